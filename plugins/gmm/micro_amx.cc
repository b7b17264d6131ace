// AMX-BF16 micro-kernel: the pair layout of micro.h is AMX's own (a B strip
// of 32 columns is two B tiles side by side, 128 bytes per pair row), so the
// driver packs nothing differently. Blocks of 32 rows x 32 columns keep four
// C tiles (tmm0-3) and take, per 32 elements of the reduction, two A tiles
// (tmm4-5) and two B tiles (tmm6-7); a last block of 16 rows uses half of
// them. What tiles do not cover, AVX512_BF16 computes (the set needs both):
// rows past the last multiple of 16 (in register blocks of the config's mr)
// and the reduction past the last multiple of 32. TDPBF16PS, like
// vdpbf16ps, treats bf16 subnormal inputs as zero. The host grants the
// process AMX tile state before it sets the AMX ISA bits.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "micro.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")
#endif

namespace kreg::gmm {
namespace {

constexpr int kTileRows = 16;  // rows of every tile
constexpr int kTileK = 32;     // bf16 elements of the reduction per A tile row (64 bytes)
constexpr int kNr = 32;        // two C tiles of 16 floats side by side

struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

void Configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kTileRows;
  }
  _tile_loadconfig(&cfg);
}

// C (+)= A . B over one strip for 32 rows (two A tiles) from row pointer a,
// over k32 elements of the reduction.
void Block32(const uint16_t* a, int64_t lda_bytes, const uint16_t* strip, int64_t k32, float* c, int64_t ldc_bytes,
             bool accumulate) {
  char* c0 = reinterpret_cast<char*>(c);
  char* c1 = c0 + kTileRows * ldc_bytes;
  if (accumulate) {
    _tile_loadd(0, c0, ldc_bytes);
    _tile_loadd(1, c0 + 64, ldc_bytes);
    _tile_loadd(2, c1, ldc_bytes);
    _tile_loadd(3, c1 + 64, ldc_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const char* a0 = reinterpret_cast<const char*>(a);
  const char* a1 = a0 + kTileRows * lda_bytes;
  for (int64_t k0 = 0; k0 < k32; k0 += kTileK) {
    const uint16_t* b = strip + k0 * kNr;  // pair row k0 / 2
    _tile_loadd(4, a0 + k0 * 2, lda_bytes);
    _tile_loadd(5, a1 + k0 * 2, lda_bytes);
    _tile_loadd(6, b, kNr * 4);
    _tile_loadd(7, b + 32, kNr * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c0, ldc_bytes);
  _tile_stored(1, c0 + 64, ldc_bytes);
  _tile_stored(2, c1, ldc_bytes);
  _tile_stored(3, c1 + 64, ldc_bytes);
}

// The same for 16 rows (one A tile).
void Block16(const uint16_t* a, int64_t lda_bytes, const uint16_t* strip, int64_t k32, float* c, int64_t ldc_bytes,
             bool accumulate) {
  char* c0 = reinterpret_cast<char*>(c);
  if (accumulate) {
    _tile_loadd(0, c0, ldc_bytes);
    _tile_loadd(1, c0 + 64, ldc_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
  }
  const char* a0 = reinterpret_cast<const char*>(a);
  for (int64_t k0 = 0; k0 < k32; k0 += kTileK) {
    const uint16_t* b = strip + k0 * kNr;
    _tile_loadd(4, a0 + k0 * 2, lda_bytes);
    _tile_loadd(6, b, kNr * 4);
    _tile_loadd(7, b + 32, kNr * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
  }
  _tile_stored(0, c0, ldc_bytes);
  _tile_stored(1, c0 + 64, ldc_bytes);
}

void PanelAmx(const PanelArgs& p) {
  if (p.rows <= 0 || p.strips <= 0) return;
  const int64_t k32 = p.kc / kTileK * kTileK;
  const int64_t tiled_rows = k32 == 0 ? 0 : p.rows / kTileRows * kTileRows;
  const uint16_t* a = static_cast<const uint16_t*>(p.a);
  const uint16_t* b = static_cast<const uint16_t*>(p.b);
  if (tiled_rows > 0) {
    Configure();
    for (int64_t s = 0; s < p.strips; ++s) {
      const uint16_t* strip = b + s * p.kc * kNr;
      int64_t i0 = 0;
      for (; i0 + 2 * kTileRows <= tiled_rows; i0 += 2 * kTileRows) {
        Block32(a + i0 * p.lda, p.lda * 2, strip, k32, p.c + i0 * p.ldc + s * kNr, p.ldc * 4, p.accumulate);
      }
      if (i0 < tiled_rows) {
        Block16(a + i0 * p.lda, p.lda * 2, strip, k32, p.c + i0 * p.ldc + s * kNr, p.ldc * 4, p.accumulate);
      }
    }
    _tile_release();
    // The reduction past k32, strip by strip (a strip's pair rows are kc
    // apart from the next strip's), added to the tiles' sums.
    if (k32 < p.kc) {
      PanelArgs rest = p;
      rest.rows = tiled_rows;
      rest.a = a + k32;
      rest.kc = p.kc - k32;
      rest.strips = 1;
      rest.mr = 8;  // divides tiled_rows: no block reaches past it
      rest.accumulate = true;
      rest.prefetch = nullptr;
      for (int64_t s = 0; s < p.strips; ++s) {
        rest.b = b + s * p.kc * kNr + k32 * kNr;
        rest.c = p.c + s * kNr;
        kMicroAvx512Bf16.panel(rest);
      }
    }
  }
  // Rows the tiles did not take: the register kernel, whole reduction.
  if (tiled_rows < p.rows) {
    PanelArgs rest = p;
    rest.a = a + tiled_rows * p.lda;
    rest.rows = p.rows - tiled_rows;
    rest.c = p.c + tiled_rows * p.ldc;
    kMicroAvx512Bf16.panel(rest);
  }
}

}  // namespace

const MicroSet kMicroAmxBf16 = {"amx", kNr, 12, true, PanelAmx, false};

}  // namespace kreg::gmm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
