// topk/heap's scan and topk/blockmax's passes, written once for every
// vector width (heap.cc and blockmax.cc have the kernels). Each ISA's file
// includes common.h, then its target pragma, then
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
//   template <bool kLargest> static float Reduce(Vec v)
//       (the best lane by Better: an element's value)
//   NanSet, static NanSet NoNans(), static NanSet AddNans(NanSet s, Vec a,
//       Vec b) (s and the lanes where a or b is NaN), static bool
//       AnyNan(NanSet s)
#ifndef KREG_PLUGINS_TOPK_HEAP_SCAN_H_
#define KREG_PLUGINS_TOPK_HEAP_SCAN_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>

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

// best[j] = the best of the `block` elements from c + j * block in kreg's
// order (NaN above everything, so a block with a NaN has a NaN best when
// largest), for j < blocks: an element's value. Read in one stream,
// prefetched as the scan is. max/min alone would lose a NaN (they return an
// operand, not the NaN), so NaNs are noted beside them, and the rare block
// with one is decided exactly. REQUIRES: block % V::kStep == 0.
template <typename V, bool kLargest>
void BlockMaxWith(const void* row, bool bf16, int64_t c, int64_t block, int64_t blocks, float* best) {
  const int64_t esize = bf16 ? 2 : 4;
  const char* ahead = static_cast<const char*>(row) + 32 * V::kStep * esize;
  constexpr int64_t L = V::kLanes;
  static_assert(4 * L == V::kStep);
  auto better = [](auto a, auto b) { return V::template Better<kLargest>(a, b); };
  for (int64_t j = 0; j < blocks; ++j, c += block) {
    auto a0 = V::Load(row, bf16, c), a1 = V::Load(row, bf16, c + L);
    auto a2 = V::Load(row, bf16, c + 2 * L), a3 = V::Load(row, bf16, c + 3 * L);
    auto nans = V::AddNans(V::AddNans(V::NoNans(), a0, a1), a2, a3);
    for (int64_t i = 4 * L; i < block; i += 4 * L) {
      __builtin_prefetch(ahead + (c + i) * esize);
      __builtin_prefetch(ahead + (c + i) * esize + 64);
      const auto x0 = V::Load(row, bf16, c + i), x1 = V::Load(row, bf16, c + i + L);
      const auto x2 = V::Load(row, bf16, c + i + 2 * L), x3 = V::Load(row, bf16, c + i + 3 * L);
      a0 = better(a0, x0);
      a1 = better(a1, x1);
      a2 = better(a2, x2);
      a3 = better(a3, x3);
      nans = V::AddNans(V::AddNans(nans, x0, x1), x2, x3);
    }
    if (!V::AnyNan(nans)) {
      best[j] = V::template Reduce<kLargest>(better(better(a0, a1), better(a2, a3)));
      continue;
    }
    uint32_t top = 0, at = 0;  // the best Score and its element's bits
    for (int64_t x = c; x < c + block; ++x) {
      const uint32_t bits = FloatBits(row, bf16, x), score = Score(bits, kLargest);
      if (score > top) top = score, at = bits;
    }
    std::memcpy(&best[j], &at, 4);
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

// The largest t with at least k of s[0, n) >= t: the k-th largest, found
// bit by bit with counts that vectorise. REQUIRES: 0 < k <= n.
inline uint32_t KthLargest(const uint32_t* s, int64_t n, int64_t k) {
  uint32_t t = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t want = t | (1u << bit);
    uint32_t count = 0;  // 32 bits, as the scores: a vector of counts beside a vector of scores
    for (int64_t j = 0; j < n; ++j) count += s[j] >= want;
    if (count >= k) t = want;
  }
  return t;
}

// out[0, k) = the best k of keys[0, m), best first, where keys are
// distinct and in increasing column order (so equal scores are already in
// their final order); scores and above have room for m. The k-th best
// score splits them: the fewer than k better ones are placed by counting
// the better ones (no branch; sorted when there are many), the equal ones
// follow in their order. REQUIRES: 0 < k <= m.
inline void BestOfCollected(const uint64_t* keys, int64_t m, int64_t k, uint32_t* scores, uint64_t* above,
                            uint64_t* out) {
  for (int64_t i = 0; i < m; ++i) scores[i] = static_cast<uint32_t>(keys[i] >> 32);
  const uint32_t kth = KthLargest(scores, m, k);
  int64_t n = 0;
  for (int64_t i = 0; i < m; ++i) {
    above[n] = keys[i];
    n += scores[i] > kth;
  }
  if (n > 256) {
    std::sort(above, above + n, std::greater<>());
    std::copy(above, above + n, out);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      int64_t place = 0;
      for (int64_t j = 0; j < n; ++j) place += above[j] > above[i];
      out[place] = above[i];
    }
  }
  for (int64_t i = 0, at = n; i < m && at < k; ++i) {
    out[at] = keys[i];
    at += scores[i] == kth;
  }
}

