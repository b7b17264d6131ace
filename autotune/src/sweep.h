// A sweep (internal to the tuner): the candidates of one problem, measured
// through a CandidateRunner (a worker process, or this rank of an MPI job:
// RankRunner), recorded in the table as they come, with the thread round
// and the growing of lists after the search. Not installed.
#ifndef KREG_AUTOTUNE_SRC_SWEEP_H_
#define KREG_AUTOTUNE_SRC_SWEEP_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kreg/dispatch.h"
#include "kreg/measure.h"
#include "kreg/tuner.h"
#include "kreg/worker.h"

namespace kreg {
namespace internal {

using Clock = std::chrono::steady_clock;

struct Candidate {
  std::shared_ptr<const Kernel> kernel;
  Config config;
  int threads = 0;  // a chosen thread count (the thread round); 0: the request's
};

// Measures in this process, on this rank of an MPI job: every rank runs the
// same candidates in the same order (their results are shared, so the
// search takes the same path everywhere).
class RankRunner : public CandidateRunner {
 public:
  RankRunner(const Registry& registry, const TuneRequest& request, std::vector<Problem*> problems)
      : registry_(registry),
        request_(request),
        problems_(std::move(problems)),
        sub_ops_(Dispatcher::Create(registry, TuningDb())) {}

  Measurement Measure(const std::string& name, const Params& params, int reps, int threads) override {
    Measurement m;
    absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry_.Get(name);
    if (!kernel.ok()) {
      m.error = std::string(kernel.status().message());
      return m;
    }
    absl::StatusOr<Config> config = (*kernel)->ParseConfig(params);
    if (!config.ok()) {
      m.status = TrialStatus::kIllegal;
      m.error = std::string(config.status().message());
      return m;
    }
    // A communicator of its own per candidate: a failed one leaves its
    // messages and failure notices behind in the old.
    absl::StatusOr<std::unique_ptr<Comm>> comm = request_.comm->Fresh();
    if (!comm.ok()) {
      m.error = std::string(comm.status().message());
      return m;
    }
    MeasureOptions options;
    options.warmup = request_.warmup;
    options.reps = reps;
    options.max_seconds = request_.max_seconds_per_candidate;
    options.run.num_threads = threads > 0 ? threads : request_.threads;
    options.comm = comm->get();
    // A composite op's sub-ops run at their op's default (as in the worker).
    RunOptions sub_options;
    sub_options.num_threads = request_.threads;
    options.run.dispatch = [&](absl::string_view sub_op, const kreg_args& sub_args) {
      return sub_ops_.ok() ? sub_ops_->Run(sub_op, sub_args, sub_options).status() : sub_ops_.status();
    };
    const std::string id = absl::StrCat(name, " ", (*kernel)->ConfigString(*config));
    options.verified = verified_.contains(id);
    m = MeasureKernel(**kernel, *config, problems_, options);
    if (m.ok()) verified_.insert(id);
    return m;
  }

  std::vector<Legality> CheckLegal(const std::string& name, const std::vector<Params>& configs) override {
    std::vector<Legality> out(configs.size());
    absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry_.Get(name);
    for (size_t i = 0; i < configs.size(); ++i) {
      absl::Status s = kernel.ok() ? absl::OkStatus() : kernel.status();
      absl::StatusOr<Config> config = kernel.ok() ? (*kernel)->ParseConfig(configs[i]) : absl::StatusOr<Config>(s);
      if (config.ok()) s = (*kernel)->Check(*config, *problems_[0]->args());
      if (!config.ok()) s = config.status();
      out[i].status = s.ok() ? TrialStatus::kOk : TrialStatus::kIllegal;
      if (!s.ok()) out[i].why = std::string(s.message());
    }
    return out;
  }

 private:
  const Registry& registry_;
  const TuneRequest& request_;
  std::vector<Problem*> problems_;
  std::set<std::string> verified_;
  absl::StatusOr<Dispatcher> sub_ops_;
};

// One sweep: the candidates, the worker, the table and the counts.
class Sweep {
 public:
  Sweep(const TuneRequest& request, TuningDb* db, TuneObserver* observer, const std::atomic<bool>* stop,
        CandidateRunner* runner, const tuning::Machine& machine, tuning::ProblemKey key, const int64_t* dims)
      : request_(request), db_(db), observer_(observer), stop_(stop), runner_(runner), machine_(machine),
        key_(std::move(key)), dims_(dims), title_(KeyString(key_)), start_(Clock::now()) {}

