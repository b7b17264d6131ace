// What every kreg plugin needs beyond the ABI, header-only and installed
// with it (C++17 or later, no library): failure messages, the exception
// guard no kernel may do without, element access honouring strides and
// byte_offset, bf16 conversion, the CUDA device a kernel was handed, and the
// exported table.
//
//   #include "kreg/plugin_sdk.h"
//   const kreg_op_desc* const kOps[] = {&kMyOp};
//   const kreg_kernel* const kKernels[] = {&kPlain, &kTiled};
//   KREG_DEFINE_PLUGIN("my_family", "1.0", kOps, kKernels)
//
// A plugin that only adds kernels to ops other plugins declare passes
// kreg::sdk::kNoOps for the ops.
#ifndef KREG_PLUGIN_SDK_H_
#define KREG_PLUGIN_SDK_H_

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "kreg/plugin_abi.h"

namespace kreg::sdk {

// Writes the printf-formatted message to msg (cap bytes, cut to fit) and
// returns code: `return Fail(KREG_INVALID_ARGUMENT, msg, cap, "k=%d", k);`.
[[gnu::format(printf, 4, 5)]] inline kreg_status Fail(kreg_status code, char* msg, size_t cap, const char* format,
                                                      ...) {
  if (msg != nullptr && cap > 0) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(msg, cap, format, args);
    va_end(args);
  }
  return code;
}

// Runs body() (which returns a kreg_status) and turns any exception escaping
// it into a status: nothing may unwind through the C ABI (oneTBB rethrows
// its tasks' exceptions in the caller). A plugin whose library throws its
// own type catches it inside body.
template <typename Body>
kreg_status Guarded(char* msg, size_t cap, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(KREG_RESOURCE_EXHAUSTED, msg, cap, "out of memory");
  } catch (const std::exception& e) {
    return Fail(KREG_INTERNAL, msg, cap, "%s", e.what());
  } catch (...) {
    return Fail(KREG_INTERNAL, msg, cap, "unknown exception");
  }
}

// A run's status once its parallel loop returned: only cancellation
// (Cancelled) stops a loop early, so anything but OK says so.
inline kreg_status Finish(kreg_status status, char* msg, size_t cap) {
  return status == KREG_OK ? KREG_OK : Fail(status, msg, cap, "cancelled");
}

// Whether the host asked the running kernel to stop (Ctrl-C, a tuner's
// timeout): a long loop asks between pieces of work and returns
// KREG_CANCELLED (Finish says so).
inline bool Cancelled(const kreg_host* host) {
  return host != nullptr && KREG_HAS_FIELD(host, kreg_host, cancelled) && host->cancelled != nullptr &&
         host->cancelled(host->ctx);
}

// ---- Tensors -------------------------------------------------------------------

inline bool IsBf16(const DLTensor* t) { return t->dtype.code == kDLBfloat; }

// The first element's address (data + byte_offset).
inline char* Base(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

// The first element as T*, or nullptr for an absent (optional) tensor.
template <typename T>
T* Data(const DLTensor* t) {
  return t == nullptr ? nullptr : reinterpret_cast<T*>(Base(t));
}

// Stride of dimension d in elements: compact row-major when strides is NULL,
// 0 for an absent tensor.
inline int64_t Stride(const DLTensor* t, int d) {
  if (t == nullptr) return 0;
  if (t->strides != nullptr) return t->strides[d];
  int64_t s = 1;
  for (int i = d + 1; i < t->ndim; ++i) s *= t->shape[i];
  return s;
}

// ---- bf16 ------------------------------------------------------------------------

// bf16 widens to float exactly.
inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounded to nearest even; a NaN stays a NaN of its sign (quietened).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- Devices ---------------------------------------------------------------------

// The ISA the host says this CPU has (KREG_ISA_* bits, KREG_ISA_MASK
// applied); 0 from a host too old to say.
inline uint32_t HostIsa(const kreg_host* host) {
  return host != nullptr && KREG_HAS_FIELD(host, kreg_host, isa) ? host->isa : 0;
}

// The CUDA device the host handed a kernel, or nullptr with the reason in
// msg (a CUDA kernel run without one).
inline const kreg_device* CudaDevice(const kreg_host* host, const char* kernel, char* msg, size_t cap) {
  if (host == nullptr || !KREG_HAS_FIELD(host, kreg_host, device) || host->device == nullptr ||
      host->device->kind != KREG_DEVICE_CUDA) {
    Fail(KREG_UNAVAILABLE, msg, cap, "%s runs on a CUDA device (the host gave none)", kernel);
    return nullptr;
  }
  return host->device;
}

// ---- The exported table ------------------------------------------------------------

// For a plugin that declares no op of its own.
struct NoOps {};
inline constexpr NoOps kNoOps{};

template <size_t K>
constexpr kreg_plugin PluginTable(const char* name, const char* version, const kreg_op_desc* const* ops,
                                  size_t num_ops, const kreg_kernel* const (&kernels)[K]) {
  kreg_plugin p{};
  p.struct_size = sizeof(kreg_plugin);
  p.abi_version = KREG_ABI_VERSION;
  p.name = name;
  p.version = version;
  p.ops = ops;
  p.num_ops = num_ops;
  p.kernels = kernels;
  p.num_kernels = K;
  return p;
}
template <size_t N, size_t K>
constexpr kreg_plugin PluginTable(const char* name, const char* version, const kreg_op_desc* const (&ops)[N],
                                  const kreg_kernel* const (&kernels)[K]) {
  return PluginTable(name, version, ops, N, kernels);
}
template <size_t K>
constexpr kreg_plugin PluginTable(const char* name, const char* version, NoOps,
                                  const kreg_kernel* const (&kernels)[K]) {
  return PluginTable(name, version, nullptr, 0, kernels);
}

}  // namespace kreg::sdk

// The plugin's table (name, version, its ops — an array, or kreg::sdk::kNoOps
// — and its kernels' array) and the entry point kreg looks for. Once per
// plugin, at namespace scope.
#define KREG_DEFINE_PLUGIN(NAME, VERSION, OPS, KERNELS)                                                \
  namespace {                                                                                          \
  const kreg_plugin kregPluginTable =                                                                  \
      ::kreg::sdk::PluginTable(NAME, VERSION, OPS, KERNELS);                                           \
  }                                                                                                    \
  extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kregPluginTable; }

#endif  // KREG_PLUGIN_SDK_H_
