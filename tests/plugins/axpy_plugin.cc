// A second op defined wholly inside a test plugin, proving that a new op
// family needs no host change: "axpy", out += alpha * x.
//
//   dims     n
//   tensors  x    [n]  IN     f32 or bf16
//            out  [n]  INOUT  f32 (rtol 1e-6, atol 1e-6 against the reference)
//   attrs    alpha  float, default 1, in [-1e30, 1e30]
//
// Kernels: axpy/reference (in double, rounded once) and axpy/blocked (in
// float, block by block, with a prepared state: run refuses to work without
// one, proving the host called prepare). Only the ABI header is used.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "kreg/plugin_abi.h"

namespace {

std::atomic<int> g_init_calls{0};
std::atomic<int> g_fini_calls{0};

// ---- The op ---------------------------------------------------------------

enum { kX = 0, kOut = 1, kNumTensors = 2 };
enum { kDimN = 0, kNumDims = 1 };
enum { kAttrAlpha = 0, kNumAttrs = 1 };

const kreg_dim_desc kDimNDesc = {
    .struct_size = sizeof(kreg_dim_desc), .name = "n", .doc = "number of elements", .max = int64_t{1} << 40};
const kreg_dim_desc* const kDims[] = {&kDimNDesc};

const kreg_tolerance kOutF32Tolerance = {
    .struct_size = sizeof(kreg_tolerance), .dtype = KREG_DTYPE_F32, .atol = 1e-6, .rtol = 1e-6};
const kreg_tolerance* const kOutTolerances[] = {&kOutF32Tolerance};

const kreg_tensor_desc kXDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "x",
    .doc = "the vector added, scaled by alpha",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .shape = "n",
};
const kreg_tensor_desc kOutDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "out",
    .doc = "the accumulator",
    .role = KREG_ROLE_INOUT,
    .dtypes = KREG_DTYPE_F32,
    .shape = "n",
    .tolerances = kOutTolerances,
    .num_tolerances = 1,
};
const kreg_tensor_desc* const kTensors[] = {&kXDesc, &kOutDesc};

const kreg_attr_desc kAlphaDesc = {
    .struct_size = sizeof(kreg_attr_desc),
    .name = "alpha",
    .doc = "the scale of x",
    .kind = KREG_ATTR_FLOAT,
    .default_value = {.f = 1.0},
    .min = {.f = -1e30},
    .max = {.f = 1e30},
};
const kreg_attr_desc* const kAttrs[] = {&kAlphaDesc};

// A view of validated args. Returns false (with a reason) on anything the
// host should have refused, so a host bug cannot become a crash here.
struct View {
  int64_t n = 0;
  double alpha = 0;
  const DLTensor* x = nullptr;
  DLTensor* out = nullptr;
  bool x_bf16 = false;
};

bool IsF32(const DLTensor* t) { return t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1; }
bool IsBf16(const DLTensor* t) { return t->dtype.code == kDLBfloat && t->dtype.bits == 16 && t->dtype.lanes == 1; }

kreg_status ViewOf(const kreg_args* args, View* v, char* msg, size_t cap) {
  if (args == nullptr || args->struct_size < KREG_ARGS_MIN_SIZE || args->num_tensors < kNumTensors ||
      args->num_dims < kNumDims || args->num_attrs < kNumAttrs || args->tensors == nullptr ||
      args->dims == nullptr || args->attrs == nullptr) {
    std::snprintf(msg, cap, "axpy: malformed args");
    return KREG_INVALID_ARGUMENT;
  }
  v->n = args->dims[kDimN];
  v->alpha = args->attrs[kAttrAlpha].f;
  v->x = args->tensors[kX];
  v->out = args->tensors[kOut];
  if (v->x == nullptr || v->out == nullptr || v->n < 0) {
    std::snprintf(msg, cap, "axpy: missing tensor or negative n");
    return KREG_INVALID_ARGUMENT;
  }
  if (v->x->device.device_type != kDLCPU || v->out->device.device_type != kDLCPU) {
    std::snprintf(msg, cap, "axpy: only CPU tensors are supported");
    return KREG_UNIMPLEMENTED;
  }
  if (v->x->ndim != 1 || v->out->ndim != 1 || v->x->shape[0] != v->n || v->out->shape[0] != v->n) {
    std::snprintf(msg, cap, "axpy: x and out must be 1-D of length n=%lld", static_cast<long long>(v->n));
    return KREG_INVALID_ARGUMENT;
  }
  if (!IsF32(v->out) || !(IsF32(v->x) || IsBf16(v->x))) {
    std::snprintf(msg, cap, "axpy: x must be f32 or bf16 and out f32");
    return KREG_INVALID_ARGUMENT;
  }
  v->x_bf16 = IsBf16(v->x);
  return KREG_OK;
}

