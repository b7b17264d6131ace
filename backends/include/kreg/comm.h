// Communicators: what collective kernels exchange data through (kreg_comm
// in the plugin ABI), seen from the host.
//
// A Comm is one rank's communicator. Its abi() table is what a kernel gets
// in kreg_host.comm; the host's own collectives (Barrier, AllMax), used to
// time and check a collective run on every rank at once, go through the
// same table on negative tags, so they work over any backend.
//
// Backends:
//   threads  ThreadComms(n): n ranks as threads of one process, exchanging
//            through shared memory (a receive copies straight from the
//            sender's buffer; irecv_consume hands the sender's buffer to
//            the kernel's function, which reduces straight from it). A
//            waiting rank yields its core briefly, then sleeps on a
//            condition variable.
//   mpi      LoadMpiComm(): this process is one rank of an MPI job (run
//            under mpirun). The backend is a module, kreg_mpi.so, loaded at
//            run time and built wherever MPI is found, so kreg never links
//            MPI itself. No irecv_consume (kernels receive, then
//            consume). A waiting rank polls, yielding its core between
//            polls only where its node runs more ranks than CPUs, then
//            sleeps. A rank that fails tells the others (their waits
//            fail at once); a rank that dies ends the whole job (mpirun
//            kills it).
//
// Failures: a wait gives up after the timeout (KREG_UNAVAILABLE naming the
// peer and the message awaited), when the cancel flag is set
// (KREG_CANCELLED), or at once when a rank has called Abort (every rank's
// waits then fail, naming the rank and its reason; the host's own messages
// go on while the failed rank stays, see Abort). A world that has seen an
// abort stays failed: make a fresh one.
//
// Thread-safety: each Comm is used by one thread at a time (its rank's);
// distinct ranks' Comms are used concurrently.
#ifndef KREG_BACKENDS_COMM_H_
#define KREG_BACKENDS_COMM_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kreg/machine.h"  // BackendModulePaths
#include "kreg/op.h"
#include "kreg/plugin_abi.h"

namespace kreg {

struct CommOptions {
  double timeout_seconds = 30;                    // bounds every wait
  const std::atomic<int>* cancel_flag = nullptr;  // non-zero: waits stop
  // A device mesh over the ranks (its sizes' product must be the rank
  // count; otherwise, or when empty, there are no axes): each rank's comm
  // then has one communicator per axis (kreg_comm.axis).
  Mesh mesh;
};

class Comm {
 public:
  virtual ~Comm() = default;
  const kreg_comm* abi() const { return &abi_; }
  int rank() const { return abi_.rank; }
  int size() const { return abi_.size; }
  // "threads" or "mpi".
  virtual absl::string_view backend() const = 0;
  // How many machines (shared-memory nodes) its ranks run on.
  virtual int nodes() const { return 1; }
  // This rank's communicator along mesh axis `name`, or nullptr.
  Comm* axis(absl::string_view name) const;
  // Marks this rank failed with `why`: from now on every rank's waits for
  // kernels' messages fail at once. A rank that stays (leaving = false: its
  // kernel failed, but it goes on to agree with the others on the outcome)
  // still answers the host's own messages (negative tags), which go on;
  // once a rank has left, those fail too.
  virtual void Abort(absl::string_view why, bool leaving = true) = 0;
  // A new communicator over the same ranks (and mesh), with no message in
  // flight and no failure recorded, so one failed collective leaves nothing
  // behind for the next (every rank calls it, in the same order).
  // Unimplemented for thread ranks: make new ThreadComms instead.
  virtual absl::StatusOr<std::unique_ptr<Comm>> Fresh() {
    return absl::UnimplementedError(absl::StrCat(backend(), ": no fresh communicator; make a new one"));
  }

  // Host collectives (every rank calls them, in the same order).
  absl::Status Barrier();
  // The element-wise maximum of every rank's `values` (same length on all).
  absl::StatusOr<std::vector<double>> AllMax(std::vector<double> values);
  // Rank 0's *text, on every rank.
  absl::Status Broadcast(std::string* text);
  // Every rank's `text`, by rank, on every rank.
  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& text);

