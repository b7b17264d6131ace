// Plugin "gmm_onednn": kernels gmm/onednn and tgmm/onednn of the ops that
// plugins/gmm declares (see plugins/gmm/op.cc for tensors, dims and
// semantics). Kernels only: the gmm plugin must be loaded for the ops.
//
// gmm:  per non-empty local group g (of [group_offset, group_offset +
//       local_groups)), one oneDNN matmul lhs[rows of g] [rows_g, k] x
//       rhs[g - group_offset] [k, n] -> out[rows of g] [rows_g, n] on the
//       CPU engine; a transposed rhs ([n, k] in memory) is the same [k, n]
//       weights with strides (1, row stride). existing_out is copied into
//       out's rows first and added by a post-op sum; every other row (other
//       groups', rows past sum(group_sizes)) is existing_out's or zeros.
// tgmm: per non-empty local group g, lhs[:, rows of g] (a strided [k,
//       rows_g] view, row stride m) x rhs[rows of g] [rows_g, n] ->
//       out[g - group_offset]; empty groups are zero-filled.
//
// Primitives are built in prepare (which reads group_sizes: they are data),
// one per distinct group size, and cached in the kernel's state; run builds
// any it lacks. Where oneDNN has no primitive writing out's dtype directly,
// it writes f32 into a scratch buffer that is rounded once into out
// (existing_out added in float first). Where it has no bf16 matmul at all
// (oneDNN 2.6 needs AVX-512 for bf16: an AVX2 machine has none), each
// group's bf16 inputs are widened (exactly) into f32 scratch buffers first.
//
// Accuracy, as gmm/tiled: oneDNN accumulates in float, within the op's
// tolerance for data of sane magnitude. Where an input is NaN or infinite,
// or float overflows, the output is NaN or infinite; each such output is
// recomputed in double in the reference's order, so NaN and infinities
// come out as the reference's. gmm scans its output for them (smaller than
// its inputs); tgmm, whose output is the larger, first takes the inputs'
// largest magnitudes, and where they show no output can be non-finite (no
// NaN or infinity among them, no float overflow possible) skips the output
// scan (TgmmOutputsFinite).
//
// Threads: Debian 12's oneDNN 2.6 uses OpenMP. When kreg_host.num_threads
// is > 0 the calling thread's OpenMP team size is set to it around
// primitive creation and execution (and restored after). With a TBB build
// of oneDNN the host's arena already bounds it; with a threadpool build it
// is not honoured. The plugin's own passes (zero fill, fix-ups, widening)
// run on the same runtime as oneDNN (RuntimeFor).
//
// No exception leaves a plugin function: dnnl::error and everything else is
// turned into a status with its message.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP && defined(_OPENMP)
#include <omp.h>
#define KREG_ONEDNN_OMP 1
#endif

#include "../common.h"
#include "kreg/plugin_abi.h"

namespace kreg::gmm_onednn {
namespace {

// Indices, element access and views are the gmm plugin's own (common.h).
using namespace kreg::gmm;

enum class Op { kGmm, kTgmm };

// One call, viewed (common.h's GroupedView). gmm: lhs [m, k], rhs
// [local_groups, k, n] (or [local_groups, n, k] transposed), out [m, n];
// tgmm: lhs [k, m], rhs [m, n], out [local_groups, k, n]. m is the grouped
// dim; groups are local indices below unless named global.
struct View : GroupedView {
  Op op = Op::kGmm;

