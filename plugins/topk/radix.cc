// topk/radix: radix select on the order-preserving 32-bit score of each
// element. A first pass histograms the top `first_bits` bits and finds the
// bucket holding the k-th best; everything in better buckets is selected,
// the threshold bucket's elements become candidates, and refinement rounds of
// `round_bits` bits narrow the candidates until exactly k are chosen (equal
// scores are taken in column order, which is kreg's tie rule).
//
// Unlike the seed kernel, which trusts a fixed 4096-slot candidate buffer and
// drops what overflows, a threshold bucket larger than `capacity` is refined
// by further histogram passes over the whole row until it fits, so the
// result stays exact for any input.
//
// A row of 8 * kSample elements or more skips the whole-row histogram: the
// scores of kSample elements in evenly spaced runs set a threshold that, by
// their order statistics, a little more than k of the row pass (three
// standard deviations over k); one vector pass keeps the elements at or
// above it with their columns (AVX2: compressed by a permutation table, no
// branch per element; AVX-512 with VBMI2 keeps a row of up to 2^16
// elements' offsets as 16-bit lanes, thirty-two a step), and those few are
// sorted by their distance from the lowest of them: by its top 12 bits into
// buckets, then inside each bucket (SortTopK); bf16's by one counting pass
// over the top 16 bits of their scores, which order them alone
// (SortBf16Survivors). The next row of the same length tries the
// threshold this one's survivors say about k + a margin of a like row
// reach before it takes a sample of its own. Where fewer than k pass (a
// sample that misjudged the row, as an adversarial one may) or far more
// (ties at the threshold), the row is selected as without a sample, so the
// result is exact either way.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "common.h"
#include "variants.h"

namespace kreg::topk {
namespace {

const int64_t kFirstBits[] = {8, 11, 12};
const int64_t kRoundBits[] = {4, 8};
const int64_t kCapacity[] = {256, 1024, 4096, 16384};

const kreg_param_desc kFirstBitsParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "first_bits",
    .doc = "bits of the score histogrammed by the first pass",
    .kind = KREG_PARAM_INT,
    .values = kFirstBits,
    .num_values = 3,
    .default_value = 11,
};
const kreg_param_desc kRoundBitsParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "round_bits",
    .doc = "bits per refinement round",
    .kind = KREG_PARAM_INT,
    .values = kRoundBits,
    .num_values = 2,
    .default_value = 8,
};
const kreg_param_desc kCapacityParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "capacity",
    .doc = "candidate buffer slots (more are refined over the row first)",
    .kind = KREG_PARAM_INT,
    .values = kCapacity,
    .num_values = 4,
    .default_value = 4096,
};
const kreg_param_desc* const kParams[] = {&kFirstBitsParam, &kRoundBitsParam, &kCapacityParam};

// The widest vectors the sort's helpers use: a scan over 4096 counts or
// a pass of the in-bucket sort costs as much as a pass over the keys, so
// each has a form per width (ScanCounts, MostPerBucket, SortWithinBuckets).
enum class Vectors { kNone, kAvx2, kAvx512 };

struct RadixConfig {
  int first_bits;
  int round_bits;
  int64_t capacity;
  bool avx2;
  bool avx512;
  // AVX-512BW/VL and the CPU's own VBMI2, which kreg's ISA bits do not
  // name (KREG_ISA_MASK turns this off with avx512bw): a row of up to
  // 2^16 elements collects its survivors' offsets 32 at a time (Collect).
  bool compress16;
  Vectors vectors() const { return avx512 ? Vectors::kAvx512 : avx2 ? Vectors::kAvx2 : Vectors::kNone; }
};

struct Scratch {
  std::vector<uint32_t> scores;  // the row's, or the sampled pass's survivors' float bits
  std::vector<uint32_t> ranked;  // the survivors' scores
  std::vector<int32_t> cols;     // the survivors' columns
  std::vector<uint16_t> offsets;  // their offsets in the row, where Collect takes them 32 at a time
  std::vector<uint32_t> hist;
  std::vector<uint32_t> counts;  // Histogram's interleaved counts
  std::vector<int32_t> cand;     // offsets into scores, in column order
  std::vector<uint64_t> tmp;     // SortBest's
  // A threshold the row before left for the next row of its length and
  // start (0: none): see Select.
  uint32_t carried = 0;
  int64_t carried_len = 0, carried_start = 0;
};

// Histogram of digit(scores[i]) over the offsets `idx` (or all of scores
// when idx is null) into hist, four interleaved counts so that runs of one
// bucket do not serialise on a single counter.
template <typename Digit>
void Histogram(const uint32_t* scores, const int32_t* idx, int64_t n, Digit digit, std::vector<uint32_t>& hist,
               std::vector<uint32_t>& counts) {
  const size_t buckets = hist.size();
  counts.assign(4 * buckets, 0);
  uint32_t* h = counts.data();
  int64_t i = 0;
  auto at = [&](int64_t j) { return scores[idx ? idx[j] : j]; };
  for (; i + 4 <= n; i += 4) {
    ++h[digit(at(i))];
    ++h[buckets + digit(at(i + 1))];
    ++h[2 * buckets + digit(at(i + 2))];
    ++h[3 * buckets + digit(at(i + 3))];
  }
  for (; i < n; ++i) ++h[digit(at(i))];
  for (size_t b = 0; b < buckets; ++b) hist[b] = h[b] + h[buckets + b] + h[2 * buckets + b] + h[3 * buckets + b];
}

// Calls visit(i) for each i in [0, n - n % 16) with scores[i] >= lo, in
// order, testing 16 scores per step; returns where it stopped.
// REQUIRES: lo > 0.
template <typename Visit>
__attribute__((target("avx2"))) int64_t ForEachAtLeast(const uint32_t* scores, int64_t n, uint32_t lo,
                                                       Visit&& visit) {
  // Unsigned x >= lo  <=>  signed (x ^ bias) > (lo ^ bias) - 1.
  const __m256i bias = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i t = _mm256_set1_epi32(static_cast<int>((lo ^ 0x80000000u) - 1));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scores + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scores + i + 8));
    const int ma = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_xor_si256(a, bias), t)));
    const int mb = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_xor_si256(b, bias), t)));
    for (unsigned m = static_cast<unsigned>(ma | mb << 8); m != 0; m &= m - 1) visit(i + __builtin_ctz(m));
  }
  return i;
}

#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // as at Collect512
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// ScanCounts sixteen at a time (REQUIRES: n % 16 == 0): a scalar scan
// over 4096 counts is as long as a pass over the keys, one dependent add
// per count.
__attribute__((target("avx512f"))) void ScanCounts512(uint32_t* c, size_t n) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i last = _mm512_set1_epi32(15);
  __m512i carry = zero;  // the running total in every lane
  for (size_t b = 0; b < n; b += 16) {
    __m512i x = _mm512_loadu_si512(c + b);
    x = _mm512_add_epi32(x, _mm512_alignr_epi32(x, zero, 15));  // each lane plus the one below it
    x = _mm512_add_epi32(x, _mm512_alignr_epi32(x, zero, 14));
    x = _mm512_add_epi32(x, _mm512_alignr_epi32(x, zero, 12));
    x = _mm512_add_epi32(x, _mm512_alignr_epi32(x, zero, 8));
    // The block's total from its own sums, so that the carry from block to
    // block waits on one add, not on a permute of the last result.
    const __m512i total = _mm512_permutexvar_epi32(last, x);
    _mm512_storeu_si512(c + b, _mm512_alignr_epi32(_mm512_add_epi32(x, carry), carry, 15));
    carry = _mm512_add_epi32(carry, total);
  }
}

