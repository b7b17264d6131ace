// Shared by the topk kernels: the typed view of a topk call's kreg_args, row
// access, kreg's order as integer keys, output writing, the row-parallel
// driver and the guarded entry points. Plugin-private; speaks only the
// ABI header.
#ifndef KREG_PLUGINS_TOPK_COMMON_H_
#define KREG_PLUGINS_TOPK_COMMON_H_

#include <cstdint>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <exception>
#include <new>
#include <functional>
#include <vector>

#include <immintrin.h>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "kreg/plugin_sdk.h"
#include "kreg/topk/layout.h"

namespace kreg::topk {

using sdk::Cancelled;
using sdk::Fail;
using sdk::Finish;
using sdk::Guarded;
using sdk::HostIsa;

// A typed view of a topk call's kreg_args (see op.cc for the contract):
// plugin-private, built per call by MakeTopKArgs. Absent optional tensors
// are NULL.
struct TopKArgs {
  const DLTensor* input;       // [batch, n] f32 or bf16
  int64_t k;                   // 0 <= k <= n
  int32_t largest;             // 1: largest first; 0: smallest first
  const DLTensor* row_starts;  // int32 [batch] or NULL (0)
  const DLTensor* row_ends;    // int32 [batch] or NULL (n)
  DLTensor* values;            // [batch, k], the input's dtype
  DLTensor* indices;           // int32 [batch, k]
  DLTensor* stats;             // int32 [batch] or NULL
};

// Builds the view of `args`. Reads no tensor data, so it also serves
// shape-only args. False (with a reason in msg) if args are not shaped like
// the topk op's, which the host rules out; this is only a guard.
inline bool MakeTopKArgs(const kreg_args* args, TopKArgs* out, char* msg, size_t cap) {
  if (args == nullptr || args->struct_size < KREG_ARGS_MIN_SIZE || args->num_tensors < kNumTensors ||
      args->num_dims < kNumDims || args->num_attrs < kNumAttrs || args->tensors == nullptr ||
      args->dims == nullptr || args->attrs == nullptr || args->tensors[kInput] == nullptr ||
      args->tensors[kValues] == nullptr || args->tensors[kIndices] == nullptr) {
    std::snprintf(msg, cap, "args are not those of op topk");
    return false;
  }
  out->input = args->tensors[kInput];
  out->k = args->dims[kK];
  out->largest = args->attrs[kLargest].i != 0;
  out->row_starts = args->tensors[kRowStarts];
  out->row_ends = args->tensors[kRowEnds];
  out->values = args->tensors[kValues];
  out->indices = args->tensors[kIndices];
  out->stats = args->tensors[kStats];
  return true;
}

// The value of parameter i of a configuration.
inline const kreg_param_value& Param(const kreg_config* config, size_t i) { return *config->values[i]; }

template <typename T>
inline T* RowPtr(const DLTensor* t, int64_t r) {
  int64_t stride = t->strides ? t->strides[0] : (t->ndim == 2 ? t->shape[1] : 1);
  return reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset) + r * stride;
}

inline bool IsBf16(const TopKArgs& a) { return a.input->dtype.code == kDLBfloat; }

// The column range [start, end) of row r.
inline void RowRange(const TopKArgs& a, int64_t r, int64_t* start, int64_t* end) {
  *start = a.row_starts ? RowPtr<const int32_t>(a.row_starts, 0)[r] : 0;
  *end = a.row_ends ? RowPtr<const int32_t>(a.row_ends, 0)[r] : a.input->shape[1];
}

// Maps float32 bits onto uint32 so that unsigned order is kreg's value order:
// every NaN maps to the top, -0 and +0 to the same key. Keys lie in
// [0x007fffff, 0xfffffffe], so a Score is never 0: variants use 0 as "empty".
// Branch-free, so loops over it vectorise. Two keys do not tell their float:
// kNanKey (every NaN's) and kZeroKey (-0's and +0's).
inline constexpr uint32_t kNanKey = 0xfffffffeu, kZeroKey = 0x80000000u;
inline uint32_t OrderedKey(uint32_t u) {
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  u = u == 0x80000000u ? 0 : u;
  const uint32_t key = u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
  return nan ? kNanKey : key;
}

