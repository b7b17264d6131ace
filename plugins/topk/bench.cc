// topk_bench: every available topk kernel of the registry, plain peers
// (std::partial_sort, std::nth_element + sort, FAISS's heap) and a memory
// floor, on the shapes kreg is tuned for, f32 and bf16, in one run on the
// same oneTBB threads.
//
//   build/release/bin/topk_bench --benchmark_filter=b32_n201088
//   build/release/bin/topk_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
//       --benchmark_out=topk.json --benchmark_out_format=json
//   python3 bench/ratios.py topk.json
//
// Kernels are read from the build's plugin folder at run time, so a new
// variant is benchmarked without touching this file. Each benchmark checks
// its output once against the op's reference before it is timed. Kernels are
// prepared once per input buffer (Kernel::Prepare, outside the clock) and
// timed by PreparedRun::Run on the op's arguments (kreg_args), as `kreg run`
// and the tuner time them.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_reduce.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kreg/op.h"
#include "kreg/plugin_abi.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "kreg/tensor.h"

#ifdef KREG_BENCH_HAVE_FAISS
#include <faiss/utils/Heap.h>
#endif

namespace {

struct Shape {
  int64_t batch, n, k;
  std::string Label() const { return absl::StrCat("b", batch, "_n", n, "_k", k); }
};

// Decode-time vocabularies (201088) at two batch sizes, a wide k on a
// medium row, and one very long row.
const Shape kShapes[] = {
    {128, 201088, 64}, {32, 201088, 64}, {64, 32768, 2048}, {1, 1000000, 100}};
const kreg::DType kDTypes[] = {kreg::DType::kF32, kreg::DType::kBF16};

// --benchmark_min_time unless given: long enough for a stable median, short
// enough that the whole suite takes a few minutes on 2 cores.
constexpr double kMinTimeSeconds = 0.3;

// Inputs smaller than this are rotated among several buffers (different
// seeds) so that each iteration reads memory the previous one did not leave
// in cache. Well past any L3 kreg's machines report (16-32 MiB): on a 2-core
// Zen 4 VM a 64 MiB rotation let the floor read 8 MiB in 0.10-0.25 ms from
// run to run (up to 84 GB/s, cache speed), at 512 MiB 0.145-0.28 ms. (All
// shapes' buffers together then hold about 3 GiB.)
constexpr size_t kRotateBelowBytes = size_t{512} << 20;
constexpr int kMaxBuffers = 64;

// ---- Best-known parameters ------------------------------------------------

// NAME=VALUE overrides (as Kernel::ParseConfig reads them) for a variant on a
// shape label ("b128_n201088_k64"), or on every shape ("*"; an exact label
// wins). Variants without an entry run their DefaultConfig().
struct BestParams {
  const char* variant;
  const char* shape;
  std::vector<std::string> params;
};

const std::vector<BestParams>& BestParamsTable() {
  static const auto* table = new std::vector<BestParams>{
      // Found by hand with `kreg run`; the tuner (issue 4) will own this.
      {"sort", "b64_n32768_k2048", {"method=nth_element"}},
      {"radix", "b64_n32768_k2048", {"first_bits=12"}},
      {"blockwise", "b64_n32768_k2048", {"num_blocks=256", "m_schedule=16", "stage2=nth_element"}},
  };
  return *table;
}

std::vector<std::pair<std::string, std::string>> BestParamsFor(const std::string& variant,
                                                               const std::string& shape) {
  const BestParams* found = nullptr;
  for (const BestParams& entry : BestParamsTable()) {
    if (variant != entry.variant) continue;
    if (shape == entry.shape) {
      found = &entry;
      break;
    }
    if (std::string(entry.shape) == "*") found = &entry;
  }
  std::vector<std::pair<std::string, std::string>> out;
  if (found == nullptr) return out;
  for (const std::string& p : found->params) {
    size_t eq = p.find('=');
    out.emplace_back(p.substr(0, eq), eq == std::string::npos ? "" : p.substr(eq + 1));
  }
  return out;
}

// ---- The op -------------------------------------------------------------------

// Op "topk" and its reference, from the registry main() loads.
struct TopKOp {
  std::shared_ptr<const kreg::Op> op;
  std::shared_ptr<const kreg::Kernel> reference;
  // Where the peers find what they read and write in kreg_args: tensor and
  // dim indices, by name (the op's descriptor says the order).
  int input = -1, values = -1, indices = -1;
  int batch = -1, n = -1, k = -1;
};

TopKOp& TheOp() {
  static auto* op = new TopKOp;
  return *op;
}

absl::Status InitOp(const kreg::Registry& registry) {
  absl::StatusOr<std::shared_ptr<const kreg::Op>> op = registry.GetOp("topk");
  if (!op.ok()) return op.status();
  TopKOp& t = TheOp();
  t.op = *op;
  t.reference = registry.Reference("topk");
  t.input = t.op->FindTensor("input");
  t.values = t.op->FindTensor("values");
  t.indices = t.op->FindTensor("indices");
  t.batch = t.op->FindDim("batch");
  t.n = t.op->FindDim("n");
  t.k = t.op->FindDim("k");
  if (std::min({t.input, t.values, t.indices, t.batch, t.n, t.k}) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("op topk lacks a tensor or dim the peers need: ", t.op->Describe()));
  }
  return absl::OkStatus();
}

