#include "kreg/autotune.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <set>
#include <numeric>
#include <random>

#include <oneapi/tbb/parallel_for.h>

#include "absl/strings/str_cat.h"

namespace kreg {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::vector<Config> EnumerateSpace(const Kernel& kernel, const kreg_args& args, const SpaceOptions& options) {
  std::vector<Config> all = kernel.params().Enumerate(CpuIsa(), args.dims, options.max_list_len);
  std::vector<char> legal(all.size());
  tbb::parallel_for(size_t{0}, all.size(), [&](size_t i) { legal[i] = kernel.Check(all[i], args).ok(); });
  std::vector<Config> out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (legal[i]) out.push_back(std::move(all[i]));
  }
  return out;
}

absl::string_view TrialStatusName(TrialStatus status) {
  switch (status) {
    case TrialStatus::kOk:
      return "ok";
    case TrialStatus::kWrongResult:
      return "wrong_result";
    case TrialStatus::kCrashed:
      return "crashed";
    case TrialStatus::kTimedOut:
      return "timed_out";
    case TrialStatus::kIllegal:
      return "illegal";
    case TrialStatus::kError:
      return "error";
  }
  return "error";
}

absl::StatusOr<TrialStatus> ParseTrialStatus(absl::string_view name) {
  for (TrialStatus s : {TrialStatus::kOk, TrialStatus::kWrongResult, TrialStatus::kCrashed,
                        TrialStatus::kTimedOut, TrialStatus::kIllegal, TrialStatus::kError}) {
    if (TrialStatusName(s) == name) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown trial status '", name, "'"));
}

absl::StatusOr<Strategy> ParseStrategy(absl::string_view name) {
  if (name == "exhaustive") return Strategy::kExhaustive;
  if (name == "random") return Strategy::kRandom;
  if (name == "halving") return Strategy::kHalving;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown strategy '", name, "' (expected exhaustive, random or halving)"));
}

absl::string_view StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kExhaustive:
      return "exhaustive";
    case Strategy::kRandom:
      return "random";
    case Strategy::kHalving:
      return "halving";
  }
  return "?";
}

Measurement CombinePasses(const std::vector<Measurement>& passes) {
  Measurement combined = passes.front();
  std::vector<double> medians;
  for (const Measurement& m : passes) {
    if (!m.ok()) return m;
    medians.push_back(m.median_ns);
    combined.min_ns = std::min(combined.min_ns, m.min_ns);
    combined.max_ns = std::max(combined.max_ns, m.max_ns);
  }
  std::sort(medians.begin(), medians.end());
  const size_t h = medians.size() / 2;
  combined.median_ns = medians.size() % 2 == 1 ? medians[h] : (medians[h - 1] + medians[h]) / 2;
  combined.reps = 0;
  for (const Measurement& m : passes) combined.reps += m.reps;
  return combined;
}

std::vector<bool> StillRacing(const std::vector<std::vector<Measurement>>& passes) {
  auto ok = [](const std::vector<Measurement>& p) {
    return !p.empty() && std::all_of(p.begin(), p.end(), [](const Measurement& m) { return m.ok(); });
  };
  double leader = std::numeric_limits<double>::infinity();
  for (const std::vector<Measurement>& p : passes) {
    if (ok(p)) leader = std::min(leader, CombinePasses(p).median_ns);
  }
  std::vector<bool> in(passes.size());
  for (size_t l = 0; l < passes.size(); ++l) {
    in[l] = ok(passes[l]) && CombinePasses(passes[l]).min_ns <= leader;
  }
  return in;
}

namespace {

// A search under way: what each candidate measured last, with how many
// repetitions, and the result so far.
class Searcher {
 public:
  Searcher(size_t n, const MeasureFn& measure, const SearchOptions& options)
      : n_(n), measure_(measure), options_(options), start_(Clock::now()), last_(n), reps_of_(n, 0) {}

  // Exhaustive and random: `order` in order, each at full repetitions.
  void Each(const std::vector<size_t>& order) {
    for (size_t i : order) {
      if (Spent() && !result_.measured.empty()) break;
      Run(i, options_.reps);
    }
  }

  // Successive halving. Round 0 measures everyone once; each round keeps
  // the best 1/rate of the ok ones and each group's best, and doubles the
  // repetitions. Then the final race among the leaders.
  void Halve(const std::vector<size_t>& order);

