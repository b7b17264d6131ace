// The sweep as a library: tune one problem of any op into a tuning table.
//
//   kreg::TuneRequest request;
//   request.op = "topk";
//   request.values = {{"batch", "32"}, {"n", "32000"}, {"k", "50"}};
//   request.db_path = "topk.lut";
//   auto result = kreg::Tune(*registry, request, &db);   // db: the table, loaded or empty
//
// Tune enumerates every candidate (each available kernel's parameter space,
// the op's reference left out unless named), asks the worker which are legal
// for the problem, searches them with the request's strategy, grows list
// parameters round by round from the best lists, and records every full
// measurement and every failure of a candidate's own in `db`, checkpointing
// it to db_path (SaveMerged) as results come. Results already in `db` for the
// same (problem, variant, version, configuration) are reused, so a sweep cut
// short resumes where it stopped. Plugin code runs only in the worker
// process (a separate program, kreg/worker.h): a kernel that crashes or
// hangs, in its check or its run, is recorded as failed and the sweep goes on.
//
// An entry is stamped with the tool version, the strategy and the time, and
// marked incomplete when the sweep was cut short (budget, stop flag); a
// later complete sweep clears the mark.
//
// Thread-safety: Tune may run concurrently on distinct TuningDb objects
// (several processes may share one db_path: saves lock and merge).
#ifndef KREG_AUTOTUNE_TUNER_H_
#define KREG_AUTOTUNE_TUNER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/autotune.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/kreg_tuning.pb.h"
#include "kreg/lut.h"
#include "kreg/problem.h"
#include "kreg/registry.h"

