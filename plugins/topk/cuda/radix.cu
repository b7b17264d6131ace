// topk/cuda_radix: radix select on a GPU (the TileLang seed's algorithm,
// seeds/001), made exact.
//
// Every element is a 64-bit key: its order-preserving score (kreg's order:
// NaN of either sign above +inf when largest and below -inf when smallest,
// -0 == +0) above the complement of its column, so keys are unique and a
// greater key is a better element, equal scores going to the lower column
// as on the CPU. The k-th best key is narrowed `bits` at a time from the
// top, histogrammed in shared memory, until the chosen bucket holds exactly
// the elements still missing from the top k (at the latest after the last
// bit, where buckets hold one key); the winners are then the keys whose
// bits above the cut are at least the chosen prefix.
//
// The seed's candidate buffer, made exact: with `capacity` > 0 the first
// round's bucket goes to shared memory in the gather pass that also takes
// every element above it, and the remaining rounds run there, so a row is
// read twice; a bucket that overflows the buffer (the seed dropped what did
// not fit) falls back to rounds over the row itself, as capacity 0 always
// does. Survivors (at most k, k <= 2048) are sorted in shared memory (a
// bitonic sort) and written best first; a ragged row with fewer than k
// elements is padded with column -1 and the worst value.
//
// Work per block: `rows_per_block` rows in turn; or, with `blocks_per_row`
// > 1, a long row split into that many parts, each part's top k found by a
// block of its own into scratch, then the top k of their union (which holds
// the row's: an element of the row's top k has fewer than k elements above
// it in its part) by one block per row.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels.h"

namespace kreg::cuda {
namespace {

// Keys as atomics and shared memory take them (uint64_t is unsigned long).
using Key = unsigned long long;
static_assert(sizeof(Key) == 8, "64-bit keys");

constexpr int kMaxK = 2048;         // survivors sorted in shared memory
constexpr int kMaxCapacity = 2048;  // the candidate buffer's largest size

__device__ __forceinline__ uint32_t OrderedKey(uint32_t u) {
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  u = u == 0x80000000u ? 0 : u;  // -0 is +0
  const uint32_t key = u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
  return nan ? 0xfffffffeu : key;
}

template <bool kBf16>
__device__ __forceinline__ uint32_t Bits(const void* row, int64_t c) {
  if (kBf16) return static_cast<uint32_t>(static_cast<const uint16_t*>(row)[c]) << 16;
  return static_cast<const uint32_t*>(row)[c];
}

// Scores are >= 1 (the lowest, a NaN's when smallest), so key 0 is below
// every element: the padding of a part shorter than k.
__device__ __forceinline__ Key Pack(uint32_t score, int64_t col) {
  return (static_cast<Key>(score) << 32) | (0xffffffffu - static_cast<uint32_t>(col));
}
__device__ __forceinline__ int64_t ColumnOf(Key key) { return 0xffffffffu - static_cast<uint32_t>(key); }

// A row's elements [lo, hi) as keys.
template <bool kBf16>
struct RowKeys {
  const void* row;
  int64_t lo, hi;
  uint32_t flip;  // all ones when smallest: the order reversed
  __device__ int64_t size() const { return hi - lo; }
  __device__ Key operator[](int64_t i) const {
    const int64_t c = lo + i;
    return Pack(OrderedKey(Bits<kBf16>(row, c)) ^ flip, c);
  }
};

// Keys already made (a part's survivors, the candidate buffer).
struct PackedKeys {
  const Key* keys;
  int64_t n;
  __device__ int64_t size() const { return n; }
  __device__ Key operator[](int64_t i) const { return keys[i]; }
};

struct Shared {
  int hist[256];
  // The cut so far: keys whose bits under `mask` exceed `prefix` win; of
  // those equal to it, `remaining` do; `done` once that is all of them.
  Key prefix, mask;
  int remaining, done, gt, ncand, rounds;
  Key keys[kMaxK];
  Key cand[kMaxCapacity];
};

template <int kBlock>
__device__ void Reset(Shared& s, int kk, int64_t n) {
  __syncthreads();  // the last row's readers are done
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.mask = 0;
    s.remaining = kk;
    s.done = kk >= n;  // everything wins
    s.gt = 0;
    s.ncand = 0;
    s.rounds = 0;
  }
  __syncthreads();
}

// Narrows the cut over src's keys, `bits` a round from bit `shift` down, for
// at most `max_rounds` rounds or until done.
template <int kBlock, class Src>
__device__ void Narrow(const Src& src, int bits, int shift, int max_rounds, Shared& s) {
  const int digits = 1 << bits;
  for (int round = 0; round < max_rounds && shift >= 0 && !s.done; ++round, shift -= bits) {
    for (int d = threadIdx.x; d < digits; d += kBlock) s.hist[d] = 0;
    __syncthreads();
    const Key prefix = s.prefix, mask = s.mask;
    for (int64_t i = threadIdx.x; i < src.size(); i += kBlock) {
      const Key key = src[i];
      if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & (digits - 1)], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int remaining = s.remaining, d = digits - 1;
      for (; d > 0 && s.hist[d] < remaining; --d) remaining -= s.hist[d];
      s.remaining = remaining;
      s.prefix = prefix | (static_cast<Key>(d) << shift);
      s.mask = mask | (static_cast<Key>(digits - 1) << shift);
      s.done = s.hist[d] == remaining;
      ++s.rounds;
    }
    __syncthreads();
  }
}

