// Proves the ABI's growth rules. Built twice (tests/CMakeLists.txt):
//
//   -DLAYOUT_OLD=1  plugin "growth_old", kernel axpy/old_layout: as if
//                   compiled against an older, smaller layout. Every struct's
//                   struct_size is its frozen KREG_*_MIN_SIZE and every field
//                   past it holds garbage that crashes if read or called.
//   -DLAYOUT_NEW=1  plugin "growth_new", kernel axpy/new_layout: as if
//                   compiled against a newer, larger layout. Every struct is
//                   wrapped in a bigger one (struct_size = sizeof(wrapper))
//                   whose future fields hold garbage; the known fields,
//                   prepare, release, init and fini included, are real.
//
// Both kernels implement op "axpy" (declared by the axpy test plugin; this
// plugin declares no op) correctly: out += alpha * x in float, x f32 or bf16,
// with one INT parameter `tile` in {1, 2, 4} (default 2) that only changes
// the loop shape.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "kreg/plugin_abi.h"

#if defined(LAYOUT_OLD) == defined(LAYOUT_NEW)
#error "define exactly one of LAYOUT_OLD and LAYOUT_NEW"
#endif

#ifdef LAYOUT_OLD
#define GROWTH_PLUGIN_NAME "growth_old"
#define GROWTH_VARIANT "old_layout"
#else
#define GROWTH_PLUGIN_NAME "growth_new"
#define GROWTH_VARIANT "new_layout"
#endif

