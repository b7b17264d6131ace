// A test op proving the ABI's shape extensions without any host change:
// "rowsum", out[i] = the sum of row i of x for its first `used` rows.
//
//   dims     rows, cols, used (default_dim rows: when not given, used = rows)
//   attrs    transposed  int 0/1, default 0
//   tensors  x    [rows, cols]  IN   f32 or bf16; with transposed=1 it lies
//                                    in memory as [cols, rows] (alt_shape)
//            out  [rows]        OUT  f32: rows >= used are 0
//
// validate refuses used > rows. Kernels: rowsum/reference (row by row) and
// rowsum/by_memory (walks x in memory order, one accumulator per row); both
// sum each row in double in column order and round once, so they agree bit
// for bit.
//
// Growth: dim `cols` and tensor `out` are described with the sizes of the
// layout before default_dim and alt_shape existed, their new fields holding
// garbage that crashes if read, as a plugin built against that older header
// would present them.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "kreg/plugin_abi.h"

namespace {

template <typename T>
T Garbage() {
  return reinterpret_cast<T>(uintptr_t{1});
}

enum { kX = 0, kOut = 1, kNumTensors = 2 };
enum { kRows = 0, kCols = 1, kUsed = 2, kNumDims = 3 };
enum { kTransposed = 0, kNumAttrs = 1 };

const kreg_dim_desc kRowsDesc = {
    .struct_size = sizeof(kreg_dim_desc), .name = "rows", .doc = "rows of x", .max = INT32_MAX};
const kreg_dim_desc kColsDesc = {
    .struct_size = KREG_DIM_DESC_MIN_SIZE,  // the older layout
    .name = "cols",
    .doc = "columns of x",
    .max = INT32_MAX,
    .default_dim = Garbage<const char*>(),
};
const kreg_dim_desc kUsedDesc = {.struct_size = sizeof(kreg_dim_desc),
                                 .name = "used",
                                 .doc = "rows summed (the rest of out is 0); default: rows",
                                 .max = INT32_MAX,
                                 .default_dim = "rows"};
const kreg_dim_desc* const kDims[] = {&kRowsDesc, &kColsDesc, &kUsedDesc};

const kreg_attr_desc kTransposedDesc = {
    .struct_size = sizeof(kreg_attr_desc),
    .name = "transposed",
    .doc = "1: x lies in memory as [cols, rows]",
    .kind = KREG_ATTR_INT,
    .default_value = {.i = 0},
    .min = {.i = 0},
    .max = {.i = 1},
};
const kreg_attr_desc* const kAttrs[] = {&kTransposedDesc};

const kreg_tolerance kOutTolerance = {
    .struct_size = sizeof(kreg_tolerance), .dtype = KREG_DTYPE_F32, .atol = 1e-6, .rtol = 1e-6, .scale_dim = "cols"};
const kreg_tolerance* const kOutTolerances[] = {&kOutTolerance};

const kreg_tensor_desc kXDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "x",
    .doc = "the matrix; [cols, rows] in memory with transposed=1",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16,
    .shape = "rows,cols",
    .alt_shape = "cols,rows",
    .alt_shape_attr = "transposed",
};
const kreg_tensor_desc kOutDesc = {
    .struct_size = offsetof(kreg_tensor_desc, alt_shape),  // the older layout
    .name = "out",
    .doc = "row sums; 0 past used",
    .role = KREG_ROLE_OUT,
    .dtypes = KREG_DTYPE_F32,
    .shape = "rows",
    .tolerances = kOutTolerances,
    .num_tolerances = 1,
    .alt_shape = Garbage<const char*>(),
    .alt_shape_attr = Garbage<const char*>(),
};
const kreg_tensor_desc* const kTensors[] = {&kXDesc, &kOutDesc};

// ---- Views ------------------------------------------------------------------

struct View {
  int64_t rows = 0, cols = 0, used = 0;
  bool transposed = false, bf16 = false;
  const DLTensor* x = nullptr;
  DLTensor* out = nullptr;

