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

// bf16 elements compared as 16-bit integer keys, 32 to a vector: key(x) =
// x ^ (x's sign spread over the other 15 bits), a signed order of the
// floats in which -0 sits just below +0 and NaNs lie outside
// [key(-inf), key(+inf)]. An element passes a test where its key lies
// outside the keys of the values that fail it, [lo, hi]:
//   x > t   fails on [key(-inf), key(t)]      x < t   on [key(t), key(+inf)]
//   x >= t  fails on [key(-inf), key(t) - 1]  x <= t  on [key(t) + 1, key(+inf)]
// with -0 and +0 both failing where they should (t = ±0 widens or narrows
// the range to cover both); where nothing fails (a NaN t, x >= -inf), every
// element passes.
inline int16_t Bf16Key(uint16_t x) { return static_cast<int16_t>(x ^ (x & 0x8000 ? 0x7fff : 0)); }

struct Avx512 {
  using Vec = __m512;
  static constexpr int64_t kLanes = 16, kStep = 64;
  struct Thr {
    Vec f;           // f32: the threshold
    __m512i lo;      // bf16: the failing keys' range [lo, lo + span]
    __m512i span;
    bool all;        // bf16: every element passes
  };
  // Sixteen elements starting at column c, widened to float32.
  static Vec Load(const void* row, bool bf16, int64_t c) {
    if (!bf16) return _mm512_loadu_ps(static_cast<const float*>(row) + c);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  template <int kCmp>
  static Thr Splat(float t, bool bf16) {
    Thr out{_mm512_set1_ps(t), _mm512_setzero_si512(), _mm512_setzero_si512(), false};
    if (!bf16) return out;
    uint32_t bits;
    std::memcpy(&bits, &t, 4);
    const uint16_t u = static_cast<uint16_t>(bits >> 16);  // t is an element's value: exactly a bf16
    if ((u & 0x7fff) > 0x7f80) {
      out.all = true;
      return out;
    }
    const bool zero = (u & 0x7fff) == 0;
    const int kt = Bf16Key(u), ninf = Bf16Key(0xff80), pinf = Bf16Key(0x7f80);
    int lo, hi;
    if (kCmp == _CMP_NLE_UQ) {  // x > t
      lo = ninf, hi = zero ? Bf16Key(0) : kt;
    } else if (kCmp == _CMP_NGE_UQ) {  // x < t
      lo = zero ? Bf16Key(0x8000) : kt, hi = pinf;
    } else if (kCmp == _CMP_NLT_UQ) {  // x >= t
      lo = ninf, hi = (zero ? Bf16Key(0x8000) : kt) - 1;
    } else {  // x <= t
      lo = (zero ? Bf16Key(0) : kt) + 1, hi = pinf;
    }
    if (hi < lo) {  // x >= -inf, x <= +inf: nothing fails
      out.all = true;
      return out;
    }
    out.lo = _mm512_set1_epi16(static_cast<int16_t>(lo));
    out.span = _mm512_set1_epi16(static_cast<int16_t>(hi - lo));  // as unsigned 16 bits
    return out;
  }
  // 32 bf16 elements at column c: bit i set where element c + i passes.
  static uint32_t Bf16Passes(const void* row, int64_t c, const Thr& t) {
    const __m512i x = _mm512_loadu_si512(static_cast<const uint16_t*>(row) + c);
    // x ^ ((x >> 15) & 0x7fff): ternary logic A ^ (B & C) is 0x78.
    const __m512i key = _mm512_ternarylogic_epi32(x, _mm512_srai_epi16(x, 15), _mm512_set1_epi16(0x7fff), 0x78);
    return _mm512_cmpgt_epu16_mask(_mm512_sub_epi16(key, t.lo), t.span);
  }
  using NanSet = __mmask16;
  static NanSet NoNans() { return 0; }
  static NanSet AddNans(NanSet s, Vec a, Vec b) { return s | _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
  static bool AnyNan(NanSet s) { return s != 0; }
  template <bool kLargest>
  static float Reduce(Vec v) {
    return kLargest ? _mm512_reduce_max_ps(v) : _mm512_reduce_min_ps(v);
  }
  static void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  template <bool kLargest>
  static Vec Better(Vec a, Vec b) {
    return kLargest ? _mm512_max_ps(a, b) : _mm512_min_ps(a, b);
  }
  template <int kCmp>
  static uint64_t Flags(const void* row, bool bf16, int64_t c, const Thr& t) {
    if (bf16) {
      if (t.all) return ~uint64_t{0};
      const __mmask32 lo = Bf16Passes(row, c, t), hi = Bf16Passes(row, c + 32, t);
      if (_kortestz_mask32_u8(lo, hi)) return 0;
      return uint64_t{lo} | uint64_t{hi} << 32;
    }
    const __mmask16 m0 = _mm512_cmp_ps_mask(_mm512_loadu_ps(static_cast<const float*>(row) + c), t.f, kCmp);
    const __mmask16 m1 = _mm512_cmp_ps_mask(_mm512_loadu_ps(static_cast<const float*>(row) + c + 16), t.f, kCmp);
    const __mmask16 m2 = _mm512_cmp_ps_mask(_mm512_loadu_ps(static_cast<const float*>(row) + c + 32), t.f, kCmp);
    const __mmask16 m3 = _mm512_cmp_ps_mask(_mm512_loadu_ps(static_cast<const float*>(row) + c + 48), t.f, kCmp);
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