// The largest of starts[b + 1] - starts[b] for b in [0, n): the most keys
// in one of n buckets.
__attribute__((target("avx512f"))) uint32_t MostPerBucket512(const uint32_t* starts, size_t n) {
  __m512i most = _mm512_setzero_si512();
  size_t b = 0;
  for (; b + 16 <= n; b += 16) {
    const __m512i here = _mm512_loadu_si512(starts + b);
    const __m512i next = _mm512_loadu_si512(starts + b + 1);
    most = _mm512_max_epu32(most, _mm512_sub_epi32(next, here));
  }
  uint32_t out = _mm512_reduce_max_epu32(most);
  for (; b < n; ++b) out = std::max(out, starts[b + 1] - starts[b]);
  return out;
}

// `phases` phases of an odd-even transposition sort of a[0, n), larger
// first: phase p orders the pairs (i, i + 1) with i % 2 == p % 2. A list
// whose unordered runs hold at most `phases` keys each comes out sorted.
__attribute__((target("avx512f"))) void TranspositionSort512(uint64_t* a, size_t n, uint32_t phases) {
  for (uint32_t p = 0; p < phases; ++p) {
    size_t i = p % 2;
    for (; i + 8 <= n; i += 8) {
      const __m512i x = _mm512_loadu_si512(a + i);
      const __m512i pair = _mm512_permutex_epi64(x, 0xb1);  // lanes 1 0 3 2 in each half
      // Even lanes take the larger of their pair, odd lanes the smaller.
      _mm512_storeu_si512(a + i, _mm512_mask_blend_epi64(0xaa, _mm512_max_epu64(x, pair),
                                                         _mm512_min_epu64(x, pair)));
    }
    for (; i + 1 < n; i += 2) {
      if (a[i] < a[i + 1]) std::swap(a[i], a[i + 1]);
    }
  }
}

// ScanCounts512 eight at a time with AVX2.
__attribute__((target("avx2"))) void ScanCounts256(uint32_t* c, size_t n) {
  const __m256i last = _mm256_set1_epi32(7);
  __m256i carry = _mm256_setzero_si256();  // the running total in every lane
  for (size_t b = 0; b < n; b += 8) {
    const __m256i here = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + b));
    __m256i x = _mm256_add_epi32(here, _mm256_slli_si256(here, 4));  // within each 128-bit half
    x = _mm256_add_epi32(x, _mm256_slli_si256(x, 8));
    // The low half's total into every lane of the high half.
    x = _mm256_add_epi32(x, _mm256_permute2x128_si256(_mm256_shuffle_epi32(x, 0xff), x, 0x08));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + b), _mm256_add_epi32(_mm256_sub_epi32(x, here), carry));
    carry = _mm256_add_epi32(carry, _mm256_permutevar8x32_epi32(x, last));
  }
}

// MostPerBucket512 eight at a time with AVX2.
__attribute__((target("avx2"))) uint32_t MostPerBucket256(const uint32_t* starts, size_t n) {
  __m256i most = _mm256_setzero_si256();
  size_t b = 0;
  for (; b + 8 <= n; b += 8) {
    const __m256i here = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(starts + b));
    const __m256i next = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(starts + b + 1));
    most = _mm256_max_epu32(most, _mm256_sub_epi32(next, here));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), most);
  uint32_t out = *std::max_element(lanes, lanes + 8);
  for (; b < n; ++b) out = std::max(out, starts[b + 1] - starts[b]);
  return out;
}

// TranspositionSort512 four keys a step with AVX2, which has no unsigned
// 64-bit compare: the keys are compared as signed after flipping their top
// bits.
__attribute__((target("avx2"))) void TranspositionSort256(uint64_t* a, size_t n, uint32_t phases) {
  const __m256i top = _mm256_set1_epi64x(static_cast<int64_t>(uint64_t{1} << 63));
  for (uint32_t p = 0; p < phases; ++p) {
    size_t i = p % 2;
    for (; i + 4 <= n; i += 4) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
      const __m256i pair = _mm256_permute4x64_epi64(x, 0xb1);  // lanes 1 0 3 2
      const __m256i above = _mm256_cmpgt_epi64(_mm256_xor_si256(x, top), _mm256_xor_si256(pair, top));
      const __m256i larger = _mm256_blendv_epi8(pair, x, above);
      const __m256i smaller = _mm256_blendv_epi8(x, pair, above);
      // Even lanes take the larger of their pair, odd lanes the smaller.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + i), _mm256_blend_epi32(larger, smaller, 0xcc));
    }
    for (; i + 1 < n; i += 2) {
      if (a[i] < a[i + 1]) std::swap(a[i], a[i + 1]);
    }
  }
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Exclusive prefix sums of c[0, n) in place.
void ScanCounts(uint32_t* c, size_t n, Vectors vectors) {
  if (vectors == Vectors::kAvx512 && n % 16 == 0) return ScanCounts512(c, n);
  if (vectors == Vectors::kAvx2 && n % 8 == 0) return ScanCounts256(c, n);
  uint32_t pos = 0;
  for (size_t b = 0; b < n; ++b) {
    const uint32_t here = c[b];
    c[b] = pos;
    pos += here;
  }
}

// The most keys in one of n buckets that start at starts[0, n] (the last
// the end of bucket n - 1).
uint32_t MostPerBucket(const uint32_t* starts, size_t n, Vectors vectors) {
  if (vectors == Vectors::kAvx512) return MostPerBucket512(starts, n);
  if (vectors == Vectors::kAvx2) return MostPerBucket256(starts, n);
  uint32_t most = 0;
  for (size_t b = 0; b < n; ++b) most = std::max(most, starts[b + 1] - starts[b]);
  return most;
}

// Sorts a[0, n), larger first, where no key is more than `most` places
// from where it belongs (a list of buckets in order, the largest holding
// `most` keys): with vectors by `most` phases of an odd-even transposition
// sort, no branch per key; else by an insertion sort.
void SortWithinBuckets(uint64_t* a, size_t n, uint32_t most, Vectors vectors) {
  if (vectors == Vectors::kAvx512) return TranspositionSort512(a, n, most);
  if (vectors == Vectors::kAvx2) return TranspositionSort256(a, n, most);
  for (size_t i = 1; i < n; ++i) {
    const uint64_t x = a[i];
    size_t j = i;
    for (; j > 0 && a[j - 1] < x; --j) a[j] = a[j - 1];
    a[j] = x;
  }
}

// Where SortBest takes its keys from: keys already packed, or scores and
// columns side by side (packed as the first pass moves them).
struct PackedKeys {
  const uint64_t* keys;
  uint32_t Score(size_t i) const { return static_cast<uint32_t>(keys[i] >> 32); }
  uint64_t Key(size_t i) const { return keys[i]; }
};
struct ScoredColumns {
  const uint32_t* scores;
  const int32_t* cols;
  uint32_t Score(size_t i) const { return scores[i]; }
  uint64_t Key(size_t i) const { return Pack(scores[i], cols[i]); }
};

