// torch.ops.kreg.topk, gmm and tgmm on CPU and CUDA tensors, in C++: the
// tensors are seen as DLTensors where they lie, outputs made with at::empty
// (on the inputs' device), and the op run through a kreg.Dispatcher by the
// bridge (python/src/bridge.h), so a call costs PyTorch's dispatch, the
// Dispatcher's remembered answer and the kernel. CUDA tensors run on
// PyTorch's current stream of their device, not waited for, as PyTorch's
// own CUDA ops; this needs no CUDA header or library (c10's device-generic
// streams), so no build option guards it. The schemas are defined here; their fake implementations and
// autograd formulas are registered by kreg/torch.py, which loads this
// library and hands it the Dispatcher (kreg_torch_use).
//
// Built against the libtorch of the framework Python (KREG_FRAMEWORK_PYTHON)
// and nothing of kreg's C++ but the plugin ABI and the ops' layouts.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "bridge.h"
#include "kreg/gmm/layout.h"
#include "kreg/topk/layout.h"

namespace kreg::torch_ops {
namespace {

struct Bridge {
  kreg_bridge_run_fn run = nullptr;
  const void* dispatcher = nullptr;
  kreg_bridge_run_on_stream_fn run_on_stream = nullptr;
};
std::atomic<const Bridge*> g_bridge{nullptr};

// A tensor seen as a DLTensor; holds the tensor (a contiguous copy when its
// last dimension is strided).
class View {
 public:
  View() = default;
  // `device`: the call's (its first tensor's); every tensor must be there.
  View(const at::Tensor& t, const char* name, const c10::Device& device) : tensor_(t) {
    TORCH_CHECK_VALUE(t.device() == device, "kreg: '", name, "' is on ", t.device().str(), " and the call on ",
                      device.str(), ": a call's tensors must all be on one device");
    TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(), "kreg: '", name, "' is on ", device.str(),
                      "; kreg's PyTorch ops take CPU and CUDA tensors");
    if (t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1) tensor_ = t.contiguous();
    switch (t.scalar_type()) {
      case at::kFloat:
        dl_.dtype = {kDLFloat, 32, 1};
        break;
      case at::kBFloat16:
        dl_.dtype = {kDLBfloat, 16, 1};
        break;
      case at::kInt:
        dl_.dtype = {kDLInt, 32, 1};
        break;
      default:
        TORCH_CHECK_VALUE(false, "kreg: '", name, "': dtype torch.", c10::getDtypeNames(t.scalar_type()).first,
                          " is not one kreg speaks: torch.float32, torch.bfloat16 or torch.int32");
    }
    dl_.data = tensor_.data_ptr();
    dl_.device = device.is_cuda() ? DLDevice{kDLCUDA, device.index()} : DLDevice{kDLCPU, 0};
    dl_.ndim = static_cast<int32_t>(tensor_.dim());
    dl_.shape = const_cast<int64_t*>(tensor_.sizes().data());
    dl_.strides = const_cast<int64_t*>(tensor_.strides().data());
    dl_.byte_offset = 0;
  }
  DLTensor* dl() { return tensor_.defined() ? &dl_ : nullptr; }

