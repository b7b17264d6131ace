// The gmm plugin's exported table: ops "gmm" and "tgmm" and their kernels.
#include "kreg/plugin_abi.h"
#include "variants.h"

namespace {

const kreg_op_desc* const kOps[] = {&kreg::gmm::kGmmOp, &kreg::gmm::kTgmmOp};

#define KREG_GMM_KERNEL_ADDRESS(name) &kreg::gmm::name,
const kreg_kernel* const kKernels[] = {KREG_GMM_KERNELS(KREG_GMM_KERNEL_ADDRESS)};
#undef KREG_GMM_KERNEL_ADDRESS

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "gmm",
    .version = "0.1",
    .ops = kOps,
    .num_ops = sizeof kOps / sizeof kOps[0],
    .kernels = kKernels,
    .num_kernels = sizeof kKernels / sizeof kKernels[0],
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
