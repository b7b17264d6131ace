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

SearchResult Search(size_t n, const MeasureFn& measure, const SearchOptions& options) {
  SearchResult result;
  const auto start = Clock::now();
  auto spent = [&] {
    const bool out = (options.stop != nullptr && options.stop->load()) ||
                     (options.budget_seconds > 0 &&
                      std::chrono::duration<double>(Clock::now() - start).count() >= options.budget_seconds);
    if (out) result.complete = false;
    return out;
  };
  std::vector<Measurement> last(n);
  std::vector<int> reps_of(n, 0);
  auto run = [&](size_t i, int reps) {
    Measurement m = measure(i, reps, /*again=*/false);
    last[i] = m;
    reps_of[i] = reps;
    result.measured.emplace_back(i, std::move(m));
  };
  auto group_of = [&](size_t i) { return i < options.groups.size() ? options.groups[i] : 0; };
  // The first `count` of `ranked` (ok, fastest first), then each group's
  // fastest not among them if within `within` times the fastest.
  auto keep = [&](const std::vector<size_t>& ranked, size_t count, double within) {
    std::vector<size_t> out(ranked.begin(), ranked.begin() + std::min(count, ranked.size()));
    for (size_t i : ranked) {
      const bool seen = std::any_of(out.begin(), out.end(), [&](size_t j) { return group_of(j) == group_of(i); });
      if (!seen && last[i].median_ns <= within * last[ranked.front()].median_ns) out.push_back(i);
    }
    return out;
  };
  // Timing noise slows runs down, never speeds them up: below full
  // repetitions candidates are ranked by their fastest run, which one
  // preempted run cannot spoil; at full repetitions by the median.
  auto rank = [&](std::vector<size_t>& ranked, bool full) {
    std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
      return full ? last[a].median_ns < last[b].median_ns : last[a].min_ns < last[b].min_ns;
    });
  };

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
    for (size_t i : order) {
      if (spent() && !result.measured.empty()) break;
      run(i, options.reps);
    }
  } else {
    // Successive halving. Round 0 measures everyone once; each round keeps
    // the best 1/rate of the ok ones and each group's best, and doubles the
    // repetitions.
    const int rate = std::max(2, options.halving_rate);
    // Round 0 deals the families in turn (each in its own order), so each
    // is probed early, and leaves out the rest of a family far behind.
    auto family_of = [&](size_t i) { return i < options.families.size() ? options.families[i] : 0; };
    std::vector<size_t> alive;
    {
      std::map<int, std::vector<size_t>> members;
      for (size_t i : order) members[family_of(i)].push_back(i);
      for (size_t at = 0; alive.size() < n; ++at) {
        for (const auto& [family, list] : members) {
          if (at < list.size()) alive.push_back(list[at]);
        }
      }
    }
    std::map<int, std::pair<int, double>> probed;  // family -> (ok runs, fastest)
    double fastest = std::numeric_limits<double>::infinity();
    auto far_behind = [&](size_t i) {
      auto it = probed.find(family_of(i));
      return !options.families.empty() && it != probed.end() && it->second.first >= options.family_probe &&
             it->second.second > options.family_cut * fastest;
    };
    int reps = 1;
    bool first_round = true;
    std::vector<size_t> ok;
    for (;;) {
      for (size_t i : alive) {
        if (reps_of[i] >= reps && !last[i].ok()) continue;
        if (spent() && !result.measured.empty()) break;
        if (first_round && far_behind(i)) {
          ++result.skipped;
          continue;
        }
        run(i, reps);
        if (first_round && last[i].ok()) {
          auto& [runs, best] = probed.try_emplace(family_of(i), 0, std::numeric_limits<double>::infinity()).first->second;
          ++runs;
          best = std::min(best, last[i].min_ns);
          fastest = std::min(fastest, last[i].min_ns);
        }
      }
      first_round = false;
      ok.clear();
      for (size_t i : alive) {
        if (last[i].ok() && reps_of[i] == reps) ok.push_back(i);
      }
      rank(ok, reps >= options.reps);
      if (reps >= options.reps || ok.size() <= 1 || spent()) break;
      // Round 0 times each candidate's first run after its preparation: a
      // kernel that pays once there (oneDNN's JIT: 58 ms against 3.5 ms)
      // would be cut for it, so every variant's best goes on from it.
      const double within = reps == 1 ? std::numeric_limits<double>::infinity() : 3.0;
      alive = keep(ok, std::max<size_t>(1, (ok.size() + rate - 1) / rate), within);
      if (reps == 1 && !options.families.empty()) {
        // And each family's best within the cut of the fastest: one run
        // cannot tell two close families apart (avx2 or avx512 lanes).
        std::set<int> seen;
        for (size_t i : alive) seen.insert(family_of(i));
        for (size_t i : ok) {
          if (seen.insert(family_of(i)).second && last[i].min_ns <= options.family_cut * last[ok.front()].min_ns) {
            alive.push_back(i);
          }
        }
      }
      // A round that cut nothing would measure everyone again with a few
      // more runs (a space of a few candidates, each its variant's best):
      // they go straight to full repetitions.
      reps = alive.size() >= ok.size() ? options.reps : std::min(options.reps, reps * 2);
    }
    // The final race among the leaders.
    const bool stopped = options.stop != nullptr && options.stop->load();
    std::vector<size_t> leaders = ok.empty() ? ok : keep(ok, 2, 1.5);
    if (leaders.size() > 1 && !stopped && !spent()) {
      for (size_t i : leaders) {
        if (reps_of[i] < options.reps && !spent()) run(i, options.reps);
      }
      std::vector<std::vector<Measurement>> passes(leaders.size());
      for (size_t l = 0; l < leaders.size(); ++l) {
        if (last[leaders[l]].ok() && reps_of[leaders[l]] == options.reps) passes[l].push_back(last[leaders[l]]);
      }
      std::vector<bool> in(leaders.size(), true);
      for (int pass = 0; pass < options.race_passes && !spent(); ++pass) {
        if (pass > 0) {
          in = StillRacing(passes);
          if (std::count(in.begin(), in.end(), true) < 2) break;
        }
        for (size_t step = 0; step < leaders.size() && !spent(); ++step) {
          const size_t l = pass % 2 == 0 ? leaders.size() - 1 - step : step;
          if (!in[l] || passes[l].empty() || !passes[l].back().ok()) continue;
          Measurement m = measure(leaders[l], options.reps, /*again=*/true);
          result.measured.emplace_back(leaders[l], m);
          passes[l].push_back(std::move(m));
        }
      }
      for (size_t l = 0; l < leaders.size(); ++l) {
        if (passes[l].empty()) continue;
        Measurement combined = CombinePasses(passes[l]);
        last[leaders[l]] = combined;
        result.raced.emplace_back(leaders[l], std::move(combined));
      }
    } else if (!ok.empty() && reps_of[ok.front()] < options.reps && !stopped) {
      run(ok.front(), options.reps);  // the one left, measured fully
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (reps_of[i] == options.reps) result.fully_measured.push_back(i);
  }
  for (size_t i : result.fully_measured) {
    if (last[i].ok() && (result.best < 0 || last[i].median_ns < last[result.best].median_ns)) {
      result.best = static_cast<int64_t>(i);
    }
  }
  return result;
}

}  // namespace kreg
