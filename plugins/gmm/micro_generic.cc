// The portable micro-kernels: 8-float "vectors" as plain arrays, which the
// compiler vectorises for whatever its baseline is.
#include <cstdint>

#include "kreg/plugin_sdk.h"
#include "micro.h"

namespace kreg::gmm {
namespace {

struct GenericF32 {
  using Elem = float;
  static constexpr int kLanes = 8, kPack = 1, kMaxMr = 6;
  static constexpr bool kRoundInRegisters = false;
  struct Acc {
    float v[kLanes];
  };
  using A = float;
  using B = Acc;
  static Acc Zero() { return Acc{}; }
  static Acc LoadC(const float* p) {
    Acc r;
    for (int l = 0; l < kLanes; ++l) r.v[l] = p[l];
    return r;
  }
  static void StoreC(float* p, const Acc& r) {
    for (int l = 0; l < kLanes; ++l) p[l] = r.v[l];
  }
  static void StreamC(float* p, const Acc& r) { StoreC(p, r); }
  static void StoreBf16(uint16_t* p, const Acc& lo, const Acc& hi, bool) {
    for (int l = 0; l < kLanes; ++l) {
      p[l] = sdk::FloatToBf16(lo.v[l]);
      p[kLanes + l] = sdk::FloatToBf16(hi.v[l]);
    }
  }
  // probe + r * 0: NaN from the first NaN or infinite r on.
  static Acc Probe(Acc probe, const Acc& r) {
    for (int l = 0; l < kLanes; ++l) probe.v[l] += r.v[l] * 0.0f;
    return probe;
  }
  static bool Wild(const Acc& probe) {
    bool wild = false;
    for (int l = 0; l < kLanes; ++l) wild |= probe.v[l] != probe.v[l];
    return wild;
  }
  static A Bcast(const Elem* row, int64_t q) { return row[q]; }
  static B LoadB(const Elem* p) { return LoadC(p); }
  static Acc Madd(Acc c, A a, const B& b) {
    for (int l = 0; l < kLanes; ++l) c.v[l] += a * b.v[l];
    return c;
  }
};

#include "micro_impl.h"

}  // namespace

const MicroSet kMicroGeneric = {"generic", 16, GenericF32::kMaxMr, false, Panel<GenericF32>, true};

}  // namespace kreg::gmm
