// Ops "allgather", "allreduce" and "reduce_scatter": the collectives of a
// communicator of p ranks (kreg_comm). Every rank calls the op with its own
// tensors; rank q's x is written x_q below.
//
// dims     count (elements per rank, <= INT32_MAX), ranks (p: the host sets
//          it to the communicator's size, KREG_DIM_RANKS).
// dtypes   x f32, bf16 or i32; out has x's dtype.
// attrs    reduction (allreduce, reduce_scatter): 0 sum (default), 1 max.
//
// allgather       x [count]; out [ranks, count]: out[q] = x_q, on every rank.
// allreduce       x [count]; out [count]: out = x_0 OP x_1 OP ... OP x_{p-1},
//                 bit for bit the same on every rank.
// reduce_scatter  x [ranks, count]; out [count]: rank r's out = x_0[r] OP
//                 ... OP x_{p-1}[r].
//
// sum: f32 and bf16 are summed in float or wider (the reference: in double,
// in rank order) and rounded once to the dtype (bf16: to nearest even); i32
// wraps modulo 2^32. max: NaN (the canonical quiet NaN, 0x7fc00000 for f32,
// 0x7fc0 for bf16) if any input is NaN, otherwise the largest, with +0 > -0;
// i32 signed. Sums are compared with atol * ranks * max(1, M) + rtol *
// |want|, M the sum of the terms' magnitudes (KREG_TOLERANCE_MAGNITUDE):
// f32 2e-7 / 1e-6, bf16 2e-7 / 1/128 (one bf16 ulp); max, i32 and allgather
// are exact.
//
// Untuned, an op picks (DefaultVariant) by the backend's calibrated α-β-γ
// costs when the table has them (kreg calibrate), else by size: up to
// kSmallBytes per rank doubling (log p latencies), larger the ring
// (bandwidth-optimal); fewer elements than ranks never take the ring (as
// Open MPI's guard).
#include <algorithm>
#include <cmath>
#include <string_view>

#include "common.h"
#include "kreg/plugin_abi.h"
#include "variants.h"

