// topk/heap: the classic CPU baseline (FAISS-style). A min-heap holds the k
// best seen so far; its root is the threshold. Each element is first tested
// against the threshold's float value, 16 at a time with AVX2, and only the
// rare ones that may beat it take the exact path: compare full (score,
// column) keys and replace the root.
#include <immintrin.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "common.h"
#include "variants.h"

namespace kreg::topk {
namespace {

float ValueAt(const void* row, bool bf16, int64_t c) {
  uint32_t u = FloatBits(row, bf16, c);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Replaces the root of the min-heap h[0, n) with x and restores the heap.
void ReplaceRoot(uint64_t* h, int64_t n, uint64_t x) {
  int64_t i = 0;
  for (;;) {
    int64_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && h[child + 1] < h[child]) ++child;
    if (h[child] >= x) break;
    h[i] = h[child];
    i = child;
  }
  h[i] = x;
}

// Eight elements starting at column c, widened to float32.
__attribute__((target("avx2"))) inline __m256 Load8(const void* row, bool bf16, int64_t c) {
  if (!bf16) return _mm256_loadu_ps(static_cast<const float*>(row) + c);
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// A superset of the elements that may beat threshold t: x > t (largest) or
// x < t (smallest), and anything unordered, as NaN needs the exact path.
template <bool kLargest>
__attribute__((target("avx2"))) inline __m256 MayBeat(__m256 x, __m256 t) {
  return _mm256_cmp_ps(x, t, kLargest ? _CMP_NLE_UQ : _CMP_NGE_UQ);
}

template <bool kLargest>
__attribute__((target("avx2"))) void Scan(const void* row, bool bf16, int64_t c, int64_t end,
                                           std::vector<uint64_t>& heap) {
  const int64_t k = static_cast<int64_t>(heap.size());
  uint64_t* h = heap.data();
  auto offer = [&](int64_t col) {
    uint64_t key = Pack(Score(FloatBits(row, bf16, col), kLargest), col);
    if (key > h[0]) ReplaceRoot(h, k, key);
  };
  for (;;) {
    // Nothing beats a NaN threshold when largest: later NaNs lose on index.
    float thr = ValueAt(row, bf16, PackedCol(h[0]));
    if (kLargest && thr != thr) return;
    const __m256 t = _mm256_set1_ps(thr);
    const uint64_t root = h[0];
    for (; c + 32 <= end; c += 32) {
      const __m256 x0 = Load8(row, bf16, c), x1 = Load8(row, bf16, c + 8);
      const __m256 x2 = Load8(row, bf16, c + 16), x3 = Load8(row, bf16, c + 24);
      const __m256 any = _mm256_or_ps(_mm256_or_ps(MayBeat<kLargest>(x0, t), MayBeat<kLargest>(x1, t)),
                                      _mm256_or_ps(MayBeat<kLargest>(x2, t), MayBeat<kLargest>(x3, t)));
      if (_mm256_testz_ps(any, any)) continue;
      uint32_t mask = 0;
      for (__m256 x : {x3, x2, x1, x0}) mask = mask << 8 | _mm256_movemask_ps(MayBeat<kLargest>(x, t));
      for (; mask != 0; mask &= mask - 1) offer(c + __builtin_ctz(mask));
      if (h[0] != root) {
        c += 32;
        break;
      }
    }
    if (c + 32 > end) break;
  }
  for (; c < end; ++c) offer(c);
}

kreg_status Run(const TopKArgs& a, [[maybe_unused]] const kreg_config* config, const kreg_host* host, char* msg,
                size_t cap) {
  const bool bf16 = IsBf16(a);
  const kreg_status status = SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end,
                                               std::vector<uint64_t>& heap) {
    const void* row = InputRow(a, r);
    const int64_t count = std::min<int64_t>(a.k, end - start);
    heap.resize(count);
    for (int64_t j = 0; j < count; ++j) heap[j] = Pack(Score(FloatBits(row, bf16, start + j), a.largest), start + j);
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    if (count > 0) {
      if (a.largest) {
        Scan<true>(row, bf16, start + count, end, heap);
      } else {
        Scan<false>(row, bf16, start + count, end, heap);
      }
    }
    std::sort_heap(heap.begin(), heap.end(), std::greater<>());
    return 0;
  });
  return Finish(status, msg, cap);
}

}  // namespace

extern const kreg_kernel kHeapKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "heap",
    .version = 1,
    .doc = "min-heap of the k best with an AVX2 threshold prefilter (FAISS-style)",
    .required_isa = KREG_ISA_AVX2,
    .check = CheckTopK,
    .run = GuardedRun<Run>,
};

}  // namespace kreg::topk
