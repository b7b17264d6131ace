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

const kreg_param_desc kMethodParam = [] {
  kreg_param_desc d{};
  d.struct_size = sizeof(kreg_param_desc);
  d.name = "method";
  d.doc = "partial_sort, or nth_element then sort the k best";
  d.kind = KREG_PARAM_CHOICE;
  d.values = nullptr;
  d.num_values = 0;
  d.choices = kMethods;
  d.num_choices = 2;
  d.default_value = kPartialSort;
  return d;
}();
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

extern const kreg_kernel kSortKernel = [] {
  kreg_kernel d{};
  d.struct_size = sizeof(kreg_kernel);
  d.op = "topk";
  d.variant = "sort";
  d.version = 1;
  d.doc = "sort each row's keys (the reference schedule)";
  d.required_isa = 0;
  d.flags = 0;
  d.params = kParams;
  d.num_params = sizeof kParams / sizeof kParams[0];
  d.check = CheckTopK;
  d.workspace_bytes = nullptr;
  d.run = GuardedRun<Run>;
  d.prepare = nullptr;
  d.release = nullptr;
  return d;
}();

}  // namespace kreg::topk
