// gmm_bench: grouped matmuls (ops gmm and tgmm, plugins/gmm/op.cc) of every
// kreg kernel against oneDNN called directly per group and one dense oneDNN
// matmul of all rows, in one run on the same threads. Speed is FLOP/s:
// 2 * sum(group sizes) * k * n per call (the counter "flops").
//
//   build/release/bin/gmm_bench --benchmark_filter='balanced/f32'
//   build/release/bin/gmm_bench --micros=all --benchmark_filter='bf16'
//   build/release/bin/gmm_bench --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
//       --benchmark_out=gmm.json --benchmark_out_format=json
//   python3 bench/ratios.py gmm.json
//
// Names: BM_<op>/<shape>/<input dtype>/<contestant>. The output is f32 in
// every benchmark (bf16 means bf16 lhs and rhs, f32 out), so every contestant
// computes the same thing.
//
// Shapes (the same group sizes for gmm and tgmm):
//   balanced  m=8192 k=2048 n=1024, 8 equal groups;
//   skewed    m=4096 k=2048 n=1024, 64 groups, Zipf-like sizes (MoE routing):
//             see SkewedSizes; 16 groups empty, the sizes sum to m. They are
//             printed to stderr at startup.
// gmm:  lhs [m, k], rhs [groups, k, n], out [m, n].
// tgmm: lhs [k, m], rhs [m, n], out [groups, k, n] (m is the reduction).
//
// Contestants:
//   <variant>            each available kreg kernel of the op (gmm/tiled,
//                        gmm/onednn, ...; not the reference), prepared once
//                        (Kernel::Prepare, outside the clock) and timed by
//                        PreparedRun::Run. The tiled kernels run
//                        --gmm_config / --tgmm_config (or KREG_GMM_CONFIG /
//                        KREG_TGMM_CONFIG: "tn=128,tk=128,micro=avx2",
//                        parsed by the kernel's ParamSpace), else the answer
//                        of a tuning table (--kreg_lut=PATH or KREG_LUT) when
//                        it names that kernel, else the default config.
//   tiled_<micro>        with --micros=LIST (or "all": every choice of the
//                        tiled kernels' `micro` parameter this CPU runs),
//                        the tiled kernel once per micro-kernel, the rest
//                        of its config --<op>_config's or the default (not
//                        a table's): each micro-kernel against
//                        the others and oneDNN in one run (one for bf16
//                        inputs only is skipped on f32, saying so).
//   <variant>_prepacked  gmm only, where op gmm declares the attribute
//                        constant_weights: the kernel prepared with
//                        constant_weights=1 (rhs is constant; the kernel may
//                        pack it in prepare), per-call time.
//   <variant>_pack_time  the same Kernel::Prepare (checks + packing) timed
//                        alone; the prepared state is released off the clock.
//   onednn_direct        oneDNN 2.6 matmul per non-empty group, called
//                        directly: one primitive per distinct group size and
//                        the memory objects built outside the clock; tgmm
//                        also zeroes the empty groups' out[g], as the op
//                        requires. The peer the ratios are taken against.
//   onednn_dense         the roofline: one oneDNN matmul of all rows as one
//                        group (gmm: [sum, k] x rhs[0] [k, n]; tgmm:
//                        [k, sum] x [sum, n] into out[0]). Not checked: it
//                        computes something else.
// oneDNN 2.6 has no bf16 matmul without AVX-512: there the bf16 oneDNN
// peers are skipped with an error saying so (gmm/onednn itself widens to
// f32 and still runs).
//
// Checks. Before a contestant is timed, its output (out poisoned with NaN
// first) is compared once with an oracle: oneDNN f32 matmuls per group on
// the inputs (bf16 widened exactly to f32), itself spot-checked against
// double sums at a few hundred outputs. Tolerance: |got - want| <=
// rtol * max(|want|, rms(want)), rtol 1e-3 for f32 inputs, 2e-2 for bf16.
// A contestant that fails is skipped with the first bad element: no speed is
// reported for a wrong answer.
//
// Plugins: the build's (its plugin folder), then KREG_PLUGIN_PATH's; a
// copy carried to another machine, where the build's folder is not
// (scripts/gpu_bundle.sh), names its own in KREG_PLUGIN_PATH.
//
// Threads. kreg's kernels run on oneTBB's default arena (all cores, or
// --threads=N through tbb::global_control). Debian's oneDNN 2.6 runs on
// OpenMP: main sets omp_set_num_threads to the same count, which both the
// direct peers and gmm/onednn (called on this thread) use. The counter
// "threads" says how many.
//
// Data: lhs and rhs uniform in [-1, 1) from a counter-based hash (fixed
// seeds), rounded to bf16 for bf16. Every call streams at least 64 MiB,
// four times the L3 cache, so inputs are not rotated. One (op, shape, dtype)
// case is kept at a time (benchmarks are registered grouped by case): the
// largest, tgmm skewed, holds 2 x 512 MiB (out and the oracle's copy).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_reduce.h>
#include <oneapi/tbb/task_arena.h>
#include <omp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/lut.h"
#include "kreg/op.h"
#include "kreg/plugin_abi.h"
#include "kreg/registry.h"
#include "kreg/tensor.h"