// score[j] = the Score of best[j] for j < blocks; returns the k-th best of
// them as a float (one of best's). REQUIRES: 0 < k <= blocks.
inline float BlockThreshold(const float* best, int64_t blocks, int64_t k, bool largest, uint32_t* score) {
  const uint32_t flip = largest ? 0u : 0xffffffffu;
  for (int64_t j = 0; j < blocks; ++j) {
    uint32_t bits;
    std::memcpy(&bits, &best[j], 4);
    score[j] = OrderedKey(bits) ^ flip;
  }
  const uint32_t t = KthLargest(score, blocks, k);
  int64_t j = 0;
  while (score[j] != t) ++j;
  return best[j];
}

// Writes the packed keys of the elements at least as good as t (or NaN) of
// each block j < blocks with score[j] >= Score(t) (blocks of `block`
// elements from c), in column order; returns how many. REQUIRES: block %
// V::kStep == 0.
template <typename V, bool kLargest>
int64_t CollectBlocksWith(const void* row, bool bf16, int64_t c, int64_t block, int64_t blocks, const uint32_t* score,
                          float t, uint64_t* keys) {
  constexpr int kCmp = kLargest ? _CMP_NLT_UQ : _CMP_NGT_UQ;
  const auto thr = V::template Splat<kCmp>(t, bf16);
  uint32_t t_bits;
  std::memcpy(&t_bits, &t, 4);
  const uint32_t t_score = Score(t_bits, kLargest);
  int64_t n = 0;
  for (int64_t j0 = 0; j0 < blocks; j0 += 64) {
    uint64_t reach = 0;  // the blocks from j0 whose best reaches t
    const int64_t j1 = std::min<int64_t>(j0 + 64, blocks);
    for (int64_t j = j0; j < j1; ++j) reach |= static_cast<uint64_t>(score[j] >= t_score) << (j - j0);
    for (; reach != 0; reach &= reach - 1) {
      const int64_t from = c + (j0 + __builtin_ctzll(reach)) * block;
      for (int64_t x = from; x < from + block; x += V::kStep) {
        for (uint64_t mask = V::template Flags<kCmp>(row, bf16, x, thr); mask != 0; mask &= mask - 1) {
          const int64_t col = x + __builtin_ctzll(mask);
          keys[n++] = Pack(Score(FloatBits(row, bf16, col), kLargest), col);
        }
      }
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
      .block_max = [](const void* row, bool bf16, bool largest, int64_t c, int64_t block, int64_t blocks,
                      float* best) {
        (largest ? BlockMaxWith<V, true> : BlockMaxWith<V, false>)(row, bf16, c, block, blocks, best);
      },
      .block_threshold = BlockThreshold,
      .collect_blocks = [](const void* row, bool bf16, bool largest, int64_t c, int64_t block, int64_t blocks,
                           const uint32_t* score, float t, uint64_t* keys) {
        return (largest ? CollectBlocksWith<V, true> : CollectBlocksWith<V, false>)(row, bf16, c, block, blocks,
                                                                                    score, t, keys);
      },
      .best_of_collected = BestOfCollected,
  };
}

}  // namespace
}  // namespace kreg::topk

#endif  // KREG_PLUGINS_TOPK_HEAP_SCAN_H_
