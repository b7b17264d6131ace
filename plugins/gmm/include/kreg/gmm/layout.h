// Ops "gmm" and "tgmm"'s argument layout: the positions of their tensors,
// dims and attributes in kreg_args, in the order plugins/gmm/op.cc declares
// them (op.cc asserts it at compile time). Every gmm/tgmm variant (CPU,
// oneDNN, CUDA) reads arguments by these names; nothing else states the
// order. Installed as kreg/gmm/layout.h.
#ifndef KREG_GMM_LAYOUT_H_
#define KREG_GMM_LAYOUT_H_

namespace kreg::gmm {

// Op "gmm": out[rows of group g] = lhs[rows] . rhs[g - group_offset] (+
// existing_out) for the local groups g in [group_offset, group_offset +
// local_groups). lhs [m, k], rhs [local_groups, k, n] ([.., n, k] with
// transpose_rhs), group_sizes [groups] i32, out and existing_out [m, n].
enum GmmTensor { kGmmLhs = 0, kGmmRhs, kGmmGroupSizes, kGmmOut, kGmmExistingOut, kGmmNumTensors };
enum GmmDim { kGmmM = 0, kGmmK, kGmmN, kGmmGroups, kGmmLocalGroups, kGmmNumDims };
enum GmmAttr { kGmmTransposeRhs = 0, kGmmGroupOffset, kGmmConstantWeights, kGmmNumAttrs };
// Op "tgmm": out[g - group_offset] = lhs[:, rows of g] . rhs[rows of g, :]
// for the local groups g. lhs [k, m], rhs [m, n], group_sizes [groups] i32,
// out [local_groups, k, n].
enum TgmmTensor { kTgmmLhs = 0, kTgmmRhs, kTgmmGroupSizes, kTgmmOut, kTgmmNumTensors };
enum TgmmDim { kTgmmK = 0, kTgmmM, kTgmmN, kTgmmGroups, kTgmmLocalGroups, kTgmmNumDims };
enum TgmmAttr { kTgmmGroupOffset = 0, kTgmmNumAttrs };

}  // namespace kreg::gmm

#endif  // KREG_GMM_LAYOUT_H_
