// Ops "gmm" and "tgmm": the grouped matmuls of mixture-of-experts layers (as
// Pallas megablox's gmm / tgmm). group_sizes partitions the first
// sum(group_sizes) <= m rows into consecutive blocks: block g holds rows
// [start_g, start_g + group_sizes[g]), start_g the sum of the earlier sizes.
// A call computes the local groups g in [group_offset, group_offset +
// local_groups) only (as when the experts are sharded across devices);
// local_groups defaults to groups, group_offset to 0, and group_offset +
// local_groups <= groups.
//
// gmm   dims     m (rows), k (reduction), n (columns), groups (G),
//                local_groups (default G).
//       tensors  lhs           [m, k]               f32 or bf16.
//                rhs           [local_groups, k, n] lhs's dtype; with
//                              transpose_rhs=1 [local_groups, n, k] (each
//                              group's matrix transposed).
//                group_sizes   [groups]             int32, >= 0, summing to <= m.
//                out           [m, n]               f32 or bf16 (free: the
//                                                   output dtype is the caller's).
//                existing_out  optional [m, n], out's dtype: an accumulator.
//       attrs    transpose_rhs (0/1), group_offset (>= 0), constant_weights
//                (0/1: rhs is the same on every run of one prepared state,
//                so a kernel may pack it once in prepare; results do not
//                change).
//       out[r] = existing_out[r] + lhs[r] . rhs[g - group_offset] for the
//       rows r of a local group g; every other row (other groups', rows past
//       sum(group_sizes)) is existing_out[r] (0 without it).
//
// tgmm  dims     k (rows of out[i]), m (reduction: the grouped rows), n,
//                groups, local_groups (default groups).
//       tensors  lhs           [k, m]               f32 or bf16.
//                rhs           [m, n]               lhs's dtype.
//                group_sizes   [groups]             int32, as for gmm.
//                out           [local_groups, k, n] f32 or bf16 (free).
//       attrs    group_offset (>= 0).
//       out[i] = lhs[:, rows of g] . rhs[rows of g, :] for g = group_offset
//       + i; an empty group gives zeros; rows outside the local groups are
//       ignored.
//
// bf16 inputs are widened exactly. The reference accumulates in double and
// rounds once (to nearest even) to out's dtype; other kernels may accumulate
// in float. out is compared with tolerance atol * (reduction length) *
// max(1, M) + rtol * |want|, M the sum of the terms' magnitudes (the
// reference on |lhs|, |rhs| and |existing_out|; KREG_TOLERANCE_MAGNITUDE):
// a float sum of d terms in any order is within d roundings of M, so a sum
// whose terms cancel is held to that, not to its small result. atol 2e-7
// for both dtypes, rtol f32 1e-5, bf16 1/128 (one bf16 ulp). NaN and
// infinities propagate as in a plain matmul (no zero is skipped), and match
// the reference's even where M overflows: each kernel recomputes, as the
// reference does, an output whose float sum came out NaN or infinite
// (KREG_TOLERANCE_EXACT_NONFINITE). A kernel
// may read bf16 subnormal inputs as zero, as the bf16 dot-product
// instructions (AVX512_BF16, AMX) and oneDNN on them do
// (KREG_TOLERANCE_BF16_DAZ); f32 inputs are never flushed.
#include <algorithm>
#include <cstdio>
#include <string_view>

#include "common.h"
#include "kreg/plugin_abi.h"
#include "variants.h"

namespace kreg::gmm {
namespace {

constexpr bool Named(const char* got, std::string_view want) { return std::string_view(got) == want; }

const char* const kDefaultVariants[] = {"tiled"};

// ---- gmm ---------------------------------------------------------------------------

constexpr kreg_dim_desc kGmmMDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "m", .doc = "rows of lhs and out (tokens)", .max = INT32_MAX};
constexpr kreg_dim_desc kGmmKDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "k", .doc = "reduction length (columns of lhs)"};
constexpr kreg_dim_desc kGmmNDim = {.struct_size = sizeof(kreg_dim_desc), .name = "n", .doc = "columns of rhs and out"};
// groups and group_sizes are the same in both ops (tgmm uses these too).
// Each group costs its kernels state beyond the tensors whether or not it
// holds rows: offsets, a product and its tasks (tgmm/tiled, the most: about
// 160 bytes a group, measured with a million empty ones).
constexpr kreg_dim_desc kGroupsDim = {.struct_size = sizeof(kreg_dim_desc),
                                      .name = "groups",
                                      .doc = "groups (experts): the length of group_sizes",
                                      .bytes_per_unit = 256};
