// The typed front of op "topk": argument validation, the plain reference,
// and a convenience call on owned Tensors. Semantics: kreg_topk_args in
// kreg/plugin_abi.h.
//
// Thread-safety: all functions are thread-safe on distinct outputs.
#ifndef KREG_REGISTRY_TOPK_H_
#define KREG_REGISTRY_TOPK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kreg/plugin_abi.h"
#include "kreg/registry.h"
#include "kreg/tensor.h"

namespace kreg {

// InvalidArgument naming the offending argument: shapes, dtypes, strides,
// devices, k outside [0, n], a row range outside [0, n] or reversed.
absl::Status ValidateTopK(const kreg_topk_args& args);

// The reference: a full stable sort of each row's range under kreg's order.
// REQUIRES: ValidateTopK(args).ok().
void ReferenceTopK(const kreg_topk_args& args);

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

// Allocates `result` for `input` [batch, n] and k, and returns the args
// struct pointing at them (and at options' row ranges).
absl::StatusOr<kreg_topk_args> PrepareTopK(const Tensor& input, int64_t k, const TopKOptions& options,
                                           TopKResult* result);

// Runs `kernel` (an op "topk" kernel) with `config` on `input` [batch, n].
absl::StatusOr<TopKResult> TopK(const Kernel& kernel, const Config& config,
                                const Tensor& input, int64_t k,
                                const TopKOptions& options = {});

}  // namespace kreg

#endif  // KREG_REGISTRY_TOPK_H_
