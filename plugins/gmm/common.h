// Shared by the gmm plugin's ops and kernels: tensor/dim indices (in the
// order op.cc declares them), typed views of a call's kreg_args, element
// access honouring strides and byte_offset, bf16 rounding, group starts, the
// f64 dot products the reference and the tiled kernels' exact fallback share,
// and the guarded entry points. Plugin-private; speaks only the ABI header.
#ifndef KREG_PLUGINS_GMM_COMMON_H_
#define KREG_PLUGINS_GMM_COMMON_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <exception>
#include <new>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "kreg/gmm/layout.h"
#include "kreg/plugin_sdk.h"

namespace kreg::gmm {

using sdk::Base;
using sdk::Bf16ToFloat;
using sdk::Cancelled;
using sdk::Fail;
using sdk::Finish;
using sdk::FloatToBf16;
using sdk::Guarded;
using sdk::HostIsa;
using sdk::IsBf16;
using sdk::Stride;


// ---- Element access ----------------------------------------------------------

// IsBf16, Base, Stride, Bf16ToFloat and FloatToBf16 come from the SDK.

// A double rounded to float by round-to-odd: rounding that on to bf16 (8
// bits) is then the single correct rounding of the double.
inline float RoundToOdd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u |= 1u;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Element i of a row of f32 or bf16 elements, widened exactly.
inline float LoadAt(const void* row, bool bf16, int64_t i) {
  return bf16 ? Bf16ToFloat(static_cast<const uint16_t*>(row)[i]) : static_cast<const float*>(row)[i];
}
// The address of element i of a row of f32 or bf16 elements.
inline const void* Advance(const void* p, bool bf16, int64_t i) {
  return static_cast<const char*>(p) + i * (bf16 ? 2 : 4);
}
inline void* Advance(void* p, bool bf16, int64_t i) { return static_cast<char*>(p) + i * (bf16 ? 2 : 4); }

// Stores a float result (one rounding to bf16 if the row is bf16).
inline void StoreFloat(void* row, bool bf16, int64_t i, float v) {
  if (bf16) {
    static_cast<uint16_t*>(row)[i] = FloatToBf16(v);
  } else {
    static_cast<float*>(row)[i] = v;
  }
}
// Stores a double result, rounded once to the row's dtype.
inline void StoreDouble(void* row, bool bf16, int64_t i, double v) {
  if (bf16) {
    static_cast<uint16_t*>(row)[i] = FloatToBf16(RoundToOdd(v));
  } else {
    static_cast<float*>(row)[i] = static_cast<float>(v);
  }
}

// Whether any of row[0, n) (f32 or bf16) is NaN or infinite (on the bits,
// so it vectorises).
inline bool AnyNonFinite(const void* row, bool bf16, int64_t n) {
  uint32_t all = 0;
  if (bf16) {
    const uint16_t* h = static_cast<const uint16_t*>(row);
    for (int64_t j = 0; j < n; ++j) all |= static_cast<uint32_t>((h[j] & 0x7f80u) == 0x7f80u);
  } else {
    const uint32_t* u = static_cast<const uint32_t*>(row);
    for (int64_t j = 0; j < n; ++j) all |= static_cast<uint32_t>((u[j] & 0x7f800000u) == 0x7f800000u);
  }
  return all != 0;
}

// The largest magnitude in a row of f32 or bf16 elements, as the bits of a
// non-negative f32 (bf16 widened): magnitudes order as these integers do,
// so a result >= 0x7f800000 means an infinity or NaN is in the row.
inline uint32_t MaxAbsBits(const void* row, bool bf16, int64_t n) {
  uint32_t most = 0;
  if (bf16) {
    const uint16_t* h = static_cast<const uint16_t*>(row);
    for (int64_t j = 0; j < n; ++j) most = std::max(most, static_cast<uint32_t>(h[j] & 0x7fffu) << 16);
  } else {
    const uint32_t* u = static_cast<const uint32_t*>(row);
    for (int64_t j = 0; j < n; ++j) most = std::max(most, u[j] & 0x7fffffffu);
  }
  return most;
}

// ---- Views -------------------------------------------------------------------

// A 2-D matrix of f32 or bf16: element (i, j) at p + i * ld + j.
struct Mat {
  const void* p = nullptr;
  int64_t ld = 0;
  bool bf16 = false;
  const void* Row(int64_t i) const { return Advance(p, bf16, i * ld); }
  float At(int64_t i, int64_t j) const { return LoadAt(Row(i), bf16, j); }
};
struct OutMat {
  void* p = nullptr;
  int64_t ld = 0;
  bool bf16 = false;
  void* Row(int64_t i) const { return Advance(p, bf16, i * ld); }
};

// What both ops share once viewed: the reduction problem per group.
// group_sizes covers all `groups` groups (global indices g); this call
// computes the local ones, g in [group_offset, group_offset + local_groups),
// whose rhs (gmm) or out (tgmm) block is the local index g - group_offset
// (validated: group_offset + local_groups <= groups).
struct GroupedView {
  int64_t m = 0, k = 0, n = 0, groups = 0;
  int64_t local_groups = 0, group_offset = 0;
  bool transpose_rhs = false;     // gmm: rhs is [local_groups, n, k]
  bool constant_weights = false;  // gmm: rhs is the same on every run of a prepared state
  const DLTensor* lhs = nullptr;
  const DLTensor* rhs = nullptr;
  const DLTensor* group_sizes = nullptr;
  const DLTensor* existing = nullptr;  // gmm only; NULL when absent
  DLTensor* out = nullptr;
  bool in_bf16 = false, out_bf16 = false;

