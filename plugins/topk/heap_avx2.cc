// topk/heap's scan with AVX2: 32 elements a step (heap_scan.h).
#include <immintrin.h>

#include "common.h"
#include "heap.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

#include "heap_scan.h"

namespace kreg::topk {
namespace {

struct Avx2 {
  using Vec = __m256;
  static constexpr int64_t kLanes = 8, kStep = 32;
  // Eight elements starting at column c, widened to float32.
  static Vec Load(const void* row, bool bf16, int64_t c) {
    if (!bf16) return _mm256_loadu_ps(static_cast<const float*>(row) + c);
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  template <int kCmp>
  static Vec Splat(float t, bool /*bf16*/) {
    return _mm256_set1_ps(t);
  }
  using NanSet = __m256;
  static NanSet NoNans() { return _mm256_setzero_ps(); }
  static NanSet AddNans(NanSet s, Vec a, Vec b) { return _mm256_or_ps(s, _mm256_cmp_ps(a, b, _CMP_UNORD_Q)); }
  static bool AnyNan(NanSet s) { return !_mm256_testz_ps(s, s); }
  // The best lane (an element's value: max and min return an operand).
  template <bool kLargest>
  static float Reduce(Vec v) {
    __m128 x = kLargest ? _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))
                        : _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 y = _mm_movehl_ps(x, x);
    x = kLargest ? _mm_max_ps(x, y) : _mm_min_ps(x, y);
    const __m128 z = _mm_shuffle_ps(x, x, 1);
    return _mm_cvtss_f32(kLargest ? _mm_max_ss(x, z) : _mm_min_ss(x, z));
  }
  static void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec LoadF32(const float* p) { return _mm256_loadu_ps(p); }
  template <bool kLargest>
  static Vec Better(Vec a, Vec b) {
    return kLargest ? _mm256_max_ps(a, b) : _mm256_min_ps(a, b);
  }
  template <int kCmp>
  static uint64_t Flags(const void* row, bool bf16, int64_t c, Vec t) {
    const Vec m0 = _mm256_cmp_ps(Load(row, bf16, c), t, kCmp), m1 = _mm256_cmp_ps(Load(row, bf16, c + 8), t, kCmp);
    const Vec m2 = _mm256_cmp_ps(Load(row, bf16, c + 16), t, kCmp);
    const Vec m3 = _mm256_cmp_ps(Load(row, bf16, c + 24), t, kCmp);
    const Vec any = _mm256_or_ps(_mm256_or_ps(m0, m1), _mm256_or_ps(m2, m3));
    if (_mm256_testz_ps(any, any)) return 0;
    return static_cast<uint32_t>(_mm256_movemask_ps(m0) | _mm256_movemask_ps(m1) << 8 |
                                 _mm256_movemask_ps(m2) << 16 | _mm256_movemask_ps(m3) << 24);
  }
};

}  // namespace

extern const HeapOps kHeapAvx2 = MakeHeapOps<Avx2>();

}  // namespace kreg::topk

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
