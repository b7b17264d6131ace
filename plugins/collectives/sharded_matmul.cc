// Op "sharded_matmul": a matmul on a 2-D device mesh (the seed's xla_matmul2),
// and its kernels reference, plain and overlapped.
//
// The mesh has axes x (X ranks) and y (Y ranks); rank (ix, iy) is rank
// ix * Y + iy of the communicator (x first: --mesh XxY; the kernels refuse a
// communicator whose axes x and y disagree). The global X_ [m, k] is sharded over (x,
// y), W_ [k, n] over x (replicated over y), the result [m, n] over x.
//
// dims     m, k, n (global, <= INT32_MAX); ranks (X * Y, KREG_DIM_RANKS);
//          x, y (X and Y, KREG_DIM_MESH_AXIS: the host sets them from
//          --mesh); derived: m_shard = m / x, kx = k / x, ky = k / y.
// tensors  x    [m_shard, ky] f32: this rank's block of X_, rows
//               [ix * m_shard, ...) and columns [iy * ky, ...).
//          w    [kx, n] f32: rows [ix * kx, ...) of W_.
//          out  [m_shard, n] f32: rows [ix * m_shard, ...) of the product.
//
// Exactly, with every rank's inputs its own (the ranks of one x-coordinate
// need not hold equal w): rank (ix, iy) all-gathers w along axis x from the
// ranks (jx, iy), jx = 0..X-1, into W^(iy) = the concatenation over jx of
// w_(jx,iy) ([k, n]); its partial is x_(ix,iy) . W^(iy)[iy*ky : (iy+1)*ky, :];
// out on every rank of x-coordinate ix is the sum over iy of those partials.
// When every y holds the same w, this is X_ . W_. The reference sums in
// double and rounds once; out is compared with atol 2e-7 * k * max(1, M) +
// rtol 1e-5 * |want|, M the sum of the terms' magnitudes; where M overflows
// float, the float partial sums of the shards may overflow too, and any
// infinity or NaN is accepted there. Otherwise NaN and infinities propagate
// as in a plain matmul.
//
// The local multiplies of plain and overlapped go through the host's "gmm"
// (kreg_host.dispatch, one group of m_shard rows); their collectives are the
// plugin's allgather/ring and allreduce/ring kernels (chunks = 1) run on the
// axis communicators (kreg_comm.axis).
//
// sharded_matmul/reference   every rank sends its x and w to every rank
//                            over the world communicator, then computes the
//                            formula above in double.
// sharded_matmul/plain       all-gather w along x into [k, n], one multiply
//                            of x by rows [iy*ky, (iy+1)*ky), all-reduce
//                            (sum) of the [m_shard, n] partial along y.
// sharded_matmul/overlapped  a collective matmul: the w shards go round the
//                            ring of axis x (step s: shard ix - s is held;
//                            send it to ix + 1, receive shard ix - s - 1 from
//                            ix - 1 into the other of two buffers) and while
//                            the next is in flight the rows of the held shard
//                            within [iy*ky, (iy+1)*ky), if any, are
//                            multiplied by x's matching columns and added to
//                            the partial (gmm with existing_out, ping-ponging
//                            between two partials); then the all-reduce along
//                            y.
#include <algorithm>
#include <cstring>
#include <string_view>

#include "common.h"
#include "kreg/plugin_abi.h"
#include "variants.h"

