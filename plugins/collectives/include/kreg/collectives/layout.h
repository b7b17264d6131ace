// The collectives' argument layout (ops allgather, allreduce,
// reduce_scatter): the positions of their tensors, dims and attributes in
// kreg_args, in the order plugins/collectives/op.cc declares them (op.cc
// asserts it at compile time). Installed as kreg/collectives/layout.h.
#ifndef KREG_COLLECTIVES_LAYOUT_H_
#define KREG_COLLECTIVES_LAYOUT_H_

namespace kreg::collectives {

// Every op has tensors x, out and dims count, ranks, in this order;
// allreduce and reduce_scatter have one attribute, reduction.
enum TensorIndex { kX = 0, kOut, kNumTensors };
enum DimIndex { kCount = 0, kRanks, kNumDims };
enum AttrIndex { kReduction = 0, kNumReduceAttrs };

}  // namespace kreg::collectives

#endif  // KREG_COLLECTIVES_LAYOUT_H_
