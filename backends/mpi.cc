// The mpi backend (comm.h): this process is one rank of an MPI job
// (OpenMPI, under mpirun). Built as a module, kreg_mpi.so, that the host
// loads only when asked for (LoadMpiComm), so kreg itself never links MPI.
//
// Messages between ranks of one node pass rings in shared memory
// (mpi_mail.h): a small one there alone, a larger one announced there and
// sent by MPI. Others are MPI_Isend / MPI_Irecv of bytes on a duplicate of
// MPI_COMM_WORLD whose errors return rather than abort. Kernel tags
// [0, kHostTagBase) map to themselves, host tags (negative) above them, and
// one tag carries a failing rank's reason to the others. Waits poll
// MPI_Test, spinning briefly and then sleeping (up to 1 ms a turn), so a
// waiting rank does not burn a core; they also look for a peer's failure
// notice, give up after the timeout and honour the cancel flag. While
// spinning they yield the core between polls only where this node runs
// more ranks than it has CPUs: on a core of its own a yield is a system
// call that only delays noticing the message.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kreg/comm.h"
#include "mpi_mail.h"

namespace kreg {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kHostTagBase = 16384;  // kernel tags are below it
constexpr int kFailureTag = 32000;   // a failing rank's reason
// Polling (yielding the core between polls where ranks share cores) before
// naps: long enough that a message of megabytes, whose fragments need this
// rank's progress, moves at full speed; ranks sharing a core still get it.
constexpr auto kSpin = std::chrono::milliseconds(2);
constexpr size_t kMaxFreeRequests = 64;

std::string Describe(const MpiRequest& r) {
  return r.send ? absl::StrFormat("a send of %d bytes to rank %d (tag %d)", r.bytes, r.peer, r.tag)
                : absl::StrFormat("a receive of %d bytes from rank %d (tag %d)", r.bytes, r.peer, r.tag);
}

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, len);
}

kreg_status Fail(char* msg, size_t cap, kreg_status status, const std::string& why) {
  std::snprintf(msg, cap, "%s", why.c_str());
  return status;
}

