// kreg tune and kreg query: the tuning table's command line (kreg db is
// db.cc). The sweep itself is kreg::Tune (kreg/tuner.h); this file turns
// flags into TuneRequests and prints what comes back.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/autotune.h"
#include "kreg/comm.h"
#include "kreg/limits.h"
#include "kreg/lut.h"
#include "kreg/text.h"
#include "kreg/tuner.h"
#include "tools/binders.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/record.h"

namespace kreg::cli {
namespace {

std::atomic<bool> interrupted{false};
void OnInterrupt(int) { interrupted = true; }

// One progress line, rewritten in place on a terminal, plain lines otherwise
// (and then only every few seconds), on stderr so results on stdout stay
// clean.
class Progress {
 public:
  Progress() : tty_(isatty(2)) {}
  void Update(const std::string& text) {
    const auto now = std::chrono::steady_clock::now();
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", text.c_str());
      shown_ = true;
    } else if (now - last_ > std::chrono::seconds(5)) {
      std::fprintf(stderr, "%s\n", text.c_str());
      last_ = now;
    }
    std::fflush(stderr);
  }
  // Clears the line (a terminal), so other output starts on a clean one.
  void Done() {
    if (tty_ && shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
    std::fflush(stderr);
  }

 private:
  bool tty_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_{};
};

class ProgressPrinter : public TuneObserver {
 public:
  explicit ProgressPrinter(const Flags& flags) : flags_(flags) {}
  void OnProgress(const TuneProgress& p) override {
    progress_.Update(ValidUtf8(absl::StrFormat(
        "[%d/%d] %s  best so far %s  %.0f s%s", p.done, p.candidates, p.key,
        p.best.empty() ? "-" : absl::StrCat(p.best, " ", Ms(p.best_ns)), p.elapsed_seconds,
        p.eta_seconds >= 0 ? absl::StrFormat(", ETA %.0f s", p.eta_seconds) : std::string())));
  }
  void OnWarning(absl::string_view message) override {
    progress_.Done();
    Warn(flags_, message);
  }
  void Done() { progress_.Done(); }