// What a peer reads and writes of a topk call (compact tensors, whole rows).
struct TopKView {
  const DLTensor* input;
  DLTensor* values;
  DLTensor* indices;
  int64_t batch, n, k;
};

TopKView ViewOf(const kreg_args& a) {
  const TopKOp& t = TheOp();
  return {a.tensors[t.input], a.tensors[t.values], a.tensors[t.indices],
          a.dims[t.batch],    a.dims[t.n],         a.dims[t.k]};
}

// ---- Inputs ----------------------------------------------------------------

// The op's arguments with one input tensor swapped for another: owns the
// tensor pointer array the kreg_args points at. Not movable once built.
struct Args {
  std::vector<DLTensor*> tensors;
  kreg_args args{};
};

// One (shape, dtype): the Problem (its input is buffer 0, and it checks
// outputs against the reference), more input buffers, and the op's arguments
// per buffer, all writing into the Problem's outputs.
struct Case {
  std::unique_ptr<kreg::Problem> problem;
  std::vector<kreg::Tensor> more_inputs;
  std::deque<Args> args;  // stable addresses: kreg_args point into them
};

int NumBuffers(size_t bytes) {
  if (bytes >= kRotateBelowBytes) return 1;
  return static_cast<int>(std::clamp<size_t>((kRotateBelowBytes + bytes - 1) / bytes, 2, kMaxBuffers));
}

// Built on first use, so a --benchmark_filter only pays for what it runs.
absl::StatusOr<Case*> GetCase(const Shape& shape, kreg::DType dtype) {
  static auto* cases = new std::map<std::string, std::unique_ptr<Case>>;
  std::unique_ptr<Case>& slot = (*cases)[absl::StrCat(shape.Label(), "/", kreg::DTypeName(dtype))];
  if (slot) return slot.get();
  const TopKOp& t = TheOp();
  absl::StatusOr<kreg::Values> values =
      t.op->ParseValues(kreg::Dims{{"batch", shape.batch}, {"n", shape.n}, {"k", shape.k}});
  if (!values.ok()) return values.status();
  kreg::ProblemOptions options;
  options.dtypes = {{"", dtype}};
  options.dist = kreg::Dist::kNormal;
  options.seed = 1;
  absl::StatusOr<std::unique_ptr<kreg::Problem>> problem =
      kreg::Problem::Make(t.op, t.reference, *values, options);
  if (!problem.ok()) return problem.status();
  auto c = std::make_unique<Case>();
  c->problem = *std::move(problem);
  const int buffers = NumBuffers(static_cast<size_t>(shape.batch * shape.n) * kreg::DTypeSize(dtype));
  for (int i = 1; i < buffers; ++i) {
    c->more_inputs.emplace_back(dtype, std::vector<int64_t>{shape.batch, shape.n});
    kreg::FillRandom(c->more_inputs.back(), kreg::Dist::kNormal, options.seed + i);
  }
  // Only now take DLPack views: they are invalidated when a Tensor moves.
  const kreg_args& base = *c->problem->args();
  auto add = [&](const DLTensor* input) {
    Args& a = c->args.emplace_back();
    a.tensors.assign(base.tensors, base.tensors + base.num_tensors);
    // Inputs are only read (kreg_args' contract); the ABI's pointers are not const.
    if (input != nullptr) a.tensors[t.input] = const_cast<DLTensor*>(input);
    a.args = base;
    a.args.tensors = a.tensors.data();
  };
  add(nullptr);
  for (const kreg::Tensor& more : c->more_inputs) add(more.dl());
  slot = std::move(c);
  return slot.get();
}