namespace kreg::collectives {
namespace {

constexpr bool Named(const char* got, std::string_view want) { return std::string_view(got) == want; }

enum ShardedTensor { kShardedX = 0, kShardedW, kShardedOut, kShardedNumTensors };
enum ShardedDim {
  kShardedM = 0,
  kShardedK,
  kShardedN,
  kShardedRanks,
  kShardedMeshX,
  kShardedMeshY,
  kShardedMShard,
  kShardedKx,
  kShardedKy,
  kShardedNumDims
};
// The host's op "gmm" (plugins/gmm/op.cc), in its order.
enum GmmTensor { kGmmLhs = 0, kGmmRhs, kGmmGroupSizes, kGmmOut, kGmmExistingOut, kGmmNumTensors };
constexpr size_t kGmmNumDims = 5;   // m, k, n, groups, local_groups
constexpr size_t kGmmNumAttrs = 3;  // transpose_rhs, group_offset, constant_weights

// Elements of any one buffer a kernel keeps (m_shard * n, k * n, m_shard *
// ky): with at most kMaxRanks slots of two of them, byte counts stay well
// inside int64.
constexpr int64_t kMaxElements = int64_t{1} << 40;

constexpr DLDataType kF32 = {kDLFloat, 32, 1};
constexpr DLDataType kI32 = {kDLInt, 32, 1};

// ---- The op ----------------------------------------------------------------------

constexpr kreg_dim_desc kMDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "m", .doc = "rows of the global X_ and out", .max = INT32_MAX};
constexpr kreg_dim_desc kKDim = {.struct_size = sizeof(kreg_dim_desc),
                                 .name = "k",
                                 .doc = "the reduction: columns of X_, rows of W_",
                                 .max = INT32_MAX};
constexpr kreg_dim_desc kNDim = {
    .struct_size = sizeof(kreg_dim_desc), .name = "n", .doc = "columns of W_ and out", .max = INT32_MAX};
constexpr kreg_dim_desc kRanksDim = {
    .struct_size = sizeof(kreg_dim_desc),
    .name = "ranks",
    .doc = "ranks of the communicator, x * y (set by the host)",
    .max = kMaxRanks,
    .flags = KREG_DIM_RANKS,
};
constexpr kreg_dim_desc kMeshXDim = {
    .struct_size = sizeof(kreg_dim_desc),
    .name = "x",
    .doc = "ranks along mesh axis x, which shards X_'s rows and W_'s rows (set by the host from --mesh)",
    .max = kMaxRanks,
    .flags = KREG_DIM_MESH_AXIS,
};
constexpr kreg_dim_desc kMeshYDim = {
    .struct_size = sizeof(kreg_dim_desc),
    .name = "y",
    .doc = "ranks along mesh axis y, which shards X_'s columns (set by the host from --mesh)",
    .max = kMaxRanks,
    .flags = KREG_DIM_MESH_AXIS,
};
constexpr kreg_dim_desc kMShardDim = {.struct_size = sizeof(kreg_dim_desc),
                                      .name = "m_shard",
                                      .doc = "rows of x and out: m / x",
                                      .numerator = "m",
                                      .denominator = "x"};
constexpr kreg_dim_desc kKxDim = {.struct_size = sizeof(kreg_dim_desc),
                                  .name = "kx",
                                  .doc = "rows of w: k / x",
                                  .numerator = "k",
                                  .denominator = "x"};
constexpr kreg_dim_desc kKyDim = {.struct_size = sizeof(kreg_dim_desc),
                                  .name = "ky",
                                  .doc = "columns of x: k / y",
                                  .numerator = "k",
                                  .denominator = "y"};
constexpr const kreg_dim_desc* kDims[] = {&kMDim,     &kKDim,      &kNDim,  &kRanksDim, &kMeshXDim,
                                          &kMeshYDim, &kMShardDim, &kKxDim, &kKyDim};

// A float dot product of k terms is within k roundings of its terms' size
// (KREG_TOLERANCE_MAGNITUDE); where those overflow float, the per-shard
// partial sums may overflow too (to an infinity, or NaN) and are accepted.
constexpr kreg_tolerance kOutF32 = {.struct_size = sizeof(kreg_tolerance),
                                    .dtype = KREG_DTYPE_F32,
                                    .atol = 2e-7,
                                    .rtol = 1e-5,
                                    .scale_dim = "k",
                                    .flags = KREG_TOLERANCE_MAGNITUDE};
constexpr const kreg_tolerance* kOutTolerances[] = {&kOutF32};

constexpr kreg_tensor_desc kXDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "x",
    .doc = "this rank's block of X_: rows [ix * m_shard, ...), columns [iy * ky, ...)",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32,
    .shape = "m_shard,ky",
};
constexpr kreg_tensor_desc kWDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "w",
    .doc = "this rank's rows [ix * kx, ...) of W_",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32,
    .same_dtype_as = "x",
    .shape = "kx,n",
};
constexpr kreg_tensor_desc kOutDesc = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "out",
    .doc = "rows [ix * m_shard, ...) of the product, the same on every rank of axis y",
    .role = KREG_ROLE_OUT,
    .dtypes = KREG_DTYPE_F32,
    .same_dtype_as = "x",
    .shape = "m_shard,n",
    .tolerances = kOutTolerances,
    .num_tolerances = 1,
};
constexpr const kreg_tensor_desc* kTensors[] = {&kXDesc, &kWDesc, &kOutDesc};

static_assert(sizeof kDims / sizeof kDims[0] == kShardedNumDims && Named(kDims[kShardedM]->name, "m") &&
              Named(kDims[kShardedK]->name, "k") && Named(kDims[kShardedN]->name, "n") &&
              Named(kDims[kShardedRanks]->name, "ranks") && Named(kDims[kShardedMeshX]->name, "x") &&
              Named(kDims[kShardedMeshY]->name, "y") && Named(kDims[kShardedMShard]->name, "m_shard") &&
              Named(kDims[kShardedKx]->name, "kx") && Named(kDims[kShardedKy]->name, "ky"));
