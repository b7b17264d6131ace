#include "kreg/tuner.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <ctime>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/dispatch.h"
#include "kreg/measure.h"
#include "kreg/npy.h"
#include "kreg/worker.h"

#ifndef KREG_VERSION
#define KREG_VERSION "unknown"
#endif

namespace kreg {
namespace {

using Clock = std::chrono::steady_clock;

tuning::Trial::Status ToProto(TrialStatus s) {
  switch (s) {
    case TrialStatus::kOk:
      return tuning::Trial::OK;
    case TrialStatus::kWrongResult:
      return tuning::Trial::WRONG_RESULT;
    case TrialStatus::kCrashed:
      return tuning::Trial::CRASHED;
    case TrialStatus::kTimedOut:
      return tuning::Trial::TIMED_OUT;
    case TrialStatus::kIllegal:
      return tuning::Trial::ILLEGAL;
    case TrialStatus::kError:
      return tuning::Trial::ERROR;
  }
  return tuning::Trial::ERROR;
}

TrialStatus FromProto(tuning::Trial::Status s) {
  switch (s) {
    case tuning::Trial::OK:
      return TrialStatus::kOk;
    case tuning::Trial::WRONG_RESULT:
      return TrialStatus::kWrongResult;
    case tuning::Trial::CRASHED:
      return TrialStatus::kCrashed;
    case tuning::Trial::TIMED_OUT:
      return TrialStatus::kTimedOut;
    case tuning::Trial::ILLEGAL:
      return TrialStatus::kIllegal;
    default:
      return TrialStatus::kError;
  }
}

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
  void AddLegal(const std::shared_ptr<const Kernel>& kernel, std::vector<Config> configs) {
    if (configs.empty() || stopped()) return;
    std::vector<Params> params;
    for (const Config& c : configs) params.push_back(kernel->ConfigPairs(c));
    const std::vector<Legality> legal = runner_->CheckLegal(kernel->name(), params);
    if (configs.size() > 1 && !legal.empty() && legal[0].status == TrialStatus::kCrashed) {
      std::vector<Config> second(std::make_move_iterator(configs.begin() + configs.size() / 2),
                                 std::make_move_iterator(configs.end()));
      configs.resize(configs.size() / 2);
      AddLegal(kernel, std::move(configs));
      AddLegal(kernel, std::move(second));
      return;
    }
    std::string warned;
    for (size_t i = 0; i < configs.size() && i < legal.size(); ++i) {
      if (legal[i].status == TrialStatus::kOk) {
        candidates_.push_back({kernel, std::move(configs[i])});
      } else if (legal[i].status != TrialStatus::kIllegal && warned != legal[i].why) {
        warned = legal[i].why;
        if (legal[i].status == TrialStatus::kError && error_.empty()) error_ = legal[i].why;
        const std::string which = configs.size() == 1 ? kernel->ConfigString(configs[i]) : std::string();
        Warn(absl::StrCat(kernel->name(), which.empty() ? "" : " ", which, ": ", legal[i].why));
      }
    }
  }

  size_t size() const { return candidates_.size(); }
  const Candidate& operator[](size_t i) const { return candidates_[i]; }
  bool stopped() const { return stop_ != nullptr && stop_->load(); }