namespace {

using kreg::DType;

// ---- Settings ---------------------------------------------------------------------

enum class OpKind { kGmm, kTgmm };
const char* OpName(OpKind op) { return op == OpKind::kGmm ? "gmm" : "tgmm"; }

struct Settings {
  std::string gmm_config, tgmm_config;  // NAME=VALUE,... for gmm/tiled, tgmm/tiled
  std::string lut_path;
  std::string micros;  // --micros: "", "all" or avx2,avx512,...
  int threads = 0;
};

Settings& TheSettings() {
  static auto* settings = new Settings;
  return *settings;
}

struct Shape {
  const char* name;
  int64_t m, k, n, groups;
  bool skewed;
};

const Shape kShapes[] = {{"balanced", 8192, 2048, 1024, 8, false}, {"skewed", 4096, 2048, 1024, 64, true}};
const DType kDTypes[] = {DType::kF32, DType::kBF16};

// ---- Group sizes ------------------------------------------------------------------

// MoE-like routing, deterministic on every platform: group g gets rank
// perm[g], a Fisher-Yates permutation of 0..G-1 drawn from std::mt19937_64
// seeded kSkewSeed (the engine's sequence is fixed by the standard; indices
// are rng() % (i + 1), not a std distribution, whose algorithm is not). The
// G/4 groups of the highest ranks are empty; the others weigh
// 1 / (rank + 1)^1.1 and get floor(m * weight / sum of weights) rows, the
// rows left over going one each to the largest fractional parts (ties: the
// lower rank), so that the sizes sum to exactly m.
constexpr uint64_t kSkewSeed = 42;
constexpr double kZipfExponent = 1.1;

std::vector<int32_t> SkewedSizes(int64_t m, int64_t groups) {
  std::vector<int64_t> rank(groups);
  for (int64_t g = 0; g < groups; ++g) rank[g] = g;
  std::mt19937_64 rng(kSkewSeed);
  for (int64_t i = groups - 1; i > 0; --i) std::swap(rank[i], rank[rng() % static_cast<uint64_t>(i + 1)]);
  const int64_t live = groups - groups / 4;
  std::vector<double> weight(groups, 0.0);
  double sum = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (rank[g] < live) sum += weight[g] = std::pow(static_cast<double>(rank[g] + 1), -kZipfExponent);
  }
  std::vector<int32_t> sizes(groups, 0);
  std::vector<std::pair<double, int64_t>> frac;  // (-fraction, rank) -> group
  std::map<int64_t, int64_t> group_of_rank;
  int64_t given = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (weight[g] == 0) continue;
    const double quota = static_cast<double>(m) * weight[g] / sum;
    sizes[g] = static_cast<int32_t>(std::floor(quota));
    given += sizes[g];
    frac.emplace_back(-(quota - std::floor(quota)), rank[g]);
    group_of_rank[rank[g]] = g;
  }
  std::sort(frac.begin(), frac.end());
  for (int64_t i = 0; given < m; ++i, ++given) ++sizes[group_of_rank[frac[i % frac.size()].second]];
  return sizes;
}

std::vector<int32_t> GroupSizes(const Shape& shape) {
  if (shape.skewed) return SkewedSizes(shape.m, shape.groups);
  std::vector<int32_t> sizes(shape.groups, static_cast<int32_t>(shape.m / shape.groups));
  for (int64_t g = 0; g < shape.m % shape.groups; ++g) ++sizes[g];
  return sizes;
}

int64_t Total(const std::vector<int32_t>& sizes) {
  int64_t total = 0;
  for (int32_t s : sizes) total += s;
  return total;
}

// ---- Data -------------------------------------------------------------------------

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i: uniform in [-1, 1) (24 random bits), from (seed, i) alone, so
// the fill is parallel and the same on every run.
void FillUniform(kreg::Tensor& t, uint64_t seed) {
  const int64_t n = t.numel();
  const bool bf16 = t.dtype() == DType::kBF16;
  void* data = t.data();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1 << 16), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i != r.end(); ++i) {
      const uint64_t bits = SplitMix64(seed * 0x100000001b3ull ^ static_cast<uint64_t>(i));
      const float x = static_cast<float>(bits >> 40) * 0x1p-23f - 1.0f;
      if (bf16) {
        static_cast<uint16_t*>(data)[i] = kreg::FloatToBf16(x);
      } else {
        static_cast<float*>(data)[i] = x;
      }
    }
  });
}

void FillFloat(kreg::Tensor& t, float value) {
  float* p = t.data_as<float>();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, t.numel(), 1 << 16), [&](const tbb::blocked_range<int64_t>& r) {
    std::fill(p + r.begin(), p + r.end(), value);
  });
}

// A matrix operand: element (i, j) at p + (i * ld + j) elements.
struct Mat {
  const void* p;
  int64_t ld;
  bool bf16;
  float At(int64_t i, int64_t j) const {
    const int64_t at = i * ld + j;
    return bf16 ? kreg::Bf16ToFloat(static_cast<const uint16_t*>(p)[at]) : static_cast<const float*>(p)[at];
  }
  Mat Offset(int64_t i, int64_t j) const {
    const int64_t at = i * ld + j;
    return {static_cast<const char*>(p) + at * (bf16 ? 2 : 4), ld, bf16};
  }
};

// ---- oneDNN ------------------------------------------------------------------------

struct Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

Dnnl& TheDnnl() {
  static auto* dnnl = new Dnnl;
  return *dnnl;
}