// One stable LSD pass per digit of kPasses digits of `width` bits, taken
// from (score - lo) >> low, the top digit last; digits count down so that
// better keys come first. Passes alternate between tmp and out, the first
// into tmp, so `from` may be out's own keys.
template <int kPasses, typename From>
void SortDigits(const From& from, size_t n, std::vector<uint64_t>& out, std::vector<uint64_t>& tmp,
                std::vector<uint32_t>& counts, uint32_t lo, int low, int width, Vectors vectors) {
  const uint32_t mask = (1u << width) - 1;
  const size_t buckets = size_t{1} << width;
  auto digit = [&](uint32_t score, int p) { return mask - (((score - lo) >> (low + p * width)) & mask); };
  counts.assign(kPasses * buckets, 0);
  uint32_t* c = counts.data();
  for (size_t i = 0; i < n; ++i) {
    for (int p = 0; p < kPasses; ++p) ++c[p * buckets + digit(from.Score(i), p)];
  }
  for (int p = 0; p < kPasses; ++p) ScanCounts(c + p * buckets, buckets, vectors);
  tmp.resize(n);
  out.resize(n);
  uint64_t* to = tmp.data();
  for (size_t i = 0; i < n; ++i) to[c[digit(from.Score(i), 0)]++] = from.Key(i);
  for (int p = 1; p < kPasses; ++p) {
    const uint64_t* keys = to;
    to = p % 2 ? out.data() : tmp.data();
    uint32_t* cp = c + p * buckets;
    for (size_t i = 0; i < n; ++i) to[cp[digit(static_cast<uint32_t>(keys[i] >> 32), p)]++] = keys[i];
  }
  if (kPasses % 2 == 1) out.swap(tmp);
}

// The range of a row's scores, which SortBest and SortTopK count from.
struct ScoreRange {
  uint32_t lo = 0, hi = 0;
  uint32_t differ = 0;  // the bits where some score differs from the first
};

// The scores of n f32 elements' bits (as ComputeScores), and their range.
__attribute__((target_clones("avx2", "default"))) ScoreRange ScoresAndRange(const uint32_t* bits, size_t n,
                                                                           uint32_t flip, uint32_t* scores) {
  ScoreRange r;
  r.lo = r.hi = n > 0 ? OrderedKey(bits[0]) ^ flip : 0;
  const uint32_t first = r.lo;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t score = OrderedKey(bits[i]) ^ flip;
    scores[i] = score;
    r.lo = std::min(r.lo, score);
    r.hi = std::max(r.hi, score);
    r.differ |= score ^ first;
  }
  return r;
}

// ScoreRange of the scores `from` holds.
template <typename From>
ScoreRange ScoresOf(const From& from, size_t n) {
  ScoreRange r;
  r.lo = r.hi = n > 0 ? from.Score(0) : 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t score = from.Score(i);
    r.lo = std::min(r.lo, score);
    r.hi = std::max(r.hi, score);
    r.differ |= score ^ from.Score(0);
  }
  return r;
}

// Sorts n keys into out best first: score down, then column up (the packed
// keys' own order). `from` may be out's own keys. A stable LSD radix sort
// of each score's distance from the lowest, over only the bits where
// scores differ, in as few passes of at most 12 bits as that range needs:
// two for the k best of a row of normal f32 data (whose scores span about
// 2^24), one for bf16's (whose low 16 bits never differ). Counting from the
// lowest score rather than over every bit that differs matters where
// scores cross a power of two: 1.9 and 2.1 differ in every exponent bit
// but are close. `counts` and `tmp` are its room.
// REQUIRES: keys of equal score come in column order, as Select collects
// them. `range`, where the caller has it, is the scores' (ScoresOf).
template <typename From>
void SortBest(const From& from, size_t n, std::vector<uint64_t>& out, std::vector<uint64_t>& tmp,
              std::vector<uint32_t>& counts, Vectors vectors, const ScoreRange* range = nullptr) {
  const ScoreRange r = range != nullptr ? *range : ScoresOf(from, n);
  const uint32_t lo = r.lo, hi = r.hi, differ = r.differ;
  if (n < 64 || differ == 0) {  // few keys, or one score: column order already
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = from.Key(i);
    if (differ != 0) std::sort(out.begin(), out.end(), std::greater<>());
    return;
  }
  // Every score shares the bits below `low`, so the distances do too.
  const int low = __builtin_ctz(differ);
  const int bits = 32 - __builtin_clz((hi - lo) >> low);
  const int passes = (bits + 11) / 12;
  const int width = (bits + passes - 1) / passes;
  if (passes == 1) {
    SortDigits<1>(from, n, out, tmp, counts, lo, low, width, vectors);
  } else if (passes == 2) {
    SortDigits<2>(from, n, out, tmp, counts, lo, low, width, vectors);
  } else {
    SortDigits<3>(from, n, out, tmp, counts, lo, low, width, vectors);
  }
}

// SortBest of packed keys, in place.
void SortBest(std::vector<uint64_t>& keys, std::vector<uint64_t>& tmp, std::vector<uint32_t>& counts, Vectors vectors) {
  SortBest(PackedKeys{keys.data()}, keys.size(), keys, tmp, counts, vectors);
}

// How many more than k pass the threshold a row leaves for the next: four
// standard deviations of the difference between two rows' counts above
// one value, where each count is binomial (len, k / len), and a few more.
int64_t CarryMargin(int64_t len, int64_t k) {
  const double p = static_cast<double>(k) / static_cast<double>(len);
  return static_cast<int64_t>(std::ceil(4 * std::sqrt(2 * static_cast<double>(k) * (1 - p)))) + 16;
}

// How many of the lowest ranks a threshold past the survivors is
// extrapolated from.
constexpr int64_t kSpacingRanks = 256;

// The score `missing` ranks below `lowest`, spaced as the w ranks above it
// are (the score w ranks up being `above`); 0 (none) where that would reach
// below every score.
uint32_t Extrapolated(uint32_t lowest, uint32_t above, int64_t w, int64_t missing) {
  const double spacing = static_cast<double>(above - lowest) / static_cast<double>(w);
  const double below = std::ceil(spacing * static_cast<double>(missing));
  return below < static_cast<double>(lowest) ? lowest - static_cast<uint32_t>(below) : 0;
}

// The score that about `rank` of a row like this one reach, from its
// survivors `sorted` (best first): the rank-th's, or, where fewer survived,
// extrapolated from the lowest kSpacingRanks.
uint32_t CarriedThreshold(const std::vector<uint64_t>& sorted, int64_t rank) {
  const int64_t n = static_cast<int64_t>(sorted.size());
  auto score = [&](int64_t i) { return static_cast<uint32_t>(sorted[i] >> 32); };
  if (rank <= n) return score(rank - 1);
  const int64_t w = std::min<int64_t>(n - 1, kSpacingRanks);
  return w > 0 ? Extrapolated(score(n - 1), score(n - 1 - w), w, rank - n) : 0;
}

