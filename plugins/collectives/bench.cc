// collectives_bench: kreg's collective variants against the peers a user
// would otherwise call, in one run.
//
//   Alone: the threads backend. Every variant of allgather, allreduce and
//   reduce_scatter on 2 and 4 thread ranks of this process, against memcpy
//   of the same bytes on one thread (peer/memcpy: the machine's copy
//   bandwidth, the yardstick of the bus bandwidth) and on two threads at
//   once (peer/memcpy_2threads: what the ranks' two cores copy together,
//   the yardstick of the traffic bounds in bench/RESULTS.md).
//
//   Under mpirun -n P (P > 1): the mpi backend. Every variant against Open
//   MPI's own MPI_Allgather, MPI_Allreduce and MPI_Reduce_scatter_block
//   (peer/mpi) on the same ranks. Rank 0 runs Google Benchmark and leads;
//   the others follow its commands (which case, one iteration at a time), so
//   every rank runs each iteration together.
//
// An iteration is timed on rank 0 from a barrier to a barrier: the slowest
// rank's time. Sizes follow NCCL's tests: S is the bytes of allreduce's
// vector, of allgather's output and of reduce_scatter's input (per rank);
// counters algbw = S / time and busbw = algbw x 2(P-1)/P (allreduce) or
// (P-1)/P (allgather, reduce_scatter), bytes per second; memcpy's bw is its
// S / time. f32 sums throughout. Run:
//
//   build/release/bin/collectives_bench --benchmark_repetitions=3
//   mpirun -n 2 build/release/bin/collectives_bench
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "kreg/comm.h"
#include "kreg/dispatch.h"
#include "kreg/problem.h"
#include "kreg/registry.h"

#ifdef KREG_BENCH_HAVE_MPI
#include <mpi.h>
#endif

namespace kreg {
namespace {

constexpr int64_t kSizes[] = {1 << 10, 16 << 10, 256 << 10, 4 << 20, 16 << 20, 64 << 20};
const char* const kOps[] = {"allgather", "allreduce", "reduce_scatter"};

std::string SizeName(int64_t bytes) {
  return bytes >= (1 << 20) ? absl::StrCat(bytes >> 20, "MiB") : absl::StrCat(bytes >> 10, "KiB");
}

// Elements per rank (the op's count) for S bytes of f32.
int64_t CountOf(const std::string& op, int64_t bytes, int ranks) {
  return op == "allreduce" ? bytes / 4 : bytes / 4 / ranks;
}

double BusFactor(const std::string& op, int ranks) {
  return (op == "allreduce" ? 2.0 : 1.0) * (ranks - 1) / ranks;
}

benchmark::Counter BytesPerSecond(double bytes_per_iteration) {
  return benchmark::Counter(bytes_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                            benchmark::Counter::OneK::kIs1000);
}

void SetBandwidth(benchmark::State& state, const std::string& op, int64_t bytes, int ranks) {
  state.counters["algbw"] = BytesPerSecond(static_cast<double>(bytes));
  state.counters["busbw"] = BytesPerSecond(static_cast<double>(bytes) * BusFactor(op, ranks));
}

Registry& TheRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry();
    for (const absl::Status& s : r->LoadPlugins({std::string(KREG_PLUGIN_DIR) + "/kreg_collectives.so",
                                                 std::string(KREG_PLUGIN_DIR) + "/kreg_gmm.so"})) {
      std::cerr << "collectives_bench: " << s << "\n";
    }
    return r;
  }();
  return *registry;
}

// One rank's part of a kernel case: its problem and prepared run.
struct RankRun {
  std::unique_ptr<Problem> problem;
  std::unique_ptr<PreparedRun> run;
};

// The sub-ops of composite ops (sharded_matmul's gmm): each op's default.
const Dispatcher& TheDispatcher() {
  static const Dispatcher* dispatcher = new Dispatcher(*Dispatcher::Create(TheRegistry(), TuningDb()));
  return *dispatcher;
}