template <typename T>
T* Base(const DLTensor* t) {
  return reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset);
}
int64_t Stride(const DLTensor* t) { return t->strides != nullptr ? t->strides[0] : 1; }

// Element i of x as float (bf16 widened exactly).
inline float XAt(const void* base, bool bf16, int64_t stride, int64_t i) {
  if (bf16) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i * stride]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  return static_cast<const float*>(base)[i * stride];
}

kreg_status DataClass(const kreg_args* args, char* out, size_t out_cap) {
  if (out == nullptr || out_cap == 0) return KREG_INVALID_ARGUMENT;
  out[0] = '\0';
  if (args == nullptr || (args->flags & KREG_ARGS_SHAPE_ONLY) != 0) return KREG_OK;
  View v;
  char ignored[8];
  if (ViewOf(args, &v, ignored, sizeof ignored) != KREG_OK) return KREG_INVALID_ARGUMENT;
  if (v.n == 0) return KREG_OK;
  const void* x = Base<const void>(v.x);
  const int64_t stride = Stride(v.x);
  int64_t zeros = 0;
  for (int64_t i = 0; i < v.n; ++i) zeros += XAt(x, v.x_bf16, stride, i) == 0.0f ? 1 : 0;
  if (zeros > v.n - zeros) {  // more than half
    static const char kSparse[] = "sparse";
    if (out_cap < sizeof kSparse) return KREG_RESOURCE_EXHAUSTED;  // out stays ""
    std::memcpy(out, kSparse, sizeof kSparse);
  }
  return KREG_OK;
}

const char* const kDefaultVariants[] = {"blocked"};

const kreg_op_desc kAxpyOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "axpy",
    .doc = "out += alpha * x",
    .dims = kDims,
    .num_dims = kNumDims,
    .tensors = kTensors,
    .num_tensors = kNumTensors,
    .attrs = kAttrs,
    .num_attrs = kNumAttrs,
    .data_class = DataClass,
    .default_variants = kDefaultVariants,
    .num_default_variants = 1,
};

// ---- axpy/reference -------------------------------------------------------

kreg_status ReferenceRun(const kreg_config*, const kreg_args* args, void*, void*, size_t, const kreg_host*,
                         char* msg, size_t cap) {
  View v;
  if (kreg_status s = ViewOf(args, &v, msg, cap); s != KREG_OK) return s;
  if (v.n == 0) return KREG_OK;
  const void* x = Base<const void>(v.x);
  float* out = Base<float>(v.out);
  const int64_t xs = Stride(v.x), os = Stride(v.out);
  for (int64_t i = 0; i < v.n; ++i) {
    float& o = out[i * os];
    o = static_cast<float>(static_cast<double>(o) + v.alpha * static_cast<double>(XAt(x, v.x_bf16, xs, i)));
  }
  return KREG_OK;
}

const kreg_kernel kReferenceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "axpy",
    .variant = "reference",
    .version = 1,
    .doc = "in double, rounded once: the oracle",
    .flags = KREG_KERNEL_REFERENCE,
    .run = ReferenceRun,
};

// ---- axpy/blocked ---------------------------------------------------------

enum { kParamBlock = 0, kParamUnroll = 1, kParamPrefetch = 2, kNumBlockedParams = 3 };
enum { kUnrollScalar = 0, kUnrollAvx2 = 1 };

const kreg_param_desc kBlockParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "block",
    .doc = "elements per block; a power of two",
    .kind = KREG_PARAM_INT,
    .default_value = 256,
    .values_kind = KREG_VALUES_POW2,
    .lo = 16,
    .hi = 65536,
    .cap_dim = "n",
};

