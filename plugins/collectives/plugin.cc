// The collectives plugin's exported table: ops "allgather", "allreduce",
// "reduce_scatter" and "sharded_matmul" and their kernels.
#include "kreg/plugin_abi.h"
#include "variants.h"

namespace {

const kreg_op_desc* const kOps[] = {&kreg::collectives::kAllgatherOp, &kreg::collectives::kAllreduceOp,
                                    &kreg::collectives::kReduceScatterOp, &kreg::collectives::kShardedMatmulOp};

#define KREG_COLLECTIVES_KERNEL_ADDRESS(name) &kreg::collectives::name,
const kreg_kernel* const kKernels[] = {KREG_COLLECTIVES_KERNELS(KREG_COLLECTIVES_KERNEL_ADDRESS)};
#undef KREG_COLLECTIVES_KERNEL_ADDRESS

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "collectives",
    .version = "0.1",
    .ops = kOps,
    .num_ops = sizeof kOps / sizeof kOps[0],
    .kernels = kKernels,
    .num_kernels = sizeof kKernels / sizeof kKernels[0],
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