// ---- Peers -------------------------------------------------------------------

inline float ToFloat(float v) { return v; }
inline float ToFloat(uint16_t bf16) { return kreg::Bf16ToFloat(bf16); }

// Calls fn(row, n, k, values_row, indices_row) for every row, rows in
// parallel on oneTBB's default arena, as the kernels do. Our tensors are
// compact, so rows are plain offsets.
template <typename T, typename Fn>
void ForEachRow(const kreg_args& args, Fn fn) {
  const TopKView a = ViewOf(args);
  const int64_t n = a.n, k = a.k;
  const T* in = static_cast<const T*>(a.input->data);
  T* values = static_cast<T*>(a.values->data);
  int32_t* indices = static_cast<int32_t*>(a.indices->data);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, a.batch),
                    [&](const tbb::blocked_range<int64_t>& rows) {
                      for (int64_t r = rows.begin(); r != rows.end(); ++r) {
                        fn(in + r * n, n, k, values + r * k, indices + r * k);
                      }
                    });
}

// (a) What a user writes first: (value, index) pairs, std::partial_sort.
template <typename T>
void PartialSortPeer(const kreg_args& a) {
  ForEachRow<T>(a, [](const T* row, int64_t n, int64_t k, T* values, int32_t* indices) {
    thread_local std::vector<std::pair<float, int32_t>> items;
    items.resize(n);
    for (int64_t c = 0; c < n; ++c) items[c] = {ToFloat(row[c]), static_cast<int32_t>(c)};
    std::partial_sort(items.begin(), items.begin() + k, items.end(), [](const auto& x, const auto& y) {
      return x.first > y.first || (x.first == y.first && x.second < y.second);
    });
    for (int64_t j = 0; j < k; ++j) {
      indices[j] = items[j].second;
      values[j] = row[items[j].second];
    }
  });
}

// (b) The other plain thing: an index array, std::nth_element, then a sort
// of the k best, all with a value comparator.
template <typename T>
void NthElementSortPeer(const kreg_args& a) {
  ForEachRow<T>(a, [](const T* row, int64_t n, int64_t k, T* values, int32_t* indices) {
    thread_local std::vector<int32_t> order;
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    auto better = [row](int32_t i, int32_t j) {
      float x = ToFloat(row[i]), y = ToFloat(row[j]);
      return x > y || (x == y && i < j);
    };
    std::nth_element(order.begin(), order.begin() + k, order.end(), better);
    std::sort(order.begin(), order.begin() + k, better);
    for (int64_t j = 0; j < k; ++j) {
      indices[j] = order[j];
      values[j] = row[order[j]];
    }
  });
}

