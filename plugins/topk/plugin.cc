// The topk plugin's exported table: op "topk" and its kernels.
#include "kreg/plugin_sdk.h"
#include "variants.h"

namespace {

const kreg_op_desc* const kOps[] = {&kreg::topk::kTopKOp};

#define KREG_TOPK_KERNEL_ADDRESS(name) &kreg::topk::name,
const kreg_kernel* const kKernels[] = {KREG_TOPK_KERNELS(KREG_TOPK_KERNEL_ADDRESS)};
#undef KREG_TOPK_KERNEL_ADDRESS

}  // namespace

KREG_DEFINE_PLUGIN("topk", "2.0", kOps, kKernels)
