// allgather/doubling, reduce_scatter/doubling and allreduce/doubling:
// log2(p) rounds of pairwise exchanges, at distances that double or halve.
//
// allgather       Bruck, for any p: a buffer of p blocks holds rank + i's x
//                 at block i; round k (d = 2^k) sends blocks [0, m) to rank
//                 - d and receives rank + d's into [d, d + m), m = min(d, p -
//                 d); at the end block i is copied to out[rank + i]. Round 0
//                 sends x itself, not a copy just written (which the peer
//                 would read out of this core's cache), and out[rank] is
//                 copied from x.
// Fold            (p not a power of two) with core = the largest power of two
//                 <= p, extra rank core + e hands its accumulators to rank e,
//                 which combines them after its own (lower rank first), takes
//                 part for both and at the end sends rank core + e its result.
// reduce_scatter  fold, then recursive halving among the core ranks over
//                 owners: core rank o owns block o and, if it has an extra,
//                 block o + core (laid out together, owner after owner). At
//                 d = core/2, ..., 1 a rank keeps the half of its owners on
//                 its side of bit d, sends the other half's partials to rank
//                 ^ d and combines the partner's partials of its own half
//                 (the rank with bit d clear on the left).
// allreduce       fold, then split=whole: recursive doubling (d = 1, ...,
//                 core/2) exchanging the whole vector, both ranks of a pair
//                 computing lower-rank OP higher-rank, so bit for bit the
//                 same (MPICH's); or split=halving (Rabenseifner): recursive
//                 halving over core chunks of the vector (chunk o: [count * o
//                 / core, count * (o + 1) / core), possibly empty), rank o
//                 stores its whole chunk o into out, then recursive doubling
//                 gathers out's chunks in the dtype.
// Partials travel as accumulators (common.h); results the extras get: as
// accumulators (reduce_scatter, stored by the extra) or as out (allreduce).
// A received partial is reduced as it is taken in (ReduceInto), straight
// from the sender's buffer where the communicator has irecv_consume: in
// place into the kept half (halving, fold), or into the scratch buffer not
// being sent (whole; its first round sends x itself for f32 and i32 on a
// power of two, its last stores straight into out).
#include <algorithm>
#include <bit>
#include <cstring>

#include "common.h"
#include "variants.h"

