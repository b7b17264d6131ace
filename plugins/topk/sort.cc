// topk/sort: sort each row's packed (score, column) keys, either with
// std::partial_sort or with std::nth_element and a sort of the k best. Simple
// and obviously right: the baseline the other variants are measured against.
#include <algorithm>
#include <functional>
#include <vector>

#include "common.h"
#include "variants.h"

namespace kreg::topk {
namespace {

enum Method { kPartialSort = 0, kNthElement = 1 };
const char* const kMethods[] = {"partial_sort", "nth_element"};

const kreg_param_desc kMethodParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "method",
    .doc = "partial_sort, or nth_element then sort the k best",
    .kind = KREG_PARAM_CHOICE,
    .choices = kMethods,
    .num_choices = 2,
    .default_value = kPartialSort,
};
const kreg_param_desc* const kParams[] = {&kMethodParam};

kreg_status Run(const TopKArgs& a, const kreg_config* config, const kreg_host* host, char* msg,
                size_t cap) {
  const bool bf16 = IsBf16(a);
  const int64_t method = Param(config, 0).value;
  const kreg_status status = SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end,
                                               std::vector<uint64_t>& keys) {
    const void* row = InputRow(a, r);
    keys.resize(end - start);
    for (int64_t c = start; c < end; ++c) {
      keys[c - start] = Pack(Score(FloatBits(row, bf16, c), a.largest), c);
    }
    KeepBest(keys, a.k, method == kNthElement);
    return 0;
  });
  return Finish(status, msg, cap);
}

}  // namespace

extern const kreg_kernel kSortKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "sort",
    .version = 1,
    .doc = "sort each row's keys (the reference schedule)",
    .params = kParams,
    .num_params = sizeof kParams / sizeof kParams[0],
    .check = CheckTopK,
    .run = GuardedRun<Run>,
};

}  // namespace kreg::topk