  SearchResult Finish() {
    for (size_t i = 0; i < n_; ++i) {
      if (reps_of_[i] == options_.reps) result_.fully_measured.push_back(i);
    }
    for (size_t i : result_.fully_measured) {
      if (last_[i].ok() && (result_.best < 0 || last_[i].median_ns < last_[result_.best].median_ns)) {
        result_.best = static_cast<int64_t>(i);
      }
    }
    return std::move(result_);
  }

 private:
  // Whether the budget is spent or a stop was asked for (the search is
  // then incomplete).
  bool Spent() {
    const bool out = (options_.stop != nullptr && options_.stop->load()) ||
                     (options_.budget_seconds > 0 &&
                      std::chrono::duration<double>(Clock::now() - start_).count() >= options_.budget_seconds);
    if (out) result_.complete = false;
    return out;
  }
  void Run(size_t i, int reps) {
    Measurement m = measure_(i, reps, /*again=*/false);
    last_[i] = m;
    reps_of_[i] = reps;
    result_.measured.emplace_back(i, std::move(m));
  }
  int GroupOf(size_t i) const { return i < options_.groups.size() ? options_.groups[i] : 0; }
  int FamilyOf(size_t i) const { return i < options_.families.size() ? options_.families[i] : 0; }
  // The first `count` of `ranked` (ok, fastest first), then each group's
  // fastest not among them if within `within` times the fastest.
  std::vector<size_t> Keep(const std::vector<size_t>& ranked, size_t count, double within) const {
    std::vector<size_t> out(ranked.begin(), ranked.begin() + std::min(count, ranked.size()));
    for (size_t i : ranked) {
      const bool seen = std::any_of(out.begin(), out.end(), [&](size_t j) { return GroupOf(j) == GroupOf(i); });
      if (!seen && last_[i].median_ns <= within * last_[ranked.front()].median_ns) out.push_back(i);
    }
    return out;
  }
  // Timing noise slows runs down, never speeds them up: below full
  // repetitions candidates are ranked by their fastest run, which one
  // preempted run cannot spoil; at full repetitions by the median.
  void Rank(std::vector<size_t>& ranked, bool full) const {
    std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
      return full ? last_[a].median_ns < last_[b].median_ns : last_[a].min_ns < last_[b].min_ns;
    });
  }
  // Round 0 deals the families in turn (each in its own order), so each is
  // probed early.
  std::vector<size_t> DealFamilies(const std::vector<size_t>& order) const {
    std::vector<size_t> alive;
    std::map<int, std::vector<size_t>> members;
    for (size_t i : order) members[FamilyOf(i)].push_back(i);
    for (size_t at = 0; alive.size() < n_; ++at) {
      for (const auto& [family, list] : members) {
        if (at < list.size()) alive.push_back(list[at]);
      }
    }
    return alive;
  }
  // Who goes on to the next round from `ok` (ranked) after one at `reps`.
  std::vector<size_t> Cut(const std::vector<size_t>& ok, int reps) const;
  // The final race among the leaders of `ok` (the last round's, ranked).
  void Race(const std::vector<size_t>& ok);

  const size_t n_;
  const MeasureFn& measure_;
  const SearchOptions& options_;
  const Clock::time_point start_;
  std::vector<Measurement> last_;
  std::vector<int> reps_of_;
  SearchResult result_;
};

void Searcher::Halve(const std::vector<size_t>& order) {
  // Round 0 leaves out the rest of a family far behind.
  std::vector<size_t> alive = DealFamilies(order);
  std::map<int, std::pair<int, double>> probed;  // family -> (ok runs, fastest)
  double fastest = std::numeric_limits<double>::infinity();
  auto far_behind = [&](size_t i) {
    auto it = probed.find(FamilyOf(i));
    return !options_.families.empty() && it != probed.end() && it->second.first >= options_.family_probe &&
           it->second.second > options_.family_cut * fastest;
  };
  int reps = 1;
  bool first_round = true;
  std::vector<size_t> ok;
  for (;;) {
    for (size_t i : alive) {
      if (reps_of_[i] >= reps && !last_[i].ok()) continue;
      if (Spent() && !result_.measured.empty()) break;
      if (first_round && far_behind(i)) {
        ++result_.skipped;
        continue;
      }
      Run(i, reps);
      if (first_round && last_[i].ok()) {
        auto& [runs, best] = probed.try_emplace(FamilyOf(i), 0, std::numeric_limits<double>::infinity()).first->second;
        ++runs;
        best = std::min(best, last_[i].min_ns);
        fastest = std::min(fastest, last_[i].min_ns);
      }
    }
    first_round = false;
    ok.clear();
    for (size_t i : alive) {
      if (last_[i].ok() && reps_of_[i] == reps) ok.push_back(i);
    }
    Rank(ok, reps >= options_.reps);
    if (reps >= options_.reps || ok.size() <= 1 || Spent()) break;
    alive = Cut(ok, reps);
    // A round that cut nothing would measure everyone again with a few
    // more runs (a space of a few candidates, each its variant's best):
    // they go straight to full repetitions.
    reps = alive.size() >= ok.size() ? options_.reps : std::min(options_.reps, reps * 2);
  }
  Race(ok);
}

