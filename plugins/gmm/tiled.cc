// gmm/tiled and tgmm/tiled: cache-blocked grouped matmuls on oneTBB.
//
// Work is cut into (group, row tile, column tile) tasks, each a tm x tn
// float accumulator on the stack fed by tk-deep slices of the reduction
// through a micro-kernel ("generic" C++ or "avx2" intrinsics). Row tiles are
// cut from each group's first row, so a group may start anywhere and its last
// tile may be partial; k and n need not divide the tiles. (tgmm: tm tiles
// the k rows of out[g], tn its n columns, tk the group's rows.)
//
// Accuracy. A float accumulation is within the op's tolerance of the
// reference's double one for data of sane magnitude, but not where products
// overflow float, infinities meet overflowed partial sums, or huge terms
// cancel. So a pre-pass flags each lhs row and rhs column holding a value of
// magnitude above 2^32 or a NaN/infinity ("wild"); outputs that read a wild
// row or column are recomputed in double in the reference's order (exactly
// the reference's answer). Non-wild products stay below 2^64: nothing
// overflows, and NaN/infinities never reach the float path. Real data never
// takes the fallback; the conformance suite's random bit patterns do.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"
#include "micro.h"
#include "variants.h"

namespace kreg::gmm {
namespace {

enum { kParamTm = 0, kParamTn, kParamTk, kParamMicro, kNumParams };
enum { kMicroGeneric = 0, kMicroAvx2 = 1 };
constexpr int64_t kMaxTm = 64, kMaxTn = 128;

const int64_t kTmValues[] = {8, 16, 32, kMaxTm};
const int64_t kTnValues[] = {16, 32, 64, kMaxTn};
const int64_t kTkValues[] = {64, 128, 256, 512};
const char* const kMicroChoices[] = {"generic", "avx2"};
const uint32_t kMicroIsa[] = {0, KREG_ISA_AVX2 | KREG_ISA_FMA};

const kreg_param_desc kTmParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tm",
    .doc = "rows per tile (gmm: of a group's rows; tgmm: of out[g]'s k rows)",
    .kind = KREG_PARAM_INT,
    .values = kTmValues,
    .num_values = 4,
    .default_value = 32,
};
const kreg_param_desc kTnParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tn",
    .doc = "columns per tile",
    .kind = KREG_PARAM_INT,
    .values = kTnValues,
    .num_values = 4,
    .default_value = 64,
};
const kreg_param_desc kTkParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tk",
    .doc = "reduction slice per micro-kernel call (gmm: of k; tgmm: of a group's rows)",
    .kind = KREG_PARAM_INT,
    .values = kTkValues,
    .num_values = 4,
    .default_value = 256,
};
const kreg_param_desc kMicroParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "micro",
    .doc = "micro-kernel: portable C++ or AVX2+FMA intrinsics",
    .kind = KREG_PARAM_CHOICE,
    .choices = kMicroChoices,
    .num_choices = 2,
    .default_value = kMicroAvx2,
    .choice_isa = kMicroIsa,
};
const kreg_param_desc* const kParams[] = {&kTmParam, &kTnParam, &kTkParam, &kMicroParam};

struct Tiling {
  int64_t tm = 0, tn = 0, tk = 0;
  bool avx2 = false;
};

kreg_status ReadConfig(const kreg_config* config, Tiling* t, char* msg, size_t cap) {
  if (config == nullptr || config->num_values < kNumParams || config->values == nullptr) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "tiled: expected 4 parameter values (tm, tn, tk, micro)");
  }
  for (int i = 0; i < kNumParams; ++i) {
    if (config->values[i] == nullptr) return Fail(KREG_INVALID_ARGUMENT, msg, cap, "tiled: a parameter value is NULL");
  }
  t->tm = config->values[kParamTm]->value;
  t->tn = config->values[kParamTn]->value;
  t->tk = config->values[kParamTk]->value;
  const int64_t micro = config->values[kParamMicro]->value;
  if (t->tm < 1 || t->tm > kMaxTm || t->tn < 1 || t->tn > kMaxTn || t->tk < 1 ||
      (micro != kMicroGeneric && micro != kMicroAvx2)) {
    std::snprintf(msg, cap, "tiled: illegal config tm=%lld tn=%lld tk=%lld micro=%lld", static_cast<long long>(t->tm),
                  static_cast<long long>(t->tn), static_cast<long long>(t->tk), static_cast<long long>(micro));
    return KREG_INVALID_ARGUMENT;
  }
  t->avx2 = micro == kMicroAvx2;
  return KREG_OK;
}

using MicroFn = void (*)(float*, int64_t, const Mat&, const Mat&, int64_t, int64_t, int64_t);

// Above this magnitude (or NaN/infinite) a value is "wild": see the top.
inline bool Wild(float x) { return !(std::fabs(x) <= 0x1p32f); }