  // Measures candidate i (see MeasureFn); `again`: a race's repeat, measured
  // afresh and not stored (Record stores the race's combined result).
  Measurement Measure(size_t i, int reps, bool again) {
    const Candidate& c = candidates_[i];
    const tuning::Config proto_config = ToProtoConfig(*c.kernel, c.config);
    Measurement m;
    // Resume: a stored result of this (variant, version, config) is reused:
    // a full measurement or a candidate's own failure, or a partial one (a
    // halving round's) of at least `reps` runs, or the mark of one in flight
    // when an MPI job ended.
    const bool partial = reps < request_.search.reps && !again;
    const tuning::Trial* t =
        again ? nullptr : db_->FindTrial(key_, c.kernel->variant(), c.kernel->version(), proto_config, Threads(c));
    bool from_partial = false;
    if (t == nullptr && partial) {
      t = db_->FindPartial(key_, c.kernel->variant(), c.kernel->version(), proto_config, Threads(c));
      if (t != nullptr && t->status() == tuning::Trial::OK && t->reps() < reps) t = nullptr;
      from_partial = t != nullptr;
    }
    if (t != nullptr && !MayHaveBeenTheEnvironment(*t)) {
      m.status = FromProto(t->status());
      m.median_ns = t->median_ns();
      m.min_ns = t->min_ns();
      m.max_ns = t->max_ns();
      m.reps = reps;
      m.error = t->error();
      Count(i, /*measured=*/false);
      if (!m.ok() && from_partial) Record(i, m);  // an in-flight mark: the crash becomes the candidate's trial
    } else {
      if (request_.comm != nullptr) {
        // Under MPI a crash ends the job: the candidate is recorded as
        // crashed first, and replaced by its result once it has one (a
        // partial measurement's mark is a partial one, of as many runs, which
        // its result replaces).
        tuning::Trial in_flight = NewTrial(c, proto_config);
        in_flight.set_status(tuning::Trial::CRASHED);
        in_flight.set_error("in flight when the MPI job ended (under MPI a crash ends the job)");
        in_flight.set_measured_at(std::time(nullptr));
        in_flight.set_threads(Threads(c));
        if (partial) {
          in_flight.set_reps(reps);
          db_->AddPartial(key_, in_flight);
        } else {
          db_->AddTrial(key_, in_flight);
          Publish(&in_flight);
        }
        Checkpoint();
      }
      m = runner_->Measure(c.kernel->name(), c.kernel->ConfigPairs(c.config), reps, c.threads);
      if (stopped()) return m;  // a candidate cut short by the stop flag is not a result
      Count(i, /*measured=*/true);
      if (!m.ok()) {
        ++result_.failed;
        Warn(absl::StrCat(Name(c), ": ", TrialStatusName(m.status),
                          ": ", m.error));
      }
      // kError (the worker could not be started or set up) is not kept, so a
      // later run tries again (under MPI it replaces the in-flight mark).
      const bool full = m.ok() && reps >= request_.search.reps && !again;
      if (full || (!m.ok() && (m.status != TrialStatus::kError || request_.comm != nullptr))) Record(i, m);
      if (m.ok() && partial) RecordPartial(i, m, reps);
    }
    if (m.ok() && reps >= request_.search.reps) full_[i] = m.median_ns;
    // Progress shows the fastest seen so far, full measurement or not.
    if (m.ok() && (best_name_.empty() || m.median_ns < best_ns_)) {
      best_ns_ = m.median_ns;
      best_name_ = Name(c);
    }
    Report();
    return m;
  }

  // Stores measurement `m` of candidate i as its trial, and checkpoints.
  void Record(size_t i, const Measurement& m) {
    const tuning::Trial trial = TrialOf(i, m);
    db_->AddTrial(key_, trial);
    Publish(&trial);
    Checkpoint();
  }

  // Stores a measurement below full repetitions (a halving round's) as the
  // runs asked for, `reps` (a median that settles stops sooner), so a round
  // that asks as many reuses it; checkpoints at most every two seconds:
  // there are hundreds, each quick.
  void RecordPartial(size_t i, const Measurement& m, int reps) {
    tuning::Trial trial = TrialOf(i, m);
    trial.set_reps(std::max(m.reps, reps));
    db_->AddPartial(key_, trial);
    if (Elapsed() - partial_saved_at_ >= 2.0) {
      Checkpoint();
      partial_saved_at_ = Elapsed();
    }
  }

  tuning::Trial TrialOf(size_t i, const Measurement& m) const {
    const Candidate& c = candidates_[i];
    tuning::Trial trial = NewTrial(c, ToProtoConfig(*c.kernel, c.config));
    trial.set_median_ns(m.median_ns);
    trial.set_min_ns(m.min_ns);
    trial.set_max_ns(m.max_ns);
    trial.set_reps(m.reps);
    trial.set_status(ToProto(m.status));
    trial.set_error(m.error);
    trial.set_measured_at(std::time(nullptr));
    trial.set_threads(Threads(c));
    trial.set_signal(m.signal);
    return trial;
  }

