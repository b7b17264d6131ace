// gmm/cuda_cublas and tgmm/cuda_cublas: the grouped matmuls through cuBLAS,
// a vendor baseline beside kreg's own kernel. cuBLAS is loaded at run time
// (dlopen), so the plugin loads, and its other kernels run, where cuBLAS is
// not installed; these two then say why.
//
// cuBLAS takes the groups' shapes on the host, so group_sizes is copied
// back first (a synchronisation the tile-list kernel does not need). Rows
// are row-major and cuBLAS column-major: each group's out^T = rhs^T .
// lhs^T, in one cublasGemmGroupedBatchedEx call (mode grouped: every group a
// problem of its own) or one cublasGemmEx per group (mode per_group).
// The grouped call takes bf16 in with bf16 out and f32 in with f32 out, not
// bf16 in with f32 out (the plugin's check refuses mode grouped there), and
// its kernels were seen reading a group's matrix misaligned where the
// groups' addresses differ in alignment (compute-sanitizer on an H100), so
// a call whose matrices are not all on 16-byte addresses and row pitches
// runs per group (but for a bf16 out with existing_out, which per group
// rounds twice: an error). Non-finite outputs are then recomputed as the
// reference's (FixNonFinite).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.h"

namespace kreg::cuda {
namespace {

// cublasGemmEx's C entry point (the header overloads the name for C++).
using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                  const void*, cudaDataType_t, int, const void*, cudaDataType_t, int, const void*,
                                  void*, cudaDataType_t, int, cublasComputeType_t, cublasGemmAlgo_t);

struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  GemmEx gemm = nullptr;
  decltype(&cublasGemmGroupedBatchedEx) grouped = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  std::string missing;  // why not, or empty
};

// Loaded once: the soname, then the toolkit's usual places.
const Cublas& Lib() {
  static const Cublas* const lib = [] {
    auto* c = new Cublas;
    void* h = nullptr;
    std::string tried;
    for (const char* path : {"libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13",
                             "/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13"}) {
      h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) break;
      tried = dlerror();
    }
    if (h == nullptr) {
      c->missing = "cuBLAS 13 not found (" + tried + ")";
      return c;
    }
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, name));
      if (f == nullptr && c->missing.empty()) c->missing = std::string("cuBLAS lacks ") + name;
    };
    sym(c->create, "cublasCreate_v2");
    sym(c->set_stream, "cublasSetStream_v2");
    sym(c->set_math_mode, "cublasSetMathMode");
    sym(c->gemm, "cublasGemmEx");
    sym(c->grouped, "cublasGemmGroupedBatchedEx");
    sym(c->status_string, "cublasGetStatusString");
    return c;
  }();
  return *lib;
}

// One handle per device for the process's life, used by one call at a time.
std::mutex handles_mutex;
std::map<int, cublasHandle_t>& Handles() {
  static auto* const handles = new std::map<int, cublasHandle_t>;
  return *handles;
}

int Fail(char* msg, size_t cap, const GroupedArgs& a, const char* what, const char* why) {
  std::snprintf(msg, cap, "%s/cuda_cublas: %s: %s", a.tgmm ? "tgmm" : "gmm", what, why);
  return 1;
}

// One GEMM of the call, in cuBLAS's column-major terms.
struct Gemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  const void* a;
  int lda;
  const void* b;
  int ldb;
  void* c;
  int ldc;
};

}  // namespace

const char* CublasMissing() {
  const Cublas& lib = Lib();
  return lib.missing.empty() ? nullptr : lib.missing.c_str();
}