// Appends src's winners (bits under the mask at least the prefix) to keys.
template <int kBlock, class Src>
__device__ void TakeWinners(const Src& src, Shared& s) {
  const Key prefix = s.prefix, mask = s.mask;
  for (int64_t i = threadIdx.x; i < src.size(); i += kBlock) {
    const Key key = src[i];
    if ((key & mask) >= prefix) s.keys[atomicAdd(&s.gt, 1)] = key;
  }
  __syncthreads();
}

// The kk best keys of src into s.keys[0, kk), in no order.
template <int kBlock, class Src>
__device__ void SelectBest(const Src& src, int kk, int bits, int capacity, Shared& s) {
  Reset<kBlock>(s, kk, src.size());
  if (kk == 0) return;
  const int first = 64 - bits;
  if (capacity > 0 && !s.done) {
    Narrow<kBlock>(src, bits, first, 1, s);
    if (!s.done) {
      // Everything above the bucket wins; the bucket goes to the buffer.
      const Key prefix = s.prefix, mask = s.mask;
      for (int64_t i = threadIdx.x; i < src.size(); i += kBlock) {
        const Key key = src[i];
        if ((key & mask) > prefix) {
          s.keys[atomicAdd(&s.gt, 1)] = key;
        } else if ((key & mask) == prefix) {
          const int at = atomicAdd(&s.ncand, 1);
          if (at < capacity) s.cand[at] = key;
        }
      }
      __syncthreads();
      if (s.ncand <= capacity) {
        const PackedKeys cand{s.cand, s.ncand};
        Narrow<kBlock>(cand, bits, first - bits, 64, s);
        TakeWinners<kBlock>(cand, s);
        return;
      }
      // Overflow: the rounds over the row itself, from the start.
      Reset<kBlock>(s, kk, src.size());
    }
  }
  Narrow<kBlock>(src, bits, first, 64, s);
  TakeWinners<kBlock>(src, s);
}

