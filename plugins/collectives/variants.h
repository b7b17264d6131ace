// The collectives plugin's ops and kernels. A new variant is one file
// defining its kreg_kernel plus one line in KREG_COLLECTIVES_KERNELS;
// plugin.cc's table reads this list.
#ifndef KREG_PLUGINS_COLLECTIVES_VARIANTS_H_
#define KREG_PLUGINS_COLLECTIVES_VARIANTS_H_

#include "kreg/plugin_abi.h"

// X(name) for every kernel of the plugin, the references first.
#define KREG_COLLECTIVES_KERNELS(X) \
  X(kAllgatherReferenceKernel)      \
  X(kAllreduceReferenceKernel)      \
  X(kReduceScatterReferenceKernel)  \
  X(kShardedMatmulReferenceKernel)  \
  X(kAllgatherRingKernel)           \
  X(kAllreduceRingKernel)           \
  X(kReduceScatterRingKernel)       \
  X(kAllgatherDoublingKernel)       \
  X(kAllreduceDoublingKernel)       \
  X(kReduceScatterDoublingKernel)   \
  X(kAllgatherDirectKernel)         \
  X(kAllreduceDirectKernel)         \
  X(kReduceScatterDirectKernel)     \
  X(kShardedMatmulPlainKernel)      \
  X(kShardedMatmulOverlappedKernel)

namespace kreg::collectives {

// Ops "allgather", "allreduce" and "reduce_scatter" (op.cc).
extern const kreg_op_desc kAllgatherOp;
extern const kreg_op_desc kAllreduceOp;
extern const kreg_op_desc kReduceScatterOp;
// Op "sharded_matmul" (sharded_matmul.cc).
extern const kreg_op_desc kShardedMatmulOp;

#define KREG_COLLECTIVES_DECLARE_KERNEL(name) extern const kreg_kernel name;
KREG_COLLECTIVES_KERNELS(KREG_COLLECTIVES_DECLARE_KERNEL)
#undef KREG_COLLECTIVES_DECLARE_KERNEL

}  // namespace kreg::collectives

#endif  // KREG_PLUGINS_COLLECTIVES_VARIANTS_H_