absl::StatusOr<RankRun> Prepare(const Kernel& kernel, Comm& comm, Dims dims, const Mesh& mesh = {}) {
  absl::StatusOr<Values> values = kernel.op_info().ParseValues(dims);
  if (!values.ok()) return values.status();
  absl::Status set = mesh.empty() ? kernel.op_info().SetRanks(&*values, comm.size())
                                  : kernel.op_info().SetMesh(&*values, mesh);
  if (!set.ok()) return set;
  ProblemOptions options;
  options.comm = comm.abi();
  options.seed = 7;
  RankRun r;
  absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(kernel.op_ptr(), nullptr, *values, options);
  if (!problem.ok()) return problem.status();
  r.problem = *std::move(problem);
  RunOptions run;
  run.comm = comm.abi();
  // No oneTBB arena around the run (num_threads 0): the collectives start
  // no threads of their own, and sharded_matmul's gmm calls get one thread
  // each through dispatch below.
  run.num_threads = 0;
  run.dispatch = [](absl::string_view op, const kreg_args& args) {
    RunOptions sub;
    sub.num_threads = 1;
    return TheDispatcher().Run(op, args, sub).status();
  };
  absl::StatusOr<std::unique_ptr<PreparedRun>> prepared = kernel.Prepare(kernel.DefaultConfig(), *r.problem->args(), run);
  if (!prepared.ok()) return prepared.status();
  r.run = *std::move(prepared);
  return r;
}

// ---- threads ------------------------------------------------------------------------

// Ranks 1..n-1 as threads that run one iteration whenever rank 0 (the
// benchmark's thread) starts one.
class ThreadRanks {
 public:
  ThreadRanks(int n, std::function<absl::Status(Comm&)> iteration, const Mesh& mesh = {})
      : comms_(ThreadComms(n, {.mesh = mesh})), iteration_(std::move(iteration)) {
    for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { Follow(*comms_[r]); });
  }
  ~ThreadRanks() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Comm& rank0() { return *comms_[0]; }
  std::vector<std::unique_ptr<Comm>>& comms() { return comms_; }
  // Starts one iteration on ranks 1.. (rank 0 runs its own part).
  void Start() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generation_;
    }
    cv_.notify_all();
  }

 private:
  void Follow(Comm& comm) {
    int64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      lock.unlock();
      if (absl::Status s = iteration_(comm); !s.ok()) std::cerr << "rank " << comm.rank() << ": " << s << "\n";
    }
  }
  std::vector<std::unique_ptr<Comm>> comms_;
  std::function<absl::Status(Comm&)> iteration_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t generation_ = 0;
  bool stop_ = false;
};

// Times `kernel` on `ranks` thread ranks (a `mesh` of them) with `dims`:
// returns false after SkipWithError.
bool TimeThreads(benchmark::State& state, const Kernel& kernel, int ranks, const Dims& dims, const Mesh& mesh = {}) {
  std::vector<RankRun> runs(ranks);
  ThreadRanks pool(
      ranks,
      [&](Comm& comm) -> absl::Status {
        if (absl::Status s = comm.Barrier(); !s.ok()) return s;
        absl::Status s = runs[comm.rank()].run->Run();
        return s.ok() ? comm.Barrier() : s;
      },
      mesh);
  for (auto& comm : pool.comms()) {  // the collectives' prepare does not talk
    absl::StatusOr<RankRun> r = Prepare(kernel, *comm, dims, mesh);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return false;
    }
    runs[comm->rank()] = *std::move(r);
  }
  for (auto _ : state) {
    pool.Start();
    Comm& me = pool.rank0();
    absl::Status s = me.Barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (s.ok()) s = runs[0].run->Run();
    if (s.ok()) s = me.Barrier();
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return false;
    }
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return true;
}

void BM_ThreadsKernel(benchmark::State& state, std::string kernel_name, int ranks, int64_t bytes) {
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = TheRegistry().Get(kernel_name);
  if (!kernel.ok()) return state.SkipWithError(std::string(kernel.status().message()).c_str());
  const std::string op = (*kernel)->op();
  if (TimeThreads(state, **kernel, ranks, Dims{{"count", CountOf(op, bytes, ranks)}})) {
    SetBandwidth(state, op, bytes, ranks);
  }
}

// sharded_matmul on a mesh of thread ranks: plain against overlapped.
void BM_ThreadsShardedMatmul(benchmark::State& state, std::string kernel_name, Mesh mesh, Dims dims) {
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = TheRegistry().Get(kernel_name);
  if (!kernel.ok()) return state.SkipWithError(std::string(kernel.status().message()).c_str());
  int ranks = 1;
  for (const auto& [axis, size] : mesh) ranks *= size;
  if (TimeThreads(state, **kernel, ranks, dims, mesh)) {
    const double flops = 2.0 * dims[0].second * dims[1].second * dims[2].second;
    state.counters["flops"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::OneK::kIs1000);
  }
}