namespace kreg::collectives {
namespace {

enum { kTagMain = 0, kTagFoldIn = 1, kTagFoldOut = 2, kTagGather = 3 };

// The largest power of two <= p.
int CoreOf(int p) { return static_cast<int>(std::bit_floor(static_cast<unsigned>(p))); }

// Sends to `to` and receives from `from` at once, and waits for both. Slots 0, 1.
bool Exchange(Link& link, int tag, int to, const void* out, size_t out_bytes, int from, void* in, size_t in_bytes) {
  return link.Recv(0, from, tag, in, in_bytes) && link.Send(1, to, tag, out, out_bytes) && link.Wait(0) && link.Wait(1);
}

// Posts into slot 0 a receive from `peer` of n accumulators that `into`
// takes in: mine OP theirs (the lower rank's first) into dst, which may be
// mine; landing: where they land first without irecv_consume (not mine).
// *into must outlive the link's waits.
bool RecvReduce(Link& link, const Call& c, int peer, int tag, const void* mine, bool mine_acc, void* dst,
                bool narrow, void* landing, int64_t n, ReduceInto* into) {
  *into = {.dtype = c.dtype,
           .reduction = c.reduction,
           .own = mine,
           .dst = dst,
           .own_acc = mine_acc,
           .partial_first = peer < c.rank,
           .narrow = narrow};
  return link.RecvConsume(0, peer, tag, landing, n * kAccBytes, ReduceInto::Consume, into);
}

// The fold's first half over n accumulators at acc (recv: scratch of n).
bool FoldIn(Link& link, const Call& c, int core, void* acc, void* recv, int64_t n, ReduceInto* into) {
  if (c.rank >= core) return link.Send(0, c.rank - core, kTagFoldIn, acc, n * kAccBytes) && link.Wait(0);
  if (c.rank + core < c.p) {
    return RecvReduce(link, c, c.rank + core, kTagFoldIn, acc, true, acc, false, recv, n, into) && link.Wait(0);
  }
  return true;
}

// Recursive halving among the core ranks: owner o's partials are
// [off(o), off(o + 1)) of acc; at the end this rank's owner's are whole.
// The partner's half is reduced into this rank's in place as it is taken
// in (recv: where it lands first without irecv_consume, as large as half
// the owners' partials).
template <typename Offset>
bool Halve(Link& link, const Call& c, int core, Offset off, void* acc, void* recv, ReduceInto* into) {
  int lo = 0;
  for (int d = core / 2; d >= 1; d /= 2) {
    const bool lower = (c.rank & d) == 0;
    const int keep = lower ? lo : lo + d, give = lower ? lo + d : lo;
    const int64_t n = off(keep + d) - off(keep);
    void* mine = At(acc, off(keep), kAccBytes);
    if (!RecvReduce(link, c, c.rank ^ d, kTagMain, mine, true, mine, false, recv, n, into) ||
        !link.Send(1, c.rank ^ d, kTagMain, At(acc, off(give), kAccBytes), (off(give + d) - off(give)) * kAccBytes) ||
        !link.Wait(0) || !link.Wait(1)) {
      return false;
    }
    lo = keep;
  }
  return true;
}

// ---- allgather -----------------------------------------------------------------------

constexpr char kAllgatherName[] = "allgather/doubling";

// Bruck's buffer: p blocks of count elements.
void* AllgatherLayout(const Call& c, Carver* w) { return w->Take(c.p * c.Bytes(c.count)); }

kreg_status AllgatherWorkspace(const kreg_config*, const kreg_args* args, const kreg_host*, size_t* bytes, char* msg,
                               size_t cap) {
  return Measure(Op::kAllgather, kAllgatherName, args, bytes, msg, cap, AllgatherLayout);
}

kreg_status AllgatherRun(const kreg_config*, const kreg_args* args, void*, void* workspace, size_t workspace_size,
                         const kreg_host* host, char* msg, size_t cap) {
  Call c;
  void* buf;
  if (kreg_status s = Begin(Op::kAllgather, kAllgatherName, args, host, &c, msg, cap); s != KREG_OK) return s;
  if (kreg_status s = Carve(c, AllgatherLayout, workspace, workspace_size, &buf, msg, cap); s != KREG_OK) return s;
  if (c.count == 0) return KREG_OK;
  const size_t block = c.Bytes(c.count);
  void* slots[2];
  Link link(c, slots, 2, msg, cap);
  // Round d = 1 sends x itself (block 0 alone); x is copied into block 0,
  // which later rounds send, while it travels.
  for (int d = 1; d < c.p; d *= 2) {
    const size_t bytes = std::min(d, c.p - d) * block;
    const int to = Mod(c.rank - d, c.p), from = Mod(c.rank + d, c.p);
    const void* send = d == 1 ? c.x : buf;
    if (!link.Recv(0, from, kTagMain, At(buf, d, block), bytes) || !link.Send(1, to, kTagMain, send, bytes)) {
      return link.status();
    }
    if (d == 1 && c.p > 2) std::memcpy(buf, c.x, block);
    if (!link.Wait(0) || !link.Wait(1)) return link.status();
  }
  std::memcpy(c.OutRow(c.rank), c.x, block);
  for (int i = 1; i < c.p; ++i) std::memcpy(c.OutRow(Mod(c.rank + i, c.p)), At(buf, i, block), block);
  return link.Finish();
}

// ---- reduce_scatter ------------------------------------------------------------------

constexpr char kReduceScatterName[] = "reduce_scatter/doubling";

struct ReduceScatterScratch {
  void* acc;   // p blocks of count accumulators, owner after owner
  void* recv;  // as many
};

ReduceScatterScratch ReduceScatterLayout(const Call& c, Carver* w) {
  return {w->Take(c.p * c.count * kAccBytes), w->Take(c.p * c.count * kAccBytes)};
}

kreg_status ReduceScatterWorkspace(const kreg_config*, const kreg_args* args, const kreg_host*, size_t* bytes,
                                   char* msg, size_t cap) {
  return Measure(Op::kReduceScatter, kReduceScatterName, args, bytes, msg, cap, ReduceScatterLayout);
}

kreg_status ReduceScatterRun(const kreg_config*, const kreg_args* args, void*, void* workspace, size_t workspace_size,
                             const kreg_host* host, char* msg, size_t cap) {
  Call c;
  ReduceScatterScratch s;
  if (kreg_status st = Begin(Op::kReduceScatter, kReduceScatterName, args, host, &c, msg, cap); st != KREG_OK) {
    return st;
  }
  if (kreg_status st = Carve(c, ReduceScatterLayout, workspace, workspace_size, &s, msg, cap); st != KREG_OK) {
    return st;
  }
  if (c.count == 0) return KREG_OK;
  const int core = CoreOf(c.p), extra = c.p - core;
  // Owner o's blocks start at off(o): block o, then block o + core if o < extra.
  auto off = [&](int64_t o) { return (o + std::min<int64_t>(o, extra)) * c.count; };
  for (int b = 0; b < c.p; ++b) {
    const int64_t at = b < core ? off(b) : off(b - core) + c.count;
    Widen(c.dtype, c.XRow(b), At(s.acc, at, kAccBytes), c.count);
  }
  ReduceInto into;  // before the link: its last waits may still run it
  void* slots[2];
  Link link(c, slots, 2, msg, cap);
  if (!FoldIn(link, c, core, s.acc, s.recv, c.p * c.count, &into)) return link.status();
  if (c.rank >= core) {
    if (!link.Recv(0, c.rank - core, kTagFoldOut, s.recv, c.count * kAccBytes) || !link.Wait(0)) {
      return link.status();
    }
    Narrow(c.dtype, c.reduction, s.recv, c.out, c.count);
    return link.Finish();
  }
  if (!Halve(link, c, core, off, s.acc, s.recv, &into)) return link.status();
  Narrow(c.dtype, c.reduction, At(s.acc, off(c.rank), kAccBytes), c.out, c.count);
  if (c.rank < extra) {
    link.Send(0, c.rank + core, kTagFoldOut, At(s.acc, off(c.rank) + c.count, kAccBytes), c.count * kAccBytes);
  }
  return link.Finish();
}

// ---- allreduce -----------------------------------------------------------------------

constexpr char kAllreduceName[] = "allreduce/doubling";

constexpr int64_t kWhole = 0;  // split's choices: whole, halving
const char* const kSplitChoices[] = {"whole", "halving"};
const kreg_param_desc kSplitParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "split",
    .doc =
        "whole: recursive doubling of the whole vector; halving: Rabenseifner's halving reduce-scatter + "
        "doubling allgather",
    .kind = KREG_PARAM_CHOICE,
    .choices = kSplitChoices,
    .num_choices = 2,
    .default_value = kWhole,
};
const kreg_param_desc* const kAllreduceParams[] = {&kSplitParam};

kreg_status AllreduceCheck(const kreg_config* config, const kreg_args*, const kreg_host*, char* msg, size_t cap) {
  int64_t split = kWhole;
  return ReadParam(kAllreduceName, kSplitParam, config, 0, &split, msg, cap);
}

struct AllreduceScratch {
  void* acc;   // count accumulators
  void* recv;  // as many
};

AllreduceScratch AllreduceLayout(const Call& c, Carver* w) {
  return {w->Take(c.count * kAccBytes), w->Take(c.count * kAccBytes)};
}

kreg_status AllreduceWorkspace(const kreg_config*, const kreg_args* args, const kreg_host*, size_t* bytes, char* msg,
                               size_t cap) {
  return Measure(Op::kAllreduce, kAllreduceName, args, bytes, msg, cap, AllreduceLayout);
}

// Core ranks: `mine` holds the (folded) partials, accumulators in acc or
// x itself (mine_acc false: f32 and i32 on a power of two); out gets the
// result. Each round reduces the partner's partials as they are taken in
// into the scratch buffer that is not being sent, the last round straight
// into out.
bool Whole(Link& link, const Call& c, int core, const AllreduceScratch& s, const void* mine, bool mine_acc,
           ReduceInto* into) {
  const size_t bytes = c.count * kAccBytes;
  if (core == 1) {
    Narrow(c.dtype, c.reduction, mine, c.out, c.count);
    return true;
  }
  for (int d = 1; d < core; d *= 2) {
    void* next = mine == s.recv ? s.acc : s.recv;
    const bool last = 2 * d >= core;
    if (!RecvReduce(link, c, c.rank ^ d, kTagMain, mine, mine_acc, last ? c.out : next, last, next, c.count, into) ||
        !link.Send(1, c.rank ^ d, kTagMain, mine, bytes) || !link.Wait(0) || !link.Wait(1)) {
      return false;
    }
    mine = next;
    mine_acc = true;
  }
  return true;
}

bool Halving(Link& link, const Call& c, int core, const AllreduceScratch& s, ReduceInto* into) {
  auto off = [&](int64_t o) { return Split(c.count, core, o); };
  if (!Halve(link, c, core, off, s.acc, s.recv, into)) return false;
  Narrow(c.dtype, c.reduction, At(s.acc, off(c.rank), kAccBytes), At(c.out, off(c.rank), c.elem),
         off(c.rank + 1) - off(c.rank));
  // This rank has out's chunks [base, base + d); its partner those at base ^ d.
  for (int d = 1; d < core; d *= 2) {
    const int base = c.rank & ~(d - 1), other = base ^ d;
    if (!Exchange(link, kTagGather, c.rank ^ d, At(c.out, off(base), c.elem), c.Bytes(off(base + d) - off(base)),
                  c.rank ^ d, At(c.out, off(other), c.elem), c.Bytes(off(other + d) - off(other)))) {
      return false;
    }
  }
  return true;
}

kreg_status AllreduceRun(const kreg_config* config, const kreg_args* args, void*, void* workspace,
                         size_t workspace_size, const kreg_host* host, char* msg, size_t cap) {
  Call c;
  int64_t split = kWhole;
  AllreduceScratch s;
  if (kreg_status st = Begin(Op::kAllreduce, kAllreduceName, args, host, &c, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = ReadParam(kAllreduceName, kSplitParam, config, 0, &split, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = Carve(c, AllreduceLayout, workspace, workspace_size, &s, msg, cap); st != KREG_OK) return st;
  if (c.count == 0) return KREG_OK;
  const int core = CoreOf(c.p);
  ReduceInto into;  // before the link: its last waits may still run it
  void* slots[2];
  Link link(c, slots, 2, msg, cap);
  // Whole on a power of two sends x itself where its elements are their accumulators.
  const bool widen = split != kWhole || core != c.p || c.dtype == Dtype::kBf16;
  if (widen) Widen(c.dtype, c.x, s.acc, c.count);
  if (!FoldIn(link, c, core, s.acc, s.recv, c.count, &into)) return link.status();
  if (c.rank >= core) {
    link.Recv(0, c.rank - core, kTagFoldOut, c.out, c.Bytes(c.count));
    return link.Finish();
  }
  if (!(split == kWhole ? Whole(link, c, core, s, widen ? s.acc : c.x, widen, &into) : Halving(link, c, core, s, &into))) {
    return link.status();
  }
  if (c.rank + core < c.p) link.Send(0, c.rank + core, kTagFoldOut, c.out, c.Bytes(c.count));
  return link.Finish();
}

}  // namespace

extern const kreg_kernel kAllgatherDoublingKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allgather",
    .variant = "doubling",
    .version = 1,
    .doc = "Bruck: ceil(log2 p) rounds at doubling distances, any p, then one rotation into out",
    .workspace_bytes = AllgatherWorkspace,
    .run = AllgatherRun,
};

extern const kreg_kernel kReduceScatterDoublingKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "reduce_scatter",
    .variant = "doubling",
    .version = 1,
    .doc = "recursive halving over float/int partials; ranks past a power of two fold into a partner",
    .workspace_bytes = ReduceScatterWorkspace,
    .run = ReduceScatterRun,
};

extern const kreg_kernel kAllreduceDoublingKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allreduce",
    .variant = "doubling",
    .version = 1,
    .doc = "recursive doubling of the whole vector, or Rabenseifner's halving + doubling; fold past a power of two",
    .params = kAllreduceParams,
    .num_params = 1,
    .check = AllreduceCheck,
    .workspace_bytes = AllreduceWorkspace,
    .run = AllreduceRun,
};

}  // namespace kreg::collectives
