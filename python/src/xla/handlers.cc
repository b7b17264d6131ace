// kreg's topk, gmm and tgmm as XLA FFI handlers on the CPU and on CUDA
// (kreg_xla.h): each builds the op's kreg_args over XLA's buffers, in the
// positions kreg/topk/layout.h and kreg/gmm/layout.h name, and runs the
// kernel the tables chose at trace time through Kernel::Run, which
// validates the call (shapes, dtypes, attributes; on the host also group
// sizes and row ranges) before the kernel sees it. A CUDA handler's buffers
// are on XLA's device and its kernel runs on XLA's stream (a kreg Device
// over it, made per call, as the Python bridge's), not waited for.
#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kreg/device.h"
#include "kreg/gmm/layout.h"
#include "kreg/registry.h"
#include "kreg/topk/layout.h"
#include "kreg_xla.h"
#include "runtime.h"
#include "xla/ffi/api/ffi.h"

namespace kreg::xla {
namespace {

namespace ffi = ::xla::ffi;

// Where a call's buffers are and its kernel runs: the host, or CUDA device
// `device.device_id` on XLA's `stream`.
struct Place {
  DLDevice device{kDLCPU, 0};
  void* stream = nullptr;
};

// One tensor of the call over an XLA buffer (compact row-major, so no
// strides), its leading dims folded when asked.
struct View {
  DLTensor dl{};
  std::array<int64_t, 3> shape{};
};

absl::Status Wrap(absl::string_view op, absl::string_view name, const ffi::AnyBuffer& buffer, size_t rank, bool fold,
                  const Place& place, View* view) {
  const ffi::AnyBuffer::Dimensions dims = buffer.dimensions();
  switch (buffer.element_type()) {
    case ffi::DataType::F32:
      view->dl.dtype = {kDLFloat, 32, 1};
      break;
    case ffi::DataType::BF16:
      view->dl.dtype = {kDLBfloat, 16, 1};
      break;
    case ffi::DataType::S32:
      view->dl.dtype = {kDLInt, 32, 1};
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(op, ": '", name, "' has XLA element type ",
                                                     static_cast<int>(buffer.element_type()),
                                                     ", not one kreg speaks: float32, bfloat16, int32"));
  }
  if (fold ? dims.size() + 1 < rank : dims.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": '", name, "' has ", dims.size(), " dims; expected ",
                                                   rank, fold ? " or more" : ""));
  }
  // Folded: every dim before the last rank-1 multiplies the first.
  const size_t lead = dims.size() - rank + 1;
  int64_t first = 1;
  for (size_t i = 0; i < lead; ++i) first *= dims[i];
  view->shape[0] = first;
  for (size_t i = 1; i < rank; ++i) view->shape[i] = dims[lead + i - 1];
  view->dl.data = buffer.untyped_data();
  view->dl.device = place.device;
  view->dl.ndim = static_cast<int32_t>(rank);
  view->dl.shape = view->shape.data();
  return absl::OkStatus();
}

ffi::Error ToFfi(const absl::Status& status) {
  if (status.ok()) return ffi::Error::Success();
  return ffi::Error(static_cast<XLA_FFI_Error_Code>(status.code()), std::string(status.message()));
}

// Runs the chosen kernel of `op` on the tensors (NULL where absent), dims and
// attributes, in the op's order.
template <size_t T, size_t D, size_t A>
absl::Status Run(absl::string_view op, const Place& place, std::string_view kernel, std::string_view config,
                 int64_t threads, const std::array<DLTensor*, T>& tensors, const std::array<int64_t, D>& dims,
                 const std::array<kreg_scalar, A>& attrs) {
  absl::StatusOr<std::shared_ptr<const Chosen>> chosen =
      Choose(op, absl::string_view(kernel.data(), kernel.size()), absl::string_view(config.data(), config.size()));
  if (!chosen.ok()) return chosen.status();
  kreg_args args{};
  args.struct_size = sizeof(kreg_args);
  args.tensors = tensors.data();
  args.num_tensors = T;
  args.dims = dims.data();
  args.num_dims = D;
  args.attrs = attrs.data();
  args.num_attrs = A;
  RunOptions options;
  if (place.device.device_type == kDLCUDA) {
    absl::StatusOr<std::unique_ptr<Device>> gpu = OpenCudaOnStream(place.device.device_id, place.stream);
    if (!gpu.ok()) return gpu.status();
    args.flags |= KREG_ARGS_ON_DEVICE;
    options.device = (*gpu)->abi();
    return (*chosen)->kernel->Run((*chosen)->config, args, options);
  }
  thread_local Workspace workspace;  // kept between this thread's calls
  options.num_threads = static_cast<int>(threads);
  options.workspace = &workspace;
  return (*chosen)->kernel->Run((*chosen)->config, args, options);
}

// An exception (bad_alloc) as an FFI error: none leaves a handler.
template <typename F>
ffi::Error Guarded(absl::string_view op, F&& body) {
  try {
    return ToFfi(body());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(absl::StrCat(op, ": ", e.what()));
  }
}

