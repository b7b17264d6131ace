// The threads backend: n ranks as threads of one process (comm.h).
//
// One world holds every rank's unmatched sends and receives. A send or a
// receive that finds its match already posted (same source, destination
// and tag; first posted, first matched, as MPI orders them) copies the
// bytes itself, straight from the sender's buffer into the receiver's (or
// hands the sender's buffer to the receive's consume function, for
// irecv_consume), with the world's lock released; both requests are then
// done and their ranks woken. Otherwise it waits in the world's queue for
// its match. A waiting rank first yields its core for up to kSpin (a peer
// a step behind is usually about to post: this keeps small messages at
// microseconds, and hands the core to that peer where ranks outnumber
// cores), then sleeps on its own condition variable, waking every 50 ms to
// look at the cancel flag.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kreg/comm.h"

namespace kreg {
namespace {

using Clock = std::chrono::steady_clock;
using Consume = void (*)(void* arg, const void* data, size_t bytes);
constexpr auto kSpin = std::chrono::microseconds(50);

struct Request {
  bool send = false;
  int src = 0, dst = 0, tag = 0;  // src sends to dst
  const void* from = nullptr;     // sends
  void* to = nullptr;             // receives
  Consume consume = nullptr;      // irecv_consume's receives: takes the bytes instead of `to`
  void* arg = nullptr;            // consume's
  size_t bytes = 0;
  bool queued = false;   // waiting in the world's queue for its match
  bool copying = false;  // matched; a thread is copying its bytes
  bool done = false;
  kreg_status status = KREG_OK;
  std::string error;
};

// "a send of 16 bytes to rank 2 (tag 5)".
std::string Describe(const Request& r) {
  return r.send ? absl::StrFormat("a send of %d bytes to rank %d (tag %d)", r.bytes, r.dst, r.tag)
                : absl::StrFormat("a receive of %d bytes from rank %d (tag %d)", r.bytes, r.src, r.tag);
}

class World {
 public:
  World(int n, const CommOptions& options) : n_(n), options_(options), wake_(n), queued_(n) {}

  void Post(Request* r);
  kreg_status Test(int rank, Request* r, int* done, char* msg, size_t cap);
  kreg_status Wait(int rank, Request* r, char* msg, size_t cap);
  kreg_status Barrier(int rank, char* msg, size_t cap);
  void Abort(int rank, absl::string_view why, bool leaving);

 private:
  // Whether a wait (on a host message: `host`) must stop for a failure;
  // mu_ held.
  bool Failed(bool host) const { return failed_rank_ >= 0 && (!host || failed_leaving_); }
  // Why a wait of `rank` must stop now, or KREG_OK; mu_ held.
  kreg_status Stop(int rank, bool host, Clock::time_point deadline, absl::string_view awaiting,
                   std::string* why) const;
  // Yields the core while `ready()` is false, for at most kSpin; `lock`
  // is released meanwhile.
  template <typename Ready>
  static void Spin(std::unique_lock<std::mutex>& lock, Ready&& ready) {
    const Clock::time_point end = Clock::now() + kSpin;
    while (!ready() && Clock::now() < end) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }
  // Copies r's bytes to (or from) its match m, both claimed; takes and gives
  // back `lock`.
  void Copy(Request* r, Request* m, std::unique_lock<std::mutex>& lock);
  // Finishes r (done) and returns its status; mu_ held.
  static kreg_status Finish(Request* r, char* msg, size_t cap);
  Clock::time_point Deadline(bool host) const { return WaitDeadline(options_, host); }

