#include "kreg/device.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kreg/cuda_backend.h"
#include "kreg/comm.h"

namespace kreg {

struct Device::Backend {
  const kreg_cuda_backend* table = nullptr;
  absl::Status status;  // why there is none
};

namespace {

// The module (kreg/machine.h: CudaBackend), loaded once for the process's
// life.
const Device::Backend& TheBackend() {
  static const Device::Backend* const backend = [] {
    auto* b = new Device::Backend;
    absl::StatusOr<const kreg_cuda_backend*> table = CudaBackend();
    if (table.ok()) {
      b->table = *table;
    } else {
      b->status = table.status();
    }
    return b;
  }();
  return *backend;
}

// A module function's failure as a status.
absl::Status Check(int rc, const char* msg, absl::StatusCode code = absl::StatusCode::kUnavailable) {
  return rc == 0 ? absl::OkStatus() : absl::Status(code, msg[0] != '\0' ? msg : "the CUDA backend failed");
}

}  // namespace

absl::Status CanRun(const Kernel& kernel) {
  if (kernel.device() == KREG_DEVICE_CUDA) {
    absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
    if (gpus.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(kernel.name(), " needs a CUDA device; none here: ", gpus.status().message()));
  }
  if (kernel.device() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(kernel.name(), " needs device kind ", kernel.device(),
                                                      ", which this kreg does not know"));
  }
  if (kernel.available()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(kernel.name(), " needs ",
                                                    IsaString(kernel.required_isa() & ~CpuIsa()),
                                                    ", which this CPU lacks"));
}

namespace {

// GPU `ordinal`'s description, or why there is none.
absl::StatusOr<GpuInfo> GpuAt(int ordinal) {
  absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
  if (!gpus.ok()) return gpus.status();
  if (ordinal < 0 || ordinal >= static_cast<int>(gpus->size())) {
    return absl::InvalidArgumentError(absl::StrCat("no CUDA device ", ordinal, " (this machine has ", gpus->size(), ")"));
  }
  return (*gpus)[ordinal];
}

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> Device::Open(int ordinal, void* const* caller_stream) {
  absl::StatusOr<GpuInfo> gpu = GpuAt(ordinal);
  if (!gpu.ok()) return gpu.status();
  std::unique_ptr<Device> d(new Device);
  d->backend_ = &TheBackend();
  d->info_ = *std::move(gpu);
  const kreg_cuda_backend& table = *d->backend_->table;
  char msg[512] = "";
  const int rc = caller_stream != nullptr ? table.open_on_stream(ordinal, *caller_stream, &d->abi_, msg, sizeof msg)
                                          : table.open(ordinal, &d->abi_, msg, sizeof msg);
  if (absl::Status s = Check(rc, msg); !s.ok()) {
    d->backend_ = nullptr;  // nothing to close
    return s;
  }
  return d;
}

absl::StatusOr<std::unique_ptr<Device>> OpenCuda(int ordinal) { return Device::Open(ordinal, nullptr); }

absl::StatusOr<std::unique_ptr<Device>> OpenCudaOnStream(int ordinal, void* stream) {
  return Device::Open(ordinal, &stream);
}

Device::~Device() {
  if (backend_ != nullptr) backend_->table->close(abi_.ctx);
}

absl::StatusOr<void*> Device::Alloc(size_t bytes) {
  void* p = abi_.alloc(abi_.ctx, bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("out of device memory: ", bytes, " bytes on ", info_.name));
  }
  return p;
}

void Device::Free(void* p) { abi_.free(abi_.ctx, p); }

absl::Status Device::ToDevice(void* dst, const void* src, size_t bytes) {
  char msg[512] = "";
  return Check(backend_->table->copy(abi_.ctx, dst, src, bytes, 1, msg, sizeof msg), msg, absl::StatusCode::kInternal);
}

absl::Status Device::ToHost(void* dst, const void* src, size_t bytes) {
  char msg[512] = "";
  return Check(backend_->table->copy(abi_.ctx, dst, src, bytes, 0, msg, sizeof msg), msg, absl::StatusCode::kInternal);
}

