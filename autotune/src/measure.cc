#include "kreg/measure.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace kreg {
namespace {

using Clock = std::chrono::steady_clock;
double Nanos(Clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); }

}  // namespace

Measurement MeasureKernel(const Kernel& kernel, const Config& config, const std::vector<Problem*>& problems,
                          const MeasureOptions& options) {
  Measurement m;
  if (absl::Status s = kernel.Check(config, *problems[0]->args()); !s.ok()) {
    m.status = TrialStatus::kIllegal;
    m.error = std::string(s.message());
    return m;
  }
  // Everything a run needs is made now, outside the clock.
  std::vector<std::unique_ptr<PreparedRun>> prepared;
  for (Problem* p : problems) {
    absl::StatusOr<std::unique_ptr<PreparedRun>> run = kernel.Prepare(config, *p->args(), options.run);
    if (!run.ok()) {
      m.error = std::string(run.status().message());
      return m;
    }
    prepared.push_back(*std::move(run));
  }
  auto t0 = Clock::now(), t1 = t0;
  const bool check = options.check && !(options.verified && options.reps > 1);
  if (check) {
    // The reference runs first, on inputs no candidate has touched.
    if (absl::Status s = problems[0]->ComputeReference(); !s.ok()) {
      m.error = std::string(s.message());
      return m;
    }
  }
  if (check || options.reps <= 1) {
    Problem& first = *problems[0];
    first.PoisonOutputs();
    first.RestoreInOut();
    t0 = Clock::now();
    absl::Status s = prepared[0]->Run();
    t1 = Clock::now();
    if (!s.ok()) {
      m.error = std::string(s.message());
      return m;
    }
    if (check) {
      if (absl::Status c = first.CheckOutputs(); !c.ok()) {
        m.status = absl::IsInvalidArgument(c) ? TrialStatus::kWrongResult : TrialStatus::kError;
        m.error = std::string(c.message());
        return m;
      }
    }
  }
  std::vector<double> times;
  if (options.reps <= 1) {
    times.push_back(Nanos(t1 - t0));
  } else {
    size_t turn = 0;
    const int warmup = options.verified ? std::min(options.warmup, 1) : options.warmup;
    for (int i = 0; i < warmup; ++i) {
      const size_t at = turn++ % problems.size();
      problems[at]->RestoreInOut();
      (void)prepared[at]->Run();
    }
    const auto start = Clock::now();
    std::vector<double> medians;  // the running median after each sample
    for (int i = 0; i < options.reps; ++i) {
      const size_t at = turn++ % problems.size();
      problems[at]->RestoreInOut();
      t0 = Clock::now();
      absl::Status s = prepared[at]->Run();
      t1 = Clock::now();
      if (!s.ok()) {
        m.error = std::string(s.message());
        return m;
      }
      times.push_back(Nanos(t1 - t0));
      std::vector<double> sorted = times;
      std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
      medians.push_back(sorted[sorted.size() / 2]);
      const size_t k = medians.size();
      if (k >= 5) {
        const auto [lo, hi] = std::minmax({medians[k - 1], medians[k - 2], medians[k - 3]});
        if (hi <= lo * 1.01) break;
      }
      if (i >= 2 && std::chrono::duration<double>(t1 - start).count() > options.max_seconds) break;
    }
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  m.status = TrialStatus::kOk;
  m.median_ns = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  m.min_ns = times.front();
  m.max_ns = times.back();
  m.reps = static_cast<int>(n);
  return m;
}

}  // namespace kreg