  int32_t GroupSize(int64_t g) const {
    return reinterpret_cast<const int32_t*>(Base(group_sizes))[g * Stride(group_sizes, 0)];
  }
};

// Views gmm args (shapes only: no data is read). False with a reason on
// args not shaped like gmm's, which the host rules out; only a guard.
inline bool ViewGmm(const kreg_args* args, GroupedView* v, char* msg, size_t cap) {
  if (args == nullptr || args->struct_size < KREG_ARGS_MIN_SIZE || args->num_tensors < kGmmNumTensors ||
      args->num_dims < kGmmNumDims || args->num_attrs < kGmmNumAttrs || args->tensors == nullptr ||
      args->dims == nullptr || args->attrs == nullptr ||
      args->tensors[kGmmLhs] == nullptr || args->tensors[kGmmRhs] == nullptr ||
      args->tensors[kGmmGroupSizes] == nullptr || args->tensors[kGmmOut] == nullptr) {
    std::snprintf(msg, cap, "args are not those of op gmm");
    return false;
  }
  v->m = args->dims[kGmmM];
  v->k = args->dims[kGmmK];
  v->n = args->dims[kGmmN];
  v->groups = args->dims[kGmmGroups];
  v->local_groups = args->dims[kGmmLocalGroups];
  v->group_offset = args->attrs[kGmmGroupOffset].i;
  v->transpose_rhs = args->attrs[kGmmTransposeRhs].i != 0;
  v->constant_weights = args->attrs[kGmmConstantWeights].i != 0;
  v->lhs = args->tensors[kGmmLhs];
  v->rhs = args->tensors[kGmmRhs];
  v->group_sizes = args->tensors[kGmmGroupSizes];
  v->out = args->tensors[kGmmOut];
  v->existing = args->tensors[kGmmExistingOut];
  v->in_bf16 = IsBf16(v->lhs);
  v->out_bf16 = IsBf16(v->out);
  return true;
}

inline bool ViewTgmm(const kreg_args* args, GroupedView* v, char* msg, size_t cap) {
  if (args == nullptr || args->struct_size < KREG_ARGS_MIN_SIZE || args->num_tensors < kTgmmNumTensors ||
      args->num_dims < kTgmmNumDims || args->num_attrs < kTgmmNumAttrs || args->tensors == nullptr ||
      args->dims == nullptr || args->attrs == nullptr ||
      args->tensors[kTgmmLhs] == nullptr || args->tensors[kTgmmRhs] == nullptr ||
      args->tensors[kTgmmGroupSizes] == nullptr || args->tensors[kTgmmOut] == nullptr) {
    std::snprintf(msg, cap, "args are not those of op tgmm");
    return false;
  }
  v->m = args->dims[kTgmmM];
  v->k = args->dims[kTgmmK];
  v->n = args->dims[kTgmmN];
  v->groups = args->dims[kTgmmGroups];
  v->local_groups = args->dims[kTgmmLocalGroups];
  v->group_offset = args->attrs[kTgmmGroupOffset].i;
  v->lhs = args->tensors[kTgmmLhs];
  v->rhs = args->tensors[kTgmmRhs];
  v->group_sizes = args->tensors[kTgmmGroupSizes];
  v->out = args->tensors[kTgmmOut];
  v->in_bf16 = IsBf16(v->lhs);
  v->out_bf16 = IsBf16(v->out);
  return true;
}

// gmm: lhs [m, k]; out / existing [m, n]. GmmRhs(v, local_g) is the matrix
// of local group local_g (global group v.group_offset + local_g) as it lies
// in memory: [k, n], or with v.transpose_rhs [n, k]. So element (p, j) of
// the group's logical [k, n] matrix is At(p, j), or At(j, p) when
// transposed; Row(i) is always a physical (contiguous) row.
inline Mat GmmLhs(const GroupedView& v) { return {Base(v.lhs), Stride(v.lhs, 0), v.in_bf16}; }
inline Mat GmmRhs(const GroupedView& v, int64_t local_g) {
  return {Advance(Base(v.rhs), v.in_bf16, local_g * Stride(v.rhs, 0)), Stride(v.rhs, 1), v.in_bf16};
}
inline Mat GmmExisting(const GroupedView& v) {
  return {Base(v.existing), Stride(v.existing, 0), v.out_bf16};
}
inline OutMat GmmOut(const GroupedView& v) { return {Base(v.out), Stride(v.out, 0), v.out_bf16}; }
// tgmm: lhs [k, m]; rhs [m, n]; out[local_g] [k, n], for global group
// v.group_offset + local_g.
inline Mat TgmmLhs(const GroupedView& v) { return {Base(v.lhs), Stride(v.lhs, 0), v.in_bf16}; }
inline Mat TgmmRhs(const GroupedView& v) { return {Base(v.rhs), Stride(v.rhs, 0), v.in_bf16}; }
inline OutMat TgmmOut(const GroupedView& v, int64_t local_g) {
  return {Advance(Base(v.out), v.out_bf16, local_g * Stride(v.out, 0)), Stride(v.out, 1), v.out_bf16};
}

// starts[g] = first row of (global) group g; starts[groups] = their total
// (<= m, as validated). The local groups' rows are [starts[group_offset],
// starts[group_offset + local_groups]); gmm's other rows are
// existing_out's (or 0).
inline std::vector<int64_t> GroupStarts(const GroupedView& v) {
  std::vector<int64_t> starts(v.groups + 1, 0);
  for (int64_t g = 0; g < v.groups; ++g) starts[g + 1] = starts[g] + v.GroupSize(g);
  return starts;
}

// ---- The reference's arithmetic -----------------------------------------------
// Both are defined in dot.cc, out of line and without ISA attributes:
// products of f32 values are exact in double, sums run in this order, so the
// tiled kernels' fallback reproduces the reference bit for bit.

// sum over p of lhs(row, p) * rhs(p, col), p = 0..k-1 in order, in double.
// `rhs` is GmmRhs's matrix as it lies in memory: [k, n], or [n, k] when
// rhs_transposed (rhs(p, col) is then rhs.At(col, p)).
double GmmDot(const Mat& lhs, int64_t row, const Mat& rhs, int64_t col, int64_t k, bool rhs_transposed = false);
// sum over r in [r0, r1) of lhs(i, r) * rhs(r, col), in order, in double.
double TgmmDot(const Mat& lhs, int64_t i, const Mat& rhs, int64_t col, int64_t r0, int64_t r1);

// ---- Validation, checks, guards -----------------------------------------------

// group_offset + local_groups <= groups (shapes only).
inline kreg_status ValidateLocalGroups(const GroupedView& v, char* msg, size_t cap) {
  if (v.group_offset < 0 || v.local_groups < 0 || v.group_offset > v.groups - v.local_groups) {
    std::snprintf(msg, cap, "group_offset=%lld + local_groups=%lld exceeds groups=%lld",
                  static_cast<long long>(v.group_offset), static_cast<long long>(v.local_groups),
                  static_cast<long long>(v.groups));
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

// Group sizes >= 0 summing to at most `m`; data is read unless shape-only.
inline kreg_status ValidatePartition(const kreg_args* args, const GroupedView& v, char* msg, size_t cap) {
  if ((args->flags & KREG_ARGS_SHAPE_ONLY) != 0) return KREG_OK;
  int64_t sum = 0;
  for (int64_t g = 0; g < v.groups; ++g) {
    const int64_t size = v.GroupSize(g);
    if (size < 0) {
      std::snprintf(msg, cap, "group_sizes[%lld]=%lld is negative", static_cast<long long>(g),
                    static_cast<long long>(size));
      return KREG_INVALID_ARGUMENT;
    }
    sum += size;
    if (sum > v.m) {
      std::snprintf(msg, cap, "group_sizes[0..%lld] sum to %lld, more than m=%lld rows", static_cast<long long>(g),
                    static_cast<long long>(sum), static_cast<long long>(v.m));
      return KREG_INVALID_ARGUMENT;
    }
  }
  return KREG_OK;
}

// Every kernel's check: CPU tensors and no device backend.
inline kreg_status CheckCpu(const kreg_args* args, const kreg_host* host, char* msg, size_t cap) {
  if (host != nullptr && KREG_HAS_FIELD(host, kreg_host, device) && host->device != nullptr) {
    return Fail(KREG_UNIMPLEMENTED, msg, cap, "CPU kernel: host has a device backend");
  }
  for (size_t i = 0; i < args->num_tensors; ++i) {
    if (args->tensors[i] != nullptr && args->tensors[i]->device.device_type != kDLCPU) {
      return Fail(KREG_UNIMPLEMENTED, msg, cap, "CPU kernel: a tensor is not on the CPU");
    }
  }
  return KREG_OK;
}

// Runs fn(i) for i in [0, count) on oneTBB, honouring cancellation.
template <typename Fn>
kreg_status ParallelFor(int64_t count, const kreg_host* host, Fn&& fn, int64_t grain = 1) {
  if (count <= 0) return KREG_OK;
  std::atomic<bool> stop{false};
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, grain), [&](const tbb::blocked_range<int64_t>& range) {
    if (stop.load(std::memory_order_relaxed)) return;
    if (Cancelled(host)) {
      stop = true;
      return;
    }
    for (int64_t i = range.begin(); i != range.end(); ++i) fn(i);
  });
  return stop ? KREG_CANCELLED : KREG_OK;
}

// Runs body() and turns any exception into a status: nothing may unwind
// through the C ABI.
}  // namespace kreg::gmm

#endif  // KREG_PLUGINS_GMM_COMMON_H_