  // Stamps how the entry is tuned (complete or not).
  void SetTuningInfo(bool complete) {
    db_->SetTuningInfo(key_, ToolVersion(), StrategyName(request_.search.strategy), std::time(nullptr), complete);
    Publish(nullptr);
  }

  // Tells request.on_record about `trial` (nullptr: the tuning info alone).
  void Publish(const tuning::Trial* trial) {
    if (!request_.on_record) return;
    TuningDb one;
    one.AddMachine(machine_);
    if (trial != nullptr) one.AddTrial(key_, *trial);
    if (const tuning::Entry* e = db_->FindEntry(key_); e != nullptr && e->tuned_at() > 0) {
      one.SetTuningInfo(key_, e->tool_version(), e->strategy(), e->tuned_at(), !e->incomplete());
    }
    request_.on_record(one);
  }

  // Whether stored failure `t` may say more about the environment than about
  // the kernel, so this sweep measures it again instead of reusing it: a
  // crash by a signal a kernel does not raise at itself (SIGKILL from the
  // OOM killer, SIGTERM, SIGINT, SIGHUP from a person). (Another thread
  // count is another trial altogether.)
  static bool MayHaveBeenTheEnvironment(const tuning::Trial& t) {
    return t.status() == tuning::Trial::CRASHED &&
           (t.signal() == SIGKILL || t.signal() == SIGTERM || t.signal() == SIGINT || t.signal() == SIGHUP);
  }

  // The thread count candidate c runs with (0: all cores), as recorded.
  int Threads(const Candidate& c) const { return ThreadsAvailable(c.threads > 0 ? c.threads : request_.threads); }
  static std::string Name(const Candidate& c) {
    const std::string config = c.kernel->ConfigString(c.config);
    return absl::StrCat(c.kernel->name(), config.empty() ? "" : " ", config,
                        c.threads > 0 ? absl::StrCat(" on ", c.threads, c.threads == 1 ? " thread" : " threads") : "");
  }

  // The thread round: more threads can be slower (a single row, a small
  // problem on a big machine), so the leaders (each variant's best within
  // kThreadRoundWithin of the best, at most kThreadRoundLeaders) are
  // measured again on 1, 2, 4, ... threads, fewer than the `cores` they
  // ran on; a faster one is the entry's best like any other trial. Each
  // leader and its fewer-thread copies race (as the search's leaders do):
  // up to race_passes + 1 passes, interleaved in alternating order, so a
  // core another tenant holds for a while slows them all alike; one clearly
  // behind after a pass leaves the race (StillRacing).
  bool ThreadRound(int cores, double deadline_seconds) {
    constexpr double kThreadRoundWithin = 1.5;
    constexpr size_t kThreadRoundLeaders = 3;
    std::map<const Kernel*, std::pair<double, size_t>> best_of;  // kernel -> (full median, candidate)
    for (const auto& [i, ns] : full_) {
      if (candidates_[i].threads > 0) continue;
      const Kernel* k = candidates_[i].kernel.get();
      if (!best_of.contains(k) || ns < best_of[k].first) best_of[k] = {ns, i};
    }
    std::vector<std::pair<double, size_t>> leaders;
    for (const auto& [k, best] : best_of) leaders.push_back(best);
    std::sort(leaders.begin(), leaders.end());
    while (!leaders.empty() &&
           (leaders.size() > kThreadRoundLeaders || leaders.back().first > kThreadRoundWithin * leaders[0].first)) {
      leaders.pop_back();
    }
    for (const auto& [ns, i] : leaders) {
      std::vector<size_t> group = {i};
      for (int t = 1; t < cores; t *= 2) {
        group.push_back(candidates_.size());
        candidates_.push_back({candidates_[i].kernel, candidates_[i].config, t});
      }
      std::vector<std::vector<Measurement>> passes(group.size());
      std::vector<bool> in(group.size(), true);
      for (int pass = 0; pass <= request_.search.race_passes; ++pass) {
        if (pass > 0) {
          in = StillRacing(passes);
          if (std::count(in.begin(), in.end(), true) < 2) break;
        }
        for (size_t step = 0; step < group.size(); ++step) {
          if (stopped() || (deadline_seconds > 0 && Elapsed() >= deadline_seconds)) return false;
          const size_t l = pass % 2 == 0 ? group.size() - 1 - step : step;
          if (!in[l]) continue;
          passes[l].push_back(Measure(group[l], request_.search.reps, /*again=*/true));
        }
      }
      for (size_t l = 0; l < group.size(); ++l) {
        const Measurement combined = CombinePasses(passes[l]);
        if (combined.status != TrialStatus::kError) Record(group[l], combined);  // as Measure keeps them
      }
    }
    return true;
  }

