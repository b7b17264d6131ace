// The tiled kernels' micro-kernels (see tiled.cc for the driver).
//
// One panel call computes C (+)= A . B for one task's rows and one slice of
// the reduction:
//   A  rows x kc, row-major with row stride lda: f32, or bf16 for the pair
//      kernels (packed by the driver: contiguous, padded, kc even for pairs);
//   B  `strips` strips of nr columns, each kc x nr (f32), or for the pair
//      kernels kc/2 x nr pairs (b(2q, j), b(2q + 1, j)) of bf16, zero-padded;
//      or, for the f32 sets, still in place, packed by the panel itself
//      (PanelArgs::b_src);
//   C  float, row stride ldc, rows x strips * nr (a panel's last block is
//      as high as the rows left: no row past them is computed or written);
//      or, on the reduction's last slice, the sums go straight to the op's
//      out (PanelOut), so that its stores overlap the FMAs instead of
//      following them as a copy.
// Every product is taken (no zero skipped), so NaN and infinities propagate
// as in a plain matmul. Each kernel set is compiled for its ISA alone (its
// own file, under a target pragma) from one template, micro_impl.h; the host
// runs a set only on CPUs with its ISA (the `micro` parameter's choice_isa).
#ifndef KREG_PLUGINS_GMM_MICRO_H_
#define KREG_PLUGINS_GMM_MICRO_H_

#include <cstdint>

namespace kreg::gmm {

// Where a panel's finished sums go instead of C: rows ld elements apart
// from p (every strip whole), f32, or bf16 rounded as FloatToBf16 rounds;
// non-temporal where `stream` (p and rows on 64 bytes); *wild is set when
// any sum is NaN or infinite (the driver recomputes those). Only sets with
// MicroSet::stores_out take it.
struct PanelOut {
  void* p = nullptr;
  int64_t ld = 0;
  bool bf16 = false;
  bool stream = false;
  bool* wild = nullptr;
};

struct PanelArgs {
  int mr = 0;  // rows per register block: 4, 6, 8 or 12 (<= MicroSet::max_mr)
  const void* a = nullptr;
  int64_t lda = 0, rows = 0;
  const void* b = nullptr;
  int64_t kc = 0, strips = 0;
  // Optional, f32 sets only: B is not packed yet. Each strip's first
  // register block reads it in place, step q of strip s at
  // b_src + q * b_src_ld + s * nr (rhs itself, every strip whole), and
  // writes it to b in the packed layout, for the strip's later blocks and
  // the panel's next calls: packing rides on that block's FMAs instead of
  // running as a pass of its own.
  const float* b_src = nullptr;
  int64_t b_src_ld = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;  // false: C = A . B; true: C += A . B
  // Optional: a region to prefetch while computing, spread over the panel
  // (the next slice of B, read from memory while this one computes): rows
  // of row_bytes bytes, ld bytes apart.
  const char* prefetch = nullptr;
  int64_t prefetch_rows = 0, prefetch_row_bytes = 0, prefetch_ld = 0;
  PanelOut out;  // C read (accumulate) but the sums written here, where set
};

struct MicroSet {
  const char* name;
  int nr;           // columns per register block (B strip width): 2 vectors
  int max_mr;       // largest mr whose blocks fit the register file
  bool bf16_pairs;  // A and B are bf16 (pair dot products); else f32
  void (*panel)(const PanelArgs& args);
  bool stores_out;  // honours PanelArgs::out
};

// Portable C++ (what the compiler's baseline vectorises): 6 x 16 at most.
extern const MicroSet kMicroGeneric;
// AVX2 + FMA, 8-float vectors: mr x 16 blocks, mr <= 6.
extern const MicroSet kMicroAvx2;
// AVX-512 F/BW/VL, 16-float vectors: mr x 32 blocks, mr <= 12.
extern const MicroSet kMicroAvx512;
// AVX512_BF16 (vdpbf16ps) on bf16 pairs, f32 accumulators: mr x 32.
extern const MicroSet kMicroAvx512Bf16;
// AMX-BF16 tiles on bf16 pairs, 32 x 32 blocks; the rows and the reduction
// the tiles do not cover go to kMicroAvx512Bf16 (mr x 32).
extern const MicroSet kMicroAmxBf16;

}  // namespace kreg::gmm

#endif  // KREG_PLUGINS_GMM_MICRO_H_
