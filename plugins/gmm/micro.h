// The tiled kernels' micro-kernels: acc[i * ldc + j] += sum over p < kt of
// a(i, p) * b(p, j), for i < mt, j < nt, in float; a and b are f32 or bf16
// (the same dtype), widened exactly. Every product is taken (no zero is
// skipped), so NaN and infinities propagate as in a plain matmul.
#ifndef KREG_PLUGINS_GMM_MICRO_H_
#define KREG_PLUGINS_GMM_MICRO_H_

#include <cstdint>

#include "common.h"

namespace kreg::gmm {

// Portable C++ (whatever the compiler's baseline vectorises).
void MicroGeneric(float* acc, int64_t ldc, const Mat& a, const Mat& b, int64_t mt, int64_t nt, int64_t kt);
// AVX2 + FMA: 6 x 16 register blocks. Call only where the CPU has both.
void MicroAvx2(float* acc, int64_t ldc, const Mat& a, const Mat& b, int64_t mt, int64_t nt, int64_t kt);

}  // namespace kreg::gmm

#endif  // KREG_PLUGINS_GMM_MICRO_H_