// A list of f32-out matmuls c[M, N] = a[M, K] . b[K, N] (row-major with
// leading dimensions), primitives and memory objects built by Add outside
// any clock, one primitive per distinct shape; Run executes them all in order
// (and zeroes the regions given to Zero first).
class DnnlPlan {
 public:
  absl::Status Add(int64_t rows, int64_t inner, int64_t cols, const Mat& a, const Mat& b, float* c, int64_t ldc) {
    using memory = dnnl::memory;
    const memory::data_type in = a.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
    const memory::desc a_md({rows, inner}, in, memory::dims{a.ld, 1});
    const memory::desc b_md({inner, cols}, in, memory::dims{b.ld, 1});
    const memory::desc c_md({rows, cols}, memory::data_type::f32, memory::dims{ldc, 1});
    Dnnl& d = TheDnnl();
    try {
      const auto key = std::make_tuple(rows, inner, cols, a.ld, b.ld, ldc, a.bf16);
      auto it = prims_.find(key);
      if (it == prims_.end()) {
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), d.engine);
        it = prims_.emplace(key, dnnl::matmul(pd)).first;
      }
      Call& call = calls_.emplace_back();
      call.matmul = it->second;
      call.args = {{DNNL_ARG_SRC, memory(a_md, d.engine, const_cast<void*>(a.p))},
                   {DNNL_ARG_WEIGHTS, memory(b_md, d.engine, const_cast<void*>(b.p))},
                   {DNNL_ARG_DST, memory(c_md, d.engine, c)}};
    } catch (const dnnl::error& e) {
      if (e.status == dnnl_unimplemented) {
        return absl::UnimplementedError(absl::StrCat(
            "oneDNN ", DNNL_VERSION_MAJOR, ".", DNNL_VERSION_MINOR, ": no ", a.bf16 ? "bf16" : "f32",
            " matmul on this CPU", a.bf16 ? " (bf16 needs AVX-512)" : ""));
      }
      return absl::InternalError(absl::StrCat("oneDNN matmul: ", e.what()));
    }
    return absl::OkStatus();
  }
  void Zero(float* p, int64_t count) { zero_.emplace_back(p, count); }

  absl::Status Run() {
    for (const auto& [p, count] : zero_) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; i += kZeroChunk) {
        std::memset(p + i, 0, sizeof(float) * std::min(kZeroChunk, count - i));
      }
    }
    Dnnl& d = TheDnnl();
    try {
      for (Call& call : calls_) call.matmul.execute(d.stream, call.args);
      d.stream.wait();
    } catch (const dnnl::error& e) {
      return absl::InternalError(absl::StrCat("oneDNN matmul: ", e.what()));
    }
    return absl::OkStatus();
  }
  size_t primitives() const { return prims_.size(); }

 private:
  static constexpr int64_t kZeroChunk = 1 << 16;
  struct Call {
    dnnl::matmul matmul;
    std::unordered_map<int, dnnl::memory> args;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>, dnnl::matmul> prims_;
  std::vector<Call> calls_;
  std::vector<std::pair<float*, int64_t>> zero_;
};

// ---- Cases -------------------------------------------------------------------------

// Op gmm or tgmm from the registry main() loads, and where its tensors and
// dims are in a kreg_args.
struct OpInfo {
  std::shared_ptr<const kreg::Op> op;
  int lhs = -1, rhs = -1, group_sizes = -1, out = -1;
  bool constant_weights = false;  // the op declares attribute constant_weights
};

OpInfo& TheOp(OpKind kind) {
  static auto* ops = new OpInfo[2];
  return ops[kind == OpKind::kGmm ? 0 : 1];
}

absl::Status InitOp(const kreg::Registry& registry, OpKind kind) {
  absl::StatusOr<std::shared_ptr<const kreg::Op>> op = registry.GetOp(OpName(kind));
  if (!op.ok()) return op.status();
  OpInfo& info = TheOp(kind);
  info.op = *op;
  info.lhs = info.op->FindTensor("lhs");
  info.rhs = info.op->FindTensor("rhs");
  info.group_sizes = info.op->FindTensor("group_sizes");
  info.out = info.op->FindTensor("out");
  info.constant_weights = info.op->FindAttr("constant_weights") >= 0;
  for (const char* dim : {"m", "k", "n", "groups"}) {
    if (info.op->FindDim(dim) < 0) {
      return absl::FailedPreconditionError(absl::StrCat("op ", OpName(kind), " has no dim ", dim, ": ",
                                                        info.op->Describe()));
    }
  }
  if (std::min({info.lhs, info.rhs, info.group_sizes, info.out}) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("op ", OpName(kind), " lacks a tensor the bench needs: ", info.op->Describe()));
  }
  return absl::OkStatus();
}

// The arguments of one call; owns what the kreg_args points at. Not movable
// once built.
struct Args {
  std::vector<DLTensor*> tensors;
  kreg::Values values;
  kreg_args args{};
};

// One (op, shape, dtype): inputs, out, the oracle's out, and the op's
// arguments (plain, and with constant_weights=1 where the op has it).
struct Case {
  OpKind op = OpKind::kGmm;
  Shape shape = kShapes[0];
  DType dtype = DType::kF32;
  std::vector<int32_t> sizes;
  int64_t total = 0;
  kreg::Tensor lhs, rhs, group_sizes, out, expected;
  double expected_rms = 0;
  Args plain;
  std::optional<Args> constant;  // constant_weights=1

  double Flops() const { return 2.0 * static_cast<double>(total) * static_cast<double>(shape.k * shape.n); }
  Mat Lhs() const { return {lhs.data(), lhs.dim(1), dtype == DType::kBF16}; }
  // gmm: rhs[g]; tgmm: rhs.
  Mat Rhs(int64_t g) const {
    const Mat whole = {rhs.data(), rhs.shape().back(), dtype == DType::kBF16};
    return op == OpKind::kGmm ? whole.Offset(g * shape.k, 0) : whole;
  }
};

