// allgather/reference, allreduce/reference and reduce_scatter/reference: the
// ops' oracles. Every rank sends its x (reduce_scatter: row q of it, to rank
// q) to every other rank and receives theirs into slot q of the workspace,
// all posted at once; once everything has arrived it computes locally from
// the slots: allgather copies them, allreduce and reduce_scatter reduce
// element by element over q = 0..p-1 in order, sums in double (i32 in
// uint32_t, wrapping) rounded once to the dtype, max as Max (common.h).
#include <cstring>

#include "common.h"
#include "variants.h"

namespace kreg::collectives {
namespace {

constexpr int kTag = 0;

// A double rounded to float by round-to-odd: rounding that on to bf16 (8
// bits) is then the single correct rounding of the double.
float RoundToOdd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

struct Scratch {
  void** requests;  // 2 (p - 1)
  void* slots;      // p slots of count elements: slot q holds rank q's data
};

Scratch Layout(const Call& c, Carver* w) {
  return {static_cast<void**>(w->Take(2 * (c.p - 1) * sizeof(void*))), w->Take(c.p * c.Bytes(c.count))};
}

// Fills slot q with rank q's x (reduce_scatter: rank q's x[rank]).
kreg_status Gather(Op op, const Call& c, const Scratch& s, char* msg, size_t cap) {
  const size_t bytes = c.Bytes(c.count);
  std::memcpy(At(s.slots, c.rank, bytes), op == Op::kReduceScatter ? c.XRow(c.rank) : c.x, bytes);
  Link link(c, s.requests, 2 * (c.p - 1), msg, cap);
  int k = 0;
  for (int q = 0; q < c.p; ++q) {
    if (q == c.rank) continue;
    if (!link.Recv(k++, q, kTag, At(s.slots, q, bytes), bytes) ||
        !link.Send(k++, q, kTag, op == Op::kReduceScatter ? c.XRow(q) : c.x, bytes)) {
      break;
    }
  }
  return link.Finish();
}

// out[i] = the reduction over slots q = 0..p-1 of their element i.
void Reduce(const Call& c, const void* slots, void* out) {
  const int64_t n = c.count;
  const bool sum = c.reduction == Reduction::kSum;
  const bool bf16 = c.dtype == Dtype::kBf16;
  for (int64_t i = 0; i < n; ++i) {
    if (c.dtype == Dtype::kI32) {
      const uint32_t* s = static_cast<const uint32_t*>(slots);
      uint32_t acc = s[i];
      for (int q = 1; q < c.p; ++q) acc = sum ? acc + s[q * n + i] : Max{}(acc, s[q * n + i]);
      static_cast<uint32_t*>(out)[i] = acc;
      continue;
    }
    auto load = [&](int q) {
      return bf16 ? Bf16ToFloat(static_cast<const uint16_t*>(slots)[q * n + i])
                  : static_cast<const float*>(slots)[q * n + i];
    };
    float result;
    if (sum) {
      double acc = load(0);
      for (int q = 1; q < c.p; ++q) acc += load(q);
      result = bf16 ? RoundToOdd(acc) : static_cast<float>(acc);
    } else {
      result = -INFINITY;  // max's identity: a NaN comes out canonical even when p = 1
      for (int q = 0; q < c.p; ++q) result = Max{}(result, load(q));
    }
    if (bf16) {
      static_cast<uint16_t*>(out)[i] = FloatToBf16(result);
    } else {
      static_cast<float*>(out)[i] = result;
    }
  }
}

template <Op kOp, const char* kName>
kreg_status Run(const kreg_config*, const kreg_args* args, void*, void* workspace, size_t workspace_size,
                const kreg_host* host, char* msg, size_t cap) {
  Call c;
  Scratch s;
  if (kreg_status st = Begin(kOp, kName, args, host, &c, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = Carve(c, Layout, workspace, workspace_size, &s, msg, cap); st != KREG_OK) return st;
  if (c.count == 0) return KREG_OK;
  if (kreg_status st = Gather(kOp, c, s, msg, cap); st != KREG_OK) return st;
  if (kOp == Op::kAllgather) {
    for (int q = 0; q < c.p; ++q) std::memcpy(c.OutRow(q), At(s.slots, q * c.count, c.elem), c.Bytes(c.count));
  } else {
    Reduce(c, s.slots, c.out);
  }
  return KREG_OK;
}

template <Op kOp, const char* kName>
kreg_status Workspace(const kreg_config*, const kreg_args* args, const kreg_host*, size_t* bytes, char* msg,
                      size_t cap) {
  return Measure(kOp, kName, args, bytes, msg, cap, Layout);
}

constexpr char kAllgatherName[] = "allgather/reference";
constexpr char kAllreduceName[] = "allreduce/reference";
constexpr char kReduceScatterName[] = "reduce_scatter/reference";

}  // namespace

extern const kreg_kernel kAllgatherReferenceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allgather",
    .variant = "reference",
    .version = 1,
    .doc = "everyone sends x to everyone at once, then copies: the oracle",
    .flags = KREG_KERNEL_REFERENCE,
    .workspace_bytes = Workspace<Op::kAllgather, kAllgatherName>,
    .run = Run<Op::kAllgather, kAllgatherName>,
};

extern const kreg_kernel kAllreduceReferenceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allreduce",
    .variant = "reference",
    .version = 1,
    .doc = "everyone sends x to everyone at once, then reduces in rank order in double: the oracle",
    .flags = KREG_KERNEL_REFERENCE,
    .workspace_bytes = Workspace<Op::kAllreduce, kAllreduceName>,
    .run = Run<Op::kAllreduce, kAllreduceName>,
};

extern const kreg_kernel kReduceScatterReferenceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "reduce_scatter",
    .variant = "reference",
    .version = 1,
    .doc = "everyone sends row q of x to rank q at once, then reduces in rank order in double: the oracle",
    .flags = KREG_KERNEL_REFERENCE,
    .workspace_bytes = Workspace<Op::kReduceScatter, kReduceScatterName>,
    .run = Run<Op::kReduceScatter, kReduceScatterName>,
};

}  // namespace kreg::collectives