#ifdef KREG_BENCH_HAVE_FAISS
// (c) FAISS's CPU k-selection: a size-k min-heap per row (the loop of
// faiss::heap_addn), then faiss::heap_reorder. FAISS's own HeapArray::addn
// parallelises with OpenMP; rows go on oneTBB here so every entry shares the
// same threads. bf16 rows are widened to f32 as they are read.
template <typename T>
void FaissHeapPeer(const kreg_args& a) {
  using C = faiss::CMin<float, int64_t>;  // the worst of the k best on top
  ForEachRow<T>(a, [](const T* row, int64_t n, int64_t k, T* values, int32_t* indices) {
    thread_local std::vector<float> heap_values;
    thread_local std::vector<int64_t> heap_ids;
    heap_values.resize(k);
    heap_ids.resize(k);
    faiss::heap_heapify<C>(k, heap_values.data(), heap_ids.data());
    // Ids are n - column: FAISS lets the smaller id lose among equal values,
    // so the larger column loses, as kreg's order wants, and no id is FAISS's
    // empty marker -1.
    for (int64_t c = 0; c < n; ++c) {
      const float x = ToFloat(row[c]);
      if (C::cmp(heap_values[0], x)) faiss::heap_replace_top<C>(k, heap_values.data(), heap_ids.data(), x, n - c);
    }
    faiss::heap_reorder<C>(k, heap_values.data(), heap_ids.data());
    for (int64_t j = 0; j < k; ++j) {
      indices[j] = static_cast<int32_t>(n - heap_ids[j]);
      values[j] = row[indices[j]];
    }
  });
}
#endif

