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
#include <immintrin.h>

#include <algorithm>
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

struct Scratch {
  std::vector<uint32_t> scores;
  std::vector<uint32_t> hist;
  std::vector<int32_t> cand;  // offsets into scores, in column order
  std::vector<uint64_t> tmp;  // SortByScore's
};

// Histogram of digit(scores[i]) over the offsets `idx` (or all of scores
// when idx is null) into hist, four interleaved counts so that runs of one
// bucket do not serialise on a single counter.
template <typename Digit>
void Histogram(const uint32_t* scores, const int32_t* idx, int64_t n, Digit digit, std::vector<uint32_t>& hist) {
  const size_t buckets = hist.size();
  std::vector<uint32_t> h(4 * buckets, 0);
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

// Sorts packed keys best first by score alone: a stable LSD radix sort over
// the four score bytes (bytes every key shares are skipped). REQUIRES: keys
// of equal score appear in column order, as Select collects them.
void SortByScore(std::vector<uint64_t>& keys, std::vector<uint64_t>& tmp) {
  const size_t n = keys.size();
  if (n < 64) {
    std::sort(keys.begin(), keys.end(), std::greater<>());
    return;
  }
  tmp.resize(n);
  size_t count[4][256] = {};
  for (uint64_t key : keys) {
    for (int d = 0; d < 4; ++d) ++count[d][0xff - ((key >> (32 + 8 * d)) & 0xff)];
  }
  uint64_t* src = keys.data();
  uint64_t* dst = tmp.data();
  for (int d = 0; d < 4; ++d) {
    const int shift = 32 + 8 * d;
    size_t* c = count[d];
    if (c[0xff - ((src[0] >> shift) & 0xff)] == n) continue;
    size_t pos = 0;
    for (int b = 0; b < 256; ++b) {
      const size_t here = c[b];
      c[b] = pos;
      pos += here;
    }
    for (size_t i = 0; i < n; ++i) dst[c[0xff - ((src[i] >> shift) & 0xff)]++] = src[i];
    std::swap(src, dst);
  }
  if (src != keys.data()) std::memcpy(keys.data(), src, n * sizeof(uint64_t));
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

void Select(const void* row, bool bf16, bool largest, int64_t start, int64_t end, int64_t k,
            int first_bits, int round_bits, int64_t capacity, bool avx2, Scratch& s,
            std::vector<uint64_t>& out) {
  const int64_t len = end - start;
  out.clear();
  if (k == 0 || len == 0) return;
  s.scores.resize(len);
  uint32_t* scores = s.scores.data();
  const char* first = static_cast<const char*>(row) + start * (bf16 ? 2 : 4);
  ComputeScores(first, bf16, len, largest ? 0u : 0xffffffffu, scores);
  if (len <= k) {
    out.resize(len);
    for (int64_t i = 0; i < len; ++i) out[i] = Pack(scores[i], start + i);
    SortByScore(out, s.tmp);
    return;
  }

  // First pass: the bucket of the top first_bits bits that holds the k-th.
  int bits = first_bits;
  s.hist.assign(size_t{1} << bits, 0);
  Histogram(scores, nullptr, len, [&](uint32_t x) { return x >> (32 - first_bits); }, s.hist);
  int64_t better = 0;
  uint32_t prefix = ThresholdBucket(s.hist, k, &better);
  int64_t need = k - better;
  int64_t in_bucket = s.hist[prefix];

  // Overflow: refine the threshold bucket over the whole row until it fits.
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
    o[n_out] = Pack(scores[i], start + i);
    n_out += p > prefix;
    c[n_cand] = static_cast<int32_t>(i);
    n_cand += (p == prefix) & (n_cand < cand_limit);
  };
  // Only elements at or above the threshold prefix matter: a tenth or less
  // of the row. Find them 16 at a time where the CPU allows.
  const uint32_t lo = prefix << shift;
  int64_t i = 0;
  if (avx2 && lo > 0) i = ForEachAtLeast(scores, len, lo, visit);
  for (; i < len; ++i) {
    if (scores[i] >= lo) visit(i);
  }

  // Refinement rounds on the candidates.
  while (need < n_cand && bits < 32) {
    const int rb = std::min(round_bits, 32 - bits);
    const uint32_t mask = (1u << rb) - 1;
    const int sh = 32 - bits - rb;
    s.hist.assign(size_t{1} << rb, 0);
    Histogram(scores, c, n_cand, [&](uint32_t x) { return (x >> sh) & mask; }, s.hist);
    int64_t sub_better = 0;
    const uint32_t sub = ThresholdBucket(s.hist, need, &sub_better);
    int64_t kept = 0;
    for (int64_t j = 0; j < n_cand; ++j) {
      const int32_t at = c[j];
      const uint32_t d = (scores[at] >> sh) & mask;
      o[n_out] = Pack(scores[at], start + at);
      n_out += d > sub;
      c[kept] = at;
      kept += d == sub;
    }
    n_cand = kept;
    need -= sub_better;
    bits += rb;
  }
  for (int64_t j = 0; j < need; ++j) o[n_out++] = Pack(scores[c[j]], start + c[j]);
  out.resize(n_out);
  SortByScore(out, s.tmp);
}

kreg_status Run(const TopKArgs& a, const kreg_config* config, const kreg_host* host, char* msg,
                size_t cap) {
  const bool bf16 = IsBf16(a);
  const int first_bits = static_cast<int>(Param(config, 0).value);
  const int round_bits = static_cast<int>(Param(config, 1).value);
  const int64_t capacity = Param(config, 2).value;
  // AVX2 only speeds up a scan; the variant itself needs no ISA.
  const bool avx2 = host != nullptr && KREG_HAS_FIELD(host, kreg_host, isa) && (host->isa & KREG_ISA_AVX2);
  tbb::enumerable_thread_specific<Scratch> scratch;
  const kreg_status status = SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end,
                                               std::vector<uint64_t>& keys) {
    Select(InputRow(a, r), bf16, a.largest, start, end, a.k, first_bits, round_bits, capacity, avx2,
           scratch.local(), keys);
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
