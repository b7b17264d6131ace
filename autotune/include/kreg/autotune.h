// The autotuner's parts that need no process of their own: search spaces
// built from kernel descriptors, and search strategies over them.
//
// A strategy only decides what to measure and how often; it reaches the
// kernels through a MeasureFn, so strategies can be tested against a
// synthetic cost function and run unchanged against isolated workers
// (kreg/worker.h).
//
// Thread-safety: EnumerateSpace is thread-safe and uses oneTBB internally;
// Search calls `measure` from the calling thread only, one call at a time,
// so timed runs never overlap.
#ifndef KREG_AUTOTUNE_AUTOTUNE_H_
#define KREG_AUTOTUNE_AUTOTUNE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/registry.h"

namespace kreg {

struct SpaceOptions {
  // INT_LIST parameters take the increasing lists of 1..max_list_len values
  // drawn from the parameter's candidates (plus its default list).
  int max_list_len = 2;
};

// Every configuration of `kernel` (ParamSpace::Enumerate) that its legality
// check accepts for `args` (checked in parallel), in a stable order, the
// default first when legal.
std::vector<Config> EnumerateSpace(const Kernel& kernel, const kreg_args& args,
                                   const SpaceOptions& options = {});

enum class TrialStatus { kOk, kWrongResult, kCrashed, kTimedOut, kIllegal, kError };
absl::string_view TrialStatusName(TrialStatus status);  // "ok", "wrong_result", ...
absl::StatusOr<TrialStatus> ParseTrialStatus(absl::string_view name);

// One measurement of one candidate.
struct Measurement {
  TrialStatus status = TrialStatus::kError;
  double median_ns = 0, min_ns = 0, max_ns = 0;
  int reps = 0;
  std::string error;  // why, when status is not kOk
  int signal = 0;     // kCrashed: the signal that ended the process running it (0: unknown)
  // Collectives: the failure is another rank's ("rank R failed"), learned
  // when the ranks agreed on the outcome.
  bool relayed = false;
  bool ok() const { return status == TrialStatus::kOk; }
};

enum class Strategy { kExhaustive, kRandom, kHalving };
absl::StatusOr<Strategy> ParseStrategy(absl::string_view name);
absl::string_view StrategyName(Strategy strategy);

struct SearchOptions {
  Strategy strategy = Strategy::kHalving;
  int reps = 10;             // timed runs of a full measurement
  double budget_seconds = 0;  // 0: none; every strategy stops when spent
  size_t random_samples = 0;  // random: candidates to draw (0: a quarter)
  int halving_rate = 4;       // halving: keep 1 of every `rate` per round
  // halving: each candidate's group (its variant); empty: one group. Every
  // group's best so far survives each cut and races at the end.
  std::vector<int> groups;
  // halving: each candidate's family (its variant and the values of its
  // choice parameters, e.g. a micro-kernel); empty: none. Round 0 measures
  // the families in turn and measures no more of a family once
  // `family_probe` of its candidates ran and its fastest is `family_cut`
  // times the fastest so far or slower (a portable micro-kernel beside an
  // AVX-512 one): those are left out, not measured. Each family's best
  // within that cut of the fastest goes on to the next round.
  std::vector<int> families;
  int family_probe = 4;
  double family_cut = 3.0;
  // halving: interleaved passes of the final race after the leaders' full
  // measurements.
  int race_passes = 2;
  uint64_t seed = 1;
  const std::atomic<bool>* stop = nullptr;  // set: finish the current candidate, then stop
};

// measure(i, reps, again) measures candidate i with `reps` timed runs.
// `again`: a repeat of a full measurement in halving's final race, which
// must be measured afresh (not answered from a stored result).
using MeasureFn = std::function<Measurement(size_t candidate, int reps, bool again)>;

struct SearchResult {
  // Every measurement made, in order; later ones of a candidate supersede
  // earlier ones (halving re-measures survivors with more repetitions).
  std::vector<std::pair<size_t, Measurement>> measured;
  // Halving's final race: each leader's passes combined (the median of
  // their medians, the least minimum, the greatest maximum, every rep), in
  // the leaders' order. Empty when one candidate was left.
  std::vector<std::pair<size_t, Measurement>> raced;
  // The best candidate by its raced, else last full, measurement; -1 if
  // none was ok.
  int64_t best = -1;
  // Candidates whose last measurement used opts.reps repetitions.
  std::vector<size_t> fully_measured;
  // False when the budget or the stop flag cut the strategy short.
  bool complete = true;
  // halving: candidates left out of round 0 with their family.
  size_t skipped = 0;
};

// Searches candidates [0, n). Exhaustive measures all fully. Random measures
// a sample fully. Halving measures all once (each candidate's first run is
// its correctness check), keeps the best 1/rate (ranked by their fastest
// run, which one preempted run cannot spoil) and each group's best if within
// 3x, doubles the repetitions, and so on up to full repetitions;
// then races the leaders (the best two and each group's best, if within
// 1.5x of the best): each measured fully, then up to `race_passes` more
// times, interleaved in alternating order so that drift and noise fall on
// all of them alike, a leader leaving the race once clearly behind
// (StillRacing); the winner has the least median of its passes' medians.
SearchResult Search(size_t n, const MeasureFn& measure, const SearchOptions& options);

// One candidate's race passes as one measurement: the median of their
// medians, the least min and greatest max, the repetitions summed; a
// failure in any pass is the result. `passes` is not empty.
Measurement CombinePasses(const std::vector<Measurement>& passes);

// After an interleaved pass of a race, the racers still in it: passes[l]
// are racer l's measurements so far (empty or failed: out). Timing noise
// slows runs down and never speeds them up, so a racer whose fastest run
// is slower than the leader's median (CombinePasses) is behind it, and
// more passes would only confirm that; the others race on.
std::vector<bool> StillRacing(const std::vector<std::vector<Measurement>>& passes);

}  // namespace kreg

#endif  // KREG_AUTOTUNE_AUTOTUNE_H_