class MpiComm final : public Comm {
 public:
  static absl::StatusOr<std::unique_ptr<Comm>> Create(const CommOptions& options) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        return absl::UnavailableError("mpi: MPI_Init_thread failed");
      }
    }
    return Over(MPI_COMM_WORLD, options, !initialized);
  }

  // A communicator of its own over the ranks of `base` (collective), with
  // its mesh axes.
  static std::unique_ptr<Comm> Over(MPI_Comm base, const CommOptions& options, bool owns_mpi) {
    auto comm = std::unique_ptr<MpiComm>(new MpiComm(options, owns_mpi));
    MPI_Comm_dup(base, &comm->world_);
    MPI_Comm_set_errhandler(comm->world_, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    MPI_Comm_rank(comm->world_, &rank);
    MPI_Comm_size(comm->world_, &size);
    comm->abi_.rank = rank;
    comm->abi_.size = size;
    comm->mail_ = NodeMail::Create(comm->world_);
    // Nodes: the ranks sharing memory with each other count once.
    MPI_Comm local;
    int local_rank = 0;
    MPI_Comm_split_type(comm->world_, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank);
    int local_size = 1;
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    // More ranks on this node than CPUs (mpirun --oversubscribe): spinning
    // waits yield.
    const unsigned cpus = std::thread::hardware_concurrency();
    comm->yield_ = cpus == 0 || static_cast<unsigned>(local_size) > cpus;
    const int leader = local_rank == 0 ? 1 : 0;
    MPI_Allreduce(&leader, &comm->nodes_, 1, MPI_INT, MPI_SUM, comm->world_);
    if (MeshFits(options.mesh, size)) {
      comm->EnableAxes();
      for (size_t a = 0; a < options.mesh.size(); ++a) {
        const std::vector<int> group = AxisGroup(options.mesh, a, rank);
        const int key = static_cast<int>(std::find(group.begin(), group.end(), rank) - group.begin());
        auto sub = std::unique_ptr<MpiComm>(new MpiComm(options, false));
        MPI_Comm_split(comm->world_, group[0], key, &sub->world_);
        MPI_Comm_set_errhandler(sub->world_, MPI_ERRORS_RETURN);
        sub->abi_.rank = key;
        sub->abi_.size = static_cast<int>(group.size());
        sub->mail_ = NodeMail::Create(sub->world_);
        sub->parent_ = comm.get();
        sub->yield_ = comm->yield_;
        comm->axes_.emplace_back(options.mesh[a].first, std::move(sub));
      }
    }
    return comm;
  }

  ~MpiComm() override {
    axes_.clear();  // their communicators first
    for (MpiRequest* r : free_) delete r;
    // After a failure (this rank's, a peer's, a peer gone silent) nothing
    // collective is called: a stopped or hung peer would hold MPI_Finalize
    // forever. The process then exits (its error printed, exit 1) without
    // finalizing, and mpirun ends the whole job, the silent peer too.
    if (!failed_.empty()) return;
    MPI_Comm_free(&world_);
    if (owns_mpi_) MPI_Finalize();
  }

  absl::string_view backend() const override { return "mpi"; }
  int nodes() const override { return nodes_; }
  absl::StatusOr<std::unique_ptr<Comm>> Fresh() override { return Over(world_, options_, false); }

  // Tells every other rank why this one failed (their waits then fail at
  // once, axes' too); the notices are small, so they go out eagerly. A
  // notice is 'L' (the rank left) or 'S' (it stays for the host's
  // agreement), then the reason.
  void Abort(absl::string_view why, bool leaving = true) override {
    if (parent_ != nullptr) return parent_->Abort(why, leaving);
    const bool was_leaving = failed_leaving_;
    if (failed_.empty()) {
      failed_ = absl::StrCat("rank ", rank(), " failed (", why, ")");
      failed_.resize(std::min<size_t>(failed_.size(), 1000));
    }
    failed_leaving_ = failed_leaving_ || leaving;
    if (own_notice_ && was_leaving == failed_leaving_) return;  // the others know already
    own_notice_ = true;
    const std::string& notice = notices_.emplace_back(absl::StrCat(failed_leaving_ ? "L" : "S", failed_));
    for (int q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      MPI_Request r;
      MPI_Isend(notice.data(), static_cast<int>(notice.size()), MPI_CHAR, q, kFailureTag, world_, &r);
      MPI_Request_free(&r);
    }
  }

 private:
  MpiComm(const CommOptions& options, bool owns_mpi) : options_(options), owns_mpi_(owns_mpi) {
    abi_.struct_size = sizeof(kreg_comm);
    abi_.ctx = this;
    abi_.isend = &MpiComm::Isend;
    abi_.irecv = &MpiComm::Irecv;
    abi_.test = &MpiComm::TestAbi;
    abi_.wait = &MpiComm::WaitAbi;
    abi_.barrier = &MpiComm::BarrierAbi;
  }
  static MpiComm* Self(void* ctx) { return static_cast<MpiComm*>(ctx); }

  // Whether a wait (on a host message: `host`) must stop for a failure,
  // this rank's or a peer's (on this communicator, or for an axis on the
  // whole mesh's), and why. Reads the notices that came.
  bool Failed(bool host, std::string* why) {
    if (parent_ != nullptr && parent_->Failed(host, why)) return true;
    for (int flag = 1; flag && !failed_leaving_;) {
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, world_, &flag, &status);
      if (!flag) break;
      int len = 0;
      MPI_Get_count(&status, MPI_CHAR, &len);
      std::string text(len, '\0');
      MPI_Recv(text.data(), len, MPI_CHAR, status.MPI_SOURCE, kFailureTag, world_, MPI_STATUS_IGNORE);
      if (text.empty()) continue;
      if (failed_.empty()) failed_ = text.substr(1);  // every later wait fails too
      failed_leaving_ = failed_leaving_ || text[0] == 'L';
    }
    if (failed_.empty() || (host && !failed_leaving_)) return false;
    *why = failed_;
    return true;
  }

  static kreg_status Post(void* ctx, bool send, int32_t peer, int32_t tag, const void* buf, size_t bytes,
                          void** request, char* msg, size_t cap) {
    MpiComm* self = Self(ctx);
    const char* what = send ? "isend" : "irecv";
    if (request == nullptr) return Fail(msg, cap, KREG_INVALID_ARGUMENT, absl::StrCat(what, ": request is NULL"));
    *request = nullptr;
    if (peer < 0 || peer >= self->size()) {
      return Fail(msg, cap, KREG_INVALID_ARGUMENT,
                  absl::StrFormat("%s: peer %d is not a rank of this communicator (size %d)", what, peer,
                                  self->size()));
    }
    if (tag >= kHostTagBase || tag < -(kFailureTag - kHostTagBase - 1)) {
      return Fail(msg, cap, KREG_INVALID_ARGUMENT,
                  absl::StrFormat("%s: tag %d is outside [0, %d)", what, tag, kHostTagBase));
    }
    MpiRequest* r = self->NewRequest();
    *r = MpiRequest{};
    r->send = send;
    r->peer = peer;
    r->tag = tag;
    r->mpi_tag = tag >= 0 ? tag : kHostTagBase - tag;
    r->bytes = bytes;
    r->buf = const_cast<void*>(buf);
    NodeMail* mail = self->mail_ != nullptr && self->mail_->Carries(peer) ? self->mail_.get() : nullptr;
    // Through the node's rings: a receive always (its message or its
    // envelope comes there), a send unless it is larger than a slot.
    if (mail != nullptr && (!send || bytes <= mail->max_inline())) {
      send ? mail->Send(r) : mail->Receive(r);
      *request = r;
      return KREG_OK;
    }
    if (const int code = PostMpi(send, r->buf, bytes, peer, r->mpi_tag, self->world_, &r->request);
        code != MPI_SUCCESS) {
      self->FreeRequest(r);
      return Fail(msg, cap, KREG_INTERNAL, absl::StrCat(what, ": ", MpiError(code)));
    }
    if (mail != nullptr) mail->Send(r);  // its envelope
    *request = r;
    return KREG_OK;
  }

  static kreg_status Isend(void* ctx, int32_t peer, int32_t tag, const void* buf, size_t bytes, void** request,
                           char* msg, size_t cap) {
    return Post(ctx, true, peer, tag, buf, bytes, request, msg, cap);
  }
  static kreg_status Irecv(void* ctx, int32_t peer, int32_t tag, void* buf, size_t bytes, void** request, char* msg,
                           size_t cap) {
    return Post(ctx, false, peer, tag, buf, bytes, request, msg, cap);
  }

  // Requests come from a free list: a small message's wait is a
  // microsecond, where malloc and free would show.
  MpiRequest* NewRequest() {
    if (free_.empty()) return new MpiRequest;
    MpiRequest* r = free_.back();
    free_.pop_back();
    return r;
  }
  void FreeRequest(MpiRequest* r) {
    r->drain.reset();
    if (free_.size() < kMaxFreeRequests) {
      free_.push_back(r);
    } else {
      delete r;
    }
  }

  // One look at r (the node's rings first): done (and r freed, its status
  // returned) or not.
  kreg_status Poll(MpiRequest* r, bool* done, char* msg, size_t cap) {
    if (mail_ != nullptr) mail_->Progress();
    if (r->mail == MpiRequest::Mail::kQueued || r->mail == MpiRequest::Mail::kPosted) {
      *done = false;
      return KREG_OK;
    }
    int flag = 1, code = r->code;
    MPI_Status status;
    if (r->mail == MpiRequest::Mail::kNone) code = MPI_Test(&r->request, &flag, &status);
    *done = flag != 0 || code != MPI_SUCCESS;
    if (!*done) return KREG_OK;
    kreg_status result = KREG_OK;
    std::string why;
    int cls = 0;
    if (code != MPI_SUCCESS) MPI_Error_class(code, &cls);
    if (r->matched && r->sent > r->bytes) cls = MPI_ERR_TRUNCATE;
    if (code != MPI_SUCCESS || cls == MPI_ERR_TRUNCATE) {
      result = cls == MPI_ERR_TRUNCATE ? KREG_INVALID_ARGUMENT : KREG_INTERNAL;
      why = cls == MPI_ERR_TRUNCATE
                ? absl::StrFormat("rank %d sent more than the %d bytes rank %d expected (tag %d): the ranks disagree "
                                  "on sizes or dtypes",
                                  r->peer, r->bytes, rank(), r->tag)
                : absl::StrCat(Describe(*r), ": ", MpiError(code));
    } else if (!r->send) {
      MPI_Count got = static_cast<MPI_Count>(r->sent);
      if (!r->matched) MPI_Get_elements_x(&status, MPI_BYTE, &got);
      if (static_cast<size_t>(got) != r->bytes) {
        result = KREG_INVALID_ARGUMENT;
        why = absl::StrFormat("rank %d sent %d bytes (tag %d) to rank %d, which expected %d: the ranks disagree on "
                              "sizes or dtypes",
                              r->peer, got, r->tag, rank(), r->bytes);
      }
    }
    FreeRequest(r);
    return result == KREG_OK ? KREG_OK : Fail(msg, cap, result, why);
  }

  // Why a wait (on a host message: `host`) must stop now (KREG_OK: it need
  // not).
  kreg_status Stop(bool host, Clock::time_point deadline, absl::string_view awaiting, std::string* why) {
    if (Failed(host, why)) {
      *why = absl::StrCat(*why, "; rank ", rank(), " gave up ", awaiting);
      return KREG_UNAVAILABLE;
    }
    return StopWaiting(options_, host, rank(), deadline, awaiting, why);
  }

  // Polls until `poll` says done: 64 times in a tight loop (a small
  // message's latency: no clock read, no yield), then for kSpin (yielding
  // between polls where ranks share cores), then with naps growing to
  // 1 ms. Failure notices, the cancel flag and the deadline (counted from
  // the end of the tight loop) are looked at every 64 turns.
  // `awaiting()` describes the wait, for the message. Giving up withdraws
  // `cancel` (a point-to-point request) unless it is NULL.
  template <typename PollFn, typename Awaiting>
  kreg_status Await(PollFn&& poll, bool host, Awaiting&& awaiting, MpiRequest* cancel, char* msg, size_t cap) {
    Clock::time_point start, deadline;  // read once the tight loop is over
    std::chrono::microseconds nap(0);
    bool napping = false;
    for (int turn = 0;; ++turn) {
      bool done = false;
      const kreg_status s = poll(&done);
      if (done) return s;
      if (turn < 63) continue;
      if (turn == 63) {
        start = Clock::now();
        deadline = WaitDeadline(options_, host);
      }
      if (yield_ && turn >= 64 && !napping) std::this_thread::yield();
      if (turn % 64 != 63 && !napping) continue;
      std::string why;
      if (const kreg_status stop = Stop(host, deadline, awaiting(), &why); stop != KREG_OK) {
        if (cancel != nullptr) Withdraw(cancel);
        return Fail(msg, cap, stop, why);
      }
      napping = napping || Clock::now() - start > kSpin;
      if (napping) {
        nap = std::min(std::chrono::microseconds(1000), nap + std::chrono::microseconds(10));
        std::this_thread::sleep_for(nap);
      }
    }
  }

  // Forgets a request given up on: out of the rings' lists, MPI's cancelled.
  void Withdraw(MpiRequest* r) {
    if (r->mail == MpiRequest::Mail::kQueued || r->mail == MpiRequest::Mail::kPosted) mail_->Withdraw(r);
    if (r->request != MPI_REQUEST_NULL) {
      MPI_Cancel(&r->request);
      MPI_Request_free(&r->request);
    }
  }

  static kreg_status TestAbi(void* ctx, void* request, int* done, char* msg, size_t cap) {
    if (request == nullptr || done == nullptr) {
      return Fail(msg, cap, KREG_INVALID_ARGUMENT, "test: request or done is NULL");
    }
    MpiComm* self = Self(ctx);
    auto* r = static_cast<MpiRequest*>(request);
    bool finished = false;
    const kreg_status s = self->Poll(r, &finished, msg, cap);
    *done = finished ? 1 : 0;
    if (finished) return s;
    std::string why;
    if (self->Failed(r->tag < 0, &why)) {  // finish it: a failed world fails pending requests at once
      *done = 1;
      return WaitAbi(ctx, request, msg, cap);
    }
    return KREG_OK;
  }

  static kreg_status WaitAbi(void* ctx, void* request, char* msg, size_t cap) {
    if (request == nullptr) return Fail(msg, cap, KREG_INVALID_ARGUMENT, "wait: request is NULL");
    MpiComm* self = Self(ctx);
    auto* r = static_cast<MpiRequest*>(request);
    const MpiRequest described = *r;  // r is deleted once done
    auto awaiting = [&] { return absl::StrCat("waiting for ", Describe(described)); };
    bool deleted = false;
    const kreg_status s = self->Await(
        [&](bool* done) {
          const kreg_status p = self->Poll(r, done, msg, cap);
          deleted = *done;
          return p;
        },
        described.tag < 0, awaiting, r, msg, cap);
    if (!deleted) self->FreeRequest(r);
    return s;
  }

  static kreg_status BarrierAbi(void* ctx, char* msg, size_t cap) {
    MpiComm* self = Self(ctx);
    MPI_Request request;
    MPI_Ibarrier(self->world_, &request);
    return self->Await(
        [&](bool* done) {
          if (self->mail_ != nullptr) self->mail_->Progress();  // a peer may await this rank's sends
          int flag = 0;
          MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
          *done = flag != 0;
          return KREG_OK;
        },
        /*host=*/false,
        // A collective request cannot be cancelled: one given up on is left to MPI_Finalize.
        [] { return std::string("in a barrier"); }, nullptr, msg, cap);
  }

  const CommOptions options_;
  const bool owns_mpi_;
  MPI_Comm world_ = MPI_COMM_NULL;
  std::string failed_;            // set once this rank or a peer failed
  bool failed_leaving_ = false;   // a failed rank has left (see Comm::Abort)
  bool own_notice_ = false;       // this rank has sent its notices
  std::deque<std::string> notices_;  // sent (their buffers outlive the sends)
  std::vector<MpiRequest*> free_;    // finished requests, for reuse
  std::unique_ptr<NodeMail> mail_;  // messages to the ranks of this node
  MpiComm* parent_ = nullptr;  // an axis communicator's whole mesh
  int nodes_ = 1;                // the world's, as counted in Over
  bool yield_ = true;            // spinning waits yield (ranks share cores)
};

}  // namespace
}  // namespace kreg

// The module's entry point (LoadMpiComm).
extern "C" __attribute__((visibility("default"))) kreg::Comm* kreg_mpi_comm_v1(const kreg::CommOptions* options,
                                                                                 char* msg, size_t cap) {
  absl::StatusOr<std::unique_ptr<kreg::Comm>> comm = kreg::MpiComm::Create(*options);
  if (!comm.ok()) {
    std::snprintf(msg, cap, "%s", std::string(comm.status().message()).c_str());
    return nullptr;
  }
  return comm->release();
}
