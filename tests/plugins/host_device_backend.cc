// A stand-in for the CUDA device backend (kreg_cuda_backend.so, see
// kreg/cuda_backend.h) whose "GPU" is this process's memory: copies are
// memcpy, the stream does nothing, timing is the host clock. With
// KREG_CUDA_BACKEND pointing at it, kreg's device path (DeviceCall, --device
// cuda, tuning and dispatch under a GPU's key) runs where there is no GPU,
// with the kernels of host_device_plugin.cc. KREG_HOST_DEVICE_GIB sets its
// memory size (1 GiB by default): another GPU of the same SM version.
// open_on_stream takes any value as the caller's stream (nothing runs on
// it) and keeps the last one for kreg_host_device_last_stream(), so a test
// sees which stream kreg ran on. A test double: never installed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kreg/cuda_backend.h"

namespace {

uint64_t Memory() {
  const char* gib = std::getenv("KREG_HOST_DEVICE_GIB");
  return (gib != nullptr ? std::strtoull(gib, nullptr, 10) : 1) << 30;
}

struct Device {
  std::chrono::steady_clock::time_point start;
  int stream = 0;  // its address is the stream (open)
};

std::atomic<void*> last_stream{nullptr};

int Count(int* n, char*, size_t) {
  *n = 1;
  return 0;
}

int Describe(int ordinal, kreg_gpu_info* info, char* msg, size_t cap) {
  if (ordinal != 0) {
    std::snprintf(msg, cap, "no device %d", ordinal);
    return 1;
  }
  *info = kreg_gpu_info{};
  std::snprintf(info->name, sizeof info->name, "kreg host-memory test device");
  info->sm = 90;
  info->num_sms = 2;
  info->memory_bytes = Memory();
  info->l2_bytes = 1 << 20;
  info->driver_version = 13000;
  info->runtime_version = 13000;
  return 0;
}

void* Alloc(void*, size_t bytes) {
  if (bytes > Memory()) return nullptr;
  return std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
}

void Free(void*, void* p) { std::free(p); }

// Device `ordinal` on `stream` (nullptr: one of its own).
int OpenOn(int ordinal, void* stream, kreg_device* device, char* msg, size_t cap) {
  kreg_gpu_info info;
  if (Describe(ordinal, &info, msg, cap) != 0) return 1;
  auto* d = new Device;
  *device = kreg_device{};
  device->struct_size = sizeof(kreg_device);
  device->ctx = d;
  device->kind = KREG_DEVICE_CUDA;
  device->ordinal = ordinal;
  device->stream = stream != nullptr ? stream : &d->stream;
  device->sm = info.sm;
  device->num_sms = info.num_sms;
  device->memory_bytes = info.memory_bytes;
  device->name = "kreg host-memory test device";
  device->driver_version = info.driver_version;
  device->alloc = Alloc;
  device->free = Free;
  return 0;
}

int Open(int ordinal, kreg_device* device, char* msg, size_t cap) { return OpenOn(ordinal, nullptr, device, msg, cap); }

int OpenOnStream(int ordinal, void* stream, kreg_device* device, char* msg, size_t cap) {
  last_stream.store(stream);
  return OpenOn(ordinal, stream, device, msg, cap);
}

void Close(void* ctx) { delete static_cast<Device*>(ctx); }

int Copy(void*, void* dst, const void* src, size_t bytes, int, char*, size_t) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return 0;
}

int Nothing(void*, char*, size_t) { return 0; }

int TimeBegin(void* ctx, char*, size_t) {
  static_cast<Device*>(ctx)->start = std::chrono::steady_clock::now();
  return 0;
}

int TimeEnd(void* ctx, double* ns, char*, size_t) {
  *ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - static_cast<Device*>(ctx)->start)
            .count();
  return 0;
}

const kreg_cuda_backend kBackend = {
    .struct_size = sizeof(kreg_cuda_backend),
    .count = Count,
    .describe = Describe,
    .open = Open,
    .close = Close,
    .copy = Copy,
    .synchronize = Nothing,
    .flush_l2 = Nothing,
    .time_begin = TimeBegin,
    .time_end = TimeEnd,
    .open_on_stream = OpenOnStream,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const kreg_cuda_backend* kreg_cuda_backend_v1(void) {
  return &kBackend;
}

// The stream the last open_on_stream was given.
extern "C" __attribute__((visibility("default"))) void* kreg_host_device_last_stream(void) {
  return last_stream.load();
}