  Mat Lhs() const { return op == Op::kGmm ? GmmLhs(*this) : TgmmLhs(*this); }
  // gmm: rhs[local] as it lies in memory ([k, n], or [n, k] transposed);
  // tgmm: rhs (local ignored).
  Mat Rhs(int64_t local) const { return op == Op::kGmm ? GmmRhs(*this, local) : TgmmRhs(*this); }
  Mat Existing() const { return GmmExisting(*this); }
  // gmm: out; tgmm: out[local].
  OutMat Out(int64_t local) const { return op == Op::kGmm ? GmmOut(*this) : TgmmOut(*this, local); }
  // The row count of local group `local` (global group group_offset + local).
  int64_t Size(int64_t local) const { return GroupSize(group_offset + local); }
};

bool ViewArgs(Op op, const kreg_args* args, View* v, char* msg, size_t cap) {
  v->op = op;
  return op == Op::kGmm ? ViewGmm(args, v, msg, cap) : ViewTgmm(args, v, msg, cap);
}

// The SDK's guard, oneDNN's own errors named first.
template <typename Body>
kreg_status Guarded(char* msg, size_t cap, Body&& body) noexcept {
  return sdk::Guarded(msg, cap, [&]() -> kreg_status {
    try {
      return body();
    } catch (const dnnl::error& e) {
      return Fail(e.status == dnnl_out_of_memory ? KREG_RESOURCE_EXHAUSTED : KREG_INTERNAL, msg, cap,
                  "oneDNN: %s (status %d)", e.what(), static_cast<int>(e.status));
    }
  });
}

// The plugin's own passes between matmuls run on oneDNN's runtime where it
// is OpenMP: oneTBB workers woken between OpenMP regions would fight
// oneDNN's still-spinning threads for the cores. fn must not throw.
template <typename Fn>
kreg_status RuntimeFor(int64_t count, const kreg_host* host, Fn&& fn, int64_t grain = 1) {
#ifdef KREG_ONEDNN_OMP
  (void)grain;
  if (count <= 0) return KREG_OK;
  if (Cancelled(host)) return KREG_CANCELLED;
  const int threads = host != nullptr && host->num_threads > 0 ? host->num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < count; ++i) fn(i);
  return KREG_OK;
#else
  return ParallelFor(count, host, std::forward<Fn>(fn), grain);
#endif
}

// Sets the calling thread's OpenMP team size (oneDNN's) to the host's
// thread count for the scope; restores it after.
class ThreadScope {
 public:
  explicit ThreadScope(const kreg_host* host) {
#ifdef KREG_ONEDNN_OMP
    if (host != nullptr && host->num_threads > 0) {
      saved_ = omp_get_max_threads();
      omp_set_num_threads(host->num_threads);
    }
#else
    (void)host;
#endif
  }
  ~ThreadScope() {
#ifdef KREG_ONEDNN_OMP
    if (saved_ > 0) omp_set_num_threads(saved_);
#endif
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  [[maybe_unused]] int saved_ = 0;
};

// ---- Primitives and state -----------------------------------------------------------

using dnnl::memory;

memory::data_type Dt(bool bf16) { return bf16 ? memory::data_type::bf16 : memory::data_type::f32; }

struct Prim {
  dnnl::matmul matmul;
  memory::desc src, wei, dst;
  std::string impl;  // oneDNN's implementation, e.g. "brg:avx512_core_amx"
};

// Per problem: the engine, a stream, one matmul per distinct group size,
// and (when oneDNN cannot write out's dtype) a float scratch buffer.
struct State {
  Op op;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  bool direct = true;  // dst is out itself (else: f32 scratch, rounded by us)
  bool widen = false;  // bf16 inputs widened to f32 scratch (lhs_buf, rhs_buf)
  bool sum = false;    // gmm with existing_out: post-op sum into out
  std::map<int64_t, Prim> prims;  // by the group's row count
  std::vector<float> scratch, lhs_buf, rhs_buf;

  explicit State(Op o) : op(o) {}