 private:
  const Flags& flags_;
  Progress progress_;
};

std::string Winner(const std::string& op, const tuning::Trial& t) {
  std::string config = ConfigText(t.config());
  return absl::StrCat(op, "/", t.variant(), config.empty() ? "" : " ", config,
                      t.threads() > 0 ? absl::StrCat(" on ", t.threads(), t.threads() == 1 ? " thread" : " threads") : "",
                      "  ", Ms(t.median_ns()));
}

}  // namespace

// The tune result record.
Json TuneResultJson(const TuneResult& r, absl::string_view strategy) {
  const std::string& op = r.key.op();
  Json out = Json::object();
  out["key"] = KeyJson(r.key);
  out["best"] = r.entry.has_best() ? TrialJson(op, r.entry.best()) : Json(nullptr);
  out["runner_up"] = r.entry.has_runner_up() ? TrialJson(op, r.entry.runner_up()) : Json(nullptr);
  Json counts = Json::object();
  counts["candidates"] = r.candidates;
  counts["measured"] = r.measured;
  counts["reused"] = r.reused;
  counts["failed"] = r.failed;
  out["counts"] = std::move(counts);
  out["seconds"] = r.seconds;
  out["strategy"] = std::string(strategy);
  out["complete"] = r.complete;
  return out;
}

namespace {

// Prints one problem's result (`where`: the ranks and machine that tuned it
// under mpirun, or "").
void PrintResult(const Flags& flags, const TuneResult& r, Strategy strategy, const std::string& where,
                 Json where_json) {
  if (flags.json) {
    Json out = TuneResultJson(r, StrategyName(strategy));
    if (!where_json.is_null()) out["shared"] = std::move(where_json);
    out["timing"] = TimingName(flags);
    std::cout << Dump(out) << std::endl;
    return;
  }
  const std::string& op_name = r.key.op();
  std::string best = "no candidate succeeded";
  if (r.entry.has_best()) {
    best = Winner(op_name, r.entry.best());
    if (r.entry.has_runner_up()) absl::StrAppend(&best, "  (runner-up ", Winner(op_name, r.entry.runner_up()), ")");
  }
  std::cout << ValidUtf8(absl::StrFormat("%s: %s\n    %d candidates, %d measured, %d reused, %d failed, %.1f s, %s, %s%s%s\n",
                                         KeyString(r.key), best, r.candidates, r.measured, r.reused, r.failed,
                                         r.seconds, StrategyName(strategy), TimingName(flags),
                                         r.complete  ? ""
                                         : r.stopped ? "  (incomplete: stopped)"
                                                     : "  (incomplete: the budget ran out)",
                                         where))
            << std::flush;
}

// A sweep of a non-collective op under mpirun, shared between the ranks
// (kreg::TuneAcross); rank 0 prints each problem's result on each machine.
absl::Status TuneShared(const Flags& flags, const Registry& registry, const TuneRequest& base,
                        std::vector<NamedValues> problems, Comm& comm, TuningDb& db, Strategy strategy,
                        const std::string& interrupted_message) {
  std::vector<TuneRequest> requests;
  std::vector<std::string> names;  // "topk batch=4,n=1000,k=8"
  for (NamedValues& values : problems) {
    names.push_back(absl::StrCat(base.op, " ", absl::StrJoin(values, ",", absl::PairFormatter("="))));
    requests.push_back(base);
    requests.back().values = std::move(values);
    requests.back().comm = nullptr;
  }
  ProgressPrinter printer(flags);
  absl::StatusOr<std::vector<SharedResult>> results =
      TuneAcross(registry, requests, comm, &db, comm.rank() == 0 ? &printer : nullptr, &interrupted);
  printer.Done();
  if (!results.ok()) return results.status();
  std::vector<std::string> failures, nothing_ran;
  bool stopped = interrupted;
  for (const SharedResult& shared : *results) {
    std::string machine = shared.machine;
    for (const tuning::Machine& m : db.proto().machines()) {
      if (m.id() == shared.machine) machine = MachineSummary(m);
    }
    const std::string where = absl::StrCat("on rank", shared.ranks.size() > 1 ? "s " : " ",
                                           absl::StrJoin(shared.ranks, ","), " (", machine, ")");
    if (!shared.status.ok()) {
      failures.push_back(absl::StrCat(names[shared.problem], " ", where, ": ", shared.status.message()));
      continue;
    }
    stopped = stopped || shared.result.stopped;
    if (!shared.result.entry.has_best()) nothing_ran.push_back(KeyString(shared.result.key));
    Json where_json = Json::object();
    where_json["ranks"] = shared.ranks;
    where_json["machine"] = shared.machine;
    PrintResult(flags, shared.result, strategy, absl::StrCat("\n    ", where), std::move(where_json));
  }
  if (stopped) return absl::CancelledError(interrupted_message);
  if (!failures.empty()) return absl::FailedPreconditionError(absl::StrJoin(failures, "; "));
  if (!nothing_ran.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no candidate succeeded for ", absl::StrJoin(nothing_ran, "; "), " (every failure is recorded in ", flags.db,
        ": kreg db show ", flags.db, ")"));
  }
  return absl::OkStatus();
}

// The request every problem's sweep starts from (its values left out), and
// the device mesh --mesh gives (its axes are the problems' mesh dims, its
// size the ranks).
absl::StatusOr<TuneRequest> BaseRequest(const Flags& flags, Strategy strategy, ProblemOptions options,
                                        std::vector<std::pair<std::string, std::string>> inputs, Mesh* mesh) {
  TuneRequest base;
  base.op = flags.target;
  base.options = std::move(options);
  base.input_files = std::move(inputs);
  absl::StatusOr<std::vector<std::string>> variants = SplitList(flags.variants);
  if (!variants.ok()) return absl::InvalidArgumentError(absl::StrCat("--variants: ", variants.status().message()));
  base.variants = *std::move(variants);
  base.data_class = flags.data_class;  // as given: the table stores it as valid UTF-8
  base.search.strategy = strategy;
  base.search.reps = flags.reps;
  base.search.budget_seconds = flags.budget;
  base.search.seed = flags.seed;
  base.max_list_len = flags.max_list_len;
  base.list_growth_rounds = flags.list_growth_rounds;
  base.warmup = flags.warmup;
  base.threads = flags.threads;
  base.thread_round = !flags.no_thread_round;
  base.timeout_seconds = flags.timeout;
  base.db_path = flags.db;
  base.ranks = flags.ranks;
  base.comm_timeout = flags.comm_timeout;
  absl::StatusOr<DeviceKind> device = DeviceOf(flags);
  if (!device.ok()) return device.status();
  base.device = *device == DeviceKind::kCuda ? KREG_DEVICE_CUDA : 0;
  base.device_warm = flags.warm;
  // The flags' validators hold the same bounds; the library's one check too.
  if (absl::Status s = CheckTuneRequest(base); !s.ok()) return s;
  if (flags.mesh.empty()) return base;
  absl::StatusOr<Mesh> parsed = ParseMesh(flags.mesh);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--mesh: ", parsed.status().message()));
  *mesh = *std::move(parsed);
  base.mesh = MeshString(*mesh);
  int size = 1;  // at most limits::kMaxRanks (ParseMesh)
  for (const auto& [axis, n] : *mesh) size *= n;
  if (base.ranks > 0 && base.ranks != size) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks ", base.ranks, " but the mesh ", base.mesh, " has ",
                                                   size, " ranks"));
  }
  if (flags.backend != "mpi") {
    if (absl::Status s = limits::CheckThreadRanks(size, absl::StrCat("--mesh ", base.mesh)); !s.ok()) return s;
    base.ranks = size;
  }
  return base;
}

