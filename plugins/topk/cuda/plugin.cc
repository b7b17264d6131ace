// topk's CUDA kernel, its own plugin (kreg_topk_cuda): topk/cuda_radix for the
// op plugins/topk declares. Its tensors are in the device's memory (the
// host's device backend copies them there, KREG_ARGS_ON_DEVICE) and it
// launches on kreg_host.device's stream; the host synchronises and times.
#include <cstdio>

#include "kernels.h"
#include "kreg/plugin_sdk.h"
#include "kreg/topk/layout.h"

namespace kreg::cuda {
namespace {

using sdk::Data;
using sdk::Stride;
using namespace ::kreg::topk;

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

kreg_status RadixRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                     char* msg, size_t cap) {
  const kreg_device* device = sdk::CudaDevice(host, "topk/cuda_radix", msg, cap);
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
  a.largest = args->attrs[kLargest].i != 0;
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

const kreg_kernel* const kKernels[] = {&kRadix};

}  // namespace
}  // namespace kreg::cuda

KREG_DEFINE_PLUGIN("topk_cuda", "0.1", ::kreg::sdk::kNoOps, ::kreg::cuda::kKernels)
