// The topk variants of this plugin. A new variant is one file defining its
// kreg_kernel plus one line here and one in plugin.cc's table.
#ifndef KREG_PLUGINS_TOPK_VARIANTS_H_
#define KREG_PLUGINS_TOPK_VARIANTS_H_

#include "kreg/plugin_abi.h"

namespace kreg::topk {

extern const kreg_kernel kSortKernel;
extern const kreg_kernel kHeapKernel;
extern const kreg_kernel kRadixKernel;
extern const kreg_kernel kBlockwiseKernel;

}  // namespace kreg::topk

#endif  // KREG_PLUGINS_TOPK_VARIANTS_H_