  // A trial of candidate c, not yet measured.
  static tuning::Trial NewTrial(const Candidate& c, const tuning::Config& proto_config) {
    tuning::Trial trial;
    trial.set_variant(c.kernel->variant());
    trial.set_variant_version(c.kernel->version());
    *trial.mutable_config() = proto_config;
    return trial;
  }

  // Extends the list parameters of each kernel's best configurations by one
  // more value, round by round, while that finds something faster.
  bool GrowLists(double deadline_seconds) {
    std::map<const Kernel*, double> best_of;  // each kernel's best full median
    for (const auto& [i, ns] : full_) {
      const Kernel* k = candidates_[i].kernel.get();
      if (!best_of.contains(k) || ns < best_of[k]) best_of[k] = ns;
    }
    for (int round = 0; round < request_.list_growth_rounds; ++round) {
      bool improved = false;
      std::map<const Kernel*, std::vector<Config>> grown;
      for (const auto& [k, ns] : best_of) {
        // The two best configurations of this kernel.
        std::vector<std::pair<double, size_t>> mine;
        for (const auto& [i, t] : full_) {
          if (candidates_[i].kernel.get() == k) mine.emplace_back(t, i);
        }
        std::sort(mine.begin(), mine.end());
        if (mine.size() > 2) mine.resize(2);
        for (const auto& [t, i] : mine) {
          const Config& base = candidates_[i].config;
          for (size_t p = 0; p < k->params().size(); ++p) {
            const ParamInfo& info = k->params()[p];
            if (info.kind != KREG_PARAM_INT_LIST || !k->params().Active(base, p)) continue;
            const std::vector<int64_t>& list = base.values()[p].list;
            for (int64_t v : info.Values(dims_)) {
              if (!list.empty() && v <= list.back()) continue;
              Config next = base;
              next.mutable_values()[p].list.push_back(v);
              if (!Known(*k, next)) grown[k].push_back(std::move(next));
            }
          }
        }
      }
      if (grown.empty()) return true;
      const size_t first = candidates_.size();
      for (auto& [k, configs] : grown) {
        std::sort(configs.begin(), configs.end(), [](const Config& a, const Config& b) {
          return a.values() < b.values();
        });
        configs.erase(std::unique(configs.begin(), configs.end()), configs.end());
        AddLegal(Shared(k), std::move(configs));
      }
      for (size_t i = first; i < candidates_.size(); ++i) {
        if (stopped() || (deadline_seconds > 0 && Elapsed() >= deadline_seconds)) return false;
        const Measurement m = Measure(i, request_.search.reps, /*again=*/false);
        const Kernel* k = candidates_[i].kernel.get();
        if (m.ok() && m.median_ns < best_of[k]) {
          best_of[k] = m.median_ns;
          improved = true;
        }
      }
      if (!improved) return true;
    }
    return true;
  }

  void Checkpoint() {
    if (request_.db_path.empty()) return;
    if (absl::Status s = db_->SaveMerged(request_.db_path); !s.ok() && save_error_.ok()) save_error_ = s;
  }

  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  const absl::Status& save_error() const { return save_error_; }
  // The first error (not a refusal) a legality check met, e.g. the worker
  // could not set the problem up.
  const std::string& error() const { return error_; }
  TuneResult& result() { return result_; }