// The k best of n keys into out[0, k), ordered as SortBest orders them, and
// the score that about `rank` of them reach (for the next row's threshold;
// 0 for none). Where the scores span more than one pass's digit, one MSD
// pass on the top 12 bits of each score's distance from the lowest places
// the keys by bucket, and the buckets down to the k-th best's are then put
// in order inside (SortWithinBuckets: with vectors by as many phases of
// an odd-even transposition sort as the largest holds keys). ~2,300
// survivors of a row of normal f32 data fill ~3,000 buckets, the largest
// with about eight, so this costs less than SortBest's second scatter and
// its histogram (bench/RESULTS.md, "Large-k top-k, fifth round"). Where a
// kept bucket holds more than kMostPerBucket (scores bunched below one top
// digit, as adversarial rows may be), SortBest sorts them all instead.
// `range` is the scores' (ScoresOf). `from` may be out's own keys.
// REQUIRES: 0 < k <= n; keys of equal score come in column order.
template <typename From>
uint32_t SortTopK(const From& from, const ScoreRange& range, size_t n, size_t k, int64_t rank,
                  std::vector<uint64_t>& out, Scratch& s, Vectors vectors) {
  const uint32_t lo = range.lo, hi = range.hi, differ = range.differ;
  auto sort_all = [&] {
    SortBest(from, n, out, s.tmp, s.counts, vectors, &range);
    const uint32_t t = CarriedThreshold(out, rank);
    out.resize(k);
    return t;
  };
  const int low = differ != 0 ? __builtin_ctz(differ) : 0;
  const int bits = differ != 0 ? 32 - __builtin_clz((hi - lo) >> low) : 0;
  constexpr int kTop = 12;
  constexpr uint32_t kMask = (1u << kTop) - 1;
  constexpr uint32_t kMostPerBucket = 32;
  if (n < 64 || bits <= kTop) return sort_all();  // one LSD pass or none
  const int shift = low + bits - kTop;
  auto bucket = [&](uint32_t score) { return kMask - ((score - lo) >> shift); };  // best first
  std::vector<uint32_t>& c = s.counts;
  c.assign(kMask + 2, 0);
  for (size_t i = 0; i < n; ++i) ++c[bucket(from.Score(i))];
  ScanCounts(c.data(), kMask + 1, vectors);  // c[b]: where bucket b starts
  c[kMask + 1] = static_cast<uint32_t>(n);
  // The bucket holding the r-th best: the last that starts before it.
  auto bucket_of = [&](int64_t r) {
    return static_cast<uint32_t>(std::upper_bound(c.begin(), c.end() - 1, static_cast<uint32_t>(r - 1)) -
                                 c.begin() - 1);
  };
  const uint32_t last = bucket_of(static_cast<int64_t>(k));
  const uint32_t most = MostPerBucket(c.data(), last + 1, vectors);
  if (most > kMostPerBucket) return sort_all();
  // The lowest score of the rank-th's bucket, or past n an extrapolation
  // as CarriedThreshold's, from the lowest score of the bucket w ranks
  // above the last.
  auto floor_of = [&](uint32_t b) { return lo + ((kMask - b) << shift); };
  const int64_t count = static_cast<int64_t>(n);
  const int64_t w = std::min<int64_t>(count - 1, kSpacingRanks);
  uint32_t t = 0;
  if (rank <= count) {
    t = floor_of(bucket_of(rank));
  } else if (w > 0) {
    t = Extrapolated(lo, floor_of(bucket_of(count - w)), w, rank - count);
  }
  const uint32_t kept = c[last + 1];
  s.tmp.resize(n);
  uint64_t* to = s.tmp.data();
  // All n are placed (a test for the dropped ones would mispredict more
  // than their stores cost); those past `kept` go unread.
  for (size_t i = 0; i < n; ++i) to[c[bucket(from.Score(i))]++] = from.Key(i);
  SortWithinBuckets(to, kept, most, vectors);  // a key moves only within its bucket
  out.swap(s.tmp);
  out.resize(k);
  return t;
}

constexpr uint32_t kBf16Span = 4095;

#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // as at Collect512
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The packed keys (Pack(score, col)) of survivors of a bf16 row of len
// elements whose element `start` is at `first`, sixteen at a time, each
// read from the row by a gather: the first n - n % 16 of them, which it
// returns; *most is set to the largest score / 2^16 - t16 among them.
__attribute__((target("avx512f"))) int64_t Bf16Keys512(const uint16_t* first, int64_t start, int64_t len,
                                                       const int32_t* cols, int64_t n, uint32_t flip, uint32_t t16,
                                                       uint64_t* keys, uint32_t* most) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i vstart = _mm512_set1_epi32(static_cast<int32_t>(start));
  const __m512i last = _mm512_set1_epi32(static_cast<int32_t>(len - 1));
  const __m512i last_value = _mm512_set1_epi32(first[len - 1]);
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i nan_key = _mm512_set1_epi32(static_cast<int32_t>(kNanKey));
  const __m512i vflip = _mm512_set1_epi32(static_cast<int32_t>(flip));
  const __m512i vt16 = _mm512_set1_epi32(static_cast<int32_t>(t16));
  __m512i far = zero;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512i col = _mm512_loadu_si512(cols + j);
    const __m512i at = _mm512_sub_epi32(col, vstart);
    // A 4-byte read at the row's last element would pass its end: that
    // lane takes the element from last_value instead.
    const __mmask16 inside = _mm512_cmpneq_epi32_mask(at, last);
    __m512i u = _mm512_mask_i32gather_epi32(last_value, inside, at, first, 2);
    u = _mm512_slli_epi32(u, 16);
    // OrderedKey, sixteen at a time.
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, magnitude), inf);
    u = _mm512_maskz_mov_epi32(_mm512_cmpneq_epi32_mask(u, sign), u);  // -0 as +0
    __m512i score = _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), sign));
    score = _mm512_xor_si512(_mm512_mask_mov_epi32(score, nan, nan_key), vflip);
    far = _mm512_max_epu32(far, _mm512_sub_epi32(_mm512_srli_epi32(score, 16), vt16));
    const __m512i low = _mm512_ternarylogic_epi32(col, col, col, 0x55);  // ~col, Pack's 0xffffffff - col
    for (int half = 0; half < 2; ++half) {
      const __m256i s8 = half ? _mm512_extracti64x4_epi64(score, 1) : _mm512_castsi512_si256(score);
      const __m256i c8 = half ? _mm512_extracti64x4_epi64(low, 1) : _mm512_castsi512_si256(low);
      _mm512_storeu_si512(keys + j + 8 * half, _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepu32_epi64(s8), 32),
                                                               _mm512_cvtepu32_epi64(c8)));
    }
  }
  *most = _mm512_reduce_max_epu32(far);
  return j;
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The packed keys of n survivors from their float bits, and the largest
// score / 2^16 - t16 among them: auto-vectorised, once per ISA, picked at
// load time.
__attribute__((target_clones("avx2", "default"))) uint32_t KeysOfBits(const uint32_t* bits, const int32_t* cols,
                                                                      int64_t n, uint32_t flip, uint32_t t16,
                                                                      uint64_t* keys) {
  uint32_t most = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t score = OrderedKey(bits[j]) ^ flip;
    keys[j] = Pack(score, cols[j]);
    most = std::max(most, (score >> 16) - t16);
  }
  return most;
}

