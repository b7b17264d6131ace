// topk/cuda_radix: radix select on a GPU (the TileLang seed's algorithm,
// seeds/001), one block per row, made exact.
//
// Each element's order-preserving 32-bit score (kreg's: NaN of either sign
// above +inf when largest and below -inf when smallest, -0 == +0) is
// histogrammed `bits` at a time from the top, in shared memory, keeping the
// bucket that holds the k-th best, until the k-th best score T is known
// exactly, with how many elements equal to it are in the top k. A last pass
// gathers the elements above T (in any order) and the first of those equal
// to T by column (a block scan keeps their column order), so ties go to the
// lower column as on the CPU. The seed's 4096-slot candidate buffer, which
// overflowed silently, is gone: the candidates are at most k by
// construction. The k survivors are sorted in shared memory (a bitonic sort
// of (score, column) keys) and written best first; a ragged row with fewer
// than k elements is padded with column -1 and the worst value.
//
// Reads each row 32 / bits + 1 times (5 with bits=8): exact first; one
// block per row leaves SMs idle on few rows (a row split across blocks is
// the next step).
#include <cuda_runtime.h>
#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <cstdio>

#include "kernels.h"

namespace kreg::cuda {
namespace {

constexpr int kMaxK = 2048;  // the survivors sorted in shared memory

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

template <bool kBf16>
__device__ __forceinline__ uint32_t ScoreAt(const void* row, int64_t c, uint32_t flip) {
  return OrderedKey(Bits<kBf16>(row, c)) ^ flip;
}

template <int kBlock, bool kBf16>
__global__ void __launch_bounds__(kBlock) RadixTopK(RadixArgs a) {
  using Scan = cub::BlockScan<int, kBlock>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_remaining, s_gt, s_eq_base;
  __shared__ uint64_t keys[kMaxK];

  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x;
  const void* row = static_cast<const char*>(a.input) + r * a.input_stride * (kBf16 ? 2 : 4);
  const int64_t lo = a.row_starts != nullptr ? a.row_starts[r * a.starts_stride] : 0;
  const int64_t hi = a.row_ends != nullptr ? a.row_ends[r * a.ends_stride] : a.n;
  const int64_t len = hi > lo ? hi - lo : 0;
  const int kk = static_cast<int>(len < a.k ? len : a.k);
  const uint32_t flip = a.largest ? 0u : 0xffffffffu;
  const int digits = 1 << a.bits;

  if (tid == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_remaining = kk;
  }
  __syncthreads();
  // The kk-th best score, `bits` at a time from the top.
  for (int shift = 32 - a.bits; kk > 0 && shift >= 0; shift -= a.bits) {
    for (int d = tid; d < digits; d += kBlock) hist[d] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix, mask = s_mask;
    for (int64_t c = lo + tid; c < hi; c += kBlock) {
      const uint32_t s = ScoreAt<kBf16>(row, c, flip);
      if ((s & mask) == prefix) atomicAdd(&hist[(s >> shift) & (digits - 1)], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int remaining = s_remaining, d = digits - 1;
      for (; d > 0 && hist[d] < remaining; --d) remaining -= hist[d];
      s_remaining = remaining;  // of the chosen bucket, how many belong to the top
      s_prefix = prefix | (static_cast<uint32_t>(d) << shift);
      s_mask = mask | (static_cast<uint32_t>(digits - 1) << shift);
    }
    __syncthreads();
  }
  const uint32_t t = s_prefix;      // the kk-th best score
  const int take_eq = s_remaining;  // how many equal to it are in the top kk
  if (tid == 0) {
    s_gt = 0;
    s_eq_base = 0;
  }
  __syncthreads();
  // Gather: everything above t, and the first take_eq equal to it by column.
  for (int64_t base = lo; kk > 0 && base < hi; base += kBlock) {
    const int64_t c = base + tid;
    const uint32_t s = c < hi ? ScoreAt<kBf16>(row, c, flip) : 0;
    const bool in = c < hi;
    const uint64_t packed = (static_cast<uint64_t>(s) << 32) | (0xffffffffu - static_cast<uint32_t>(c));
    if (in && s > t) keys[atomicAdd(&s_gt, 1)] = packed;
    int rank = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(in && s == t ? 1 : 0, rank, total);
    const int eq_base = s_eq_base;
    if (in && s == t && eq_base + rank < take_eq) keys[(kk - take_eq) + eq_base + rank] = packed;
    __syncthreads();  // s_eq_base read by all, scan storage reused
    if (tid == 0) s_eq_base = eq_base + total;
    __syncthreads();
  }
  // Sort the kk keys descending: a bitonic sort over the next power of two,
  // padded with keys below every real one.
  int size = 1;
  while (size < kk) size <<= 1;
  for (int i = kk + tid; i < size; i += kBlock) keys[i] = 0;
  __syncthreads();
  for (int width = 2; width <= size; width <<= 1) {
    for (int stride = width >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < size; i += kBlock) {
        const int j = i ^ stride;
        if (j > i) {
          const bool descending = (i & width) == 0;
          const uint64_t x = keys[i], y = keys[j];
          if ((x < y) == descending) {
            keys[i] = y;
            keys[j] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  // Best first; the tail of a short row: column -1 and the worst value.
  int32_t* idx = a.indices + r * a.indices_stride;
  const uint32_t worst = a.largest ? 0xff800000u : 0x7f800000u;  // -inf : +inf
  for (int j = tid; j < a.k; j += kBlock) {
    const int64_t col = j < kk ? static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(keys[j])) : -1;
    idx[j] = static_cast<int32_t>(col);
    if (kBf16) {
      uint16_t* val = static_cast<uint16_t*>(a.values) + r * a.values_stride;
      val[j] = col >= 0 ? static_cast<const uint16_t*>(row)[col] : static_cast<uint16_t>(worst >> 16);
    } else {
      uint32_t* val = static_cast<uint32_t*>(a.values) + r * a.values_stride;
      val[j] = col >= 0 ? static_cast<const uint32_t*>(row)[col] : worst;
    }
  }
  if (a.stats != nullptr && tid == 0) a.stats[r * a.stats_stride] = (32 + a.bits - 1) / a.bits;  // radix rounds
}

template <int kBlock>
cudaError_t LaunchWith(const RadixArgs& a, cudaStream_t stream) {
  if (a.bf16) {
    RadixTopK<kBlock, true><<<static_cast<unsigned>(a.batch), kBlock, 0, stream>>>(a);
  } else {
    RadixTopK<kBlock, false><<<static_cast<unsigned>(a.batch), kBlock, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

int RadixMaxK() { return kMaxK; }

int LaunchRadixTopK(const RadixArgs& a, int ordinal, void* stream, char* msg, size_t cap) {
  if (a.batch == 0 || a.k == 0) return 0;
  // This plugin's runtime is its own (linked statically): it launches on
  // the host's device and stream.
  cudaError_t e = cudaSetDevice(ordinal);
  if (e != cudaSuccess) {
    std::snprintf(msg, cap, "topk/cuda_radix: cudaSetDevice(%d): %s", ordinal, cudaGetErrorString(e));
    return 1;
  }
  e = cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.block) {
    case 256:
      e = LaunchWith<256>(a, s);
      break;
    case 512:
      e = LaunchWith<512>(a, s);
      break;
    case 1024:
      e = LaunchWith<1024>(a, s);
      break;
  }
  if (e == cudaSuccess) return 0;
  std::snprintf(msg, cap, "launching topk/cuda_radix: %s", cudaGetErrorString(e));
  return 1;
}

}  // namespace kreg::cuda