  // Host messages between two ranks outside the collectives (a sweep's
  // results, streaming to rank 0 as they come), in order per pair of ranks.
  // Post sends `text` to `peer` without waiting: the Comm keeps it until it
  // is delivered, and Flush waits for every one posted. Receive returns the
  // next message `peer` posted to this rank, or nullopt when none has come.
  absl::Status Post(int peer, std::string text);
  absl::Status Flush();
  absl::StatusOr<std::optional<std::string>> Receive(int peer);

 protected:
  // Sets abi_.axis; axes_ holds the communicators it answers with.
  void EnableAxes();
  kreg_comm abi_{};
  std::vector<std::pair<std::string, std::unique_ptr<Comm>>> axes_;

 private:
  // Post's messages in flight: a size, then the text (each a request).
  struct Outgoing {
    uint64_t bytes = 0;
    std::string text;
    void* requests[2] = {nullptr, nullptr};
  };
  absl::Status Reap(bool wait);
  std::deque<Outgoing> outgoing_;
  std::map<int, std::pair<uint64_t, void*>> incoming_;  // peer -> the size awaited, its receive
};

// For backends: how long a wait may last, the timeout, or for a host message
// (`host`: the agreement after a run, which a failed rank reaches only once
// its own waits have timed out) twice that and a second; when a wait that
// began with `deadline` (WaitDeadline) must stop for the cancel flag
// (KREG_CANCELLED) or the time (KREG_UNAVAILABLE), with *why naming the rank
// and what it `awaited`; KREG_OK to go on.
double WaitSeconds(const CommOptions& options, bool host);
std::chrono::steady_clock::time_point WaitDeadline(const CommOptions& options, bool host);
kreg_status StopWaiting(const CommOptions& options, bool host, int rank,
                        std::chrono::steady_clock::time_point deadline, absl::string_view awaiting, std::string* why);

// The ranks of `mesh` along axis `a` that share rank r's other
// coordinates, in their order on that axis (row-major numbering).
std::vector<int> AxisGroup(const Mesh& mesh, size_t a, int r);
// Whether `mesh` has axes whose sizes multiply to n.
bool MeshFits(const Mesh& mesh, int n);

// n >= 1 thread ranks sharing one world.
std::vector<std::unique_ptr<Comm>> ThreadComms(int n, const CommOptions& options);

// Where a communicator's ranks live: threads of this process, or the
// processes of an MPI job.
enum class CommBackend { kThreads, kMpi };
// "threads" or "mpi"; InvalidArgument otherwise ("backend 'x': expected
// threads or mpi").
absl::StatusOr<CommBackend> ParseCommBackend(absl::string_view name);
absl::string_view CommBackendName(CommBackend backend);

// This process's communicators, one per rank it runs: `ranks` ThreadComms
// (threads; limits::CheckThreadRanks; none for 0), or its one rank of the
// MPI job (mpi: LoadMpiComm; `ranks`, when not 0, must be the job's size).
// What kreg run, kreg tune, kreg calibrate and Python open.
absl::StatusOr<std::vector<std::unique_ptr<Comm>>> OpenComms(CommBackend backend, int ranks,
                                                             const CommOptions& options);

// This process's rank of the MPI job it runs in (MPI initialised on first
// use, finalised when the Comm is destroyed: one per process). The module
// is kreg_mpi.so (BackendModulePaths, $KREG_MPI_BACKEND). Unavailable when
// it is missing (kreg built without MPI) or MPI cannot start.
absl::StatusOr<std::unique_ptr<Comm>> LoadMpiComm(const CommOptions& options);

// The data class in a collective's tuning key: its backend and, for MPI, the
// nodes its ranks span: "backend=threads", "backend=mpi,nodes=2".
std::string CollectiveDataClass(absl::string_view backend, int nodes);
std::string CollectiveDataClass(const Comm& comm);

// Runs body(comm) for every comm at once, each on a thread of its own (a
// single comm on the caller's thread), and
// returns the first error by rank order (OK if none). A rank whose body
// fails is aborted, so ranks waiting on it fail at once instead of at the
// timeout.
absl::Status RunRanks(const std::vector<std::unique_ptr<Comm>>& comms, const std::function<absl::Status(Comm&)>& body);

}  // namespace kreg

#endif  // KREG_BACKENDS_COMM_H_
