// Measuring candidates in a child process, so that a candidate that crashes
// or hangs is recorded as failed and the sweep goes on.
//
// The parent (IsolatedRunner) starts a worker — by default the `kreg` binary
// run as `kreg __worker` — and speaks a line protocol over its stdin and
// stdout: one `job` line describing the problem, then one `run` line per
// candidate; the worker answers `start ID` before it runs a candidate and
// `done ID ...` after. A worker that dies or stays silent past the timeout is
// killed; its candidate is recorded as crashed or timed out, and the next
// candidate starts a fresh worker.
//
// In the worker every candidate's output is checked against the op's
// reference (computed once per input) before any of its time counts; timed
// runs rotate among several input buffers so caches do not flatter small
// problems, after `warmup` untimed runs, and repeat up to `reps` times,
// stopping early once the running median is stable (the last three within
// 1%, at least 5 samples) or past max_seconds_per_run.
//
// Thread-safety: an IsolatedRunner is used from one thread at a time.
// Starting a worker sets SIGPIPE to SIG_IGN if it was at its default, so a
// worker dying early shows up as an error rather than killing the caller.
#ifndef KREG_AUTOTUNE_WORKER_H_
#define KREG_AUTOTUNE_WORKER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kreg/autotune.h"
#include "kreg/problem.h"

namespace kreg {

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
  std::string Serialize() const;
  // The ProblemOptions it describes (reading the input files).
  absl::StatusOr<ProblemOptions> Options() const;
  static absl::StatusOr<WorkerJob> Parse(absl::string_view line);
};

using Params = std::vector<std::pair<std::string, std::string>>;

class IsolatedRunner {
 public:
  // `command` is the worker's argv (e.g. {"/usr/bin/kreg", "__worker"}).
  // `timeout_seconds` bounds one candidate's measurement.
  IsolatedRunner(std::vector<std::string> command, WorkerJob job, double timeout_seconds);
  ~IsolatedRunner();
  IsolatedRunner(const IsolatedRunner&) = delete;
  IsolatedRunner& operator=(const IsolatedRunner&) = delete;

  // Measures kernel `name` with `params` and `reps` timed runs. Never
  // throws or crashes: failures come back as the Measurement's status. A
  // worker that cannot even set the problem up gives kError for every
  // candidate, with its reason.
  Measurement Measure(const std::string& name, const Params& params, int reps);

  // When *stop becomes true, a measurement in flight is abandoned (the
  // worker killed, kError "interrupted" returned) within about 0.1 s.
  void set_stop(const std::atomic<bool>* stop) { stop_ = stop; }

  // Workers started so far (1 plus one per crash or hang).
  int workers_started() const { return started_; }

 private:
  absl::Status Spawn();
  void Kill();
  // Reads one line, waiting at most `seconds`; false on EOF or timeout
  // (*timed_out says which).
  bool ReadLine(double seconds, std::string* line, bool* timed_out);
  std::string ExitReason();

  std::vector<std::string> command_;
  WorkerJob job_;
  const std::atomic<bool>* stop_ = nullptr;
  double timeout_;
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  static constexpr double kSetupSeconds = 600;
  std::string buffer_;
  std::string fatal_;  // set once the worker cannot set the problem up
  bool fresh_ = false;
  int next_id_ = 0;
  int started_ = 0;
};

// The worker's side: reads the protocol on `in_fd`, answers on `out_fd`.
// Returns the process exit code.
int WorkerMain(int in_fd, int out_fd);

}  // namespace kreg

#endif  // KREG_AUTOTUNE_WORKER_H_
