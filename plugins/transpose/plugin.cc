// The transpose plugin's exported table: op "transpose" and its kernels.
#include "common.h"

namespace {

const kreg_op_desc* const kOps[] = {&kreg::transpose::kTransposeOp};
const kreg_kernel* const kKernels[] = {&kreg::transpose::kReference, &kreg::transpose::kBlocked};

}  // namespace

KREG_DEFINE_PLUGIN("transpose", "0.1", kOps, kKernels)
