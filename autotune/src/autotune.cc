#include "kreg/autotune.h"

#include <algorithm>
#include <chrono>
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
    Measurement m = measure(i, reps);
    last[i] = m;
    reps_of[i] = reps;
    result.measured.emplace_back(i, std::move(m));
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
    // the best 1/rate of the ok ones and multiplies the repetitions by rate.
    const int rate = std::max(2, options.halving_rate);
    std::vector<size_t> alive = order;
    int reps = 1;
    for (;;) {
      for (size_t i : alive) {
        if (reps_of[i] >= reps && !last[i].ok()) continue;
        if (spent() && !result.measured.empty()) break;
        run(i, reps);
      }
      std::vector<size_t> ok;
      for (size_t i : alive) {
        if (last[i].ok() && reps_of[i] == reps) ok.push_back(i);
      }
      std::sort(ok.begin(), ok.end(), [&](size_t a, size_t b) { return last[a].median_ns < last[b].median_ns; });
      if (reps >= options.reps || ok.size() <= 1 || spent()) {
        // Measure the winner fully if it is not already.
        const bool stopped = options.stop != nullptr && options.stop->load();
        if (!ok.empty() && reps < options.reps && !stopped) run(ok.front(), options.reps);
        break;
      }
      ok.resize(std::max<size_t>(1, (ok.size() + rate - 1) / rate));
      alive = std::move(ok);
      reps = std::min(options.reps, reps * rate);
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