static_assert(sizeof kTensors / sizeof kTensors[0] == kShardedNumTensors && Named(kTensors[kShardedX]->name, "x") &&
              Named(kTensors[kShardedW]->name, "w") && Named(kTensors[kShardedOut]->name, "out"));

const char* const kDefaultVariants[] = {"plain"};

// ---- The view of a call ----------------------------------------------------------

// One call's dims and this rank's tensors (rows `ld` elements apart). Reads
// no data.
struct Shard {
  const char* name = nullptr;  // the kernel (or the op): prefixes every message
  int64_t k = 0, n = 0, ms = 0, kx = 0, ky = 0;
  int nx = 1, ny = 1;  // ranks along axes x and y
  const float* x = nullptr;
  int64_t x_ld = 0;
  const float* w = nullptr;
  int64_t w_ld = 0;
  float* out = nullptr;
  int64_t out_ld = 0;
};

kreg_status View(const char* name, const kreg_args* args, Shard* s, char* msg, size_t cap) {
  if (args == nullptr || args->struct_size < KREG_ARGS_MIN_SIZE || args->tensors == nullptr ||
      args->num_tensors < kShardedNumTensors || args->dims == nullptr || args->num_dims < kShardedNumDims ||
      args->tensors[kShardedX] == nullptr || args->tensors[kShardedW] == nullptr ||
      args->tensors[kShardedOut] == nullptr) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: args are not those of the op", name);
  }
  const int64_t* d = args->dims;
  for (int i = 0; i < kShardedNumDims; ++i) {
    if (d[i] < 0 || d[i] > INT32_MAX) return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: dims out of range", name);
  }
  const int64_t nx = d[kShardedMeshX], ny = d[kShardedMeshY];
  if (nx < 1 || ny < 1 || nx * ny != d[kShardedRanks]) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: the mesh must be x by y: x=%lld, y=%lld, but ranks=%lld", name,
                static_cast<long long>(nx), static_cast<long long>(ny), static_cast<long long>(d[kShardedRanks]));
  }
  if (d[kShardedMShard] * nx != d[kShardedM] || d[kShardedKx] * nx != d[kShardedK] ||
      d[kShardedKy] * ny != d[kShardedK]) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: m_shard, kx, ky are not m / x, k / x, k / y", name);
  }
  for (const DLTensor* t : {args->tensors[kShardedX], args->tensors[kShardedW], args->tensors[kShardedOut]}) {
    if (t->ndim != 2 || t->dtype.code != kDLFloat || t->dtype.bits != 32) {
      return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: x, w and out are 2-D f32", name);
    }
  }
  *s = {.name = name,
        .k = d[kShardedK],
        .n = d[kShardedN],
        .ms = d[kShardedMShard],
        .kx = d[kShardedKx],
        .ky = d[kShardedKy],
        .nx = static_cast<int>(nx),
        .ny = static_cast<int>(ny),
        .x = static_cast<const float*>(Base(args->tensors[kShardedX])),
        .x_ld = RowStride(args->tensors[kShardedX]),
        .w = static_cast<const float*>(Base(args->tensors[kShardedW])),
        .w_ld = RowStride(args->tensors[kShardedW]),
        .out = static_cast<float*>(Base(args->tensors[kShardedOut])),
        .out_ld = RowStride(args->tensors[kShardedOut])};
  if (s->ms * s->n > kMaxElements || s->k * s->n > kMaxElements || s->ms * s->ky > kMaxElements) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: too large: m_shard*n, k*n and m_shard*ky are at most 2^40", name);
  }
  return KREG_OK;
}

kreg_status Validate(const kreg_args* args, char* msg, size_t cap) {
  Shard s;
  return View("sharded_matmul", args, &s, msg, cap);
}

// This rank's place: its communicator of x * y ranks, its coordinates
// (rank = ix * y + iy) and, where the communicator has them, its axes.
struct Mesh {
  const kreg_comm* world = nullptr;
  const kreg_comm* x = nullptr;  // NULL, as y, when the communicator has no axes x and y
  const kreg_comm* y = nullptr;
  int ix = 0, iy = 0;
};