// Sorts s.keys[0, kk) descending (bitonic over the next power of two,
// padded with keys below every real one).
template <int kBlock>
__device__ void SortKeys(Shared& s, int kk) {
  int size = 1;
  while (size < kk) size <<= 1;
  for (int i = kk + threadIdx.x; i < size; i += kBlock) s.keys[i] = 0;
  __syncthreads();
  for (int width = 2; width <= size; width <<= 1) {
    for (int stride = width >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < size; i += kBlock) {
        const int j = i ^ stride;
        if (j > i) {
          const bool descending = (i & width) == 0;
          const Key x = s.keys[i], y = s.keys[j];
          if ((x < y) == descending) {
            s.keys[i] = y;
            s.keys[j] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Row r's output from its kk survivors: best first, the tail of a short row
// column -1 and the worst value.
template <int kBlock, bool kBf16>
__device__ void WriteRow(const RadixArgs& a, int64_t r, const void* row, int kk, Shared& s) {
  SortKeys<kBlock>(s, kk);
  int32_t* idx = a.indices + r * a.indices_stride;
  const uint32_t worst = a.largest ? 0xff800000u : 0x7f800000u;  // -inf : +inf
  for (int j = threadIdx.x; j < a.k; j += kBlock) {
    const int64_t col = j < kk ? ColumnOf(s.keys[j]) : -1;
    idx[j] = static_cast<int32_t>(col);
    if (kBf16) {
      uint16_t* val = static_cast<uint16_t*>(a.values) + r * a.values_stride;
      val[j] = col >= 0 ? static_cast<const uint16_t*>(row)[col] : static_cast<uint16_t>(worst >> 16);
    } else {
      uint32_t* val = static_cast<uint32_t*>(a.values) + r * a.values_stride;
      val[j] = col >= 0 ? static_cast<const uint32_t*>(row)[col] : worst;
    }
  }
  if (a.stats != nullptr && threadIdx.x == 0) a.stats[r * a.stats_stride] = s.rounds;
}

struct RowRange {
  const void* row;
  int64_t lo, hi;
};

template <bool kBf16>
__device__ RowRange RangeOf(const RadixArgs& a, int64_t r) {
  const void* row = static_cast<const char*>(a.input) + r * a.input_stride * (kBf16 ? 2 : 4);
  // Clamped to [0, n]: ranges of arrays already on the device reach the
  // kernel unvalidated (the host cannot read them without waiting).
  int64_t lo = a.row_starts != nullptr ? a.row_starts[r * a.starts_stride] : 0;
  int64_t hi = a.row_ends != nullptr ? a.row_ends[r * a.ends_stride] : a.n;
  lo = lo < 0 ? 0 : lo > a.n ? a.n : lo;
  hi = hi < lo ? lo : hi > a.n ? a.n : hi;
  return {row, lo, hi};
}

// Whole rows: block b takes rows b * rows_per_block, ... in turn.
template <int kBlock, bool kBf16>
__global__ void __launch_bounds__(kBlock) WholeRows(RadixArgs a) {
  __shared__ Shared s;
  for (int i = 0; i < a.rows_per_block; ++i) {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * a.rows_per_block + i;
    if (r >= a.batch) return;
    const RowRange range = RangeOf<kBf16>(a, r);
    const RowKeys<kBf16> src{range.row, range.lo, range.hi, a.largest ? 0u : 0xffffffffu};
    const int kk = static_cast<int>(src.size() < a.k ? src.size() : a.k);
    SelectBest<kBlock>(src, kk, a.bits, a.capacity, s);
    WriteRow<kBlock, kBf16>(a, r, range.row, kk, s);
  }
}

// A split row's part (blockIdx.x of blocks_per_row; row blockIdx.y): its
// top k into scratch[row][part * k, ...), padded with key 0.
template <int kBlock, bool kBf16>
__global__ void __launch_bounds__(kBlock) RowParts(RadixArgs a, Key* scratch) {
  __shared__ Shared s;
  const int64_t r = blockIdx.y;
  const RowRange range = RangeOf<kBf16>(a, r);
  const int64_t part = (range.hi - range.lo + a.blocks_per_row - 1) / a.blocks_per_row;
  const int64_t lo = range.lo + blockIdx.x * part;
  const int64_t hi = lo + part < range.hi ? lo + part : range.hi;
  const RowKeys<kBf16> src{range.row, lo, hi > lo ? hi : lo, a.largest ? 0u : 0xffffffffu};
  const int kk = static_cast<int>(src.size() < a.k ? src.size() : a.k);
  SelectBest<kBlock>(src, kk, a.bits, a.capacity, s);
  Key* out = scratch + (r * a.blocks_per_row + blockIdx.x) * a.k;
  for (int j = threadIdx.x; j < a.k; j += kBlock) out[j] = j < kk ? s.keys[j] : 0;
}

// A split row's answer: the top k of its parts' survivors.
template <int kBlock, bool kBf16>
__global__ void __launch_bounds__(kBlock) JoinParts(RadixArgs a, const Key* scratch) {
  __shared__ Shared s;
  const int64_t r = blockIdx.x;
  const RowRange range = RangeOf<kBf16>(a, r);
  const PackedKeys src{scratch + r * a.blocks_per_row * a.k, a.blocks_per_row * a.k};
  const int64_t len = range.hi - range.lo;
  const int kk = static_cast<int>(len < a.k ? len : a.k);
  SelectBest<kBlock>(src, kk, a.bits, a.capacity, s);
  WriteRow<kBlock, kBf16>(a, r, range.row, kk, s);
}

template <int kBlock, bool kBf16>
cudaError_t LaunchWith(const RadixArgs& a, Key* scratch, cudaStream_t stream) {
  if (a.blocks_per_row <= 1) {
    const int64_t blocks = (a.batch + a.rows_per_block - 1) / a.rows_per_block;
    WholeRows<kBlock, kBf16><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(a);
    return cudaGetLastError();
  }
  const dim3 parts(static_cast<unsigned>(a.blocks_per_row), static_cast<unsigned>(a.batch));
  RowParts<kBlock, kBf16><<<parts, kBlock, 0, stream>>>(a, scratch);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  JoinParts<kBlock, kBf16><<<static_cast<unsigned>(a.batch), kBlock, 0, stream>>>(a, scratch);
  return cudaGetLastError();
}

template <int kBlock>
cudaError_t LaunchBlock(const RadixArgs& a, Key* scratch, cudaStream_t stream) {
  return a.bf16 ? LaunchWith<kBlock, true>(a, scratch, stream) : LaunchWith<kBlock, false>(a, scratch, stream);
}

}  // namespace

int RadixMaxK() { return kMaxK; }
int RadixMaxCapacity() { return kMaxCapacity; }

int LaunchRadixTopK(const RadixArgs& a, const kreg_device& device, char* msg, size_t cap) {
  if (a.batch == 0 || a.k == 0) return 0;
  // This plugin's runtime is its own (linked statically): it launches on
  // the host's device and stream.
  cudaError_t e = cudaSetDevice(device.ordinal);
  if (e != cudaSuccess) {
    std::snprintf(msg, cap, "topk/cuda_radix: cudaSetDevice(%d): %s", device.ordinal, cudaGetErrorString(e));
    return 1;
  }
  void* scratch = nullptr;
  if (a.blocks_per_row > 1) {
    scratch = device.alloc(device.ctx, static_cast<size_t>(a.batch * a.blocks_per_row * a.k) * sizeof(Key));
    if (scratch == nullptr) {
      std::snprintf(msg, cap, "topk/cuda_radix: out of device memory for %lld rows' parts",
                    static_cast<long long>(a.batch));
      return 1;
    }
  }
  const auto s = static_cast<cudaStream_t>(device.stream);
  auto* parts = static_cast<Key*>(scratch);
  e = cudaErrorInvalidValue;
  switch (a.block) {
    case 256:
      e = LaunchBlock<256>(a, parts, s);
      break;
    case 512:
      e = LaunchBlock<512>(a, parts, s);
      break;
    case 1024:
      e = LaunchBlock<1024>(a, parts, s);
      break;
  }
  if (scratch != nullptr) device.free(device.ctx, scratch);  // stream-ordered: after the kernels
  if (e == cudaSuccess) return 0;
  std::snprintf(msg, cap, "launching topk/cuda_radix: %s", cudaGetErrorString(e));
  return 1;
}

}  // namespace kreg::cuda