 private:
  bool Known(const Kernel& k, const Config& c) const {
    for (const Candidate& x : candidates_) {
      if (x.kernel.get() == &k && x.config == c) return true;
    }
    return false;
  }
  std::shared_ptr<const Kernel> Shared(const Kernel* k) const {
    for (const Candidate& x : candidates_) {
      if (x.kernel.get() == k) return x.kernel;
    }
    return nullptr;
  }
  // Counts candidate i once: as measured, or as reused from the table.
  void Count(size_t i, bool measured) {
    if (seen_.size() < candidates_.size()) seen_.resize(candidates_.size(), 0);
    if (seen_[i]) return;
    seen_[i] = 1;
    ++done_;
    ++(measured ? result_.measured : result_.reused);
  }
  void Warn(absl::string_view text) {
    if (observer_ != nullptr) observer_->OnWarning(text);
  }
  void Report() {
    if (observer_ == nullptr) return;
    TuneProgress p;
    p.key = title_;
    p.done = done_;
    p.candidates = candidates_.size();
    p.best = best_name_;
    p.best_ns = best_ns_;
    p.elapsed_seconds = Elapsed();
    // Exhaustive: by the pace so far; random and halving: by the budget.
    if (request_.search.strategy == Strategy::kExhaustive && done_ > 0) {
      p.eta_seconds = p.elapsed_seconds / static_cast<double>(done_) * static_cast<double>(p.candidates - done_);
    } else if (request_.search.budget_seconds > 0) {
      p.eta_seconds = std::max(0.0, request_.search.budget_seconds - p.elapsed_seconds);
    }
    observer_->OnProgress(p);
  }

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

}  // namespace

const char* ToolVersion() { return "kreg " KREG_VERSION; }

absl::StatusOr<TuneResult> Tune(const Registry& registry, const TuneRequest& request, TuningDb* db,
                                TuneObserver* observer, const std::atomic<bool>* stop) {
  absl::StatusOr<std::shared_ptr<const Op>> op_or = registry.GetOp(request.op);
  if (!op_or.ok()) return absl::InvalidArgumentError(op_or.status().message());
  const Op& op = **op_or;
  if (request.search.reps < 1 || request.timeout_seconds <= 0 || request.max_list_len < 1 ||
      request.list_growth_rounds < 0) {
    return absl::InvalidArgumentError("reps, timeout and max list length must be positive");
  }
  if (request.slices < 1 || request.slice < 0 || request.slice >= request.slices) {
    return absl::InvalidArgumentError(absl::StrCat("share ", request.slice, " of ", request.slices,
                                                   ": expected 0 <= slice < slices"));
  }
  absl::StatusOr<Values> values = op.ParseValues(request.values);
  if (!values.ok()) return values.status();
  if (request.comm != nullptr) {
    if (request.search.budget_seconds > 0) {
      return absl::InvalidArgumentError("under MPI a sweep takes no budget (the ranks would stop at different times)");
    }
    if (absl::Status s = op.SetRanks(&*values, request.comm->size()); !s.ok()) return s;
  } else if (request.ranks > 0) {
    if (absl::Status s = op.SetRanks(&*values, request.ranks); !s.ok()) return s;
  } else if (op.collective()) {
    return absl::InvalidArgumentError(absl::StrCat(op.name(), " is a collective op: give the ranks to tune on"));
  }
  ProblemOptions options = request.options;
  options.inputs.clear();
  for (const auto& [name, path] : request.input_files) {
    absl::StatusOr<Tensor> t = ReadNpy(path);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("input ", name, ": ", t.status().message()));
    options.inputs[name] = *std::move(t);
  }
  // The key and legality from shape-only arguments; the data class of
  // generated inputs needs real ones.
  ShapeArgs shape;
  if (absl::Status s = MakeShapeArgs(op, *values, options, &shape); !s.ok()) return s;
  // A problem too large for this machine fails once, here, not in every
  // candidate's worker.
  if (absl::Status s = FitsInMemory(op, *values, options); !s.ok()) return s;
  std::string data_class = request.data_class;
  if (data_class.empty() && op.collective()) {
    data_class = request.comm != nullptr ? CollectiveDataClass(*request.comm) : CollectiveDataClass("threads", 1);
  }
  if (data_class.empty()) {
    absl::StatusOr<std::string> d;
    if (op.has_data_class()) {
      absl::StatusOr<std::unique_ptr<Problem>> real = Problem::Make(*op_or, nullptr, *values, options);
      if (!real.ok()) return real.status();
      d = DataClassOf(op, *(*real)->args(), options);
    } else {
      d = DataClassOf(op, *shape.args(), options);
    }
    if (!d.ok()) return d.status();
    data_class = *d;
  }
  // The machine the key names: this CPU's, or the GPU's the kernels run on.
  tuning::Machine machine = ThisMachine();
  const bool on_device = request.device != 0;
  if (request.device == KREG_DEVICE_CUDA) {
    if (op.collective() || request.comm != nullptr) {
      return absl::InvalidArgumentError("--device cuda: collective ops and sweeps under mpirun run on the CPU");
    }
    absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
    if (!gpus.ok()) return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", gpus.status().message()));
    if (request.device_ordinal < 0 || request.device_ordinal >= static_cast<int>(gpus->size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("no CUDA device ", request.device_ordinal, " (this machine has ", gpus->size(), ")"));
    }
    machine = MachineOf((*gpus)[request.device_ordinal]);
    db->AddMachine(machine);
  } else if (on_device) {
    return absl::InvalidArgumentError(absl::StrCat("unknown device kind ", request.device));
  }
  const tuning::ProblemKey key = MakeProblemKey(op.name(), op.KeyOf(*shape.args()), machine.id(), data_class);