constexpr kreg_dim_desc kGmmLocalGroupsDim = {
    .struct_size = sizeof(kreg_dim_desc),
    .name = "local_groups",
    .doc = "groups this call computes (rhs's first dim), from group_offset on; default: groups",
    .default_dim = "groups",
};
constexpr const kreg_dim_desc* kGmmDims[] = {&kGmmMDim, &kGmmKDim, &kGmmNDim, &kGroupsDim, &kGmmLocalGroupsDim};

constexpr kreg_attr_desc kGmmTransposeRhsAttr = {
    .struct_size = sizeof(kreg_attr_desc),
    .name = "transpose_rhs",
    .doc = "1: rhs is [local_groups, n, k], each group's matrix transposed",
    .kind = KREG_ATTR_INT,
    .default_value = {.i = 0},
    .min = {.i = 0},
    .max = {.i = 1},
};
constexpr kreg_attr_desc kGmmGroupOffsetAttr = {
    .struct_size = sizeof(kreg_attr_desc),
    .name = "group_offset",
    .doc = "the first group computed; rows of groups outside [group_offset, group_offset + local_groups) are "
           "existing_out or 0",
    .kind = KREG_ATTR_INT,
    .default_value = {.i = 0},
    .min = {.i = 0},
    .max = {.i = INT32_MAX},
};
constexpr kreg_attr_desc kGmmConstantWeightsAttr = {
    .struct_size = sizeof(kreg_attr_desc),
    .name = "constant_weights",
    .doc = "1: rhs is the same on every call with one prepared state (inference weights), so kernels may pack it "
           "once in prepare",
    .kind = KREG_ATTR_INT,
    .default_value = {.i = 0},
    .min = {.i = 0},
    .max = {.i = 1},
};
constexpr const kreg_attr_desc* kGmmAttrs[] = {&kGmmTransposeRhsAttr, &kGmmGroupOffsetAttr, &kGmmConstantWeightsAttr};

// Float sums within d roundings of their terms' size; non-finite outputs
// recomputed; bf16 subnormal inputs may read as zero.
constexpr uint32_t kTolFlags = KREG_TOLERANCE_MAGNITUDE | KREG_TOLERANCE_EXACT_NONFINITE | KREG_TOLERANCE_BF16_DAZ;
constexpr kreg_tolerance kGmmOutF32 = {.struct_size = sizeof(kreg_tolerance),
                                       .dtype = KREG_DTYPE_F32,
                                       .atol = 2e-7,
                                       .rtol = 1e-5,
                                       .scale_dim = "k",
                                       .flags = kTolFlags};
constexpr kreg_tolerance kGmmOutBf16 = {.struct_size = sizeof(kreg_tolerance),
                                        .dtype = KREG_DTYPE_BF16,
                                        .atol = 2e-7,
                                        .rtol = 1.0 / 128,
                                        .scale_dim = "k",
                                        .flags = kTolFlags};
constexpr const kreg_tolerance* kGmmOutTolerances[] = {&kGmmOutF32, &kGmmOutBf16};

constexpr kreg_tensor_desc kGmmLhsDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "lhs",
    .doc = "the rows (tokens), grouped by consecutive blocks",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .shape = "m,k",
};
constexpr kreg_tensor_desc kGmmRhsDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "rhs",
    .doc = "one [k, n] matrix per local group (expert weights); [n, k] with transpose_rhs=1",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .same_dtype_as = "lhs",
    .shape = "local_groups,k,n",
    .alt_shape = "local_groups,n,k",
    .alt_shape_attr = "transpose_rhs",
};
constexpr kreg_tensor_desc kGroupSizesDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "group_sizes",
    .doc = "rows per group, >= 0, summing to at most m",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_I32,
    .shape = "groups",
    .gen = KREG_GEN_PARTITION,
    .gen_dim = "m",
};
constexpr kreg_tensor_desc kGmmOutDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "out",
    .doc = "existing_out (or 0) plus each row of a local group times its rhs; other rows: existing_out or 0",
    .role = KREG_ROLE_OUT,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .shape = "m,n",
    .tolerances = kGmmOutTolerances,
    .num_tolerances = 2,
};
constexpr kreg_tensor_desc kGmmExistingOutDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "existing_out",
    .doc = "an accumulator added to out (absent: 0)",
    .role = KREG_ROLE_IN,
    .flags = KREG_TENSOR_OPTIONAL,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .same_dtype_as = "out",
    .shape = "m,n",
};
constexpr const kreg_tensor_desc* kGmmTensors[] = {&kGmmLhsDesc, &kGmmRhsDesc, &kGroupSizesDesc, &kGmmOutDesc,
                                                   &kGmmExistingOutDesc};

