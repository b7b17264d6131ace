// Op "transpose": out[j, i] = x[i, j], a bit-for-bit copy (NaN payloads,
// -0 and subnormals stay as they are).
//
// dims     rows, cols.
// tensors  x    [rows, cols]  f32, bf16 or i32.
//          out  [cols, rows]  x's dtype.
//
// A small family kept whole in its folder: descriptors (here), layout
// (include/kreg/transpose/layout.h), kernels, conformance cases, benchmark
// and fuzz seeds.
#include <string_view>

#include "common.h"

namespace kreg::transpose {
namespace {

constexpr kreg_dim_desc kRowsDim = {.struct_size = sizeof(kreg_dim_desc), .name = "rows", .doc = "x's rows"};
constexpr kreg_dim_desc kColsDim = {.struct_size = sizeof(kreg_dim_desc), .name = "cols", .doc = "x's columns"};
constexpr const kreg_dim_desc* kDims[] = {&kRowsDim, &kColsDim};

constexpr uint32_t kDtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16 | KREG_DTYPE_I32;
constexpr kreg_tensor_desc kXTensor = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "x",
    .doc = "the matrix",
    .role = KREG_ROLE_IN,
    .dtypes = kDtypes,
    .shape = "rows,cols",
};
constexpr kreg_tensor_desc kOutTensor = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "out",
    .doc = "its transpose, bit for bit",
    .role = KREG_ROLE_OUT,
    .dtypes = kDtypes,
    .same_dtype_as = "x",
    .shape = "cols,rows",
};
constexpr const kreg_tensor_desc* kTensors[] = {&kXTensor, &kOutTensor};

// The kernels read arguments by layout.h's positions: keep them in step.
constexpr bool Named(const char* got, std::string_view want) { return std::string_view(got) == want; }
static_assert(sizeof kDims / sizeof kDims[0] == kNumDims && Named(kDims[kRows]->name, "rows") &&
              Named(kDims[kCols]->name, "cols"));
static_assert(sizeof kTensors / sizeof kTensors[0] == kNumTensors && Named(kTensors[kX]->name, "x") &&
              Named(kTensors[kOut]->name, "out"));

const char* const kDefaultVariants[] = {"blocked"};

}  // namespace

const kreg_op_desc kTransposeOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "transpose",
    .doc = "out[j, i] = x[i, j], bit for bit",
    .dims = kDims,
    .num_dims = kNumDims,
    .tensors = kTensors,
    .num_tensors = kNumTensors,
    .default_variants = kDefaultVariants,
    .num_default_variants = 1,
};

}  // namespace kreg::transpose