int RunCublas(const GroupedArgs& a, const kreg_device& device, bool grouped, char* msg, size_t cap) {
  const Cublas& lib = Lib();
  if (!lib.missing.empty()) return Fail(msg, cap, a, "cuBLAS", lib.missing.c_str());
  const auto stream = static_cast<cudaStream_t>(device.stream);
  if (cudaError_t e = cudaSetDevice(device.ordinal); e != cudaSuccess) {
    return Fail(msg, cap, a, "cudaSetDevice", cudaGetErrorString(e));
  }
  std::lock_guard<std::mutex> lock(handles_mutex);
  cublasHandle_t& handle = Handles()[device.ordinal];
  if (handle == nullptr) {
    if (cublasStatus_t s = lib.create(&handle); s != CUBLAS_STATUS_SUCCESS) {
      handle = nullptr;
      return Fail(msg, cap, a, "cublasCreate", lib.status_string(s));
    }
  }
  // A bf16 out's partial sums (split-k) reduced in float, not rounded to
  // bf16 on the way: accumulation in float, one rounding at the end, as
  // the op's tolerance assumes (seen off by 1.3% on an H100 otherwise).
  if (cublasStatus_t s = lib.set_math_mode(handle, static_cast<cublasMath_t>(
                                                       CUBLAS_DEFAULT_MATH |
                                                       CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
      s != CUBLAS_STATUS_SUCCESS) {
    return Fail(msg, cap, a, "cublasSetMathMode", lib.status_string(s));
  }
  if (cublasStatus_t s = lib.set_stream(handle, stream); s != CUBLAS_STATUS_SUCCESS) {
    return Fail(msg, cap, a, "cublasSetStream", lib.status_string(s));
  }
  const size_t in_size = a.in_bf16 ? 2 : 4, out_size = a.out_bf16 ? 2 : 4;
  const cudaDataType_t in_type = a.in_bf16 ? CUDA_R_16BF : CUDA_R_32F, out_type = a.out_bf16 ? CUDA_R_16BF : CUDA_R_32F;

  // The groups' shapes, on the host (clamped as the tile-list kernel's plan).
  std::vector<int32_t> sizes(static_cast<size_t>(a.groups));
  if (a.groups > 0) {
    cudaError_t e = cudaMemcpyAsync(sizes.data(), a.group_sizes, sizes.size() * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return Fail(msg, cap, a, "reading group_sizes", cudaGetErrorString(e));
  }
  std::vector<int64_t> first(static_cast<size_t>(a.local_groups)), rows(first.size());
  int64_t start = 0, lo = 0;  // the local groups' rows: [lo, hi)
  for (int64_t g = 0; g < a.group_offset + a.local_groups; ++g) {
    int64_t s = sizes[g] < 0 ? 0 : sizes[g];
    s = s > a.m - start ? a.m - start : s;
    if (g == a.group_offset) lo = start;
    if (g >= a.group_offset) {
      first[g - a.group_offset] = start;
      rows[g - a.group_offset] = s;
    }
    start += s;
  }
  const int64_t hi = a.local_groups > 0 ? start : lo;

  std::vector<Gemm> gemms;
  const float one = 1.0f, zero = 0.0f;
  const bool accumulate = a.existing != nullptr;
  if (!a.tgmm) {
    // out = existing_out (or zero) everywhere; each group's rows then get
    // their product added (or written, beta 0).
    if (a.m > 0 && a.n > 0) {
      const cudaError_t e =
          accumulate ? cudaMemcpy2DAsync(a.out, a.out_ld * out_size, a.existing, a.existing_ld * out_size,
                                         a.n * out_size, a.m, cudaMemcpyDeviceToDevice, stream)
                     : cudaMemset2DAsync(a.out, a.out_ld * out_size, 0, a.n * out_size, a.m, stream);
      if (e != cudaSuccess) return Fail(msg, cap, a, "filling out", cudaGetErrorString(e));
    }
    for (int64_t i = 0; i < a.local_groups; ++i) {
      if (rows[i] == 0 || a.n == 0 || a.k == 0) continue;
      const char* rhs = static_cast<const char*>(a.rhs) + i * a.rhs_group_stride * in_size;
      gemms.push_back({a.transpose_rhs ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(a.n),
                       static_cast<int>(rows[i]), static_cast<int>(a.k), rhs, static_cast<int>(a.rhs_ld),
                       static_cast<const char*>(a.lhs) + first[i] * a.lhs_ld * in_size, static_cast<int>(a.lhs_ld),
                       static_cast<char*>(a.out) + first[i] * a.out_ld * out_size, static_cast<int>(a.out_ld)});
    }
  } else {
    for (int64_t i = 0; i < a.local_groups; ++i) {
      char* out = static_cast<char*>(a.out) + i * a.out_group_stride * out_size;
      if (a.k == 0 || a.n == 0) continue;
      if (rows[i] == 0) {  // an empty group's block: zeros
        if (cudaError_t e = cudaMemset2DAsync(out, a.out_ld * out_size, 0, a.n * out_size, a.k, stream);
            e != cudaSuccess) {
          return Fail(msg, cap, a, "zeroing an empty group", cudaGetErrorString(e));
        }
        continue;
      }
      gemms.push_back({CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(a.n), static_cast<int>(a.k),
                       static_cast<int>(rows[i]), static_cast<const char*>(a.rhs) + first[i] * a.rhs_ld * in_size,
                       static_cast<int>(a.rhs_ld), static_cast<const char*>(a.lhs) + first[i] * in_size,
                       static_cast<int>(a.lhs_ld), out, static_cast<int>(a.out_ld)});
    }
  }
  if (gemms.empty()) return 0;
  const float* beta = accumulate ? &one : &zero;
  auto on16 = [](const void* p, int ld, size_t size) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld * size % 16 == 0;
  };
  bool aligned = true;
  for (const Gemm& g : gemms) {
    aligned = aligned && on16(g.a, g.lda, in_size) && on16(g.b, g.ldb, in_size) && on16(g.c, g.ldc, out_size);
  }
  if (grouped && !aligned && accumulate && a.out_bf16) {  // per group would round twice (the check's reason)
    return Fail(msg, cap, a, "mode=grouped",
                "a bf16 out with existing_out needs every group's matrices on 16-byte addresses, and these tensors "
                "are not");
  }
  grouped = grouped && aligned;
  if (!grouped) {
    for (const Gemm& g : gemms) {
      const cublasStatus_t s = lib.gemm(handle, g.ta, g.tb, g.m, g.n, g.k, &one, g.a, in_type, g.lda, g.b, in_type,
                                        g.ldb, beta, g.c, out_type, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS) return Fail(msg, cap, a, "cublasGemmEx", lib.status_string(s));
    }
    return FixNonFinite(a, lo, hi, device, msg, cap);
  }
  // One call: every GEMM a cuBLAS group of one problem; the pointer arrays
  // on the device (copied from pageable memory: staged before the call
  // returns).
  const size_t count = gemms.size();
  std::vector<cublasOperation_t> ta(count), tb(count);
  std::vector<int> ms(count), ns(count), ks(count), ldas(count), ldbs(count), ldcs(count), ones(count, 1);
  std::vector<float> alphas(count, 1.0f), betas(count, *beta);
  std::vector<const void*> pointers(3 * count);
  for (size_t i = 0; i < count; ++i) {
    const Gemm& g = gemms[i];
    ta[i] = g.ta;
    tb[i] = g.tb;
    ms[i] = g.m;
    ns[i] = g.n;
    ks[i] = g.k;
    ldas[i] = g.lda;
    ldbs[i] = g.ldb;
    ldcs[i] = g.ldc;
    pointers[i] = g.a;
    pointers[count + i] = g.b;
    pointers[2 * count + i] = g.c;
  }
  void* on_device = device.alloc(device.ctx, pointers.size() * sizeof(void*));
  if (on_device == nullptr) return Fail(msg, cap, a, "pointer arrays", "out of device memory");
  int rc = 0;
  if (cudaError_t e = cudaMemcpyAsync(on_device, pointers.data(), pointers.size() * sizeof(void*),
                                      cudaMemcpyHostToDevice, stream);
      e != cudaSuccess) {
    rc = Fail(msg, cap, a, "copying pointer arrays", cudaGetErrorString(e));
  } else {
    auto* const* p = static_cast<void* const*>(on_device);
    const cublasStatus_t s = lib.grouped(
        handle, ta.data(), tb.data(), ms.data(), ns.data(), ks.data(), alphas.data(),
        reinterpret_cast<const void* const*>(p), in_type, ldas.data(), reinterpret_cast<const void* const*>(p + count),
        in_type, ldbs.data(), betas.data(), p + 2 * count, out_type, ldcs.data(), static_cast<int>(count),
        ones.data(), CUBLAS_COMPUTE_32F);
    if (s != CUBLAS_STATUS_SUCCESS) rc = Fail(msg, cap, a, "cublasGemmGroupedBatchedEx", lib.status_string(s));
  }
  device.free(device.ctx, on_device);  // stream-ordered: after the call
  return rc != 0 ? rc : FixNonFinite(a, lo, hi, device, msg, cap);
}

}  // namespace kreg::cuda
