// The collectives plugin's exported table: ops "allgather", "allreduce",
// "reduce_scatter" and "sharded_matmul" and their kernels.
#include "kreg/plugin_sdk.h"
#include "variants.h"

namespace {

const kreg_op_desc* const kOps[] = {&kreg::collectives::kAllgatherOp, &kreg::collectives::kAllreduceOp,
                                    &kreg::collectives::kReduceScatterOp, &kreg::collectives::kShardedMatmulOp};

#define KREG_COLLECTIVES_KERNEL_ADDRESS(name) &kreg::collectives::name,
const kreg_kernel* const kKernels[] = {KREG_COLLECTIVES_KERNELS(KREG_COLLECTIVES_KERNEL_ADDRESS)};
#undef KREG_COLLECTIVES_KERNEL_ADDRESS

}  // namespace

KREG_DEFINE_PLUGIN("collectives", "0.1", kOps, kKernels)
