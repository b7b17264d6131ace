// The cuda plugin: kernels that run on a CUDA device, for ops other plugins
// declare (topk). Their tensors are in the device's memory (the host's
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

int64_t RowStride(const DLTensor* t) {
  if (t == nullptr) return 0;
  if (t->ndim < 2) return t->strides != nullptr && t->ndim == 1 ? t->strides[0] : 1;
  return t->strides != nullptr ? t->strides[0] : t->shape[1];
}

template <typename T>
T* Data(const DLTensor* t) {
  return t == nullptr ? nullptr : reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset);
}

const int64_t kBits[] = {4, 8};
const int64_t kBlocks[] = {256, 512, 1024};
const kreg_param_desc kBitsParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "bits",
    .doc = "score bits histogrammed per radix round (32 / bits rounds)",
    .kind = KREG_PARAM_INT,
    .values = kBits,
    .num_values = 2,
    .default_value = 8,
};
const kreg_param_desc kBlockParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "block",
    .doc = "threads per block (one block per row)",
    .kind = KREG_PARAM_INT,
    .values = kBlocks,
    .num_values = 3,
    .default_value = 512,
};
const kreg_param_desc* const kRadixParams[] = {&kBitsParam, &kBlockParam};

kreg_status RadixCheck(const kreg_config*, const kreg_args* args, const kreg_host*, char* msg, size_t cap) {
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
  if (host == nullptr || !KREG_HAS_FIELD(host, kreg_host, device) || host->device == nullptr ||
      host->device->kind != KREG_DEVICE_CUDA) {
    std::snprintf(msg, cap, "topk/cuda_radix runs on a CUDA device (the host gave none)");
    return KREG_UNAVAILABLE;
  }
  const DLTensor* const* t = args->tensors;
  RadixArgs a{};
  a.input = Data<const void>(t[kInput]);
  a.input_stride = RowStride(t[kInput]);
  a.row_starts = Data<const int32_t>(t[kRowStarts]);
  a.starts_stride = RowStride(t[kRowStarts]);
  a.row_ends = Data<const int32_t>(t[kRowEnds]);
  a.ends_stride = RowStride(t[kRowEnds]);
  a.values = Data<void>(t[kValues]);
  a.values_stride = RowStride(t[kValues]);
  a.indices = Data<int32_t>(t[kIndices]);
  a.indices_stride = RowStride(t[kIndices]);
  a.stats = Data<int32_t>(t[kStats]);
  a.stats_stride = RowStride(t[kStats]);
  a.batch = args->dims[kBatch];
  a.n = args->dims[kN];
  a.k = static_cast<int>(args->dims[kK]);
  a.largest = args->attrs[0].i != 0;
  a.bf16 = t[kInput]->dtype.code == kDLBfloat;
  a.bits = static_cast<int>(config->values[0]->value);
  a.block = static_cast<int>(config->values[1]->value);
  return LaunchRadixTopK(a, host->device->ordinal, host->device->stream, msg, cap) == 0 ? KREG_OK : KREG_INTERNAL;
}

const kreg_kernel kRadix = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "cuda_radix",
    .version = 1,
    .doc = "radix select on a CUDA GPU, one block per row, exact (seed 001, made exact)",
    .params = kRadixParams,
    .num_params = sizeof kRadixParams / sizeof kRadixParams[0],
    .check = RadixCheck,
    .run = RadixRun,
    .device = KREG_DEVICE_CUDA,
};

const kreg_kernel* const kKernels[] = {&kRadix};

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