const char* const kUnrollChoices[] = {"scalar", "avx2"};
const uint32_t kUnrollIsa[] = {0, KREG_ISA_AVX2 | KREG_ISA_FMA};
const kreg_param_desc kUnrollParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "unroll",
    .doc = "loop shape within a block",
    .kind = KREG_PARAM_CHOICE,
    .choices = kUnrollChoices,
    .num_choices = 2,
    .default_value = kUnrollScalar,
    .choice_isa = kUnrollIsa,
};

const int64_t kPrefetchValues[] = {0, 1};
const int64_t kPrefetchWhen[] = {kUnrollAvx2};
const kreg_param_desc kPrefetchParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "prefetch",
    .doc = "prefetch the next block (avx2 loop only)",
    .kind = KREG_PARAM_INT,
    .values = kPrefetchValues,
    .num_values = 2,
    .when_param = "unroll",
    .when_values = kPrefetchWhen,
    .num_when_values = 1,
};

const kreg_param_desc* const kBlockedParams[] = {&kBlockParam, &kUnrollParam, &kPrefetchParam};

// What prepare builds: alpha narrowed once and the block plan.
struct State {
  float alpha = 0;
  int64_t n = 0;
  int64_t block = 0;
  int64_t num_blocks = 0;
  int64_t unroll = kUnrollScalar;
  bool prefetch = false;
};

kreg_status BlockedPrepare(const kreg_config* config, const kreg_args* args, const kreg_host*, void** state,
                           char* msg, size_t cap) {
  try {
    if (state == nullptr) {
      std::snprintf(msg, cap, "axpy/blocked: state is NULL");
      return KREG_INVALID_ARGUMENT;
    }
    *state = nullptr;
    View v;
    if (kreg_status s = ViewOf(args, &v, msg, cap); s != KREG_OK) return s;
    if (config == nullptr || config->num_values < kNumBlockedParams || config->values == nullptr) {
      std::snprintf(msg, cap, "axpy/blocked: expected %d parameter values", kNumBlockedParams);
      return KREG_INVALID_ARGUMENT;
    }
    for (int i = 0; i < kNumBlockedParams; ++i) {
      if (config->values[i] == nullptr) {
        std::snprintf(msg, cap, "axpy/blocked: parameter value %d is NULL", i);
        return KREG_INVALID_ARGUMENT;
      }
    }
    const int64_t block = config->values[kParamBlock]->value;
    const int64_t unroll = config->values[kParamUnroll]->value;
    const int64_t prefetch = config->values[kParamPrefetch]->value;
    if (block < 1 || (unroll != kUnrollScalar && unroll != kUnrollAvx2) || (prefetch != 0 && prefetch != 1)) {
      std::snprintf(msg, cap, "axpy/blocked: illegal config block=%lld unroll=%lld prefetch=%lld",
                    static_cast<long long>(block), static_cast<long long>(unroll), static_cast<long long>(prefetch));
      return KREG_INVALID_ARGUMENT;
    }
    State* st = new State;
    st->alpha = static_cast<float>(v.alpha);
    st->n = v.n;
    st->block = block;
    st->num_blocks = v.n / block + (v.n % block != 0 ? 1 : 0);
    st->unroll = unroll;
    st->prefetch = prefetch != 0;
    *state = st;
    return KREG_OK;
  } catch (const std::bad_alloc&) {
    std::snprintf(msg, cap, "axpy/blocked: out of memory");
    return KREG_RESOURCE_EXHAUSTED;
  } catch (...) {
    std::snprintf(msg, cap, "axpy/blocked: unexpected exception in prepare");
    return KREG_INTERNAL;
  }
}

void BlockedRelease(void* state) { delete static_cast<State*>(state); }

bool Cancelled(const kreg_host* host) {
  return host != nullptr && KREG_HAS_FIELD(host, kreg_host, cancelled) && host->cancelled != nullptr &&
         host->cancelled(host->ctx) != 0;
}