// What every run needs: CPU tensors, a communicator of x * y ranks and, if
// it has axes, axes x and y whose ranks are this rank's coordinates.
kreg_status Place(const Shard& s, const kreg_args* args, const kreg_host* host, Mesh* mesh, char* msg, size_t cap) {
  const kreg_comm* comm = KREG_HAS_FIELD(host, kreg_host, comm) ? host->comm : nullptr;
  if (comm == nullptr || comm->struct_size < KREG_COMM_MIN_SIZE) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: needs a communicator (run with --mesh XxY)", s.name);
  }
  if (comm->size != s.nx * s.ny || comm->rank < 0 || comm->rank >= comm->size) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: a mesh of %d x %d, but this is rank %d of a communicator of %d",
                s.name, s.nx, s.ny, comm->rank, comm->size);
  }
  if (KREG_HAS_FIELD(host, kreg_host, device) && host->device != nullptr) {
    return Fail(KREG_UNIMPLEMENTED, msg, cap, "%s: CPU kernel: host has a device backend", s.name);
  }
  for (int i = 0; i < kShardedNumTensors; ++i) {
    if (args->tensors[i]->device.device_type != kDLCPU) {
      return Fail(KREG_UNIMPLEMENTED, msg, cap, "%s: CPU kernel: a tensor is not on the CPU", s.name);
    }
  }
  *mesh = {.world = comm, .ix = comm->rank / s.ny, .iy = comm->rank % s.ny};
  const auto axis = KREG_HAS_FIELD(comm, kreg_comm, axis) ? comm->axis : nullptr;
  const kreg_comm* x = axis != nullptr ? axis(comm->ctx, "x") : nullptr;
  const kreg_comm* y = axis != nullptr ? axis(comm->ctx, "y") : nullptr;
  if (x == nullptr || y == nullptr) return KREG_OK;
  if (x->struct_size < KREG_COMM_MIN_SIZE || y->struct_size < KREG_COMM_MIN_SIZE || x->size != s.nx ||
      y->size != s.ny || x->rank != mesh->ix || y->rank != mesh->iy) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap,
                "%s: rank %d is x=%d, y=%d of a %d x %d mesh, but the op numbers ranks x * %d + y (give --mesh XxY, "
                "x first)",
                s.name, comm->rank, x->rank, y->rank, x->size, y->size, s.ny);
  }
  mesh->x = x;
  mesh->y = y;
  return KREG_OK;
}

// rows x cols floats from src (rows src_ld apart) to dst (dst_ld apart).
void CopyRows(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_ld, src + r * src_ld, cols * sizeof(float));
}

void ZeroOut(const Shard& s) {
  for (int64_t r = 0; r < s.ms; ++r) std::fill_n(s.out + r * s.out_ld, s.n, 0.0f);
}

// ---- reference -------------------------------------------------------------------

constexpr char kReferenceName[] = "sharded_matmul/reference";
constexpr int kTag = 0;

struct ReferenceScratch {
  void** requests;  // 2 (ranks - 1)
  float* slots;     // slot q: rank q's x [m_shard, ky] then its w [kx, n], compact
  double* row;      // [n]: one row of out
};

int64_t SlotElements(const Shard& s) { return s.ms * s.ky + s.kx * s.n; }

ReferenceScratch ReferenceLayout(const Shard& s, Carver* w) {
  const int p = s.nx * s.ny;
  return {static_cast<void**>(w->Take(2 * (p - 1) * sizeof(void*))),
          static_cast<float*>(w->Take(p * SlotElements(s) * sizeof(float))),
          static_cast<double*>(w->Take(s.n * sizeof(double)))};
}

kreg_status ReferenceWorkspace(const kreg_config*, const kreg_args* args, const kreg_host*, size_t* bytes, char* msg,
                               size_t cap) {
  Shard s;
  if (kreg_status st = View(kReferenceName, args, &s, msg, cap); st != KREG_OK) return st;
  Carver w(nullptr);
  ReferenceLayout(s, &w);
  *bytes = w.used();
  return KREG_OK;
}