std::vector<int64_t> Starts(const std::vector<int32_t>& sizes) {
  std::vector<int64_t> starts(sizes.size() + 1, 0);
  for (size_t g = 0; g < sizes.size(); ++g) starts[g + 1] = starts[g] + sizes[g];
  return starts;
}

// The plan of the grouped matmul into `out` (the case's out or the oracle's):
// onednn_direct.
absl::Status PlanGrouped(const Case& c, float* out, DnnlPlan* plan) {
  const std::vector<int64_t> starts = Starts(c.sizes);
  const int64_t m = c.shape.m, k = c.shape.k, n = c.shape.n;
  for (int64_t g = 0; g < c.shape.groups; ++g) {
    const int64_t r0 = starts[g], rows = c.sizes[g];
    if (rows == 0) {
      if (c.op == OpKind::kTgmm) plan->Zero(out + g * k * n, k * n);  // out[g] = 0
      continue;
    }
    // gmm: lhs[rows of g] . rhs[g]; tgmm: lhs[:, rows of g] . rhs[rows of g].
    const absl::Status s =
        c.op == OpKind::kGmm
            ? plan->Add(rows, k, n, c.Lhs().Offset(r0, 0), c.Rhs(g), out + r0 * n, n)
            : plan->Add(k, rows, n, c.Lhs().Offset(0, r0), c.Rhs(0).Offset(r0, 0), out + g * k * n, n);
    if (!s.ok()) return s;
  }
  // gmm: rows past the groups would be zeros; the shapes here have none.
  if (c.op == OpKind::kGmm && starts.back() < m) plan->Zero(out + starts.back() * n, (m - starts.back()) * n);
  return absl::OkStatus();
}

// onednn_dense: all grouped rows as one group.
absl::Status PlanDense(Case& c, DnnlPlan* plan) {
  float* out = c.out.data_as<float>();
  if (c.op == OpKind::kGmm) return plan->Add(c.total, c.shape.k, c.shape.n, c.Lhs(), c.Rhs(0), out, c.shape.n);
  return plan->Add(c.shape.k, c.total, c.shape.n, c.Lhs(), c.Rhs(0), out, c.shape.n);
}

// rows x cols of `a`, widened to a compact f32 matrix.
std::vector<float> Widen(const Mat& a, int64_t rows, int64_t cols) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  tbb::parallel_for(int64_t{0}, rows, [&](int64_t i) {
    for (int64_t j = 0; j < cols; ++j) w[i * cols + j] = a.At(i, j);
  });
  return w;
}

// The oracle: oneDNN f32 matmuls per group (bf16 inputs widened to f32 one
// group at a time) into c.expected; then a spot check against double sums.
absl::Status ComputeExpected(Case& c) {
  float* want = c.expected.data_as<float>();
  if (c.dtype == DType::kF32) {
    DnnlPlan plan;
    if (absl::Status s = PlanGrouped(c, want, &plan); !s.ok()) return s;
    if (absl::Status s = plan.Run(); !s.ok()) return s;
  } else {
    const std::vector<int64_t> starts = Starts(c.sizes);
    const int64_t k = c.shape.k, n = c.shape.n;
    std::fill(want, want + c.expected.numel(), 0.0f);
    for (int64_t g = 0; g < c.shape.groups; ++g) {
      const int64_t r0 = starts[g], rows = c.sizes[g];
      if (rows == 0) continue;
      const bool gmm = c.op == OpKind::kGmm;
      const std::vector<float> a = gmm ? Widen(c.Lhs().Offset(r0, 0), rows, k) : Widen(c.Lhs().Offset(0, r0), k, rows);
      const std::vector<float> b = gmm ? Widen(c.Rhs(g), k, n) : Widen(c.Rhs(0).Offset(r0, 0), rows, n);
      DnnlPlan plan;
      absl::Status s = gmm ? plan.Add(rows, k, n, {a.data(), k, false}, {b.data(), n, false}, want + r0 * n, n)
                           : plan.Add(k, rows, n, {a.data(), rows, false}, {b.data(), n, false}, want + g * k * n, n);
      if (s.ok()) s = plan.Run();
      if (!s.ok()) return s;
    }
  }
  c.expected_rms = std::sqrt(tbb::parallel_reduce(
      tbb::blocked_range<int64_t>(0, c.expected.numel(), 1 << 16), 0.0,
      [&](const tbb::blocked_range<int64_t>& r, double s) {
        for (int64_t i = r.begin(); i != r.end(); ++i) s += static_cast<double>(want[i]) * want[i];
        return s;
      },
      std::plus<>()) / static_cast<double>(c.expected.numel()));

  // Spot check: 256 outputs of non-empty groups against double sums.
  const std::vector<int64_t> starts = Starts(c.sizes);
  std::mt19937_64 rng(7);
  const int64_t k = c.shape.k, n = c.shape.n;
  for (int t = 0; t < 256; ++t) {
    const int64_t col = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    double sum = 0;
    int64_t at;
    if (c.op == OpKind::kGmm) {
      const int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.total));
      const int64_t g = std::upper_bound(starts.begin(), starts.end(), r) - starts.begin() - 1;
      for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(c.Lhs().At(r, p)) * c.Rhs(g).At(p, col);
      at = r * n + col;
    } else {
      int64_t g = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.shape.groups));
      while (c.sizes[g] == 0) g = (g + 1) % c.shape.groups;
      const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(k));
      for (int64_t r = starts[g]; r < starts[g + 1]; ++r) {
        sum += static_cast<double>(c.Lhs().At(i, r)) * c.Rhs(0).At(r, col);
      }
      at = (g * k + i) * n + col;
    }
    if (!(std::fabs(want[at] - sum) <= 1e-4 * std::max(std::fabs(sum), c.expected_rms))) {
      return absl::InternalError(absl::StrCat("the oracle (oneDNN f32) is wrong: out[", at, "] = ", want[at],
                                              ", a double sum gives ", sum));
    }
  }
  return absl::OkStatus();
}

