// AVX2 + FMA micro-kernels (8-float vectors), from micro_impl.h.
#include <immintrin.h>

#include <cstdint>

#include "bf16_round.h"
#include "micro.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace kreg::gmm {
namespace {

struct Avx2F32 {
  using Elem = float;
  static constexpr int kLanes = 8, kPack = 1, kMaxMr = 6;
  static constexpr bool kRoundInRegisters = false;
  using Acc = __m256;
  using A = __m256;
  using B = __m256;
  static Acc Zero() { return _mm256_setzero_ps(); }
  static Acc LoadC(const float* p) { return _mm256_loadu_ps(p); }
  static void StoreC(float* p, Acc r) { _mm256_storeu_ps(p, r); }
  static void StreamC(float* p, Acc r) { _mm256_stream_ps(p, r); }
  static void StoreBf16(uint16_t* p, Acc lo, Acc hi, bool stream) {
    const __m256i bits = Bf16Bits256x2(_mm256_castps_si256(lo), _mm256_castps_si256(hi));
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), bits);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
    }
  }
  // probe + r * 0: NaN from the first NaN or infinite r on.
  static Acc Probe(Acc probe, Acc r) { return _mm256_add_ps(probe, _mm256_mul_ps(r, _mm256_setzero_ps())); }
  static bool Wild(Acc probe) { return _mm256_movemask_ps(_mm256_cmp_ps(probe, probe, _CMP_UNORD_Q)) != 0; }
  static A Bcast(const Elem* row, int64_t q) { return _mm256_broadcast_ss(row + q); }
  static B LoadB(const Elem* p) { return _mm256_loadu_ps(p); }
  static Acc Madd(Acc c, A a, B b) { return _mm256_fmadd_ps(a, b, c); }
};

#include "micro_impl.h"

}  // namespace

const MicroSet kMicroAvx2 = {"avx2", 16, Avx2F32::kMaxMr, false, Panel<Avx2F32>, true};

}  // namespace kreg::gmm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
