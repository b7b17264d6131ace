// Shared by the collectives plugin's ops and kernels: tensor/dim/attr indices
// (in the order op.cc declares them), the typed view of a call (Call), the
// element types and reductions (Widen, Accumulate, Combine, Narrow),
// workspace carving, the request bookkeeping over the host's kreg_comm
// (Link), parameter reading and one-line errors. Nothing here allocates or
// throws. Plugin-private; speaks only the ABI header.
//
// Accumulators. Partial reductions are kept and sent as 4-byte
// accumulators: float for f32 and bf16 (bf16 widens exactly and is rounded
// once, to nearest even, when the result is stored), uint32_t for i32 (sums
// wrap modulo 2^32; max compares as int32).
#ifndef KREG_PLUGINS_COLLECTIVES_COMMON_H_
#define KREG_PLUGINS_COLLECTIVES_COMMON_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kreg/collectives/layout.h"
#include "kreg/plugin_sdk.h"

namespace kreg::collectives {

using sdk::Bf16ToFloat;
using sdk::Fail;
using sdk::FloatToBf16;

// The ranks dim's largest value: keeps every workspace size (at most
// 2 * ranks * count * 4 bytes, count <= INT32_MAX) well inside int64.
constexpr int64_t kMaxRanks = int64_t{1} << 16;

enum class Op { kAllgather, kAllreduce, kReduceScatter };
enum class Dtype { kF32, kBf16, kI32 };
enum class Reduction { kSum = 0, kMax = 1 };

constexpr size_t kAccBytes = 4;  // one accumulator: float or uint32_t

// ---- Elements and reductions -----------------------------------------------------

inline void* At(void* p, int64_t i, size_t elem) { return static_cast<char*>(p) + i * static_cast<int64_t>(elem); }
inline const void* At(const void* p, int64_t i, size_t elem) {
  return static_cast<const char*>(p) + i * static_cast<int64_t>(elem);
}

// Element i of `parts` nearly equal consecutive parts of n elements starts
// at Split(n, parts, i); Split(n, parts, parts) = n. Parts may be empty.
inline int64_t Split(int64_t n, int64_t parts, int64_t i) { return n * i / parts; }

// a mod p in [0, p).
inline int Mod(int64_t a, int p) { return static_cast<int>((a % p + p) % p); }


// An element as stored (float, uint16_t bf16 bits, uint32_t i32 bits) as
// its accumulator.
inline float Wide(float v) { return v; }
inline float Wide(uint16_t bf16) { return Bf16ToFloat(bf16); }
inline uint32_t Wide(uint32_t v) { return v; }

constexpr float kQuietNan = std::bit_cast<float>(0x7fc00000u);  // canonical

struct Sum {
  float operator()(float a, float b) const { return a + b; }
  uint32_t operator()(uint32_t a, uint32_t b) const { return a + b; }
};

// max over a total order: NaN (either sign) above everything, as the
// canonical quiet NaN (0x7fc0 once stored as bf16); +0 > -0. So it is
// exact, associative and commutative.
struct Max {
  float operator()(float a, float b) const {
    if (std::isnan(a) || std::isnan(b)) return kQuietNan;
    if (a != b) return a > b ? a : b;
    // Equal: the same bits, or zeros, where +0 (0x0) & -0 (0x80000000) is +0.
    return std::bit_cast<float>(std::bit_cast<uint32_t>(a) & std::bit_cast<uint32_t>(b));
  }
  uint32_t operator()(uint32_t a, uint32_t b) const {
    return static_cast<int32_t>(a) > static_cast<int32_t>(b) ? a : b;
  }
};

// Calls fn(element, op): a value of the dtype's stored element type and the
// reduction's functor.
template <typename Fn>
void Dispatch(Dtype dtype, Reduction reduction, Fn&& fn) {
  const bool sum = reduction == Reduction::kSum;
  switch (dtype) {
    case Dtype::kF32:
      return sum ? fn(float{}, Sum{}) : fn(float{}, Max{});
    case Dtype::kBf16:
      return sum ? fn(uint16_t{}, Sum{}) : fn(uint16_t{}, Max{});
    case Dtype::kI32:
      return sum ? fn(uint32_t{}, Sum{}) : fn(uint32_t{}, Max{});
  }
}

// acc[i] = x[i] widened.
inline void Widen(Dtype dtype, const void* x, void* acc, int64_t n) {
  if (dtype != Dtype::kBf16) {
    std::memcpy(acc, x, n * kAccBytes);
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(x);
  float* dst = static_cast<float*>(acc);
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

// acc[i] = acc[i] OP x[i] widened: x's contribution after the partial.
inline void Accumulate(Dtype dtype, Reduction reduction, void* acc, const void* x, int64_t n) {
  Dispatch(dtype, reduction, [&](auto element, auto op) {
    using Element = decltype(element);
    using Acc = decltype(Wide(element));
    const Element* src = static_cast<const Element*>(x);
    Acc* dst = static_cast<Acc*>(acc);
    for (int64_t i = 0; i < n; ++i) dst[i] = op(dst[i], Wide(src[i]));
  });
}

// dst[i] = lo[i] OP hi[i] over accumulators (dst may be lo or hi). The
// lower ranks' partial is `lo`, so both ranks of a pair get the same bits.
inline void Combine(Dtype dtype, Reduction reduction, const void* lo, const void* hi, void* dst, int64_t n) {
  Dispatch(dtype, reduction, [&](auto element, auto op) {
    using Acc = decltype(Wide(element));
    const Acc* a = static_cast<const Acc*>(lo);
    const Acc* b = static_cast<const Acc*>(hi);
    Acc* d = static_cast<Acc*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = op(a[i], b[i]);
  });
}

// out[i] = acc[i] stored in the dtype (bf16: rounded to nearest even). Under
// max a NaN is stored canonical, as a reduction over one rank must be too.
inline void Narrow(Dtype dtype, Reduction reduction, const void* acc, void* out, int64_t n) {
  if (dtype == Dtype::kI32 || (dtype == Dtype::kF32 && reduction == Reduction::kSum)) {
    std::memcpy(out, acc, n * kAccBytes);
    return;
  }
  const bool max = reduction == Reduction::kMax;
  const float* src = static_cast<const float*>(acc);
  for (int64_t i = 0; i < n; ++i) {
    const float v = max && std::isnan(src[i]) ? kQuietNan : src[i];
    if (dtype == Dtype::kBf16) {
      static_cast<uint16_t*>(out)[i] = FloatToBf16(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

// A received partial taken in (a receive's consume function, Link's
// RecvConsume): dst = partial OP own element-wise, the partial first unless
// !partial_first (then own OP partial: the lower rank's first, as Combine).
// The partial is data's bytes / kAccBytes accumulators; own as many
// elements of the dtype (an input row, widened; bf16 only after the
// partial) or, with own_acc, accumulators; dst accumulators or, with
// narrow, the dtype (the result, stored as Narrow stores it). dst may be
// data (in place) or own.
struct ReduceInto {
  Dtype dtype = Dtype::kF32;
  Reduction reduction = Reduction::kSum;
  const void* own = nullptr;
  void* dst = nullptr;
  bool own_acc = false;
  bool partial_first = true;
  bool narrow = false;

  static void Consume(void* arg, const void* data, size_t bytes) {
    const ReduceInto& r = *static_cast<const ReduceInto*>(arg);
    const int64_t n = static_cast<int64_t>(bytes / kAccBytes);
    Dispatch(r.dtype, r.reduction, [&](auto element, auto op) {
      using Element = decltype(element);
      using Acc = decltype(Wide(element));
      const Acc* partial = static_cast<const Acc*>(data);
      if (r.own_acc) {
        r.Loop<Acc, Element>(op, partial, static_cast<const Acc*>(r.own), n);
      } else {
        r.Loop<Element, Element>(op, partial, static_cast<const Element*>(r.own), n);
      }
    });
  }

 private:
  template <typename Own, typename Element, typename Acc, typename OpFn>
  void Loop(OpFn op, const Acc* partial, const Own* mine, int64_t n) const {
    if constexpr (std::is_same_v<Own, Acc>) {
      // One loop over (first, second) whichever is first, so the two ranks
      // of a pair run the same instructions: a sum of two NaNs keeps one
      // operand's payload, by position.
      const Acc* a = partial_first ? partial : mine;
      const Acc* b = partial_first ? mine : partial;
      if constexpr (!std::is_same_v<Element, Acc>) {
        if (narrow) {  // bf16: rounded once
          Element* d = static_cast<Element*>(dst);
          for (int64_t i = 0; i < n; ++i) d[i] = FloatToBf16(op(a[i], b[i]));
          return;
        }
      }
      // f32 and i32 store as their accumulators (a max's NaN is canonical already).
      Acc* d = static_cast<Acc*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = op(a[i], b[i]);
    } else {
      // bf16 elements of the dtype: after the partial (partial_first).
      if (narrow) {
        Element* d = static_cast<Element*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = FloatToBf16(op(partial[i], Wide(mine[i])));
        return;
      }
      Acc* d = static_cast<Acc*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = op(partial[i], Wide(mine[i]));
    }
  }
};

// ---- The view of a call ------------------------------------------------------------

// One call's view of its kreg_args (shapes and pointers; no data is read)
// and, once Begin has run, this rank's communicator.
struct Call {
  const char* name = nullptr;  // the kernel, "allreduce/ring": prefixes every message
  Dtype dtype = Dtype::kF32;
  size_t elem = 4;  // bytes per element of x and out
  Reduction reduction = Reduction::kSum;
  int64_t count = 0;  // elements per rank (a row of a [ranks, count] tensor)
  int p = 1;          // ranks
  int rank = 0;
  const kreg_comm* comm = nullptr;
  const void* x = nullptr;  // [count], or reduce_scatter's [ranks, count]
  int64_t x_ld = 0;         // elements between rows of x
  void* out = nullptr;      // [count], or allgather's [ranks, count]
  int64_t out_ld = 0;       // elements between rows of out

  const void* XRow(int64_t q) const { return At(x, q * x_ld, elem); }
  void* OutRow(int64_t q) const { return At(out, q * out_ld, elem); }
  size_t Bytes(int64_t n) const { return static_cast<size_t>(n) * elem; }
};

inline void* Base(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }
inline int64_t RowStride(const DLTensor* t) { return t->strides != nullptr ? t->strides[0] : t->shape[1]; }

// Views `args` of op `op` for kernel `name`. Reads no data, so it serves
// shape-only args too. The host has checked shapes and dtypes; this guards.
inline kreg_status View(Op op, const char* name, const kreg_args* args, Call* c, char* msg, size_t cap) {
  const size_t num_attrs = op == Op::kAllgather ? 0 : kNumReduceAttrs;
  if (args == nullptr || args->struct_size < KREG_ARGS_MIN_SIZE || args->num_tensors < kNumTensors ||
      args->num_dims < kNumDims || args->num_attrs < num_attrs || args->tensors == nullptr || args->dims == nullptr ||
      (num_attrs > 0 && args->attrs == nullptr) || args->tensors[kX] == nullptr || args->tensors[kOut] == nullptr ||
      args->dims[kCount] < 0 || args->dims[kRanks] < 1 || args->dims[kRanks] > kMaxRanks) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: args are not those of the op", name);
  }
  const DLTensor* x = args->tensors[kX];
  DLTensor* out = args->tensors[kOut];
  const DLDataType t = x->dtype;
  if (t.code == kDLFloat && t.bits == 32) {
    c->dtype = Dtype::kF32;
  } else if (t.code == kDLBfloat && t.bits == 16) {
    c->dtype = Dtype::kBf16;
  } else if (t.code == kDLInt && t.bits == 32) {
    c->dtype = Dtype::kI32;
  } else {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: x is not f32, bf16 or i32", name);
  }
  c->name = name;
  c->elem = c->dtype == Dtype::kBf16 ? 2 : 4;
  c->reduction = num_attrs > 0 && args->attrs[kReduction].i != 0 ? Reduction::kMax : Reduction::kSum;
  c->count = args->dims[kCount];
  c->p = static_cast<int>(args->dims[kRanks]);
  c->x = Base(x);
  c->x_ld = op == Op::kReduceScatter ? RowStride(x) : 0;
  c->out = Base(out);
  c->out_ld = op == Op::kAllgather ? RowStride(out) : 0;
  return KREG_OK;
}

// What every run starts with: the view, this rank's communicator (its size
// must be the ranks dim) and CPU tensors.
inline kreg_status Begin(Op op, const char* name, const kreg_args* args, const kreg_host* host, Call* c, char* msg,
                         size_t cap) {
  if (kreg_status s = View(op, name, args, c, msg, cap); s != KREG_OK) return s;
  const kreg_comm* comm = host != nullptr && KREG_HAS_FIELD(host, kreg_host, comm) ? host->comm : nullptr;
  if (comm == nullptr || comm->struct_size < KREG_COMM_MIN_SIZE) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: needs a communicator (run with --ranks N)", name);
  }
  if (comm->size != c->p || comm->rank < 0 || comm->rank >= comm->size) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: ranks=%d, but this is rank %d of a communicator of %d", name,
                c->p, comm->rank, comm->size);
  }
  if (KREG_HAS_FIELD(host, kreg_host, device) && host->device != nullptr) {
    return Fail(KREG_UNIMPLEMENTED, msg, cap, "%s: CPU kernel: host has a device backend", name);
  }
  if (args->tensors[kX]->device.device_type != kDLCPU || args->tensors[kOut]->device.device_type != kDLCPU) {
    return Fail(KREG_UNIMPLEMENTED, msg, cap, "%s: CPU kernel: a tensor is not on the CPU", name);
  }
  c->comm = comm;
  c->rank = comm->rank;
  return KREG_OK;
}

// ---- Workspace -----------------------------------------------------------------------

// Carves a workspace into consecutive 64-byte aligned regions. Over a NULL
// base it only measures, so workspace_bytes and run share one layout
// function, layout(call, &carver).
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  void* Take(uint64_t bytes) {
    void* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (bytes + 63) / 64 * 64;
    return p;
  }
  uint64_t used() const { return used_; }

 private:
  char* base_;
  uint64_t used_ = 0;
};

// A kernel's workspace_bytes: what layout(call, &carver) takes.
template <typename Layout>
kreg_status Measure(Op op, const char* name, const kreg_args* args, size_t* bytes, char* msg, size_t cap,
                    Layout layout) {
  Call c;
  if (kreg_status s = View(op, name, args, &c, msg, cap); s != KREG_OK) return s;
  Carver w(nullptr);
  layout(c, &w);
  *bytes = w.used();
  return KREG_OK;
}

// Run's regions of the workspace, as layout laid them out for Measure.
template <typename Layout, typename Regions>
kreg_status Carve(const Call& c, Layout layout, void* workspace, size_t size, Regions* regions, char* msg, size_t cap) {
  Carver w(workspace);
  *regions = layout(c, &w);
  if (w.used() > size) {
    return Fail(KREG_RESOURCE_EXHAUSTED, msg, cap, "%s: workspace of %zu bytes, needs %llu", c.name, size,
                static_cast<unsigned long long>(w.used()));
  }
  return KREG_OK;
}

// ---- Requests ------------------------------------------------------------------------

// One run's point-to-point traffic over the host's communicator. Requests
// live in slots the caller provides (each one request or NULL). The first
// failure is kept: its status, and in msg the communicator's message
// prefixed with the kernel's name; after it every post is skipped and every
// call returns false. Finish() waits for every request still posted, and so
// does the destructor, so a kernel may return status() from anywhere.
class Link {
 public:
  // REQUIRES: c.comm is set (Begin); slots has num_slots entries.
  Link(const Call& c, void** slots, int num_slots, char* msg, size_t cap)
      : comm_(c.comm), name_(c.name), slots_(slots), num_slots_(num_slots), msg_(msg), cap_(cap) {
    std::fill(slots_, slots_ + num_slots_, nullptr);
  }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  ~Link() { Finish(); }

  static constexpr int kMaxConsumeSlots = 16;

  kreg_status status() const { return status_; }

  // Posts into empty slot i a send of `bytes` at buf to rank `peer`.
  bool Send(int i, int peer, int tag, const void* buf, size_t bytes) {
    if (status_ != KREG_OK) return false;
    text_[0] = '\0';
    return Check(comm_->isend(comm_->ctx, peer, tag, buf, bytes, &slots_[i], text_, sizeof text_), "isend", i);
  }
  // Posts into empty slot i a receive of `bytes` into buf from rank `peer`.
  bool Recv(int i, int peer, int tag, void* buf, size_t bytes) {
    if (status_ != KREG_OK) return false;
    text_[0] = '\0';
    return Check(comm_->irecv(comm_->ctx, peer, tag, buf, bytes, &slots_[i], text_, sizeof text_), "irecv", i);
  }
  // Posts into empty slot i (< kMaxConsumeSlots) a receive of `bytes` from
  // rank `peer` that consume(arg, data, bytes) takes in: straight from the
  // message where the communicator has irecv_consume, else in Wait(i), once
  // the message has landed in `landing` (bytes of the kernel's; consume
  // then reads it there, so it may write it in place).
  bool RecvConsume(int i, int peer, int tag, void* landing, size_t bytes, void (*consume)(void*, const void*, size_t),
                   void* arg) {
    if (status_ != KREG_OK) return false;
    text_[0] = '\0';
    if (i >= kMaxConsumeSlots) return Check(KREG_INTERNAL, "irecv_consume", i);
    if (KREG_HAS_FIELD(comm_, kreg_comm, irecv_consume) && comm_->irecv_consume != nullptr) {
      return Check(comm_->irecv_consume(comm_->ctx, peer, tag, bytes, consume, arg, &slots_[i], text_, sizeof text_),
                   "irecv_consume", i);
    }
    if (!Recv(i, peer, tag, landing, bytes)) return false;
    pending_[i] = {consume, arg, landing, bytes};
    pending_mask_ |= 1u << i;
    return true;
  }
  // Finishes slot i's request, if any (and a consume RecvConsume left to it).
  bool Wait(int i) {
    if (slots_[i] == nullptr) return status_ == KREG_OK;
    text_[0] = '\0';
    const bool ok = Check(comm_->wait(comm_->ctx, std::exchange(slots_[i], nullptr), text_, sizeof text_), "wait", -1);
    if (i < kMaxConsumeSlots && (pending_mask_ >> i & 1u) != 0) {
      pending_mask_ &= ~(1u << i);
      if (ok) pending_[i].consume(pending_[i].arg, pending_[i].landing, pending_[i].bytes);
    }
    return ok;
  }
  // Waits for every request still posted; the first failure's status.
  kreg_status Finish() {
    for (int i = 0; i < num_slots_; ++i) Wait(i);
    return status_;
  }

 private:
  // Keeps the first failure. A post that failed left no request in slot i.
  bool Check(kreg_status s, const char* call, int i) {
    if (s == KREG_OK) return status_ == KREG_OK;
    if (i >= 0) slots_[i] = nullptr;
    if (status_ == KREG_OK) {
      status_ = s;
      if (text_[0] != '\0') {
        std::snprintf(msg_, cap_, "%s: %s", name_, text_);
      } else {
        std::snprintf(msg_, cap_, "%s: %s failed with status %d", name_, call, static_cast<int>(s));
      }
    }
    return false;
  }

  const kreg_comm* comm_;
  const char* name_;
  void** slots_;
  int num_slots_;
  char* msg_;
  size_t cap_;
  kreg_status status_ = KREG_OK;
  char text_[512];
  // RecvConsume's receives that consume once waited for (no irecv_consume):
  // slot i's is pending_[i] while bit i of pending_mask_ is set (left
  // uninitialised otherwise: a small message's run is a microsecond).
  struct Pending {
    void (*consume)(void*, const void*, size_t);
    void* arg;
    void* landing;
    size_t bytes;
  };
  uint32_t pending_mask_ = 0;
  Pending pending_[kMaxConsumeSlots];
};

// ---- Parameters ----------------------------------------------------------------

// Parameter `index` of config, described by desc: one of desc's values (INT)
// or a choice index (CHOICE).
inline kreg_status ReadParam(const char* name, const kreg_param_desc& desc, const kreg_config* config, size_t index,
                             int64_t* value, char* msg, size_t cap) {
  if (config == nullptr || config->num_values <= index || config->values == nullptr ||
      config->values[index] == nullptr) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: no value for parameter %s", name, desc.name);
  }
  const int64_t v = config->values[index]->value;
  const bool legal = desc.kind == KREG_PARAM_CHOICE
                         ? v >= 0 && v < static_cast<int64_t>(desc.num_choices)
                         : std::find(desc.values, desc.values + desc.num_values, v) != desc.values + desc.num_values;
  if (!legal) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "%s: %s=%lld is not legal", name, desc.name,
                static_cast<long long>(v));
  }
  *value = v;
  return KREG_OK;
}

}  // namespace kreg::collectives

#endif  // KREG_PLUGINS_COLLECTIVES_COMMON_H_