  const int n_;
  const CommOptions options_;
  std::mutex mu_;
  std::vector<std::condition_variable> wake_;  // per rank
  std::vector<std::deque<Request*>> queued_;   // per destination: unmatched sends and receives, in order
  int failed_rank_ = -1;
  std::string failed_why_;
  bool failed_leaving_ = false;  // a failed rank has left (see Comm::Abort)
  int64_t barrier_generation_ = 0;
  int barrier_arrived_ = 0;
};

void World::Copy(Request* r, Request* m, std::unique_lock<std::mutex>& lock) {
  Request* send = r->send ? r : m;
  Request* recv = r->send ? m : r;
  if (send->bytes != recv->bytes) {
    const std::string why =
        absl::StrFormat("rank %d sent %d bytes (tag %d) to rank %d, which expected %d: the ranks disagree on "
                        "sizes or dtypes",
                        send->src, send->bytes, send->tag, send->dst, recv->bytes);
    for (Request* x : {send, recv}) {
      x->status = KREG_INVALID_ARGUMENT;
      x->error = why;
      x->done = true;
    }
  } else {
    send->copying = recv->copying = true;
    lock.unlock();
    if (recv->consume != nullptr) {
      recv->consume(recv->arg, send->from, send->bytes);
    } else if (send->bytes > 0) {
      std::memcpy(recv->to, send->from, send->bytes);
    }
    lock.lock();
    send->copying = recv->copying = false;
    send->done = recv->done = true;
  }
  wake_[send->src].notify_all();
  wake_[recv->dst].notify_all();
}

void World::Post(Request* r) {
  std::unique_lock<std::mutex> lock(mu_);
  std::deque<Request*>& q = queued_[r->dst];
  auto match = std::find_if(q.begin(), q.end(), [&](const Request* m) {
    return m->send != r->send && m->src == r->src && m->tag == r->tag;
  });
  if (match == q.end()) {
    r->queued = true;
    q.push_back(r);
    return;
  }
  Request* m = *match;
  q.erase(match);
  m->queued = false;
  Copy(r, m, lock);
}

kreg_status World::Stop(int rank, bool host, Clock::time_point deadline, absl::string_view awaiting,
                        std::string* why) const {
  if (Failed(host)) {
    *why = failed_rank_ == rank ? absl::StrCat("rank ", rank, " has failed: ", failed_why_)
                                : absl::StrCat("rank ", failed_rank_, " failed (", failed_why_, "); rank ", rank,
                                               " gave up ", awaiting);
    return KREG_UNAVAILABLE;
  }
  return StopWaiting(options_, host, rank, deadline, awaiting, why);
}

kreg_status World::Finish(Request* r, char* msg, size_t cap) {
  const kreg_status status = r->status;
  if (status != KREG_OK) std::snprintf(msg, cap, "%s", r->error.c_str());
  delete r;
  return status;
}

kreg_status World::Test(int rank, Request* r, int* done, char* msg, size_t cap) {
  std::unique_lock<std::mutex> lock(mu_);
  *done = r->done ? 1 : 0;
  if (r->done) return Finish(r, msg, cap);
  // A failed or cancelled world fails pending requests at once.
  if (Failed(r->tag < 0) || (options_.cancel_flag && options_.cancel_flag->load(std::memory_order_relaxed) != 0)) {
    lock.unlock();
    *done = 1;
    return Wait(rank, r, msg, cap);
  }
  return KREG_OK;
}

kreg_status World::Wait(int rank, Request* r, char* msg, size_t cap) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool host = r->tag < 0;
  Spin(lock, [&] { return r->done || Failed(host); });
  const Clock::time_point deadline = Deadline(host);
  while (!r->done) {
    std::string why;
    const kreg_status stop = Stop(rank, host, deadline, absl::StrCat("waiting for ", Describe(*r)), &why);
    if (stop != KREG_OK && !r->copying) {
      // Withdrawn: no one may touch its buffer after this returns.
      if (r->queued) {
        std::deque<Request*>& q = queued_[r->dst];
        q.erase(std::find(q.begin(), q.end(), r));
      }
      r->status = stop;
      r->error = why;
      break;
    }
    wake_[rank].wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
  }
  return Finish(r, msg, cap);
}

kreg_status World::Barrier(int rank, char* msg, size_t cap) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t generation = barrier_generation_;
  if (++barrier_arrived_ == n_) {
    barrier_arrived_ = 0;
    ++barrier_generation_;
    for (std::condition_variable& w : wake_) w.notify_all();
    return KREG_OK;
  }
  Spin(lock, [&] { return barrier_generation_ != generation || Failed(false); });
  const Clock::time_point deadline = Deadline(false);
  while (barrier_generation_ == generation) {
    std::string why;
    const kreg_status stop =
        Stop(rank, false, deadline, absl::StrFormat("in a barrier (%d of %d ranks arrived)", barrier_arrived_, n_),
             &why);
    if (stop != KREG_OK) {
      --barrier_arrived_;
      std::snprintf(msg, cap, "%s", why.c_str());
      return stop;
    }
    wake_[rank].wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
  }
  return KREG_OK;
}

