// Op "transpose"'s argument layout: the positions of its tensors and dims in
// kreg_args, in the order plugins/transpose/op.cc declares them (op.cc
// asserts it at compile time). Installed as kreg/transpose/layout.h.
#ifndef KREG_TRANSPOSE_LAYOUT_H_
#define KREG_TRANSPOSE_LAYOUT_H_

namespace kreg::transpose {

//   x    [rows, cols]  f32 | bf16 | i32
//   out  [cols, rows]  x's dtype (output)
enum TensorIndex { kX = 0, kOut, kNumTensors };
enum DimIndex { kRows = 0, kCols, kNumDims };

}  // namespace kreg::transpose

#endif  // KREG_TRANSPOSE_LAYOUT_H_
