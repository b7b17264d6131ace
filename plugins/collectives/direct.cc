// allgather/direct, reduce_scatter/direct and allreduce/direct: every rank
// exchanges with every other in one step. Round i = 1..p-1 sends to rank + i
// and receives from rank - i; at most `outstanding` rounds are in flight
// (round i is posted once round i - outstanding has finished). A rank's
// round i meets its partners' round i, so the window cannot deadlock.
//
// allgather       x goes straight to every rank's out[rank].
// reduce_scatter  row q of x goes to rank q; the rows received (and the own
//                 one) are reduced in rank order 0..p-1 into accumulators,
//                 then stored into out.
// allreduce       x goes to every rank; each reduces all p in rank order
//                 0..p-1, the same operations on every rank, so the same
//                 bits.
#include <algorithm>
#include <cstring>

#include "common.h"
#include "variants.h"

namespace kreg::collectives {
namespace {

constexpr int kTag = 0;
constexpr int kMaxOutstanding = 8;

const int64_t kOutstandingValues[] = {1, 2, 4, kMaxOutstanding};
const kreg_param_desc kOutstandingParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "outstanding",
    .doc = "sends (and as many receives) in flight per rank at once",
    .kind = KREG_PARAM_INT,
    .values = kOutstandingValues,
    .num_values = sizeof kOutstandingValues / sizeof kOutstandingValues[0],
    .default_value = kMaxOutstanding,
};
const kreg_param_desc* const kParams[] = {&kOutstandingParam};

template <const char* kName>
kreg_status Check(const kreg_config* config, const kreg_args*, const kreg_host*, char* msg, size_t cap) {
  int64_t window = 1;
  return ReadParam(kName, kOutstandingParam, config, 0, &window, msg, cap);
}

// The rounds, messages of `bytes`: send_to(q) is what goes to rank q,
// recv_from(q) where rank q's lands. `local` (the rank's own part, copied)
// runs once the first window is posted, while those messages travel. Waits
// for everything.
template <typename SendTo, typename RecvFrom, typename Local>
kreg_status Exchange(const Call& c, int window, size_t bytes, SendTo send_to, RecvFrom recv_from, Local local,
                     char* msg, size_t cap) {
  void* slots[2 * kMaxOutstanding];
  Link link(c, slots, 2 * window, msg, cap);
  bool local_done = false;
  for (int i = 1; i < c.p; ++i) {
    const int k = (i - 1) % window;
    const int to = Mod(c.rank + i, c.p), from = Mod(c.rank - i, c.p);
    if (!link.Wait(k) || !link.Wait(window + k) || !link.Recv(window + k, from, kTag, recv_from(from), bytes) ||
        !link.Send(k, to, kTag, send_to(to), bytes)) {
      break;
    }
    if (i == std::min(window, c.p - 1)) {
      local();
      local_done = true;
    }
  }
  if (!local_done) local();
  return link.Finish();
}

// out = the reduction over q = 0..p-1 of the p slots of count elements.
void ReduceSlots(const Call& c, const void* slots, void* acc, void* out) {
  Widen(c.dtype, slots, acc, c.count);
  for (int q = 1; q < c.p; ++q) Accumulate(c.dtype, c.reduction, acc, At(slots, q * c.count, c.elem), c.count);
  Narrow(c.dtype, c.reduction, acc, out, c.count);
}

struct ReduceScratch {
  void* slots;  // p slots of count elements: rank q's data in slot q
  void* acc;    // count accumulators
};

ReduceScratch ReduceLayout(const Call& c, Carver* w) {
  return {w->Take(c.p * c.Bytes(c.count)), w->Take(c.count * kAccBytes)};
}

template <Op kOp, const char* kName>
kreg_status ReduceWorkspace(const kreg_config*, const kreg_args* args, const kreg_host*, size_t* bytes, char* msg,
                            size_t cap) {
  return Measure(kOp, kName, args, bytes, msg, cap, ReduceLayout);
}

// reduce_scatter and allreduce: slot q gets rank q's row `rank` of x
// (reduce_scatter) or its x (allreduce); then ReduceSlots.
template <Op kOp, const char* kName>
kreg_status ReduceRun(const kreg_config* config, const kreg_args* args, void*, void* workspace, size_t workspace_size,
                      const kreg_host* host, char* msg, size_t cap) {
  Call c;
  int64_t window = 1;
  ReduceScratch s;
  if (kreg_status st = Begin(kOp, kName, args, host, &c, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = ReadParam(kName, kOutstandingParam, config, 0, &window, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = Carve(c, ReduceLayout, workspace, workspace_size, &s, msg, cap); st != KREG_OK) return st;
  if (c.count == 0) return KREG_OK;
  const size_t bytes = c.Bytes(c.count);
  auto mine_for = [&](int q) { return kOp == Op::kReduceScatter ? c.XRow(q) : c.x; };
  if (kreg_status st = Exchange(
          c, static_cast<int>(window), bytes, mine_for, [&](int q) { return At(s.slots, q, bytes); },
          [&] { std::memcpy(At(s.slots, c.rank, bytes), mine_for(c.rank), bytes); }, msg, cap);
      st != KREG_OK) {
    return st;
  }
  ReduceSlots(c, s.slots, s.acc, c.out);
  return KREG_OK;
}

constexpr char kAllgatherName[] = "allgather/direct";
constexpr char kReduceScatterName[] = "reduce_scatter/direct";
constexpr char kAllreduceName[] = "allreduce/direct";

kreg_status AllgatherRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                         char* msg, size_t cap) {
  Call c;
  int64_t window = 1;
  if (kreg_status st = Begin(Op::kAllgather, kAllgatherName, args, host, &c, msg, cap); st != KREG_OK) return st;
  if (kreg_status st = ReadParam(kAllgatherName, kOutstandingParam, config, 0, &window, msg, cap); st != KREG_OK) {
    return st;
  }
  if (c.count == 0) return KREG_OK;
  return Exchange(
      c, static_cast<int>(window), c.Bytes(c.count), [&](int) { return c.x; }, [&](int q) { return c.OutRow(q); },
      [&] { std::memcpy(c.OutRow(c.rank), c.x, c.Bytes(c.count)); }, msg, cap);
}

}  // namespace

extern const kreg_kernel kAllgatherDirectKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allgather",
    .variant = "direct",
    .version = 1,
    .doc = "x sent straight to every rank's out, at most `outstanding` messages in flight",
    .params = kParams,
    .num_params = 1,
    .check = Check<kAllgatherName>,
    .run = AllgatherRun,
};

extern const kreg_kernel kReduceScatterDirectKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "reduce_scatter",
    .variant = "direct",
    .version = 1,
    .doc = "row q of x sent straight to rank q, at most `outstanding` in flight; reduced in rank order",
    .params = kParams,
    .num_params = 1,
    .check = Check<kReduceScatterName>,
    .workspace_bytes = ReduceWorkspace<Op::kReduceScatter, kReduceScatterName>,
    .run = ReduceRun<Op::kReduceScatter, kReduceScatterName>,
};

extern const kreg_kernel kAllreduceDirectKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allreduce",
    .variant = "direct",
    .version = 1,
    .doc = "x sent straight to every rank, at most `outstanding` in flight; each reduces all in rank order",
    .params = kParams,
    .num_params = 1,
    .check = Check<kAllreduceName>,
    .workspace_bytes = ReduceWorkspace<Op::kAllreduce, kAllreduceName>,
    .run = ReduceRun<Op::kAllreduce, kAllreduceName>,
};

}  // namespace kreg::collectives