absl::Status BuildArgs(Case& c, const OpInfo& info, bool constant_weights, Args* a) {
  kreg::NamedValues named = {{"m", absl::StrCat(c.shape.m)},
                             {"k", absl::StrCat(c.shape.k)},
                             {"n", absl::StrCat(c.shape.n)},
                             {"groups", absl::StrCat(c.shape.groups)}};
  if (constant_weights) named.emplace_back("constant_weights", "1");
  absl::StatusOr<kreg::Values> values = info.op->ParseValues(named);
  if (!values.ok()) return values.status();
  // Dims left out take their defaults (local_groups = groups: every group).
  if (absl::Status s = info.op->Complete(&*values); !s.ok()) return s;
  a->values = *std::move(values);
  a->tensors.assign(info.op->tensors().size(), nullptr);
  // Inputs are only read (kreg_args' contract); the ABI's pointers are not const.
  a->tensors[info.lhs] = const_cast<DLTensor*>(c.lhs.dl());
  a->tensors[info.rhs] = const_cast<DLTensor*>(c.rhs.dl());
  a->tensors[info.group_sizes] = const_cast<DLTensor*>(c.group_sizes.dl());
  a->tensors[info.out] = c.out.dl();
  a->args.struct_size = sizeof(kreg_args);
  a->args.tensors = a->tensors.data();
  a->args.num_tensors = a->tensors.size();
  a->args.dims = a->values.dims.data();
  a->args.num_dims = a->values.dims.size();
  a->args.attrs = a->values.attrs.data();
  a->args.num_attrs = a->values.attrs.size();
  return info.op->Validate(a->args);
}

absl::StatusOr<std::unique_ptr<Case>> MakeCase(OpKind op, const Shape& shape, DType dtype) {
  const OpInfo& info = TheOp(op);
  auto c = std::make_unique<Case>();
  c->op = op;
  c->shape = shape;
  c->dtype = dtype;
  c->sizes = GroupSizes(shape);
  c->total = Total(c->sizes);
  const int64_t m = shape.m, k = shape.k, n = shape.n, groups = shape.groups;
  if (op == OpKind::kGmm) {
    c->lhs = kreg::Tensor(dtype, {m, k});
    c->rhs = kreg::Tensor(dtype, {groups, k, n});
    c->out = kreg::Tensor(DType::kF32, {m, n});
  } else {
    c->lhs = kreg::Tensor(dtype, {k, m});
    c->rhs = kreg::Tensor(dtype, {m, n});
    c->out = kreg::Tensor(DType::kF32, {groups, k, n});
  }
  c->expected = kreg::Tensor(DType::kF32, c->out.shape());
  c->group_sizes = kreg::Tensor(DType::kI32, {groups});
  std::copy(c->sizes.begin(), c->sizes.end(), c->group_sizes.data_as<int32_t>());
  FillUniform(c->lhs, 1);
  FillUniform(c->rhs, 2);
  if (absl::Status s = BuildArgs(*c, info, false, &c->plain); !s.ok()) return s;
  if (info.constant_weights) {
    if (absl::Status s = BuildArgs(*c, info, true, &c->constant.emplace()); !s.ok()) return s;
  }
  if (absl::Status s = ComputeExpected(*c); !s.ok()) return s;
  return c;
}

// Built on first use, one at a time: a --benchmark_filter only pays for what
// it runs, and memory holds one case.
absl::StatusOr<Case*> GetCase(OpKind op, const Shape& shape, DType dtype) {
  static auto* current = new std::unique_ptr<Case>;
  static auto* failed = new std::map<std::string, absl::Status>;
  const std::string key = absl::StrCat(OpName(op), "/", shape.name, "/", kreg::DTypeName(dtype));
  if (auto it = failed->find(key); it != failed->end()) return it->second;
  Case* c = current->get();
  if (c != nullptr && c->op == op && std::string(c->shape.name) == shape.name && c->dtype == dtype) return c;
  current->reset();
  absl::StatusOr<std::unique_ptr<Case>> made = MakeCase(op, shape, dtype);
  if (!made.ok()) {
    (*failed)[key] = made.status();
    return made.status();
  }
  *current = *std::move(made);
  return current->get();
}

