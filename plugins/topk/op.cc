// Op "topk": the k best elements of each row, sorted best first.
//
// dims     batch (rows), n (row length; indices are int32, so n <= INT32_MAX),
//          k (results per row, 0 <= k <= n).
// attrs    largest  1: largest first; 0: smallest first.
// tensors  input       [batch, n]  f32 or bf16.
//          row_starts  optional int32 [batch]; row_ends  optional int32
//                      [batch] (absent: 0 and n). Row r considers only
//                      columns [row_starts[r], row_ends[r]),
//                      0 <= start <= end <= n.
//          values      [batch, k]  the input's dtype.
//          indices     [batch, k]  int32 global column indices.
//          stats       optional int32 [batch], never compared: a per-row
//                      statistic each kernel documents (topk/blockwise: the
//                      depth d whose top-d of every block was the superset,
//                      m-1 when the rule held at m, k when the row fell back;
//                      a row cut into column chunks reports its deepest
//                      chunk). Other kernels write 0.
//
// Order: NaN (either sign) compares above +inf; -0 equals +0; equal values
// are ordered by ascending index. A row whose range holds fewer than k
// elements fills its tail with index -1 and value -inf (largest) or +inf
// (smallest). Outputs are compared bit for bit.
#include <cinttypes>
#include <cstdio>
#include <string_view>

#include "common.h"
#include "kreg/plugin_abi.h"
#include "variants.h"

namespace kreg::topk {
namespace {

constexpr kreg_dim_desc kBatchDim = {.struct_size = sizeof(kreg_dim_desc), .name = "batch", .doc = "rows"};
constexpr kreg_dim_desc kNDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "n", .doc = "row length", .max = INT32_MAX};
constexpr kreg_dim_desc kKDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "k", .doc = "results per row, at most n"};
constexpr const kreg_dim_desc* kDims[] = {&kBatchDim, &kNDim, &kKDim};

constexpr kreg_tensor_desc kInputTensor = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "input",
    .doc = "the rows to select from",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .shape = "batch,n",
};
constexpr kreg_tensor_desc kRowStartsTensor = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "row_starts",
    .doc = "first column of each row's range (absent: 0)",
    .role = KREG_ROLE_IN,
    .flags = KREG_TENSOR_OPTIONAL,
    .dtypes = KREG_DTYPE_I32,
    .shape = "batch",
    .gen = KREG_GEN_RANGE_START,
    .gen_dim = "n",
};
constexpr kreg_tensor_desc kRowEndsTensor = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "row_ends",
    .doc = "one past the last column of each row's range (absent: n)",
    .role = KREG_ROLE_IN,
    .flags = KREG_TENSOR_OPTIONAL,
    .dtypes = KREG_DTYPE_I32,
    .shape = "batch",
    .gen = KREG_GEN_RANGE_END,
    .gen_dim = "n",
};
constexpr kreg_tensor_desc kValuesTensor = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "values",
    .doc = "the k best values of each row, best first; padding -inf (largest) or +inf",
    .role = KREG_ROLE_OUT,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .same_dtype_as = "input",
    .shape = "batch,k",
};
constexpr kreg_tensor_desc kIndicesTensor = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "indices",
    .doc = "their global column indices; padding -1",
    .role = KREG_ROLE_OUT,
    .dtypes = KREG_DTYPE_I32,
    .shape = "batch,k",
};
constexpr kreg_tensor_desc kStatsTensor = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "stats",
    .doc = "a per-row statistic the kernel documents (blockwise: its stop depth; others: 0)",
    .role = KREG_ROLE_OUT,
    .flags = KREG_TENSOR_OPTIONAL | KREG_TENSOR_UNCHECKED,
    .dtypes = KREG_DTYPE_I32,
    .shape = "batch",
};
constexpr const kreg_tensor_desc* kTensors[] = {&kInputTensor,  &kRowStartsTensor, &kRowEndsTensor,
                                                &kValuesTensor, &kIndicesTensor,   &kStatsTensor};

constexpr kreg_attr_desc kLargestAttr = {
    .struct_size = sizeof(kreg_attr_desc),
    .name = "largest",
    .doc = "1: the largest first; 0: the smallest first",
    .kind = KREG_ATTR_INT,
    .default_value = {.i = 1},
    .min = {.i = 0},
    .max = {.i = 1},
};
constexpr const kreg_attr_desc* kAttrs[] = {&kLargestAttr};

// common.h's TopKArgs reads args by these indices: keep them in step.
constexpr bool Named(const char* got, std::string_view want) { return std::string_view(got) == want; }
static_assert(sizeof kDims / sizeof kDims[0] == kNumDims && Named(kDims[kBatch]->name, "batch") &&
              Named(kDims[kN]->name, "n") && Named(kDims[kK]->name, "k"));
static_assert(sizeof kTensors / sizeof kTensors[0] == kNumTensors && Named(kTensors[kInput]->name, "input") &&
              Named(kTensors[kRowStarts]->name, "row_starts") && Named(kTensors[kRowEnds]->name, "row_ends") &&
              Named(kTensors[kValues]->name, "values") && Named(kTensors[kIndices]->name, "indices") &&
              Named(kTensors[kStats]->name, "stats"));
static_assert(sizeof kAttrs / sizeof kAttrs[0] == kNumAttrs && Named(kAttrs[kLargest]->name, "largest"));

// What the host cannot check from the descriptor: k <= n, and (when the data
// may be read) every row's range within [0, n] and not reversed.
kreg_status Validate(const kreg_args* args, char* msg, size_t cap) {
  TopKArgs a;
  if (!MakeTopKArgs(args, &a, msg, cap)) return KREG_INVALID_ARGUMENT;
  const int64_t batch = args->dims[kBatch], n = args->dims[kN];
  if (a.k < 0) {
    std::snprintf(msg, cap, "k=%" PRId64 " is negative", a.k);
    return KREG_INVALID_ARGUMENT;
  }
  if (a.k > n) {
    std::snprintf(msg, cap, "k=%" PRId64 " exceeds the row length n=%" PRId64, a.k, n);
    return KREG_INVALID_ARGUMENT;
  }
  if ((args->flags & KREG_ARGS_SHAPE_ONLY) != 0 || (a.row_starts == nullptr && a.row_ends == nullptr)) {
    return KREG_OK;
  }
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t start = a.row_starts ? RowPtr<const int32_t>(a.row_starts, 0)[r] : 0;
    const int64_t end = a.row_ends ? RowPtr<const int32_t>(a.row_ends, 0)[r] : n;
    if (start < 0 || end > n || start > end) {
      std::snprintf(msg, cap,
                    "row %" PRId64 " has range [%" PRId64 ", %" PRId64 "), not within [0, n=%" PRId64
                    "] with start <= end",
                    r, start, end, n);
      return KREG_INVALID_ARGUMENT;
    }
  }
  return KREG_OK;
}

const char* const kDefaultVariants[] = {"radix", "sort"};

}  // namespace

const kreg_op_desc kTopKOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "topk",
    .doc = "the k best elements of each row of [batch, n], sorted best first",
    .dims = kDims,
    .num_dims = kNumDims,
    .tensors = kTensors,
    .num_tensors = kNumTensors,
    .attrs = kAttrs,
    .num_attrs = kNumAttrs,
    .validate = Validate,
    .default_variants = kDefaultVariants,
    .num_default_variants = sizeof kDefaultVariants / sizeof kDefaultVariants[0],
};

}  // namespace kreg::topk
