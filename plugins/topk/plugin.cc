// The topk plugin's exported table: op "topk" and its kernels.
#include "kreg/plugin_abi.h"
#include "variants.h"

namespace {

const kreg_op_desc* const kOps[] = {&kreg::topk::kTopKOp};

#define KREG_TOPK_KERNEL_ADDRESS(name) &kreg::topk::name,
const kreg_kernel* const kKernels[] = {KREG_TOPK_KERNELS(KREG_TOPK_KERNEL_ADDRESS)};
#undef KREG_TOPK_KERNEL_ADDRESS

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "topk",
    .version = "2.0",
    .ops = kOps,
    .num_ops = sizeof kOps / sizeof kOps[0],
    .kernels = kKernels,
    .num_kernels = sizeof kKernels / sizeof kKernels[0],
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