// Under mpirun (--backend mpi): this process's rank of the job, `base` made
// to sweep on it (only rank 0 keeps the table); null otherwise.
absl::StatusOr<std::unique_ptr<Comm>> OpenJob(const Flags& flags, const Mesh& mesh, TuneRequest* base) {
  if (flags.backend == "mpi" && base->device != 0) {
    return absl::InvalidArgumentError("--device cuda: a sweep on the GPU runs in one process, not under mpirun");
  }
  absl::StatusOr<CommBackend> backend = BackendOf(flags);
  if (!backend.ok()) return backend.status();
  if (*backend != CommBackend::kMpi) return std::unique_ptr<Comm>();
  CommOptions comm_options;
  comm_options.timeout_seconds = flags.comm_timeout;
  comm_options.mesh = mesh;
  absl::StatusOr<std::vector<std::unique_ptr<Comm>>> comm = OpenComms(CommBackend::kMpi, 0, comm_options);
  if (!comm.ok()) return comm.status();
  std::unique_ptr<Comm> mpi = std::move(comm->front());
  base->comm = mpi.get();
  if (mpi->rank() != 0) base->db_path.clear();
  return mpi;
}

// Every problem's values (one per --dims, the mesh's axes added), all read
// before the first sweep starts, so a typo in the last --dims does not wait
// for the others.
absl::StatusOr<std::vector<NamedValues>> ParseProblems(const Flags& flags, const Op& op, const Mesh& mesh) {
  std::vector<NamedValues> problems;
  for (const std::string& d : flags.dims.empty() ? std::vector<std::string>{""} : flags.dims) {
    absl::StatusOr<NamedValues> named = ParseNamedValues(d);
    if (!named.ok()) return absl::InvalidArgumentError(absl::StrCat("--dims: ", named.status().message()));
    for (const std::pair<std::string, int>& axis : mesh) {
      const bool given =
          std::any_of(named->begin(), named->end(), [&](const auto& v) { return v.first == axis.first; });
      if (!given) named->emplace_back(axis.first, absl::StrCat(axis.second));
    }
    if (absl::Status s = op.ParseValues(*named).status(); !s.ok()) return absl::InvalidArgumentError(s.message());
    problems.push_back(*std::move(named));
  }
  return problems;
}

