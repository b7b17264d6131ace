// topk/blockwise: the blockwise superset algorithm of the Pallas TPU seed, on
// CPU with AVX2. Column c of a row's range belongs to block c % num_blocks;
// eight blocks share one vector, so each block's running top-m is a column of
// m vectors kept sorted by a vertical compare-exchange network. A vector of
// eight new elements that beats no block's m-th best skips the network.
//
// Stopping rule (exact, with ties broken by column): let the pivot be the
// largest m-th best (score, column) key of any block. If the top-(m-1) of all
// blocks hold at least k keys above the pivot, they hold the global top-k:
// anything outside them ranks at or below its block's m-th, so below the
// pivot. Otherwise the next m of `m_schedule` is tried, ending with m = k,
// which always holds: there the superset is the whole range. Stage two is an
// exact top-k of the superset. The depth used (m-1, or k when the schedule
// ran out) is reported per row in the optional `stats` tensor.
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <vector>

#include "common.h"
#include "variants.h"

namespace kreg::topk {
namespace {

const int64_t kNumBlocks[] = {16, 32, 64, 128, 256};
const int64_t kMCandidates[] = {2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32};
const int64_t kDefaultSchedule[] = {5, 8, 12};
enum Stage2 { kPartialSort = 0, kNthElement = 1 };
const char* const kStage2[] = {"partial_sort", "nth_element"};

const kreg_param_desc kNumBlocksParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "num_blocks",
    .doc = "column-strided blocks (8 per AVX2 vector)",
    .kind = KREG_PARAM_INT,
    .values = kNumBlocks,
    .num_values = 5,
    .default_value = 128,
};
const kreg_param_desc kMScheduleParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "m_schedule",
    .doc = "increasing depths m to try before m = k (entries >= k unused)",
    .kind = KREG_PARAM_INT_LIST,
    .values = kMCandidates,
    .num_values = 11,
    .default_list = kDefaultSchedule,
    .default_list_len = 3,
};
const kreg_param_desc kStage2Param = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "stage2",
    .doc = "exact top-k of the superset: partial_sort or nth_element + sort",
    .kind = KREG_PARAM_CHOICE,
    .choices = kStage2,
    .num_choices = 2,
    .default_value = kPartialSort,
};
const kreg_param_desc* const kParams[] = {&kNumBlocksParam, &kMScheduleParam, &kStage2Param};

kreg_status Check(const kreg_config* config, const kreg_args* args, const kreg_host* host, char* msg,
                  size_t cap) {
  if (kreg_status s = CheckTopK(config, args, host, msg, cap); s != KREG_OK) return s;
  const kreg_param_value& schedule = Param(config, 1);
  for (size_t i = 0; i < schedule.list_len; ++i) {
    if (schedule.list[i] < 2 || (i > 0 && schedule.list[i] <= schedule.list[i - 1])) {
      return Fail(KREG_INVALID_ARGUMENT, msg, cap, "m_schedule must be increasing with entries >= 2");
    }
  }
  return KREG_OK;
}

#define KREG_AVX2 __attribute__((target("avx2"), always_inline)) inline

// Per-thread block state: level j, block i holds the block's j-th best score
// (biased to signed, INT32_MIN = empty) at score[j * nb + i] and its column.
struct Blocks {
  std::vector<int32_t> score, col;
};

__attribute__((target("avx2"))) inline __m256i Load(const int32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Eight order-preserving scores (kreg's order, biased to signed int32).
KREG_AVX2 __m256i Scores8(const void* row, bool bf16, int64_t c, __m256i flip) {
  __m256i u;
  if (bf16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
    u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
  } else {
    u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const float*>(row) + c));
  }
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  u = _mm256_andnot_si256(_mm256_and_si256(_mm256_cmpeq_epi32(u, sign), sign), u);  // -0 -> +0
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  __m256i key = _mm256_xor_si256(u, _mm256_or_si256(_mm256_srai_epi32(u, 31), sign));
  key = _mm256_blendv_epi8(key, _mm256_set1_epi32(static_cast<int>(0xfffffffeu)), nan);
  // Score = key (largest) or ~key (smallest), biased for signed compares.
  return _mm256_xor_si256(key, flip);
}

// Inserts eight (score, column) pairs into the sorted columns of levels
// sc[0], sc[nb], ..., sc[(m-1) nb] (eight blocks). The new element enters
// where it is strictly greater, so an equal one (always an earlier column)
// stays above it: kreg's tie rule. Below that level every element moves down
// one, unconditionally: the one pushed down precedes the one under it even
// when their scores tie.
KREG_AVX2 void Insert(int32_t* sc, int32_t* cc, int64_t m, int64_t nb, __m256i x, __m256i c) {
  __m256i moved = _mm256_setzero_si256();
  for (int64_t j = 0; j < m; ++j, sc += nb, cc += nb) {
    const __m256i ts = Load(sc), tc = Load(cc);
    const __m256i gt = _mm256_or_si256(_mm256_cmpgt_epi32(x, ts), moved);
    moved = gt;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sc), _mm256_blendv_epi8(ts, x, gt));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cc), _mm256_blendv_epi8(tc, c, gt));
    x = _mm256_blendv_epi8(x, ts, gt);
    c = _mm256_blendv_epi8(c, tc, gt);
  }
}