static_assert(sizeof kGmmDims / sizeof kGmmDims[0] == kGmmNumDims && Named(kGmmDims[kGmmM]->name, "m") &&
              Named(kGmmDims[kGmmK]->name, "k") && Named(kGmmDims[kGmmN]->name, "n") &&
              Named(kGmmDims[kGmmGroups]->name, "groups") && Named(kGmmDims[kGmmLocalGroups]->name, "local_groups"));
static_assert(sizeof kGmmAttrs / sizeof kGmmAttrs[0] == kGmmNumAttrs &&
              Named(kGmmAttrs[kGmmTransposeRhs]->name, "transpose_rhs") &&
              Named(kGmmAttrs[kGmmGroupOffset]->name, "group_offset") &&
              Named(kGmmAttrs[kGmmConstantWeights]->name, "constant_weights"));
static_assert(sizeof kGmmTensors / sizeof kGmmTensors[0] == kGmmNumTensors &&
              Named(kGmmTensors[kGmmLhs]->name, "lhs") && Named(kGmmTensors[kGmmRhs]->name, "rhs") &&
              Named(kGmmTensors[kGmmGroupSizes]->name, "group_sizes") && Named(kGmmTensors[kGmmOut]->name, "out") &&
              Named(kGmmTensors[kGmmExistingOut]->name, "existing_out"));

kreg_status ValidateGmm(const kreg_args* args, char* msg, size_t cap) {
  return Guarded(msg, cap, [&] {
    GroupedView v;
    if (!ViewGmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = ValidateLocalGroups(v, msg, cap); s != KREG_OK) return s;
    return ValidatePartition(args, v, msg, cap);
  });
}

// ---- tgmm --------------------------------------------------------------------------

constexpr kreg_dim_desc kTgmmKDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "k", .doc = "rows of lhs and of each out[g]"};
constexpr kreg_dim_desc kTgmmMDim = {.struct_size = sizeof(kreg_dim_desc),
                                     .name = "m",
                                     .doc = "grouped rows (tokens): the reduction length",
                                     .max = INT32_MAX};
constexpr kreg_dim_desc kTgmmNDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "n", .doc = "columns of rhs and of each out[g]"};
constexpr kreg_dim_desc kTgmmLocalGroupsDim = {
    .struct_size = sizeof(kreg_dim_desc),
    .name = "local_groups",
    .doc = "groups this call computes (out's first dim), from group_offset on; default: groups",
    .default_dim = "groups",
};
constexpr const kreg_dim_desc* kTgmmDims[] = {&kTgmmKDim, &kTgmmMDim, &kTgmmNDim, &kGroupsDim,
                                              &kTgmmLocalGroupsDim};

constexpr kreg_attr_desc kTgmmGroupOffsetAttr = {
    .struct_size = sizeof(kreg_attr_desc),
    .name = "group_offset",
    .doc = "the first group computed: out[i] is group group_offset + i",
    .kind = KREG_ATTR_INT,
    .default_value = {.i = 0},
    .min = {.i = 0},
    .max = {.i = INT32_MAX},
};
constexpr const kreg_attr_desc* kTgmmAttrs[] = {&kTgmmGroupOffsetAttr};

constexpr kreg_tolerance kTgmmOutF32 = {.struct_size = sizeof(kreg_tolerance),
                                        .dtype = KREG_DTYPE_F32,
                                        .atol = 2e-7,
                                        .rtol = 1e-5,
                                        .scale_dim = "m",
                                        .flags = kTolFlags};
constexpr kreg_tolerance kTgmmOutBf16 = {.struct_size = sizeof(kreg_tolerance),
                                         .dtype = KREG_DTYPE_BF16,
                                         .atol = 2e-7,
                                         .rtol = 1.0 / 128,
                                         .scale_dim = "m",
                                         .flags = kTolFlags};
constexpr const kreg_tolerance* kTgmmOutTolerances[] = {&kTgmmOutF32, &kTgmmOutBf16};

constexpr kreg_tensor_desc kTgmmLhsDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "lhs",
    .doc = "[k, m]: its columns are the grouped rows",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .shape = "k,m",
};
constexpr kreg_tensor_desc kTgmmRhsDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "rhs",
    .doc = "[m, n]: the grouped rows (e.g. output gradients)",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .same_dtype_as = "lhs",
    .shape = "m,n",
};
constexpr kreg_tensor_desc kTgmmOutDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "out",
    .doc = "per local group, lhs[:, its rows] times rhs[its rows, :]; zeros for an empty group",
    .role = KREG_ROLE_OUT,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .shape = "local_groups,k,n",
    .tolerances = kTgmmOutTolerances,
    .num_tolerances = 2,
};
constexpr const kreg_tensor_desc* kTgmmTensors[] = {&kTgmmLhsDesc, &kTgmmRhsDesc, &kGroupSizesDesc, &kTgmmOutDesc};