// OK when out agrees with the oracle (see the top).
absl::Status CheckOut(const Case& c) {
  const double rtol = c.dtype == DType::kF32 ? 1e-3 : 2e-2;
  const float* got = c.out.data_as<float>();
  const float* want = c.expected.data_as<float>();
  const int64_t n = c.out.numel();
  const double floor = c.expected_rms;
  const int64_t bad = tbb::parallel_reduce(
      tbb::blocked_range<int64_t>(0, n, 1 << 16), n,
      [&](const tbb::blocked_range<int64_t>& r, int64_t first) {
        for (int64_t i = r.begin(); i != r.end() && i < first; ++i) {
          const double w = want[i];
          if (!(std::fabs(got[i] - w) <= rtol * std::max(std::fabs(w), floor))) return i;
        }
        return first;
      },
      [](int64_t x, int64_t y) { return std::min(x, y); });
  if (bad == n) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("wrong answer: out[", bad, "] = ", got[bad], ", oneDNN gives ", want[bad],
                                          " (rtol ", rtol, ", rms ", floor, ")"));
}

// ---- Contestants ----------------------------------------------------------------------

enum class Kind { kKernel, kPrepacked, kPackTime, kDirect, kDense };

struct Entry {
  OpKind op = OpKind::kGmm;
  Shape shape = kShapes[0];
  DType dtype = DType::kF32;
  Kind kind = Kind::kKernel;
  std::shared_ptr<const kreg::Kernel> kernel;  // kKernel, kPrepacked, kPackTime
  std::optional<kreg::Config> config;          // given (flag, env); else resolved on first run
  std::string config_source;                   // "given", "table exact", "default", ...
  absl::Status setup;                          // e.g. a config that did not parse
  std::optional<absl::Status> verified;        // the one check, once done
};

void Skip(benchmark::State& state, const absl::Status& status) { state.SkipWithError(status.ToString().c_str()); }

// The tuning table, if --kreg_lut gave one: loaded by main.
std::unique_ptr<kreg::Lut>& LutSlot() {
  static auto* lut = new std::unique_ptr<kreg::Lut>;
  return *lut;
}

// The config of a kernel entry: the flag's, else the table's answer when it
// names this kernel, else the default.
void ResolveConfig(Entry& e, const kreg_args& args) {
  if (e.config) return;
  e.config = e.kernel->DefaultConfig();
  e.config_source = "default";
  const kreg::Lut* lut = LutSlot().get();
  if (lut == nullptr || e.kernel->params().size() == 0) return;
  const kreg::Op& op = e.kernel->op_info();
  const kreg::OpKey key = op.KeyOf(args);
  absl::StatusOr<std::string> data_class = op.DataClass(args);
  if (!data_class.ok()) {
    e.config_source = absl::StrCat("default (data class: ", data_class.status().message(), ")");
    return;
  }
  absl::StatusOr<kreg::LutAnswer> a = lut->Query(op.name(), key.dtype, key.dims, kreg::ThisMachine().id(), *data_class);
  if (!a.ok()) {
    e.config_source = absl::StrCat("default (table: ", a.status().message(), ")");
  } else if (a->kernel == nullptr || a->kernel->name() != e.kernel->name()) {
    e.config_source = absl::StrCat("default (table answers ", a->kernel ? a->kernel->name() : "nothing", ")");
  } else {
    e.config = *a->config;
    e.config_source = absl::StrCat("table ", kreg::MatchName(a->match));
  }
}

void SetCounters(benchmark::State& state, const Case& c) {
  state.counters["flops"] = benchmark::Counter(c.Flops(), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = TheSettings().threads;
}

std::string DTypeLabel(DType dtype) { return absl::StrCat("in ", kreg::DTypeName(dtype), ", out f32"); }

// "; default [tm=96 tn=256 ...]": where a kernel's config came from, and
// what it is; "" for a kernel without parameters.
std::string ConfigLabel(const Entry& e) {
  if (e.kernel->params().size() == 0) return "";
  return absl::StrCat("; ", e.config_source, " [", e.kernel->ConfigString(*e.config), "]");
}

// Checks a contestant's run once (out poisoned first), then times `run`.
template <typename RunFn>
void TimeRuns(benchmark::State& state, Entry& e, Case& c, RunFn run) {
  if (!e.verified) {
    FillFloat(c.out, std::numeric_limits<float>::quiet_NaN());
    absl::Status s = run();
    e.verified = s.ok() ? CheckOut(c) : s;
  } else if (absl::Status s = run(); !s.ok()) {  // warm-up
    return Skip(state, s);
  }
  if (!e.verified->ok()) return Skip(state, *e.verified);
  for (auto _ : state) {
    if (absl::Status s = run(); !s.ok()) {
      Skip(state, s);
      break;
    }
  }
  SetCounters(state, c);
}

void RunEntry(benchmark::State& state, Entry& e) {
  if (!e.setup.ok()) return Skip(state, e.setup);
  absl::StatusOr<Case*> got = GetCase(e.op, e.shape, e.dtype);
  if (!got.ok()) return Skip(state, got.status());
  Case& c = **got;
  switch (e.kind) {
    case Kind::kKernel:
    case Kind::kPrepacked: {
      const kreg_args& args = e.kind == Kind::kKernel ? c.plain.args : c.constant->args;
      ResolveConfig(e, args);
      // Prepared per call of this function and released at its end: one
      // benchmark's state (e.g. packed weights) at a time.
      absl::StatusOr<std::unique_ptr<kreg::PreparedRun>> prepared = e.kernel->Prepare(*e.config, args);
      if (!prepared.ok()) return Skip(state, prepared.status());
      kreg::PreparedRun& run = **prepared;
      TimeRuns(state, e, c, [&] { return run.Run(); });
      state.SetLabel(DTypeLabel(e.dtype) + ConfigLabel(e));
      return;
    }
    case Kind::kPackTime: {
      ResolveConfig(e, c.constant->args);
      for (auto _ : state) {
        absl::StatusOr<std::unique_ptr<kreg::PreparedRun>> prepared = e.kernel->Prepare(*e.config, c.constant->args);
        if (!prepared.ok()) {
          Skip(state, prepared.status());
          break;
        }
        state.PauseTiming();
        prepared->reset();
        state.ResumeTiming();
      }
      state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(c.rhs.nbytes()));
      state.counters["threads"] = TheSettings().threads;
      state.SetLabel(absl::StrCat(DTypeLabel(e.dtype), "; Kernel::Prepare with constant_weights=1", ConfigLabel(e)));
      return;
    }
    case Kind::kDirect:
    case Kind::kDense: {
      DnnlPlan plan;
      absl::Status s = e.kind == Kind::kDirect ? PlanGrouped(c, c.out.data_as<float>(), &plan) : PlanDense(c, &plan);
      if (!s.ok()) return Skip(state, s);
      if (e.kind == Kind::kDense) e.verified = absl::OkStatus();  // a roofline: not the same product
      TimeRuns(state, e, c, [&] { return plan.Run(); });
      state.counters["primitives"] = static_cast<double>(plan.primitives());
      state.SetLabel(absl::StrCat(DTypeLabel(e.dtype), e.kind == Kind::kDense ? "; roofline, unchecked" : ""));
      return;
    }
  }
}