void World::Abort(int rank, absl::string_view why, bool leaving) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_rank_ < 0) {
    failed_rank_ = rank;
    failed_why_ = std::string(why);
  }
  failed_leaving_ = failed_leaving_ || leaving;
  for (std::condition_variable& w : wake_) w.notify_all();
}

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<World> world, int rank, int size) : world_(std::move(world)) {
    abi_.struct_size = sizeof(kreg_comm);
    abi_.ctx = this;
    abi_.rank = rank;
    abi_.size = size;
    abi_.isend = &ThreadComm::Isend;
    abi_.irecv = &ThreadComm::Irecv;
    abi_.test = &ThreadComm::TestAbi;
    abi_.wait = &ThreadComm::WaitAbi;
    abi_.barrier = &ThreadComm::BarrierAbi;
    abi_.irecv_consume = &ThreadComm::IrecvConsume;
  }
  absl::string_view backend() const override { return "threads"; }
  void Abort(absl::string_view why, bool leaving = true) override {
    world_->Abort(rank(), why, leaving);
    for (auto& [name, sub] : axes_) sub->Abort(why, leaving);
  }
  void AddAxis(std::string name, std::unique_ptr<Comm> comm) {
    if (axes_.empty()) EnableAxes();
    axes_.emplace_back(std::move(name), std::move(comm));
  }

 private:
  static ThreadComm* Self(void* ctx) { return static_cast<ThreadComm*>(ctx); }
  // A receive takes its bytes into `to`, or hands them to consume(arg, ...).
  static kreg_status Post(void* ctx, bool send, int32_t peer, int32_t tag, const void* from, void* to, size_t bytes,
                          Consume consume, void* arg, void** request, char* msg, size_t cap) {
    ThreadComm* self = Self(ctx);
    if (request == nullptr) {
      std::snprintf(msg, cap, "%s: request is NULL", send ? "isend" : "irecv");
      return KREG_INVALID_ARGUMENT;
    }
    *request = nullptr;
    if (peer < 0 || peer >= self->size()) {
      std::snprintf(msg, cap, "%s: peer %d is not a rank of this communicator (size %d)", send ? "isend" : "irecv",
                    peer, self->size());
      return KREG_INVALID_ARGUMENT;
    }
    if (bytes > 0 && (send ? from == nullptr : to == nullptr && consume == nullptr)) {
      std::snprintf(msg, cap, "%s: NULL buffer for %zu bytes", send ? "isend" : "irecv", bytes);
      return KREG_INVALID_ARGUMENT;
    }
    auto* r = new Request;
    r->send = send;
    r->src = send ? self->rank() : peer;
    r->dst = send ? peer : self->rank();
    r->tag = tag;
    r->from = from;
    r->to = to;
    r->consume = consume;
    r->arg = arg;
    r->bytes = bytes;
    *request = r;
    self->world_->Post(r);
    return KREG_OK;
  }
  static kreg_status Isend(void* ctx, int32_t peer, int32_t tag, const void* buf, size_t bytes, void** request,
                           char* msg, size_t cap) {
    return Post(ctx, true, peer, tag, buf, nullptr, bytes, nullptr, nullptr, request, msg, cap);
  }
  static kreg_status Irecv(void* ctx, int32_t peer, int32_t tag, void* buf, size_t bytes, void** request, char* msg,
                           size_t cap) {
    return Post(ctx, false, peer, tag, nullptr, buf, bytes, nullptr, nullptr, request, msg, cap);
  }
  static kreg_status IrecvConsume(void* ctx, int32_t peer, int32_t tag, size_t bytes, Consume consume, void* arg,
                                  void** request, char* msg, size_t cap) {
    if (consume == nullptr) {
      if (request != nullptr) *request = nullptr;
      std::snprintf(msg, cap, "irecv_consume: consume is NULL");
      return KREG_INVALID_ARGUMENT;
    }
    return Post(ctx, false, peer, tag, nullptr, nullptr, bytes, consume, arg, request, msg, cap);
  }
  static kreg_status TestAbi(void* ctx, void* request, int* done, char* msg, size_t cap) {
    if (request == nullptr || done == nullptr) {
      std::snprintf(msg, cap, "test: request or done is NULL");
      return KREG_INVALID_ARGUMENT;
    }
    return Self(ctx)->world_->Test(Self(ctx)->rank(), static_cast<Request*>(request), done, msg, cap);
  }
  static kreg_status WaitAbi(void* ctx, void* request, char* msg, size_t cap) {
    if (request == nullptr) {
      std::snprintf(msg, cap, "wait: request is NULL");
      return KREG_INVALID_ARGUMENT;
    }
    return Self(ctx)->world_->Wait(Self(ctx)->rank(), static_cast<Request*>(request), msg, cap);
  }
  static kreg_status BarrierAbi(void* ctx, char* msg, size_t cap) {
    return Self(ctx)->world_->Barrier(Self(ctx)->rank(), msg, cap);
  }

  std::shared_ptr<World> world_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> ThreadComms(int n, const CommOptions& options) {
  auto world = std::make_shared<World>(n, options);
  std::vector<std::unique_ptr<ThreadComm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<ThreadComm>(world, r, n));
  if (MeshFits(options.mesh, n)) {
    // Per axis, one world per group of ranks sharing the other coordinates.
    for (size_t a = 0; a < options.mesh.size(); ++a) {
      for (int r = 0; r < n; ++r) {
        const std::vector<int> group = AxisGroup(options.mesh, a, r);
        if (group[0] != r) continue;  // made by the group's first rank
        auto axis_world = std::make_shared<World>(static_cast<int>(group.size()), options);
        for (size_t j = 0; j < group.size(); ++j) {
          auto member = std::make_unique<ThreadComm>(axis_world, static_cast<int>(j), static_cast<int>(group.size()));
          comms[group[j]]->AddAxis(options.mesh[a].first, std::move(member));
        }
      }
    }
  }
  return {std::make_move_iterator(comms.begin()), std::make_move_iterator(comms.end())};
}

}  // namespace kreg