static_assert(sizeof kTgmmDims / sizeof kTgmmDims[0] == kTgmmNumDims && Named(kTgmmDims[kTgmmK]->name, "k") &&
              Named(kTgmmDims[kTgmmM]->name, "m") && Named(kTgmmDims[kTgmmN]->name, "n") &&
              Named(kTgmmDims[kTgmmGroups]->name, "groups") &&
              Named(kTgmmDims[kTgmmLocalGroups]->name, "local_groups"));
static_assert(sizeof kTgmmAttrs / sizeof kTgmmAttrs[0] == kTgmmNumAttrs &&
              Named(kTgmmAttrs[kTgmmGroupOffset]->name, "group_offset"));
static_assert(sizeof kTgmmTensors / sizeof kTgmmTensors[0] == kTgmmNumTensors &&
              Named(kTgmmTensors[kTgmmLhs]->name, "lhs") && Named(kTgmmTensors[kTgmmRhs]->name, "rhs") &&
              Named(kTgmmTensors[kTgmmGroupSizes]->name, "group_sizes") &&
              Named(kTgmmTensors[kTgmmOut]->name, "out"));

kreg_status ValidateTgmm(const kreg_args* args, char* msg, size_t cap) {
  return Guarded(msg, cap, [&] {
    GroupedView v;
    if (!ViewTgmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = ValidateLocalGroups(v, msg, cap); s != KREG_OK) return s;
    return ValidatePartition(args, v, msg, cap);
  });
}

// ---- Data class: how skewed the groups are ---------------------------------------
//
// "balanced" when the largest computed group holds at most twice the mean
// rows per computed group, else "skewed" (a few hot experts). Measured on
// this project's machines, the tuned winner changes with it (the variant or
// the tiling, bench/RESULTS.md), so it is part of the tuning key; computed
// per call at dispatch (one pass over group_sizes).
constexpr double kSkewedAbove = 2.0;

kreg_status ClassifySkew(const GroupedView& v, char* out, size_t cap) {
  int64_t sum = 0, largest = 0;
  for (int64_t g = v.group_offset; g < v.group_offset + v.local_groups; ++g) {
    const int64_t size = v.GroupSize(g);
    sum += size;
    largest = std::max(largest, size);
  }
  const bool skewed = sum > 0 && static_cast<double>(largest) * static_cast<double>(v.local_groups) >
                                     kSkewedAbove * static_cast<double>(sum);
  std::snprintf(out, cap, "%s", skewed ? "skewed" : "balanced");
  return KREG_OK;
}

kreg_status GmmDataClass(const kreg_args* args, char* out, size_t cap) {
  return Guarded(out, cap, [&] {
    GroupedView v;
    if (!ViewGmm(args, &v, out, cap)) return KREG_INVALID_ARGUMENT;
    return ClassifySkew(v, out, cap);
  });
}

kreg_status TgmmDataClass(const kreg_args* args, char* out, size_t cap) {
  return Guarded(out, cap, [&] {
    GroupedView v;
    if (!ViewTgmm(args, &v, out, cap)) return KREG_INVALID_ARGUMENT;
    return ClassifySkew(v, out, cap);
  });
}

}  // namespace

const kreg_op_desc kGmmOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "gmm",
    .doc = "grouped matmul: each block of rows of lhs [m, k] times its group's rhs [k, n]",
    .dims = kGmmDims,
    .num_dims = kGmmNumDims,
    .tensors = kGmmTensors,
    .num_tensors = kGmmNumTensors,
    .attrs = kGmmAttrs,
    .num_attrs = kGmmNumAttrs,
    .validate = ValidateGmm,
    .data_class = GmmDataClass,
    .default_variants = kDefaultVariants,
    .num_default_variants = 1,
};

const kreg_op_desc kTgmmOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "tgmm",
    .doc = "transposed grouped matmul: per group, lhs[:, its rows] [k, m_g] times rhs[its rows] [m_g, n]",
    .dims = kTgmmDims,
    .num_dims = kTgmmNumDims,
    .tensors = kTgmmTensors,
    .num_tensors = kTgmmNumTensors,
    .attrs = kTgmmAttrs,
    .num_attrs = kTgmmNumAttrs,
    .validate = ValidateTgmm,
    .data_class = TgmmDataClass,
    .default_variants = kDefaultVariants,
    .num_default_variants = 1,
};

}  // namespace kreg::gmm
