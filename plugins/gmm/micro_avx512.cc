// AVX-512 micro-kernels (16-float vectors), from micro_impl.h: f32 FMAs
// (F/BW/VL) and bf16 pair dot products (AVX512_BF16 vdpbf16ps, f32
// accumulators). vdpbf16ps flushes bf16 subnormal inputs to zero, an error
// far inside the op's bf16 tolerance.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "bf16_round.h"
#include "micro.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")
#endif

namespace kreg::gmm {
namespace {

// The float accumulators both sets share.
struct Avx512Acc {
  using Acc = __m512;
  static constexpr bool kRoundInRegisters = true;
  static Acc Zero() { return _mm512_setzero_ps(); }
  static Acc LoadC(const float* p) { return _mm512_loadu_ps(p); }
  static void StoreC(float* p, Acc r) { _mm512_storeu_ps(p, r); }
  static void StreamC(float* p, Acc r) { _mm512_stream_ps(p, r); }
  static void StoreBf16(uint16_t* p, Acc lo, Acc hi, bool stream) {
    const __m256i a = Bf16Bits512(_mm512_castps_si512(lo)), b = Bf16Bits512(_mm512_castps_si512(hi));
    __m256i* to = reinterpret_cast<__m256i*>(p);
    if (stream) {
      _mm256_stream_si256(to, a);
      _mm256_stream_si256(to + 1, b);
    } else {
      _mm256_storeu_si256(to, a);
      _mm256_storeu_si256(to + 1, b);
    }
  }
  // probe + r * 0: NaN from the first NaN or infinite r on.
  static Acc Probe(Acc probe, Acc r) { return _mm512_add_ps(probe, _mm512_mul_ps(r, _mm512_setzero_ps())); }
  static bool Wild(Acc probe) { return _mm512_cmp_ps_mask(probe, probe, _CMP_UNORD_Q) != 0; }
};

struct Avx512F32 : Avx512Acc {
  using Elem = float;
  static constexpr int kLanes = 16, kPack = 1, kMaxMr = 12;
  using A = __m512;
  using B = __m512;
  static A Bcast(const Elem* row, int64_t q) { return _mm512_set1_ps(row[q]); }
  static B LoadB(const Elem* p) { return _mm512_loadu_ps(p); }
  static Acc Madd(Acc c, A a, B b) { return _mm512_fmadd_ps(a, b, c); }
};

struct Avx512Bf16Pairs : Avx512Acc {
  using Elem = uint16_t;
  static constexpr int kLanes = 16, kPack = 2, kMaxMr = 12;
  using A = __m512i;
  using B = __m512i;
  static A Bcast(const Elem* row, int64_t q) {
    int32_t pair;
    std::memcpy(&pair, row + 2 * q, sizeof pair);
    return _mm512_set1_epi32(pair);
  }
  static B LoadB(const Elem* p) { return _mm512_loadu_si512(p); }
  static Acc Madd(Acc c, A a, B b) { return _mm512_dpbf16_ps(c, (__m512bh)a, (__m512bh)b); }
};

#include "micro_impl.h"

}  // namespace

const MicroSet kMicroAvx512 = {"avx512", 32, Avx512F32::kMaxMr, false, Panel<Avx512F32>, true};
const MicroSet kMicroAvx512Bf16 = {"avx512bf16", 32, Avx512Bf16Pairs::kMaxMr, true, Panel<Avx512Bf16Pairs>, true};

}  // namespace kreg::gmm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
