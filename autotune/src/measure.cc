#include "kreg/measure.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kreg/device.h"

namespace kreg {
namespace {

using Clock = std::chrono::steady_clock;
double Nanos(Clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); }

// What every rank of a collective learns after each step: the worst status
// (ok < wrong result < illegal < error) and the lowest rank that had it, and
// the largest value (a run's time). Without a communicator, this rank's own.
class Ranks {
 public:
  explicit Ranks(Comm* comm) : comm_(comm) {}

  // Shares this rank's outcome `m` (status, error) and `value`; returns the
  // largest value. On failure anywhere, *m is this rank's own failure or
  // "rank R failed", and false is returned.
  bool Share(Measurement* m, double* value = nullptr) {
    if (comm_ == nullptr) return m->status == TrialStatus::kOk;
    const double severity = Severity(m->status);
    const double v = value != nullptr ? *value : 0;
    // Lowest failing rank: the largest (size - rank) among those failing.
    absl::StatusOr<std::vector<double>> all =
        comm_->AllMax({severity, severity > 0 ? comm_->size() - comm_->rank() : 0.0, v});
    if (!all.ok()) {
      m->status = TrialStatus::kError;
      if (m->error.empty()) m->error = std::string(all.status().message());
      return false;
    }
    if (value != nullptr) *value = (*all)[2];
    if ((*all)[0] == 0) return true;
    const int failed = comm_->size() - static_cast<int>((*all)[1]);
    if (severity != (*all)[0]) {
      m->status = FromSeverity((*all)[0]);
      m->error = absl::StrCat("rank ", failed, " failed");
      m->relayed = true;
    }
    return false;
  }

 private:
  static double Severity(TrialStatus s) {
    switch (s) {
      case TrialStatus::kOk:
        return 0;
      case TrialStatus::kWrongResult:
        return 1;
      case TrialStatus::kIllegal:
        return 2;
      default:
        return 3;
    }
  }
  static TrialStatus FromSeverity(double s) {
    return s == 1 ? TrialStatus::kWrongResult : s == 2 ? TrialStatus::kIllegal : TrialStatus::kError;
  }
  Comm* comm_;
};

// Runs `run` once, timed; a collective starts every rank at a barrier, and
// a rank whose run fails tells the others at once (their kernels' waits on
// it fail rather than time out; the agreement that follows goes on).
absl::Status TimedRun(PreparedRun& run, Comm* comm, double* nanos, Device* device = nullptr, bool cold = false) {
  if (device != nullptr) {  // events on the device's stream around the launch
    if (cold) {
      if (absl::Status s = device->FlushL2(); !s.ok()) return s;
    }
    absl::StatusOr<double> ns = device->Time([&] { return run.Run(); });
    if (!ns.ok()) return ns.status();
    *nanos = *ns;
    return absl::OkStatus();
  }
  if (comm != nullptr) {
    if (absl::Status s = comm->Barrier(); !s.ok()) return s;
  }
  const auto t0 = Clock::now();
  absl::Status s = run.Run();
  *nanos = Nanos(Clock::now() - t0);
  if (!s.ok() && comm != nullptr) comm->Abort(s.message(), /*leaving=*/false);  // it stays to agree
  return s;
}

// Whether every rank measures the same kernel, configuration and problem:
// a fingerprint of them, its maximum and minimum over the ranks.
absl::Status SameEverywhere(Comm& comm, const Kernel& kernel, const Config& config, const Problem& problem) {
  const OpKey key = problem.key();
  const std::string what = absl::StrCat(kernel.name(), " ", kernel.ConfigString(config), " ", key.dtype, " ",
                                        DimsString(key.dims));
  const uint64_t h = std::hash<std::string>{}(what);  // the same binary on every rank
  const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
  absl::StatusOr<std::vector<double>> m = comm.AllMax({hi, lo, -hi, -lo});
  if (!m.ok()) return m.status();
  if ((*m)[0] != -(*m)[2] || (*m)[1] != -(*m)[3]) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ranks disagree on what to run (kernel, parameters, dtypes or dims); rank ", comm.rank(),
                     " has ", what));
  }
  return absl::OkStatus();
}

// Whether the running median has settled: the medians after each sample
// (appended to *medians), the last three of at least five within 1%.
bool Settled(const std::vector<double>& times, std::vector<double>* medians) {
  std::vector<double> sorted = times;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  medians->push_back(sorted[sorted.size() / 2]);
  const size_t k = medians->size();
  if (k < 5) return false;
  const auto [lo, hi] = std::minmax({(*medians)[k - 1], (*medians)[k - 2], (*medians)[k - 3]});
  return hi <= lo * 1.01;
}

// An OK measurement of `times`: their median, min, max and count.
void Summarize(std::vector<double> times, Measurement* m) {
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  m->status = TrialStatus::kOk;
  m->median_ns = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  m->min_ns = times.front();
  m->max_ns = times.back();
  m->reps = static_cast<int>(n);
}

}  // namespace