// NAME=VALUE,... for `kernel`, from a flag or the environment.
absl::StatusOr<kreg::Config> ParseConfigText(const kreg::Kernel& kernel, const std::string& text) {
  absl::StatusOr<kreg::NamedValues> pairs = kreg::ParseNamedValues(text);
  if (!pairs.ok()) return pairs.status();
  return kernel.ParseConfig(*pairs);
}

// The `micro` choices --micros names for `kernel` ("all": each this CPU
// runs); none for a kernel without that parameter or without the flag.
std::vector<std::string> MicroChoices(const kreg::Kernel& kernel, const std::string& flag) {
  const int index = kernel.params().Find("micro");
  if (index < 0 || flag.empty()) return {};
  const kreg::ParamInfo& param = kernel.params().params()[index];
  if (flag != "all") return absl::StrSplit(flag, ',', absl::SkipEmpty());
  std::vector<std::string> out;
  for (size_t i = 0; i < param.choices.size(); ++i) {
    if (param.ChoiceAvailable(static_cast<int64_t>(i), kreg::CpuIsa())) out.push_back(param.choices[i]);
  }
  return out;
}

// Sets entry `e`'s config to its own (given or default) with micro=`micro`;
// an error for a choice this CPU lacks. (A micro-kernel for bf16 inputs
// only is refused by the kernel when prepared on f32 ones.)
absl::Status WithMicro(const kreg::Kernel& kernel, const std::string& micro, Entry& e) {
  if (!e.setup.ok()) return e.setup;
  kreg::NamedValues pairs = kernel.ConfigPairs(e.config ? *e.config : kernel.DefaultConfig());
  for (auto& [name, value] : pairs) {
    if (name == "micro") value = micro;
  }
  absl::StatusOr<kreg::Config> config = kernel.ParseConfig(pairs);
  if (!config.ok()) return config.status();
  e.config = *config;
  e.config_source = e.config_source.empty() ? "default, micro given" : absl::StrCat(e.config_source, ", micro given");
  return absl::OkStatus();
}

