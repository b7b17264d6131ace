// The typed convenience front of op "topk", over the generic call (kreg_args
// run by a Kernel or a Dispatcher): outputs allocated, arguments laid out.
// Header-only; lives with its family (plugins/topk/include), installed as
// kreg/topk.h. The op itself (validation, reference and semantics) is
// declared by the topk plugin; its argument layout is kreg/topk/layout.h.
//
//   auto dispatcher = kreg::Dispatcher::Create(**registry, *db);
//   auto result = kreg::TopK(*dispatcher, logits, /*k=*/64);  // values + indices
//
// Thread-safety: the functions are thread-safe on distinct inputs.
#ifndef KREG_TOPK_H_
#define KREG_TOPK_H_

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kreg/dispatch.h"
#include "kreg/params.h"
#include "kreg/plugin_abi.h"
#include "kreg/registry.h"
#include "kreg/tensor.h"
#include "kreg/topk/layout.h"

namespace kreg {

struct TopKOptions {
  bool largest = true;
  const Tensor* row_starts = nullptr;  // int32 [batch], or nullptr
  const Tensor* row_ends = nullptr;    // int32 [batch], or nullptr
  RunOptions run;
};

struct TopKResult {
  Tensor values;   // [batch, k], the input's dtype
  Tensor indices;  // [batch, k], int32
};

namespace topk_internal {

inline constexpr char kOp[] = "topk";

// The op's arguments, pointing at the caller's tensors and `result`.
struct Call {
  DLTensor* tensors[topk::kNumTensors] = {};
  int64_t dims[topk::kNumDims] = {};
  kreg_scalar attrs[topk::kNumAttrs] = {};
  kreg_args args{};
};

// Checks the input's shape and k, allocates `result` and lays out `call`.
// The rest (dtypes, row ranges, strides) is the op's validation, at the run.
inline absl::Status Prepare(const Tensor& input, int64_t k, const TopKOptions& options,
                            TopKResult* result, Call* call) {
  if (input.shape().size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("topk: input must be 2-D [batch, n], got ",
                                                   input.ShapeString()));
  }
  const int64_t batch = input.dim(0), n = input.dim(1);
  if (k < 0 || k > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk: k=", k, " is not within [0, n=", n, "]"));
  }
  absl::StatusOr<Tensor> values = Tensor::Make(input.dtype(), {batch, k});
  if (!values.ok()) return values.status();
  absl::StatusOr<Tensor> indices = Tensor::Make(DType::kI32, {batch, k});
  if (!indices.ok()) return indices.status();
  result->values = *std::move(values);
  result->indices = *std::move(indices);
  // Inputs are only read (kreg_args' contract); the ABI's pointers are not const.
  auto in = [](const Tensor* t) { return t == nullptr ? nullptr : const_cast<DLTensor*>(t->dl()); };
  call->tensors[topk::kInput] = in(&input);
  call->tensors[topk::kRowStarts] = in(options.row_starts);
  call->tensors[topk::kRowEnds] = in(options.row_ends);
  call->tensors[topk::kValues] = result->values.dl();
  call->tensors[topk::kIndices] = result->indices.dl();
  call->tensors[topk::kStats] = nullptr;  // not asked for
  call->dims[topk::kBatch] = batch;
  call->dims[topk::kN] = n;
  call->dims[topk::kK] = k;
  call->attrs[topk::kLargest].i = options.largest ? 1 : 0;
  call->args = {};
  call->args.struct_size = sizeof(kreg_args);
  call->args.flags = 0;
  call->args.tensors = call->tensors;
  call->args.num_tensors = topk::kNumTensors;
  call->args.dims = call->dims;
  call->args.num_dims = topk::kNumDims;
  call->args.attrs = call->attrs;
  call->args.num_attrs = topk::kNumAttrs;
  return absl::OkStatus();
}

}  // namespace topk_internal

// Runs `kernel` (a kernel of op "topk") with `config` on `input` [batch, n].
inline absl::StatusOr<TopKResult> TopK(const Kernel& kernel, const Config& config,
                                       const Tensor& input, int64_t k,
                                       const TopKOptions& options = {}) {
  if (kernel.op() != topk_internal::kOp) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel.name(), " is not a kernel of op '", topk_internal::kOp, "'"));
  }
  TopKResult result;
  topk_internal::Call call;
  if (absl::Status s = topk_internal::Prepare(input, k, options, &result, &call); !s.ok()) return s;
  if (absl::Status s = kernel.Run(config, call.args, options.run); !s.ok()) return s;
  return result;
}

// Runs op "topk" on `input` [batch, n] with whatever `dispatcher`'s table
// picks; `how` (if not null) says what ran.
inline absl::StatusOr<TopKResult> TopK(const Dispatcher& dispatcher, const Tensor& input, int64_t k,
                                       const TopKOptions& options = {},
                                       DispatchResult* how = nullptr) {
  TopKResult result;
  topk_internal::Call call;
  if (absl::Status s = topk_internal::Prepare(input, k, options, &result, &call); !s.ok()) return s;
  absl::StatusOr<DispatchResult> ran = dispatcher.Run(topk_internal::kOp, call.args, options.run);
  if (!ran.ok()) return ran.status();
  if (how != nullptr) *how = *std::move(ran);
  return result;
}

}  // namespace kreg

#endif  // KREG_TOPK_H_
