// allgather/ring, reduce_scatter/ring and allreduce/ring: p - 1 steps in
// which every rank sends one block to rank + 1 and receives one from rank - 1.
//
// allgather       step s sends out[rank - s] (step 0: x itself) and
//                 receives out[rank - s - 1], which it forwards at step s +
//                 1; out[rank] = x is copied once the ring is done. (A
//                 block just copied would be read by the peer out of this
//                 core's cache: over MPI's single copy the 2-rank
//                 all-gather took 2-4x as long from 256 KiB up.)
// reduce_scatter  block b (x's row b) starts at rank b + 1 and goes round:
//                 each rank adds its own x[b] after the partial it received,
//                 so block b is whole at rank b after p - 1 steps (summed in
//                 the order b + 1, b + 2, ..., b, mod p). Step s sends the
//                 partial of block rank - s - 1, receives that of block
//                 rank - s - 2. Partials travel as accumulators (common.h)
//                 and live in two buffers of count, used in turn; a
//                 received one is reduced with x[b] as it is taken in,
//                 straight from the sender's buffer where the communicator
//                 has irecv_consume (thread ranks), and the last step's
//                 result goes straight into out. Step 0 sends x[b] itself
//                 where its elements are their accumulators (f32, i32).
// allreduce       the same reduce-scatter over p chunks of the vector
//                 (chunk b: [count * b / p, count * (b + 1) / p), possibly
//                 empty), each partial kept at its chunk's place in one
//                 buffer of count; rank r's last step stores chunk r,
//                 whole, into out;
//                 then the allgather over out's chunks in the dtype. Every
//                 chunk is reduced once, so all ranks get the same bits.
//
// Parameter chunks cuts each step's block into that many pieces: piece j of
// step s + 1 is posted (its receive too) as soon as piece j of step s has
// arrived and been reduced and the send of piece j of step s has finished,
// so up to `chunks` pieces per direction are in flight while earlier ones
// are reduced. Pieces may be empty (zero-byte messages, on both sides).
#include <cstring>

#include "common.h"
#include "variants.h"

namespace kreg::collectives {
namespace {

constexpr int kMaxChunks = 8;
enum { kTagReduce = 0, kTagGather = 1 };

const int64_t kChunkValues[] = {1, 2, 4, kMaxChunks};
const kreg_param_desc kChunksParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "chunks",
    .doc = "pieces per step's block, pipelined: a piece is forwarded as soon as it has arrived",
    .kind = KREG_PARAM_INT,
    .values = kChunkValues,
    .num_values = sizeof kChunkValues / sizeof kChunkValues[0],
    .default_value = 1,
};
const kreg_param_desc* const kParams[] = {&kChunksParam};

// A message's bytes.
struct Bytes {
  void* p;
  size_t n;
};

// Where the ring's p blocks lie in a buffer, in elements: rows of count
// elements `ld` apart, or chunks of a vector of count elements.
struct Blocks {
  int64_t count;
  int p;
  bool rows;
  int64_t ld;
  int64_t Start(int64_t b) const { return rows ? b * ld : Split(count, p, b); }
  int64_t Len(int64_t b) const { return rows ? count : Split(count, p, b + 1) - Split(count, p, b); }
};

// Piece j of `pieces` of the n elements of `elem` bytes at p.
Bytes Piece(void* p, int64_t n, size_t elem, int pieces, int j) {
  const int64_t lo = Split(n, pieces, j), hi = Split(n, pieces, j + 1);
  return {At(p, lo, elem), static_cast<size_t>(hi - lo) * elem};
}

// Runs the p - 1 steps. plan.Send(s, j) is piece j of what step s sends to
// rank + 1; plan.PostRecv(link, slot, left, tag, s, j) posts its receive
// from rank - 1 (taken in by the time the slot is waited for). Slots [0, 2 *
// pieces).
template <typename Plan>
bool RunRing(Link& link, const Call& c, int tag, int pieces, Plan& plan) {
  const int left = Mod(c.rank - 1, c.p), right = Mod(c.rank + 1, c.p), steps = c.p - 1;
  auto post = [&](int s, int j) {
    const Bytes out = plan.Send(s, j);
    return plan.PostRecv(link, j, left, tag, s, j) && link.Send(pieces + j, right, tag, out.p, out.n);
  };
  for (int j = 0; j < pieces && steps > 0; ++j) {
    if (!post(0, j)) return false;
  }
  for (int s = 0; s < steps; ++s) {
    for (int j = 0; j < pieces; ++j) {
      // The send frees the buffer step s + 1 may receive into (reduce_scatter).
      if (!link.Wait(j) || !link.Wait(pieces + j) || (s + 1 < steps && !post(s + 1, j))) return false;
    }
  }
  return true;
}

// The allgather: blocks of `base` (in the dtype), the rank's own already in
// place or, where `own` is set, sent from there at step 0.
struct GatherPlan {
  const Call& c;
  Blocks blocks;
  void* base;
  int pieces;
  const void* own = nullptr;

