// torch.ops.kreg's autograd kernels, in C++ so a call pays no Python for
// them (docs/DESIGN.md §9, Framework bindings, has the formulas). Each
// backward calls the ops again through PyTorch's dispatcher, so the
// gradients' grouped matmuls are kreg's, dispatched, and traceable by
// torch.compile (kreg/torch.py registers the fake implementations).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace kreg::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor Gmm(const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& group_sizes, bool transpose_rhs,
               int64_t group_offset, const std::optional<at::Tensor>& existing_out,
               std::optional<at::ScalarType> out_dtype) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("kreg::gmm", "").typed<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, int64_t, const std::optional<at::Tensor>&,
      std::optional<at::ScalarType>)>();
  return op.call(lhs, rhs, group_sizes, transpose_rhs, group_offset, existing_out, out_dtype);
}

at::Tensor Tgmm(const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& group_sizes, int64_t group_offset,
                std::optional<int64_t> local_groups, std::optional<at::ScalarType> out_dtype) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("kreg::tgmm", "").typed<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, std::optional<int64_t>,
      std::optional<at::ScalarType>)>();
  return op.call(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype);
}

std::tuple<at::Tensor, at::Tensor> Topk(const at::Tensor& input, int64_t k, bool largest,
                                        const std::optional<at::Tensor>& row_starts,
                                        const std::optional<at::Tensor>& row_ends) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("kreg::topk", "").typed<std::tuple<
      at::Tensor, at::Tensor>(const at::Tensor&, int64_t, bool, const std::optional<at::Tensor>&,
                              const std::optional<at::Tensor>&)>();
  return op.call(input, k, largest, row_starts, row_ends);
}

// Two operands in one dtype: float32 where theirs differ (a bf16 rhs, a
// float32 gradient), as kreg's grouped matmuls take one dtype.
std::pair<at::Tensor, at::Tensor> Pair(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == b.scalar_type()) return {a, b};
  return {a.to(at::kFloat), b.to(at::kFloat)};
}

