// Shared by the transpose kernels: the typed view of a call. Plugin-private;
// speaks only the ABI and the SDK.
#ifndef KREG_PLUGINS_TRANSPOSE_COMMON_H_
#define KREG_PLUGINS_TRANSPOSE_COMMON_H_

#include <cstdint>

#include "kreg/plugin_sdk.h"
#include "kreg/transpose/layout.h"

namespace kreg::transpose {

// A call: element size 4 (f32, i32) or 2 (bf16); row strides in elements
// (the last dimension is contiguous).
struct View {
  const char* x;
  char* out;
  int64_t rows, cols, x_ld, out_ld;
  int elem;
};

inline View ViewOf(const kreg_args* args) {
  const DLTensor* x = args->tensors[kX];
  const DLTensor* out = args->tensors[kOut];
  return {sdk::Base(x),         sdk::Base(out),         args->dims[kRows], args->dims[kCols],
          sdk::Stride(x, 0),    sdk::Stride(out, 0),    x->dtype.bits / 8};
}

extern const kreg_op_desc kTransposeOp;
extern const kreg_kernel kReference;
extern const kreg_kernel kBlocked;

}  // namespace kreg::transpose

#endif  // KREG_PLUGINS_TRANSPOSE_COMMON_H_