// A stable counting sort of n keys into `to` by bucket(key) < width, a
// multiple of 16, lowest bucket first. The keys are four quarters, each
// counted and placed as its own stream, so that runs of one bucket do not
// wait on one counter: quarter q is [q * m, (q + 1) * m), the last also the
// n % 4 past 4 * m. `c` is its room.
template <typename Bucket>
void PlaceByBucket(const uint64_t* keys, int64_t n, Bucket bucket, size_t width, std::vector<uint32_t>& c,
                   uint64_t* to, Vectors vectors) {
  const int64_t m = n / 4;
  c.assign(5 * width, 0);
  uint32_t* const h[4] = {c.data(), c.data() + width, c.data() + 2 * width, c.data() + 3 * width};
  uint32_t* const total = c.data() + 4 * width;
  for (int64_t i = 0; i < m; ++i) {
    for (int q = 0; q < 4; ++q) ++h[q][bucket(keys[q * m + i])];
  }
  for (int64_t j = 4 * m; j < n; ++j) ++h[3][bucket(keys[j])];
  for (size_t b = 0; b < width; ++b) total[b] = h[0][b] + h[1][b] + h[2][b] + h[3][b];
  ScanCounts(total, width, vectors);
  // Bucket b's keys: quarter 0's, then 1's, and so on, each in order.
  for (size_t b = 0; b < width; ++b) {
    uint32_t at = total[b];
    for (uint32_t* hq : h) {
      const uint32_t here = hq[b];
      hq[b] = at;
      at += here;
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int q = 0; q < 4; ++q) {
      const uint64_t key = keys[q * m + i];
      to[h[q][bucket(key)]++] = key;
    }
  }
  for (int64_t j = 4 * m; j < n; ++j) to[h[3][bucket(keys[j])]++] = keys[j];
}

// The k best of the n survivors of a bf16 row of len elements whose element
// `start` is at `first` (their columns `cols`, ascending; each scores at
// least t; their float bits `bits`, or null where AVX-512 reads them from
// the row) into out, ordered as SortBest orders them, and the score that
// about `rank` of them reach (as SortTopK). A bf16 score's top 16 bits
// order it alone, so one stable counting pass over score / 2^16 - t / 2^16
// sorts the survivors exactly: their keys are made (with AVX-512 straight
// from the row), counted and placed, three walks over the survivors where
// the general path's read-back, scores, histogram and scatter take five
// (bench/RESULTS.md, "Large-k top-k, seventh round"). Where they span
// kBf16Span or more such values, SortTopK sorts the keys.
// REQUIRES: 0 < k <= n.
uint32_t SortBf16Survivors(const uint16_t* first, int64_t start, int64_t len, const uint32_t* bits,
                           const int32_t* cols, int64_t n, int64_t k, uint32_t flip, uint32_t t, int64_t rank,
                           Scratch& s, std::vector<uint64_t>& out, Vectors vectors) {
  const uint32_t t16 = t >> 16;
  out.resize(n);
  uint64_t* keys = out.data();
  uint32_t most = 0;  // the largest distance from t16
  if (bits == nullptr) {
    int64_t j = Bf16Keys512(first, start, len, cols, n, flip, t16, keys, &most);
    for (; j < n; ++j) {
      const uint32_t score = OrderedKey(static_cast<uint32_t>(first[cols[j] - start]) << 16) ^ flip;
      keys[j] = Pack(score, cols[j]);
      most = std::max(most, (score >> 16) - t16);
    }
  } else {
    most = KeysOfBits(bits, cols, n, flip, t16, keys);
  }
  if (most >= kBf16Span) {  // scores too far apart for one counting pass
    const PackedKeys from{keys};
    return SortTopK(from, ScoresOf(from, static_cast<size_t>(n)), static_cast<size_t>(n), static_cast<size_t>(k),
                    rank, out, s, vectors);
  }
  // Bucket top - d holds distance d, so that better keys come first.
  const uint32_t top = most | 15;
  s.tmp.resize(n);
  PlaceByBucket(
      keys, n, [&](uint64_t key) { return top - (static_cast<uint32_t>(key >> 48) - t16); }, top + 1, s.counts,
      s.tmp.data(), vectors);
  out.swap(s.tmp);
  const uint32_t carried = CarriedThreshold(out, rank);
  out.resize(k);
  return carried;
}

// Scores of a row: auto-vectorised, once per ISA, picked at load time.
__attribute__((target_clones("avx2", "default"))) void ComputeScores(const void* in, bool bf16, int64_t len,
                                                                      uint32_t flip, uint32_t* scores) {
  if (bf16) {
    const uint16_t* p = static_cast<const uint16_t*>(in);
    for (int64_t i = 0; i < len; ++i) scores[i] = OrderedKey(static_cast<uint32_t>(p[i]) << 16) ^ flip;
  } else {
    const uint32_t* p = static_cast<const uint32_t*>(in);
    for (int64_t i = 0; i < len; ++i) scores[i] = OrderedKey(p[i]) ^ flip;
  }
}

// Walks hist from the best bucket down; returns the bucket holding the
// need-th best and sets *better to the count in better buckets.
uint32_t ThresholdBucket(const std::vector<uint32_t>& hist, int64_t need, int64_t* better) {
  int64_t seen = 0;
  for (int64_t b = static_cast<int64_t>(hist.size()) - 1; b > 0; --b) {
    if (seen + hist[b] >= need) {
      *better = seen;
      return static_cast<uint32_t>(b);
    }
    seen += hist[b];
  }
  *better = seen;
  return 0;
}

// The radix select of the k best of `len` scores, whose columns are
// cols[i] (or base + i without cols), into `out`, sorted best first.
// REQUIRES: k < len; cols ascending.
void SelectScores(const uint32_t* scores, const int32_t* cols, int64_t base, int64_t len, int64_t k,
                  const RadixConfig& cfg, Scratch& s, std::vector<uint64_t>& out) {
  auto col = [&](int64_t i) { return cols != nullptr ? cols[i] : base + i; };
  const int first_bits = cfg.first_bits, round_bits = cfg.round_bits;
  const int64_t capacity = cfg.capacity;

  // First pass: the bucket of the top first_bits bits that holds the k-th.
  int bits = first_bits;
  s.hist.assign(size_t{1} << bits, 0);
  Histogram(scores, nullptr, len, [&](uint32_t x) { return x >> (32 - first_bits); }, s.hist, s.counts);
  int64_t better = 0;
  uint32_t prefix = ThresholdBucket(s.hist, k, &better);
  int64_t need = k - better;
  int64_t in_bucket = s.hist[prefix];

  // Overflow: refine the threshold bucket over all the scores until it fits.
  while (in_bucket > capacity && bits < 32) {
    const int rb = std::min(round_bits, 32 - bits);
    const uint32_t mask = (1u << rb) - 1;
    s.hist.assign(size_t{1} << rb, 0);
    for (int64_t i = 0; i < len; ++i) {
      if ((scores[i] >> (32 - bits)) == prefix) ++s.hist[(scores[i] >> (32 - bits - rb)) & mask];
    }
    int64_t sub_better = 0;
    const uint32_t sub = ThresholdBucket(s.hist, need, &sub_better);
    need -= sub_better;
    better += sub_better;
    prefix = (prefix << rb) | sub;
    bits += rb;
    in_bucket = s.hist[sub];
  }

  // Collect: better prefixes are selected, the threshold prefix becomes
  // candidates. With all 32 bits fixed the candidates are equal, so the
  // first `need` in column order are the answer.
  const int64_t cand_limit = bits < 32 ? in_bucket : need;
  out.resize(k + 1);
  s.cand.resize(cand_limit + 1);
  uint64_t* o = out.data();
  int32_t* c = s.cand.data();
  int64_t n_out = 0, n_cand = 0;
  const int shift = 32 - bits;
  auto visit = [&](int64_t i) {  // branch-free: better and candidate are equally likely
    const uint32_t p = scores[i] >> shift;
    o[n_out] = Pack(scores[i], col(i));
    n_out += p > prefix;
    c[n_cand] = static_cast<int32_t>(i);
    n_cand += (p == prefix) & (n_cand < cand_limit);
  };
  // Only elements at or above the threshold prefix matter: a tenth or less
  // of the row. Find them 16 at a time where the CPU allows.
  const uint32_t lo = prefix << shift;
  int64_t i = 0;
  if (cfg.avx2 && lo > 0) i = ForEachAtLeast(scores, len, lo, visit);
  for (; i < len; ++i) {
    if (scores[i] >= lo) visit(i);
  }

  // Refinement rounds on the candidates.
  while (need < n_cand && bits < 32) {
    const int rb = std::min(round_bits, 32 - bits);
    const uint32_t mask = (1u << rb) - 1;
    const int sh = 32 - bits - rb;
    s.hist.assign(size_t{1} << rb, 0);
    Histogram(scores, c, n_cand, [&](uint32_t x) { return (x >> sh) & mask; }, s.hist, s.counts);
    int64_t sub_better = 0;
    const uint32_t sub = ThresholdBucket(s.hist, need, &sub_better);
    int64_t kept = 0;
    for (int64_t j = 0; j < n_cand; ++j) {
      const int32_t at = c[j];
      const uint32_t d = (scores[at] >> sh) & mask;
      o[n_out] = Pack(scores[at], col(at));
      n_out += d > sub;
      c[kept] = at;
      kept += d == sub;
    }
    n_cand = kept;
    need -= sub_better;
    bits += rb;
  }
  for (int64_t j = 0; j < need; ++j) o[n_out++] = Pack(scores[c[j]], col(c[j]));
  out.resize(n_out);
  SortBest(out, s.tmp, s.counts, cfg.vectors());
}

