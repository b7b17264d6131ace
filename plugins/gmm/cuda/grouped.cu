// gmm/cuda_grouped and tgmm/cuda_grouped: kreg's own grouped matmuls on
// tensor cores (bf16 in, f32 accumulate, WMMA 16x16x16), after the megablox
// seed (seeds/002): one tile list across every local group.
//
// A plan kernel reads group_sizes on the device (no copy to the host, no
// synchronisation) and lays out every tile of every local group in one
// index space: gmm's tiles are a group's rows in blocks of tm (a group's
// last block may be short; a block never spans two groups) by n in blocks
// of tn; tgmm's are k by n, the same for every group. A persistent grid
// (a few blocks per SM) walks that space, so a small expert's tiles run
// beside a large one's instead of leaving SMs idle behind a per-group
// launch. Each tile: 4 warps (2 x 2), the reduction in chunks of 32 staged
// in shared memory (zero past the edges), results stored with the edges
// masked. gmm's rows outside the local groups get existing_out or zero
// from a fill kernel; tgmm's empty groups get zeros (a tile with nothing
// to reduce).
//
// Loads are element-wise (coalesced along the contiguous dimension):
// exact first; vector loads and a double-buffered pipeline are the next
// steps for speed.
//
// Non-finite results are the reference's, as on the CPU (tiled.cc): where
// a float accumulator comes out NaN or infinite (an input was, or a float
// product or partial sum overflowed), that element is recomputed as the
// reference computes it, a double sum in the reference's order rounded
// once, so infinities keep the reference's sign and no overflow happens
// that double would not have. FixNonFinite does the same after cuBLAS,
// whose accumulators are not seen: it scans the output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <cstdio>

#include "kernels.h"

