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

const kreg_param_desc kParams[] = {
    {sizeof(kreg_param_desc), "first_bits", "bits of the score histogrammed by the first pass",
     KREG_PARAM_INT, kFirstBits, 3, nullptr, 0, 11, nullptr, 0},
    {sizeof(kreg_param_desc), "round_bits", "bits per refinement round", KREG_PARAM_INT, kRoundBits, 2,
     nullptr, 0, 8, nullptr, 0},
    {sizeof(kreg_param_desc), "capacity", "candidate buffer slots (more are refined over the row first)",
     KREG_PARAM_INT, kCapacity, 4, nullptr, 0, 4096, nullptr, 0},
};

struct Scratch {
  std::vector<uint32_t> scores;
  std::vector<uint32_t> hist;
  std::vector<int64_t> cand;  // offsets into scores, in column order
};

// Walks hist from the best bucket down; returns the bucket holding the
// need-th best and adds the count of better buckets to *better.
int64_t ThresholdBucket(const std::vector<uint32_t>& hist, int64_t need, int64_t* better) {
  int64_t seen = 0;
  for (int64_t b = static_cast<int64_t>(hist.size()) - 1; b >= 0; --b) {
    if (seen + hist[b] >= need) {
      *better = seen;
      return b;
    }
    seen += hist[b];
  }
  *better = seen;
  return 0;
}

void Select(const void* row, bool bf16, bool largest, int64_t start, int64_t end, int64_t k,
            int first_bits, int round_bits, int64_t capacity, Scratch& s, std::vector<uint64_t>& out) {
  const int64_t len = end - start;
  out.clear();
  if (k == 0 || len == 0) return;
  auto take = [&](int64_t i) { out.push_back(Pack(s.scores[i], start + i)); };
  // Scores and the first histogram (of the top first_bits bits) in one pass.
  int bits = first_bits;
  s.scores.resize(len);
  s.hist.assign(size_t{1} << bits, 0);
  uint32_t* scores = s.scores.data();
  uint32_t* hist = s.hist.data();
  const uint32_t flip = largest ? 0u : 0xffffffffu;
  const int first_shift = 32 - bits;
  if (bf16) {
    const uint16_t* in = static_cast<const uint16_t*>(row) + start;
    for (int64_t i = 0; i < len; ++i) scores[i] = OrderedKey(static_cast<uint32_t>(in[i]) << 16) ^ flip;
  } else {
    const uint32_t* in = static_cast<const uint32_t*>(row) + start;
    for (int64_t i = 0; i < len; ++i) scores[i] = OrderedKey(in[i]) ^ flip;
  }
  if (len <= k) {
    for (int64_t i = 0; i < len; ++i) take(i);
    SortBestFirst(out);
    return;
  }
  for (int64_t i = 0; i < len; ++i) ++hist[scores[i] >> first_shift];
  int64_t better = 0;
  uint32_t prefix = static_cast<uint32_t>(ThresholdBucket(s.hist, k, &better));
  int64_t need = k - better;
  int64_t in_bucket = s.hist[prefix];

  // Overflow: refine the threshold bucket over the whole row until it fits.
  while (in_bucket > capacity && bits < 32) {
    const int rb = std::min(round_bits, 32 - bits);
    s.hist.assign(size_t{1} << rb, 0);
    const uint32_t mask = (1u << rb) - 1;
    for (int64_t i = 0; i < len; ++i) {
      if ((scores[i] >> (32 - bits)) == prefix) ++s.hist[(scores[i] >> (32 - bits - rb)) & mask];
    }
    int64_t sub_better = 0;
    uint32_t sub = static_cast<uint32_t>(ThresholdBucket(s.hist, need, &sub_better));
    need -= sub_better;
    prefix = (prefix << rb) | sub;
    bits += rb;
    in_bucket = s.hist[sub];
  }

  // Collect: better prefixes are selected, the threshold prefix becomes
  // candidates. With all 32 bits fixed the candidates are equal, so the
  // first `need` in column order are the answer.
  s.cand.clear();
  const int shift = 32 - bits;
  for (int64_t i = 0; i < len; ++i) {
    const uint32_t p = scores[i] >> shift;
    if (p > prefix) {
      take(i);
    } else if (p == prefix && (bits < 32 || static_cast<int64_t>(s.cand.size()) < need)) {
      s.cand.push_back(i);
    }
  }

  // Refinement rounds on the candidates.
  while (need < static_cast<int64_t>(s.cand.size()) && bits < 32) {
    const int rb = std::min(round_bits, 32 - bits);
    const uint32_t mask = (1u << rb) - 1;
    s.hist.assign(size_t{1} << rb, 0);
    for (int64_t i : s.cand) ++s.hist[(scores[i] >> (32 - bits - rb)) & mask];
    int64_t sub_better = 0;
    const uint32_t sub = static_cast<uint32_t>(ThresholdBucket(s.hist, need, &sub_better));
    size_t kept = 0;
    for (int64_t i : s.cand) {
      const uint32_t d = (scores[i] >> (32 - bits - rb)) & mask;
      if (d > sub) take(i);
      if (d == sub) s.cand[kept++] = i;
    }
    s.cand.resize(kept);
    need -= sub_better;
    bits += rb;
  }
  for (int64_t j = 0; j < need; ++j) take(s.cand[j]);
  SortBestFirst(out);
}

kreg_status Run(const kreg_config* config, const void* args, void*, size_t, const kreg_host* host, char* msg,
                size_t cap) {
  const kreg_topk_args& a = *static_cast<const kreg_topk_args*>(args);
  const bool bf16 = IsBf16(a);
  const int first_bits = static_cast<int>(config->values[0].value);
  const int round_bits = static_cast<int>(config->values[1].value);
  const int64_t capacity = config->values[2].value;
  kreg_status status = SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end,
                                               std::vector<uint64_t>& keys) {
    thread_local Scratch scratch;
    Select(InputRow(a, r), bf16, a.largest, start, end, a.k, first_bits, round_bits, capacity, scratch, keys);
    return 0;
  });
  if (status != KREG_OK) return Fail(status, msg, cap, "cancelled");
  return KREG_OK;
}

}  // namespace

extern const kreg_kernel kRadixKernel = {
    sizeof(kreg_kernel), "topk", "radix", 1,
    "radix select on order-preserving keys, exact when a bucket overflows the buffer",
    0, kParams, 3, nullptr, nullptr, Run,
};

}  // namespace kreg::topk
