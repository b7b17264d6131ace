// The gmm plugin's ops and kernels. A new variant is one file defining its
// kreg_kernel plus one line in KREG_GMM_KERNELS; plugin.cc's table reads
// this list.
#ifndef KREG_PLUGINS_GMM_VARIANTS_H_
#define KREG_PLUGINS_GMM_VARIANTS_H_

#include "kreg/plugin_abi.h"

// X(name) for every kernel of the plugin, the references first.
#define KREG_GMM_KERNELS(X) \
  X(kGmmReferenceKernel)    \
  X(kTgmmReferenceKernel)   \
  X(kGmmTiledKernel)        \
  X(kTgmmTiledKernel)

namespace kreg::gmm {

// Ops "gmm" and "tgmm" (op.cc).
extern const kreg_op_desc kGmmOp;
extern const kreg_op_desc kTgmmOp;

#define KREG_GMM_DECLARE_KERNEL(name) extern const kreg_kernel name;
KREG_GMM_KERNELS(KREG_GMM_DECLARE_KERNEL)
#undef KREG_GMM_DECLARE_KERNEL

}  // namespace kreg::gmm

#endif  // KREG_PLUGINS_GMM_VARIANTS_H_