// A score that, by the order statistics of kSample elements of the row, a
// little more than k of its `len` scores reach: the sample's best within
// three standard deviations past k's expected rank there. The sample is
// runs of kSampleRun consecutive elements, evenly spaced (a run is a cache
// line of f32: single strided elements cost a line each, for one score).
// 0 where k is too large a share of the row for a sample to help.
// REQUIRES: len >= 8 * kSample.
constexpr int64_t kSample = 1024;
constexpr int64_t kSampleRun = 16;

constexpr int64_t kSampleRuns = kSample / kSampleRun;

// Where sample run r of a row of len elements starts.
int64_t SampleRunStart(int64_t len, int64_t r) {
  const int64_t step = len / kSampleRuns;
  return r * step + (step - kSampleRun) / 2;
}

// Asks for the lines of a row's sample all at once, not one miss after
// another.
void PrefetchSample(const void* first, bool bf16, int64_t len) {
  const int64_t size = bf16 ? 2 : 4;
  for (int64_t r = 0; r < kSampleRuns; ++r) {
    const char* at = static_cast<const char*>(first) + SampleRunStart(len, r) * size;
    __builtin_prefetch(at);
    __builtin_prefetch(at + (kSampleRun - 1) * size);
  }
}

uint32_t SampledThreshold(const void* first, bool bf16, uint32_t flip, int64_t len, int64_t k, Scratch& s) {
  const double expected = static_cast<double>(k) * static_cast<double>(kSample) / static_cast<double>(len);
  const int64_t rank = static_cast<int64_t>(std::ceil(expected + 3 * std::sqrt(expected) + 2));
  if (rank >= kSample / 2) return 0;
  s.scores.resize(kSample);
  PrefetchSample(first, bf16, len);
  for (int64_t r = 0; r < kSampleRuns; ++r) {
    const int64_t at = SampleRunStart(len, r);
    for (int64_t j = 0; j < kSampleRun; ++j) {
      const uint32_t bits = bf16 ? static_cast<uint32_t>(static_cast<const uint16_t*>(first)[at + j]) << 16
                                 : static_cast<const uint32_t*>(first)[at + j];
      s.scores[r * kSampleRun + j] = OrderedKey(bits) ^ flip;
    }
  }
  // The rank-th best sample score, its top 16 bits (the rest 0: a little
  // lower, so a few more pass): two 8-bit histogram rounds.
  int64_t need = rank;
  auto bucket = [&need](const uint32_t* hist) {  // the one holding the need-th best
    int b = 255;
    for (; b > 0 && need > hist[b]; --b) need -= hist[b];
    return static_cast<uint32_t>(b);
  };
  // A sample's top bytes are few (its exponents), so each of four
  // interleaved counts takes every fourth score: one counter's increments
  // would wait on each other.
  uint32_t hist[4][256] = {};
  for (int64_t i = 0; i < kSample; i += 4) {
    for (int64_t j = 0; j < 4; ++j) ++hist[j][s.scores[i + j] >> 24];
  }
  for (int b = 0; b < 256; ++b) hist[0][b] += hist[1][b] + hist[2][b] + hist[3][b];
  const uint32_t top = bucket(hist[0]);
  // The second byte of the scores in that bucket, gathered first.
  uint32_t in_top[kSample];
  int64_t n = 0;
  for (int64_t i = 0; i < kSample; ++i) {
    in_top[n] = s.scores[i];
    n += (s.scores[i] >> 24) == top;
  }
  std::fill(std::begin(hist[0]), std::end(hist[0]), 0);
  for (int64_t i = 0; i < n; ++i) ++hist[0][(in_top[i] >> 16) & 0xff];
  return top << 24 | bucket(hist[0]) << 16;
}

// 256 permutations of 8 lanes, each moving the lanes its index's bits name
// to the front in order: the AVX2 stand-in for AVX-512's compress.
const std::array<std::array<int32_t, 8>, 256> kCompress = [] {
  std::array<std::array<int32_t, 8>, 256> table{};
  for (int m = 0; m < 256; ++m) {
    int n = 0;
    for (int lane = 0; lane < 8; ++lane) {
      if (m & (1 << lane)) table[m][n++] = lane;
    }
  }
  return table;
}();

// A threshold on scores as a comparison of the elements themselves, so
// that the pass over a row computes no scores: a score (OrderedKey ^ flip)
// reaches t exactly where x `cmp` f, with cmp _CMP_NLT_UQ for the largest
// (x >= f, NaN, the top score, passing too) or _CMP_LE_OQ for the smallest
// (x <= f, NaN failing). -0 and +0 compare equal, as their scores do. cmp
// is 0 at the ends where no float compares so (only NaN passes, or
// nothing): there the scores are compared.
struct FloatBound {
  int cmp;
  float f;
};

