// A topk variant for the LUT tests whose legality depends on the shape:
// `tile` must not exceed k. It never runs (the LUT only asks legality).
#include <cstdio>

#include "kreg/plugin_abi.h"

namespace {

const int64_t kTiles[] = {4, 16, 64, 256};

const kreg_param_desc kParams[] = {
    {sizeof(kreg_param_desc), "tile", "columns per tile; at most k", KREG_PARAM_INT, kTiles, 4,
     nullptr, 0, 4, nullptr, 0},
};

kreg_status Check(const kreg_config* config, const void* args, char* msg, size_t cap) {
  const auto& a = *static_cast<const kreg_topk_args*>(args);
  if (config->values[0].value > a.k) {
    std::snprintf(msg, cap, "tile=%lld exceeds k=%lld",
                  static_cast<long long>(config->values[0].value), static_cast<long long>(a.k));
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

kreg_status Run(const kreg_config*, const void*, void*, size_t, const kreg_host*, char* msg,
                size_t cap) {
  std::snprintf(msg, cap, "topk/tiled is a test fake and does not run");
  return KREG_UNIMPLEMENTED;
}

const kreg_kernel kKernels[] = {
    {sizeof(kreg_kernel), "topk", "tiled", 1, "a fake whose tile must not exceed k", 0, kParams, 1,
     Check, nullptr, Run},
};

const kreg_plugin kPlugin = {
    sizeof(kreg_plugin), KREG_ABI_VERSION, "lut_test", "0.1", kKernels, 1,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v1(void) { return &kPlugin; }