// One pass over [start, end) keeping the top-m of every block.
__attribute__((target("avx2"))) void Pass(const void* row, bool bf16, bool largest, int64_t start,
                                          int64_t end, int64_t nb, int64_t m, Blocks& b) {
  b.score.assign(m * nb, INT32_MIN);
  b.col.assign(m * nb, -1);
  int32_t* sc = b.score.data();
  int32_t* cc = b.col.data();
  const __m256i flip = _mm256_set1_epi32(static_cast<int>(largest ? 0x80000000u : 0x7fffffffu));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int32_t* bottom = sc + (m - 1) * nb;
  int64_t c0 = start;
  for (; c0 + nb <= end; c0 += nb) {
    for (int64_t i = 0; i < nb; i += 8) {
      const __m256i x = Scores8(row, bf16, c0 + i, flip);
      if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(x, Load(bottom + i))) == 0) continue;
      Insert(sc + i, cc + i, m, nb, x, _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c0 + i)), lane));
    }
  }
  // The ragged tail: lanes past the end carry the empty score and lose.
  for (int64_t i = 0; i < nb && c0 + i < end; i += 8) {
    int32_t s[8], c[8];
    for (int l = 0; l < 8; ++l) {
      const int64_t col = c0 + i + l;
      s[l] = col < end ? static_cast<int32_t>(Score(FloatBits(row, bf16, col), largest) ^ 0x80000000u) : INT32_MIN;
      c[l] = col < end ? static_cast<int32_t>(col) : -1;
    }
    Insert(sc + i, cc + i, m, nb, Load(s), Load(c));
  }
}

// The packed key of block slot (level j, block i), or 0 when empty.
inline uint64_t SlotKey(const Blocks& b, int64_t nb, int64_t j, int64_t i) {
  const int32_t c = b.col[j * nb + i];
  return c < 0 ? 0 : Pack(static_cast<uint32_t>(b.score[j * nb + i]) ^ 0x80000000u, c);
}

kreg_status Run(const TopKArgs& a, const kreg_config* config, const kreg_host* host, char* msg,
                size_t cap) {
  const bool bf16 = IsBf16(a);
  const int64_t nb = Param(config, 0).value;
  std::vector<int64_t> schedule;
  for (size_t i = 0; i < Param(config, 1).list_len; ++i) schedule.push_back(Param(config, 1).list[i]);
  const bool nth = Param(config, 2).value == kNthElement;
  tbb::enumerable_thread_specific<Blocks> per_thread;
  const kreg_status status = SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end,
                                               std::vector<uint64_t>& keys) {
    Blocks& blocks = per_thread.local();
    const void* row = InputRow(a, r);
    keys.clear();
    int32_t depth = static_cast<int32_t>(a.k);
    for (int64_t m : schedule) {
      // Depths that cannot hold k keys, or reach k, are skipped.
      if (m >= a.k || (m - 1) * nb < a.k) continue;
      Pass(row, bf16, a.largest, start, end, nb, m, blocks);
      uint64_t pivot = 0;
      for (int64_t i = 0; i < nb; ++i) pivot = std::max(pivot, SlotKey(blocks, nb, m - 1, i));
      int64_t above = 0;
      for (int64_t j = 0; j < m - 1; ++j) {
        for (int64_t i = 0; i < nb; ++i) above += SlotKey(blocks, nb, j, i) > pivot;
      }
      if (above >= a.k || pivot == 0) {
        depth = static_cast<int32_t>(m - 1);
        break;
      }
    }
    if (depth < a.k) {
      for (int64_t j = 0; j < depth; ++j) {
        for (int64_t i = 0; i < nb; ++i) {
          if (uint64_t key = SlotKey(blocks, nb, j, i); key != 0) keys.push_back(key);
        }
      }
    } else {
      // m = k: every block's top-k, i.e. the whole range, is the superset.
      for (int64_t c = start; c < end; ++c) keys.push_back(Pack(Score(FloatBits(row, bf16, c), a.largest), c));
    }
    KeepBest(keys, a.k, nth);
    return depth;
  });
  return Finish(status, msg, cap);
}

}  // namespace

extern const kreg_kernel kBlockwiseKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "blockwise",
    .version = 2,
    .doc = "blockwise superset: running top-m per column-strided block, then top-k of the superset",
    .required_isa = KREG_ISA_AVX2,
    .params = kParams,
    .num_params = sizeof kParams / sizeof kParams[0],
    .check = Check,
    .run = GuardedRun<Run>,
};

}  // namespace kreg::topk
