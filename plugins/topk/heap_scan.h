// topk/heap's scan, written once for every vector width (heap.cc has the
// kernel). Each ISA's file includes common.h, then its target pragma, then
// this (whose functions are in an anonymous namespace, so each file's copy
// is compiled for its own ISA and stays its own), and instantiates
// its functions with a `V` of vectors of V::kLanes floats that provides
//   static Vec Load(const void* row, bool bf16, int64_t c)   (widened)
//   template <int kCmp> static Thr Splat(float t, bool bf16)
//       (t as Flags<kCmp> compares with it)
//   template <bool kLargest> static Vec Better(Vec a, Vec b)
//       (max or min: one of the two, an element's value, NaN or not)
//   template <int kCmp> static uint64_t Flags(const void* row, bool bf16,
//       int64_t c, const Thr& t)
//       (bit i set where element c + i compares kCmp to t, for V::kStep
//       elements, or a superset; 0 fast when none does)
//   static void Store(float* p, Vec v), static Vec LoadF32(const float* p)
#ifndef KREG_PLUGINS_TOPK_HEAP_SCAN_H_
#define KREG_PLUGINS_TOPK_HEAP_SCAN_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common.h"
#include "heap.h"

namespace kreg::topk {
namespace {

// Replaces the root of the min-heap h[0, n) with x and restores the heap.
// The smaller child is chosen without a branch (it is a coin toss, and a
// mispredicted branch per level cost more than the rest of the sift).
inline void ReplaceRoot(uint64_t* h, int64_t n, uint64_t x) {
  int64_t i = 0;
  for (int64_t child = 1; child + 1 < n; child = 2 * i + 1) {
    child += h[child + 1] < h[child];
    if (h[child] >= x) break;
    h[i] = h[child];
    i = child;
  }
  if (const int64_t child = 2 * i + 1; child + 1 == n && h[child] < x) {  // a last, lone child
    h[i] = h[child];
    i = child;
  }
  h[i] = x;
}

inline float ValueAt(const void* row, bool bf16, int64_t c) {
  uint32_t u = FloatBits(row, bf16, c);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Offers columns [c, end) of row to the min-heap h of k packed keys (the
// best so far, root the worst of them): the vector test V skips what
// cannot beat the root, the rest takes the exact path.
template <typename V, bool kLargest>
void ScanWith(const void* row, bool bf16, int64_t c, int64_t end, uint64_t* h, int64_t k) {
  auto offer = [&](int64_t col) {
    uint64_t key = Pack(Score(FloatBits(row, bf16, col), kLargest), col);
    if (key > h[0]) ReplaceRoot(h, k, key);
  };
  for (;;) {
    // Nothing beats a NaN threshold when largest: later NaNs lose on index.
    const float thr = ValueAt(row, bf16, PackedCol(h[0]));
    if (kLargest && thr != thr) return;
    const uint64_t root = h[0];
    // May beat t: x > t (largest) or x < t (smallest), or unordered, as NaN
    // needs the exact path (a superset is fine; a missed element is not).
    constexpr int kCmp = kLargest ? _CMP_NLE_UQ : _CMP_NGE_UQ;
    const auto t = V::template Splat<kCmp>(thr, bf16);
    // The hardware prefetcher alone leaves this loop waiting on memory (a
    // row takes ~1.5x a plain read of it): fetch 32 steps ahead.
    const char* ahead = static_cast<const char*>(row) + 32 * V::kStep * (bf16 ? 2 : 4);
    const int64_t esize = bf16 ? 2 : 4;
    for (; c + V::kStep <= end; c += V::kStep) {
      __builtin_prefetch(ahead + c * esize);
      __builtin_prefetch(ahead + c * esize + 64);
      uint64_t mask = V::template Flags<kCmp>(row, bf16, c, t);
      if (mask == 0) continue;
      for (; mask != 0; mask &= mask - 1) offer(c + __builtin_ctzll(mask));
      if (h[0] != root) {
        c += V::kStep;
        break;
      }
    }
    if (c + V::kStep > end) break;
  }
  for (; c < end; ++c) offer(c);
}

// best[j] = the best (largest or smallest float) of the `stripes` elements
// c + s * blocks + j: blocks column-strided over a prefix of the row, read
// in order, one vector compare per V::kLanes elements. Each is an
// element's value.
// REQUIRES: blocks % V::kLanes == 0, stripes >= 1.
template <typename V, bool kLargest>
void BlockBestsWith(const void* row, bool bf16, int64_t c, int64_t blocks, int64_t stripes, float* best) {
  for (int64_t j = 0; j < blocks; j += V::kLanes) V::Store(best + j, V::Load(row, bf16, c + j));
  for (int64_t s = 1; s < stripes; ++s) {
    for (int64_t j = 0; j < blocks; j += V::kLanes) {
      V::Store(best + j, V::template Better<kLargest>(V::Load(row, bf16, c + s * blocks + j), V::LoadF32(best + j)));
    }
  }
}

// Writes the packed keys of the elements of [c, end) that are at least as
// good as t (x >= t largest, x <= t smallest, or unordered) to keys;
// returns how many. REQUIRES: (end - c) % V::kStep == 0, keys has room
// for end - c.
template <typename V, bool kLargest>
int64_t CollectWith(const void* row, bool bf16, int64_t c, int64_t end, float thr, uint64_t* keys) {
  constexpr int kCmp = kLargest ? _CMP_NLT_UQ : _CMP_NGT_UQ;
  const auto t = V::template Splat<kCmp>(thr, bf16);
  int64_t n = 0;
  for (; c < end; c += V::kStep) {
    for (uint64_t mask = V::template Flags<kCmp>(row, bf16, c, t); mask != 0;
         mask &= mask - 1) {
      const int64_t col = c + __builtin_ctzll(mask);
      keys[n++] = Pack(Score(FloatBits(row, bf16, col), kLargest), col);
    }
  }
  return n;
}

// The ISA's HeapOps: the functions above for both directions.
template <typename V>
constexpr HeapOps MakeHeapOps() {
  return {
      .scan = [](const void* row, bool bf16, bool largest, int64_t c, int64_t end, uint64_t* heap, int64_t k) {
        (largest ? ScanWith<V, true> : ScanWith<V, false>)(row, bf16, c, end, heap, k);
      },
      .block_bests = [](const void* row, bool bf16, bool largest, int64_t c, int64_t blocks, int64_t stripes,
                        float* best) {
        (largest ? BlockBestsWith<V, true> : BlockBestsWith<V, false>)(row, bf16, c, blocks, stripes, best);
      },
      .collect = [](const void* row, bool bf16, bool largest, int64_t c, int64_t end, float t, uint64_t* keys) {
        return (largest ? CollectWith<V, true> : CollectWith<V, false>)(row, bf16, c, end, t, keys);
      },
  };
}

}  // namespace
}  // namespace kreg::topk

#endif  // KREG_PLUGINS_TOPK_HEAP_SCAN_H_
