// A sweep's candidates measured and recorded (sweep.h).
#include "sweep.h"

#include <algorithm>
#include <csignal>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/comm.h"
#include "kreg/measure.h"

namespace kreg {
namespace internal {
namespace {

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

}  // namespace

void Sweep::AddLegal(const std::shared_ptr<const Kernel>& kernel, std::vector<Config> configs) {
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

Measurement Sweep::Measure(size_t i, int reps, bool again) {
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

void Sweep::Record(size_t i, const Measurement& m) {
  const tuning::Trial trial = TrialOf(i, m);
  db_->AddTrial(key_, trial);
  Publish(&trial);
  Checkpoint();
}

void Sweep::RecordPartial(size_t i, const Measurement& m, int reps) {
  tuning::Trial trial = TrialOf(i, m);
  trial.set_reps(std::max(m.reps, reps));
  db_->AddPartial(key_, trial);
  if (Elapsed() - partial_saved_at_ >= 2.0) {
    Checkpoint();
    partial_saved_at_ = Elapsed();
  }
}

tuning::Trial Sweep::TrialOf(size_t i, const Measurement& m) const {
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

void Sweep::SetTuningInfo(bool complete) {
  db_->SetTuningInfo(key_, ToolVersion(), StrategyName(request_.search.strategy), std::time(nullptr), complete);
  Publish(nullptr);
}

void Sweep::Publish(const tuning::Trial* trial) {
  if (!request_.on_record) return;
  TuningDb one;
  one.AddMachine(machine_);
  if (trial != nullptr) one.AddTrial(key_, *trial);
  if (const tuning::Entry* e = db_->FindEntry(key_); e != nullptr && e->tuned_at() > 0) {
    one.SetTuningInfo(key_, e->tool_version(), e->strategy(), e->tuned_at(), !e->incomplete());
  }
  request_.on_record(one);
}

bool Sweep::MayHaveBeenTheEnvironment(const tuning::Trial& t) {
  return t.status() == tuning::Trial::CRASHED &&
         (t.signal() == SIGKILL || t.signal() == SIGTERM || t.signal() == SIGINT || t.signal() == SIGHUP);
}

std::string Sweep::Name(const Candidate& c) {
  const std::string config = c.kernel->ConfigString(c.config);
  return absl::StrCat(c.kernel->name(), config.empty() ? "" : " ", config,
                      c.threads > 0 ? absl::StrCat(" on ", c.threads, c.threads == 1 ? " thread" : " threads") : "");
}

bool Sweep::ThreadRound(int cores, double deadline_seconds) {
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

tuning::Trial Sweep::NewTrial(const Candidate& c, const tuning::Config& proto_config) {
  tuning::Trial trial;
  trial.set_variant(c.kernel->variant());
  trial.set_variant_version(c.kernel->version());
  *trial.mutable_config() = proto_config;
  return trial;
}

bool Sweep::GrowLists(double deadline_seconds) {
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

void Sweep::Checkpoint() {
  if (request_.db_path.empty()) return;
  if (absl::Status s = db_->SaveMerged(request_.db_path); !s.ok() && save_error_.ok()) save_error_ = s;
}

bool Sweep::Known(const Kernel& k, const Config& c) const {
  for (const Candidate& x : candidates_) {
    if (x.kernel.get() == &k && x.config == c) return true;
  }
  return false;
}

std::shared_ptr<const Kernel> Sweep::Shared(const Kernel* k) const {
  for (const Candidate& x : candidates_) {
    if (x.kernel.get() == k) return x.kernel;
  }
  return nullptr;
}

void Sweep::Count(size_t i, bool measured) {
  if (seen_.size() < candidates_.size()) seen_.resize(candidates_.size(), 0);
  if (seen_[i]) return;
  seen_[i] = 1;
  ++done_;
  ++(measured ? result_.measured : result_.reused);
}

void Sweep::Warn(absl::string_view text) {
  if (observer_ != nullptr) observer_->OnWarning(text);
}

void Sweep::Report() {
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

}  // namespace internal
}  // namespace kreg
