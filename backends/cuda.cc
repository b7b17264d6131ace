// The CUDA device backend: a module (kreg_cuda_backend.so) over the CUDA runtime,
// linked statically, so neither the host nor a machine without CUDA needs
// its libraries. Built wherever the CUDA toolkit is found; where no driver
// or GPU is present, count() says why. See kreg/cuda_backend.h.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "kreg/cuda_backend.h"

namespace {

int Fail(char* msg, size_t cap, const char* what, cudaError_t e) {
  std::snprintf(msg, cap, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  cudaGetLastError();  // clear it
  return 1;
}

struct Device {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  void* flush = nullptr;  // twice the L2
  size_t flush_bytes = 0;
  kreg_gpu_info info{};
  bool borrowed = false;  // open_on_stream: the stream is the caller's
  int previous = -1;      // the device current before open_on_stream
};

int Count(int* n, char* msg, size_t cap) {
  *n = 0;
  if (cudaError_t e = cudaGetDeviceCount(n); e == cudaErrorInsufficientDriver) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaGetLastError();
    std::snprintf(msg, cap, "no NVIDIA driver, or one older than this runtime (CUDA %d.%d)",
                  runtime / 1000, runtime % 1000 / 10);
    return 1;
  } else if (e != cudaSuccess) {
    return Fail(msg, cap, "cudaGetDeviceCount", e);
  }
  if (*n == 0) {
    std::snprintf(msg, cap, "the NVIDIA driver reports no GPU");
    return 1;
  }
  return 0;
}

int Describe(int ordinal, kreg_gpu_info* info, char* msg, size_t cap) {
  cudaDeviceProp p{};
  if (cudaError_t e = cudaGetDeviceProperties(&p, ordinal); e != cudaSuccess) {
    return Fail(msg, cap, "cudaGetDeviceProperties", e);
  }
  *info = kreg_gpu_info{};
  std::snprintf(info->name, sizeof info->name, "%s", p.name);
  info->sm = p.major * 10 + p.minor;
  info->num_sms = p.multiProcessorCount;
  info->memory_bytes = p.totalGlobalMem;
  info->l2_bytes = static_cast<uint64_t>(p.l2CacheSize);
  cudaDriverGetVersion(&info->driver_version);
  cudaRuntimeGetVersion(&info->runtime_version);
  return 0;
}

void* Alloc(void* ctx, size_t bytes) {
  void* p = nullptr;
  if (cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, static_cast<Device*>(ctx)->stream) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void Free(void* ctx, void* p) {
  if (p != nullptr) cudaFreeAsync(p, static_cast<Device*>(ctx)->stream);
}

void Close(void* ctx) {
  auto* d = static_cast<Device*>(ctx);
  if (d == nullptr) return;
  if (d->borrowed) {
    if (d->previous >= 0 && d->previous != d->ordinal) cudaSetDevice(d->previous);
    delete d;
    return;
  }
  cudaSetDevice(d->ordinal);
  if (d->stream != nullptr) cudaStreamSynchronize(d->stream);
  if (d->flush != nullptr) cudaFree(d->flush);
  if (d->start != nullptr) cudaEventDestroy(d->start);
  if (d->stop != nullptr) cudaEventDestroy(d->stop);
  if (d->stream != nullptr) cudaStreamDestroy(d->stream);
  delete d;
}

// *device over d (opened, or over a caller's stream).
void Fill(Device* d, kreg_device* device) {
  *device = kreg_device{};
  device->struct_size = sizeof(kreg_device);
  device->ctx = d;
  device->kind = KREG_DEVICE_CUDA;
  device->ordinal = d->ordinal;
  device->stream = d->stream;
  device->sm = d->info.sm;
  device->num_sms = d->info.num_sms;
  device->memory_bytes = d->info.memory_bytes;
  device->name = d->info.name;
  device->driver_version = d->info.driver_version;
  device->alloc = Alloc;
  device->free = Free;
}

int Open(int ordinal, kreg_device* device, char* msg, size_t cap) {
  auto* d = new (std::nothrow) Device;
  if (d == nullptr) {
    std::snprintf(msg, cap, "out of host memory");
    return 1;
  }
  d->ordinal = ordinal;
  cudaError_t e = cudaSetDevice(ordinal);
  const char* what = "cudaSetDevice";
  if (e == cudaSuccess && Describe(ordinal, &d->info, msg, cap) != 0) {
    Close(d);
    return 1;
  }
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), what = "cudaStreamCreate";
  if (e == cudaSuccess) e = cudaEventCreate(&d->start), what = "cudaEventCreate";
  if (e == cudaSuccess) e = cudaEventCreate(&d->stop);
  if (e == cudaSuccess) {
    d->flush_bytes = 2 * d->info.l2_bytes;
    if (d->flush_bytes > 0) e = cudaMalloc(&d->flush, d->flush_bytes), what = "cudaMalloc (the L2 flush buffer)";
  }
  if (e != cudaSuccess) {
    Fail(msg, cap, what, e);
    Close(d);
    return 1;
  }
  Fill(d, device);
  return 0;
}

// A device's description, read once per ordinal (cudaGetDeviceProperties
// is too slow for every call of open_on_stream).
const kreg_gpu_info* Described(int ordinal, char* msg, size_t cap) {
  static std::mutex mu;
  static std::map<int, kreg_gpu_info>* const described = new std::map<int, kreg_gpu_info>;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = described->find(ordinal); it != described->end()) return &it->second;
  kreg_gpu_info info;
  if (Describe(ordinal, &info, msg, cap) != 0) return nullptr;
  return &described->emplace(ordinal, info).first->second;
}

