// Measuring candidates in a child process, so that a candidate that crashes
// or hangs is recorded as failed and the sweep goes on.
//
// The parent (IsolatedRunner) starts a worker — the installed `kreg-worker`
// program (FindWorker) — and speaks the protocol of autotune/worker.proto
// over its stdin and stdout: length-delimited protobuf messages, one Job
// describing the problem, then one request per candidate (Run) or per
// kernel's batch of candidates (Check); the worker answers Started before it
// works on a request and Done or Checked after. A worker that dies or stays
// silent past the timeout is killed; its candidate (or every candidate of
// its batch) is recorded as crashed or timed out, and the next request
// starts a fresh worker. Plugin code runs only in the worker: its legality
// checks as well as its runs.
//
// In the worker every candidate's output is checked against the op's
// reference (computed once per input, before any candidate) before any of
// its time counts; timed runs rotate among several input buffers so caches
// do not flatter small problems, after `warmup` untimed runs, and repeat up
// to `reps` times, stopping early once the running median is stable (the
// last three within 1%, at least 5 samples) or past max_seconds_per_run. A
// candidate checked once (by this worker or an earlier one of the same
// runner) is not checked again.
//
// Thread-safety: an IsolatedRunner is used from one thread at a time, and
// that thread must outlive its workers (they die with it: PR_SET_PDEATHSIG).
// Starting a worker sets SIGPIPE to SIG_IGN if it was at its default, so a
// worker dying early shows up as an error rather than killing the caller.
#ifndef KREG_AUTOTUNE_WORKER_H_
#define KREG_AUTOTUNE_WORKER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kreg/autotune.h"
#include "kreg/problem.h"

namespace kreg {
namespace worker {
class Job;  // kreg/worker.pb.h, generated from autotune/worker.proto
class Reply;
}  // namespace worker

// What a worker needs to rebuild the problem: the op, its dims and inputs,
// and the plugin files the parent loaded.
struct WorkerJob {
  std::string op;
  NamedValues values;  // dims and attributes
  // Dtypes by tensor name ("" for every tensor that allows it).
  std::vector<std::pair<std::string, std::string>> dtypes;
  std::vector<std::string> with;  // optional inputs to generate
  Dist dist = Dist::kNormal;
  Partition partition = Partition::kRandom;
  uint64_t seed = 1;
  std::vector<std::pair<std::string, std::string>> input_files;  // name -> .npy
  std::vector<std::string> plugins;                                // files
  int warmup = 2;
  int threads = 0;                  // 0: all cores
  double max_seconds_per_run = 5;  // stop repeating a candidate after this
  // Collective ops: that many thread ranks in the worker, each with its own
  // problem (inputs seeded by rank), measured together on a fresh threads
  // communicator per candidate; rank 0's measurement is the answer.
  int ranks = 0;
  double comm_timeout = 30;
  std::string mesh;  // a device mesh's axes (MeshString), or ""
  // Device kernels: KREG_DEVICE_CUDA and the device's ordinal (0: the
  // CPU's kernels); timed with the device's events, cold L2 unless warm.
  int device = 0;
  int device_ordinal = 0;
  bool warm = false;
  // The protocol's message (every field; any bytes round-trip) and back.
  // FromProto fails only on an unknown dist or partition name.
  void ToProto(worker::Job* out) const;
  static absl::StatusOr<WorkerJob> FromProto(const worker::Job& job);
  // The ProblemOptions it describes (reading the input files).
  absl::StatusOr<ProblemOptions> Options() const;
};

using Params = std::vector<std::pair<std::string, std::string>>;

// Whether one configuration is legal for the job's problem.
struct Legality {
  // kOk: legal. kIllegal: the host's value check or the kernel's own check
  // refused. kCrashed / kTimedOut: the worker died or hung while checking
  // (every configuration of that batch gets it). kError: anything else (the
  // worker could not be started or set the problem up, an unknown kernel,
  // interrupted by the stop flag).
  TrialStatus status = TrialStatus::kError;
  std::string why;  // empty when legal
  bool legal() const { return status == TrialStatus::kOk; }
};

// The measuring worker's argv ({path}): the first executable found of
//   $KREG_WORKER, when set (and then only it);
//   <dir>/../libexec/kreg/kreg-worker, <dir> the folder of the binary or
//     shared object holding this library's code (a Python extension's
//     folder, the kreg binary's bin/), its real path first;
//   the same next to /proc/self/exe;
//   the configured install path (<prefix>/libexec/kreg/kreg-worker).
// So a build tree (bin/, libexec/kreg/) and an install, moved or not, find
// their own worker. NotFound names every place looked.
absl::StatusOr<std::vector<std::string>> FindWorker();

// How a sweep measures its candidates and checks their legality: in a
// worker process (IsolatedRunner), or in this process on every rank of an
// MPI job (kreg::Tune with TuneRequest::comm).
class CandidateRunner {
 public:
  virtual ~CandidateRunner() = default;
  // `threads`: per kernel run, 0 for the job's.
  virtual Measurement Measure(const std::string& name, const Params& params, int reps, int threads) = 0;
  virtual std::vector<Legality> CheckLegal(const std::string& name, const std::vector<Params>& configs) = 0;
};

class IsolatedRunner : public CandidateRunner {
 public:
  // `command` is the worker's argv (e.g. FindWorker()'s).
  // `timeout_seconds` bounds one candidate's measurement, or one CheckLegal
  // batch (a fresh worker's set-up, before it answers Started, has 600 s).
  IsolatedRunner(std::vector<std::string> command, WorkerJob job, double timeout_seconds);
  ~IsolatedRunner() override;
  IsolatedRunner(const IsolatedRunner&) = delete;
  IsolatedRunner& operator=(const IsolatedRunner&) = delete;