// The table to record into (`reports`: this process keeps it; a new one if
// missing), checked writable before anything is measured. Under mpirun a
// collective's ranks all start from rank 0's table, so all skip the same
// candidates (measured, or in flight when an earlier job died).
absl::StatusOr<TuningDb> OpenTable(const Flags& flags, bool reports, Comm* mpi, bool collective) {
  absl::StatusOr<TuningDb> db = reports ? TuningDb::Load(flags.db) : TuningDb();
  if (db.status().code() == absl::StatusCode::kNotFound) db = TuningDb();  // a new table
  if (db.status().code() == absl::StatusCode::kDataLoss) db = absl::InvalidArgumentError(db.status().message());
  if (db.ok() && !db->unchecked().empty() && reports) Warn(flags, db->unchecked());
  if (db.ok() && reports) {
    if (absl::Status s = TuningDb::CheckWritable(flags.db); !s.ok()) db = s;
  }
  if (mpi != nullptr && !db.ok()) mpi->Abort(db.status().message());  // the other ranks wait for rank 0's table
  if (!db.ok()) return db.status();
  if (mpi != nullptr && collective) {
    std::string bytes = db->ToBinary();
    if (absl::Status s = mpi->Broadcast(&bytes); !s.ok()) return s;
    if (mpi->rank() != 0) db = TuningDb::Parse(bytes, "rank 0's table");
    if (!db.ok()) return db.status();
  }
  db->AddMachine(ThisMachine());
  return db;
}

// Ctrl-C and SIGTERM stop the sweep after the candidate being measured.
void CatchInterrupts(const Flags& flags) {
  struct sigaction action {};
  action.sa_handler = OnInterrupt;
  action.sa_flags = SA_RESETHAND;  // a second Ctrl-C ends kreg at once (every result is saved already)
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  SetLockWait(flags.lock_timeout, &interrupted);  // a save waiting for the lock stops on them too
}

// The problems swept one after another in this process (or, a collective
// under mpirun, with the job's other ranks); `reports`: this process prints
// the results.
absl::Status TuneEach(const Flags& flags, const Registry& registry, const TuneRequest& base,
                      std::vector<NamedValues> problems, TuningDb& db, Strategy strategy, bool reports,
                      const std::string& interrupted_message) {
  std::vector<std::string> nothing_ran;  // keys no candidate succeeded for
  for (NamedValues& values : problems) {
    TuneRequest request = base;
    request.values = std::move(values);
    ProgressPrinter printer(flags);
    absl::StatusOr<TuneResult> result =
        kreg::Tune(registry, request, &db, reports ? &printer : nullptr, &interrupted);
    printer.Done();
    if (interrupted || (result.ok() && result->stopped)) return absl::CancelledError(interrupted_message);
    if (!result.ok()) return result.status();
    if (!result->entry.has_best()) nothing_ran.push_back(KeyString(result->key));
    if (reports) PrintResult(flags, *result, strategy, "", Json(nullptr));
  }
  if (!nothing_ran.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no candidate succeeded for ", absl::StrJoin(nothing_ran, "; "), " (every failure is recorded in ", flags.db,
        ": kreg db show ", flags.db, ")"));
  }
  return absl::OkStatus();
}

std::string InterruptedMessage(const Flags& flags) {
  return absl::StrCat("interrupted; every finished measurement is in ", flags.db,
                      "; run the same command again to resume");
}

// A line about a recorded shape: on stdout, or stderr under --json (whose
// stdout holds records only).
void Say(const Flags& flags, const std::string& line) {
  (flags.json ? std::cerr : std::cout) << ValidUtf8(line) << "\n" << std::flush;
}

