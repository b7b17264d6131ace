// kreg tune, kreg query and kreg db: the tuning table's command line. The
// sweep itself is kreg::Tune (kreg/tuner.h); this file turns flags into
// TuneRequests and prints what comes back.
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
#include "tools/cli.h"

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

}  // namespace

absl::Status Tune(const Flags& flags) {
  if (flags.dims.empty() && flags.inputs.empty()) {
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

  TuneRequest base;
  base.op = flags.target;
  base.options = *std::move(options);
  base.input_files = *std::move(inputs);
  absl::StatusOr<std::vector<std::string>> variants = SplitList(flags.variants);
  if (!variants.ok()) return absl::InvalidArgumentError(absl::StrCat("--variants: ", variants.status().message()));
  base.variants = *std::move(variants);
  base.data_class = flags.data_class;  // as given: the table stores it as valid UTF-8
  base.search.strategy = *strategy;
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
  base.device = flags.device == "cuda" ? KREG_DEVICE_CUDA : 0;
  base.device_warm = flags.warm;
  // A device mesh: its axes are the problems' mesh dims, its size the ranks.
  Mesh mesh;
  if (!flags.mesh.empty()) {
    absl::StatusOr<Mesh> parsed = ParseMesh(flags.mesh);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--mesh: ", parsed.status().message()));
    mesh = *std::move(parsed);
    base.mesh = MeshString(mesh);
    int size = 1;  // at most limits::kMaxRanks (ParseMesh)
    for (const auto& [axis, n] : mesh) size *= n;
    if (base.ranks > 0 && base.ranks != size) {
      return absl::InvalidArgumentError(absl::StrCat("--ranks ", base.ranks, " but the mesh ", base.mesh, " has ",
                                                     size, " ranks"));
    }
    if (flags.backend != "mpi") {
      if (absl::Status s = limits::CheckThreadRanks(size, absl::StrCat("--mesh ", base.mesh)); !s.ok()) return s;
      base.ranks = size;
    }
  }
  // Under mpirun (--backend mpi) rank 0 keeps the table and reports. A
  // collective's ranks sweep together, each candidate on all of them; other
  // ops' problems and candidates are shared out (TuneShared).
  std::unique_ptr<Comm> mpi;
  if (flags.backend == "mpi" && base.device != 0) {
    return absl::InvalidArgumentError("--device cuda: a sweep on the GPU runs in one process, not under mpirun");
  }
  absl::StatusOr<CommBackend> backend = BackendOf(flags);
  if (!backend.ok()) return backend.status();
  if (*backend == CommBackend::kMpi) {
    CommOptions comm_options;
    comm_options.timeout_seconds = flags.comm_timeout;
    comm_options.mesh = mesh;
    absl::StatusOr<std::vector<std::unique_ptr<Comm>>> comm = OpenComms(CommBackend::kMpi, 0, comm_options);
    if (!comm.ok()) return comm.status();
    mpi = std::move(comm->front());
    base.comm = mpi.get();
    if (mpi->rank() != 0) base.db_path.clear();
  }
  const bool reports = mpi == nullptr || mpi->rank() == 0;

  // Every problem's dims are read before the first sweep starts, so a typo
  // in the last --dims does not wait for the others.
  absl::StatusOr<std::shared_ptr<const Op>> op = (*registry)->GetOp(flags.target);
  if (!op.ok()) return absl::InvalidArgumentError(op.status().message());
  std::vector<NamedValues> problems;
  for (const std::string& d : flags.dims.empty() ? std::vector<std::string>{""} : flags.dims) {
    absl::StatusOr<NamedValues> named = ParseNamedValues(d);
    if (!named.ok()) return absl::InvalidArgumentError(absl::StrCat("--dims: ", named.status().message()));
    for (const std::pair<std::string, int>& axis : mesh) {
      const bool given =
          std::any_of(named->begin(), named->end(), [&](const auto& v) { return v.first == axis.first; });
      if (!given) named->emplace_back(axis.first, absl::StrCat(axis.second));
    }
    if (absl::Status s = (*op)->ParseValues(*named).status(); !s.ok()) return absl::InvalidArgumentError(s.message());
    problems.push_back(*std::move(named));
  }

  absl::StatusOr<TuningDb> db = reports ? TuningDb::Load(flags.db) : TuningDb();
  if (db.status().code() == absl::StatusCode::kNotFound) db = TuningDb();  // a new table
  if (db.status().code() == absl::StatusCode::kDataLoss) db = absl::InvalidArgumentError(db.status().message());
  if (db.ok() && !db->unchecked().empty() && reports) Warn(flags, db->unchecked());
  // The table must be writable before anything is measured.
  if (db.ok() && reports) {
    if (absl::Status s = TuningDb::CheckWritable(flags.db); !s.ok()) db = s;
  }
  if (mpi != nullptr && !db.ok()) mpi->Abort(db.status().message());  // the other ranks wait for rank 0's table
  if (!db.ok()) return db.status();
  if (mpi != nullptr && (*op)->collective()) {
    // Every rank starts from rank 0's table, so all skip the same
    // candidates (measured, or in flight when an earlier job died).
    std::string bytes = db->ToBinary();
    if (absl::Status s = mpi->Broadcast(&bytes); !s.ok()) return s;
    if (mpi->rank() != 0) db = TuningDb::Parse(bytes, "rank 0's table");
    if (!db.ok()) return db.status();
  }
  db->AddMachine(ThisMachine());

  struct sigaction action {};
  action.sa_handler = OnInterrupt;
  action.sa_flags = SA_RESETHAND;  // a second Ctrl-C ends kreg at once (every result is saved already)
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  SetLockWait(flags.lock_timeout, &interrupted);  // a save waiting for the lock stops on them too

  const std::string interrupted_message = absl::StrCat(
      "interrupted; every finished measurement is in ", flags.db, "; run the same command again to resume");
  if (mpi != nullptr && !(*op)->collective()) {
    return TuneShared(flags, **registry, base, std::move(problems), *mpi, *db, *strategy, interrupted_message);
  }
  std::vector<std::string> nothing_ran;  // keys no candidate succeeded for
  for (NamedValues& values : problems) {
    TuneRequest request = base;
    request.values = std::move(values);
    ProgressPrinter printer(flags);
    absl::StatusOr<TuneResult> result =
        kreg::Tune(**registry, request, &*db, reports ? &printer : nullptr, &interrupted);
    printer.Done();
    if (interrupted || (result.ok() && result->stopped)) return absl::CancelledError(interrupted_message);
    if (!result.ok()) return result.status();
    if (!result->entry.has_best()) nothing_ran.push_back(KeyString(result->key));
    if (reports) PrintResult(flags, *result, *strategy, "", Json(nullptr));
  }
  if (!nothing_ran.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no candidate succeeded for ", absl::StrJoin(nothing_ran, "; "), " (every failure is recorded in ", flags.db,
        ": kreg db show ", flags.db, ")"));
  }
  return absl::OkStatus();
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

namespace {

// kreg db plot: the table read here (a bad one is this command's error),
// drawn by the Python package's kreg.plot from its JSON export.
absl::StatusOr<int> Plot(const Flags& flags) {
  absl::StatusOr<TuningDb> db = LoadTable(flags, flags.file_a);
  if (!db.ok()) return db.status();
  char json_path[] = "/tmp/kreg-plot-XXXXXX.json";
  const int fd = mkstemps(json_path, 5);
  if (fd < 0) return absl::InternalError(absl::StrCat("db plot: cannot make a temporary file: ", std::strerror(errno)));
  const std::string json = db->ToJson();
  const bool written = write(fd, json.data(), json.size()) == static_cast<ssize_t>(json.size());
  close(fd);
  if (!written) {
    unlink(json_path);
    return absl::InternalError("db plot: cannot write a temporary file");
  }
  // The interpreter kreg was built for, isolated (-I: no current folder,
  // PYTHONPATH or user site on its path, so nothing planted there runs as
  // the caller), given kreg's own package beside its library (the build
  // tree's python/, or where it is installed) before its site packages.
  const std::string package = absl::StrCat(InstallPrefix(), "/python:", InstallPrefix(), "/", KREG_PYTHON_SUBDIR);
  static constexpr char kBoot[] =
      "import runpy, sys\n"
      "sys.path[:0] = [p for p in sys.argv[1].split(':') if p]\n"
      "sys.argv = ['kreg.plot'] + sys.argv[2:]\n"
      "try:\n"
      "    import kreg\n"
      "except ImportError as e:\n"
      "    sys.exit('kreg db plot: cannot import kreg (' + str(e) + '): it needs kreg built with Python')\n"
      "runpy.run_module('kreg.plot', run_name='__main__', alter_sys=True)\n";
  std::vector<std::string> args = {KREG_PYTHON_EXECUTABLE, "-I", "-c", kBoot, package, json_path, "--out",
                                   flags.out_dir, "--name", flags.file_a, "--prog", "kreg db plot"};
  if (!flags.key_filter.empty()) args.insert(args.end(), {"--key", flags.key_filter});
  std::cout << std::flush;
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  const bool waited = pid > 0 && waitpid(pid, &status, 0) == pid;
  unlink(json_path);
  if (!waited) return absl::InternalError("db plot: cannot start Python");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return absl::FailedPreconditionError(absl::StrCat("db plot needs Python 3 (", KREG_PYTHON_EXECUTABLE,
                                                      ") with kreg's Python package and matplotlib"));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;  // kreg.plot said why, in one line
}

}  // namespace

absl::StatusOr<int> Db(const Flags& flags) {
  const std::string& verb = flags.command;
  if (verb == "db show" || verb == "db export") {
    absl::StatusOr<TuningDb> db = LoadTable(flags, flags.file_a);
    if (!db.ok()) return db.status();
    std::cout << ValidUtf8(verb == "db show" ? db->Summary()
                           : flags.json   ? db->ToJson()
                           : flags.csv    ? db->ToCsv()
                                          : db->ToText());
    return 0;
  }
  if (verb == "db plot") return Plot(flags);
  if (verb == "db merge") {
    TuningDb merged;
    for (const std::string& in : flags.files) {
      absl::StatusOr<TuningDb> db = LoadTable(flags, in);
      if (!db.ok()) return db.status();
      merged.MergeFrom(*db, TuningDb::Ties::kCanonical);  // the same table whatever the order of IN...
    }
    if (absl::Status s = merged.SaveMerged(flags.file_a); !s.ok()) {
      if (s.code() == absl::StatusCode::kDataLoss) return absl::InvalidArgumentError(s.message());
      return s;
    }
    std::cout << ValidUtf8(absl::StrCat("merged ", flags.files.size(), " tables into ", flags.file_a, " (",
                                        merged.size(), " problems)\n"));
    return 0;
  }
  if (verb == "db diff") {
    absl::StatusOr<TuningDb> a = LoadTable(flags, flags.file_a);
    if (!a.ok()) return a.status();
    absl::StatusOr<TuningDb> b = LoadTable(flags, flags.file_b);
    if (!b.ok()) return b.status();
    const std::string diff = TuningDb::Diff(*a, *b);
    std::cout << (diff.empty() ? "the winners agree everywhere\n" : ValidUtf8(diff));
    return diff.empty() ? 0 : 1;
  }
  if (verb == "db slim") {
    absl::StatusOr<TuningDb> db = LoadTable(flags, flags.file_a);
    if (!db.ok()) return db.status();
    SaveOptions options;
    options.best_per_variant = true;
    if (absl::Status s = db->Save(flags.file_b, options); !s.ok()) return s;
    std::cout << ValidUtf8(absl::StrCat("wrote ", flags.file_b, ": ", db->size(),
                                        " problems, the fastest trial of each variant (per choice combination) kept\n"));
    return 0;
  }
  return absl::InvalidArgumentError("give one of: show FILE, export FILE, merge OUT IN..., diff A B, slim IN OUT");
}

}  // namespace kreg::cli