inline bool AnyWild(const void* row, bool bf16, int64_t begin, int64_t end) {
  bool wild = false;
  for (int64_t j = begin; j < end; ++j) wild |= Wild(LoadAt(row, bf16, j));
  return wild;
}

// ORs into flags[j] whether element j of the row is wild, j < n.
inline void OrWild(uint8_t* flags, const void* row, bool bf16, int64_t n) {
  for (int64_t j = 0; j < n; ++j) flags[j] |= static_cast<uint8_t>(Wild(LoadAt(row, bf16, j)));
}

struct Tile {
  int64_t g, r0, r1, c0, c1;  // group, rows [r0, r1), columns [c0, c1) of the output
};

// ---- gmm ---------------------------------------------------------------------------

kreg_status GmmCheck(const kreg_config* config, const kreg_args* args, const kreg_host* host, char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewGmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    Tiling t;
    if (kreg_status s = ReadConfig(config, &t, msg, cap); s != KREG_OK) return s;
    return CheckCpu(args, host, msg, cap);
  });
}

kreg_status GmmRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                   char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewGmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = CheckCpu(args, host, msg, cap); s != KREG_OK) return s;
    Tiling t;
    if (kreg_status s = ReadConfig(config, &t, msg, cap); s != KREG_OK) return s;
    const MicroFn micro = t.avx2 ? MicroAvx2 : MicroGeneric;
    const std::vector<int64_t> starts = GroupStarts(v);
    const int64_t total = starts[v.groups];
    const Mat lhs = GmmLhs(v);
    const OutMat out = GmmOut(v);
    const bool bf16 = v.in_bf16;

    // Wild lhs rows (of the grouped rows) and rhs columns (per group).
    std::vector<uint8_t> lhs_wild(total), rhs_wild(v.groups * v.n, 0);
    kreg_status status =
        ParallelFor(total, host, [&](int64_t r) { lhs_wild[r] = AnyWild(lhs.Row(r), bf16, 0, v.k); }, 16);
    if (status != KREG_OK) return Finish(status, msg, cap);
    status = ParallelFor(v.groups, host, [&](int64_t g) {
      if (starts[g + 1] == starts[g]) return;
      const Mat rhs = GmmRhs(v, g);
      for (int64_t p = 0; p < v.k; ++p) OrWild(&rhs_wild[g * v.n], rhs.Row(p), bf16, v.n);
    });
    if (status != KREG_OK) return Finish(status, msg, cap);

    std::vector<Tile> tiles;
    for (int64_t g = 0; g < v.groups; ++g) {
      for (int64_t r0 = starts[g]; r0 < starts[g + 1]; r0 += t.tm) {
        for (int64_t c0 = 0; c0 < v.n; c0 += t.tn) {
          tiles.push_back({g, r0, std::min(r0 + t.tm, starts[g + 1]), c0, std::min(c0 + t.tn, v.n)});
        }
      }
    }
    status = ParallelFor(static_cast<int64_t>(tiles.size()), host, [&](int64_t task) {
      const Tile& tile = tiles[task];
      const int64_t mt = tile.r1 - tile.r0, nt = tile.c1 - tile.c0;
      alignas(64) float acc[kMaxTm * kMaxTn];
      std::fill(acc, acc + mt * nt, 0.0f);
      const Mat rhs = GmmRhs(v, tile.g);
      for (int64_t k0 = 0; k0 < v.k; k0 += t.tk) {
        const Mat a = {Advance(lhs.Row(tile.r0), bf16, k0), lhs.ld, bf16};
        const Mat b = {Advance(rhs.Row(k0), bf16, tile.c0), rhs.ld, bf16};
        micro(acc, nt, a, b, mt, nt, std::min(t.tk, v.k - k0));
      }
      const uint8_t* col_wild = &rhs_wild[tile.g * v.n];
      for (int64_t i = 0; i < mt; ++i) {
        const int64_t r = tile.r0 + i;
        void* o = out.Row(r);
        const void* e = v.existing != nullptr ? GmmExisting(v).Row(r) : nullptr;
        for (int64_t j = 0; j < nt; ++j) {
          const int64_t c = tile.c0 + j;
          if (lhs_wild[r] | col_wild[c]) {
            double d = GmmDot(lhs, r, rhs, c, v.k);
            if (e != nullptr) d += LoadAt(e, v.out_bf16, c);
            StoreDouble(o, out.bf16, c, d);
          } else {
            float f = acc[i * nt + j];
            if (e != nullptr) f += LoadAt(e, v.out_bf16, c);
            StoreFloat(o, out.bf16, c, f);
          }
        }
      }
    });
    if (status != KREG_OK) return Finish(status, msg, cap);

    // Rows past the groups: existing_out, or zeros.
    status = ParallelFor(v.m - total, host, [&](int64_t i) {
      const int64_t r = total + i;
      void* o = out.Row(r);
      const size_t bytes = static_cast<size_t>(v.n) * (out.bf16 ? 2 : 4);
      if (v.existing != nullptr) {
        std::memcpy(o, GmmExisting(v).Row(r), bytes);
      } else {
        std::memset(o, 0, bytes);
      }
    }, 16);
    return Finish(status, msg, cap);
  });
}