// A score where larger is better: the key, or its complement when smallest.
inline uint32_t Score(uint32_t float_bits, bool largest) {
  return OrderedKey(float_bits) ^ (largest ? 0u : 0xffffffffu);
}

// Bits of element c of a row as float32 bits (bf16 widened).
inline uint32_t FloatBits(const void* row, bool bf16, int64_t c) {
  if (bf16) return static_cast<uint32_t>(static_cast<const uint16_t*>(row)[c]) << 16;
  uint32_t u;
  std::memcpy(&u, static_cast<const char*>(row) + 4 * c, 4);
  return u;
}

// Row r of the input, as float32 or bf16 elements.
inline const void* InputRow(const TopKArgs& a, int64_t r) {
  return IsBf16(a) ? static_cast<const void*>(RowPtr<const uint16_t>(a.input, r))
                   : static_cast<const void*>(RowPtr<const float>(a.input, r));
}

// Score and column packed so that larger is better and ties go to the
// smaller column.
inline uint64_t Pack(uint32_t score, int64_t col) {
  return (static_cast<uint64_t>(score) << 32) | (0xffffffffu - static_cast<uint32_t>(col));
}
inline int32_t PackedCol(uint64_t p) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(p));
}

// Runs fn(r) for every row, rows in parallel on oneTBB, honouring
// cancellation. Returns KREG_CANCELLED if stopped. (The host runs kernels
// inside a oneTBB arena of kreg_host.num_threads threads when it is set.)
template <typename Fn>
kreg_status ForEachRow(int64_t batch, const kreg_host* host, Fn&& fn) {
  std::atomic<bool> stop{false};
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, batch), [&](const tbb::blocked_range<int64_t>& range) {
    for (int64_t r = range.begin(); r != range.end(); ++r) {
      if (stop.load(std::memory_order_relaxed)) return;
      if (Cancelled(host)) {
        stop = true;
        return;
      }
      fn(r);
    }
  });
  return stop ? KREG_CANCELLED : KREG_OK;
}

// Keeps the best `count` packed keys, sorted best first: by partial sort, or
// by nth_element and a sort of the kept ones.
inline void KeepBest(std::vector<uint64_t>& keys, int64_t count, bool nth_element = false) {
  count = std::min<int64_t>(count, static_cast<int64_t>(keys.size()));
  auto mid = keys.begin() + count;
  if (nth_element) {
    if (mid != keys.end()) std::nth_element(keys.begin(), mid, keys.end(), std::greater<>());
    std::sort(keys.begin(), mid, std::greater<>());
  } else {
    std::partial_sort(keys.begin(), mid, keys.end(), std::greater<>());
  }
  keys.resize(count);
}