 private:
  at::Tensor tensor_;
  DLTensor dl_{};
};

// On CUDA tensors: on PyTorch's current stream of `device` (made current).
template <size_t kTensors, size_t kDims, size_t kAttrs>
void Run(const char* op, const c10::Device& device, std::array<View, kTensors>& views,
         const std::array<int64_t, kDims>& dims, const std::array<int64_t, kAttrs>& attrs) {
  const Bridge* bridge = g_bridge.load(std::memory_order_acquire);
  TORCH_CHECK(bridge != nullptr, "kreg: torch.ops.kreg.", op, " was called before kreg.torch was imported");
  std::array<DLTensor*, kTensors> tensors;
  for (size_t t = 0; t < kTensors; ++t) tensors[t] = views[t].dl();
  std::array<kreg_scalar, kAttrs == 0 ? 1 : kAttrs> scalars{};
  for (size_t a = 0; a < kAttrs; ++a) scalars[a].i = attrs[a];
  kreg_args args{};
  args.struct_size = sizeof(kreg_args);
  args.tensors = tensors.data();
  args.num_tensors = kTensors;
  args.dims = dims.data();
  args.num_dims = kDims;
  args.attrs = scalars.data();
  args.num_attrs = kAttrs;
  char error[512];
  int code;
  if (device.is_cuda()) {
    TORCH_CHECK(bridge->run_on_stream != nullptr, "kreg: this kreg runs no CUDA tensors");
    const c10::DeviceGuard guard(device);
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
    code = bridge->run_on_stream(bridge->dispatcher, op, &args, device.index(), stream.native_handle(), error,
                                 sizeof(error));
  } else {
    code = bridge->run(bridge->dispatcher, op, &args, 0, error, sizeof(error));
  }
  switch (code) {
    case KREG_BRIDGE_OK:
      return;
    case KREG_BRIDGE_BAD_ARGUMENT:
      TORCH_CHECK_VALUE(false, error);
    default:
      TORCH_CHECK(false, error);
  }
}

at::ScalarType OutType(const at::Tensor& lhs, std::optional<at::ScalarType> out_dtype) {
  return out_dtype.value_or(lhs.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> Topk(const at::Tensor& input, int64_t k, bool largest,
                                        const std::optional<at::Tensor>& row_starts,
                                        const std::optional<at::Tensor>& row_ends) {
  TORCH_CHECK_VALUE(input.dim() == 2, "kreg.topk: input must be [batch, n], got ", input.dim(), " dimensions");
  TORCH_CHECK_VALUE(k >= 0, "topk: k=", k, " must be >= 0");
  at::Tensor values = at::empty({input.size(0), k}, input.options());
  at::Tensor indices = at::empty({input.size(0), k}, input.options().dtype(at::kInt));
  std::array<View, topk::kNumTensors> views;
  views[topk::kInput] = View(input, "input", input.device());
  if (row_starts) views[topk::kRowStarts] = View(*row_starts, "row_starts", input.device());
  if (row_ends) views[topk::kRowEnds] = View(*row_ends, "row_ends", input.device());
  views[topk::kValues] = View(values, "values", input.device());
  views[topk::kIndices] = View(indices, "indices", input.device());
  std::array<int64_t, topk::kNumDims> dims;
  dims[topk::kBatch] = input.size(0);
  dims[topk::kN] = input.size(1);
  dims[topk::kK] = k;
  std::array<int64_t, topk::kNumAttrs> attrs;
  attrs[topk::kLargest] = largest ? 1 : 0;
  Run("topk", input.device(), views, dims, attrs);
  return {values, indices};
}

at::Tensor Gmm(const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& group_sizes, bool transpose_rhs,
               int64_t group_offset, const std::optional<at::Tensor>& existing_out,
               std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK_VALUE(lhs.dim() == 2 && rhs.dim() == 3 && group_sizes.dim() == 1,
                    "kreg.gmm: lhs must be [m, k], rhs [groups, k, n] and group_sizes [groups]");
  const int64_t n = transpose_rhs ? rhs.size(1) : rhs.size(2);
  at::Tensor out = at::empty({lhs.size(0), n}, lhs.options().dtype(OutType(lhs, out_dtype)));
  std::array<View, gmm::kGmmNumTensors> views;
  views[gmm::kGmmLhs] = View(lhs, "lhs", lhs.device());
  views[gmm::kGmmRhs] = View(rhs, "rhs", lhs.device());
  views[gmm::kGmmGroupSizes] = View(group_sizes, "group_sizes", lhs.device());
  views[gmm::kGmmOut] = View(out, "out", lhs.device());
  if (existing_out) views[gmm::kGmmExistingOut] = View(*existing_out, "existing_out", lhs.device());
  std::array<int64_t, gmm::kGmmNumDims> dims;
  dims[gmm::kGmmM] = lhs.size(0);
  dims[gmm::kGmmK] = lhs.size(1);
  dims[gmm::kGmmN] = n;
  dims[gmm::kGmmGroups] = group_sizes.size(0);
  dims[gmm::kGmmLocalGroups] = rhs.size(0);
  std::array<int64_t, gmm::kGmmNumAttrs> attrs;
  attrs[gmm::kGmmTransposeRhs] = transpose_rhs ? 1 : 0;
  attrs[gmm::kGmmGroupOffset] = group_offset;
  attrs[gmm::kGmmConstantWeights] = 0;
  Run("gmm", lhs.device(), views, dims, attrs);
  return out;
}

at::Tensor Tgmm(const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& group_sizes, int64_t group_offset,
                std::optional<int64_t> local_groups, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK_VALUE(lhs.dim() == 2 && rhs.dim() == 2 && group_sizes.dim() == 1,
                    "kreg.tgmm: lhs must be [k, m], rhs [m, n] and group_sizes [groups]");
  const int64_t local = local_groups.value_or(group_sizes.size(0));
  TORCH_CHECK_VALUE(local >= 0, "kreg.tgmm: local_groups=", local, " must be >= 0");
  at::Tensor out = at::empty({local, lhs.size(0), rhs.size(1)}, lhs.options().dtype(OutType(lhs, out_dtype)));
  std::array<View, gmm::kTgmmNumTensors> views;
  views[gmm::kTgmmLhs] = View(lhs, "lhs", lhs.device());
  views[gmm::kTgmmRhs] = View(rhs, "rhs", lhs.device());
  views[gmm::kTgmmGroupSizes] = View(group_sizes, "group_sizes", lhs.device());
  views[gmm::kTgmmOut] = View(out, "out", lhs.device());
  std::array<int64_t, gmm::kTgmmNumDims> dims;
  dims[gmm::kTgmmK] = lhs.size(0);
  dims[gmm::kTgmmM] = lhs.size(1);
  dims[gmm::kTgmmN] = rhs.size(1);
  dims[gmm::kTgmmGroups] = group_sizes.size(0);
  dims[gmm::kTgmmLocalGroups] = local;
  std::array<int64_t, gmm::kTgmmNumAttrs> attrs;
  attrs[gmm::kTgmmGroupOffset] = group_offset;
  Run("tgmm", lhs.device(), views, dims, attrs);
  return out;
}

}  // namespace
}  // namespace kreg::torch_ops

// Hands the shim the bridge's entries and the Dispatcher every call runs
// through (kreg.Dispatcher._bridge()); the previous ones are kept, never
// freed, so a call in flight on another thread finishes on them.
extern "C" __attribute__((visibility("default"))) void kreg_torch_use(uintptr_t run, uintptr_t dispatcher,
                                                                      uintptr_t run_on_stream) {
  auto* bridge = new kreg::torch_ops::Bridge{reinterpret_cast<kreg_bridge_run_fn>(run),
                                             reinterpret_cast<const void*>(dispatcher),
                                             reinterpret_cast<kreg_bridge_run_on_stream_fn>(run_on_stream)};
  kreg::torch_ops::g_bridge.store(bridge, std::memory_order_release);
}

TORCH_LIBRARY(kreg, m) {
  m.def("topk(Tensor input, int k, bool largest=True, Tensor? row_starts=None, Tensor? row_ends=None)"
        " -> (Tensor values, Tensor indices)");
  m.def("gmm(Tensor lhs, Tensor rhs, Tensor group_sizes, bool transpose_rhs=False, int group_offset=0,"
        " Tensor? existing_out=None, ScalarType? out_dtype=None) -> Tensor");
  m.def("tgmm(Tensor lhs, Tensor rhs, Tensor group_sizes, int group_offset=0, int? local_groups=None,"
        " ScalarType? out_dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(kreg, CPU, m) {
  m.impl("topk", &kreg::torch_ops::Topk);
  m.impl("gmm", &kreg::torch_ops::Gmm);
  m.impl("tgmm", &kreg::torch_ops::Tgmm);
}

// The same functions: a call's device is its tensors'.
TORCH_LIBRARY_IMPL(kreg, CUDA, m) {
  m.impl("topk", &kreg::torch_ops::Topk);
  m.impl("gmm", &kreg::torch_ops::Gmm);
  m.impl("tgmm", &kreg::torch_ops::Tgmm);
}