FloatBound BoundOf(uint32_t t, bool largest) {
  constexpr uint32_t kMinusInf = 0x007fffffu, kPlusInf = 0xff800000u;  // their scores
  auto value = [](uint32_t key) {  // the float whose OrderedKey is key, for key in [kMinusInf, kPlusInf]
    const uint32_t bits = key >= 0x80000000u ? key ^ 0x80000000u : ~key;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  if (largest) {
    if (t > kPlusInf) return {0, 0};
    return {_CMP_NLT_UQ, value(std::max(t, kMinusInf))};
  }
  uint32_t at_most = ~t;  // OrderedKey(x) <= at_most
  if (at_most < kMinusInf) return {0, 0};
  // 0x7fffffff is no float's score (it would be -0's): the next below is.
  if (at_most == 0x7fffffffu) at_most = 0x7ffffffeu;
  return {_CMP_LE_OQ, value(std::min(at_most, kPlusInf))};
}

// Element i of a row as float32 bits.
inline uint32_t BitsAt(const void* first, bool bf16, int64_t i) {
  return bf16 ? static_cast<uint32_t>(static_cast<const uint16_t*>(first)[i]) << 16
              : static_cast<const uint32_t*>(first)[i];
}

// Writes the elements of the row's [0, len) whose score reaches t, as float
// bits, and their columns (base + i) to bits (unless null: bf16's survivors
// are read from the row as they are sorted) and cols, in column order;
// returns how many, or -1 once more than `limit` pass. REQUIRES: room for
// limit + 16 in each output.
int64_t CollectScalar(const void* first, bool bf16, int64_t len, uint32_t flip, uint32_t t, int64_t base,
                      int64_t limit, uint32_t* bits, int32_t* cols) {
  int64_t n = 0;
  for (int64_t i = 0; i < len; ++i) {
    const uint32_t x = BitsAt(first, bf16, i);
    if (bits != nullptr) bits[n] = x;
    cols[n] = static_cast<int32_t>(base + i);
    n += (OrderedKey(x) ^ flip) >= t;
    if (n > limit) return -1;
  }
  return n;
}

#if !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12 takes the intrinsics' undefined pass-through source for an
// uninitialised read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// CollectScalar by a FloatBound (kCmp its cmp), sixteen at a time with
// AVX-512's compress of the columns; the survivors' values are read back by
// column after (the row is in cache by then), which costs less than a
// second compress per vector (3-5% of the whole at 64x32768, k=2048);
// without `bits` (bf16, which SortBf16Survivors gathers), not at all.
template <int kCmp>
__attribute__((target("avx512f"))) int64_t Collect512(const void* first, bool bf16, int64_t len, uint32_t flip,
                                                      uint32_t t, float f, int64_t base, int64_t limit, uint32_t* bits,
                                                      int32_t* cols) {
  const __m512 vf = _mm512_set1_ps(f);
  __m512i col = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(base)),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i sixteen = _mm512_set1_epi32(16);
  int64_t n = 0;
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m512i u =
        bf16 ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                     reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(first) + i))),
                                 16)
             : _mm512_loadu_si512(static_cast<const uint32_t*>(first) + i);
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_castsi512_ps(u), vf, kCmp);
    _mm512_storeu_si512(cols + n, _mm512_maskz_compress_epi32(m, col));
    n += __builtin_popcount(m);
    col = _mm512_add_epi32(col, sixteen);
    if (n > limit) return -1;
  }
  if (bits != nullptr) {
    for (int64_t j = 0; j < n; ++j) bits[j] = BitsAt(first, bf16, cols[j] - base);
  }
  const int64_t rest = CollectScalar(static_cast<const char*>(first) + i * (bf16 ? 2 : 4), bf16, len - i, flip, t,
                                     base + i, limit - n, bits != nullptr ? bits + n : nullptr, cols + n);
  return rest < 0 ? -1 : n + rest;
}

// Collect512 of a row of at most 2^16 elements (REQUIRES), by offsets in
// the row: thirty-two elements a step, their offsets compressed as 16-bit
// lanes (AVX512_VBMI2), half the compresses and stores of Collect512's
// 32-bit columns, which were what bound its pass. Writes offsets only;
// returns how many, or -1 once more than `limit` pass. REQUIRES: room for
// limit + 32 offsets.
template <int kCmp>
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) int64_t CollectOffsets512(const void* first, bool bf16,
                                                                                int64_t len, uint32_t flip,
                                                                                uint32_t t, float f, int64_t limit,
                                                                                uint16_t* offsets) {
  const __m512 vf = _mm512_set1_ps(f);
  __m512i at = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11,
                                10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i step = _mm512_set1_epi16(32);
  const uint16_t* first16 = static_cast<const uint16_t*>(first);
  const uint32_t* first32 = static_cast<const uint32_t*>(first);
  int64_t n = 0;
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m512i u[2];  // elements i to i + 31 as float bits
    for (int h = 0; h < 2; ++h) {
      u[h] = bf16 ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                          reinterpret_cast<const __m256i*>(first16 + i + 16 * h))),
                                      16)
                  : _mm512_loadu_si512(first32 + i + 16 * h);
    }
    const __mmask16 low = _mm512_cmp_ps_mask(_mm512_castsi512_ps(u[0]), vf, kCmp);
    const __mmask16 high = _mm512_cmp_ps_mask(_mm512_castsi512_ps(u[1]), vf, kCmp);
    const __mmask32 m = _mm512_kunpackw(high, low);
    _mm512_storeu_si512(offsets + n, _mm512_maskz_compress_epi16(m, at));
    n += __builtin_popcount(m);
    at = _mm512_add_epi16(at, step);
    if (n > limit) return -1;
  }
  for (; i < len; ++i) {
    offsets[n] = static_cast<uint16_t>(i);
    n += (OrderedKey(BitsAt(first, bf16, i)) ^ flip) >= t;
    if (n > limit) return -1;
  }
  return n;
}

// The columns (base + offset) of n survivors at `offsets` of a row whose
// element 0 is at `first`, and, unless bits is null (REQUIRES then an f32
// row), their float bits, sixteen at a time (a gather from the row).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void ColumnsOfOffsets512(const uint32_t* first,
                                                                            const uint16_t* offsets, int64_t n,
                                                                            int64_t base, int32_t* cols,
                                                                            uint32_t* bits) {
  const __m512i vbase = _mm512_set1_epi32(static_cast<int32_t>(base));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512i at = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, offsets + j));
    _mm512_mask_storeu_epi32(cols + j, m, _mm512_add_epi32(at, vbase));
    if (bits != nullptr) {
      _mm512_mask_storeu_epi32(bits + j, m, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, at, first, 4));
    }
  }
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Collect512 eight at a time with AVX2, a permutation table standing in
// for compress. It asks for the row 4 KiB (f32) or 2 KiB (bf16) ahead:
// the hardware's prefetch alone left its loads waiting (bf16 8-15% slower
// under KREG_ISA_MASK=avx2,fma; the same in Collect512 and
// CollectOffsets512 made the AVX-512 pass slower).
template <int kCmp>
__attribute__((target("avx2"))) int64_t Collect256(const void* first, bool bf16, int64_t len, uint32_t flip,
                                                   uint32_t t, float f, int64_t base, int64_t limit, uint32_t* bits,
                                                   int32_t* cols) {
  const __m256 vf = _mm256_set1_ps(f);
  __m256i col = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(base)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i eight = _mm256_set1_epi32(8);
  int64_t n = 0;
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    __builtin_prefetch(static_cast<const char*>(first) + (i + 1024) * (bf16 ? 2 : 4));
    const __m256i u =
        bf16 ? _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                     reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(first) + i))),
                                 16)
             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint32_t*>(first) + i));
    const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_castsi256_ps(u), vf, kCmp));
    const __m256i perm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kCompress[m].data()));
    if (bits != nullptr) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + n), _mm256_permutevar8x32_epi32(u, perm));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cols + n), _mm256_permutevar8x32_epi32(col, perm));
    n += __builtin_popcount(static_cast<unsigned>(m));
    col = _mm256_add_epi32(col, eight);
    if (n > limit) return -1;
  }
  const int64_t rest = CollectScalar(static_cast<const char*>(first) + i * (bf16 ? 2 : 4), bf16, len - i, flip, t,
                                     base + i, limit - n, bits != nullptr ? bits + n : nullptr, cols + n);
  return rest < 0 ? -1 : n + rest;
}