// The columns of keys[0, n - n % 8) into idx and their values' bits from
// the scores into bits (f32) or bits16 (bf16, the one given), eight at a
// time; returns how many, and where a score does not tell its value, reads
// it from the row.
__attribute__((target("avx2"))) inline int64_t DecodeKeys256(const uint64_t* keys, int64_t n, uint32_t flip,
                                                             const void* row, int32_t* idx, uint32_t* bits,
                                                             uint16_t* bits16) {
  const __m256i vflip = _mm256_set1_epi32(static_cast<int>(flip));
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i ones = _mm256_set1_epi32(-1);
  const __m256i nan_key = _mm256_set1_epi32(static_cast<int>(kNanKey));
  const __m256i zero_key = _mm256_set1_epi32(static_cast<int>(kZeroKey));
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 k0 = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + j)));
    const __m256 k1 = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + j + 4)));
    // The low and high halves of the eight keys, in order.
    const __m256i low = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(k0, k1, 0x88)), 0xd8);
    const __m256i key = _mm256_xor_si256(
        _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(k0, k1, 0xdd)), 0xd8), vflip);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + j), _mm256_xor_si256(low, ones));  // PackedCol
    // OrderedKey undone: a key with its top bit set is a float with it clear.
    const __m256i value =
        _mm256_xor_si256(key, _mm256_or_si256(_mm256_xor_si256(_mm256_srai_epi32(key, 31), ones), sign));
    if (bits16 != nullptr) {
      const __m256i high = _mm256_srli_epi32(value, 16);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bits16 + j),
                       _mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1)));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + j), value);
    }
    const __m256i untold = _mm256_or_si256(_mm256_cmpeq_epi32(key, nan_key), _mm256_cmpeq_epi32(key, zero_key));
    for (unsigned m = _mm256_movemask_ps(_mm256_castsi256_ps(untold)); m != 0; m &= m - 1) {
      const int64_t at = j + __builtin_ctz(m);
      const uint32_t from_row = FloatBits(row, bits16 != nullptr, idx[at]);
      if (bits16 != nullptr) {
        bits16[at] = static_cast<uint16_t>(from_row >> 16);
      } else {
        bits[at] = from_row;
      }
    }
  }
  return j;
}

// Writes row r from packed keys sorted best first (at most k of them), each
// Pack(Score(bits, a.largest), col), then -1 padding with the worst value up
// to k. With AVX2 in `isa` the values come from the scores, eight at a
// time, and only a NaN or a zero is read from the row again (reading every
// value back by column made radix at 64x32768, k=2048 7-9% slower: the row
// is out of L1 by then, and the columns come in value order); otherwise
// each is read from the row.
inline void WriteKeys(const TopKArgs& a, int64_t r, const std::vector<uint64_t>& keys, uint32_t isa) {
  int32_t* idx = RowPtr<int32_t>(a.indices, r);
  const int64_t count = static_cast<int64_t>(keys.size());
  const bool bf16 = IsBf16(a);
  const void* row = InputRow(a, r);
  uint32_t* val = bf16 ? nullptr : RowPtr<uint32_t>(a.values, r);
  uint16_t* val16 = bf16 ? RowPtr<uint16_t>(a.values, r) : nullptr;
  const int64_t done = (isa & KREG_ISA_AVX2) != 0
                           ? DecodeKeys256(keys.data(), count, a.largest ? 0u : 0xffffffffu, row, idx, val, val16)
                           : 0;
  // The rest by column from the row.
  for (int64_t j = done; j < count; ++j) idx[j] = PackedCol(keys[j]);
  const uint32_t worst = a.largest ? 0xff800000u : 0x7f800000u;  // -inf : +inf
  if (bf16) {
    const uint16_t* in = static_cast<const uint16_t*>(row);
    for (int64_t j = done; j < count; ++j) val16[j] = in[idx[j]];
    for (int64_t j = count; j < a.k; ++j) val16[j] = static_cast<uint16_t>(worst >> 16);
  } else {
    const uint32_t* in = static_cast<const uint32_t*>(row);
    for (int64_t j = done; j < count; ++j) val[j] = in[idx[j]];
    for (int64_t j = count; j < a.k; ++j) val[j] = worst;
  }
  for (int64_t j = count; j < a.k; ++j) idx[j] = -1;
}

// Rows are cut into chunks of at least this many columns (1 MiB of f32),
// and into no more chunks than threads: each chunk's start-up (a heap or
// histogram of its own, a task's wake-up, the merge) must be paid for by a
// read long enough to hide it. (Chunks of 2^15 columns, four per thread,
// made one row of 10^6 up to 2.7x slower than a single thread.)
constexpr int64_t kMinChunk = 1 << 18;