ffi::Error Topk(const Place& place, ffi::AnyBuffer input, ffi::RemainingArgs ranges, ffi::Result<ffi::AnyBuffer> values,
                ffi::Result<ffi::AnyBuffer> indices, std::string_view kernel, std::string_view config,
                int64_t threads, int64_t largest, int64_t has_row_starts, int64_t has_row_ends) {
  return Guarded("topk", [&]() -> absl::Status {
    std::array<View, topk::kNumTensors> views;
    std::array<DLTensor*, topk::kNumTensors> tensors{};
    auto wrap = [&](absl::string_view name, const ffi::AnyBuffer& b, size_t rank, int t) {
      tensors[t] = &views[t].dl;
      return Wrap("topk", name, b, rank, /*fold=*/true, place, &views[t]);
    };
    if (absl::Status s = wrap("input", input, 2, topk::kInput); !s.ok()) return s;
    if (ranges.size() != static_cast<size_t>((has_row_starts != 0) + (has_row_ends != 0))) {
      return absl::InvalidArgumentError("topk: the row ranges given disagree with has_row_starts/has_row_ends");
    }
    size_t next = 0;
    for (const auto& [has, name, t] : {std::tuple{has_row_starts, "row_starts", topk::kRowStarts},
                                       std::tuple{has_row_ends, "row_ends", topk::kRowEnds}}) {
      if (has == 0) continue;
      ffi::ErrorOr<ffi::AnyBuffer> b = ranges.get<ffi::AnyBuffer>(next++);
      if (!b.has_value()) return absl::InvalidArgumentError(absl::StrCat("topk: ", name, ": ", b.error().message()));
      if (absl::Status s = wrap(name, *b, 1, t); !s.ok()) return s;
    }
    if (absl::Status s = wrap("values", *values, 2, topk::kValues); !s.ok()) return s;
    if (absl::Status s = wrap("indices", *indices, 2, topk::kIndices); !s.ok()) return s;
    const std::array<int64_t, topk::kNumDims> dims = {views[topk::kInput].shape[0], views[topk::kInput].shape[1],
                                                      views[topk::kValues].shape[1]};
    const std::array<kreg_scalar, topk::kNumAttrs> attrs = {kreg_scalar{.i = largest}};
    return Run("topk", place, kernel, config, threads, tensors, dims, attrs);
  });
}

ffi::Error Gmm(const Place& place, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer group_sizes, ffi::RemainingArgs rest,
               ffi::Result<ffi::AnyBuffer> out, std::string_view kernel, std::string_view config, int64_t threads,
               int64_t transpose_rhs, int64_t group_offset, int64_t has_existing_out) {
  return Guarded("gmm", [&]() -> absl::Status {
    std::array<View, gmm::kGmmNumTensors> views;
    std::array<DLTensor*, gmm::kGmmNumTensors> tensors{};
    auto wrap = [&](absl::string_view name, const ffi::AnyBuffer& b, size_t rank, int t) {
      tensors[t] = &views[t].dl;
      return Wrap("gmm", name, b, rank, /*fold=*/false, place, &views[t]);
    };
    if (absl::Status s = wrap("lhs", lhs, 2, gmm::kGmmLhs); !s.ok()) return s;
    if (absl::Status s = wrap("rhs", rhs, 3, gmm::kGmmRhs); !s.ok()) return s;
    if (absl::Status s = wrap("group_sizes", group_sizes, 1, gmm::kGmmGroupSizes); !s.ok()) return s;
    if (absl::Status s = wrap("out", *out, 2, gmm::kGmmOut); !s.ok()) return s;
    if (rest.size() != (has_existing_out != 0 ? 1u : 0u)) {
      return absl::InvalidArgumentError("gmm: the arguments given disagree with has_existing_out");
    }
    if (has_existing_out != 0) {
      ffi::ErrorOr<ffi::AnyBuffer> b = rest.get<ffi::AnyBuffer>(0);
      if (!b.has_value()) return absl::InvalidArgumentError(absl::StrCat("gmm: existing_out: ", b.error().message()));
      if (absl::Status s = wrap("existing_out", *b, 2, gmm::kGmmExistingOut); !s.ok()) return s;
    }
    const std::array<int64_t, gmm::kGmmNumDims> dims = {
        views[gmm::kGmmLhs].shape[0], views[gmm::kGmmLhs].shape[1], views[gmm::kGmmOut].shape[1],
        views[gmm::kGmmGroupSizes].shape[0], views[gmm::kGmmRhs].shape[0]};
    const std::array<kreg_scalar, gmm::kGmmNumAttrs> attrs = {kreg_scalar{.i = transpose_rhs},
                                                              kreg_scalar{.i = group_offset}, kreg_scalar{.i = 0}};
    return Run("gmm", place, kernel, config, threads, tensors, dims, attrs);
  });
}