Measurement MeasureKernel(const Kernel& kernel, const Config& config, const std::vector<Problem*>& problems,
                          const MeasureOptions& options) {
  Measurement m;
  Ranks ranks(options.comm);
  RunOptions run_options = options.run;
  if (options.comm != nullptr) run_options.comm = options.comm->abi();
  auto failed = [&](const absl::Status& s, TrialStatus status = TrialStatus::kError) {
    if (!s.ok()) {
      m.status = status;
      m.error = std::string(s.message());
    }
    return !ranks.Share(&m);
  };
  m.status = TrialStatus::kOk;
  if (options.comm != nullptr) {
    if (absl::Status s = SameEverywhere(*options.comm, kernel, config, *problems[0]); !s.ok()) {
      m.status = TrialStatus::kError;
      m.error = std::string(s.message());
      return m;
    }
  }
  // Device kernels: each problem's call on the device (its data validated
  // on the host first, by the host call's check).
  Device* device = options.device;
  std::vector<std::unique_ptr<DeviceCall>> on_device;
  if (device != nullptr) {
    run_options.device = device->abi();
    if (failed(kernel.op_info().Validate(*problems[0]->args()), TrialStatus::kIllegal)) return m;
    for (Problem* p : problems) {
      absl::StatusOr<std::unique_ptr<DeviceCall>> call = DeviceCall::Make(*device, *p->args());
      if (failed(call.status())) return m;
      on_device.push_back(*std::move(call));
    }
  }
  auto args_of = [&](size_t i) { return device != nullptr ? on_device[i]->args() : problems[i]->args(); };
  // Puts problem i's tensors on the device (after the host restored or
  // poisoned them); nothing on the CPU.
  auto copy_in = [&](size_t i) { return device != nullptr ? on_device[i]->CopyIn() : absl::OkStatus(); };
  if (failed(kernel.Check(config, *args_of(0)), TrialStatus::kIllegal)) return m;
  // Everything a run needs is made now, outside the clock.
  std::vector<std::unique_ptr<PreparedRun>> prepared;
  absl::Status prepare_status;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (absl::Status s = copy_in(i); !s.ok()) {
      prepare_status = s;
      break;
    }
    absl::StatusOr<std::unique_ptr<PreparedRun>> run = kernel.Prepare(config, *args_of(i), run_options);
    if (!run.ok()) {
      prepare_status = run.status();
      break;
    }
    prepared.push_back(*std::move(run));
  }
  if (failed(prepare_status)) return m;
  const bool check = options.check && !(options.verified && options.reps > 1);
  // The reference runs first, on inputs no candidate has touched.
  if (check && failed(problems[0]->ComputeReference())) return m;
  double first_ns = 0;
  const bool cold = device != nullptr && options.cold;
  if (check || options.reps <= 1) {
    Problem& first = *problems[0];
    first.PoisonOutputs();
    first.RestoreInOut();
    if (device != nullptr && failed(copy_in(0))) return m;
    if (failed(TimedRun(*prepared[0], options.comm, &first_ns, device, cold))) return m;
    if (device != nullptr && failed(on_device[0]->CopyBack())) return m;
    if (check) {
      const absl::Status c = first.CheckOutputs();
      if (failed(c, absl::IsInvalidArgument(c) ? TrialStatus::kWrongResult : TrialStatus::kError)) return m;
    }
  }
  std::vector<double> times;
  if (options.reps <= 1) {
    if (!ranks.Share(&m, &first_ns)) return m;
    times.push_back(first_ns);
  } else {
    size_t turn = 0;
    const int warmup = options.verified ? std::min(options.warmup, 1) : options.warmup;
    // In-out tensors restored before each run (on the device too), outside
    // the clock; false when that failed.
    auto restore = [&](size_t at) {
      problems[at]->RestoreInOut();
      return device == nullptr || !problems[at]->has_inout() || !failed(copy_in(at));
    };
    for (int i = 0; i < warmup; ++i) {
      const size_t at = turn++ % problems.size();
      if (!restore(at)) return m;
      double ns = 0;
      if (failed(TimedRun(*prepared[at], options.comm, &ns, device, cold))) return m;
    }
    double timed_ns = 0;  // the timed runs so far
    std::vector<double> medians;  // the running median after each sample
    for (int i = 0; i < options.reps; ++i) {
      const size_t at = turn++ % problems.size();
      if (!restore(at)) return m;
      double ns = 0;
      if (absl::Status s = TimedRun(*prepared[at], options.comm, &ns, device, cold); !s.ok()) {
        m.status = TrialStatus::kError;
        m.error = std::string(s.message());
      }
      if (!ranks.Share(&m, &ns)) return m;  // ns: the slowest rank's
      times.push_back(ns);
      timed_ns += ns;
      if (Settled(times, &medians)) break;
      if (i >= 2 && timed_ns * 1e-9 > options.max_seconds) break;
    }
  }
  // A write past a tensor's end in any run, checked or not, is a wrong result.
  for (Problem* p : problems) {
    if (failed(p->CheckGuards(), TrialStatus::kWrongResult)) return m;
  }
  Summarize(std::move(times), &m);
  return m;
}

}  // namespace kreg