// kreg tune --from-record: each recorded shape the table does not answer
// exactly, swept in turn; one that fails is reported and the others go on.
absl::Status TuneFromRecord(const Flags& flags, const Registry& registry, Strategy strategy,
                            const ProblemOptions& options) {
  if (flags.backend == "mpi") {
    return absl::InvalidArgumentError("--from-record: sweeps run in one process, not under mpirun");
  }
  // The whole record is read before the table is touched.
  absl::StatusOr<std::vector<RecordedProblem>> problems = ReadRecordedProblems(flags, registry, options);
  if (!problems.ok()) return problems.status();
  if (problems->empty()) {
    Say(flags, absl::StrCat(flags.from_record, ": no shapes recorded; nothing to tune"));
    return absl::OkStatus();
  }
  absl::StatusOr<TuningDb> db = OpenTable(flags, /*reports=*/true, nullptr, false);
  if (!db.ok()) return db.status();
  if (absl::Status s = SkipAnswered(flags, registry, *db, &*problems); !s.ok()) return s;
  CatchInterrupts(flags);
  std::vector<std::string> failed;
  for (RecordedProblem& p : *problems) {
    const std::string name = RecordedName(flags, p.shape);
    Say(flags, absl::StrCat(name, p.skip.empty() ? ": tuning" : absl::StrCat(": skipped, ", p.skip)));
    if (!p.skip.empty()) continue;
    Mesh mesh;
    absl::StatusOr<TuneRequest> base = BaseRequest(p.flags, strategy, std::move(p.options), {}, &mesh);
    absl::Status s = base.status();
    if (s.ok()) {
      s = TuneEach(p.flags, registry, *base, {std::move(p.values)}, *db, strategy, true, InterruptedMessage(flags));
    }
    if (s.code() == absl::StatusCode::kCancelled) return s;
    if (!s.ok()) {
      Warn(flags, absl::StrCat(name, ": ", s.message()));
      failed.push_back(name);
    }
  }
  if (failed.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(failed.size(), " of ", problems->size(),
                                                    " recorded shapes failed: ", absl::StrJoin(failed, "; ")));
}

}  // namespace

absl::Status Tune(const Flags& flags) {
  if (flags.from_record.empty() && flags.target.empty()) {
    return absl::InvalidArgumentError("OP is required (or give --from-record FILE)");
  }
  if (flags.from_record.empty() && flags.dims.empty() && flags.inputs.empty()) {
    return absl::InvalidArgumentError("tune needs --dims NAME=V,... (one problem per --dims)");
  }
  absl::StatusOr<Strategy> strategy = ParseStrategy(flags.strategy);
  if (!strategy.ok()) return absl::InvalidArgumentError(absl::StrCat("--strategy: ", strategy.status().message()));
  absl::StatusOr<ProblemOptions> options = OptionsFromFlags(flags);
  if (!options.ok()) return options.status();
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> inputs = Pairs(flags.inputs, "input");
  if (!inputs.ok()) return inputs.status();
  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry(flags);
  if (!registry.ok()) return registry.status();
  if (!flags.from_record.empty()) return TuneFromRecord(flags, **registry, *strategy, *std::move(options));
  Mesh mesh;
  absl::StatusOr<TuneRequest> base = BaseRequest(flags, *strategy, *std::move(options), *std::move(inputs), &mesh);
  if (!base.ok()) return base.status();
  // Under mpirun (--backend mpi) rank 0 keeps the table and reports. A
  // collective's ranks sweep together, each candidate on all of them; other
  // ops' problems and candidates are shared out (TuneShared).
  absl::StatusOr<std::unique_ptr<Comm>> mpi = OpenJob(flags, mesh, &*base);
  if (!mpi.ok()) return mpi.status();
  const bool reports = *mpi == nullptr || (*mpi)->rank() == 0;
  absl::StatusOr<std::shared_ptr<const Op>> op = (*registry)->GetOp(flags.target);
  if (!op.ok()) return absl::InvalidArgumentError(op.status().message());
  absl::StatusOr<std::vector<NamedValues>> problems = ParseProblems(flags, **op, mesh);
  if (!problems.ok()) return problems.status();
  absl::StatusOr<TuningDb> db = OpenTable(flags, reports, mpi->get(), (*op)->collective());
  if (!db.ok()) return db.status();
  CatchInterrupts(flags);
  const std::string interrupted_message = InterruptedMessage(flags);
  if (*mpi != nullptr && !(*op)->collective()) {
    return TuneShared(flags, **registry, *base, *std::move(problems), **mpi, *db, *strategy, interrupted_message);
  }
  return TuneEach(flags, **registry, *base, *std::move(problems), *db, *strategy, reports, interrupted_message);
}