// Removes --NAME=VALUE from argv (before Google Benchmark sees the flags);
// the last one wins. False (and a message) for --NAME without a value.
bool TakeFlag(std::vector<char*>& args, const char* name, std::string* value) {
  const std::string prefix = absl::StrCat("--", name, "=");
  bool ok = true;
  for (auto it = args.begin() + 1; it != args.end();) {
    if (std::strncmp(*it, prefix.c_str(), prefix.size()) == 0) {
      *value = *it + prefix.size();
      it = args.erase(it);
    } else {
      if (std::string(*it) == absl::StrCat("--", name)) {
        std::fprintf(stderr, "gmm_bench: --%s needs a value (--%s=...)\n", name, name);
        ok = false;
      }
      ++it;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Settings& settings = TheSettings();
  if (const char* env = std::getenv("KREG_GMM_CONFIG")) settings.gmm_config = env;
  if (const char* env = std::getenv("KREG_TGMM_CONFIG")) settings.tgmm_config = env;
  if (const char* env = std::getenv("KREG_LUT")) settings.lut_path = env;
  std::vector<char*> args(argv, argv + argc);
  std::string threads_text;
  if (!TakeFlag(args, "gmm_config", &settings.gmm_config) || !TakeFlag(args, "tgmm_config", &settings.tgmm_config) ||
      !TakeFlag(args, "kreg_lut", &settings.lut_path) || !TakeFlag(args, "threads", &threads_text) ||
      !TakeFlag(args, "micros", &settings.micros)) {
    return 1;
  }
  argc = static_cast<int>(args.size());
  args.push_back(nullptr);
  argv = args.data();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  // One thread count for oneTBB (kreg) and OpenMP (oneDNN).
  std::optional<tbb::global_control> limit;
  if (!threads_text.empty()) {
    if (!absl::SimpleAtoi(threads_text, &settings.threads) || settings.threads < 1) {
      std::fprintf(stderr, "gmm_bench: --threads=%s: expected a positive integer\n", threads_text.c_str());
      return 1;
    }
    limit.emplace(tbb::global_control::max_allowed_parallelism, settings.threads);
  } else {
    settings.threads = tbb::this_task_arena::max_concurrency();
  }
  omp_set_num_threads(settings.threads);

  // The build's plugins first (where the build is: not on a machine a
  // bundle was carried to), then KREG_PLUGIN_PATH; never an installed
  // kreg's, which could be older than this tree.
  kreg::LoadOptions load;
  std::error_code no_build;
  if (std::filesystem::is_directory(KREG_PLUGIN_DIR, no_build)) load.plugin_paths = {KREG_PLUGIN_DIR};
  load.use_default_dirs = false;
  absl::StatusOr<std::unique_ptr<kreg::Registry>> registry = kreg::Registry::Load(load);
  if (!registry.ok()) {
    std::fprintf(stderr, "gmm_bench: %s\n", registry.status().ToString().c_str());
    return 1;
  }
  for (const absl::Status& refusal : (*registry)->refusals()) {
    std::fprintf(stderr, "gmm_bench: warning: %s\n", refusal.ToString().c_str());
  }
  for (OpKind op : {OpKind::kGmm, OpKind::kTgmm}) {
    if (absl::Status s = InitOp(**registry, op); !s.ok()) {
      std::fprintf(stderr, "gmm_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (!settings.lut_path.empty()) {
    absl::StatusOr<kreg::TuningDb> db = kreg::TuningDb::Load(settings.lut_path);
    absl::StatusOr<kreg::Lut> lut = db.ok() ? kreg::Lut::Build(*db, **registry) : db.status();
    if (!lut.ok()) {
      std::fprintf(stderr, "gmm_bench: --kreg_lut=%s: %s\n", settings.lut_path.c_str(),
                   lut.status().ToString().c_str());
      return 1;
    }
    LutSlot() = std::make_unique<kreg::Lut>(*std::move(lut));
  }
  if (!TheOp(OpKind::kGmm).constant_weights) {
    std::fprintf(stderr, "gmm_bench: op gmm has no attribute constant_weights; no _prepacked/_pack_time benchmarks\n");
  }
  for (const Shape& shape : kShapes) {
    if (shape.skewed) {
      const std::vector<int32_t> sizes = GroupSizes(shape);
      std::fprintf(stderr, "gmm_bench: %s group sizes (m=%lld, seed %llu): %s\n", shape.name,
                   static_cast<long long>(shape.m), static_cast<unsigned long long>(kSkewSeed),
                   absl::StrJoin(sizes, ",").c_str());
    }
  }

  std::deque<Entry> entries;  // stable addresses for the registered lambdas
  auto add = [&](Entry e, const std::string& contestant) {
    Entry* entry = &entries.emplace_back(std::move(e));
    const std::string name = absl::StrCat("BM_", OpName(entry->op), "/", entry->shape.name, "/",
                                          kreg::DTypeName(entry->dtype), "/", contestant);
    benchmark::RegisterBenchmark(name.c_str(), [entry](benchmark::State& state) { RunEntry(state, *entry); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  // Grouped by case (op, shape, dtype), which GetCase keeps one at a time.
  for (OpKind op : {OpKind::kGmm, OpKind::kTgmm}) {
    std::vector<std::shared_ptr<const kreg::Kernel>> kernels;
    for (const auto& kernel : (*registry)->Kernels(OpName(op))) {
      // The reference (double sums) would take minutes per call here.
      if (kernel->is_reference()) continue;
      if (!kernel->available()) {
        std::fprintf(stderr, "gmm_bench: skipping %s: %s\n", kernel->name().c_str(),
                   kernel->device() != 0
                       ? "a CUDA kernel (this benchmark times CPU kernels; bench/gpu_peers.py times it on a GPU)"
                       : ("this CPU lacks " + kreg::IsaString(kernel->required_isa())).c_str());
        continue;
      }
      kernels.push_back(kernel);
    }
    const std::string& config_text = op == OpKind::kGmm ? settings.gmm_config : settings.tgmm_config;
    for (const Shape& shape : kShapes) {
      for (DType dtype : kDTypes) {
        Entry base;
        base.op = op;
        base.shape = shape;
        base.dtype = dtype;
        base.kind = Kind::kKernel;
        for (const auto& kernel : kernels) {
          Entry e = base;
          e.kernel = kernel;
          if (kernel->variant() == "tiled" && !config_text.empty()) {
            absl::StatusOr<kreg::Config> config = ParseConfigText(*kernel, config_text);
            if (config.ok()) {
              e.config = *config;
              e.config_source = "given";
            } else {
              e.setup = absl::InvalidArgumentError(
                  absl::StrCat("--", OpName(op), "_config for ", kernel->name(), ": ", config.status().message()));
            }
          }
          add(e, kernel->variant());
          for (const std::string& micro : MicroChoices(*kernel, settings.micros)) {
            Entry m = e;
            m.setup = WithMicro(*kernel, micro, m);
            add(m, absl::StrCat(kernel->variant(), "_", micro));
          }
          if (TheOp(op).constant_weights) {
            e.kind = Kind::kPrepacked;
            add(e, kernel->variant() + "_prepacked");
            e.kind = Kind::kPackTime;
            add(e, kernel->variant() + "_pack_time");
          }
        }
        Entry direct = base;
        direct.kind = Kind::kDirect;
        add(direct, "onednn_direct");
        Entry dense = base;
        dense.kind = Kind::kDense;
        add(dense, "onednn_dense");
      }
    }
  }

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