// (d) The memory floor: one streaming read of the whole input (a sum of its
// 32-bit words, vectorised with AVX-512 or AVX2 where the CPU has it), cut into one
// contiguous piece per thread whatever the batch. No top-k of this input can
// be faster.
__attribute__((target_clones("avx512f", "avx2", "default"))) uint32_t SumWords(const uint32_t* p, size_t n) {
  uint32_t s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

void StreamRead(const kreg_args& args) {
  const TopKView a = ViewOf(args);
  const size_t words = static_cast<size_t>(a.batch * a.n) * (a.input->dtype.bits / 8) / 4;
  const uint32_t* p = static_cast<const uint32_t*>(a.input->data);
  const size_t pieces = static_cast<size_t>(tbb::this_task_arena::max_concurrency());
  uint32_t sum = tbb::parallel_reduce(
      tbb::blocked_range<size_t>(0, words, (words + pieces - 1) / pieces), uint32_t{0},
      [p](const tbb::blocked_range<size_t>& r, uint32_t s) { return s + SumWords(p + r.begin(), r.size()); },
      std::plus<>(), tbb::static_partitioner());
  benchmark::DoNotOptimize(sum);
}

// ---- Benchmarks ---------------------------------------------------------------

// One run of an entry on one buffer's arguments, set up outside the clock.
using RunFn = std::function<absl::Status()>;
// Sets an entry up on one buffer's arguments (a kernel: Kernel::Prepare).
using PrepareFn = std::function<absl::StatusOr<RunFn>(const kreg_args&)>;

struct Entry {
  Shape shape;
  kreg::DType dtype;
  PrepareFn prepare;
  bool check = true;                     // false for the floor: it has no outputs
  absl::Status setup;                    // e.g. a best-known config that did not parse
  std::string label;                     // the config, printed with the result
  std::optional<absl::Status> verified;  // the one check, once done
};

void Skip(benchmark::State& state, const absl::Status& status) {
  state.SkipWithError(status.ToString().c_str());
}

void RunEntry(benchmark::State& state, Entry& e) {
  if (!e.setup.ok()) return Skip(state, e.setup);
  absl::StatusOr<Case*> c = GetCase(e.shape, e.dtype);
  if (!c.ok()) return Skip(state, c.status());
  kreg::Problem& problem = *(*c)->problem;
  // Prepared per call of this function, released at its end: prepared
  // states and the shared workspace belong to one benchmark at a time.
  std::vector<RunFn> runs;
  for (const Args& a : (*c)->args) {
    absl::StatusOr<RunFn> run = e.prepare(a.args);
    if (!run.ok()) return Skip(state, run.status());
    runs.push_back(*std::move(run));
  }
  if (!e.verified) {
    absl::Status s;
    if (e.check) {
      // Poisoned first, so outputs left unwritten (or left by the previous
      // entry) are caught.
      problem.PoisonOutputs();
      s = runs[0]();
      if (s.ok()) s = problem.CheckOutputs();
    }
    e.verified = s;
  }
  if (!e.verified->ok()) return Skip(state, *e.verified);
  size_t i = 0;
  for (auto _ : state) {
    absl::Status s = runs[i++ % runs.size()]();
    if (!s.ok()) {
      Skip(state, s);
      break;
    }
  }
  const int64_t elements = e.shape.batch * e.shape.n;
  state.SetItemsProcessed(state.iterations() * elements);
  state.SetBytesProcessed(state.iterations() * elements * static_cast<int64_t>(kreg::DTypeSize(e.dtype)));
  state.counters["buffers"] = static_cast<double>(runs.size());
  if (!e.label.empty()) state.SetLabel(e.label.c_str());
}

kreg::Workspace& SharedWorkspace() {
  // Benchmarks run one at a time, and one benchmark's buffers have the same
  // shape (so the same workspace size): the kernels can share one.
  static auto* workspace = new kreg::Workspace;
  return *workspace;
}

// An entry that calls `f` on the arguments: nothing to prepare.
Entry PlainEntry(void (*f)(const kreg_args&)) {
  Entry e;
  e.prepare = [f](const kreg_args& a) -> absl::StatusOr<RunFn> {
    const kreg_args* args = &a;  // lives in the Case
    return RunFn([f, args] {
      f(*args);
      return absl::OkStatus();
    });
  };
  return e;
}

// A peer's entry: its f32 or bf16 instantiation, by the input's dtype.
Entry PeerEntry(void (*f32)(const kreg_args&), void (*bf16)(const kreg_args&)) {
  Entry e;
  e.prepare = [f32, bf16](const kreg_args& a) -> absl::StatusOr<RunFn> {
    const kreg_args* args = &a;  // lives in the Case
    void (*f)(const kreg_args&) = ViewOf(a).input->dtype.code == kDLBfloat ? bf16 : f32;
    return RunFn([f, args] {
      f(*args);
      return absl::OkStatus();
    });
  };
  return e;
}

// `extra`: parameters set beyond the best-known ones (e.g. simd=avx512).
Entry KernelEntry(const std::shared_ptr<const kreg::Kernel>& kernel, const Shape& shape,
                  const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  Entry e;
  std::vector<std::pair<std::string, std::string>> params = BestParamsFor(std::string(kernel->variant()), shape.Label());
  params.insert(params.end(), extra.begin(), extra.end());
  absl::StatusOr<kreg::Config> config = kernel->ParseConfig(params);
  if (!config.ok()) {
    e.setup = absl::InvalidArgumentError(
        absl::StrCat("best-known params of ", kernel->name(), ": ", config.status().message()));
    return e;
  }
  e.label = kernel->ConfigString(*config);
  e.prepare = [kernel, config = *config](const kreg_args& a) -> absl::StatusOr<RunFn> {
    kreg::RunOptions options;
    options.workspace = &SharedWorkspace();
    // Checks the arguments and the configuration, sizes the workspace and
    // prepares the kernel's state; the run does nothing else.
    absl::StatusOr<std::unique_ptr<kreg::PreparedRun>> prepared = kernel->Prepare(config, a, options);
    if (!prepared.ok()) return prepared.status();
    std::shared_ptr<kreg::PreparedRun> run = *std::move(prepared);
    return RunFn([run] { return run->Run(); });
  };
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  // The default min time goes in as a flag, not Benchmark::MinTime(), which
  // would override the flag and put "min_time:..." into every name.
  std::vector<char*> args(argv, argv + argc);
  std::string min_time_flag = absl::StrCat("--benchmark_min_time=", kMinTimeSeconds);
  if (std::none_of(args.begin(), args.end(),
                   [](const char* a) { return std::strncmp(a, "--benchmark_min_time", 20) == 0; })) {
    args.insert(args.begin() + 1, min_time_flag.data());
  }
  argc = static_cast<int>(args.size());
  args.push_back(nullptr);
  argv = args.data();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  // The build's plugins first, then KREG_PLUGIN_PATH; never an installed
  // kreg's, which could be older than this tree.
  kreg::LoadOptions load;
  load.plugin_paths = {KREG_PLUGIN_DIR};
  load.use_default_dirs = false;
  absl::StatusOr<std::unique_ptr<kreg::Registry>> registry = kreg::Registry::Load(load);
  if (!registry.ok()) {
    std::fprintf(stderr, "topk_bench: %s\n", registry.status().ToString().c_str());
    return 1;
  }
  for (const absl::Status& refusal : (*registry)->refusals()) {
    std::fprintf(stderr, "topk_bench: warning: %s\n", refusal.ToString().c_str());
  }
  if (absl::Status s = InitOp(**registry); !s.ok()) {
    std::fprintf(stderr, "topk_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<std::shared_ptr<const kreg::Kernel>> kernels;
  for (const auto& kernel : (*registry)->Kernels("topk")) {
    // The reference is the oracle every entry is checked against, not a
    // contender (as for kreg tune).
    if (kernel->is_reference()) continue;
    if (kernel->available()) {
      kernels.push_back(kernel);
    } else {
      std::fprintf(stderr, "topk_bench: skipping %s: %s\n", kernel->name().c_str(),
                   kernel->device() != 0
                       ? "a CUDA kernel (this benchmark times CPU kernels; bench/gpu_peers.py times it on a GPU)"
                       : ("this CPU lacks " + kreg::IsaString(kernel->required_isa())).c_str());
    }
  }
#ifndef KREG_BENCH_HAVE_FAISS
  std::fprintf(stderr, "topk_bench: built without FAISS; no peer/faiss_heap benchmarks\n");
#endif

  std::deque<Entry> entries;  // stable addresses for the registered lambdas
  auto add = [&](const std::string& name, Entry e, const Shape& shape, kreg::DType dtype) {
    e.shape = shape;
    e.dtype = dtype;
    Entry* entry = &entries.emplace_back(std::move(e));
    benchmark::RegisterBenchmark(name.c_str(), [entry](benchmark::State& state) { RunEntry(state, *entry); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  for (const Shape& shape : kShapes) {
    for (kreg::DType dtype : kDTypes) {
      const std::string suffix = absl::StrCat("/", kreg::DTypeName(dtype), "/", shape.Label());
      Entry floor = PlainEntry(StreamRead);
      floor.check = false;
      add("floor/stream_read" + suffix, std::move(floor), shape, dtype);
      for (const auto& kernel : kernels) {
        add(kernel->name() + suffix, KernelEntry(kernel, shape), shape, dtype);
        // A wider vector ISA than the default (topk/heap's simd=avx512), where this CPU has it.
        if (kernel->ParseConfig({{"simd", "avx512"}}).ok()) {
          add(kernel->name() + "_avx512" + suffix, KernelEntry(kernel, shape, {{"simd", "avx512"}}), shape, dtype);
        }
      }
      add("peer/partial_sort" + suffix,
          PeerEntry(PartialSortPeer<float>, PartialSortPeer<uint16_t>), shape, dtype);
      add("peer/nth_element_sort" + suffix,
          PeerEntry(NthElementSortPeer<float>, NthElementSortPeer<uint16_t>), shape, dtype);
#ifdef KREG_BENCH_HAVE_FAISS
      // bf16 is widened to f32 on the fly: FAISS has no bf16 heap.
      add(std::string(dtype == kreg::DType::kBF16 ? "peer/faiss_heap_cvt" : "peer/faiss_heap") + suffix,
          PeerEntry(FaissHeapPeer<float>, FaissHeapPeer<uint16_t>), shape, dtype);
#endif
    }
  }

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