// CollectScalar, by a float comparison and vectors where it can.
int64_t Collect(const void* first, bool bf16, int64_t len, uint32_t flip, uint32_t t, int64_t base, int64_t limit,
                const RadixConfig& cfg, uint32_t* bits, int32_t* cols, std::vector<uint16_t>& offsets) {
  const FloatBound b = BoundOf(t, flip == 0);
  // By offsets where they fit 16 bits; bf16's bits, which SortBf16Survivors
  // gathers with AVX-512, are not asked for there.
  if (cfg.compress16 && b.cmp != 0 && len <= int64_t{1} << 16 && (bits == nullptr || !bf16)) {
    offsets.resize(limit + 32);
    const int64_t n =
        b.cmp == _CMP_NLT_UQ
            ? CollectOffsets512<_CMP_NLT_UQ>(first, bf16, len, flip, t, b.f, limit, offsets.data())
            : CollectOffsets512<_CMP_LE_OQ>(first, bf16, len, flip, t, b.f, limit, offsets.data());
    if (n > 0) ColumnsOfOffsets512(static_cast<const uint32_t*>(first), offsets.data(), n, base, cols, bits);
    return n;
  }
  if (b.cmp == _CMP_NLT_UQ && cfg.avx512) {
    return Collect512<_CMP_NLT_UQ>(first, bf16, len, flip, t, b.f, base, limit, bits, cols);
  }
  if (b.cmp == _CMP_LE_OQ && cfg.avx512) {
    return Collect512<_CMP_LE_OQ>(first, bf16, len, flip, t, b.f, base, limit, bits, cols);
  }
  if (b.cmp == _CMP_NLT_UQ && cfg.avx2) {
    return Collect256<_CMP_NLT_UQ>(first, bf16, len, flip, t, b.f, base, limit, bits, cols);
  }
  if (b.cmp == _CMP_LE_OQ && cfg.avx2) {
    return Collect256<_CMP_LE_OQ>(first, bf16, len, flip, t, b.f, base, limit, bits, cols);
  }
  return CollectScalar(first, bf16, len, flip, t, base, limit, bits, cols);
}

// Selects the k best of row[start, end) into out.
//
// Rows of one call mostly share a distribution (a batch of logits), so a
// long row leaves the next row this thread takes, if of its length and
// start, a threshold: the score about k + CarryMargin of it reached. That
// row is passed over by it first, and takes a sample only where fewer than
// k pass or too many; it sorts ~k + margin survivors instead of the
// sample's (2,300 against 2,880 at 32768 x k=2048) and skips the sample's
// 64 line misses.
void Select(const void* row, bool bf16, bool largest, int64_t start, int64_t end, int64_t k,
            const RadixConfig& cfg, Scratch& s, std::vector<uint64_t>& out) {
  const int64_t len = end - start;
  out.clear();
  if (k == 0 || len == 0) return;
  const int64_t size = bf16 ? 2 : 4;
  const char* first = static_cast<const char*>(row) + start * size;
  const uint32_t flip = largest ? 0u : 0xffffffffu;
  const bool carries = len >= 8 * kSample && len > k;
  int64_t n = -1;  // survivors of a threshold; -1 for none
  uint32_t t = 0;  // that threshold
  // The survivors' float bits, or null where SortBf16Survivors gathers them.
  auto kept_bits = [&]() { return bf16 && cfg.avx512 ? nullptr : s.scores.data(); };
  if (carries) {
    // Room for twice the survivors the sample predicts; more means ties
    // at t or a sample that misjudged the row.
    const int64_t limit = std::min(len, 2 * (k + len / kSample) + 64);
    s.cols.resize(limit + 16);
    if (s.carried != 0 && s.carried_len == len && s.carried_start == start) {
      t = s.carried;
      s.scores.resize(limit + 16);
      n = Collect(first, bf16, len, flip, t, start, limit, cfg, kept_bits(), s.cols.data(), s.offsets);
    }
    s.carried = 0;
    if (n < k) {
      if (t = SampledThreshold(first, bf16, flip, len, k, s); t > 0) {
        s.scores.resize(limit + 16);  // the sample used it
        n = Collect(first, bf16, len, flip, t, start, limit, cfg, kept_bits(), s.cols.data(), s.offsets);
      }
    }
  }
  // What this row leaves the next, from its best (all its survivors, or
  // its k best).
  auto leave = [&](uint32_t next) {
    if (!carries) return;
    s.carried = next;
    s.carried_len = len;
    s.carried_start = start;
  };
  if (n >= k && bf16) {
    leave(SortBf16Survivors(reinterpret_cast<const uint16_t*>(first), start, len, kept_bits(), s.cols.data(), n, k,
                            flip, t, k + CarryMargin(len, k), s, out, cfg.vectors()));
    return;
  }
  if (n >= k) {  // a few more than k: sorting them all is cheaper than selecting first
    s.ranked.resize(n);
    const ScoreRange range = ScoresAndRange(s.scores.data(), static_cast<size_t>(n), flip, s.ranked.data());
    leave(SortTopK(ScoredColumns{s.ranked.data(), s.cols.data()}, range, static_cast<size_t>(n),
                   static_cast<size_t>(k), k + CarryMargin(len, k), out, s, cfg.vectors()));
    return;
  }
  s.scores.resize(len);
  uint32_t* scores = s.scores.data();
  ComputeScores(first, bf16, len, flip, scores);
  if (len <= k) {
    out.resize(len);
    for (int64_t i = 0; i < len; ++i) out[i] = Pack(scores[i], start + i);
    SortBest(out, s.tmp, s.counts, cfg.vectors());
    return;
  }
  SelectScores(scores, nullptr, start, len, k, cfg, s, out);
  leave(CarriedThreshold(out, k + CarryMargin(len, k)));
}

constexpr uint32_t kCompress16Isa = KREG_ISA_AVX512F | KREG_ISA_AVX512BW | KREG_ISA_AVX512VL;

kreg_status Run(const TopKArgs& a, const kreg_config* config, const kreg_host* host, char* msg,
                size_t cap) {
  const bool bf16 = IsBf16(a);
  // AVX2 and AVX-512 only speed up the scans; the variant itself needs no ISA.
  const uint32_t isa = HostIsa(host);
  const RadixConfig cfg = {
      .first_bits = static_cast<int>(Param(config, 0).value),
      .round_bits = static_cast<int>(Param(config, 1).value),
      .capacity = Param(config, 2).value,
      .avx2 = (isa & KREG_ISA_AVX2) != 0,
      .avx512 = (isa & KREG_ISA_AVX512F) != 0,
      .compress16 = (isa & kCompress16Isa) == kCompress16Isa && __builtin_cpu_supports("avx512vbmi2"),
  };
  tbb::enumerable_thread_specific<Scratch> scratch;
  const kreg_status status = SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end,
                                               std::vector<uint64_t>& keys) {
    Select(InputRow(a, r), bf16, a.largest, start, end, a.k, cfg, scratch.local(), keys);
    return 0;
  });
  return Finish(status, msg, cap);
}

}  // namespace

extern const kreg_kernel kRadixKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "radix",
    .version = 1,
    .doc = "radix select on order-preserving keys, exact when a bucket overflows the buffer",
    .params = kParams,
    .num_params = sizeof kParams / sizeof kParams[0],
    .check = CheckTopK,
    .run = GuardedRun<Run>,
};

}  // namespace kreg::topk