  // The matmul for a group of `rows` rows.
  const Prim& Get(const View& v, int64_t rows) {
    auto it = prims.find(rows);
    if (it != prims.end()) return it->second;
    const memory::data_type in = widen ? memory::data_type::f32 : Dt(v.in_bf16);
    const memory::data_type out = direct ? Dt(v.out_bf16) : memory::data_type::f32;
    Prim p;
    if (v.op == Op::kGmm) {
      p.src = memory::desc({rows, v.k}, in, memory::dims{widen ? v.k : Stride(v.lhs, 0), 1});
      // A transposed rhs: the [k, n] weights column-major, each column a row of [n, k].
      p.wei = v.transpose_rhs ? memory::desc({v.k, v.n}, in, memory::dims{1, widen ? v.k : Stride(v.rhs, 1)})
                              : memory::desc({v.k, v.n}, in, memory::dims{widen ? v.n : Stride(v.rhs, 1), 1});
      p.dst = direct ? memory::desc({rows, v.n}, out, memory::dims{Stride(v.out, 0), 1})
                     : memory::desc({rows, v.n}, out, memory::dims{v.n, 1});
    } else {
      p.src = memory::desc({v.k, rows}, in, memory::dims{widen ? rows : Stride(v.lhs, 0), 1});
      p.wei = memory::desc({rows, v.n}, in, memory::dims{widen ? v.n : Stride(v.rhs, 0), 1});
      p.dst = direct ? memory::desc({v.k, v.n}, out, memory::dims{Stride(v.out, 1), 1})
                     : memory::desc({v.k, v.n}, out, memory::dims{v.n, 1});
    }
    dnnl::primitive_attr attr;
    if (sum) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.src, p.wei, p.dst), attr, engine);
    p.matmul = dnnl::matmul(pd);
    p.impl = pd.impl_info_str();
    return prims.emplace(rows, std::move(p)).first->second;
  }
};

// Whether the matmuls have anything to compute (k, n > 0).
bool HasWork(const View& v) { return v.k > 0 && v.n > 0; }

std::unique_ptr<State> Build(Op op, const View& v) {
  auto state = std::make_unique<State>(op);
  state->sum = op == Op::kGmm && v.existing != nullptr;
  if (!HasWork(v)) return state;
  int64_t max_rows = 0;
  std::vector<int64_t> sizes;
  for (int64_t l = 0; l < v.local_groups; ++l) {
    const int64_t rows = v.Size(l);
    if (rows > 0) sizes.push_back(rows);
    max_rows = std::max(max_rows, rows);
  }
  if (sizes.empty()) return state;
  // The first of: native inputs into out's dtype; native inputs into f32
  // scratch; (bf16 only) widened inputs into out's dtype; into f32 scratch.
  const bool sum = state->sum;
  for (int attempt = 0;; ++attempt) {
    state->widen = attempt >= 2;
    state->direct = attempt % 2 == 0;
    state->sum = sum && state->direct;
    state->prims.clear();
    try {
      state->Get(v, sizes[0]);
      break;
    } catch (const dnnl::error& e) {
      if (e.status != dnnl_unimplemented || attempt == (v.in_bf16 ? 3 : 1)) throw;
    }
  }
  for (int64_t rows : sizes) state->Get(v, rows);
  if (!state->direct) {
    state->scratch.resize(static_cast<size_t>((op == Op::kGmm ? max_rows : v.k) * v.n));
  }
  if (state->widen) {
    state->lhs_buf.resize(static_cast<size_t>(max_rows * v.k));
    state->rhs_buf.resize(static_cast<size_t>((op == Op::kGmm ? v.k : max_rows) * v.n));
  }
  return state;
}

// Widens rows x cols of `src` (bf16) into the compact f32 buffer `dst`.
kreg_status Widen(const Mat& src, int64_t rows, int64_t cols, float* dst, const kreg_host* host) {
  return RuntimeFor(rows, host, [&](int64_t i) {
    const uint16_t* p = static_cast<const uint16_t*>(src.Row(i));
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = Bf16ToFloat(p[j]);
  }, 16);
}