absl::Status Query(const Flags& flags) {
  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry(flags);
  if (!registry.ok()) return registry.status();
  absl::StatusOr<Lut> lut = AnsweringLut(flags, **registry);
  if (!lut.ok()) return lut.status();
  absl::StatusOr<DeviceKind> device = DeviceOf(flags);
  if (!device.ok()) return device.status();
  for (const std::string& d : flags.dims) {
    absl::StatusOr<ProblemSpec> spec = SpecFromFlags(flags, **registry, flags.target, d);
    if (!spec.ok()) return spec.status();
    // The key comes from arguments, as for tune and dispatch: shape-only ones.
    ShapeArgs shape;
    if (absl::Status s = ShapeArgsOf(*spec, &shape); !s.ok()) return absl::InvalidArgumentError(s.message());
    absl::StatusOr<std::string> data_class = DataClassOf(flags, *spec, *shape.args());
    if (!data_class.ok()) return data_class.status();
    std::vector<std::string> warnings;
    absl::StatusOr<QueryRecord> record =
        AskTable(*lut, *spec->op, *shape.args(), *data_class, *device, flags.threads, &warnings);
    for (const std::string& w : warnings) Warn(flags, w);
    if (!record.ok()) return record.status();
    const LutAnswer* a = &record->answer;
    if (flags.json) {
      std::cout << Dump(AnswerJson(record->key, *a)) << "\n";
      continue;
    }
    const std::string config = a->kernel->ConfigString(*a->config);
    const std::string how = AnswerHow(*a, /*detailed=*/true);
    std::cout << ValidUtf8(absl::StrFormat("%s %s %s%s -> %s%s%s  [%s]\n", spec->op->name(), record->key.dtype(),
                                           DimsString(KeyDims(record->key)),
                                           data_class->empty() ? "" : " [" + *data_class + "]",
                                           a->kernel->name(), config.empty() ? "" : " ", config, how));
  }
  return absl::OkStatus();
}

