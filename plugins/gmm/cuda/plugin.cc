// The gmm family's CUDA kernels, their own plugin (kreg_gmm_cuda): gmm and
// tgmm cuda_grouped and cuda_cublas (cuBLAS loaded at run time), for the ops
// plugins/gmm declares. Their tensors are in the device's memory (the
// host's device backend copies them there, KREG_ARGS_ON_DEVICE) and they
// launch on kreg_host.device's stream; the host synchronises and times.
#include <cstdio>

#include "kernels.h"
#include "kreg/gmm/layout.h"
#include "kreg/plugin_sdk.h"

namespace kreg::cuda {
namespace {

using sdk::Data;
using sdk::Stride;
using namespace ::kreg::gmm;

// gmm's and tgmm's tensors share their first four positions (lhs, rhs,
// group_sizes, out).
static_assert(int{kGmmLhs} == int{kTgmmLhs} && int{kGmmRhs} == int{kTgmmRhs} &&
              int{kGmmGroupSizes} == int{kTgmmGroupSizes} && int{kGmmOut} == int{kTgmmOut});
enum { kLhs = kGmmLhs, kRhs = kGmmRhs, kGroupSizes = kGmmGroupSizes, kOut = kGmmOut };

GroupedArgs ViewGrouped(const kreg_args* args, bool tgmm) {
  const DLTensor* const* t = args->tensors;
  GroupedArgs a;
  a.tgmm = tgmm;
  a.lhs = Data<const void>(t[kLhs]);
  a.lhs_ld = Stride(t[kLhs], 0);
  a.rhs = Data<const void>(t[kRhs]);
  a.group_sizes = Data<const int32_t>(t[kGroupSizes]);
  a.out = Data<void>(t[kOut]);
  a.in_bf16 = t[kLhs]->dtype.code == kDLBfloat;
  a.out_bf16 = t[kOut]->dtype.code == kDLBfloat;
  if (!tgmm) {
    a.m = args->dims[kGmmM];
    a.k = args->dims[kGmmK];
    a.n = args->dims[kGmmN];
    a.groups = args->dims[kGmmGroups];
    a.local_groups = args->dims[kGmmLocalGroups];
    a.transpose_rhs = args->attrs[kGmmTransposeRhs].i != 0;
    a.group_offset = args->attrs[kGmmGroupOffset].i;
    a.rhs_group_stride = Stride(t[kRhs], 0);
    a.rhs_ld = Stride(t[kRhs], 1);
    a.out_ld = Stride(t[kOut], 0);
    if (args->num_tensors > kGmmExistingOut && t[kGmmExistingOut] != nullptr) {
      a.existing = Data<const void>(t[kGmmExistingOut]);
      a.existing_ld = Stride(t[kGmmExistingOut], 0);
    }
  } else {
    a.k = args->dims[kTgmmK];
    a.m = args->dims[kTgmmM];
    a.n = args->dims[kTgmmN];
    a.groups = args->dims[kTgmmGroups];
    a.local_groups = args->dims[kTgmmLocalGroups];
    a.group_offset = args->attrs[kTgmmGroupOffset].i;
    a.rhs_ld = Stride(t[kRhs], 0);
    a.out_group_stride = Stride(t[kOut], 0);
    a.out_ld = Stride(t[kOut], 1);
  }
  return a;
}

const char* OpName(bool tgmm) { return tgmm ? "tgmm" : "gmm"; }

const char* const kModes[] = {"grouped", "per_group"};
const kreg_param_desc kModeParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "mode",
    .doc = "grouped: one cublasGemmGroupedBatchedEx call (bf16 in with bf16 out, or f32; per group where a matrix "
           "is off 16-byte alignment); per_group: one cublasGemmEx per group",
    .kind = KREG_PARAM_CHOICE,
    .choices = kModes,
    .num_choices = 2,
    .default_value = 0,
};
const kreg_param_desc* const kCublasParams[] = {&kModeParam};

// Shapes cuBLAS takes: ints, and an output type for the inputs' (bf16 in:
// f32 or bf16 out; f32 in: f32 out); mode grouped (cublasGemmGroupedBatchedEx)
// not bf16 in with f32 out; mode per_group not gmm's bf16 out with
// existing_out (on an H100 its kernels came out two bf16 steps off the
// reference there, where one rounding of float sums is within one: the
// product rounded to bf16 before existing_out is added, by the look of it).
template <bool kTgmm>
kreg_status CublasCheck(const kreg_config* config, const kreg_args* args, const kreg_host*, char* msg, size_t cap) {
  for (size_t d = 0; d < 3; ++d) {
    if (args->dims[d] > 0x7fffffff) {
      std::snprintf(msg, cap, "%s/cuda_cublas: dims past 2^31 - 1 are not a cuBLAS GEMM", OpName(kTgmm));
      return KREG_INVALID_ARGUMENT;
    }
  }
  if (args->tensors[kLhs]->dtype.code != kDLBfloat && args->tensors[kOut]->dtype.code == kDLBfloat) {
    std::snprintf(msg, cap, "%s/cuda_cublas: f32 inputs with a bf16 out are not a cuBLAS GEMM type", OpName(kTgmm));
    return KREG_INVALID_ARGUMENT;
  }
  const bool grouped = config != nullptr && config->num_values > 0 && config->values[0]->value == 0;
  if (grouped && args->tensors[kLhs]->dtype.code == kDLBfloat && args->tensors[kOut]->dtype.code != kDLBfloat) {
    std::snprintf(msg, cap,
                  "%s/cuda_cublas: mode=grouped (cublasGemmGroupedBatchedEx) takes bf16 inputs with a bf16 out only; "
                  "an f32 out runs with mode=per_group",
                  OpName(kTgmm));
    return KREG_INVALID_ARGUMENT;
  }
  const bool existing = !kTgmm && args->num_tensors > kGmmExistingOut && args->tensors[kGmmExistingOut] != nullptr;
  if (existing && args->tensors[kOut]->dtype.code == kDLBfloat) {
    if (!grouped) {
      std::snprintf(msg, cap,
                    "gmm/cuda_cublas: mode=per_group rounds a bf16 out twice with existing_out; mode=grouped takes it");
      return KREG_INVALID_ARGUMENT;
    }
    // Rows on 16 bytes (with aligned tensors), or the grouped call could
    // not run as one (RunCublas).
    const DLTensor* const* t = args->tensors;
    if (Stride(t[kLhs], 0) % 8 != 0 || Stride(t[kRhs], 0) % 8 != 0 || Stride(t[kRhs], 1) % 8 != 0 ||
        Stride(t[kOut], 0) % 8 != 0) {
      std::snprintf(msg, cap,
                    "gmm/cuda_cublas: a bf16 out with existing_out needs rows on 16 bytes (k and n multiples of 8) "
                    "for mode=grouped, and mode=per_group rounds it twice");
      return KREG_INVALID_ARGUMENT;
    }
  }
  return KREG_OK;
}

template <bool kTgmm>
kreg_status CublasRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                      char* msg, size_t cap) {
  const kreg_device* device = sdk::CudaDevice(host, kTgmm ? "tgmm/cuda_cublas" : "gmm/cuda_cublas", msg, cap);
  if (device == nullptr) return KREG_UNAVAILABLE;
  GroupedArgs a = ViewGrouped(args, kTgmm);
  a.num_sms = device->num_sms;
  return RunCublas(a, *device, config->values[0]->value == 0, msg, cap) == 0 ? KREG_OK : KREG_INTERNAL;
}