  Bytes Block(int64_t b, int j) const {
    b = Mod(b, c.p);
    return Piece(At(base, blocks.Start(b), c.elem), blocks.Len(b), c.elem, pieces, j);
  }
  Bytes Send(int s, int j) const {
    if (s == 0 && own != nullptr) return Piece(const_cast<void*>(own), blocks.Len(c.rank), c.elem, pieces, j);
    return Block(c.rank - s, j);
  }
  bool PostRecv(Link& link, int slot, int peer, int tag, int s, int j) const {
    const Bytes in = Block(c.rank - s - 1, j);
    return link.Recv(slot, peer, tag, in.p, in.n);
  }
};

// The reduce-scatter: x's blocks `in`. The partial that arrives at step s
// (of block Block(s)) is taken in straight from the sender's buffer where
// the communicator can (ReduceInto): partial OP this rank's x block into
// Partial(s), its block's place in acc or with two_buffers one of two
// buffers of count; at the last step (block rank, whole) into `result`, in
// the dtype. Step 0 sends the own block rank - 1: x itself where its
// elements are their accumulators (f32, i32), else widened into
// Partial(-1).
struct ReducePlan {
  const Call& c;
  Blocks in;
  void* acc;
  bool two_buffers;
  int pieces;
  void* result;  // block rank's place in the output
  ReduceInto into[kMaxChunks] = {};  // piece j's, while its receive is posted

  int64_t Block(int s) const { return Mod(c.rank - s - 2, c.p); }  // received at step s
  void* Partial(int s) const { return At(acc, two_buffers ? ((s + 1) & 1) * c.count : in.Start(Block(s)), kAccBytes); }
  bool SendsX() const { return c.dtype != Dtype::kBf16; }
  Bytes Send(int s, int j) const {
    if (s == 0 && SendsX()) {
      return Piece(const_cast<void*>(At(c.x, in.Start(Block(-1)), c.elem)), in.Len(Block(-1)), c.elem, pieces, j);
    }
    return Piece(Partial(s - 1), in.Len(Block(s - 1)), kAccBytes, pieces, j);
  }
  bool PostRecv(Link& link, int slot, int peer, int tag, int s, int j) {
    const int64_t b = Block(s), lo = Split(in.Len(b), pieces, j);
    const Bytes landing = Piece(Partial(s), in.Len(b), kAccBytes, pieces, j);
    const bool last = s == c.p - 2;
    into[j] = {.dtype = c.dtype,
               .reduction = c.reduction,
               .own = At(c.x, in.Start(b) + lo, c.elem),
               .dst = last ? At(result, lo, c.elem) : landing.p,
               .narrow = last};
    return link.RecvConsume(slot, peer, tag, landing.p, landing.n, ReduceInto::Consume, &into[j]);
  }
  // Before step 0: the own block rank - 1 widened, where it is sent so; on
  // one rank, the result.
  void Start() const {
    if (c.p > 1 && SendsX()) return;
    Widen(c.dtype, At(c.x, in.Start(Block(-1)), c.elem), Partial(-1), in.Len(Block(-1)));
    if (c.p == 1) Narrow(c.dtype, c.reduction, Partial(-1), result, in.Len(0));
  }
};

template <const char* kName>
kreg_status Check(const kreg_config* config, const kreg_args*, const kreg_host*, char* msg, size_t cap) {
  int64_t chunks = 1;
  return ReadParam(kName, kChunksParam, config, 0, &chunks, msg, cap);
}

// ---- allgather -----------------------------------------------------------------------

constexpr char kAllgatherName[] = "allgather/ring";

kreg_status AllgatherRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                         char* msg, size_t cap) {
  Call c;
  int64_t chunks = 1;
  if (kreg_status s = Begin(Op::kAllgather, kAllgatherName, args, host, &c, msg, cap); s != KREG_OK) return s;
  if (kreg_status s = ReadParam(kAllgatherName, kChunksParam, config, 0, &chunks, msg, cap); s != KREG_OK) return s;
  if (c.count == 0) return KREG_OK;
  const int pieces = static_cast<int>(chunks);
  void* slots[2 * kMaxChunks];
  Link link(c, slots, 2 * pieces, msg, cap);
  GatherPlan gather{c, {c.count, c.p, true, c.out_ld}, c.out, pieces, c.x};
  RunRing(link, c, kTagGather, pieces, gather);
  const kreg_status s = link.Finish();
  std::memcpy(c.OutRow(c.rank), c.x, c.Bytes(c.count));
  return s;
}

// ---- reduce_scatter ------------------------------------------------------------------

constexpr char kReduceScatterName[] = "reduce_scatter/ring";