  // Measures kernel `name` with `params` and `reps` timed runs. Never
  // throws or crashes: failures come back as the Measurement's status. A
  // worker that cannot even set the problem up gives kError for every
  // candidate, with its reason.
  Measurement Measure(const std::string& name, const Params& params, int reps, int threads = 0) override;

  // Whether each of `configs` of kernel `name` is legal for the job's
  // problem, asked of the worker in one request: Kernel::Check against the
  // args of its first problem (args, then the values against them, then the
  // kernel's own check). One Legality per config, in order; never throws or
  // crashes. A check that crashes or hangs kills the worker, and the whole
  // batch gets kCrashed ("the kernel's check crashed: worker killed by
  // signal 11 (Segmentation fault)") or kTimedOut; the next call starts a
  // fresh worker.
  std::vector<Legality> CheckLegal(const std::string& name, const std::vector<Params>& configs) override;

  // When *stop becomes true, a measurement or check in flight is abandoned
  // (the worker killed, kError "interrupted" returned) within about 0.1 s.
  void set_stop(const std::atomic<bool>* stop) { stop_ = stop; }

  // Workers started so far (1 plus one per crash or hang).
  int workers_started() const { return started_; }

 private:
  // Why a request got no answer.
  enum class Lost { kNone, kStopped, kTimedOut, kDied, kGarbled };
  struct Answer {
    bool ok = false;  // the reply is the answer (Done or Checked)
    Lost lost = Lost::kNone;
    bool started = false;  // the worker had answered Started
    std::string why;       // when not ok
  };

  // Sends `request` (a framed kreg.worker.Request with this `id`), starting
  // a worker first if none runs, and waits for its answer: a fresh worker
  // gets kSetupSeconds to set up and answer Started, then `timeout_`. On
  // failure the worker is gone; a worker that cannot be started, or fails
  // before it is set up, sets fatal_.
  Answer Ask(const std::string& request, int64_t id, worker::Reply* reply);
  absl::Status Spawn();
  void Kill();
  // Writes without blocking past `seconds` or the stop flag.
  Lost Write(const std::string& data, double seconds);
  // Reads one reply, waiting at most `seconds`.
  Lost ReadReply(double seconds, worker::Reply* reply);
  std::string ExitReason();

  std::vector<std::string> command_;
  WorkerJob job_;
  const std::atomic<bool>* stop_ = nullptr;
  double timeout_;
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  static constexpr double kSetupSeconds = 600;
  std::string buffer_;   // read from the worker, not yet parsed
  std::string pending_;  // the job, sent with a fresh worker's first request
  std::string fatal_;  // set once the worker cannot set the problem up
  int exit_signal_ = 0;  // the signal that ended the last worker (ExitReason)
  bool fresh_ = false;
  int64_t next_id_ = 0;
  int started_ = 0;
  // Candidates that passed their check (kernel and params, framed).
  std::set<std::string> verified_;
};

// Where IsolatedRunner tells its worker the tuner's pid: a worker whose
// parent is already gone when it starts (the tuner killed between the spawn
// and the worker's first instruction) exits instead of running on as an
// orphan, which the parent-death signal, set too late, would not stop.
inline constexpr char kWorkerParentEnv[] = "KREG_WORKER_PARENT";

// The worker's side (the kreg-worker program's main): reads the protocol on
// `in_fd`, answers on `out_fd`; when that is 1, the protocol moves to a
// descriptor of its own and stdout becomes stderr. Returns the process exit
// code.
int WorkerMain(int in_fd, int out_fd);

}  // namespace kreg

#endif  // KREG_AUTOTUNE_WORKER_H_