namespace {

// Non-null garbage: any read through it, or call of it, crashes.
template <typename T>
T Garbage() {
  return reinterpret_cast<T>(uintptr_t{1});
}

// ---- The kernel's computation ---------------------------------------------

bool IsF32(const DLTensor* t) { return t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1; }
bool IsBf16(const DLTensor* t) { return t->dtype.code == kDLBfloat && t->dtype.bits == 16 && t->dtype.lanes == 1; }

kreg_status Axpy(int64_t tile, const kreg_args* args, char* msg, size_t cap) {
  // axpy's order: tensors x, out; dims n; attrs alpha.
  if (args == nullptr || args->num_tensors < 2 || args->num_dims < 1 || args->num_attrs < 1) {
    std::snprintf(msg, cap, GROWTH_VARIANT ": malformed args");
    return KREG_INVALID_ARGUMENT;
  }
  const DLTensor* x = args->tensors[0];
  DLTensor* out = args->tensors[1];
  const int64_t n = args->dims[0];
  if (x == nullptr || out == nullptr || n < 0 || x->ndim != 1 || out->ndim != 1 || x->shape[0] != n ||
      out->shape[0] != n || !IsF32(out) || !(IsF32(x) || IsBf16(x)) || x->device.device_type != kDLCPU ||
      out->device.device_type != kDLCPU) {
    std::snprintf(msg, cap, GROWTH_VARIANT ": unexpected tensors");
    return KREG_INVALID_ARGUMENT;
  }
  if (tile != 1 && tile != 2 && tile != 4) {
    std::snprintf(msg, cap, GROWTH_VARIANT ": tile=%lld is not 1, 2 or 4", static_cast<long long>(tile));
    return KREG_INVALID_ARGUMENT;
  }
  if (n == 0) return KREG_OK;
  const float alpha = static_cast<float>(args->attrs[0].f);
  const bool bf16 = IsBf16(x);
  const char* xb = static_cast<const char*>(x->data) + x->byte_offset;
  float* ob = reinterpret_cast<float*>(static_cast<char*>(out->data) + out->byte_offset);
  const int64_t xs = x->strides != nullptr ? x->strides[0] : 1;
  const int64_t os = out->strides != nullptr ? out->strides[0] : 1;
  auto x_at = [&](int64_t i) {
    if (!bf16) return reinterpret_cast<const float*>(xb)[i * xs];
    const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(xb)[i * xs]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  int64_t i = 0;
  for (; i + tile <= n; i += tile) {
    for (int64_t l = 0; l < tile; ++l) ob[(i + l) * os] += alpha * x_at(i + l);
  }
  for (; i < n; ++i) ob[i * os] += alpha * x_at(i);
  return KREG_OK;
}

int64_t TileOf(const kreg_config* config) {
  return config != nullptr && config->num_values >= 1 && config->values != nullptr && config->values[0] != nullptr
             ? config->values[0]->value
             : -1;
}

kreg_status Check(const kreg_config* config, const kreg_args*, const kreg_host*, char* msg, size_t cap) {
  const int64_t tile = TileOf(config);
  if (tile != 1 && tile != 2 && tile != 4) {
    std::snprintf(msg, cap, GROWTH_VARIANT ": tile=%lld is not 1, 2 or 4", static_cast<long long>(tile));
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

const int64_t kTiles[] = {1, 2, 4};
const char* const kParamName = "tile";
const char* const kParamDoc = "elements per inner step";

#ifdef LAYOUT_OLD

// ---- The older, smaller layout ---------------------------------------------

// No prepare: run works without state.
kreg_status Run(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host*,
                char* msg, size_t cap) {
  return Axpy(TileOf(config), args, msg, cap);
}

const kreg_param_desc kTileParam = {
    .struct_size = KREG_PARAM_DESC_MIN_SIZE,
    .name = kParamName,
    .doc = kParamDoc,
    .kind = KREG_PARAM_INT,
    .values = kTiles,
    .num_values = 3,
    .default_value = 2,
    // Past the minimum: garbage.
    .choice_isa = Garbage<const uint32_t*>(),
    .values_kind = 77,
    .lo = -12345,
    .hi = -99999,
    .step = -7,
    .cap_dim = Garbage<const char*>(),
    .when_param = Garbage<const char*>(),
    .when_values = Garbage<const int64_t*>(),
    .num_when_values = 0xdeadbeef,
};
const kreg_param_desc* const kParams[] = {&kTileParam};

const kreg_kernel kKernel = {
    .struct_size = KREG_KERNEL_MIN_SIZE,
    .op = "axpy",
    .variant = GROWTH_VARIANT,
    .version = 1,
    .doc = "axpy from a plugin built against a smaller layout",
    .params = kParams,
    .num_params = 1,
    .check = Check,
    .run = Run,
    // Past the minimum: garbage.
    .prepare = Garbage<kreg_status (*)(const kreg_config*, const kreg_args*, const kreg_host*, void**, char*,
                                       size_t)>(),
    .release = Garbage<void (*)(void*)>(),
};
const kreg_kernel* const kKernels[] = {&kKernel};

const kreg_plugin kPlugin = {
    .struct_size = KREG_PLUGIN_MIN_SIZE,
    .abi_version = KREG_ABI_VERSION,
    .name = GROWTH_PLUGIN_NAME,
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = 1,
    // Past the minimum: garbage.
    .init = Garbage<kreg_status (*)(const kreg_host*, char*, size_t)>(),
    .fini = Garbage<void (*)(void)>(),
};

const kreg_plugin* Table() { return &kPlugin; }

#else  // LAYOUT_NEW

// ---- The newer, larger layout ----------------------------------------------

struct ParamV3 {
  kreg_param_desc base;
  uint64_t future_a;
  const char* future_b;
};
struct KernelV3 {
  kreg_kernel base;
  uint64_t future_a;
  const char* future_b;
  void (*future_fn)(void);
};
struct PluginV3 {
  kreg_plugin base;
  uint64_t future_a;
  const char* future_b;
};

struct State {
  int64_t tile;
};

kreg_status Prepare(const kreg_config* config, const kreg_args*, const kreg_host*, void** state, char* msg,
                    size_t cap) {
  *state = nullptr;
  State* st = new (std::nothrow) State{TileOf(config)};
  if (st == nullptr) {
    std::snprintf(msg, cap, GROWTH_VARIANT ": out of memory");
    return KREG_RESOURCE_EXHAUSTED;
  }
  *state = st;
  return KREG_OK;
}

void Release(void* state) { delete static_cast<State*>(state); }

// Needs the prepared state: proves the host found `prepare` in a kernel
// struct larger than the one it was compiled with.
kreg_status Run(const kreg_config*, const kreg_args* args, void* state, void*, size_t, const kreg_host*, char* msg,
                size_t cap) {
  if (state == nullptr) {
    std::snprintf(msg, cap, "no state");
    return KREG_INVALID_ARGUMENT;
  }
  return Axpy(static_cast<const State*>(state)->tile, args, msg, cap);
}

kreg_status Init(const kreg_host*, char*, size_t) { return KREG_OK; }
void Fini(void) {}

const ParamV3 kTileParam = {
    .base =
        {
            .struct_size = sizeof(ParamV3),
            .name = kParamName,
            .doc = kParamDoc,
            .kind = KREG_PARAM_INT,
            .values = kTiles,
            .num_values = 3,
            .default_value = 2,
        },
    .future_a = 0xdeadbeefdeadbeefull,
    .future_b = Garbage<const char*>(),
};
const kreg_param_desc* const kParams[] = {&kTileParam.base};

const KernelV3 kKernel = {
    .base =
        {
            .struct_size = sizeof(KernelV3),
            .op = "axpy",
            .variant = GROWTH_VARIANT,
            .version = 1,
            .doc = "axpy from a plugin built against a larger layout",
            .params = kParams,
            .num_params = 1,
            .check = Check,
            .run = Run,
            .prepare = Prepare,
            .release = Release,
        },
    .future_a = 0xdeadbeefdeadbeefull,
    .future_b = Garbage<const char*>(),
    .future_fn = Garbage<void (*)(void)>(),
};
const kreg_kernel* const kKernels[] = {&kKernel.base};

const PluginV3 kPlugin = {
    .base =
        {
            .struct_size = sizeof(PluginV3),
            .abi_version = KREG_ABI_VERSION,
            .name = GROWTH_PLUGIN_NAME,
            .version = "0.1",
            .kernels = kKernels,
            .num_kernels = 1,
            .init = Init,
            .fini = Fini,
        },
    .future_a = 0xdeadbeefdeadbeefull,
    .future_b = Garbage<const char*>(),
};

const kreg_plugin* Table() { return &kPlugin.base; }

#endif

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return Table(); }
