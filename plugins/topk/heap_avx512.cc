// topk/heap's scan with AVX-512 (F, BW): 64 elements a step, the compares
// straight into mask registers (heap_scan.h).
#include <immintrin.h>

#include "common.h"
#include "heap.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx2")
// GCC 12 takes the intrinsics' undefined pass-through source for an
// uninitialised read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "heap_scan.h"

namespace kreg::topk {
namespace {

struct Avx512 {
  using Vec = __m512;
  static constexpr int64_t kLanes = 16, kStep = 64;
  // Sixteen elements starting at column c, widened to float32.
  static Vec Load(const void* row, bool bf16, int64_t c) {
    if (!bf16) return _mm512_loadu_ps(static_cast<const float*>(row) + c);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static Vec Splat(float t) { return _mm512_set1_ps(t); }
  static void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  template <bool kLargest>
  static Vec Better(Vec a, Vec b) {
    return kLargest ? _mm512_max_ps(a, b) : _mm512_min_ps(a, b);
  }
  template <int kCmp>
  static uint64_t Flags(const void* row, bool bf16, int64_t c, Vec t) {
    const __mmask16 m0 = _mm512_cmp_ps_mask(Load(row, bf16, c), t, kCmp);
    const __mmask16 m1 = _mm512_cmp_ps_mask(Load(row, bf16, c + 16), t, kCmp);
    const __mmask16 m2 = _mm512_cmp_ps_mask(Load(row, bf16, c + 32), t, kCmp);
    const __mmask16 m3 = _mm512_cmp_ps_mask(Load(row, bf16, c + 48), t, kCmp);
    if (_kortestz_mask16_u8(_kor_mask16(m0, m1), _kor_mask16(m2, m3))) return 0;
    return uint64_t{m0} | uint64_t{m1} << 16 | uint64_t{m2} << 32 | uint64_t{m3} << 48;
  }
};

}  // namespace

extern const HeapOps kHeapAvx512 = MakeHeapOps<Avx512>();

}  // namespace kreg::topk

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
