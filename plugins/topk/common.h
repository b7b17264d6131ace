// Shared by the topk variants: row access, kreg's order as integer keys,
// output writing and the row-parallel driver. Plugin-private; speaks only the
// ABI header.
#ifndef KREG_PLUGINS_TOPK_COMMON_H_
#define KREG_PLUGINS_TOPK_COMMON_H_

#include <cstdint>
#include <cstdio>
#include <cstring>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <atomic>

#include "kreg/plugin_abi.h"

namespace kreg::topk {

template <typename T>
inline T* RowPtr(const DLTensor* t, int64_t r) {
  int64_t stride = t->strides ? t->strides[0] : (t->ndim == 2 ? t->shape[1] : 1);
  return reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset) + r * stride;
}

inline bool IsBf16(const kreg_topk_args& a) { return a.input->dtype.code == kDLBfloat; }

// The column range [start, end) of row r.
inline void RowRange(const kreg_topk_args& a, int64_t r, int64_t* start, int64_t* end) {
  *start = a.row_starts ? RowPtr<const int32_t>(a.row_starts, 0)[r] : 0;
  *end = a.row_ends ? RowPtr<const int32_t>(a.row_ends, 0)[r] : a.input->shape[1];
}

// Maps float32 bits onto uint32 so that unsigned order is kreg's value order:
// every NaN maps to the top, -0 and +0 to the same key.
inline uint32_t OrderedKey(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A score where larger is better: the key, or its complement when smallest.
inline uint32_t Score(uint32_t float_bits, bool largest) {
  uint32_t key = OrderedKey(float_bits);
  return largest ? key : ~key;
}

// Bits of element c of a row as float32 bits (bf16 widened).
inline uint32_t FloatBits(const void* row, bool bf16, int64_t c) {
  if (bf16) return static_cast<uint32_t>(static_cast<const uint16_t*>(row)[c]) << 16;
  uint32_t u;
  std::memcpy(&u, static_cast<const char*>(row) + 4 * c, 4);
  return u;
}

// Row r of the input, as float32 or bf16 elements.
inline const void* InputRow(const kreg_topk_args& a, int64_t r) {
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

// Writes row r's result: `count` columns best first, then -1 padding with the
// worst value up to k.
inline void WriteRow(const kreg_topk_args& a, int64_t r, const int32_t* cols, int64_t count) {
  int32_t* idx = RowPtr<int32_t>(a.indices, r);
  const bool bf16 = IsBf16(a);
  const uint32_t worst = a.largest ? 0xff800000u : 0x7f800000u;  // -inf : +inf
  if (bf16) {
    const uint16_t* in = RowPtr<const uint16_t>(a.input, r);
    uint16_t* val = RowPtr<uint16_t>(a.values, r);
    for (int64_t j = 0; j < count; ++j) val[j] = in[cols[j]];
    for (int64_t j = count; j < a.k; ++j) val[j] = static_cast<uint16_t>(worst >> 16);
  } else {
    const uint32_t* in = RowPtr<const uint32_t>(a.input, r);
    uint32_t* val = RowPtr<uint32_t>(a.values, r);
    for (int64_t j = 0; j < count; ++j) val[j] = in[cols[j]];
    for (int64_t j = count; j < a.k; ++j) val[j] = worst;
  }
  if (idx != cols) std::memmove(idx, cols, sizeof(int32_t) * count);
  for (int64_t j = count; j < a.k; ++j) idx[j] = -1;
}

inline bool Cancelled(const kreg_host* host) {
  return host != nullptr && host->cancelled != nullptr && host->cancelled(host->ctx);
}

// Runs fn(r) for every row, rows in parallel on oneTBB, honouring
// host->num_threads and cancellation. Returns KREG_CANCELLED if stopped.
template <typename Fn>
kreg_status ForEachRow(int64_t batch, const kreg_host* host, Fn&& fn) {
  std::atomic<bool> stop{false};
  auto body = [&] {
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
  };
  if (host != nullptr && host->num_threads > 0) {
    tbb::task_arena arena(host->num_threads);
    arena.execute(body);
  } else {
    body();
  }
  return stop ? KREG_CANCELLED : KREG_OK;
}

inline kreg_status Fail(kreg_status code, char* msg, size_t cap, const char* text) {
  std::snprintf(msg, cap, "%s", text);
  return code;
}

}  // namespace kreg::topk

#endif  // KREG_PLUGINS_TOPK_COMMON_H_
