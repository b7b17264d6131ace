// topk/reference: the op's oracle. A full stable sort of each row's range
// under kreg's order, comparing the values as floats (not the packed integer
// keys the variants share), then the first k written out. Plain and obviously
// right; rows run in parallel.
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "common.h"
#include "variants.h"

namespace kreg::topk {
namespace {

// Element c of row r as a float (bf16 widened).
float Load(const TopKArgs& a, int64_t r, int64_t c) {
  if (IsBf16(a)) {
    const uint32_t u = static_cast<uint32_t>(RowPtr<const uint16_t>(a.input, r)[c]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  return RowPtr<const float>(a.input, r)[c];
}

// kreg's total order: NaN (either sign) above everything, -0 == +0.
int Compare(float x, float y) {
  const bool xn = std::isnan(x), yn = std::isnan(y);
  if (xn || yn) return static_cast<int>(xn) - static_cast<int>(yn);
  return x < y ? -1 : (x > y ? 1 : 0);
}

kreg_status Run(const TopKArgs& a, const kreg_config*, const kreg_host* host, char* msg, size_t cap) {
  const bool bf16 = IsBf16(a);
  const uint32_t worst = a.largest ? 0xff800000u : 0x7f800000u;  // -inf : +inf, as f32 bits
  const kreg_status status = ForEachRow(a.input->shape[0], host, [&](int64_t r) {
    int64_t start, end;
    RowRange(a, r, &start, &end);
    std::vector<int64_t> order(end - start);
    std::iota(order.begin(), order.end(), start);
    std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
      const int c = Compare(Load(a, r, i), Load(a, r, j));
      return a.largest ? c > 0 : c < 0;
    });
    int32_t* idx = RowPtr<int32_t>(a.indices, r);
    for (int64_t j = 0; j < a.k; ++j) {
      const bool real = j < static_cast<int64_t>(order.size());
      idx[j] = real ? static_cast<int32_t>(order[j]) : -1;
      if (bf16) {
        RowPtr<uint16_t>(a.values, r)[j] =
            real ? RowPtr<const uint16_t>(a.input, r)[order[j]] : static_cast<uint16_t>(worst >> 16);
      } else {
        RowPtr<uint32_t>(a.values, r)[j] = real ? RowPtr<const uint32_t>(a.input, r)[order[j]] : worst;
      }
    }
    if (a.stats != nullptr) RowPtr<int32_t>(a.stats, 0)[r] = 0;
  });
  return Finish(status, msg, cap);
}

}  // namespace

extern const kreg_kernel kReferenceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "reference",
    .version = 1,
    .doc = "the oracle: a full stable sort of each row's range",
    .flags = KREG_KERNEL_REFERENCE,
    .check = CheckTopK,
    .run = GuardedRun<Run>,
};

}  // namespace kreg::topk
