// A topk variant for the LUT tests whose legality depends on the shape:
// `tile` must not exceed k, and the same as a CUDA kernel (topk/gpu_tiled).
// They never run (the LUT only asks legality). They implement op "topk",
// declared by the topk plugin; this plugin declares no op.
#include <cstdint>
#include <cstdio>

#include "kreg/plugin_abi.h"

namespace {

// topk's dims, in the op's order.
enum { kDimBatch = 0, kDimN = 1, kDimK = 2, kNumTopkDims = 3 };

const int64_t kTiles[] = {4, 16, 64, 256};

const kreg_param_desc kTileParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tile",
    .doc = "columns per tile; at most k",
    .kind = KREG_PARAM_INT,
    .values = kTiles,
    .num_values = 4,
    .default_value = 4,
};
const kreg_param_desc* const kParams[] = {&kTileParam};

// Sees shapes only: k is a dim.
kreg_status Check(const kreg_config* config, const kreg_args* args, const kreg_host*, char* msg, size_t cap) {
  if (config->num_values < 1 || args->num_dims < kNumTopkDims) {
    std::snprintf(msg, cap, "topk/tiled: expected one parameter and topk's dims batch, n, k");
    return KREG_INVALID_ARGUMENT;
  }
  const int64_t tile = config->values[0]->value;
  const int64_t k = args->dims[kDimK];
  if (tile > k) {
    std::snprintf(msg, cap, "tile=%lld exceeds k=%lld", static_cast<long long>(tile), static_cast<long long>(k));
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

kreg_status Run(const kreg_config*, const kreg_args*, void*, void*, size_t, const kreg_host*, char* msg,
                size_t cap) {
  std::snprintf(msg, cap, "topk/tiled is a test fake and does not run");
  return KREG_UNIMPLEMENTED;
}

const kreg_kernel kTiledKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "tiled",
    .version = 1,
    .doc = "a fake whose tile must not exceed k",
    .params = kParams,
    .num_params = 1,
    .check = Check,
    .run = Run,
};
const kreg_kernel kGpuTiledKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "gpu_tiled",
    .version = 1,
    .doc = "a fake CUDA kernel whose tile must not exceed k",
    .params = kParams,
    .num_params = 1,
    .check = Check,
    .run = Run,
    .device = KREG_DEVICE_CUDA,
};
const kreg_kernel* const kKernels[] = {&kTiledKernel, &kGpuTiledKernel};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "lut_test",
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = 2,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