void Execute(State& s, const Prim& p, const void* src, const void* wei, void* dst) {
  memory src_mem(p.src, s.engine, const_cast<void*>(src));
  memory wei_mem(p.wei, s.engine, const_cast<void*>(wei));
  memory dst_mem(p.dst, s.engine, dst);
  p.matmul.execute(s.stream, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, wei_mem}, {DNNL_ARG_DST, dst_mem}});
  s.stream.wait();
}

// ---- Kernel entry points -------------------------------------------------------

template <Op kOp>
kreg_status Check(const kreg_config*, const kreg_args* args, const kreg_host* host, char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    View v;
    if (!ViewArgs(kOp, args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    return CheckCpu(args, host, msg, cap);
  });
}

template <Op kOp>
kreg_status Prepare(const kreg_config*, const kreg_args* args, const kreg_host* host, void** state, char* msg,
                    size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    View v;
    if (!ViewArgs(kOp, args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = CheckCpu(args, host, msg, cap); s != KREG_OK) return s;
    ThreadScope threads(host);
    std::unique_ptr<State> built = Build(kOp, v);
    if (host != nullptr && host->log != nullptr && !built->prims.empty()) {
      // What oneDNN chose: the user's answer to "why is this fast or slow here".
      char note[256];
      std::snprintf(note, sizeof note, "%zu matmul primitive(s), oneDNN implementation %s%s%s",
                    built->prims.size(), built->prims.begin()->second.impl.c_str(),
                    built->widen ? ", bf16 inputs widened to f32" : "", built->direct ? "" : ", through f32 scratch");
      host->log(host->ctx, 0, note);
    }
    *state = built.release();
    return KREG_OK;
  });
}

void Release(void* state) { delete static_cast<State*>(state); }

kreg_status GmmRun(const View& v, State& s, const kreg_host* host) {
  const std::vector<int64_t> starts = GroupStarts(v);
  // The local groups' rows [first, first + total) are the rows the matmuls write.
  const int64_t first = starts[v.group_offset];
  const int64_t total = HasWork(v) ? starts[v.group_offset + v.local_groups] - first : 0;
  const int64_t groups = v.local_groups;
  const Mat lhs = v.Lhs();
  const OutMat out = v.Out(0);
  const size_t row_bytes = static_cast<size_t>(v.n) * (v.out_bf16 ? 2 : 4);

  // Rows no matmul writes: existing_out, or zeros. With the post-op sum, the
  // grouped rows start as existing_out too.
  kreg_status status = RuntimeFor(v.m, host, [&](int64_t r) {
    if (!s.sum && r >= first && r < first + total) return;
    if (v.existing != nullptr) {
      std::memmove(out.Row(r), v.Existing().Row(r), row_bytes);
    } else {
      std::memset(out.Row(r), 0, row_bytes);
    }
  }, 16);
  if (status != KREG_OK || total == 0) return status;

  const int64_t rhs_rows = v.transpose_rhs ? v.n : v.k, rhs_cols = v.transpose_rhs ? v.k : v.n;
  for (int64_t l = 0; l < groups; ++l) {
    const int64_t r0 = starts[v.group_offset + l], rows = v.Size(l);
    if (rows == 0) continue;
    if (Cancelled(host)) return KREG_CANCELLED;
    const Mat rhs = v.Rhs(l);
    const Prim& p = s.Get(v, rows);
    const void* src = lhs.Row(r0);
    const void* wei = rhs.p;
    if (s.widen) {
      const Mat a = {src, lhs.ld, true};
      if ((status = Widen(a, rows, v.k, s.lhs_buf.data(), host)) != KREG_OK) return status;
      if ((status = Widen(rhs, rhs_rows, rhs_cols, s.rhs_buf.data(), host)) != KREG_OK) return status;
      src = s.lhs_buf.data();
      wei = s.rhs_buf.data();
    }
    {
      ThreadScope threads(host);
      Execute(s, p, src, wei, s.direct ? out.Row(r0) : static_cast<void*>(s.scratch.data()));
    }
    // Fix-up: non-finite outputs in double; without direct output, every
    // output from the float scratch.
    status = RuntimeFor(rows, host, [&](int64_t i) {
      const int64_t r = r0 + i;
      void* o = out.Row(r);
      const float* f = s.direct ? nullptr : &s.scratch[i * v.n];
      if (s.direct && !AnyNonFinite(o, v.out_bf16, v.n)) return;
      const void* e = v.existing != nullptr ? v.Existing().Row(r) : nullptr;
      for (int64_t c = 0; c < v.n; ++c) {
        if (!std::isfinite(s.direct ? LoadAt(o, v.out_bf16, c) : f[c])) {
          double d = GmmDot(lhs, r, rhs, c, v.k, v.transpose_rhs);
          if (e != nullptr) d += LoadAt(e, v.out_bf16, c);
          StoreDouble(o, v.out_bf16, c, d);
        } else if (!s.direct) {
          StoreFloat(o, v.out_bf16, c, e != nullptr ? f[c] + LoadAt(e, v.out_bf16, c) : f[c]);
        }
      }
    });
    if (status != KREG_OK) return status;
  }
  return KREG_OK;
}