namespace kreg::cuda {
namespace {

using namespace nvcuda;

constexpr int kTk = 32;      // reduction chunk
constexpr int kWarps = 4;    // 2 x 2 over the tile
constexpr int kThreads = 32 * kWarps;
constexpr int kBlocksPerSm = 4;

// The plan in device scratch: [0] the local groups' first row, [1] the row
// after them, [2] the tile count; then per local group its tiles' end
// (cumulative), first row and row count.
struct Plan {
  int64_t* p;
  int64_t local;
  __device__ int64_t& lo() { return p[0]; }
  __device__ int64_t& hi() { return p[1]; }
  __device__ int64_t& total() { return p[2]; }
  __device__ int64_t& tile_end(int64_t i) { return p[3 + i]; }
  __device__ int64_t& row_start(int64_t i) { return p[3 + local + i]; }
  __device__ int64_t& row_count(int64_t i) { return p[3 + 2 * local + i]; }
};
inline size_t PlanBytes(int64_t local) { return static_cast<size_t>(3 + 3 * local) * sizeof(int64_t); }

// Group g's size clamped (negative to 0, none past m) for a group starting
// at row `start`, so a bad table the host did not validate cannot write out
// of bounds.
__device__ __forceinline__ int64_t ClampedSize(const GroupedArgs& a, int64_t g, int64_t start) {
  const int64_t s = a.group_sizes[g] < 0 ? 0 : a.group_sizes[g];
  return s > a.m - start ? a.m - start : s;
}

// One thread: group sizes are few.
__global__ void PlanKernel(GroupedArgs a, int64_t tiles_n, int64_t tiles_k, Plan plan) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int64_t start = 0;
  for (int64_t g = 0; g < a.group_offset; ++g) start += ClampedSize(a, g, start);
  plan.lo() = start;
  int64_t tiles = 0;
  for (int64_t i = 0; i < a.local_groups; ++i) {
    const int64_t s = ClampedSize(a, a.group_offset + i, start);
    plan.row_start(i) = start;
    plan.row_count(i) = s;
    tiles += a.tgmm ? tiles_k * tiles_n : (s + a.tm - 1) / a.tm * tiles_n;
    plan.tile_end(i) = tiles;
    start += s;
  }
  plan.hi() = start;
  plan.total() = tiles;
}

__device__ __forceinline__ float LoadF(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void StoreF(void* p, bool bf16, int64_t i, float v) {
  if (bf16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// The reference's result for one element, rounded once to out's dtype
// (plugins/gmm/reference.cc): products of float values are exact in
// double, summed in order. bf16: rounded to odd in float first, so the
// rounding on to bf16 is the single correct rounding of the double.
__device__ void StoreExact(void* p, bool bf16, int64_t i, double d) {
  if (!bf16) {
    static_cast<float*>(p)[i] = static_cast<float>(d);
    return;
  }
  float f = __double2float_rz(d);
  if (!isnan(d) && static_cast<double>(f) != d) f = __uint_as_float(__float_as_uint(f) | 1u);
  static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(f);
}
// gmm: sum over p of lhs(row, p) * rhs_g(p, col).
__device__ double GmmExact(const GroupedArgs& a, const void* rhs, int64_t row, int64_t col) {
  double d = 0;
  for (int64_t p = 0; p < a.k; ++p) {
    d += static_cast<double>(LoadF(a.lhs, a.in_bf16, row * a.lhs_ld + p)) *
         LoadF(rhs, a.in_bf16, a.transpose_rhs ? col * a.rhs_ld + p : p * a.rhs_ld + col);
  }
  return d;
}
// tgmm: sum over the group's rows j of lhs(kr, first + j) * rhs(first + j, col).
__device__ double TgmmExact(const GroupedArgs& a, int64_t first, int64_t rows, int64_t kr, int64_t col) {
  double d = 0;
  for (int64_t j = first; j < first + rows; ++j) {
    d += static_cast<double>(LoadF(a.lhs, a.in_bf16, kr * a.lhs_ld + j)) * LoadF(a.rhs, a.in_bf16, j * a.rhs_ld + col);
  }
  return d;
}
__device__ __forceinline__ bool NonFinite(const void* p, bool bf16, int64_t i) {
  return bf16 ? (__bfloat16_as_ushort(static_cast<const __nv_bfloat16*>(p)[i]) & 0x7f80u) == 0x7f80u
              : !isfinite(static_cast<const float*>(p)[i]);
}

// gmm's rows outside the local groups: existing_out, or zero.
__global__ void FillOutside(GroupedArgs a, Plan plan) {
  const int64_t lo = plan.lo(), hi = plan.hi();
  const int64_t outside = a.m - (hi - lo);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < outside * a.n;
       e += int64_t{gridDim.x} * blockDim.x) {
    int64_t r = e / a.n;
    const int64_t c = e % a.n;
    if (r >= lo) r += hi - lo;
    const float v = a.existing != nullptr ? LoadF(a.existing, a.out_bf16, r * a.existing_ld + c) : 0.0f;
    StoreF(a.out, a.out_bf16, r * a.out_ld + c, v);
  }
}

template <int TM, int TN>
struct alignas(128) Smem {
  __nv_bfloat16 a[TM][kTk + 8];  // padded rows: fewer bank conflicts, ldm a multiple of 8
  __nv_bfloat16 b[kTk][TN + 8];
  float c[kWarps][16 * 16];      // one fragment per warp on its way out
};

__device__ __forceinline__ __nv_bfloat16 Bf16At(const void* p, int64_t i) {
  return static_cast<const __nv_bfloat16*>(p)[i];
}

// One tile: C[TM x TN] = sum over chunks of A[TM x kTk] . B[kTk x TN], where
// load_a(r, kk, chunk) and load_b(kk, c, chunk) give the chunk's elements
// (zero past the edges); then store(r, c, value) for every element of the
// tile (the caller masks the edges).
template <int TM, int TN, typename LoadA, typename LoadB, typename Store>
__device__ void Tile(Smem<TM, TN>& s, int64_t reduction, const LoadA& load_a, const LoadB& load_b,
                     bool b_along_k, const Store& store) {
  constexpr int WM = TM / 2, WN = TN / 2, FM = WM / 16, FN = WN / 16;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i) {
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  for (int64_t chunk = 0; chunk < reduction; chunk += kTk) {
    for (int e = tid; e < TM * kTk; e += kThreads) s.a[e / kTk][e % kTk] = load_a(e / kTk, e % kTk, chunk);
    if (b_along_k) {  // rhs transposed: k is its contiguous dimension
      for (int e = tid; e < kTk * TN; e += kThreads) s.b[e % kTk][e / kTk] = load_b(e % kTk, e / kTk, chunk);
    } else {
      for (int e = tid; e < kTk * TN; e += kThreads) s.b[e / TN][e % TN] = load_b(e / TN, e % TN, chunk);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTk; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], &s.a[wm * WM + i * 16][kk], kTk + 8);
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        wmma::load_matrix_sync(fb, &s.b[kk][wn * WN + j * 16], TN + 8);
#pragma unroll
        for (int i = 0; i < FM; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < FM; ++i) {
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(s.c[warp], acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) store(wm * WM + i * 16 + e / 16, wn * WN + j * 16 + e % 16, s.c[warp][e]);
      __syncwarp();
    }
  }
}

// The local group holding tile t (the first whose tiles end past it).
__device__ __forceinline__ int64_t GroupOf(Plan& plan, int64_t t) {
  int64_t lo = 0, hi = plan.local - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (plan.tile_end(mid) > t) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

template <int TM, int TN>
__global__ void __launch_bounds__(kThreads) GmmTiles(GroupedArgs a, int64_t tiles_n, Plan plan) {
  __shared__ Smem<TM, TN> s;
  const int64_t total = plan.total();
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const int64_t g = GroupOf(plan, t);
    const int64_t local_t = t - (g > 0 ? plan.tile_end(g - 1) : 0);
    const int64_t row0 = plan.row_start(g) + local_t / tiles_n * TM;
    const int64_t row_end = plan.row_start(g) + plan.row_count(g);
    const int64_t col0 = local_t % tiles_n * TN;
    const void* rhs = static_cast<const char*>(a.rhs) + g * a.rhs_group_stride * 2;
    auto load_a = [&](int r, int kk, int64_t chunk) {
      const int64_t row = row0 + r, k = chunk + kk;
      return row < row_end && k < a.k ? Bf16At(a.lhs, row * a.lhs_ld + k) : __float2bfloat16(0.0f);
    };
    auto load_b = [&](int kk, int c, int64_t chunk) {
      const int64_t k = chunk + kk, col = col0 + c;
      if (k >= a.k || col >= a.n) return __float2bfloat16(0.0f);
      return Bf16At(rhs, a.transpose_rhs ? col * a.rhs_ld + k : k * a.rhs_ld + col);
    };
    auto store = [&](int r, int c, float v) {
      const int64_t row = row0 + r, col = col0 + c;
      if (row >= row_end || col >= a.n) return;
      const float e = a.existing != nullptr ? LoadF(a.existing, a.out_bf16, row * a.existing_ld + col) : 0.0f;
      if (isfinite(v)) {
        StoreF(a.out, a.out_bf16, row * a.out_ld + col, v + e);
      } else {
        StoreExact(a.out, a.out_bf16, row * a.out_ld + col, GmmExact(a, rhs, row, col) + e);
      }
    };
    Tile<TM, TN>(s, a.k, load_a, load_b, a.transpose_rhs, store);
  }
}

template <int TM, int TN>
__global__ void __launch_bounds__(kThreads) TgmmTiles(GroupedArgs a, int64_t tiles_n, int64_t tiles_k, Plan plan) {
  __shared__ Smem<TM, TN> s;
  const int64_t total = plan.total();
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const int64_t g = t / (tiles_k * tiles_n), local_t = t % (tiles_k * tiles_n);
    const int64_t first = plan.row_start(g), rows = plan.row_count(g);
    const int64_t k0 = local_t / tiles_n * TM, col0 = local_t % tiles_n * TN;
    // out[g][kr][c] = sum over the group's rows j of lhs[kr][first + j] . rhs[first + j][c]
    auto load_a = [&](int r, int jj, int64_t chunk) {
      const int64_t kr = k0 + r, j = chunk + jj;
      return kr < a.k && j < rows ? Bf16At(a.lhs, kr * a.lhs_ld + first + j) : __float2bfloat16(0.0f);
    };
    auto load_b = [&](int jj, int c, int64_t chunk) {
      const int64_t j = chunk + jj, col = col0 + c;
      return j < rows && col < a.n ? Bf16At(a.rhs, (first + j) * a.rhs_ld + col) : __float2bfloat16(0.0f);
    };
    char* out = static_cast<char*>(a.out) + g * a.out_group_stride * (a.out_bf16 ? 2 : 4);
    auto store = [&](int r, int c, float v) {
      const int64_t kr = k0 + r, col = col0 + c;
      if (kr >= a.k || col >= a.n) return;
      if (isfinite(v)) {
        StoreF(out, a.out_bf16, kr * a.out_ld + col, v);
      } else {
        StoreExact(out, a.out_bf16, kr * a.out_ld + col, TgmmExact(a, first, rows, kr, col));
      }
    };
    Tile<TM, TN>(s, rows, load_a, load_b, false, store);
  }
}

// Local group i's rows (clamped as the plan kernel clamps them), walked
// from group_sizes: for FixNonFinite's rare non-finite elements only.
__device__ void LocalGroupRows(const GroupedArgs& a, int64_t i, int64_t* first, int64_t* rows) {
  int64_t start = 0;
  for (int64_t g = 0; g < a.group_offset + i; ++g) start += ClampedSize(a, g, start);
  *first = start;
  *rows = ClampedSize(a, a.group_offset + i, start);
}
// The local group holding gmm's row `row` (one of the local groups' rows).
__device__ int64_t LocalGroupOf(const GroupedArgs& a, int64_t row) {
  int64_t start = 0;
  for (int64_t g = 0; g < a.group_offset + a.local_groups; ++g) {
    start += ClampedSize(a, g, start);
    if (g >= a.group_offset && row < start) return g - a.group_offset;
  }
  return a.local_groups - 1;
}

// After cuBLAS: every non-finite element of the local groups' output
// recomputed as the reference's (existing_out added in double). A block a
// row (gmm: rows [lo, hi); tgmm: every local group's k rows), its threads
// along the row.
__global__ void FixNonFiniteKernel(GroupedArgs a, int64_t lo, int64_t hi) {
  const int64_t rows = a.tgmm ? a.local_groups * a.k : hi - lo;
  const size_t out_size = a.out_bf16 ? 2 : 4;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t g = a.tgmm ? r / a.k : 0, row = a.tgmm ? r % a.k : lo + r;
    char* out = static_cast<char*>(a.out) + (g * a.out_group_stride + row * a.out_ld) * out_size;
    for (int64_t col = threadIdx.x; col < a.n; col += blockDim.x) {
      if (!NonFinite(out, a.out_bf16, col)) continue;
      double d;
      if (a.tgmm) {
        int64_t first, count;
        LocalGroupRows(a, g, &first, &count);
        d = TgmmExact(a, first, count, row, col);
      } else {
        const int64_t local = LocalGroupOf(a, row);
        d = GmmExact(a, static_cast<const char*>(a.rhs) + local * a.rhs_group_stride * (a.in_bf16 ? 2 : 4), row, col);
        if (a.existing != nullptr) d += LoadF(a.existing, a.out_bf16, row * a.existing_ld + col);
      }
      StoreExact(out, a.out_bf16, col, d);
    }
  }
}

