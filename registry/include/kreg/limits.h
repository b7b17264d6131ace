// Every bound kreg puts on a number that comes from outside: a flag, a
// Python argument, a tuning table, a plugin. Each bound is a named constant
// here with the one function that checks it; the command line, the Python
// module, the table reader and the mesh parser call these, and no other
// file states a limit. TESTING.md lists them with the reason for each.
//
// A check returns OkStatus or InvalidArgument with one line naming the value
// and what was expected: "threads: expected 0 (all cores) to 1024, got 5000".
// `what` names the value as the caller's user knows it ("threads", "trial
// 3's median_ns"); empty, the line starts at "expected" (the command line
// puts the flag's name before it).
//
// Thread-safety: all functions are pure.
#ifndef KREG_REGISTRY_INCLUDE_KREG_LIMITS_H_
#define KREG_REGISTRY_INCLUDE_KREG_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kreg::limits {

// Threads per kernel run (0: all cores). oneTBB fails outright (a crash in
// its arena) on absurd counts; 1024 is past any machine kreg tunes for, and
// oversubscribing a small one stays possible.
inline constexpr int64_t kMaxThreads = 1024;
absl::Status CheckThreads(int64_t threads, absl::string_view what = "threads");
// The test alone (inline, for a loop over many values: a table's load);
// the check above makes its error from it. Likewise RepsIn, NsIn, RatioIn.
inline bool ThreadsIn(int64_t threads) { return threads >= 0 && threads <= kMaxThreads; }

// Ranks that are threads of this process (--ranks with the threads backend,
// calibrate). Each is a thread with its own buffers standing in for one
// device or process of a node; 256 is past any node's devices or sockets,
// and a count of thousands only runs for minutes (or cannot start its
// threads).
inline constexpr int64_t kMaxThreadRanks = 256;
absl::Status CheckThreadRanks(int64_t ranks, absl::string_view what = "ranks");

// Ranks of any communicator, and a mesh's size (the product of its axes):
// an MPI job of more processes than this is far past what kreg was tested
// on. A mesh has at most kMaxMeshAxes axes.
inline constexpr int64_t kMaxRanks = 65536;
inline constexpr int kMaxMeshAxes = 4;
absl::Status CheckRanks(int64_t ranks, absl::string_view what = "ranks");

// Durations in seconds (--timeout, --comm-timeout, --budget,
// --lock-timeout, and their Python arguments): finite, and at most a week,
// so a deadline computed from one never overflows. Whether 0 is allowed
// (and what it means: "no limit" for a budget, "do not wait" for a lock) is
// the caller's.
inline constexpr double kMaxSeconds = 7 * 24 * 3600.0;
enum class Zero { kAllowed, kRefused };
absl::Status CheckSeconds(double seconds, absl::string_view what, Zero zero);

// Timed and untimed runs per measurement (--reps, --warmup, a trial's reps).
inline constexpr int64_t kMaxReps = 1000000;
absl::Status CheckReps(int64_t reps, absl::string_view what, int64_t least);
inline bool RepsIn(int64_t reps, int64_t least) { return reps >= least && reps <= kMaxReps; }

// The tuner's list parameters (--max-list-len, --list-growth-rounds): a
// list of more values, or more rounds growing one, multiplies the
// candidates past any budget.
inline constexpr int64_t kMaxListLen = 16;
inline constexpr int64_t kMaxListGrowthRounds = 16;
// `what` as an integer in [least, most] (the bounds above).
absl::Status CheckCount(int64_t value, absl::string_view what, int64_t least, int64_t most);

// A measured time in a table (median, min, max), nanoseconds: finite, not
// negative, at most kMaxSeconds (a -1 median would win every query; NaN
// breaks every comparison).
inline constexpr double kMaxNs = kMaxSeconds * 1e9;
absl::Status CheckNs(double ns, absl::string_view what);
inline bool NsIn(double ns) { return ns >= 0 && ns <= kMaxNs; }  // false for NaN and infinities

// A non-negative finite ratio or cost in a table (a trial's relative_iqr, a
// communicator model's alpha, beta, gamma) of at most kMaxSeconds.
absl::Status CheckFinite(double value, absl::string_view what);
inline bool RatioIn(double value) { return value >= 0 && value <= kMaxSeconds; }  // false for NaN and infinities

// Logical cores in a machine record.
inline constexpr int64_t kMaxCores = 65536;
absl::Status CheckCores(int64_t cores, absl::string_view what = "cores");

// A shape record (KREG_RECORD, kreg tune --from-record; kreg/record.h): at
// most this many shapes, each line at most this many bytes. A program meets
// far fewer untuned shapes, and each costs a sweep; a longer line is not
// one the recorder writes.
inline constexpr int64_t kMaxRecordShapes = 65536;
inline constexpr int64_t kMaxRecordLineBytes = 4096;
absl::Status CheckRecordShapes(int64_t shapes, absl::string_view what = "shapes");

// An error or warning line (kreg/text.h's OneLine): a message quoting a
// plugin's, a table's or a flag's text is cut past this many bytes.
inline constexpr int64_t kMaxLineBytes = 2048;

// A plugin's load (its constructors, entry point and init): past this, a
// warning names it, and kreg list --check-plugins calls it hung.
inline constexpr double kPluginLoadSeconds = 5;

// How long a writer waits for a table's lock before giving up, by default
// (--lock-timeout): long enough for another sweep to save its result.
inline constexpr double kDefaultLockTimeoutSeconds = 60;

}  // namespace kreg::limits

#endif  // KREG_REGISTRY_INCLUDE_KREG_LIMITS_H_