// Whether no output of tgmm's matmuls can be non-finite, known from the
// inputs: every element of lhs's and rhs's local columns and rows is finite
// and max|lhs| * max|rhs| * (the largest group) is under FLT_MAX / 16, so no
// float product or partial sum, in any order, nor the rounding to bf16,
// overflows (the float error of a sum of d terms is at most d * 2^-24 of its
// magnitudes' sum: under twice it for d < 2^22). Then the output needs no
// scan: tgmm's output (local_groups x k x n) is far larger than its inputs
// (the skewed benchmark's: 512 MiB against 48), and a pass over it is a
// tenth of the call.
bool TgmmOutputsFinite(const View& v, const std::vector<int64_t>& starts, const kreg_host* host) {
  const int64_t first = starts[v.group_offset], last = starts[v.group_offset + v.local_groups];
  int64_t depth = 0;
  for (int64_t l = 0; l < v.local_groups; ++l) depth = std::max(depth, v.Size(l));
  const Mat lhs = v.Lhs(), rhs = v.Rhs(0);
  // Per row of lhs (its columns [first, last)), then per row [first, last) of rhs.
  std::vector<uint32_t> most(static_cast<size_t>(v.k + (last - first)), 0);
  const kreg_status status = RuntimeFor(static_cast<int64_t>(most.size()), host, [&](int64_t i) {
    most[i] = i < v.k ? MaxAbsBits(Advance(lhs.Row(i), v.in_bf16, first), v.in_bf16, last - first)
                      : MaxAbsBits(rhs.Row(first + i - v.k), v.in_bf16, v.n);
  }, 16);
  if (status != KREG_OK) return false;
  uint32_t lhs_bits = 0, rhs_bits = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(most.size()); ++i) {
    (i < v.k ? lhs_bits : rhs_bits) = std::max(i < v.k ? lhs_bits : rhs_bits, most[i]);
  }
  if (depth >= (int64_t{1} << 22) || lhs_bits >= 0x7f800000u || rhs_bits >= 0x7f800000u) return false;
  float lhs_max, rhs_max;
  std::memcpy(&lhs_max, &lhs_bits, sizeof lhs_max);
  std::memcpy(&rhs_max, &rhs_bits, sizeof rhs_max);
  return static_cast<double>(lhs_max) * rhs_max * static_cast<double>(depth) < 3.4028234663852886e38 / 16;
}