int OpenOnStream(int ordinal, void* stream, kreg_device* device, char* msg, size_t cap) {
  const kreg_gpu_info* info = Described(ordinal, msg, cap);
  if (info == nullptr) return 1;
  auto* d = new (std::nothrow) Device;
  if (d == nullptr) {
    std::snprintf(msg, cap, "out of host memory");
    return 1;
  }
  d->ordinal = ordinal;
  d->stream = static_cast<cudaStream_t>(stream);
  d->info = *info;
  d->borrowed = true;
  if (cudaGetDevice(&d->previous) != cudaSuccess) d->previous = -1;
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    delete d;
    return Fail(msg, cap, "cudaSetDevice", e);
  }
  Fill(d, device);
  return 0;
}

int Copy(void* ctx, void* dst, const void* src, size_t bytes, int to_device, char* msg, size_t cap) {
  auto* d = static_cast<Device*>(ctx);
  if (bytes == 0) return 0;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                  d->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
  return e == cudaSuccess ? 0 : Fail(msg, cap, to_device ? "copy to the device" : "copy to the host", e);
}

int Synchronize(void* ctx, char* msg, size_t cap) {
  const cudaError_t e = cudaStreamSynchronize(static_cast<Device*>(ctx)->stream);
  return e == cudaSuccess ? 0 : Fail(msg, cap, "the stream", e);
}

int FlushL2(void* ctx, char* msg, size_t cap) {
  auto* d = static_cast<Device*>(ctx);
  if (d->flush == nullptr) return 0;
  const cudaError_t e = cudaMemsetAsync(d->flush, 0, d->flush_bytes, d->stream);
  return e == cudaSuccess ? 0 : Fail(msg, cap, "flushing the L2", e);
}

int TimeBegin(void* ctx, char* msg, size_t cap) {
  auto* d = static_cast<Device*>(ctx);
  if (d->start == nullptr) {
    std::snprintf(msg, cap, "timing needs a device kreg opened with a stream of its own, not a caller's");
    return 1;
  }
  const cudaError_t e = cudaEventRecord(d->start, d->stream);
  return e == cudaSuccess ? 0 : Fail(msg, cap, "cudaEventRecord", e);
}

int TimeEnd(void* ctx, double* ns, char* msg, size_t cap) {
  auto* d = static_cast<Device*>(ctx);
  cudaError_t e = cudaEventRecord(d->stop, d->stream);
  if (e == cudaSuccess) e = cudaEventSynchronize(d->stop);
  float ms = 0;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, d->start, d->stop);
  if (e != cudaSuccess) return Fail(msg, cap, "timing the run", e);
  *ns = static_cast<double>(ms) * 1e6;
  return 0;
}

const kreg_cuda_backend kBackend = {
    .struct_size = sizeof(kreg_cuda_backend),
    .count = Count,
    .describe = Describe,
    .open = Open,
    .close = Close,
    .copy = Copy,
    .synchronize = Synchronize,
    .flush_l2 = FlushL2,
    .time_begin = TimeBegin,
    .time_end = TimeEnd,
    .open_on_stream = OpenOnStream,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const kreg_cuda_backend* kreg_cuda_backend_v1(void) {
  return &kBackend;
}
