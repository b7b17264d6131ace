// What a problem's files share (problem.cc, fill.cc). Private to the
// registry.
#ifndef KREG_REGISTRY_SRC_PROBLEM_INTERNAL_H_
#define KREG_REGISTRY_SRC_PROBLEM_INTERNAL_H_

#include <cstdint>

#include "kreg/problem.h"
#include "kreg/tensor.h"

namespace kreg {
namespace problem_internal {

// Sizes of `t.numel()` groups summing to `total`, drawn as `how` says.
void FillPartition(Tensor& t, int64_t total, Partition how, uint64_t seed);

// Ranges within [0, n): every kind, empty, short, exact and full. `starts`
// or `ends` may be null (then 0 or n).
void FillRanges(Tensor* starts, Tensor* ends, int64_t n, uint64_t seed);

}  // namespace problem_internal
}  // namespace kreg

#endif  // KREG_REGISTRY_SRC_PROBLEM_INTERNAL_H_