kreg_status ReferenceRun(const kreg_config*, const kreg_args* args, void*, void* workspace, size_t workspace_size,
                         const kreg_host* host, char* msg, size_t cap) {
  Shard s;
  Mesh mesh;
  if (kreg_status st = View(kReferenceName, args, &s, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = Place(s, args, host, &mesh, msg, cap); st != KREG_OK) return st;
  Carver w(workspace);
  const ReferenceScratch r = ReferenceLayout(s, &w);
  if (w.used() > workspace_size) {
    return Fail(KREG_RESOURCE_EXHAUSTED, msg, cap, "%s: workspace of %zu bytes, needs %llu", s.name, workspace_size,
                static_cast<unsigned long long>(w.used()));
  }
  if (s.ms == 0 || s.n == 0) return KREG_OK;
  if (s.k == 0) {
    ZeroOut(s);
    return KREG_OK;
  }
  // Every rank's x and w, in slot q for rank q.
  const kreg_comm* comm = mesh.world;
  const int p = comm->size, rank = comm->rank;
  const int64_t slot = SlotElements(s);
  float* own = r.slots + rank * slot;
  CopyRows(s.x, s.x_ld, own, s.ky, s.ms, s.ky);
  CopyRows(s.w, s.w_ld, own + s.ms * s.ky, s.n, s.kx, s.n);
  {
    Call c;
    c.name = s.name;
    c.comm = comm;
    Link link(c, r.requests, 2 * (p - 1), msg, cap);
    const size_t bytes = slot * sizeof(float);
    for (int q = 0, i = 0; q < p; ++q) {
      if (q == rank) continue;
      if (!link.Recv(i++, q, kTag, r.slots + q * slot, bytes) || !link.Send(i++, q, kTag, own, bytes)) break;
    }
    if (kreg_status st = link.Finish(); st != KREG_OK) return st;
  }
  // out[i] = sum over jy, then t, of x_(ix,jy)[i][t] * W^(jy)[jy*ky + t], in
  // double, where row g of W^(jy) is row g % kx of w_(g / kx, jy).
  const int ix = mesh.ix;
  for (int64_t i = 0; i < s.ms; ++i) {
    std::fill_n(r.row, s.n, 0.0);
    for (int jy = 0; jy < s.ny; ++jy) {
      const float* x = r.slots + (ix * s.ny + jy) * slot + i * s.ky;
      for (int64_t t = 0; t < s.ky; ++t) {
        const int64_t g = jy * s.ky + t;
        const float* wrow = r.slots + ((g / s.kx) * s.ny + jy) * slot + s.ms * s.ky + (g % s.kx) * s.n;
        const double a = x[t];
        for (int64_t c = 0; c < s.n; ++c) r.row[c] += a * wrow[c];
      }
    }
    float* o = s.out + i * s.out_ld;
    for (int64_t c = 0; c < s.n; ++c) o[c] = static_cast<float>(r.row[c]);
  }
  return KREG_OK;
}

// ---- plain and overlapped: the pieces ------------------------------------------

// A call of this plugin's allgather/ring or allreduce/ring (sum; chunks = 1)
// on `count` floats per rank over a communicator of `ranks` ranks:
// allgather's out is [ranks, count], allreduce's [count].
class RingCall {
 public:
  RingCall(const kreg_kernel& kernel, int ranks, int64_t count, const float* x, float* out)
      : kernel_(kernel), shape_{ranks, count}, dims_{count, ranks} {
    const bool gather = &kernel == &kAllgatherRingKernel;
    x_ = {.data = const_cast<float*>(x), .device = {kDLCPU, 0}, .ndim = 1, .dtype = kF32, .shape = &shape_[1]};
    out_ = {.data = out,
            .device = {kDLCPU, 0},
            .ndim = gather ? 2 : 1,
            .dtype = kF32,
            .shape = gather ? shape_ : &shape_[1]};
    args_ = {.struct_size = sizeof(kreg_args),
             .tensors = tensors_,
             .num_tensors = 2,
             .dims = dims_,
             .num_dims = 2,
             .attrs = &sum_,
             .num_attrs = gather ? 0u : 1u};
  }
  RingCall(const RingCall&) = delete;
  RingCall& operator=(const RingCall&) = delete;

  kreg_status Workspace(const char* name, const kreg_host* host, size_t* bytes, char* msg, size_t cap) const {
    *bytes = 0;
    if (kernel_.workspace_bytes == nullptr) return KREG_OK;
    const kreg_host sub = On(host, nullptr);
    char text[512] = "";
    return Prefixed(name, kernel_.workspace_bytes(&config_, &args_, &sub, bytes, text, sizeof text), text, msg, cap);
  }
  kreg_status Run(const char* name, const kreg_host* host, const kreg_comm* comm, void* workspace, size_t size,
                  char* msg, size_t cap) const {
    const kreg_host sub = On(host, comm);
    char text[512] = "";
    return Prefixed(name, kernel_.run(&config_, &args_, nullptr, workspace, size, &sub, text, sizeof text), text, msg,
                    cap);
  }

 private:
  // The host's table (as much of it as it has) with comm in place of its own.
  static kreg_host On(const kreg_host* host, const kreg_comm* comm) {
    kreg_host sub = {};
    std::memcpy(&sub, host, std::min(host->struct_size, sizeof sub));
    sub.struct_size = sizeof sub;
    sub.comm = comm;
    return sub;
  }
  static kreg_status Prefixed(const char* name, kreg_status s, const char* text, char* msg, size_t cap) {
    return s == KREG_OK ? s : Fail(s, msg, cap, "%s: %s", name, text);
  }

  const kreg_kernel& kernel_;
  int64_t shape_[2];
  int64_t dims_[2];
  const kreg_scalar sum_ = {.i = 0};
  DLTensor x_, out_;
  DLTensor* const tensors_[2] = {&x_, &out_};
  kreg_args args_;
  const kreg_param_value chunks_ = {.struct_size = sizeof(kreg_param_value), .value = 1};
  const kreg_param_value* const values_[1] = {&chunks_};
  const kreg_config config_ = {.struct_size = sizeof(kreg_config), .values = values_, .num_values = 1};
};

// The allreduce of out's [m_shard, n] partials along y.
RingCall AllreduceY(const Shard& s, const float* partial, float* out) {
  return RingCall(kAllreduceRingKernel, s.ny, s.ms * s.n, partial, out);
}

// Place, with axes x and y, and the host's composite ops.
kreg_status Begin(const Shard& s, const kreg_args* args, const kreg_host* host, Mesh* mesh, char* msg, size_t cap) {
  if (kreg_status st = Place(s, args, host, mesh, msg, cap); st != KREG_OK) return st;
  if (mesh->x == nullptr) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: needs a 2-D mesh with axes x and y (run with --mesh XxY)",
                s.name);
  }
  if (!KREG_HAS_FIELD(host, kreg_host, dispatch) || host->dispatch == nullptr) {
    return Fail(KREG_UNIMPLEMENTED, msg, cap, "%s: the host runs no composite ops", s.name);
  }
  return KREG_OK;
}