  std::vector<std::shared_ptr<const Kernel>> kernels;
  for (const std::string& v : request.variants) {
    absl::StatusOr<std::shared_ptr<const Kernel>> k = registry.Get(absl::StrCat(op.name(), "/", v));
    if (!k.ok()) return absl::InvalidArgumentError(k.status().message());
    if (static_cast<int>((*k)->device()) != request.device) {
      return absl::InvalidArgumentError(absl::StrCat((*k)->name(), (*k)->device() != 0
                                                                       ? " runs on a CUDA device: tune it with --device cuda"
                                                                       : " runs on the CPU, not on a device"));
    }
    if (absl::Status s = CanRun(**k); !s.ok()) return absl::InvalidArgumentError(s.message());
    kernels.push_back(*k);
  }
  if (request.variants.empty()) {
    // The reference is the oracle, not a contender; device kernels tune
    // on their device, the CPU's here.
    for (std::shared_ptr<const Kernel>& k : registry.Kernels(op.name())) {
      if (k->is_reference() || static_cast<int>(k->device()) != request.device || !CanRun(*k).ok()) continue;
      kernels.push_back(std::move(k));
    }
  }
  if (kernels.empty()) {
    return absl::NotFoundError(absl::StrCat("no available ", op.name(), on_device ? " CUDA" : "", " kernel to tune"));
  }

  WorkerJob job;
  job.op = op.name();
  for (const auto& [name, dtype] : options.dtypes) job.dtypes.emplace_back(name, DTypeName(dtype));
  job.with.assign(options.with.begin(), options.with.end());
  job.values = request.values;
  job.dist = options.dist;
  job.partition = options.partition;
  job.seed = options.seed;
  job.input_files = request.input_files;
  job.plugins = registry.Files();
  job.warmup = request.warmup;
  job.threads = request.threads;
  job.max_seconds_per_run = request.max_seconds_per_candidate;
  job.ranks = request.ranks;
  job.comm_timeout = request.comm_timeout;
  job.mesh = request.mesh;
  job.device = request.device;
  job.device_ordinal = request.device_ordinal;
  job.warm = request.device_warm;
  std::vector<std::string> command = request.worker_command;
  if (command.empty() && request.comm == nullptr) {
    absl::StatusOr<std::vector<std::string>> found = FindWorker();
    if (!found.ok()) return found.status();
    command = *std::move(found);
  }
  std::unique_ptr<CandidateRunner> runner;
  std::unique_ptr<Problem> rank_problem;  // under MPI: this rank's
  if (request.comm != nullptr) {
    ProblemOptions rank_options = options;
    rank_options.comm = request.comm->abi();
    absl::StatusOr<std::unique_ptr<Problem>> p = Problem::Make(*op_or, registry.Reference(op.name()), *values, rank_options);
    if (!p.ok()) return p.status();
    rank_problem = *std::move(p);
    runner = std::make_unique<RankRunner>(registry, request, std::vector<Problem*>{rank_problem.get()});
  } else {
    auto isolated = std::make_unique<IsolatedRunner>(command, job, request.timeout_seconds);
    isolated->set_stop(stop);
    runner = std::move(isolated);
  }

