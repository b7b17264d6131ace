// The cuda plugin: kernels that run on a CUDA device, for ops other plugins
// declare (topk, gmm, tgmm). Their tensors are in the device's memory (the host's
// device backend copies them there, KREG_ARGS_ON_DEVICE) and they launch on
// kreg_host.device's stream; the host synchronises and times.
#include <cstdio>

#include "kernels.h"
#include "kreg/plugin_abi.h"

namespace kreg::cuda {
namespace {

// topk's layout (plugins/topk/op.cc): tensors input, row_starts, row_ends,
// values, indices, stats; dims batch, n, k; attribute largest.
enum { kInput, kRowStarts, kRowEnds, kValues, kIndices, kStats };
enum { kBatch, kN, kK };

// Stride of dimension d in elements (compact row-major without strides; 0
// for an absent tensor).
int64_t Stride(const DLTensor* t, int d) {
  if (t == nullptr) return 0;
  if (t->strides != nullptr) return t->strides[d];
  int64_t s = 1;
  for (int i = d + 1; i < t->ndim; ++i) s *= t->shape[i];
  return s;
}

template <typename T>
T* Data(const DLTensor* t) {
  return t == nullptr ? nullptr : reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset);
}

const int64_t kBits[] = {4, 8};
const int64_t kBlocks[] = {256, 512, 1024};
const int64_t kCapacities[] = {0, 1024, 2048};
const int64_t kBlocksPerRow[] = {1, 4, 16};
const int64_t kRowsPerBlock[] = {1, 4};
const kreg_param_desc kBitsParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "bits",
    .doc = "key bits histogrammed per radix round (until the k-th best is exact)",
    .kind = KREG_PARAM_INT,
    .values = kBits,
    .num_values = 2,
    .default_value = 8,
};
const kreg_param_desc kBlockParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "block",
    .doc = "threads per block",
    .kind = KREG_PARAM_INT,
    .values = kBlocks,
    .num_values = 3,
    .default_value = 512,
};
const kreg_param_desc kCapacityParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "capacity",
    .doc = "the first round's bucket kept in shared memory for the later rounds (0: none; an overflow falls back "
           "to rounds over the row)",
    .kind = KREG_PARAM_INT,
    .values = kCapacities,
    .num_values = 3,
    .default_value = 2048,
};
const kreg_param_desc kBlocksPerRowParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "blocks_per_row",
    .doc = "blocks a row is split between (each part's top k, then the top k of their union)",
    .kind = KREG_PARAM_INT,
    .values = kBlocksPerRow,
    .num_values = 3,
    .default_value = 1,
};
const kreg_param_desc kRowsPerBlockParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "rows_per_block",
    .doc = "rows a block takes in turn (with blocks_per_row=1)",
    .kind = KREG_PARAM_INT,
    .values = kRowsPerBlock,
    .num_values = 2,
    .default_value = 1,
};
const kreg_param_desc* const kRadixParams[] = {&kBitsParam, &kBlockParam, &kCapacityParam, &kBlocksPerRowParam,
                                               &kRowsPerBlockParam};