absl::Status Device::Synchronize() {
  char msg[512] = "";
  return Check(backend_->table->synchronize(abi_.ctx, msg, sizeof msg), msg, absl::StatusCode::kInternal);
}

absl::Status Device::FlushL2() {
  char msg[512] = "";
  return Check(backend_->table->flush_l2(abi_.ctx, msg, sizeof msg), msg, absl::StatusCode::kInternal);
}

absl::StatusOr<double> Device::Time(const std::function<absl::Status()>& launch) {
  char msg[512] = "";
  if (absl::Status s = Check(backend_->table->time_begin(abi_.ctx, msg, sizeof msg), msg, absl::StatusCode::kInternal);
      !s.ok()) {
    return s;
  }
  const absl::Status launched = launch();
  double ns = 0;
  const absl::Status timed =
      Check(backend_->table->time_end(abi_.ctx, &ns, msg, sizeof msg), msg, absl::StatusCode::kInternal);
  if (!launched.ok()) return launched;
  if (!timed.ok()) return timed;
  return ns;
}

// ---- DeviceCall ---------------------------------------------------------------------

namespace {

// The bytes a compact or strided tensor spans (validated: no overflow).
size_t SpanBytes(const DLTensor& t) {
  int64_t span = 1, compact = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] == 0) return 0;
    span += (t.shape[i] - 1) * (t.strides != nullptr ? t.strides[i] : compact);
    compact *= t.shape[i];
  }
  return static_cast<size_t>(span) * ((t.dtype.bits * t.dtype.lanes + 7) / 8);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCall>> DeviceCall::Make(Device& device, const kreg_args& host) {
  if (host.flags & (KREG_ARGS_SHAPE_ONLY | KREG_ARGS_ON_DEVICE)) {
    return absl::InvalidArgumentError("a device call is made from a host call with data");
  }
  std::unique_ptr<DeviceCall> call(new DeviceCall(device, host));
  call->buffers_.assign(host.num_tensors, nullptr);
  call->bytes_.assign(host.num_tensors, 0);
  call->tensors_.resize(host.num_tensors);
  call->pointers_.assign(host.num_tensors, nullptr);
  for (size_t i = 0; i < host.num_tensors; ++i) {
    const DLTensor* t = host.tensors[i];
    if (t == nullptr) continue;
    call->bytes_[i] = SpanBytes(*t);
    absl::StatusOr<void*> buffer = device.Alloc(call->bytes_[i]);
    if (!buffer.ok()) return buffer.status();
    call->buffers_[i] = *buffer;
    DLTensor d = *t;  // shape and strides stay the host's (they outlive the call)
    d.data = *buffer;
    d.byte_offset = 0;
    d.device = {kDLCUDA, device.info().ordinal};
    call->tensors_[i] = d;
    call->pointers_[i] = &call->tensors_[i];
  }
  call->args_ = host;
  call->args_.flags |= KREG_ARGS_ON_DEVICE;
  call->args_.tensors = call->pointers_.data();
  return call;
}

DeviceCall::~DeviceCall() {
  for (void* p : buffers_) {
    if (p != nullptr) device_.Free(p);
  }
  device_.Synchronize().IgnoreError();
}

absl::Status DeviceCall::CopyIn() {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i] == nullptr) continue;
    const DLTensor& t = *host_.tensors[i];
    const void* src = static_cast<const char*>(t.data) + t.byte_offset;
    if (absl::Status s = device_.ToDevice(buffers_[i], src, bytes_[i]); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DeviceCall::CopyBack(const std::vector<bool>* which) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i] == nullptr || (which != nullptr && (i >= which->size() || !(*which)[i]))) continue;
    // Every tensor: the inputs too, so one the kernel wrote is caught by the
    // host's check as on the CPU.
    DLTensor& t = *host_.tensors[i];
    if (absl::Status s = device_.ToHost(static_cast<char*>(t.data) + t.byte_offset, buffers_[i], bytes_[i]); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace kreg
