// kreg tune, kreg query and kreg db: the tuner's command line.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kreg/autotune.h"
#include "kreg/lut.h"
#include "kreg/worker.h"
#include "tools/cli.h"
#include "tools/json.h"

namespace kreg {
namespace {

std::atomic<bool> interrupted{false};
void OnInterrupt(int) { interrupted = true; }

constexpr char kToolVersion[] = "kreg " KREG_VERSION;

// One progress line, rewritten in place on a terminal, plain lines otherwise
// (and then only every few seconds), on stderr so results on stdout stay
// clean.
class Progress {
 public:
  Progress() : tty_(isatty(2)) {}
  void Update(const std::string& text, bool force = false) {
    const auto now = std::chrono::steady_clock::now();
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", text.c_str());
    } else if (force || now - last_ > std::chrono::seconds(5)) {
      std::fprintf(stderr, "%s\n", text.c_str());
      last_ = now;
    }
    std::fflush(stderr);
  }
  void Done() {
    if (tty_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool tty_;
  std::chrono::steady_clock::time_point last_{};
};

tuning::Trial::Status ToProto(TrialStatus s) {
  switch (s) {
    case TrialStatus::kOk:
      return tuning::Trial::OK;
    case TrialStatus::kWrongResult:
      return tuning::Trial::WRONG_RESULT;
    case TrialStatus::kCrashed:
      return tuning::Trial::CRASHED;
    case TrialStatus::kTimedOut:
      return tuning::Trial::TIMED_OUT;
    case TrialStatus::kIllegal:
      return tuning::Trial::ILLEGAL;
    case TrialStatus::kError:
      return tuning::Trial::ERROR;
  }
  return tuning::Trial::ERROR;
}

TrialStatus FromProto(tuning::Trial::Status s) {
  switch (s) {
    case tuning::Trial::OK:
      return TrialStatus::kOk;
    case tuning::Trial::WRONG_RESULT:
      return TrialStatus::kWrongResult;
    case tuning::Trial::CRASHED:
      return TrialStatus::kCrashed;
    case tuning::Trial::TIMED_OUT:
      return TrialStatus::kTimedOut;
    case tuning::Trial::ILLEGAL:
      return TrialStatus::kIllegal;
    default:
      return TrialStatus::kError;
  }
}

std::string Ms(double ns) { return absl::StrFormat("%.3f ms", ns / 1e6); }

absl::StatusOr<TuningDb> LoadOrEmpty(const std::string& path) {
  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  if (db.status().code() == absl::StatusCode::kNotFound) return TuningDb();
  return db;
}

absl::Status OneArg(const Args& args, absl::string_view command) {
  if (args.size() != 1) return absl::InvalidArgumentError(absl::StrCat(command, " takes one op, e.g. topk"));
  return absl::OkStatus();
}

// Tunes one problem into `db`, checkpointing to `path` after every result.
absl::Status TuneOne(const ProblemSpec& spec, const Registry& registry, TuningDb& db, const std::string& path) {
  const Op& op = *spec.op;
  // Shape-only arguments for the key and legality; the worker builds the
  // real inputs. The data class of generated inputs needs a real problem.
  ShapeArgs shape;
  if (absl::Status s = ShapeArgsOf(spec, &shape); !s.ok()) return s;
  std::string data_class;
  if (op.has_data_class() && absl::GetFlag(FLAGS_data_class).empty()) {
    absl::StatusOr<std::unique_ptr<Problem>> real = Problem::Make(spec.op, nullptr, spec.values, spec.options);
    if (!real.ok()) return real.status();
    absl::StatusOr<std::string> d = DataClassOf(spec, *(*real)->args());
    if (!d.ok()) return d.status();
    data_class = *d;
  } else {
    absl::StatusOr<std::string> d = DataClassOf(spec, *shape.args());
    if (!d.ok()) return d.status();
    data_class = *d;
  }
  const OpKey op_key = op.KeyOf(*shape.args());
  const tuning::ProblemKey key = MakeProblemKey(op.name(), op_key.dtype, op_key.dims, ThisMachine().id(), data_class);

  std::vector<std::string> wanted = absl::StrSplit(absl::GetFlag(FLAGS_variants), ',', absl::SkipEmpty());
  for (const std::string& v : wanted) {
    absl::StatusOr<std::shared_ptr<const Kernel>> k = registry.Get(absl::StrCat(op.name(), "/", v));
    if (!k.ok()) return absl::InvalidArgumentError(absl::StrCat("--variants: ", k.status().message()));
  }
  struct Candidate {
    std::shared_ptr<const Kernel> kernel;
    Config config;
  };
  std::vector<Candidate> candidates;
  SpaceOptions space;
  space.max_list_len = absl::GetFlag(FLAGS_max_list_len);
  for (const std::shared_ptr<const Kernel>& kernel : registry.Kernels(op.name())) {
    if (!kernel->available()) continue;
    // The reference is the oracle, not a contender, unless asked for.
    if (wanted.empty() ? kernel->is_reference()
                       : std::find(wanted.begin(), wanted.end(), kernel->variant()) == wanted.end()) {
      continue;
    }
    for (Config& c : EnumerateSpace(*kernel, *shape.args(), space)) candidates.push_back({kernel, std::move(c)});
  }
  if (candidates.empty()) return absl::NotFoundError(absl::StrCat("no available ", op.name(), " kernel to tune"));

  WorkerJob job;
  job.op = op.name();
  for (const auto& [name, dtype] : spec.options.dtypes) job.dtypes.emplace_back(name, DTypeName(dtype));
  job.with.assign(spec.options.with.begin(), spec.options.with.end());
  for (size_t i = 0; i < op.dims().size(); ++i) {
    if (spec.values.dims[i] >= 0) job.values.emplace_back(op.dims()[i].name, absl::StrCat(spec.values.dims[i]));
  }
  for (size_t i = 0; i < op.attrs().size(); ++i) {
    const kreg_scalar v = spec.values.attrs[i];
    job.values.emplace_back(op.attrs()[i].name, op.attrs()[i].is_float ? absl::StrCat(v.f) : absl::StrCat(v.i));
  }
  job.dist = spec.options.dist;
  job.partition = spec.options.partition;
  job.seed = spec.options.seed;
  job.input_files = spec.files;
  for (const PluginInfo& p : registry.Plugins()) job.plugins.push_back(p.path);
  job.warmup = absl::GetFlag(FLAGS_warmup);
  job.threads = absl::GetFlag(FLAGS_threads);
  // This very binary, even if the file is replaced during the sweep.
  IsolatedRunner runner({"/proc/self/exe", "__worker"}, job, absl::GetFlag(FLAGS_timeout));
  runner.set_stop(&interrupted);

  absl::StatusOr<Strategy> strategy = ParseStrategy(absl::GetFlag(FLAGS_strategy));
  if (!strategy.ok()) return strategy.status();
  SearchOptions search;
  search.strategy = *strategy;
  search.reps = absl::GetFlag(FLAGS_reps);
  search.budget_seconds = absl::GetFlag(FLAGS_budget);
  search.seed = spec.options.seed;
  search.stop = &interrupted;

  const std::string title = KeyString(key);
  Progress progress;
  int measured = 0, reused = 0, failed = 0;
  std::vector<char> seen(candidates.size(), 0);
  size_t done = 0;  // distinct candidates measured at least once
  double best_ns = 0;
  std::string best_name;
  const auto start = std::chrono::steady_clock::now();
  absl::Status save_error;
  MeasureFn measure = [&](size_t i, int reps) -> Measurement {
    const Candidate& c = candidates[i];
    const tuning::Config proto_config = ToProtoConfig(*c.kernel, c.config);
    const std::string variant(c.kernel->variant());
    Measurement m;
    // Resume: a stored result of this (variant, version, config) is reused;
    // only full measurements and failures are ever stored.
    if (const tuning::Trial* t = db.FindTrial(key, variant, c.kernel->version(), proto_config); t != nullptr) {
      m.status = FromProto(t->status());
      m.median_ns = t->median_ns();
      m.min_ns = t->min_ns();
      m.max_ns = t->max_ns();
      m.reps = reps;
      m.error = t->error();
      ++reused;
    } else {
      m = runner.Measure(c.kernel->name(), c.kernel->ConfigPairs(c.config), reps);
      if (interrupted) return m;  // a candidate cut short by Ctrl-C is not a result
      ++measured;
      if (!m.ok()) ++failed;
      // Full measurements and the candidate's own failures are results;
      // kError (the worker could not be started or set up, a kernel error)
      // is not kept, so a later run tries again.
      const bool full = m.ok() && reps >= search.reps;
      if (full || (!m.ok() && m.status != TrialStatus::kError)) {
        tuning::Trial trial;
        trial.set_variant(variant);
        trial.set_variant_version(c.kernel->version());
        *trial.mutable_config() = proto_config;
        trial.set_median_ns(m.median_ns);
        trial.set_min_ns(m.min_ns);
        trial.set_max_ns(m.max_ns);
        trial.set_reps(m.reps);
        trial.set_status(ToProto(m.status));
        trial.set_error(m.error);
        trial.set_measured_at(std::time(nullptr));
        db.AddTrial(key, trial);
        // Checkpoint: a sweep killed now resumes from here.
        if (absl::Status s = db.SaveMerged(path); !s.ok() && save_error.ok()) save_error = s;
      }
    }
    if (!seen[i]) {
      seen[i] = 1;
      ++done;
    }
    if (m.ok() && (best_name.empty() || m.median_ns < best_ns)) {
      best_ns = m.median_ns;
      best_name = absl::StrCat(c.kernel->name(), " ", c.kernel->ConfigString(c.config));
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Exhaustive: by the pace so far; random and halving: by the budget.
    const double eta = search.strategy == Strategy::kExhaustive
                           ? elapsed / static_cast<double>(done) * static_cast<double>(candidates.size() - done)
                       : search.budget_seconds > 0 ? std::max(0.0, search.budget_seconds - elapsed)
                                                   : -1;
    progress.Update(absl::StrFormat("[%d/%d] %s  best so far %s  %.0f s%s", done, candidates.size(), title,
                                    best_name.empty() ? "-" : absl::StrCat(best_name, " ", Ms(best_ns)), elapsed,
                                    eta >= 0 ? absl::StrFormat(", ETA %.0f s", eta) : std::string()));
    return m;
  };
  Search(candidates.size(), measure, search);
  progress.Done();
  if (!save_error.ok()) return save_error;
  if (interrupted) {
    return absl::CancelledError(absl::StrCat("interrupted; every finished measurement is in ", path,
                                             "; run the same command again to resume"));
  }
  db.SetTuningInfo(key, kToolVersion, StrategyName(search.strategy), std::time(nullptr));
  if (absl::Status s = db.SaveMerged(path); !s.ok()) return s;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const tuning::Entry* entry = db.FindEntry(key);
  std::string best = "no candidate succeeded";
  if (entry != nullptr && entry->has_best()) {
    best = absl::StrCat(op.name(), "/", entry->best().variant(), " ", ConfigText(entry->best().config()), "  ",
                        Ms(entry->best().median_ns()));
    if (entry->has_runner_up()) {
      absl::StrAppend(&best, "  (runner-up ", op.name(), "/", entry->runner_up().variant(), " ",
                      Ms(entry->runner_up().median_ns()), ")");
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Json::Object().Set("key", title).Set("best", best).Set("candidates", static_cast<int64_t>(candidates.size()))
                     .Set("measured", static_cast<int64_t>(measured)).Set("reused", static_cast<int64_t>(reused))
                     .Set("failed", static_cast<int64_t>(failed)).Set("seconds", elapsed).Dump()
              << "\n";
  } else {
    std::cout << absl::StrFormat("%s: %s\n    %d candidates, %d measured, %d reused, %d failed, %.1f s, %s\n", title,
                                 best, candidates.size(), measured, reused, failed, elapsed,
                                 StrategyName(search.strategy));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Tune(const Args& args) {
  if (absl::Status s = OneArg(args, "tune"); !s.ok()) return s;
  const std::string path = absl::GetFlag(FLAGS_db);
  if (path.empty()) return absl::InvalidArgumentError("tune needs --db FILE");
  if (absl::GetFlag(FLAGS_reps) < 1 || absl::GetFlag(FLAGS_timeout) <= 0 || absl::GetFlag(FLAGS_max_list_len) < 1) {
    return absl::InvalidArgumentError("--reps, --timeout and --max_list_len must be positive");
  }
  if (absl::Status s = ParseStrategy(absl::GetFlag(FLAGS_strategy)).status(); !s.ok()) return s;
  if (absl::GetFlag(FLAGS_dims).items.empty()) return absl::InvalidArgumentError("tune needs at least one --dims");
  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry();
  if (!registry.ok()) return registry.status();
  std::vector<ProblemSpec> specs;
  for (const std::string& d : absl::GetFlag(FLAGS_dims).items) {
    absl::StatusOr<ProblemSpec> spec = SpecFromFlags(**registry, args[0], d);
    if (!spec.ok()) return spec.status();
    specs.push_back(*std::move(spec));
  }
  absl::StatusOr<TuningDb> db = LoadOrEmpty(path);
  if (!db.ok()) return db.status();
  db->AddMachine(ThisMachine());
  struct sigaction action {};
  action.sa_handler = OnInterrupt;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  for (const ProblemSpec& spec : specs) {
    if (absl::Status s = TuneOne(spec, **registry, *db, path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Query(const Args& args) {
  if (absl::Status s = OneArg(args, "query"); !s.ok()) return s;
  const std::string path = absl::GetFlag(FLAGS_db);
  if (path.empty()) return absl::InvalidArgumentError("query needs --db FILE");
  if (absl::GetFlag(FLAGS_dims).items.empty()) return absl::InvalidArgumentError("query needs --dims");
  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry();
  if (!registry.ok()) return registry.status();
  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  if (!db.ok()) return db.status();
  absl::StatusOr<Lut> lut = Lut::Build(*db, **registry);
  if (!lut.ok()) return lut.status();
  for (const std::string& w : lut->warnings()) std::cerr << "kreg: warning: " << w << "\n";
  for (const std::string& d : absl::GetFlag(FLAGS_dims).items) {
    absl::StatusOr<ProblemSpec> spec = SpecFromFlags(**registry, args[0], d);
    if (!spec.ok()) return spec.status();
    // The key comes from arguments, as for tune and dispatch: shape-only ones.
    ShapeArgs shape;
    if (absl::Status s = ShapeArgsOf(*spec, &shape); !s.ok()) return s;
    const OpKey key = spec->op->KeyOf(*shape.args());
    absl::StatusOr<std::string> data_class = DataClassOf(*spec, *shape.args());
    if (!data_class.ok()) return data_class.status();
    absl::StatusOr<LutAnswer> a = lut->Query(spec->op->name(), key.dtype, key.dims, ThisMachine().id(), *data_class);
    if (!a.ok()) return a.status();
    for (const std::string& w : a->warnings) std::cerr << "kreg: warning: " << w << "\n";
    const std::string config = a->kernel->ConfigString(*a->config);
    if (absl::GetFlag(FLAGS_json)) {
      Json dims = Json::Object();
      for (const auto& [n, v] : key.dims) dims.Set(n, v);
      Json params = Json::Object();
      for (const auto& [n, v] : a->kernel->ConfigPairs(*a->config)) params.Set(n, v);
      Json out = Json::Object();
      out.Set("op", spec->op->name()).Set("dtype", key.dtype).Set("dims", std::move(dims))
          .Set("kernel", a->kernel->name()).Set("params", std::move(params)).Set("match", std::string(MatchName(a->match)));
      if (a->tuned_dims != nullptr) {
        Json tuned = Json::Object();
        for (const auto& [n, v] : *a->tuned_dims) tuned.Set(n, v);
        out.Set("tuned_dims", std::move(tuned)).Set("distance", a->distance);
      }
      if (a->trial != nullptr) out.Set("median_ns", static_cast<int64_t>(a->trial->median_ns()));
      std::cout << out.Dump() << "\n";
    } else {
      std::cout << absl::StrFormat("%s %s %s -> %s%s%s  [%s%s]\n", spec->op->name(), key.dtype, DimsString(key.dims),
                                   a->kernel->name(), config.empty() ? "" : " ", config, MatchName(a->match),
                                   a->tuned_dims ? absl::StrCat(" from ", DimsString(*a->tuned_dims), ", ",
                                                                a->trial ? Ms(a->trial->median_ns()) : "")
                                                 : std::string());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TableChoice> ChooseFromTable(const ProblemSpec& spec, const Registry& registry,
                                            const kreg_args& args) {
  absl::StatusOr<TuningDb> db = TuningDb::Load(absl::GetFlag(FLAGS_db));
  if (!db.ok()) return db.status();
  absl::StatusOr<Lut> lut = Lut::Build(*db, registry);
  if (!lut.ok()) return lut.status();
  const OpKey key = spec.op->KeyOf(args);
  absl::StatusOr<std::string> data_class = DataClassOf(spec, args);
  if (!data_class.ok()) return data_class.status();
  absl::StatusOr<LutAnswer> a = lut->Query(spec.op->name(), key.dtype, key.dims, ThisMachine().id(), *data_class);
  if (!a.ok()) return a.status();
  for (const std::string& w : a->warnings) std::cerr << "kreg: warning: " << w << "\n";
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry.Get(a->kernel->name());
  if (!kernel.ok()) return kernel.status();
  return TableChoice{*kernel, *a->config, std::string(MatchName(a->match))};
}

absl::Status Db(const Args& args) {
  auto usage = absl::InvalidArgumentError(
      "db takes: show FILE | export FILE | merge OUT IN... | diff A B");
  if (args.empty()) return usage;
  const std::string verb = args[0];
  if ((verb == "show" || verb == "export") && args.size() == 2) {
    absl::StatusOr<TuningDb> db = TuningDb::Load(args[1]);
    if (!db.ok()) return db.status();
    std::cout << (verb == "show" ? db->Summary() : db->ToText());
    return absl::OkStatus();
  }
  if (verb == "merge" && args.size() >= 3) {
    TuningDb merged;
    for (size_t i = 2; i < args.size(); ++i) {
      absl::StatusOr<TuningDb> db = TuningDb::Load(args[i]);
      if (!db.ok()) return db.status();
      merged.MergeFrom(*db);
    }
    if (absl::Status s = merged.SaveMerged(args[1]); !s.ok()) return s;
    std::cout << "merged " << args.size() - 2 << " tables into " << args[1] << " (" << merged.size() << " problems)\n";
    return absl::OkStatus();
  }
  if (verb == "diff" && args.size() == 3) {
    absl::StatusOr<TuningDb> a = TuningDb::Load(args[1]);
    if (!a.ok()) return a.status();
    absl::StatusOr<TuningDb> b = TuningDb::Load(args[2]);
    if (!b.ok()) return b.status();
    const std::string diff = TuningDb::Diff(*a, *b);
    std::cout << (diff.empty() ? "the winners agree everywhere\n" : diff);
    return absl::OkStatus();
  }
  return usage;
}

}  // namespace kreg
