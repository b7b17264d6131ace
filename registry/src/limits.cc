#include "kreg/limits.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kreg::limits {
namespace {

absl::Status Outside(absl::string_view what, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(what, what.empty() ? "" : ": ", "expected ", expected, ", got ", value));
}

// `expected()`: the bounds in words, made only for a value outside them (a
// table's load checks every trial's numbers).
template <typename Expected>
absl::Status IntIn(int64_t v, int64_t lo, int64_t hi, absl::string_view what, const Expected& expected) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return Outside(what, absl::StrCat(v), expected());
}

}  // namespace

absl::Status CheckThreads(int64_t threads, absl::string_view what) {
  if (ThreadsIn(threads)) return absl::OkStatus();
  return IntIn(threads, 0, kMaxThreads, what, [&] { return absl::StrCat("0 (all cores) to ", kMaxThreads); });
}

absl::Status CheckThreadRanks(int64_t ranks, absl::string_view what) {
  return IntIn(ranks, 1, kMaxThreadRanks, what,
               [&] { return absl::StrCat("1 to ", kMaxThreadRanks, " thread ranks (each is a thread of this process)"); });
}

absl::Status CheckRanks(int64_t ranks, absl::string_view what) {
  return IntIn(ranks, 1, kMaxRanks, what, [&] { return absl::StrCat("1 to ", kMaxRanks, " ranks"); });
}

absl::Status CheckSeconds(double seconds, absl::string_view what, Zero zero) {
  const bool ok = std::isfinite(seconds) && (zero == Zero::kAllowed ? seconds >= 0 : seconds > 0) &&
                  seconds <= kMaxSeconds;
  if (ok) return absl::OkStatus();
  return Outside(what, absl::StrCat(seconds),
                 absl::StrCat(zero == Zero::kAllowed ? "0 to " : "more than 0 and at most ", kMaxSeconds,
                              " seconds (a week)"));
}

absl::Status CheckReps(int64_t reps, absl::string_view what, int64_t least) {
  if (RepsIn(reps, least)) return absl::OkStatus();
  return IntIn(reps, least, kMaxReps, what, [&] { return absl::StrCat(least, " to ", kMaxReps); });
}

absl::Status CheckCount(int64_t value, absl::string_view what, int64_t least, int64_t most) {
  return IntIn(value, least, most, what, [&] { return absl::StrCat(least, " to ", most); });
}

absl::Status CheckNs(double ns, absl::string_view what) {
  if (NsIn(ns)) return absl::OkStatus();
  return Outside(what, absl::StrCat(ns), absl::StrCat("0 to ", kMaxNs, " ns (a week)"));
}

absl::Status CheckFinite(double value, absl::string_view what) {
  if (RatioIn(value)) return absl::OkStatus();
  return Outside(what, absl::StrCat(value), absl::StrCat("a finite number from 0 to ", kMaxSeconds));
}

absl::Status CheckCores(int64_t cores, absl::string_view what) {
  return IntIn(cores, 0, kMaxCores, what, [&] { return absl::StrCat("0 to ", kMaxCores); });
}

absl::Status CheckRecordShapes(int64_t shapes, absl::string_view what) {
  return IntIn(shapes, 0, kMaxRecordShapes, what, [&] { return absl::StrCat("at most ", kMaxRecordShapes, " shapes"); });
}

}  // namespace kreg::limits