// Two buffers of count accumulators.
void* ReduceScatterLayout(const Call& c, Carver* w) { return w->Take(2 * c.count * kAccBytes); }

kreg_status ReduceScatterWorkspace(const kreg_config*, const kreg_args* args, const kreg_host*, size_t* bytes,
                                   char* msg, size_t cap) {
  return Measure(Op::kReduceScatter, kReduceScatterName, args, bytes, msg, cap, ReduceScatterLayout);
}

kreg_status ReduceScatterRun(const kreg_config* config, const kreg_args* args, void*, void* workspace,
                             size_t workspace_size, const kreg_host* host, char* msg, size_t cap) {
  Call c;
  int64_t chunks = 1;
  void* acc;
  if (kreg_status s = Begin(Op::kReduceScatter, kReduceScatterName, args, host, &c, msg, cap); s != KREG_OK) {
    return s;
  }
  if (kreg_status s = ReadParam(kReduceScatterName, kChunksParam, config, 0, &chunks, msg, cap); s != KREG_OK) return s;
  if (kreg_status s = Carve(c, ReduceScatterLayout, workspace, workspace_size, &acc, msg, cap); s != KREG_OK) {
    return s;
  }
  if (c.count == 0) return KREG_OK;
  const int pieces = static_cast<int>(chunks);
  // The plan first: the link's last waits may still run its consumes.
  ReducePlan plan{c, {c.count, c.p, true, c.x_ld}, acc, true, pieces, c.out};
  void* slots[2 * kMaxChunks];
  Link link(c, slots, 2 * pieces, msg, cap);
  plan.Start();
  RunRing(link, c, kTagReduce, pieces, plan);
  return link.Finish();
}

// ---- allreduce -----------------------------------------------------------------------

constexpr char kAllreduceName[] = "allreduce/ring";

// The partials: count accumulators.
void* AllreduceLayout(const Call& c, Carver* w) { return w->Take(c.count * kAccBytes); }

kreg_status AllreduceWorkspace(const kreg_config*, const kreg_args* args, const kreg_host*, size_t* bytes, char* msg,
                               size_t cap) {
  return Measure(Op::kAllreduce, kAllreduceName, args, bytes, msg, cap, AllreduceLayout);
}

kreg_status AllreduceRun(const kreg_config* config, const kreg_args* args, void*, void* workspace,
                         size_t workspace_size, const kreg_host* host, char* msg, size_t cap) {
  Call c;
  int64_t chunks = 1;
  void* acc;
  if (kreg_status s = Begin(Op::kAllreduce, kAllreduceName, args, host, &c, msg, cap); s != KREG_OK) return s;
  if (kreg_status s = ReadParam(kAllreduceName, kChunksParam, config, 0, &chunks, msg, cap); s != KREG_OK) return s;
  if (kreg_status s = Carve(c, AllreduceLayout, workspace, workspace_size, &acc, msg, cap); s != KREG_OK) return s;
  if (c.count == 0) return KREG_OK;
  const int pieces = static_cast<int>(chunks);
  const Blocks blocks = {c.count, c.p, false, 0};
  // The plan first: the link's last waits may still run its consumes.
  ReducePlan plan{c, blocks, acc, false, pieces, At(c.out, blocks.Start(c.rank), c.elem)};
  void* slots[2 * kMaxChunks];
  Link link(c, slots, 2 * pieces, msg, cap);
  plan.Start();
  if (!RunRing(link, c, kTagReduce, pieces, plan)) return link.status();
  GatherPlan gather{c, blocks, c.out, pieces};
  RunRing(link, c, kTagGather, pieces, gather);
  return link.Finish();
}

}  // namespace

extern const kreg_kernel kAllgatherRingKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allgather",
    .variant = "ring",
    .version = 1,
    .doc = "p - 1 steps passing blocks to rank + 1 in place in out, pipelined in chunks",
    .params = kParams,
    .num_params = 1,
    .check = Check<kAllgatherName>,
    .run = AllgatherRun,
};

extern const kreg_kernel kReduceScatterRingKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "reduce_scatter",
    .variant = "ring",
    .version = 1,
    .doc = "p - 1 steps passing float/int partials to rank + 1, each adding its own row, pipelined in chunks",
    .params = kParams,
    .num_params = 1,
    .check = Check<kReduceScatterName>,
    .workspace_bytes = ReduceScatterWorkspace,
    .run = ReduceScatterRun,
};

extern const kreg_kernel kAllreduceRingKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allreduce",
    .variant = "ring",
    .version = 1,
    .doc = "ring reduce-scatter over p chunks of the vector, then ring allgather of out, pipelined in chunks",
    .params = kParams,
    .num_params = 1,
    .check = Check<kAllreduceName>,
    .workspace_bytes = AllreduceWorkspace,
    .run = AllreduceRun,
};

}  // namespace kreg::collectives