kreg_status TgmmRun(const View& v, State& s, const kreg_host* host) {
  if (v.k == 0 || v.n == 0) return KREG_OK;
  const std::vector<int64_t> starts = GroupStarts(v);
  const int64_t groups = v.local_groups;
  const Mat lhs = v.Lhs(), rhs = v.Rhs(0);
  const size_t row_bytes = static_cast<size_t>(v.n) * (v.out_bf16 ? 2 : 4);
  // With direct output and inputs that cannot overflow, nothing to fix up.
  const bool finite = s.direct && TgmmOutputsFinite(v, starts, host);

  kreg_status status = KREG_OK;
  for (int64_t l = 0; l < groups; ++l) {
    const int64_t g = v.group_offset + l;
    const int64_t r0 = starts[g], rows = starts[g + 1] - r0;
    const OutMat out = v.Out(l);
    if (Cancelled(host)) return KREG_CANCELLED;
    if (rows == 0) {
      status = RuntimeFor(v.k, host, [&](int64_t i) { std::memset(out.Row(i), 0, row_bytes); }, 16);
      if (status != KREG_OK) return status;
      continue;
    }
    const Prim& p = s.Get(v, rows);
    const void* src = Advance(lhs.p, v.in_bf16, r0);
    const void* wei = rhs.Row(r0);
    if (s.widen) {
      if ((status = Widen({src, lhs.ld, true}, v.k, rows, s.lhs_buf.data(), host)) != KREG_OK) return status;
      if ((status = Widen({wei, rhs.ld, true}, rows, v.n, s.rhs_buf.data(), host)) != KREG_OK) return status;
      src = s.lhs_buf.data();
      wei = s.rhs_buf.data();
    }
    {
      ThreadScope threads(host);
      Execute(s, p, src, wei, s.direct ? out.p : static_cast<void*>(s.scratch.data()));
    }
    if (finite) continue;
    status = RuntimeFor(v.k, host, [&](int64_t i) {
      void* o = out.Row(i);
      const float* f = s.direct ? nullptr : &s.scratch[i * v.n];
      if (s.direct && !AnyNonFinite(o, v.out_bf16, v.n)) return;
      for (int64_t c = 0; c < v.n; ++c) {
        if (!std::isfinite(s.direct ? LoadAt(o, v.out_bf16, c) : f[c])) {
          StoreDouble(o, v.out_bf16, c, TgmmDot(lhs, i, rhs, c, r0, starts[g + 1]));
        } else if (!s.direct) {
          StoreFloat(o, v.out_bf16, c, f[c]);
        }
      }
    });
    if (status != KREG_OK) return status;
  }
  return KREG_OK;
}

template <Op kOp>
kreg_status Run(const kreg_config*, const kreg_args* args, void* state, void*, size_t, const kreg_host* host,
                char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    View v;
    if (!ViewArgs(kOp, args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = CheckCpu(args, host, msg, cap); s != KREG_OK) return s;
    std::unique_ptr<State> own;
    State* s = static_cast<State*>(state);
    if (s == nullptr) {
      ThreadScope threads(host);
      own = Build(kOp, v);
      s = own.get();
    }
    const kreg_status status = kOp == Op::kGmm ? GmmRun(v, *s, host) : TgmmRun(v, *s, host);
    return Finish(status, msg, cap);
  });
}

const kreg_kernel kGmmKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "onednn",
    .version = 1,
    .doc = "one oneDNN matmul per non-empty group (primitives cached per group size), exact fallback for wild values",
    .check = Check<Op::kGmm>,
    .run = Run<Op::kGmm>,
    .prepare = Prepare<Op::kGmm>,
    .release = Release,
};

const kreg_kernel kTgmmKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "tgmm",
    .variant = "onednn",
    .version = 1,
    .doc = "one oneDNN matmul per non-empty group on a strided lhs view, exact fallback for wild values",
    .check = Check<Op::kTgmm>,
    .run = Run<Op::kTgmm>,
    .prepare = Prepare<Op::kTgmm>,
    .release = Release,
};

const kreg_kernel* const kKernels[] = {&kGmmKernel, &kTgmmKernel};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "gmm_onednn",
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = sizeof kKernels / sizeof kKernels[0],
};

}  // namespace
}  // namespace kreg::gmm_onednn

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kreg::gmm_onednn::kPlugin; }
