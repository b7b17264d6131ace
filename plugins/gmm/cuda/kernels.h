// The gmm family's CUDA device code (the .cu files, nvcc) and cuBLAS calls
// as plain launches the host side (plugin.cc) calls: no CUDA types cross
// this header.
#ifndef KREG_PLUGINS_GMM_CUDA_KERNELS_H_
#define KREG_PLUGINS_GMM_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "kreg/plugin_abi.h"

namespace kreg::cuda {

// gmm's and tgmm's call (plugins/gmm/op.cc): device pointers, strides in
// elements. gmm: lhs [m, k], rhs [local_groups, k, n] ([.., n, k] with
// transpose_rhs), out and existing [m, n]. tgmm: lhs [k, m], rhs [m, n],
// out [local_groups, k, n].
struct GroupedArgs {
  bool tgmm = false;
  const void* lhs = nullptr;
  int64_t lhs_ld = 0;
  const void* rhs = nullptr;
  int64_t rhs_ld = 0, rhs_group_stride = 0;
  const int32_t* group_sizes = nullptr;  // [groups], on the device
  void* out = nullptr;
  int64_t out_ld = 0, out_group_stride = 0;
  const void* existing = nullptr;  // gmm's existing_out, or nullptr
  int64_t existing_ld = 0;
  int64_t m = 0, k = 0, n = 0, groups = 0, local_groups = 0, group_offset = 0;
  bool transpose_rhs = false, in_bf16 = false, out_bf16 = false;
  int tm = 0, tn = 0;  // cuda_grouped's tile (64 or 128 each)
  int num_sms = 0;
};

// gmm/cuda_grouped, tgmm/cuda_grouped (bf16 inputs): enqueues the call on
// device's stream; non-zero with a reason in msg if a launch failed.
int LaunchGrouped(const GroupedArgs& args, const kreg_device& device, char* msg, size_t cap);

// gmm/cuda_cublas, tgmm/cuda_cublas through cuBLAS, loaded at run time:
// `grouped` one cublasGemmGroupedBatchedEx call where every matrix's
// address and row pitch are multiples of 16 bytes (else one cublasGemmEx
// per group, or an error for a bf16 out with existing_out), else one
// cublasGemmEx per group; then FixNonFinite. Reads group_sizes to the host
// (a synchronisation: cuBLAS takes the shapes there). Non-zero with a reason in msg on failure (cuBLAS
// missing: CublasMissing() says why).
int RunCublas(const GroupedArgs& args, const kreg_device& device, bool grouped, char* msg, size_t cap);
// After RunCublas: recomputes each non-finite element of the local groups'
// output (gmm: rows [lo, hi)) as the reference does (a double sum in its
// order, rounded once), as cuda_grouped does for its non-finite
// accumulators. Enqueued on device's stream; non-zero with a reason in msg
// if the launch failed.
int FixNonFinite(const GroupedArgs& args, int64_t lo, int64_t hi, const kreg_device& device, char* msg, size_t cap);
// Why cuBLAS cannot be loaded here, or nullptr when it can.
const char* CublasMissing();

}  // namespace kreg::cuda

#endif  // KREG_PLUGINS_GMM_CUDA_KERNELS_H_
