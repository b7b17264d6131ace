// The topk op and kernels of this plugin. A new variant is one file defining
// its kreg_kernel plus one line in KREG_TOPK_KERNELS; plugin.cc's table reads
// this list.
#ifndef KREG_PLUGINS_TOPK_VARIANTS_H_
#define KREG_PLUGINS_TOPK_VARIANTS_H_

#include "kreg/plugin_abi.h"

// Descriptors (kernels, params, the op) are designated initialisers naming
// only the fields they set: the others, and fields the ABI appends later, are
// zero ("none"); kreg_add_plugin() turns off -Wmissing-field-initializers.

// X(name) for every kernel of the plugin, the reference first.
#define KREG_TOPK_KERNELS(X) \
  X(kReferenceKernel)        \
  X(kSortKernel)             \
  X(kHeapKernel)             \
  X(kRadixKernel)            \
  X(kBlockwiseKernel)        \
  X(kBlockMaxKernel)

namespace kreg::topk {

// Op "topk" (op.cc).
extern const kreg_op_desc kTopKOp;

#define KREG_TOPK_DECLARE_KERNEL(name) extern const kreg_kernel name;
KREG_TOPK_KERNELS(KREG_TOPK_DECLARE_KERNEL)
#undef KREG_TOPK_DECLARE_KERNEL

}  // namespace kreg::topk

#endif  // KREG_PLUGINS_TOPK_VARIANTS_H_