kreg_status RadixCheck(const kreg_config* config, const kreg_args* args, const kreg_host*, char* msg, size_t cap) {
  const int64_t blocks_per_row = config->values[3]->value, rows_per_block = config->values[4]->value;
  if (blocks_per_row > 1 && rows_per_block > 1) {
    std::snprintf(msg, cap, "blocks_per_row=%lld and rows_per_block=%lld: a block takes part of a row or rows, "
                  "not both", static_cast<long long>(blocks_per_row), static_cast<long long>(rows_per_block));
    return KREG_INVALID_ARGUMENT;
  }
  if (blocks_per_row > 1 && args->dims[kBatch] > 65535) {
    std::snprintf(msg, cap, "batch=%lld exceeds 65535, the most rows split between blocks",
                  static_cast<long long>(args->dims[kBatch]));
    return KREG_INVALID_ARGUMENT;
  }
  if (args->dims[kK] > RadixMaxK()) {
    std::snprintf(msg, cap, "k=%lld exceeds %d, the most topk/cuda_radix sorts on chip",
                  static_cast<long long>(args->dims[kK]), RadixMaxK());
    return KREG_INVALID_ARGUMENT;
  }
  if (args->dims[kBatch] > 0x7fffffff) {
    std::snprintf(msg, cap, "batch=%lld exceeds a grid's blocks", static_cast<long long>(args->dims[kBatch]));
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

// The host's CUDA device, or nullptr with the reason in msg.
const kreg_device* DeviceOf(const kreg_host* host, const char* kernel, char* msg, size_t cap) {
  if (host == nullptr || !KREG_HAS_FIELD(host, kreg_host, device) || host->device == nullptr ||
      host->device->kind != KREG_DEVICE_CUDA) {
    std::snprintf(msg, cap, "%s runs on a CUDA device (the host gave none)", kernel);
    return nullptr;
  }
  return host->device;
}

kreg_status RadixRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                     char* msg, size_t cap) {
  const kreg_device* device = DeviceOf(host, "topk/cuda_radix", msg, cap);
  if (device == nullptr) return KREG_UNAVAILABLE;
  const DLTensor* const* t = args->tensors;
  RadixArgs a{};
  a.input = Data<const void>(t[kInput]);
  a.input_stride = Stride(t[kInput], 0);
  a.row_starts = Data<const int32_t>(t[kRowStarts]);
  a.starts_stride = Stride(t[kRowStarts], 0);
  a.row_ends = Data<const int32_t>(t[kRowEnds]);
  a.ends_stride = Stride(t[kRowEnds], 0);
  a.values = Data<void>(t[kValues]);
  a.values_stride = Stride(t[kValues], 0);
  a.indices = Data<int32_t>(t[kIndices]);
  a.indices_stride = Stride(t[kIndices], 0);
  a.stats = Data<int32_t>(t[kStats]);
  a.stats_stride = Stride(t[kStats], 0);
  a.batch = args->dims[kBatch];
  a.n = args->dims[kN];
  a.k = static_cast<int>(args->dims[kK]);
  a.largest = args->attrs[0].i != 0;
  a.bf16 = t[kInput]->dtype.code == kDLBfloat;
  a.bits = static_cast<int>(config->values[0]->value);
  a.block = static_cast<int>(config->values[1]->value);
  a.capacity = static_cast<int>(config->values[2]->value);
  a.blocks_per_row = static_cast<int>(config->values[3]->value);
  a.rows_per_block = static_cast<int>(config->values[4]->value);
  return LaunchRadixTopK(a, *device, msg, cap) == 0 ? KREG_OK : KREG_INTERNAL;
}

const kreg_kernel kRadix = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "cuda_radix",
    .version = 2,
    .doc = "radix select on a CUDA GPU, a candidate buffer exact on overflow, rows split between blocks or blocks "
           "taking rows (seed 001, made exact)",
    .params = kRadixParams,
    .num_params = sizeof kRadixParams / sizeof kRadixParams[0],
    .check = RadixCheck,
    .run = RadixRun,
    .device = KREG_DEVICE_CUDA,
};

// ---- gmm and tgmm ------------------------------------------------------------------

// gmm's layout (plugins/gmm/common.h): tensors lhs, rhs, group_sizes, out,
// existing_out; dims m, k, n, groups, local_groups; attributes
// transpose_rhs, group_offset, constant_weights. tgmm's: lhs, rhs,
// group_sizes, out; dims k, m, n, groups, local_groups; group_offset.
enum { kLhs, kRhs, kGroupSizes, kOut, kExistingOut };
enum { kGmmM, kGmmK, kGmmN, kGmmGroups, kGmmLocalGroups };
enum { kTgmmK, kTgmmM, kTgmmN, kTgmmGroups, kTgmmLocalGroups };

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
    a.transpose_rhs = args->attrs[0].i != 0;
    a.group_offset = args->attrs[1].i;
    a.rhs_group_stride = Stride(t[kRhs], 0);
    a.rhs_ld = Stride(t[kRhs], 1);
    a.out_ld = Stride(t[kOut], 0);
    if (args->num_tensors > kExistingOut && t[kExistingOut] != nullptr) {
      a.existing = Data<const void>(t[kExistingOut]);
      a.existing_ld = Stride(t[kExistingOut], 0);
    }
  } else {
    a.k = args->dims[kTgmmK];
    a.m = args->dims[kTgmmM];
    a.n = args->dims[kTgmmN];
    a.groups = args->dims[kTgmmGroups];
    a.local_groups = args->dims[kTgmmLocalGroups];
    a.group_offset = args->attrs[0].i;
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
    .doc = "grouped: one cublasGemmGroupedBatchedEx call; per_group: one cublasGemmEx per group",
    .kind = KREG_PARAM_CHOICE,
    .choices = kModes,
    .num_choices = 2,
    .default_value = 0,
};
const kreg_param_desc* const kCublasParams[] = {&kModeParam};

// Shapes cuBLAS takes: ints, and an output type for the inputs' (bf16 in:
// f32 or bf16 out; f32 in: f32 out).
template <bool kTgmm>
kreg_status CublasCheck(const kreg_config*, const kreg_args* args, const kreg_host*, char* msg, size_t cap) {
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
  return KREG_OK;
}

template <bool kTgmm>
kreg_status CublasRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                      char* msg, size_t cap) {
  const kreg_device* device = DeviceOf(host, kTgmm ? "tgmm/cuda_cublas" : "gmm/cuda_cublas", msg, cap);
  if (device == nullptr) return KREG_UNAVAILABLE;
  const GroupedArgs a = ViewGrouped(args, kTgmm);
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
  const kreg_device* device = DeviceOf(host, kTgmm ? "tgmm/cuda_grouped" : "gmm/cuda_grouped", msg, cap);
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

const kreg_kernel* const kKernels[] = {&kRadix, &kGmmCublas, &kTgmmCublas, &kGmmGrouped, &kTgmmGrouped};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "cuda",
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = sizeof kKernels / sizeof kKernels[0],
};

}  // namespace
}  // namespace kreg::cuda

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kreg::cuda::kPlugin; }