const int64_t kTiles[] = {64, 128};
const kreg_param_desc kTmParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tm",
    .doc = "tile rows (gmm: a group's rows; tgmm: k)",
    .kind = KREG_PARAM_INT,
    .values = kTiles,
    .num_values = 2,
    .default_value = 128,
};
const kreg_param_desc kTnParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tn",
    .doc = "tile columns (n)",
    .kind = KREG_PARAM_INT,
    .values = kTiles,
    .num_values = 2,
    .default_value = 128,
};
const kreg_param_desc* const kGroupedParams[] = {&kTmParam, &kTnParam};

template <bool kTgmm>
kreg_status GroupedCheck(const kreg_config*, const kreg_args* args, const kreg_host*, char* msg, size_t cap) {
  if (args->tensors[kLhs]->dtype.code != kDLBfloat) {
    std::snprintf(msg, cap, "%s/cuda_grouped takes bf16 inputs (tensor cores); f32 runs on %s/cuda_cublas",
                  OpName(kTgmm), OpName(kTgmm));
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

template <bool kTgmm>
kreg_status GroupedRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                       char* msg, size_t cap) {
  const kreg_device* device = sdk::CudaDevice(host, kTgmm ? "tgmm/cuda_grouped" : "gmm/cuda_grouped", msg, cap);
  if (device == nullptr) return KREG_UNAVAILABLE;
  GroupedArgs a = ViewGrouped(args, kTgmm);
  a.tm = static_cast<int>(config->values[0]->value);
  a.tn = static_cast<int>(config->values[1]->value);
  a.num_sms = device->num_sms;
  return LaunchGrouped(a, *device, msg, cap) == 0 ? KREG_OK : KREG_INTERNAL;
}

const kreg_kernel kGmmCublas = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "cuda_cublas",
    .version = 1,
    .doc = "cuBLAS on a CUDA GPU: one grouped batched GEMM call, or a GEMM per group (group sizes read back)",
    .params = kCublasParams,
    .num_params = 1,
    .check = CublasCheck<false>,
    .run = CublasRun<false>,
    .device = KREG_DEVICE_CUDA,
};
const kreg_kernel kTgmmCublas = {
    .struct_size = sizeof(kreg_kernel),
    .op = "tgmm",
    .variant = "cuda_cublas",
    .version = 1,
    .doc = "cuBLAS on a CUDA GPU: one grouped batched GEMM call, or a GEMM per group (group sizes read back)",
    .params = kCublasParams,
    .num_params = 1,
    .check = CublasCheck<true>,
    .run = CublasRun<true>,
    .device = KREG_DEVICE_CUDA,
};
const kreg_kernel kGmmGrouped = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "cuda_grouped",
    .version = 1,
    .doc = "tensor cores (bf16 in, f32 accumulate), one tile list across all groups, planned on the GPU",
    .params = kGroupedParams,
    .num_params = 2,
    .check = GroupedCheck<false>,
    .run = GroupedRun<false>,
    .device = KREG_DEVICE_CUDA,
};
const kreg_kernel kTgmmGrouped = {
    .struct_size = sizeof(kreg_kernel),
    .op = "tgmm",
    .variant = "cuda_grouped",
    .version = 1,
    .doc = "tensor cores (bf16 in, f32 accumulate), every group's k x n tiles in one list",
    .params = kGroupedParams,
    .num_params = 2,
    .check = GroupedCheck<true>,
    .run = GroupedRun<true>,
    .device = KREG_DEVICE_CUDA,
};

const kreg_kernel* const kKernels[] = {&kGmmCublas, &kTgmmCublas, &kGmmGrouped, &kTgmmGrouped};

}  // namespace
}  // namespace kreg::cuda

KREG_DEFINE_PLUGIN("gmm_cuda", "0.1", ::kreg::sdk::kNoOps, ::kreg::cuda::kKernels)