// The driver every selecting variant shares. `select(r, start, end, keys)`
// must leave in `keys` the packed keys (Pack(Score(bits, largest), col), as
// WriteKeys reads them) of the min(k, end - start) best columns of
// [start, end) of row r, best first, and return a per-row
// statistic (or 0). Rows run in parallel; when there are fewer rows than
// threads, long rows are also cut into column chunks whose results are
// merged, so one long row uses the threads its length pays for.
template <typename Select>
kreg_status SelectRows(const TopKArgs& a, const kreg_host* host, Select&& select) {
  const int64_t batch = a.input->shape[0];
  int32_t* stats = a.stats ? RowPtr<int32_t>(a.stats, 0) : nullptr;
  const int threads = tbb::this_task_arena::max_concurrency();
  const uint32_t isa = HostIsa(host);
  if (batch >= threads || a.input->shape[1] < 2 * kMinChunk) {
    tbb::enumerable_thread_specific<std::vector<uint64_t>> per_thread;
    return ForEachRow(batch, host, [&](int64_t r) {
      std::vector<uint64_t>& keys = per_thread.local();
      int64_t start, end;
      RowRange(a, r, &start, &end);
      int32_t stat = select(r, start, end, keys);
      if (stats) stats[r] = stat;
      WriteKeys(a, r, keys, isa);
    });
  }
  for (int64_t r = 0; r < batch; ++r) {
    int64_t start, end;
    RowRange(a, r, &start, &end);
    const int64_t chunks = std::clamp<int64_t>((end - start) / kMinChunk, 1, threads);
    std::vector<std::vector<uint64_t>> parts(chunks);
    std::vector<int32_t> part_stats(chunks);
    kreg_status status = ForEachRow(chunks, host, [&](int64_t i) {
      const int64_t lo = start + (end - start) * i / chunks, hi = start + (end - start) * (i + 1) / chunks;
      part_stats[i] = select(r, lo, hi, parts[i]);
    });
    if (status != KREG_OK) return status;
    std::vector<uint64_t> keys;
    for (const std::vector<uint64_t>& part : parts) keys.insert(keys.end(), part.begin(), part.end());
    KeepBest(keys, a.k);
    if (stats) stats[r] = *std::max_element(part_stats.begin(), part_stats.end());
    WriteKeys(a, r, keys, isa);
  }
  return KREG_OK;
}

// The check every topk kernel shares: the args are topk's, and on the CPU
// (the only device these kernels speak). Sees shapes only.
inline kreg_status CheckTopK(const kreg_config*, const kreg_args* args, const kreg_host* host, char* msg,
                             size_t cap) {
  TopKArgs a;
  if (!MakeTopKArgs(args, &a, msg, cap)) return KREG_INVALID_ARGUMENT;
  if (host != nullptr && KREG_HAS_FIELD(host, kreg_host, device) && host->device != nullptr) {
    return Fail(KREG_UNIMPLEMENTED, msg, cap, "CPU kernel: host has a device backend");
  }
  for (size_t i = 0; i < kNumTensors; ++i) {
    if (args->tensors[i] != nullptr && args->tensors[i]->device.device_type != kDLCPU) {
      return Fail(KREG_UNIMPLEMENTED, msg, cap, "CPU kernel: a tensor is not on the CPU");
    }
  }
  return KREG_OK;
}

// A topk variant's body: the args already viewed.
using TopKBody = kreg_status (*)(const TopKArgs& a, const kreg_config* config, const kreg_host* host,
                                 char* msg, size_t cap);

// The kreg_kernel.run of a variant: CheckTopK, then Body with every
// exception caught.
template <TopKBody Body>
kreg_status GuardedRun(const kreg_config* config, const kreg_args* args, void* /*state*/, void* /*workspace*/,
                       size_t /*workspace_size*/, const kreg_host* host, char* msg, size_t cap) {
  return Guarded(msg, cap, [&] {
    if (kreg_status s = CheckTopK(config, args, host, msg, cap); s != KREG_OK) return s;
    TopKArgs a;
    MakeTopKArgs(args, &a, msg, cap);
    return Body(a, config, host, msg, cap);
  });
}

}  // namespace kreg::topk

#endif  // KREG_PLUGINS_TOPK_COMMON_H_