template <int TM, int TN>
cudaError_t LaunchTiles(const GroupedArgs& a, int64_t tiles_n, int64_t tiles_k, Plan plan, cudaStream_t stream) {
  // At most every tile a block (bounded by m / tm + local groups for gmm),
  // at most a few blocks per SM: the rest loop.
  const int64_t bound = a.tgmm ? a.local_groups * tiles_k * tiles_n : (a.m / TM + a.local_groups) * tiles_n;
  int64_t blocks = int64_t{a.num_sms > 0 ? a.num_sms : 1} * kBlocksPerSm;
  blocks = bound < blocks ? bound : blocks;
  if (blocks <= 0) return cudaSuccess;
  if (a.tgmm) {
    TgmmTiles<TM, TN><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, tiles_n, tiles_k, plan);
  } else {
    GmmTiles<TM, TN><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, tiles_n, plan);
  }
  return cudaGetLastError();
}

}  // namespace

int LaunchGrouped(const GroupedArgs& a, const kreg_device& device, char* msg, size_t cap) {
  cudaError_t e = cudaSetDevice(device.ordinal);
  const auto stream = static_cast<cudaStream_t>(device.stream);
  const char* what = "cudaSetDevice";
  void* scratch = nullptr;
  const int64_t tiles_n = (a.n + a.tn - 1) / a.tn, tiles_k = (a.k + a.tm - 1) / a.tm;
  if (e == cudaSuccess && a.local_groups > 0) {
    scratch = device.alloc(device.ctx, PlanBytes(a.local_groups));
    if (scratch == nullptr) {
      std::snprintf(msg, cap, "gmm/cuda_grouped: out of device memory for the plan");
      return 1;
    }
    const Plan plan{static_cast<int64_t*>(scratch), a.local_groups};
    PlanKernel<<<1, 1, 0, stream>>>(a, tiles_n, tiles_k, plan);
    what = "the plan kernel";
    e = cudaGetLastError();
    if (e == cudaSuccess && !a.tgmm && a.m * a.n > 0) {
      FillOutside<<<256, 256, 0, stream>>>(a, plan);
      what = "the fill kernel";
      e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
      what = "the tile kernel";
      if (a.tm == 64 && a.tn == 64) e = LaunchTiles<64, 64>(a, tiles_n, tiles_k, plan, stream);
      if (a.tm == 64 && a.tn == 128) e = LaunchTiles<64, 128>(a, tiles_n, tiles_k, plan, stream);
      if (a.tm == 128 && a.tn == 64) e = LaunchTiles<128, 64>(a, tiles_n, tiles_k, plan, stream);
      if (a.tm == 128 && a.tn == 128) e = LaunchTiles<128, 128>(a, tiles_n, tiles_k, plan, stream);
    }
    device.free(device.ctx, scratch);  // stream-ordered: after the kernels
  } else if (e == cudaSuccess && !a.tgmm && a.m * a.n > 0) {
    // No local group: every row is outside them.
    int64_t zero[3] = {0, 0, 0};
    scratch = device.alloc(device.ctx, sizeof zero);
    if (scratch == nullptr) {
      std::snprintf(msg, cap, "gmm/cuda_grouped: out of device memory for the plan");
      return 1;
    }
    e = cudaMemcpyAsync(scratch, zero, sizeof zero, cudaMemcpyHostToDevice, stream);
    what = "cudaMemcpyAsync";
    if (e == cudaSuccess) {
      FillOutside<<<256, 256, 0, stream>>>(a, Plan{static_cast<int64_t*>(scratch), 0});
      what = "the fill kernel";
      e = cudaGetLastError();
    }
    device.free(device.ctx, scratch);
  }
  if (e == cudaSuccess) return 0;
  std::snprintf(msg, cap, "%s/cuda_grouped: %s: %s", a.tgmm ? "tgmm" : "gmm", what, cudaGetErrorString(e));
  return 1;
}

int FixNonFinite(const GroupedArgs& a, int64_t lo, int64_t hi, const kreg_device& device, char* msg, size_t cap) {
  const int64_t rows = a.tgmm ? a.local_groups * a.k : hi - lo;
  if (rows <= 0 || a.n <= 0) return 0;
  const int64_t most = int64_t{a.num_sms > 0 ? a.num_sms : 1} * 16;
  FixNonFiniteKernel<<<static_cast<unsigned>(rows < most ? rows : most), a.n < 256 ? 64 : 256, 0,
                       static_cast<cudaStream_t>(device.stream)>>>(a, lo, hi);
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  std::snprintf(msg, cap, "%s/cuda_cublas: the non-finite scan: %s", a.tgmm ? "tgmm" : "gmm", cudaGetErrorString(e));
  return 1;
}

}  // namespace kreg::cuda