namespace kreg::collectives {
namespace {

constexpr bool Named(const char* got, std::string_view want) { return std::string_view(got) == want; }

const char* const kDefaultVariants[] = {"ring"};
constexpr int64_t kSmallBytes = 64 << 10;

// The α-β-γ costs (Thakur, Rabenseifner and Gropp 2005) of each variant at
// its default configuration, for p ranks and n bytes (allreduce's vector,
// allgather's output, reduce_scatter's input), lg = ceil(log2 p), f = (p -
// 1) / p. Doubling pays a fold (2 messages of n) where p is not a power of
// two, and allgather's Bruck a final local copy of n; direct sends the
// ring's messages at once, its bandwidth term 1.5x for every rank sending
// to every other.
struct Costs {
  double ring, doubling, direct;
};
Costs ModelCosts(std::string_view op, const kreg_comm_model& m, double p, double n) {
  const double lg = std::ceil(std::log2(p)), f = (p - 1) / p;
  const double a = m.alpha, b = m.beta, g = m.gamma;
  const double fold = std::exp2(lg) == p ? 0 : 2 * a + n * (b + g);
  if (op == "allgather") {
    return {(p - 1) * a + f * n * b, lg * a + f * n * b + n * b, (p - 1) * a + 1.5 * f * n * b};
  }
  if (op == "reduce_scatter") {
    return {(p - 1) * a + f * n * (b + g), lg * a + f * n * (b + g) + fold, (p - 1) * a + 1.5 * f * n * (b + g)};
  }
  // allreduce: ring = reduce-scatter then allgather; doubling (split=whole)
  // = lg exchanges of the whole vector; direct = everyone gets everything.
  return {2 * (p - 1) * a + 2 * f * n * b + f * n * g, lg * (a + n * (b + g)) + fold, (p - 1) * (a + n * (b + g))};
}

// The untuned choice: with a calibrated model (kreg calibrate), the
// cheapest algorithm by it; without, by size. Either way fewer elements
// than ranks never take the ring (Open MPI's guard).
const char* DefaultVariant(const kreg_args* args, const kreg_host* host) {
  const int64_t count = args->dims[kCount], ranks = args->dims[kRanks];
  const int64_t elem = args->tensors[kX]->dtype.bits / 8;
  const bool ring_ok = count >= ranks;
  const kreg_comm_model* model =
      host != nullptr && KREG_HAS_FIELD(host, kreg_host, comm_model) ? host->comm_model : nullptr;
  if (model == nullptr) {
    if (!ring_ok) return "direct";
    return count * elem <= kSmallBytes ? "doubling" : "ring";
  }
  const int64_t rows = args->tensors[kOut]->ndim == 2 ? ranks : 1;  // allgather's out is [ranks, count]
  const int64_t in_rows = args->tensors[kX]->ndim == 2 ? ranks : 1;  // reduce_scatter's x
  const double n = static_cast<double>(count * elem * std::max(rows, in_rows));
  const std::string_view op = rows > 1 ? "allgather" : in_rows > 1 ? "reduce_scatter" : "allreduce";
  const Costs c = ModelCosts(op, *model, static_cast<double>(ranks), n);
  if (ring_ok && c.ring <= c.doubling && c.ring <= c.direct) return "ring";
  return c.doubling <= c.direct ? "doubling" : "direct";
}
constexpr uint32_t kDtypes = KREG_DTYPE_F32 | KREG_DTYPE_BF16 | KREG_DTYPE_I32;

constexpr kreg_dim_desc kCountDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "count", .doc = "elements per rank", .max = INT32_MAX};
constexpr kreg_dim_desc kRanksDim = {
    .struct_size = sizeof(kreg_dim_desc),
    .name = "ranks",
    .doc = "ranks of the communicator (set by the host)",
    .max = kMaxRanks,
    .flags = KREG_DIM_RANKS,
};
constexpr const kreg_dim_desc* kDims[] = {&kCountDim, &kRanksDim};

constexpr kreg_attr_desc kReductionAttr = {
    .struct_size = sizeof(kreg_attr_desc),
    .name = "reduction",
    .doc = "0: sum; 1: max (NaN if any input is NaN; +0 > -0)",
    .kind = KREG_ATTR_INT,
    .default_value = {.i = 0},
    .min = {.i = 0},
    .max = {.i = 1},
};
constexpr const kreg_attr_desc* kReduceAttrs[] = {&kReductionAttr};

// Sums only: max is exact in every kernel, i32 has no entry.
// Sums in another order than the reference's: a float sum of p terms is
// within (p - 1) float roundings of the terms' size (KREG_TOLERANCE_MAGNITUDE),
// bf16 then within one rounding of the result.
constexpr kreg_tolerance kSumF32 = {.struct_size = sizeof(kreg_tolerance),
                                    .dtype = KREG_DTYPE_F32,
                                    .atol = 2e-7,
                                    .rtol = 1e-6,
                                    .scale_dim = "ranks",
                                    .flags = KREG_TOLERANCE_MAGNITUDE};
constexpr kreg_tolerance kSumBf16 = {.struct_size = sizeof(kreg_tolerance),
                                     .dtype = KREG_DTYPE_BF16,
                                     .atol = 2e-7,
                                     .rtol = 1.0 / 128,
                                     .scale_dim = "ranks",
                                     .flags = KREG_TOLERANCE_MAGNITUDE};
constexpr const kreg_tolerance* kSumTolerances[] = {&kSumF32, &kSumBf16};

constexpr kreg_tensor_desc kVectorX = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "x",
    .doc = "this rank's vector",
    .role = KREG_ROLE_IN,
    .dtypes = kDtypes,
    .shape = "count",
};

// ---- allgather -----------------------------------------------------------------------

