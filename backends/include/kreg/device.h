// Devices: what only the host owns on an accelerator — its memory, a
// stream, copies, event timing and the GPU's identity — seen from the host.
//
// The CUDA backend is a module, kreg_cuda_backend.so, loaded at run time and built
// wherever the CUDA toolkit is found (over the CUDA runtime, linked into it
// statically), so kreg never links CUDA and runs where there is none. The
// registry's machine module loads it and lists the GPUs (kreg/machine.h:
// GpuInfo, CudaDevices); Devices are opened here. Where the module is
// missing, or there is no driver or no GPU, CudaDevices() and OpenCuda() say
// why (Unavailable), in one line.
//
// A Device's abi() is what a kernel gets in kreg_host.device. Copies and
// Synchronize wait for the device; Time() records CUDA events on the
// device's stream around what `launch` enqueues there. A Device opened over
// a caller's stream (OpenCudaOnStream) runs kernels there and owns nothing
// of it: no L2 flush, no timing, and closing it waits for nothing.
//
// Thread-safety: a Device is used by one thread at a time.
#ifndef KREG_BACKENDS_DEVICE_H_
#define KREG_BACKENDS_DEVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlpack/dlpack.h"
#include "kreg/machine.h"  // GpuInfo, CudaDevices
#include "kreg/plugin_abi.h"
#include "kreg/registry.h"

namespace kreg {

class Device {
 public:
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const GpuInfo& info() const { return info_; }
  const kreg_device* abi() const { return &abi_; }
  void* stream() const { return abi_.stream; }

  // Device memory (256-byte aligned); ResourceExhausted when it runs out.
  absl::StatusOr<void*> Alloc(size_t bytes);
  void Free(void* p);
  absl::Status ToDevice(void* dst, const void* src, size_t bytes);
  absl::Status ToHost(void* dst, const void* src, size_t bytes);
  absl::Status Synchronize();
  // Overwrites twice the L2 on the stream: the next run starts cold.
  absl::Status FlushL2();
  // Runs `launch` (which enqueues work on stream()) between two events;
  // the device time between them, in ns.
  absl::StatusOr<double> Time(const std::function<absl::Status()>& launch);

  struct Backend;  // the loaded module (device.cc)

 private:
  friend absl::StatusOr<std::unique_ptr<Device>> OpenCuda(int ordinal);
  friend absl::StatusOr<std::unique_ptr<Device>> OpenCudaOnStream(int ordinal, void* stream);
  Device() = default;
  // On a stream of its own, or over `caller_stream`'s where given.
  static absl::StatusOr<std::unique_ptr<Device>> Open(int ordinal, void* const* caller_stream);
  const Backend* backend_ = nullptr;
  GpuInfo info_;
  kreg_device abi_{};
};

// CUDA device `ordinal` with a stream of its own.
absl::StatusOr<std::unique_ptr<Device>> OpenCuda(int ordinal = 0);

// CUDA device `ordinal` over a caller's `stream` (a cudaStream_t of that
// device; 0 the legacy default stream), current on this thread until the
// Device closes: kernels launch on that stream, after whatever the caller
// enqueued there, and the caller orders its later work after them by using
// the same stream; nothing is synchronised. Cheap (nothing is created), so
// made per call (kreg/cuda_backend.h: open_on_stream).
absl::StatusOr<std::unique_ptr<Device>> OpenCudaOnStream(int ordinal, void* stream);

// Whether this machine can run `kernel`: a CPU kernel where the CPU has its
// ISA (Kernel::available), a CUDA kernel where there is a CUDA device;
// FailedPrecondition saying what is missing otherwise.
absl::Status CanRun(const Kernel& kernel);

// A host Problem's call on a device: a device buffer per tensor, and args
// (KREG_ARGS_ON_DEVICE) over them with the host call's shapes, dims and
// attributes. The host Problem stays the truth: CopyIn puts its tensors on
// the device (inputs, in-out ones as restored, outputs as poisoned),
// CopyBack brings them all back into it, so
// Problem::CheckOutputs checks the device's results against the CPU
// reference. Holds the Problem and the Device by reference.
class DeviceCall {
 public:
  // The host problem's data is validated there first (the op's validator
  // reads it); device args are checked for shapes only.
  static absl::StatusOr<std::unique_ptr<DeviceCall>> Make(Device& device, const kreg_args& host_args);
  ~DeviceCall();
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;

  const kreg_args* args() const { return &args_; }
  // Every tensor, host to device (outputs too: poisoned, a kernel that
  // leaves one unwritten is caught).
  absl::Status CopyIn();
  // Every tensor, device to host: outputs, in-out tensors, and inputs (so
  // the host's check catches an input the kernel wrote, as on the CPU);
  // with `which`, only the tensors it marks (a caller's read-only inputs
  // stay untouched).
  absl::Status CopyBack(const std::vector<bool>* which = nullptr);

 private:
  DeviceCall(Device& device, const kreg_args& host) : device_(device), host_(host) {}
  Device& device_;
  const kreg_args& host_;
  std::vector<void*> buffers_;  // per tensor, nullptr where absent
  std::vector<size_t> bytes_;
  std::vector<DLTensor> tensors_;
  std::vector<DLTensor*> pointers_;
  kreg_args args_{};
};

}  // namespace kreg

#endif  // KREG_BACKENDS_DEVICE_H_