// to[m_shard, n] = (from, or 0 if NULL) + lhs[m_shard, kk] . rhs[kk, n] by the
// host's "gmm" with one group of all m_shard rows; lhs's rows are ld apart,
// rhs and the partials compact. REQUIRES: m_shard, kk, n > 0.
kreg_status Multiply(const Shard& s, const kreg_host* host, int32_t* group_sizes, const float* lhs, int64_t ld,
                     int64_t kk, const float* rhs, const float* from, float* to, char* msg, size_t cap) {
  int64_t lhs_shape[2] = {s.ms, kk}, lhs_strides[2] = {ld, 1}, rhs_shape[3] = {1, kk, s.n}, one[1] = {1},
          out_shape[2] = {s.ms, s.n};
  *group_sizes = static_cast<int32_t>(s.ms);
  auto tensor = [](const void* data, int ndim, int64_t* shape, int64_t* strides, DLDataType dtype) {
    return DLTensor{.data = const_cast<void*>(data),
                    .device = {kDLCPU, 0},
                    .ndim = ndim,
                    .dtype = dtype,
                    .shape = shape,
                    .strides = strides};
  };
  DLTensor lhs_t = tensor(lhs, 2, lhs_shape, lhs_strides, kF32), rhs_t = tensor(rhs, 3, rhs_shape, nullptr, kF32),
           sizes_t = tensor(group_sizes, 1, one, nullptr, kI32), out_t = tensor(to, 2, out_shape, nullptr, kF32),
           from_t = tensor(from, 2, out_shape, nullptr, kF32);
  DLTensor* const tensors[kGmmNumTensors] = {&lhs_t, &rhs_t, &sizes_t, &out_t, from != nullptr ? &from_t : nullptr};
  const int64_t dims[kGmmNumDims] = {s.ms, kk, s.n, 1, 1};
  const kreg_scalar attrs[kGmmNumAttrs] = {{.i = 0}, {.i = 0}, {.i = 0}};
  const kreg_args args = {.struct_size = sizeof(kreg_args),
                          .tensors = tensors,
                          .num_tensors = kGmmNumTensors,
                          .dims = dims,
                          .num_dims = kGmmNumDims,
                          .attrs = attrs,
                          .num_attrs = kGmmNumAttrs};
  char text[512] = "";
  const kreg_status st = host->dispatch(host->ctx, "gmm", &args, text, sizeof text);
  return st == KREG_OK ? st : Fail(st, msg, cap, "%s: gmm: %s", s.name, text);
}

// The workspace of plain and overlapped.
struct Scratch {
  int32_t* group_sizes;  // [1]: gmm's
  float* acc[2];         // [m_shard, n] each: partials (and out's stand-in when its rows are strided)
  float* w[2];           // plain: w[0] the gathered [k, n]; overlapped: the two shard buffers [kx, n]
  void* tail;            // allreduce/ring's workspace (plain: first, w packed when strided)
  size_t tail_bytes;
};