  // Element (i, j) of x as it lies in memory (honouring strides).
  float At(int64_t i, int64_t j) const {
    const int64_t s0 = x->strides ? x->strides[0] : x->shape[1];
    const int64_t s1 = x->strides ? x->strides[1] : 1;
    const char* base = static_cast<const char*>(x->data) + x->byte_offset;
    if (!bf16) return reinterpret_cast<const float*>(base)[i * s0 + j * s1];
    const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(base)[i * s0 + j * s1]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  float& Out(int64_t i) const {
    float* base = reinterpret_cast<float*>(static_cast<char*>(out->data) + out->byte_offset);
    return base[i * (out->strides ? out->strides[0] : 1)];
  }
};

bool ViewOf(const kreg_args* args, View* v, char* msg, size_t cap) {
  if (args == nullptr || args->num_tensors < kNumTensors || args->num_dims < kNumDims ||
      args->num_attrs < kNumAttrs || args->tensors[kX] == nullptr || args->tensors[kOut] == nullptr) {
    std::snprintf(msg, cap, "rowsum: malformed args");
    return false;
  }
  v->rows = args->dims[kRows];
  v->cols = args->dims[kCols];
  v->used = args->dims[kUsed];
  v->transposed = args->attrs[kTransposed].i != 0;
  v->x = args->tensors[kX];
  v->out = args->tensors[kOut];
  v->bf16 = v->x->dtype.code == kDLBfloat;
  // The host gave x the shape its descriptor names under `transposed`.
  const int64_t want0 = v->transposed ? v->cols : v->rows, want1 = v->transposed ? v->rows : v->cols;
  if (v->x->ndim != 2 || v->x->shape[0] != want0 || v->x->shape[1] != want1) {
    std::snprintf(msg, cap, "rowsum: x is not [%lld, %lld]", static_cast<long long>(want0),
                  static_cast<long long>(want1));
    return false;
  }
  return true;
}

kreg_status Validate(const kreg_args* args, char* msg, size_t cap) {
  View v;
  if (!ViewOf(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
  if (v.used > v.rows) {
    std::snprintf(msg, cap, "used=%lld exceeds rows=%lld", static_cast<long long>(v.used),
                  static_cast<long long>(v.rows));
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

const kreg_op_desc kRowsumOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "rowsum",
    .doc = "out[i] = sum of row i of x, for the first `used` rows",
    .dims = kDims,
    .num_dims = kNumDims,
    .tensors = kTensors,
    .num_tensors = kNumTensors,
    .attrs = kAttrs,
    .num_attrs = kNumAttrs,
    .validate = Validate,
};

// ---- Kernels ------------------------------------------------------------------

kreg_status ReferenceRun(const kreg_config*, const kreg_args* args, void*, void*, size_t, const kreg_host*,
                         char* msg, size_t cap) {
  View v;
  if (!ViewOf(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
  for (int64_t i = 0; i < v.rows; ++i) {
    double acc = 0;
    if (i < v.used) {
      for (int64_t j = 0; j < v.cols; ++j) acc += v.transposed ? v.At(j, i) : v.At(i, j);
    }
    v.Out(i) = static_cast<float>(acc);
  }
  return KREG_OK;
}

kreg_status ByMemoryRun(const kreg_config*, const kreg_args* args, void*, void*, size_t, const kreg_host*,
                        char* msg, size_t cap) {
  View v;
  if (!ViewOf(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
  try {
    std::vector<double> acc(v.rows, 0.0);
    if (v.transposed) {
      for (int64_t j = 0; j < v.cols; ++j) {
        for (int64_t i = 0; i < v.used; ++i) acc[i] += v.At(j, i);
      }
    } else {
      for (int64_t i = 0; i < v.used; ++i) {
        for (int64_t j = 0; j < v.cols; ++j) acc[i] += v.At(i, j);
      }
    }
    for (int64_t i = 0; i < v.rows; ++i) v.Out(i) = static_cast<float>(acc[i]);
  } catch (const std::bad_alloc&) {
    std::snprintf(msg, cap, "rowsum/by_memory: out of memory");
    return KREG_RESOURCE_EXHAUSTED;
  }
  return KREG_OK;
}

const kreg_kernel kReference = {
    .struct_size = sizeof(kreg_kernel),
    .op = "rowsum",
    .variant = "reference",
    .version = 1,
    .doc = "row by row in double: the oracle",
    .flags = KREG_KERNEL_REFERENCE,
    .run = ReferenceRun,
};
const kreg_kernel kByMemory = {
    .struct_size = sizeof(kreg_kernel),
    .op = "rowsum",
    .variant = "by_memory",
    .version = 1,
    .doc = "in memory order, one double accumulator per row",
    .run = ByMemoryRun,
};

const kreg_op_desc* const kOps[] = {&kRowsumOp};
const kreg_kernel* const kKernels[] = {&kReference, &kByMemory};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "rowsum_test",
    .version = "1.0",
    .ops = kOps,
    .num_ops = 1,
    .kernels = kKernels,
    .num_kernels = 2,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
