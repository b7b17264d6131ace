// The micro-kernels of gmm/tiled and tgmm/tiled (see micro.h). The AVX2 one
// is compiled for avx2,fma by function attributes only: the plugin has no
// global ISA flags, and the host runs the "avx2" choice only on CPUs with
// both.
#include "micro.h"

#include <immintrin.h>

namespace kreg::gmm {
namespace {

template <bool kBf16>
void GenericImpl(float* acc, int64_t ldc, const Mat& a, const Mat& b, int64_t mt, int64_t nt, int64_t kt) {
  for (int64_t i = 0; i < mt; ++i) {
    float* c = acc + i * ldc;
    const void* arow = a.Row(i);
    for (int64_t p = 0; p < kt; ++p) {
      const float x = LoadAt(arow, kBf16, p);
      const void* brow = b.Row(p);
      for (int64_t j = 0; j < nt; ++j) c[j] += x * LoadAt(brow, kBf16, j);
    }
  }
}

#define KREG_AVX2 __attribute__((target("avx2,fma")))

// Eight elements of a row from column j, widened to float.
template <bool kBf16>
KREG_AVX2 inline __m256 Load8(const void* row, int64_t j) {
  if constexpr (kBf16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + j));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(row) + j);
  }
}

// Rows [i0, i0 + kMr) x columns [j0, j0 + 8 * kNv) of acc, kept in
// registers over the whole kt loop.
template <int kMr, int kNv, bool kBf16>
KREG_AVX2 void Block(float* acc, int64_t ldc, const Mat& a, const Mat& b, int64_t i0, int64_t j0, int64_t kt) {
  __m256 c[kMr][kNv];
  const void* arow[kMr];
  for (int r = 0; r < kMr; ++r) {
    arow[r] = a.Row(i0 + r);
    for (int v = 0; v < kNv; ++v) c[r][v] = _mm256_loadu_ps(acc + (i0 + r) * ldc + j0 + 8 * v);
  }
  for (int64_t p = 0; p < kt; ++p) {
    const void* brow = b.Row(p);
    __m256 bv[kNv];
    for (int v = 0; v < kNv; ++v) bv[v] = Load8<kBf16>(brow, j0 + 8 * v);
    for (int r = 0; r < kMr; ++r) {
      const __m256 x = _mm256_set1_ps(LoadAt(arow[r], kBf16, p));
      for (int v = 0; v < kNv; ++v) c[r][v] = _mm256_fmadd_ps(x, bv[v], c[r][v]);
    }
  }
  for (int r = 0; r < kMr; ++r) {
    for (int v = 0; v < kNv; ++v) _mm256_storeu_ps(acc + (i0 + r) * ldc + j0 + 8 * v, c[r][v]);
  }
}

// kMr rows from i0: 16-column blocks, an 8-column block, then the < 8
// columns left one at a time.
template <int kMr, bool kBf16>
KREG_AVX2 void Rows(float* acc, int64_t ldc, const Mat& a, const Mat& b, int64_t i0, int64_t nt, int64_t kt) {
  int64_t j = 0;
  for (; j + 16 <= nt; j += 16) Block<kMr, 2, kBf16>(acc, ldc, a, b, i0, j, kt);
  if (j + 8 <= nt) {
    Block<kMr, 1, kBf16>(acc, ldc, a, b, i0, j, kt);
    j += 8;
  }
  if (j == nt) return;
  for (int r = 0; r < kMr; ++r) {
    float* c = acc + (i0 + r) * ldc;
    const void* arow = a.Row(i0 + r);
    for (int64_t p = 0; p < kt; ++p) {
      const float x = LoadAt(arow, kBf16, p);
      const void* brow = b.Row(p);
      for (int64_t jj = j; jj < nt; ++jj) c[jj] += x * LoadAt(brow, kBf16, jj);
    }
  }
}

template <bool kBf16>
KREG_AVX2 void Avx2Impl(float* acc, int64_t ldc, const Mat& a, const Mat& b, int64_t mt, int64_t nt, int64_t kt) {
  int64_t i = 0;
  for (; i + 6 <= mt; i += 6) Rows<6, kBf16>(acc, ldc, a, b, i, nt, kt);
  switch (mt - i) {
    case 5:
      Rows<5, kBf16>(acc, ldc, a, b, i, nt, kt);
      break;
    case 4:
      Rows<4, kBf16>(acc, ldc, a, b, i, nt, kt);
      break;
    case 3:
      Rows<3, kBf16>(acc, ldc, a, b, i, nt, kt);
      break;
    case 2:
      Rows<2, kBf16>(acc, ldc, a, b, i, nt, kt);
      break;
    case 1:
      Rows<1, kBf16>(acc, ldc, a, b, i, nt, kt);
      break;
    default:
      break;
  }
}

}  // namespace

void MicroGeneric(float* acc, int64_t ldc, const Mat& a, const Mat& b, int64_t mt, int64_t nt, int64_t kt) {
  if (a.bf16) {
    GenericImpl<true>(acc, ldc, a, b, mt, nt, kt);
  } else {
    GenericImpl<false>(acc, ldc, a, b, mt, nt, kt);
  }
}

KREG_AVX2 void MicroAvx2(float* acc, int64_t ldc, const Mat& a, const Mat& b, int64_t mt, int64_t nt, int64_t kt) {
  if (a.bf16) {
    Avx2Impl<true>(acc, ldc, a, b, mt, nt, kt);
  } else {
    Avx2Impl<false>(acc, ldc, a, b, mt, nt, kt);
  }
}

}  // namespace kreg::gmm