std::vector<size_t> Searcher::Cut(const std::vector<size_t>& ok, int reps) const {
  const int rate = std::max(2, options_.halving_rate);
  // Round 0 times each candidate's first run after its preparation: a
  // kernel that pays once there (oneDNN's JIT: 58 ms against 3.5 ms)
  // would be cut for it, so every variant's best goes on from it.
  const double within = reps == 1 ? std::numeric_limits<double>::infinity() : 3.0;
  std::vector<size_t> alive = Keep(ok, std::max<size_t>(1, (ok.size() + rate - 1) / rate), within);
  if (reps == 1 && !options_.families.empty()) {
    // And each family's best within the cut of the fastest: one run
    // cannot tell two close families apart (avx2 or avx512 lanes).
    std::set<int> seen;
    for (size_t i : alive) seen.insert(FamilyOf(i));
    for (size_t i : ok) {
      if (seen.insert(FamilyOf(i)).second && last_[i].min_ns <= options_.family_cut * last_[ok.front()].min_ns) {
        alive.push_back(i);
      }
    }
  }
  return alive;
}

void Searcher::Race(const std::vector<size_t>& ok) {
  const bool stopped = options_.stop != nullptr && options_.stop->load();
  std::vector<size_t> leaders = ok.empty() ? ok : Keep(ok, 2, 1.5);
  if (leaders.size() <= 1 || stopped || Spent()) {
    if (!ok.empty() && reps_of_[ok.front()] < options_.reps && !stopped) {
      Run(ok.front(), options_.reps);  // the one left, measured fully
    }
    return;
  }
  for (size_t i : leaders) {
    if (reps_of_[i] < options_.reps && !Spent()) Run(i, options_.reps);
  }
  std::vector<std::vector<Measurement>> passes(leaders.size());
  for (size_t l = 0; l < leaders.size(); ++l) {
    if (last_[leaders[l]].ok() && reps_of_[leaders[l]] == options_.reps) passes[l].push_back(last_[leaders[l]]);
  }
  std::vector<bool> in(leaders.size(), true);
  for (int pass = 0; pass < options_.race_passes && !Spent(); ++pass) {
    if (pass > 0) {
      in = StillRacing(passes);
      if (std::count(in.begin(), in.end(), true) < 2) break;
    }
    for (size_t step = 0; step < leaders.size() && !Spent(); ++step) {
      const size_t l = pass % 2 == 0 ? leaders.size() - 1 - step : step;
      if (!in[l] || passes[l].empty() || !passes[l].back().ok()) continue;
      Measurement m = measure_(leaders[l], options_.reps, /*again=*/true);
      result_.measured.emplace_back(leaders[l], m);
      passes[l].push_back(std::move(m));
    }
  }
  for (size_t l = 0; l < leaders.size(); ++l) {
    if (passes[l].empty()) continue;
    Measurement combined = CombinePasses(passes[l]);
    last_[leaders[l]] = combined;
    result_.raced.emplace_back(leaders[l], std::move(combined));
  }
}

}  // namespace

SearchResult Search(size_t n, const MeasureFn& measure, const SearchOptions& options) {
  Searcher searcher(n, measure, options);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  if (options.strategy == Strategy::kExhaustive || options.strategy == Strategy::kRandom) {
    if (options.strategy == Strategy::kRandom) {
      // Candidate 0 (the default) always, then a random sample of the rest.
      std::mt19937_64 rng(options.seed);
      if (n > 1) std::shuffle(order.begin() + 1, order.end(), rng);
      const size_t want = options.random_samples ? options.random_samples : std::max<size_t>(1, (n + 3) / 4);
      order.resize(std::min(n, want));
    }
    searcher.Each(order);
  } else {
    searcher.Halve(order);
  }
  return searcher.Finish();
}

}  // namespace kreg
