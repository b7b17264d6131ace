// The table the CUDA device backend module (kreg_cuda_backend.so,
// backends/cuda.cc) hands the host (the registry's machine module,
// kreg/machine.h: CudaBackend; backends/device.cc): kreg's own, not the
// plugin ABI. The module is built wherever the CUDA toolkit is found and
// loaded at run time, so the host never links CUDA. Every function returns
// 0 on success, else non-zero with a one-line reason in msg.
#ifndef KREG_REGISTRY_CUDA_BACKEND_H_
#define KREG_REGISTRY_CUDA_BACKEND_H_

#include <stddef.h>
#include <stdint.h>

#include "kreg/plugin_abi.h"

extern "C" {

typedef struct kreg_gpu_info {
  char name[256];
  int32_t sm;  // major * 10 + minor
  int32_t num_sms;
  uint64_t memory_bytes;
  uint64_t l2_bytes;
  int32_t driver_version;   // CUDA's: 12080 for 12.8
  int32_t runtime_version;  // the runtime the module was built with
} kreg_gpu_info;

typedef struct kreg_cuda_backend {
  size_t struct_size;
  // The number of devices (0 is an error: the reason says why).
  int (*count)(int* n, char* msg, size_t cap);
  int (*describe)(int ordinal, kreg_gpu_info* info, char* msg, size_t cap);
  // Makes the device current, creates a stream and the L2-flush buffer, and
  // fills *device (its ctx is the handle below).
  int (*open)(int ordinal, kreg_device* device, char* msg, size_t cap);
  void (*close)(void* ctx);
  int (*copy)(void* ctx, void* dst, const void* src, size_t bytes, int to_device, char* msg, size_t cap);
  int (*synchronize)(void* ctx, char* msg, size_t cap);
  // Overwrites a buffer of twice the L2's size on the stream, so the next
  // run starts cold.
  int (*flush_l2)(void* ctx, char* msg, size_t cap);
  // Records the start event on the stream; end records the stop event,
  // waits for it, and gives the time between them.
  int (*time_begin)(void* ctx, char* msg, size_t cap);
  int (*time_end)(void* ctx, double* ns, char* msg, size_t cap);
  // Fills *device over a caller's `stream` (a cudaStream_t of device
  // `ordinal`; 0 the legacy default stream) and makes `ordinal` current
  // until close, which restores the previous device. Kernels launch on
  // that stream and device->alloc orders memory on it. It creates nothing
  // (no stream, events or L2-flush buffer: flush_l2 does nothing and
  // timing fails), so it is cheap enough for every call; close neither
  // synchronises nor destroys the stream, whose work stays in flight.
  int (*open_on_stream)(int ordinal, void* stream, kreg_device* device, char* msg, size_t cap);
} kreg_cuda_backend;

// The module's one exported symbol.
const kreg_cuda_backend* kreg_cuda_backend_v1(void);
}

#endif  // KREG_REGISTRY_CUDA_BACKEND_H_