constexpr kreg_tensor_desc kAllgatherOut = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "out",
    .doc = "row q: rank q's x",
    .role = KREG_ROLE_OUT,
    .dtypes = kDtypes,
    .same_dtype_as = "x",
    .shape = "ranks,count",
};
constexpr const kreg_tensor_desc* kAllgatherTensors[] = {&kVectorX, &kAllgatherOut};

// ---- allreduce -----------------------------------------------------------------------

constexpr kreg_tensor_desc kAllreduceOut = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "out",
    .doc = "the reduction over ranks of x, the same on every rank",
    .role = KREG_ROLE_OUT,
    .dtypes = kDtypes,
    .same_dtype_as = "x",
    .shape = "count",
    .tolerances = kSumTolerances,
    .num_tolerances = 2,
};
constexpr const kreg_tensor_desc* kAllreduceTensors[] = {&kVectorX, &kAllreduceOut};

// ---- reduce_scatter ------------------------------------------------------------------

constexpr kreg_tensor_desc kReduceScatterX = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "x",
    .doc = "row q: this rank's contribution to rank q's out",
    .role = KREG_ROLE_IN,
    .dtypes = kDtypes,
    .shape = "ranks,count",
};
constexpr kreg_tensor_desc kReduceScatterOut = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "out",
    .doc = "the reduction over ranks q of rank q's x[this rank]",
    .role = KREG_ROLE_OUT,
    .dtypes = kDtypes,
    .same_dtype_as = "x",
    .shape = "count",
    .tolerances = kSumTolerances,
    .num_tolerances = 2,
};
constexpr const kreg_tensor_desc* kReduceScatterTensors[] = {&kReduceScatterX, &kReduceScatterOut};

static_assert(sizeof kDims / sizeof kDims[0] == kNumDims && Named(kDims[kCount]->name, "count") &&
              Named(kDims[kRanks]->name, "ranks"));
static_assert(sizeof kReduceAttrs / sizeof kReduceAttrs[0] == kNumReduceAttrs &&
              Named(kReduceAttrs[kReduction]->name, "reduction"));
static_assert(sizeof kAllgatherTensors / sizeof kAllgatherTensors[0] == kNumTensors &&
              Named(kAllgatherTensors[kX]->name, "x") && Named(kAllgatherTensors[kOut]->name, "out") &&
              Named(kAllreduceTensors[kX]->name, "x") && Named(kAllreduceTensors[kOut]->name, "out") &&
              Named(kReduceScatterTensors[kX]->name, "x") && Named(kReduceScatterTensors[kOut]->name, "out"));

}  // namespace

const kreg_op_desc kAllgatherOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "allgather",
    .doc = "every rank gets every rank's x: out[q] = rank q's x",
    .dims = kDims,
    .num_dims = kNumDims,
    .tensors = kAllgatherTensors,
    .num_tensors = kNumTensors,
    .default_variant = DefaultVariant,
    .default_variants = kDefaultVariants,
    .num_default_variants = 1,
};

const kreg_op_desc kAllreduceOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "allreduce",
    .doc = "every rank gets the sum (or max) over ranks of x",
    .dims = kDims,
    .num_dims = kNumDims,
    .tensors = kAllreduceTensors,
    .num_tensors = kNumTensors,
    .attrs = kReduceAttrs,
    .num_attrs = kNumReduceAttrs,
    .default_variant = DefaultVariant,
    .default_variants = kDefaultVariants,
    .num_default_variants = 1,
};

const kreg_op_desc kReduceScatterOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "reduce_scatter",
    .doc = "rank r gets the sum (or max) over ranks q of rank q's x[r]",
    .dims = kDims,
    .num_dims = kNumDims,
    .tensors = kReduceScatterTensors,
    .num_tensors = kNumTensors,
    .attrs = kReduceAttrs,
    .num_attrs = kNumReduceAttrs,
    .default_variant = DefaultVariant,
    .default_variants = kDefaultVariants,
    .num_default_variants = 1,
};

}  // namespace kreg::collectives
