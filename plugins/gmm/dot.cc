// The reference's sums, out of line and without ISA attributes (so no FMA
// contraction): the tiled and oneDNN kernels' fallback for extreme values
// reproduces the reference bit for bit. Compiled into both plugins.
#include "common.h"

namespace kreg::gmm {

double GmmDot(const Mat& lhs, int64_t row, const Mat& rhs, int64_t col, int64_t k, bool rhs_transposed) {
  const void* a = lhs.Row(row);
  double acc = 0.0;
  if (rhs_transposed) {
    const void* b = rhs.Row(col);  // the physical row `col` of [n, k]: column col of the logical rhs
    for (int64_t p = 0; p < k; ++p) {
      acc += static_cast<double>(LoadAt(a, lhs.bf16, p)) * static_cast<double>(LoadAt(b, rhs.bf16, p));
    }
    return acc;
  }
  for (int64_t p = 0; p < k; ++p) {
    acc += static_cast<double>(LoadAt(a, lhs.bf16, p)) * static_cast<double>(rhs.At(p, col));
  }
  return acc;
}

double TgmmDot(const Mat& lhs, int64_t i, const Mat& rhs, int64_t col, int64_t r0, int64_t r1) {
  const void* a = lhs.Row(i);
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    acc += static_cast<double>(LoadAt(a, lhs.bf16, r)) * static_cast<double>(rhs.At(r, col));
  }
  return acc;
}

}  // namespace kreg::gmm
