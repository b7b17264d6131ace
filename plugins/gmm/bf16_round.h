// Floats rounded to bf16 bits as FloatToBf16 rounds them (to nearest, ties
// to even; NaN quieted), a vector at a time: shared by the tiled driver's
// copy to a bf16 out and the micro-kernels that store one themselves
// (micro.h's PanelOut). Each function carries its ISA as a target
// attribute and has internal linkage, so that a file compiled for a wider
// ISA (a micro-kernel set's) never lends its copy to a narrower caller.
#ifndef KREG_PLUGINS_GMM_BF16_ROUND_H_
#define KREG_PLUGINS_GMM_BF16_ROUND_H_

#include <immintrin.h>

namespace kreg::gmm {
namespace {

#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12 on its own AVX-512 intrinsics' headers
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Sixteen floats' (bits u) bf16 bits.
__attribute__((target("avx512f"))) inline __m256i Bf16Bits512(__m512i u) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), exponent);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  const __m512i r = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Eight floats' (bits u) bf16 bits, sign-extended in each lane's low half.
__attribute__((target("avx2"))) inline __m256i Bf16Bits256(__m256i u) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), exponent);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i quieted = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
  return _mm256_srai_epi32(_mm256_blendv_epi8(rounded, quieted, nan), 16);
}

// Sixteen floats (lo's eight, then hi's) as bf16 bits, in order.
__attribute__((target("avx2"))) inline __m256i Bf16Bits256x2(__m256i lo, __m256i hi) {
  // packs works within 128-bit halves: 0-3, 8-11, 4-7, 12-15 in order.
  return _mm256_permute4x64_epi64(_mm256_packs_epi32(Bf16Bits256(lo), Bf16Bits256(hi)), 0xd8);
}

}  // namespace
}  // namespace kreg::gmm

#endif  // KREG_PLUGINS_GMM_BF16_ROUND_H_
