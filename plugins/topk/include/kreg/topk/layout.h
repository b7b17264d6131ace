// Op "topk"'s argument layout: the positions of its tensors, dims and
// attributes in kreg_args, in the order plugins/topk/op.cc declares them
// (op.cc asserts it at compile time). Every topk variant (CPU, CUDA) and the
// typed front (kreg/topk.h) read arguments by these names; nothing else
// states the order. Installed as kreg/topk/layout.h.
#ifndef KREG_TOPK_LAYOUT_H_
#define KREG_TOPK_LAYOUT_H_

namespace kreg::topk {

//   input       [batch, n]  f32 | bf16
//   row_starts  [batch]     i32, optional
//   row_ends    [batch]     i32, optional
//   values      [batch, k]  the input's dtype (output)
//   indices     [batch, k]  i32 (output)
//   stats       [batch]     i32, optional output
enum TensorIndex { kInput = 0, kRowStarts, kRowEnds, kValues, kIndices, kStats, kNumTensors };
enum DimIndex { kBatch = 0, kN, kK, kNumDims };
enum AttrIndex { kLargest = 0, kNumAttrs };  // largest: 1 (default) or 0

}  // namespace kreg::topk

#endif  // KREG_TOPK_LAYOUT_H_