namespace kreg {

struct TuneRequest {
  std::string op;
  // Dims and attributes by name; dims given by input files may be left out.
  NamedValues values;
  // Dtypes ("" for every tensor that allows it), optional inputs to
  // generate, the random distribution and partition, the seed.
  ProblemOptions options;
  // The user's own inputs, as .npy files (name, path): read here for the key
  // and by the worker for the measurements. options.inputs is ignored.
  std::vector<std::pair<std::string, std::string>> input_files;
  // Variants to search; empty: every available kernel but the reference.
  std::vector<std::string> variants;
  // The key's data class; empty: the op's classifier on the inputs, else
  // "dist=NAME" for random inputs of another distribution than normal.
  std::string data_class;
  SearchOptions search;     // strategy, repetitions, budget, seed; search.stop is set by Tune
  int max_list_len = 2;     // list parameters: lists of up to this many values at first,
  int list_growth_rounds = 4;  // then up to this many rounds extending the best lists by one
  int warmup = 2;
  int threads = 0;          // per kernel run; 0: all cores
  // With threads 0: measure the leaders again on 1, 2, 4, ... threads, fewer
  // than the cores (each a trial of its own, the thread count recorded), so
  // a kernel that runs faster on fewer threads is chosen with them.
  bool thread_round = true;
  double timeout_seconds = 30;  // one candidate's measurement (or one legality batch)
  double max_seconds_per_candidate = 5;
  // Collective ops: the number of thread ranks every candidate runs on
  // (required), and how long a rank waits for another. Their key's data
  // class is "backend=threads" unless data_class says otherwise.
  int ranks = 0;
  double comm_timeout = 30;
  // Collective ops on a device mesh: its axes (MeshString, "x=2,y=1"), given
  // to every candidate's thread communicator; the mesh's axis dims belong in
  // `values`. Empty: none. (Under MPI the Comm carries its own mesh.)
  std::string mesh;
  // Where the candidates run: 0, this CPU; KREG_DEVICE_CUDA, CUDA device
  // `device_ordinal`: its CUDA kernels only (CanRun), each run's inputs
  // copied there outside the clock, timed with CUDA events on its stream,
  // the L2 flushed before each run unless `device_warm`, and the key under
  // the GPU's machine (MachineOf), which `db` records. No thread round.
  int device = 0;
  int device_ordinal = 0;
  bool device_warm = false;
  // Collective ops under MPI: every rank of the job calls Tune with its
  // Comm and the same request and table; candidates are measured in this
  // process (a forked worker cannot join the job), on every rank at once.
  // Before each candidate runs, it is checkpointed into the table as
  // crashed ("in flight"), so a candidate that brings the job down is
  // recorded and skipped by the next run. Give db_path on rank 0 only.
  // No budget (ranks would stop at different times).
  Comm* comm = nullptr;
  // The table file checkpointed after every result; empty: none (the caller
  // saves `db` itself).
  std::string db_path;
  // This sweep's share of the candidates: every `slices`-th one enumerated,
  // from the `slice`-th (a problem split between ranks, TuneAcross). A share
  // may be empty.
  int slice = 0, slices = 1;
  // Called with each result as it is recorded (a trial, or the entry's
  // tuning info), as a table of that alone with this machine's record:
  // what TuneAcross streams to rank 0.
  std::function<void(const TuningDb& result)> on_record;
  // The worker's argv; empty: FindWorker().
  std::vector<std::string> worker_command;
};

struct TuneProgress {
  std::string key;         // KeyString of the problem
  size_t done = 0;         // distinct candidates measured at least once
  size_t candidates = 0;
  std::string best;        // "topk/heap k=..." so far, or ""
  double best_ns = 0;
  double elapsed_seconds = 0;
  double eta_seconds = -1;  // -1: unknown
};

// Told about a sweep as it goes; called from Tune's thread.
class TuneObserver {
 public:
  virtual ~TuneObserver() = default;
  virtual void OnProgress(const TuneProgress&) {}
  // A candidate that failed, a kernel whose check crashed, a stale trial.
  virtual void OnWarning(absl::string_view) {}
};

struct TuneResult {
  tuning::ProblemKey key;
  tuning::Entry entry;  // as recorded (best, runner-up, trials)
  // Distinct candidates: all, measured here, answered from the table, failed.
  size_t candidates = 0, measured = 0, reused = 0, failed = 0;
  double seconds = 0;
  bool complete = true;  // false: cut short by the budget or the stop flag
  bool stopped = false;  // the stop flag was raised
};

// The request's numbers within kreg/limits.h's bounds (repetitions,
// warm-up runs, budget and timeouts, threads, list lengths): what the
// command line and Python check before a sweep, and Tune checks again.
// InvalidArgument naming the first out of bounds (by its field's name:
// "reps", "warmup", "budget", "timeout", "threads", "max_list_len").
absl::Status CheckTuneRequest(const TuneRequest& request);

// Tunes one problem into `db`. InvalidArgument for a bad request (unknown
// op or variant, bad dims, illegal inputs), NotFound when no kernel is
// available, the file's error when db_path cannot be written. When `stop`
// becomes true the measurement in flight is abandoned, what was measured is
// kept (and saved), and the result says stopped.
absl::StatusOr<TuneResult> Tune(const Registry& registry, const TuneRequest& request, TuningDb* db,
                                TuneObserver* observer = nullptr, const std::atomic<bool>* stop = nullptr);

// Sweeps under mpirun: the problems `requests` (one op, not a collective;
// the same requests on every rank) shared between the ranks of `comm`'s
// job. Ranks whose machines have the same fingerprint (ThisMachine().id())
// form a group and split its work: whole problems, dealt round-robin, when
// the group has no more ranks than problems; else each problem's candidates
// too (TuneRequest::slice). Ranks on different machines each tune for
// their own. Every rank streams each result to rank 0 as it is recorded;
// rank 0 merges them into `db` and checkpoints it to requests[0].db_path,
// so a rank that dies loses only the candidate it was measuring, and the
// same command resumes (every rank reuses what rank 0's table holds: give
// rank 0's table, or an empty one, on every rank; Tune broadcasts it).
// A share marks its entry complete only once every share of it has.
// Returns on rank 0 one result per problem and machine (its counts summed
// over the ranks that shared it; a share's failure in `status`), on the
// others none. `observer` sees this rank's own sweeps.
struct SharedResult {
  int problem = 0;            // index in the requests
  std::string machine;        // the machine's fingerprint id
  std::vector<int> ranks;     // the ranks that tuned it
  TuneResult result;
  absl::Status status;
};
absl::StatusOr<std::vector<SharedResult>> TuneAcross(const Registry& registry, const std::vector<TuneRequest>& requests,
                                                     Comm& comm, TuningDb* db, TuneObserver* observer = nullptr,
                                                     const std::atomic<bool>* stop = nullptr);

// The tool version written into entries ("kreg 0.1.0").
const char* ToolVersion();

}  // namespace kreg

#endif  // KREG_AUTOTUNE_TUNER_H_