  // Adds the legal ones of `configs` of `kernel` (asked of the worker). A
  // batch whose check crashed the worker is asked again in halves, so one
  // configuration that crashes costs only itself; a hang is not (each try
  // would wait out the timeout).
  void AddLegal(const std::shared_ptr<const Kernel>& kernel, std::vector<Config> configs);

  size_t size() const { return candidates_.size(); }
  const Candidate& operator[](size_t i) const { return candidates_[i]; }
  bool stopped() const { return stop_ != nullptr && stop_->load(); }

  // Measures candidate i (see MeasureFn); `again`: a race's repeat, measured
  // afresh and not stored (Record stores the race's combined result).
  Measurement Measure(size_t i, int reps, bool again);

  // Stores measurement `m` of candidate i as its trial, and checkpoints.
  void Record(size_t i, const Measurement& m);

  // Stores a measurement below full repetitions (a halving round's) as the
  // runs asked for, `reps` (a median that settles stops sooner), so a round
  // that asks as many reuses it; checkpoints at most every two seconds:
  // there are hundreds, each quick.
  void RecordPartial(size_t i, const Measurement& m, int reps);

  tuning::Trial TrialOf(size_t i, const Measurement& m) const;

  // Stamps how the entry is tuned (complete or not).
  void SetTuningInfo(bool complete);

  // Tells request.on_record about `trial` (nullptr: the tuning info alone).
  void Publish(const tuning::Trial* trial);

  // Whether stored failure `t` may say more about the environment than about
  // the kernel, so this sweep measures it again instead of reusing it: a
  // crash by a signal a kernel does not raise at itself (SIGKILL from the
  // OOM killer, SIGTERM, SIGINT, SIGHUP from a person). (Another thread
  // count is another trial altogether.)
  static bool MayHaveBeenTheEnvironment(const tuning::Trial& t);

  // The thread count candidate c runs with (0: all cores), as recorded.
  int Threads(const Candidate& c) const { return ThreadsAvailable(c.threads > 0 ? c.threads : request_.threads); }
  static std::string Name(const Candidate& c);

  // The thread round: more threads can be slower (a single row, a small
  // problem on a big machine), so the leaders (each variant's best within
  // kThreadRoundWithin of the best, at most kThreadRoundLeaders) are
  // measured again on 1, 2, 4, ... threads, fewer than the `cores` they
  // ran on; a faster one is the entry's best like any other trial. Each
  // leader and its fewer-thread copies race (as the search's leaders do):
  // up to race_passes + 1 passes, interleaved in alternating order, so a
  // core another tenant holds for a while slows them all alike; one clearly
  // behind after a pass leaves the race (StillRacing).
  bool ThreadRound(int cores, double deadline_seconds);

  // A trial of candidate c, not yet measured.
  static tuning::Trial NewTrial(const Candidate& c, const tuning::Config& proto_config);

  // Extends the list parameters of each kernel's best configurations by one
  // more value, round by round, while that finds something faster.
  bool GrowLists(double deadline_seconds);

  void Checkpoint();

  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  const absl::Status& save_error() const { return save_error_; }
  // The first error (not a refusal) a legality check met, e.g. the worker
  // could not set the problem up.
  const std::string& error() const { return error_; }
  TuneResult& result() { return result_; }

 private:
  bool Known(const Kernel& k, const Config& c) const;
  std::shared_ptr<const Kernel> Shared(const Kernel* k) const;
  // Counts candidate i once: as measured, or as reused from the table.
  void Count(size_t i, bool measured);
  void Warn(absl::string_view text);
  void Report();

  const TuneRequest& request_;
  TuningDb* db_;
  TuneObserver* observer_;
  const std::atomic<bool>* stop_;
  CandidateRunner* runner_;
  const tuning::Machine& machine_;  // the key's
  tuning::ProblemKey key_;
  const int64_t* dims_;
  std::string title_;
  Clock::time_point start_;
  std::vector<Candidate> candidates_;
  std::vector<char> seen_;
  std::map<size_t, double> full_;  // candidate -> full median, ok ones
  size_t done_ = 0;
  double best_ns_ = 0;
  std::string best_name_;
  absl::Status save_error_;
  double partial_saved_at_ = 0;  // Elapsed() at the last checkpoint of partial measurements
  std::string error_;
  TuneResult result_;
};

}  // namespace internal
}  // namespace kreg

#endif  // KREG_AUTOTUNE_SRC_SWEEP_H_