ffi::Error Tgmm(const Place& place, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> out,
                std::string_view kernel, std::string_view config, int64_t threads, int64_t group_offset) {
  return Guarded("tgmm", [&]() -> absl::Status {
    std::array<View, gmm::kTgmmNumTensors> views;
    std::array<DLTensor*, gmm::kTgmmNumTensors> tensors{};
    auto wrap = [&](absl::string_view name, const ffi::AnyBuffer& b, size_t rank, int t) {
      tensors[t] = &views[t].dl;
      return Wrap("tgmm", name, b, rank, /*fold=*/false, place, &views[t]);
    };
    if (absl::Status s = wrap("lhs", lhs, 2, gmm::kTgmmLhs); !s.ok()) return s;
    if (absl::Status s = wrap("rhs", rhs, 2, gmm::kTgmmRhs); !s.ok()) return s;
    if (absl::Status s = wrap("group_sizes", group_sizes, 1, gmm::kTgmmGroupSizes); !s.ok()) return s;
    if (absl::Status s = wrap("out", *out, 3, gmm::kTgmmOut); !s.ok()) return s;
    const std::array<int64_t, gmm::kTgmmNumDims> dims = {
        views[gmm::kTgmmLhs].shape[0], views[gmm::kTgmmLhs].shape[1], views[gmm::kTgmmRhs].shape[1],
        views[gmm::kTgmmGroupSizes].shape[0], views[gmm::kTgmmOut].shape[0]};
    const std::array<kreg_scalar, gmm::kTgmmNumAttrs> attrs = {kreg_scalar{.i = group_offset}};
    return Run("tgmm", place, kernel, config, threads, tensors, dims, attrs);
  });
}

// Each op's arguments, results and attributes after what `bind` holds (the
// CUDA handlers' context first).
template <typename B>
auto TopkBinding(B bind) {
  return std::move(bind)
      .template Arg<ffi::AnyBuffer>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::string_view>("kernel")
      .template Attr<std::string_view>("config")
      .template Attr<int64_t>("threads")
      .template Attr<int64_t>("largest")
      .template Attr<int64_t>("has_row_starts")
      .template Attr<int64_t>("has_row_ends");
}

template <typename B>
auto GmmBinding(B bind) {
  return std::move(bind)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::string_view>("kernel")
      .template Attr<std::string_view>("config")
      .template Attr<int64_t>("threads")
      .template Attr<int64_t>("transpose_rhs")
      .template Attr<int64_t>("group_offset")
      .template Attr<int64_t>("has_existing_out");
}

template <typename B>
auto TgmmBinding(B bind) {
  return std::move(bind)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::string_view>("kernel")
      .template Attr<std::string_view>("config")
      .template Attr<int64_t>("threads")
      .template Attr<int64_t>("group_offset");
}

// A handler body on the host, and one on XLA's CUDA device and stream.
template <auto& Body>
constexpr auto kOnHost = [](auto... args) { return Body(Place{}, std::move(args)...); };
template <auto& Body>
constexpr auto kOnCuda = [](void* stream, int32_t ordinal, auto... args) {
  return Body(Place{{kDLCUDA, ordinal}, stream}, std::move(args)...);
};

}  // namespace
}  // namespace kreg::xla

// The CUDA handlers' context: XLA's stream and device.
#ifndef KREG_XLA_STAND_IN
namespace kreg::xla {
auto CudaContext() { return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>(); }
}  // namespace kreg::xla
#else
// Tests only (test_kreg_xla_stand_in): the CUDA handlers registered on
// XLA's CPU, over the host-memory stand-in device (tests/plugins/
// host_device_backend.cc). XLA has no stream there: the handlers get
// kStandInStream, which the stand-in backend records.
namespace kreg::xla {
struct StandInStream {};
inline constexpr uintptr_t kStandInStream = 0x57a9d;
}  // namespace kreg::xla

template <>
struct xla::ffi::CtxDecoding<kreg::xla::StandInStream> {
  using Type = void*;
  static std::optional<Type> Decode(const XLA_FFI_Api*, XLA_FFI_ExecutionContext*, DiagnosticEngine&) {
    return reinterpret_cast<void*>(kreg::xla::kStandInStream);
  }
};

namespace kreg::xla {
auto CudaContext() { return ffi::Ffi::Bind().Ctx<StandInStream>().Ctx<ffi::DeviceOrdinal>(); }
}  // namespace kreg::xla
#endif

namespace ffi = ::xla::ffi;
namespace kx = ::kreg::xla;

XLA_FFI_DEFINE_HANDLER_SYMBOL(kreg_xla_topk_cpu, kx::kOnHost<kx::Topk>, kx::TopkBinding(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kreg_xla_gmm_cpu, kx::kOnHost<kx::Gmm>, kx::GmmBinding(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kreg_xla_tgmm_cpu, kx::kOnHost<kx::Tgmm>, kx::TgmmBinding(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kreg_xla_topk_cuda, kx::kOnCuda<kx::Topk>, kx::TopkBinding(kx::CudaContext()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kreg_xla_gmm_cuda, kx::kOnCuda<kx::Gmm>, kx::GmmBinding(kx::CudaContext()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kreg_xla_tgmm_cuda, kx::kOnCuda<kx::Tgmm>, kx::TgmmBinding(kx::CudaContext()));
