// How kreg times a kernel: the one measurement that `kreg run`, the tuner's
// worker and the sweep share, so their medians are comparable.
//
// Each problem is prepared once (kreg_kernel.prepare, outside the clock).
// The first run writes over poisoned outputs, from restored in-out tensors,
// and is checked against the op's reference before any time counts (unless
// told the candidate is already verified). Then `warmup` untimed runs, then
// up to `reps` timed runs rotating among the problems, each preceded by
// restoring in-out tensors outside the clock, stopping early once the running
// median is stable (the last three within 1%, at least 5 samples) or past
// max_seconds.
//
// Collective ops: every rank calls MeasureKernel at once with its own
// problems and its Comm. Each timed run starts at a barrier and its time is
// the slowest rank's; every rank learns every failure, so all take the same
// decisions (stop early, give up) and return the same status (the failing
// rank its own error, the others "rank R failed").
//
// Thread-safety: one call at a time per set of problems.
#ifndef KREG_AUTOTUNE_MEASURE_H_
#define KREG_AUTOTUNE_MEASURE_H_

#include <vector>

#include "kreg/autotune.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/problem.h"
#include "kreg/registry.h"

namespace kreg {

struct MeasureOptions {
  int warmup = 2;
  int reps = 10;
  double max_seconds = 5;  // stop repeating after this much timed work
  bool check = true;       // check the first run against the reference
  bool verified = false;   // already checked on these problems: skip the check, warm up once
  RunOptions run;          // threads, cancellation, workspace
  Comm* comm = nullptr;    // collective ops: this rank's (sets run.comm)
  // Device kernels: the device they run on (sets run.device). The problems
  // stay on the host; each run's tensors are device copies (DeviceCall),
  // timed with events on the device's stream, the L2 flushed before each
  // timed run when `cold`; the checked run's outputs come back for the check.
  Device* device = nullptr;
  bool cold = true;
};

// Measures `kernel` with `config` on `problems` (at least one). reps <= 1:
// the checked run is the one sample. Status kIllegal when the kernel's check
// refuses, kWrongResult when outputs differ (error names the element), kError
// for any other failure.
Measurement MeasureKernel(const Kernel& kernel, const Config& config, const std::vector<Problem*>& problems,
                          const MeasureOptions& options);

}  // namespace kreg

#endif  // KREG_AUTOTUNE_MEASURE_H_