// out = gmm(lhs, rhs) (+ existing_out): d lhs = gmm(g, rhs, !transpose_rhs);
// d rhs = tgmm(lhs^T, g), or tgmm(g^T, lhs) for a transposed rhs;
// d existing_out = g.
struct GmmFunction : public torch::autograd::Function<GmmFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& lhs, const at::Tensor& rhs,
                            const at::Tensor& group_sizes, bool transpose_rhs, int64_t group_offset,
                            const std::optional<at::Tensor>& existing_out, std::optional<at::ScalarType> out_dtype) {
    ctx->save_for_backward({lhs, rhs, group_sizes});
    ctx->saved_data["transpose_rhs"] = transpose_rhs;
    ctx->saved_data["group_offset"] = group_offset;
    ctx->saved_data["has_existing"] = existing_out.has_value() && existing_out->defined();
    at::AutoDispatchBelowADInplaceOrView below;
    return Gmm(lhs, rhs, group_sizes, transpose_rhs, group_offset, existing_out, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &lhs = saved[0], &rhs = saved[1], &group_sizes = saved[2];
    const bool transpose_rhs = ctx->saved_data["transpose_rhs"].toBool();
    const int64_t group_offset = ctx->saved_data["group_offset"].toInt();
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor grad_lhs, grad_rhs, grad_existing;
    if (ctx->needs_input_grad(0)) {
      auto [g, w] = Pair(grad, rhs);
      grad_lhs = Gmm(g, w, group_sizes, !transpose_rhs, group_offset, std::nullopt, std::nullopt)
                     .to(lhs.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      auto [g, x] = Pair(grad, lhs);
      grad_rhs = (transpose_rhs ? Tgmm(g.t().contiguous(), x, group_sizes, group_offset, rhs.size(0), std::nullopt)
                                : Tgmm(x.t().contiguous(), g, group_sizes, group_offset, rhs.size(0), std::nullopt))
                     .to(rhs.scalar_type());
    }
    // needs_input_grad counts the tensors given: existing_out is the fourth.
    if (ctx->saved_data["has_existing"].toBool() && ctx->needs_input_grad(3)) grad_existing = grads[0];
    return {grad_lhs, grad_rhs, at::Tensor(), at::Tensor(), at::Tensor(), grad_existing, at::Tensor()};
  }
};

// out[i] = lhs[:, rows of g] . rhs[rows of g]: d lhs = gmm(rhs, g,
// transpose_rhs)^T; d rhs = gmm(lhs^T, g).
struct TgmmFunction : public torch::autograd::Function<TgmmFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& lhs, const at::Tensor& rhs,
                            const at::Tensor& group_sizes, int64_t group_offset, std::optional<int64_t> local_groups,
                            std::optional<at::ScalarType> out_dtype) {
    ctx->save_for_backward({lhs, rhs, group_sizes});
    ctx->saved_data["group_offset"] = group_offset;
    at::AutoDispatchBelowADInplaceOrView below;
    return Tgmm(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &lhs = saved[0], &rhs = saved[1], &group_sizes = saved[2];
    const int64_t group_offset = ctx->saved_data["group_offset"].toInt();
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor grad_lhs, grad_rhs;
    if (ctx->needs_input_grad(0)) {
      auto [r, g] = Pair(rhs, grad);
      grad_lhs = Gmm(r, g, group_sizes, true, group_offset, std::nullopt, std::nullopt).t().to(lhs.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      auto [x, g] = Pair(lhs, grad);
      grad_rhs = Gmm(x.t().contiguous(), g, group_sizes, false, group_offset, std::nullopt, std::nullopt)
                     .to(rhs.scalar_type());
    }
    return {grad_lhs, grad_rhs, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The values' gradient scattered to the chosen indices; padding (-1, past a
// short row range) sends its gradient nowhere.
struct TopkFunction : public torch::autograd::Function<TopkFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, int64_t k, bool largest,
                               const std::optional<at::Tensor>& row_starts,
                               const std::optional<at::Tensor>& row_ends) {
    at::Tensor values, indices;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(values, indices) = Topk(input, k, largest, row_starts, row_ends);
    }
    ctx->mark_non_differentiable({indices});
    ctx->save_for_backward({indices});
    ctx->saved_data["n"] = input.size(1);
    ctx->saved_data["dtype"] = static_cast<int64_t>(input.scalar_type());
    return {values, indices};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    const int64_t n = ctx->saved_data["n"].toInt();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    at::Tensor grad;
    if (grads[0].defined()) {
      const at::Tensor index = at::where(indices.ge(0), indices, n).to(at::kLong);
      at::Tensor wide = at::zeros({indices.size(0), n + 1}, grads[0].options().dtype(dtype));
      wide.scatter_add_(1, index, grads[0].to(dtype));
      grad = wide.narrow(1, 0, n);
    }
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> TopkAutograd(const at::Tensor& input, int64_t k, bool largest,
                                                const std::optional<at::Tensor>& row_starts,
                                                const std::optional<at::Tensor>& row_ends) {
  variable_list out = TopkFunction::apply(input, k, largest, row_starts, row_ends);
  return {out[0], out[1]};
}

at::Tensor GmmAutograd(const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& group_sizes,
                       bool transpose_rhs, int64_t group_offset, const std::optional<at::Tensor>& existing_out,
                       std::optional<at::ScalarType> out_dtype) {
  return GmmFunction::apply(lhs, rhs, group_sizes, transpose_rhs, group_offset, existing_out, out_dtype);
}

at::Tensor TgmmAutograd(const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& group_sizes,
                        int64_t group_offset, std::optional<int64_t> local_groups,
                        std::optional<at::ScalarType> out_dtype) {
  return TgmmFunction::apply(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype);
}

}  // namespace
}  // namespace kreg::torch_ops

TORCH_LIBRARY_IMPL(kreg, Autograd, m) {
  m.impl("topk", &kreg::torch_ops::TopkAutograd);
  m.impl("gmm", &kreg::torch_ops::GmmAutograd);
  m.impl("tgmm", &kreg::torch_ops::TgmmAutograd);
}