  Sweep sweep(request, db, observer, stop, runner.get(), machine, key, shape.args()->dims);
  size_t enumerated = 0;  // for this sweep's share
  for (const std::shared_ptr<const Kernel>& k : kernels) {
    std::vector<Config> mine;
    for (Config& c : k->params().Enumerate(CpuIsa(), shape.args()->dims, request.max_list_len)) {
      if (enumerated++ % request.slices == static_cast<size_t>(request.slice)) mine.push_back(std::move(c));
    }
    sweep.AddLegal(k, std::move(mine));
    if (sweep.stopped()) break;
  }
  TuneResult& result = sweep.result();
  result.key = key;
  if (sweep.size() == 0 && request.slices > 1 && sweep.error().empty()) return result;  // an empty share
  if (sweep.size() == 0 && !sweep.stopped()) {
    if (!sweep.error().empty()) return absl::InvalidArgumentError(sweep.error());
    return absl::InvalidArgumentError(absl::StrCat("no configuration of any ", op.name(),
                                                   " kernel is legal for ", KeyString(key)));
  }
  // The entry is marked incomplete until the search finishes.
  sweep.SetTuningInfo(/*complete=*/false);
  SearchOptions search = request.search;
  search.stop = stop;
  search.groups.clear();  // by variant
  search.families.clear();  // by variant and choices
  std::map<const Kernel*, int> group_of;
  std::map<std::pair<const Kernel*, std::vector<int64_t>>, int> family_of;
  for (size_t i = 0; i < sweep.size(); ++i) {
    const Kernel* k = sweep[i].kernel.get();
    search.groups.push_back(group_of.try_emplace(k, static_cast<int>(group_of.size())).first->second);
    std::vector<int64_t> choices;
    for (size_t p = 0; p < k->params().params().size(); ++p) {
      if (k->params().params()[p].kind == KREG_PARAM_CHOICE) choices.push_back(sweep[i].config.values()[p].value);
    }
    search.families.push_back(
        family_of.try_emplace({k, std::move(choices)}, static_cast<int>(family_of.size())).first->second);
  }
  const SearchResult searched = Search(
      sweep.size(), [&](size_t i, int reps, bool again) { return sweep.Measure(i, reps, again); }, search);
  for (const auto& [i, m] : searched.raced) sweep.Record(i, m);
  bool complete = searched.complete && !sweep.stopped();
  if (complete && request.list_growth_rounds > 0) complete = sweep.GrowLists(request.search.budget_seconds);
  // The thread round, where the sweep ran on every core it may use and
  // they are several.
  const int available = ThreadsAvailable(0);
  const int cores = available > 0 ? available : static_cast<int>(HostMachine().cores);
  if (complete && request.thread_round && request.threads == 0 && request.comm == nullptr && !op.collective() &&
      !on_device && cores > 1) {
    complete = sweep.ThreadRound(cores, request.search.budget_seconds);
  }
  complete = complete && !sweep.stopped();
  result.candidates = sweep.size();
  result.stopped = sweep.stopped();
  result.complete = complete;
  sweep.SetTuningInfo(complete);
  sweep.Checkpoint();
  if (!sweep.save_error().ok()) return sweep.save_error();
  result.seconds = sweep.Elapsed();
  if (const tuning::Entry* entry = db->FindEntry(key); entry != nullptr) result.entry = *entry;
  return result;
}

}  // namespace kreg