// out[i] += alpha * x[i] for i in [begin, end), one element at a time.
void ScalarBlock(float alpha, const void* x, bool bf16, int64_t xs, float* out, int64_t os, int64_t begin,
                 int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i * os] += alpha * XAt(x, bf16, xs, i);
}

// The same, eight lanes at a time through a local array (a loop shape the
// compiler vectorises), then the tail. Same float operations per element, so
// the same results as ScalarBlock.
void WideBlock(float alpha, const void* x, bool bf16, int64_t xs, float* out, int64_t os, int64_t begin,
               int64_t end, bool prefetch, int64_t next_end) {
  if (prefetch && end < next_end) {
    for (int64_t p = end; p < next_end; p += 16) {
      __builtin_prefetch(bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(x) + p * xs)
                              : static_cast<const void*>(static_cast<const float*>(x) + p * xs));
      __builtin_prefetch(out + p * os, 1);
    }
  }
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    float xv[8], ov[8];
    for (int l = 0; l < 8; ++l) xv[l] = XAt(x, bf16, xs, i + l);
    for (int l = 0; l < 8; ++l) ov[l] = out[(i + l) * os];
    for (int l = 0; l < 8; ++l) ov[l] += alpha * xv[l];
    for (int l = 0; l < 8; ++l) out[(i + l) * os] = ov[l];
  }
  ScalarBlock(alpha, x, bf16, xs, out, os, i, end);
}

kreg_status BlockedRun(const kreg_config*, const kreg_args* args, void* state, void*, size_t,
                       const kreg_host* host, char* msg, size_t cap) {
  if (state == nullptr) {
    std::snprintf(msg, cap, "no state");
    return KREG_INVALID_ARGUMENT;
  }
  const State& st = *static_cast<const State*>(state);
  View v;
  if (kreg_status s = ViewOf(args, &v, msg, cap); s != KREG_OK) return s;
  if (v.n != st.n) {
    std::snprintf(msg, cap, "axpy/blocked: state was prepared for n=%lld, run with n=%lld",
                  static_cast<long long>(st.n), static_cast<long long>(v.n));
    return KREG_INVALID_ARGUMENT;
  }
  if (v.n == 0) return KREG_OK;
  const void* x = Base<const void>(v.x);
  float* out = Base<float>(v.out);
  const int64_t xs = Stride(v.x), os = Stride(v.out);
  for (int64_t b = 0; b < st.num_blocks; ++b) {
    if (b % 64 == 0 && Cancelled(host)) {
      std::snprintf(msg, cap, "axpy/blocked: cancelled");
      return KREG_CANCELLED;
    }
    const int64_t begin = b * st.block;
    const int64_t end = begin + st.block < st.n ? begin + st.block : st.n;
    if (st.unroll == kUnrollAvx2) {
      const int64_t next_end = end + st.block < st.n ? end + st.block : st.n;
      WideBlock(st.alpha, x, v.x_bf16, xs, out, os, begin, end, st.prefetch, next_end);
    } else {
      ScalarBlock(st.alpha, x, v.x_bf16, xs, out, os, begin, end);
    }
  }
  return KREG_OK;
}

const kreg_kernel kBlockedKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "axpy",
    .variant = "blocked",
    .version = 1,
    .doc = "in float, block by block, with a prepared plan",
    .params = kBlockedParams,
    .num_params = kNumBlockedParams,
    .run = BlockedRun,
    .prepare = BlockedPrepare,
    .release = BlockedRelease,
};

// ---- The plugin -----------------------------------------------------------

kreg_status Init(const kreg_host*, char*, size_t) {
  g_init_calls.fetch_add(1, std::memory_order_relaxed);
  return KREG_OK;
}

void Fini(void) { g_fini_calls.fetch_add(1, std::memory_order_relaxed); }

const kreg_op_desc* const kOps[] = {&kAxpyOp};
const kreg_kernel* const kKernels[] = {&kReferenceKernel, &kBlockedKernel};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "axpy_test",
    .version = "1.0",
    .ops = kOps,
    .num_ops = sizeof kOps / sizeof kOps[0],
    .kernels = kKernels,
    .num_kernels = sizeof kKernels / sizeof kKernels[0],
    .init = Init,
    .fini = Fini,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