template <bool kOverlapped>
Scratch Layout(const Shard& s, size_t reduce_bytes, Carver* c) {
  Scratch r;
  const uint64_t partial = s.ms * s.n * sizeof(float), shard = s.kx * s.n * sizeof(float);
  r.group_sizes = static_cast<int32_t*>(c->Take(sizeof(int32_t)));
  for (float*& a : r.acc) a = static_cast<float*>(c->Take(partial));
  r.w[0] = static_cast<float*>(c->Take(kOverlapped ? shard : s.k * s.n * sizeof(float)));
  r.w[1] = kOverlapped ? static_cast<float*>(c->Take(shard)) : nullptr;
  r.tail_bytes = kOverlapped ? reduce_bytes : std::max<size_t>(shard, reduce_bytes);
  r.tail = c->Take(r.tail_bytes);
  return r;
}

template <bool kOverlapped, const char* kName>
kreg_status Workspace(const kreg_config*, const kreg_args* args, const kreg_host* host, size_t* bytes, char* msg,
                      size_t cap) {
  Shard s;
  size_t reduce_bytes;
  if (kreg_status st = View(kName, args, &s, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = AllreduceY(s, nullptr, nullptr).Workspace(kName, host, &reduce_bytes, msg, cap); st != KREG_OK) {
    return st;
  }
  Carver w(nullptr);
  Layout<kOverlapped>(s, reduce_bytes, &w);
  *bytes = w.used();
  return KREG_OK;
}

// What plain and overlapped start with: the view, the mesh, the workspace.
template <bool kOverlapped>
kreg_status Start(const char* name, const kreg_args* args, const kreg_host* host, void* workspace, size_t size,
                  Shard* s, Mesh* mesh, Scratch* r, char* msg, size_t cap) {
  size_t reduce_bytes;
  if (kreg_status st = View(name, args, s, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = Begin(*s, args, host, mesh, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = AllreduceY(*s, nullptr, nullptr).Workspace(name, host, &reduce_bytes, msg, cap); st != KREG_OK) {
    return st;
  }
  Carver w(workspace);
  *r = Layout<kOverlapped>(*s, reduce_bytes, &w);
  if (w.used() > size) {
    return Fail(KREG_RESOURCE_EXHAUSTED, msg, cap, "%s: workspace of %zu bytes, needs %llu", name, size,
                static_cast<unsigned long long>(w.used()));
  }
  return KREG_OK;
}

// out = the sum along y of the ranks' partials, through the other partial
// buffer `spare` when out's rows are strided.
kreg_status SumAlongY(const Shard& s, const kreg_host* host, const Mesh& mesh, const Scratch& r, const float* partial,
                      float* spare, char* msg, size_t cap) {
  const bool compact = s.out_ld == s.n || s.ms == 1;
  float* to = compact ? s.out : spare;
  if (kreg_status st = AllreduceY(s, partial, to).Run(s.name, host, mesh.y, r.tail, r.tail_bytes, msg, cap);
      st != KREG_OK) {
    return st;
  }
  if (!compact) CopyRows(to, s.n, s.out, s.out_ld, s.ms, s.n);
  return KREG_OK;
}

// ---- plain -----------------------------------------------------------------------

constexpr char kPlainName[] = "sharded_matmul/plain";

kreg_status PlainRun(const kreg_config*, const kreg_args* args, void*, void* workspace, size_t workspace_size,
                     const kreg_host* host, char* msg, size_t cap) {
  Shard s;
  Mesh mesh;
  Scratch r;
  if (kreg_status st = Start<false>(kPlainName, args, host, workspace, workspace_size, &s, &mesh, &r, msg, cap);
      st != KREG_OK) {
    return st;
  }
  if (s.ms == 0 || s.n == 0) return KREG_OK;
  if (s.k == 0) {
    ZeroOut(s);
    return KREG_OK;
  }
  // W^(iy) = the ranks' w along x, in r.w[0]; a strided w is packed first.
  const float* own = s.w;
  if (s.w_ld != s.n && s.kx > 1) {
    CopyRows(s.w, s.w_ld, static_cast<float*>(r.tail), s.n, s.kx, s.n);
    own = static_cast<const float*>(r.tail);
  }
  if (kreg_status st =
          RingCall(kAllgatherRingKernel, s.nx, s.kx * s.n, own, r.w[0]).Run(s.name, host, mesh.x, nullptr, 0, msg, cap);
      st != KREG_OK) {
    return st;
  }
  if (kreg_status st = Multiply(s, host, r.group_sizes, s.x, s.x_ld, s.ky, r.w[0] + mesh.iy * s.ky * s.n, nullptr,
                                r.acc[0], msg, cap);
      st != KREG_OK) {
    return st;
  }
  return SumAlongY(s, host, mesh, r, r.acc[0], r.acc[1], msg, cap);
}

// ---- overlapped ------------------------------------------------------------------

constexpr char kOverlappedName[] = "sharded_matmul/overlapped";

kreg_status OverlappedRun(const kreg_config*, const kreg_args* args, void*, void* workspace, size_t workspace_size,
                          const kreg_host* host, char* msg, size_t cap) {
  Shard s;
  Mesh mesh;
  Scratch r;
  if (kreg_status st = Start<true>(kOverlappedName, args, host, workspace, workspace_size, &s, &mesh, &r, msg, cap);
      st != KREG_OK) {
    return st;
  }
  if (s.ms == 0 || s.n == 0) return KREG_OK;
  if (s.k == 0) {
    ZeroOut(s);
    return KREG_OK;
  }
  // Step j holds shard ix - j (W_'s rows [jx * kx, (jx + 1) * kx)) in w[j % 2]
  // and passes it on to ix + 1 while shard ix - j - 1 arrives in the other.
  CopyRows(s.w, s.w_ld, r.w[0], s.n, s.kx, s.n);
  const int left = Mod(mesh.ix - 1, s.nx), right = Mod(mesh.ix + 1, s.nx);
  const size_t bytes = s.kx * s.n * sizeof(float);
  // This rank's columns of X_; the acc holding the partial, once there is one.
  const int64_t lo_k = mesh.iy * s.ky, hi_k = lo_k + s.ky;
  int partial = -1;
  Call c;
  c.name = s.name;
  c.comm = mesh.x;
  void* slots[2];
  Link link(c, slots, 2, msg, cap);
  for (int j = 0; j < s.nx; ++j) {
    const float* held = r.w[j % 2];
    if (j + 1 < s.nx &&
        !(link.Recv(0, left, kTag, r.w[(j + 1) % 2], bytes) && link.Send(1, right, kTag, held, bytes))) {
      break;
    }
    const int64_t jx = Mod(mesh.ix - j, s.nx), lo = std::max(jx * s.kx, lo_k), hi = std::min((jx + 1) * s.kx, hi_k);
    if (lo < hi) {
      const float* from = partial < 0 ? nullptr : r.acc[partial];
      const int to = partial < 0 ? 0 : 1 - partial;
      char text[512];
      if (kreg_status st = Multiply(s, host, r.group_sizes, s.x + (lo - lo_k), s.x_ld, hi - lo,
                                    held + (lo - jx * s.kx) * s.n, from, r.acc[to], text, sizeof text);
          st != KREG_OK) {
        link.Finish();  // the failure to report is the multiply's
        return Fail(st, msg, cap, "%s", text);
      }
      partial = to;
    }
    if (!link.Wait(0) || !link.Wait(1)) break;
  }
  if (kreg_status st = link.Finish(); st != KREG_OK) return st;
  if (partial < 0) {  // no shard met this rank's columns: not once k > 0, as the shards cover [0, k)
    std::fill_n(r.acc[0], s.ms * s.n, 0.0f);
    partial = 0;
  }
  return SumAlongY(s, host, mesh, r, r.acc[partial], r.acc[1 - partial], msg, cap);
}

}  // namespace

const kreg_op_desc kShardedMatmulOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "sharded_matmul",
    .doc = "X_ . W_ on an x by y mesh: X_ sharded over (x, y), W_ and out over x",
    .dims = kDims,
    .num_dims = kShardedNumDims,
    .tensors = kTensors,
    .num_tensors = kShardedNumTensors,
    .validate = Validate,
    .default_variants = kDefaultVariants,
    .num_default_variants = 1,
};

extern const kreg_kernel kShardedMatmulReferenceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "sharded_matmul",
    .variant = "reference",
    .version = 1,
    .doc = "everyone sends x and w to everyone, then sums in double: the oracle",
    .flags = KREG_KERNEL_REFERENCE,
    .workspace_bytes = ReferenceWorkspace,
    .run = ReferenceRun,
};

extern const kreg_kernel kShardedMatmulPlainKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "sharded_matmul",
    .variant = "plain",
    .version = 1,
    .doc = "all-gather w along x, one gmm, all-reduce along y (ring collectives)",
    .workspace_bytes = Workspace<false, kPlainName>,
    .run = PlainRun,
};

extern const kreg_kernel kShardedMatmulOverlappedKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "sharded_matmul",
    .variant = "overlapped",
    .version = 1,
    .doc = "w shards round the ring of x, each multiplied while the next is in flight, then all-reduce along y",
    .workspace_bytes = Workspace<true, kOverlappedName>,
    .run = OverlappedRun,
};

}  // namespace kreg::collectives