// memcpy of S bytes on one thread: the machine's copy bandwidth. The two
// buffers are cut from one allocation, the destination half a page past
// the source modulo 4 KiB: two vectors of one size land 16 bytes apart
// modulo 4 KiB, where a copy's loads wait on its own stores (4K aliasing)
// and runs at a small fraction of the bandwidth at 16-256 KiB.
// A source and a destination of `bytes` each, 4K-aliasing free (BM_Memcpy).
class CopyBuffers {
 public:
  explicit CopyBuffers(int64_t bytes) : bytes_(bytes) {
    constexpr int64_t kPage = 4096;
    const int64_t stride = (bytes + kPage - 1) / kPage * kPage + kPage / 2;
    both_.resize(stride + bytes + kPage);
    a_ = both_.data() + (kPage - reinterpret_cast<uintptr_t>(both_.data()) % kPage) % kPage;
    b_ = a_ + stride;
    std::memset(a_, 1, bytes);
    std::memset(b_, 2, bytes);
  }
  void Copy() {
    std::memcpy(b_, a_, bytes_);
    benchmark::DoNotOptimize(b_);
    benchmark::ClobberMemory();
  }

 private:
  int64_t bytes_;
  std::vector<char> both_;
  char* a_;
  char* b_;
};

void BM_Memcpy(benchmark::State& state, int64_t bytes) {
  CopyBuffers buffers(bytes);
  for (auto _ : state) buffers.Copy();
  state.counters["bw"] = BytesPerSecond(static_cast<double>(bytes));
}

// memcpy of S bytes on each of two threads at once (buffers of their own):
// what the two cores the ranks share can copy together. bw: 2S / time.
void BM_Memcpy2(benchmark::State& state, int64_t bytes) {
  CopyBuffers mine(bytes), theirs(bytes);
  std::barrier sync(2);
  std::atomic<bool> stop{false};
  std::thread helper([&] {
    for (;;) {
      sync.arrive_and_wait();
      if (stop.load()) return;
      theirs.Copy();
      sync.arrive_and_wait();
    }
  });
  for (auto _ : state) {
    sync.arrive_and_wait();
    mine.Copy();
    sync.arrive_and_wait();
  }
  stop.store(true);
  sync.arrive_and_wait();
  helper.join();
  state.counters["bw"] = BytesPerSecond(2.0 * static_cast<double>(bytes));
}

