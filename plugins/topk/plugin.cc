// The topk plugin's exported table.
#include "kreg/plugin_abi.h"
#include "variants.h"

namespace {

const kreg_kernel kKernels[] = {
    kreg::topk::kSortKernel,
    kreg::topk::kHeapKernel,
    kreg::topk::kRadixKernel,
    kreg::topk::kBlockwiseKernel,
};

const kreg_plugin kPlugin = {
    sizeof(kreg_plugin), KREG_ABI_VERSION, "topk", "1.0", kKernels, sizeof kKernels / sizeof kKernels[0],
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v1(void) { return &kPlugin; }