// ---- tgmm --------------------------------------------------------------------------

kreg_status TgmmCheck(const kreg_config* config, const kreg_args* args, const kreg_host* host, char* msg,
                      size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewTgmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    Tiling t;
    if (kreg_status s = ReadConfig(config, &t, msg, cap); s != KREG_OK) return s;
    return CheckCpu(args, host, msg, cap);
  });
}

kreg_status TgmmRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                    char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewTgmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = CheckCpu(args, host, msg, cap); s != KREG_OK) return s;
    Tiling t;
    if (kreg_status s = ReadConfig(config, &t, msg, cap); s != KREG_OK) return s;
    const MicroFn micro = t.avx2 ? MicroAvx2 : MicroGeneric;
    const std::vector<int64_t> starts = GroupStarts(v);
    const Mat lhs = TgmmLhs(v), rhs = TgmmRhs(v);
    const bool bf16 = v.in_bf16;

    // Wild lhs rows (over each group's columns) and rhs columns (over each
    // group's rows), per group.
    std::vector<uint8_t> lhs_wild(v.groups * v.k), rhs_wild(v.groups * v.n, 0);
    kreg_status status = ParallelFor(v.k, host, [&](int64_t i) {
      for (int64_t g = 0; g < v.groups; ++g) {
        lhs_wild[g * v.k + i] = AnyWild(lhs.Row(i), bf16, starts[g], starts[g + 1]);
      }
    });
    if (status != KREG_OK) return Finish(status, msg, cap);
    status = ParallelFor(v.groups, host, [&](int64_t g) {
      for (int64_t r = starts[g]; r < starts[g + 1]; ++r) OrWild(&rhs_wild[g * v.n], rhs.Row(r), bf16, v.n);
    });
    if (status != KREG_OK) return Finish(status, msg, cap);

    std::vector<Tile> tiles;
    for (int64_t g = 0; g < v.groups; ++g) {
      for (int64_t i0 = 0; i0 < v.k; i0 += t.tm) {
        for (int64_t c0 = 0; c0 < v.n; c0 += t.tn) {
          tiles.push_back({g, i0, std::min(i0 + t.tm, v.k), c0, std::min(c0 + t.tn, v.n)});
        }
      }
    }
    status = ParallelFor(static_cast<int64_t>(tiles.size()), host, [&](int64_t task) {
      const Tile& tile = tiles[task];
      const int64_t mt = tile.r1 - tile.r0, nt = tile.c1 - tile.c0;
      const int64_t begin = starts[tile.g], end = starts[tile.g + 1];
      alignas(64) float acc[kMaxTm * kMaxTn];
      std::fill(acc, acc + mt * nt, 0.0f);
      for (int64_t r0 = begin; r0 < end; r0 += t.tk) {
        const Mat a = {Advance(lhs.Row(tile.r0), bf16, r0), lhs.ld, bf16};
        const Mat b = {Advance(rhs.Row(r0), bf16, tile.c0), rhs.ld, bf16};
        micro(acc, nt, a, b, mt, nt, std::min(t.tk, end - r0));
      }
      const OutMat out = TgmmOut(v, tile.g);
      const uint8_t* row_wild = &lhs_wild[tile.g * v.k];
      const uint8_t* col_wild = &rhs_wild[tile.g * v.n];
      for (int64_t i = 0; i < mt; ++i) {
        const int64_t row = tile.r0 + i;
        void* o = out.Row(row);
        for (int64_t j = 0; j < nt; ++j) {
          const int64_t c = tile.c0 + j;
          if (row_wild[row] | col_wild[c]) {
            StoreDouble(o, out.bf16, c, TgmmDot(lhs, row, rhs, c, begin, end));
          } else {
            StoreFloat(o, out.bf16, c, acc[i * nt + j]);
          }
        }
      }
    });
    return Finish(status, msg, cap);
  });
}

}  // namespace

extern const kreg_kernel kGmmTiledKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "tiled",
    .version = 1,
    .doc = "(group, row tile, column tile) tasks on oneTBB, float accumulators, generic or AVX2 micro-kernel",
    .params = kParams,
    .num_params = kNumParams,
    .check = GmmCheck,
    .run = GmmRun,
};

extern const kreg_kernel kTgmmTiledKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "tgmm",
    .variant = "tiled",
    .version = 1,
    .doc = "(group, row tile, column tile) tasks on oneTBB, float accumulators, generic or AVX2 micro-kernel",
    .params = kParams,
    .num_params = kNumParams,
    .check = TgmmCheck,
    .run = TgmmRun,
};

}  // namespace kreg::gmm
