// The gmm plugin's exported table: ops "gmm" and "tgmm" and their kernels.
#include "kreg/plugin_sdk.h"
#include "variants.h"

namespace {

const kreg_op_desc* const kOps[] = {&kreg::gmm::kGmmOp, &kreg::gmm::kTgmmOp};

#define KREG_GMM_KERNEL_ADDRESS(name) &kreg::gmm::name,
const kreg_kernel* const kKernels[] = {KREG_GMM_KERNELS(KREG_GMM_KERNEL_ADDRESS)};
#undef KREG_GMM_KERNEL_ADDRESS

}  // namespace

KREG_DEFINE_PLUGIN("gmm", "0.1", kOps, kKernels)