void SetupTune(CLI::App* tune, HelpFormatter& help, Flags& f) {
  help.Set(tune, {"kreg tune OP --dims NAME=V,... [--dims NAME=V,...]... --db FILE [flags]\n"
                  "kreg tune --from-record FILE --db FILE [flags]",
                  "Searches every available kernel's parameter space (the op's reference left out unless named "
                  "with --variants) for each problem, one per --dims, in a worker process: a candidate that "
                  "crashes or hangs is recorded as failed. Every result is saved into the table as it comes, so "
                  "a sweep that is interrupted (Ctrl-C) or re-run with a new variant measures only what is "
                  "missing. Progress goes to stderr, results to stdout.",
                  "kreg tune topk --dims batch=32,n=32000,k=50 --dims batch=64,n=32768,k=1024 --db topk.lut\n"
                  "kreg tune topk --dims k=64 --input input=logits.npy --db topk.lut --strategy exhaustive\n"
                  "kreg tune topk --dims batch=8,n=4000,k=16 --variants sort,heap --budget 60 --db topk.lut\n"
                  "KREG_RECORD=shapes.txt ./my_program && kreg tune --from-record shapes.txt --db topk.lut"});
  tune->add_option("OP", f.target, "the op to tune (kreg list shows the ops)");
  tune->add_option("--from-record,--from_record", f.from_record,
                   "tune every shape a KREG_RECORD file holds (calls the tables did not answer exactly), each "
                   "with its op, dims, dtypes, data class and device, skipping those the table answers exactly")
      ->option_text("FILE")
      ->check(NotBlank());
  AddDims(tune, f, "a problem: the op's dims and attributes; repeatable, one problem each");
  tune->add_option("--db", f.db, "the table to record into (created if missing)")->option_text("FILE")->required();
  tune->add_option("--variants", f.variants, "variants to search (default: every available one but the reference)")
      ->option_text("V,...")
      ->check(NotBlank());
  tune->add_option("--strategy", f.strategy,
                   "exhaustive, random, or halving: everyone measured once, the best quarter kept with twice the "
                   "repetitions, and so on")
      ->option_text("NAME")
      ->capture_default_str();
  tune->add_option("--budget", f.budget, "seconds per problem (0: no limit)")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(SecondsWithin(limits::Zero::kAllowed));
  tune->add_option("--timeout", f.timeout, "seconds a candidate may take before it is killed")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(SecondsWithin(limits::Zero::kRefused));
  AddMeasure(tune, f);
  AddComm(tune, f);
  AddDtype(tune, f);
  AddWith(tune, f);
  AddInput(tune, f);
  AddGenerate(tune, f);
  tune->add_option("--max-list-len,--max_list_len", f.max_list_len,
                   "list parameters (e.g. m_schedule): lists of up to N values at first")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckCount(v, "", 1, limits::kMaxListLen); }));
  tune->add_option("--list-growth-rounds,--list_growth_rounds", f.list_growth_rounds,
                   "then up to N rounds extending the best lists by one value")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckCount(v, "", 0, limits::kMaxListGrowthRounds); }));
  tune->add_flag("--no-thread-round,--no_thread_round", f.no_thread_round,
                 "do not measure the leaders again on fewer threads than cores (without --threads they are: "
                 "a kernel faster on fewer threads is chosen with them)");
  AddDataClass(tune, f, "the data class kept in the key (default: the op's classifier on the inputs, else "
                        "dist=NAME for a --dist other than normal)");
  AddDevice(tune, f,
            "cpu, or cuda: tune the op's CUDA kernels on GPU 0 (timed with CUDA events, the L2 flushed before "
            "each run), keyed under the GPU (its name, SM version, memory and driver) beside the CPU's entries");
  AddLockTimeout(tune, f);
}

void SetupQuery(CLI::App* query, HelpFormatter& help, Flags& f) {
  help.Set(query, {"kreg query OP --dims NAME=V,... [--dims NAME=V,...]... [--db FILE] [flags]",
                   "Prints, for each problem (one per --dims), the kernel and parameters the tables (--db, then "
                   "the shipped ones) answer with on this machine and how: exact (tuned for this problem here), "
                   "nearest (the nearest problem tuned here whose choice is legal), similar machine (nothing "
                   "tuned here; the most similar tuned machine's exact or nearest answer, named), model (a "
                   "collective's calibrated costs) or default (why, and the default measured across machines, "
                   "else the op's own). \"incomplete\" marks an answer from a sweep that was cut short.",
                   "kreg query topk --dims batch=48,n=40000,k=64 --db topk.lut\n"
                   "kreg query topk --dims batch=128,n=201088,k=64 --machine strict\n"
                   "kreg query topk --dims batch=8,n=4000,k=16 --dims batch=6,n=3000,k=8 --with row_ends --db topk.lut --json"});
  query->add_option("OP", f.target, "the op to ask about")->required();
  AddDims(query, f, "a problem: the op's dims and attributes; repeatable, one answer each")->required();
  query->add_option("--db", f.db, "a table to ask before the shipped ones")->option_text("FILE");
  AddTables(query, f);
  AddDtype(query, f);
  AddWith(query, f);
  AddDist(query, f);
  AddThreads(query, f, "the threads the caller will run with (0: all cores): an entry measured on several thread counts answers with its fastest on no more");
  AddDataClass(query, f, "the data class to ask for (default: dist=NAME for a --dist other than normal)");
  query->add_option("--device", f.device, "cpu, or cuda: the answer for this machine's GPU (its CUDA kernels)")
      ->option_text("NAME")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  AddComm(query, f);
  query->add_option("--nodes", f.nodes, "with --backend mpi: the nodes of the job to ask for (kreg run and tune "
                                        "under mpirun count them)")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckRanks(v, ""); }));
}

}  // namespace kreg::cli