void RegisterThreads() {
  for (int ranks : {2, 4}) {
    for (const char* op : kOps) {
      for (const auto& kernel : TheRegistry().Kernels(op)) {
        if (kernel->is_reference()) continue;
        for (int64_t bytes : kSizes) {
          benchmark::RegisterBenchmark(
              absl::StrCat("threads/", kernel->name(), "/r", ranks, "/", SizeName(bytes)).c_str(), BM_ThreadsKernel,
              kernel->name(), ranks, bytes)
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  for (int64_t bytes : kSizes) {
    benchmark::RegisterBenchmark(absl::StrCat("peer/memcpy/", SizeName(bytes)).c_str(), BM_Memcpy, bytes)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(absl::StrCat("peer/memcpy_2threads/", SizeName(bytes)).c_str(), BM_Memcpy2, bytes)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  // m, k, n where passing w's shards and multiplying take similar times on
  // a 2-core machine, and smaller and larger.
  for (const Mesh& mesh : {Mesh{{"x", 2}, {"y", 2}}, Mesh{{"x", 2}, {"y", 1}}}) {
    for (int64_t size : {256, 1024}) {
      for (const char* variant : {"plain", "overlapped"}) {
        const Dims dims = {{"m", size}, {"k", size}, {"n", size}};
        benchmark::RegisterBenchmark(absl::StrCat("threads/sharded_matmul/", variant, "/", MeshString(mesh), "/mkn",
                                                  size)
                                         .c_str(),
                                     BM_ThreadsShardedMatmul, absl::StrCat("sharded_matmul/", variant), mesh, dims)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

// ---- mpi ---------------------------------------------------------------------------

#ifdef KREG_BENCH_HAVE_MPI

// A case every rank can set up: a kreg kernel (name) or Open MPI's own
// collective (peer), for an op and a size.
struct MpiCase {
  std::string op, kernel;  // kernel "" for Open MPI's
  int64_t bytes;
};
std::vector<MpiCase>& MpiCases() {
  static std::vector<MpiCase> cases;
  return cases;
}

// What one rank holds for the case it runs now.
struct MpiState {
  int current = -1;
  RankRun run;
  std::vector<float> x, out;
};

absl::Status SetUp(Comm& comm, MpiState& st, int index) {
  if (st.current == index) return absl::OkStatus();
  st = MpiState();
  st.current = index;
  const MpiCase& c = MpiCases()[index];
  const int64_t count = CountOf(c.op, c.bytes, comm.size());
  if (c.kernel.empty()) {
    const int64_t in = c.op == "reduce_scatter" ? count * comm.size() : count;
    const int64_t out = c.op == "allgather" ? count * comm.size() : count;
    st.x.assign(in, 1.0f);
    st.out.assign(out, 0.0f);
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = TheRegistry().Get(c.kernel);
  if (!kernel.ok()) return kernel.status();
  absl::StatusOr<RankRun> r = Prepare(**kernel, comm, Dims{{"count", count}});
  if (!r.ok()) return r.status();
  st.run = *std::move(r);
  return absl::OkStatus();
}

absl::Status RunOnce(Comm& comm, const MpiState& st) {
  const MpiCase& c = MpiCases()[st.current];
  if (!c.kernel.empty()) return st.run.run->Run();
  const int count = static_cast<int>(CountOf(c.op, c.bytes, comm.size()));
  int code = MPI_SUCCESS;
  if (c.op == "allreduce") {
    code = MPI_Allreduce(st.x.data(), const_cast<float*>(st.out.data()), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (c.op == "allgather") {
    code = MPI_Allgather(st.x.data(), count, MPI_FLOAT, const_cast<float*>(st.out.data()), count, MPI_FLOAT,
                         MPI_COMM_WORLD);
  } else {
    code = MPI_Reduce_scatter_block(st.x.data(), const_cast<float*>(st.out.data()), count, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
  }
  return code == MPI_SUCCESS ? absl::OkStatus() : absl::InternalError("MPI collective failed");
}

// One timed iteration of case `index` on every rank: barrier, run, barrier.
absl::StatusOr<double> Iterate(Comm& comm, MpiState& st, int index) {
  if (absl::Status s = SetUp(comm, st, index); !s.ok()) return s;
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  if (absl::Status s = RunOnce(comm, st); !s.ok()) return s;
  MPI_Barrier(MPI_COMM_WORLD);
  return MPI_Wtime() - t0;
}

Comm* g_comm = nullptr;
MpiState* g_state = nullptr;

// Rank 0: tells the others which case comes next (-1: the end).
void Lead(int index) { MPI_Bcast(&index, 1, MPI_INT, 0, MPI_COMM_WORLD); }

void BM_Mpi(benchmark::State& state, int index) {
  const MpiCase& c = MpiCases()[index];
  for (auto _ : state) {
    Lead(index);
    absl::StatusOr<double> t = Iterate(*g_comm, *g_state, index);
    if (!t.ok()) return state.SkipWithError(std::string(t.status().message()).c_str());
    state.SetIterationTime(*t);
  }
  SetBandwidth(state, c.op, c.bytes, g_comm->size());
}

void RegisterMpi(int ranks) {
  for (const char* op : kOps) {
    std::vector<std::string> contestants = {""};
    for (const auto& kernel : TheRegistry().Kernels(op)) {
      if (!kernel->is_reference()) contestants.push_back(kernel->name());
    }
    for (int64_t bytes : kSizes) {
      for (const std::string& k : contestants) {
        MpiCases().push_back({op, k, bytes});
        benchmark::RegisterBenchmark(
            absl::StrCat("mpi/", k.empty() ? absl::StrCat(op, "/peer_mpi") : k, "/r", ranks, "/", SizeName(bytes))
                .c_str(),
            BM_Mpi, static_cast<int>(MpiCases().size() - 1))
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

#endif  // KREG_BENCH_HAVE_MPI

}  // namespace
}  // namespace kreg

int main(int argc, char** argv) {
  int world = 1, rank = 0;
#ifdef KREG_BENCH_HAVE_MPI
  // Under mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE): the mpi backend.
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (size != nullptr && std::atoi(size) > 1) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
#endif
  if (world == 1) {
    kreg::RegisterThreads();
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  }
#ifdef KREG_BENCH_HAVE_MPI
  absl::StatusOr<std::unique_ptr<kreg::Comm>> comm = kreg::LoadMpiComm({});
  if (!comm.ok()) {
    std::cerr << "collectives_bench: " << comm.status() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  kreg::MpiState state;
  kreg::g_comm = comm->get();
  kreg::g_state = &state;
  kreg::RegisterMpi(world);
  if (rank == 0) {
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    kreg::Lead(-1);
  } else {
    for (;;) {
      int index = -1;
      MPI_Bcast(&index, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (index < 0) break;
      if (absl::StatusOr<double> t = kreg::Iterate(**comm, state, index); !t.ok()) {
        std::cerr << "rank " << rank << ": " << t.status() << "\n";
      }
    }
  }
  state = kreg::MpiState();
  comm->reset();
  MPI_Finalize();
#endif
  return 0;
}
