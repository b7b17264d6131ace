// gmm/reference and tgmm/reference: the ops' oracles. Plain loops, each
// output a sum in double in reduction order (products of widened f32/bf16
// values are exact in double), plus existing_out, rounded once to out's
// dtype; only the local groups [group_offset, group_offset + local_groups)
// are computed (gmm's other rows: existing_out or 0). A transposed rhs is
// read as GmmDot reads it. Rows (gmm) / (local group, row) pairs (tgmm) run
// in parallel.
#include <algorithm>
#include <vector>

#include "common.h"
#include "variants.h"

namespace kreg::gmm {
namespace {

kreg_status GmmRun(const kreg_config*, const kreg_args* args, void*, void*, size_t, const kreg_host* host, char* msg,
                   size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewGmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = CheckCpu(args, host, msg, cap); s != KREG_OK) return s;
    const std::vector<int64_t> starts = GroupStarts(v);
    // The local groups' rows; every other row is existing_out's (or 0).
    const int64_t first = starts[v.group_offset], last = starts[v.group_offset + v.local_groups];
    const Mat lhs = GmmLhs(v);
    const OutMat out = GmmOut(v);
    const kreg_status status = ParallelFor(v.m, host, [&](int64_t r) {
      std::vector<double> acc(v.n, 0.0);
      if (r >= first && r < last) {
        // The (global) group of row r: the last one starting at or before it.
        const int64_t g = std::upper_bound(starts.begin() + 1, starts.end(), r) - (starts.begin() + 1);
        const Mat rhs = GmmRhs(v, g - v.group_offset);
        const void* a = lhs.Row(r);
        if (v.transpose_rhs) {
          // Column j of the group's matrix is the contiguous row j of [n, k].
          for (int64_t j = 0; j < v.n; ++j) acc[j] = GmmDot(lhs, r, rhs, j, v.k, /*rhs_transposed=*/true);
        } else {
          // Row-wise, but each acc[j] still sums p = 0..k-1 in order: GmmDot's sum.
          for (int64_t p = 0; p < v.k; ++p) {
            const double x = LoadAt(a, lhs.bf16, p);
            const void* b = rhs.Row(p);
            for (int64_t j = 0; j < v.n; ++j) acc[j] += x * static_cast<double>(LoadAt(b, rhs.bf16, j));
          }
        }
      }
      if (v.existing != nullptr) {
        const void* e = GmmExisting(v).Row(r);
        for (int64_t j = 0; j < v.n; ++j) acc[j] += LoadAt(e, v.out_bf16, j);
      }
      void* o = out.Row(r);
      for (int64_t j = 0; j < v.n; ++j) StoreDouble(o, out.bf16, j, acc[j]);
    });
    return Finish(status, msg, cap);
  });
}

kreg_status TgmmRun(const kreg_config*, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                    char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewTgmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = CheckCpu(args, host, msg, cap); s != KREG_OK) return s;
    const std::vector<int64_t> starts = GroupStarts(v);
    const Mat lhs = TgmmLhs(v), rhs = TgmmRhs(v);
    // One task per (local group, row of out[local group]).
    const kreg_status status = ParallelFor(v.local_groups * v.k, host, [&](int64_t li) {
      const int64_t local = li / v.k, i = li % v.k, g = v.group_offset + local;
      std::vector<double> acc(v.n, 0.0);
      const void* a = lhs.Row(i);
      for (int64_t r = starts[g]; r < starts[g + 1]; ++r) {
        const double x = LoadAt(a, lhs.bf16, r);
        const void* b = rhs.Row(r);
        for (int64_t j = 0; j < v.n; ++j) acc[j] += x * static_cast<double>(LoadAt(b, rhs.bf16, j));
      }
      const OutMat out = TgmmOut(v, local);
      void* o = out.Row(i);
      for (int64_t j = 0; j < v.n; ++j) StoreDouble(o, out.bf16, j, acc[j]);
    });
    return Finish(status, msg, cap);
  });
}

}  // namespace

extern const kreg_kernel kGmmReferenceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "reference",
    .version = 1,
    .doc = "plain loops in double, rounded once: the oracle",
    .flags = KREG_KERNEL_REFERENCE,
    .run = GmmRun,
};

extern const kreg_kernel kTgmmReferenceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "tgmm",
    .variant = "reference",
    .version = 1,
    .doc = "plain loops in double, rounded once: the oracle",
    .flags = KREG_KERNEL_REFERENCE,
    .run = TgmmRun,
};

}  // namespace kreg::gmm
