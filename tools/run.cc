// kreg run: one kernel (OP/VARIANT), or what a tuning table chooses (OP
// --db FILE), run on built inputs, timed as the tuner times, and checked
// against the op's reference; on the CPU, on a GPU (--device cuda), or on a
// collective's ranks (threads of this process, or an MPI job's processes).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/dispatch.h"
#include "kreg/limits.h"
#include "kreg/measure.h"
#include "kreg/npy.h"
#include "kreg/op.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "kreg/text.h"
#include "tools/binders.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace kreg::cli {
namespace {

// A run from the flags to its measurements. Members are destroyed in
// reverse order: the problems before the ranks and the device they were
// made on, the registry (the kernels' plugins) last.
struct RunState {
  Flags flags;             // under mpirun, with the job's nodes
  std::string name;        // the kernel as reported: OP/VARIANT as given, or the table's choice
  bool from_table = false;  // OP --db FILE: the table chooses
  std::unique_ptr<Registry> registry;
  ProblemSpec spec;
  std::shared_ptr<const Kernel> kernel;
  Config config;
  int threads = 0;          // per run; the table's answer may ask for fewer
  std::string how;          // how the table chose (AnswerHow's), or ""
  Json chosen_by = nullptr;  // the table's answer record
  std::unique_ptr<Device> device;  // a device kernel's GPU, or null
  std::vector<std::unique_ptr<Comm>> comms;  // a collective's ranks in this process
  int first_rank = 0;
  std::vector<std::unique_ptr<Problem>> problems;  // one per rank in this process
  std::vector<Measurement> measured;
};

// The flags checked against each other, the registry loaded, the problem
// read, the kernel found (OP/VARIANT: before the inputs are built, so an
// unknown variant is found at once) and --device opened.
absl::Status Prepare(RunState& run) {
  const Flags& flags = run.flags;
  if (run.from_table && flags.db.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", run.name, "' is not OP/VARIANT (e.g. topk/sort); "
                                                   "give --db FILE to let a tuning table choose"));
  }
  if (flags.dims.size() > 1) return absl::InvalidArgumentError("run takes one --dims");
  if (!run.from_table && (!flags.db.empty() || !flags.data_class.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(flags.db.empty() ? "--data-class" : "--db",
                                                   " applies to 'kreg run OP --db FILE' (a table's choice), not to "
                                                   "OP/VARIANT"));
  }
  auto params = Pairs(flags.params, "param");
  if (!params.ok()) return params.status();
  if (run.from_table && !params->empty()) {
    return absl::InvalidArgumentError("--param applies to OP/VARIANT, not to a table's choice");
  }

  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry(flags);
  if (!registry.ok()) return registry.status();
  run.registry = *std::move(registry);
  absl::StatusOr<ProblemSpec> spec = SpecFromFlags(flags, *run.registry, run.name.substr(0, run.name.find('/')),
                                                   flags.dims.empty() ? "" : flags.dims[0]);
  if (!spec.ok()) return spec.status();
  run.spec = *std::move(spec);
  run.threads = flags.threads;
  if (!run.from_table) {
    absl::StatusOr<std::shared_ptr<const Kernel>> k = run.registry->Get(run.name);
    if (!k.ok()) return absl::InvalidArgumentError(k.status().message());
    run.kernel = *k;
    absl::StatusOr<Config> c = run.kernel->ParseConfig(*params);
    if (!c.ok()) return absl::InvalidArgumentError(c.status().message());
    run.config = *c;
  }
  // A device kernel runs on the GPU, its problem made here and copied over.
  absl::StatusOr<DeviceKind> device = DeviceOf(flags);
  if (!device.ok()) return device.status();
  if (*device == DeviceKind::kCuda) {
    if (run.spec.op->collective()) {
      return absl::InvalidArgumentError("--device cuda: collective ops run on the CPU's ranks");
    }
    absl::StatusOr<std::unique_ptr<Device>> opened = OpenCuda();
    if (!opened.ok()) return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", opened.status().message()));
    run.device = *std::move(opened);
  }
  return absl::OkStatus();
}

// Collectives run on every rank at once: each builds its own problem (its
// inputs seeded by its rank) and they measure together; rank 0 reports.
// Ranks are threads of this process (--ranks N, or --mesh's size), or this
// process is one rank of an MPI job (--backend mpi under mpirun; then
// flags.nodes is the job's). None for other ops.
absl::Status OpenRanks(RunState& run) {
  const Op& op = *run.spec.op;
  CommOptions comm_options;
  comm_options.timeout_seconds = run.flags.comm_timeout;
  comm_options.mesh = run.spec.mesh;
  // --mesh without --ranks: the mesh's size.
  const int thread_ranks = run.flags.ranks > 0 || run.spec.mesh.empty() || !op.collective()
                               ? run.flags.ranks
                               : static_cast<int>(run.spec.values.dims[op.ranks_dim()]);
  absl::StatusOr<CommBackend> backend = BackendOf(run.flags);
  if (!backend.ok()) return backend.status();
  if (*backend == CommBackend::kMpi && !op.collective()) {
    return absl::InvalidArgumentError(absl::StrCat("--backend mpi: ", op.name(), " is not a collective op"));
  }
  if (*backend == CommBackend::kThreads && thread_ranks > 0) {
    if (absl::Status s = limits::CheckThreadRanks(thread_ranks, "--mesh's size"); !s.ok()) return s;
  }
  absl::StatusOr<std::vector<std::unique_ptr<Comm>>> opened =
      OpenComms(*backend, *backend == CommBackend::kMpi ? run.flags.ranks : thread_ranks, comm_options);
  if (!opened.ok()) return opened.status();
  run.comms = *std::move(opened);
  if (*backend == CommBackend::kMpi) {
    run.flags.nodes = run.comms.front()->nodes();
  } else if (thread_ranks == 0 && op.collective()) {
    return absl::InvalidArgumentError(absl::StrCat(op.name(), " is a collective op: give --ranks N"));
  }
  return absl::OkStatus();
}

// A collective's table choice: one rank reads the table and every rank runs
// its answer, so ranks whose tables or machines differ cannot pick different
// algorithms and deadlock. REQUIRES: run.comms is not empty.
absl::Status ChooseForRanks(RunState& run) {
  Comm& comm = *run.comms[0];
  std::string choice_text;  // rank 0's choice: "kernel\nNAME=VALUE\n..."
  if (comm.rank() == 0) {
    ShapeArgs shape;
    absl::Status shaped = ShapeArgsOf(run.spec, &shape);
    absl::StatusOr<TableChoice> choice = shaped.ok()
                                             ? ChooseFromTable(run.flags, run.spec, *run.registry, *shape.args())
                                             : absl::StatusOr<TableChoice>(shaped);
    if (!choice.ok()) {
      comm.Abort(choice.status().message());  // the other ranks wait for the choice
      return choice.status();
    }
    run.kernel = choice->kernel;
    run.config = choice->config;
    run.how = choice->how;
    run.chosen_by = std::move(choice->answer);
    choice_text = run.kernel->name();
    for (const auto& [param, value] : run.kernel->ConfigPairs(run.config)) {
      absl::StrAppend(&choice_text, "\n", param, "=", value);
    }
  }
  if (run.comms.size() == 1 && comm.size() > 1) {  // an MPI job: rank 0 tells the others
    if (absl::Status s = comm.Broadcast(&choice_text); !s.ok()) return s;
    const std::vector<std::string> lines = absl::StrSplit(choice_text, '\n');
    absl::StatusOr<std::shared_ptr<const Kernel>> k = run.registry->Get(lines[0]);
    if (!k.ok()) return k.status();
    std::vector<std::pair<std::string, std::string>> pairs;
    for (size_t i = 1; i < lines.size(); ++i) {
      const std::vector<std::string> kv = absl::StrSplit(lines[i], absl::MaxSplits('=', 1));
      pairs.emplace_back(kv[0], kv.size() > 1 ? kv[1] : "");
    }
    absl::StatusOr<Config> c = (*k)->ParseConfig(pairs);
    if (!c.ok()) return c.status();
    run.kernel = *k;
    run.config = *c;
  }
  run.name = run.kernel->name();
  return absl::OkStatus();
}

// Each rank's problem made and its kernel measured (one problem off the
// ranks; a table's choice for it made from its arguments).
absl::Status MeasureAll(RunState& run) {
  const Flags& flags = run.flags;
  run.first_rank = run.comms.empty() ? 0 : run.comms[0]->rank();
  run.problems.resize(std::max<size_t>(run.comms.size(), 1));
  run.measured.resize(run.problems.size());
  auto make_problem = [&](Comm* comm) -> absl::Status {
    ProblemOptions options = run.spec.options;
    if (comm != nullptr) options.comm = comm->abi();
    absl::StatusOr<std::unique_ptr<Problem>> problem =
        Problem::Make(run.spec.op, run.registry->Reference(run.spec.op->name()), run.spec.values, options);
    if (!problem.ok()) return problem.status();
    run.problems[comm != nullptr ? comm->rank() - run.first_rank : 0] = *std::move(problem);
    return absl::OkStatus();
  };
  // Composite ops (a kernel running another op: sharded_matmul's local
  // multiplies) get their sub-ops run by a dispatcher: the --db table's
  // choice, else each op's default.
  absl::StatusOr<TuningDb> sub_table = flags.db.empty() ? TuningDb() : LoadTable(flags, flags.db);
  if (!sub_table.ok()) return sub_table.status();
  absl::StatusOr<Dispatcher> dispatcher = Dispatcher::Create(*run.registry, *sub_table);
  if (!dispatcher.ok()) return dispatcher.status();
  RunOptions sub_options;
  sub_options.num_threads = flags.threads;
  auto measure = [&](Comm* comm) {
    const int rank = comm != nullptr ? comm->rank() - run.first_rank : 0;
    MeasureOptions options;
    options.run.dispatch = [&](absl::string_view sub_op, const kreg_args& args) {
      return dispatcher->Run(sub_op, args, sub_options).status();
    };
    options.warmup = flags.warmup;
    options.reps = flags.reps;
    options.check = flags.check;
    options.run.num_threads = run.threads;
    options.comm = comm;
    options.device = run.device.get();
    options.cold = !flags.warm;
    run.measured[rank] = MeasureKernel(*run.kernel, run.config, {run.problems[rank].get()}, options);
  };
  if (!run.comms.empty()) {
    return RunRanks(run.comms, [&](Comm& c) {
      absl::Status made = make_problem(&c);
      if (made.ok()) measure(&c);
      return made;
    });
  }
  if (absl::Status s = make_problem(nullptr); !s.ok()) return s;
  if (run.from_table) {
    absl::StatusOr<TableChoice> choice = ChooseFromTable(flags, run.spec, *run.registry, *run.problems[0]->args());
    if (!choice.ok()) return choice.status();
    run.kernel = choice->kernel;
    run.config = choice->config;
    run.how = choice->how;
    run.chosen_by = std::move(choice->answer);
    run.name = run.kernel->name();
    if (choice->threads > 0 && (run.threads == 0 || choice->threads < run.threads)) run.threads = choice->threads;
  }
  measure(nullptr);
  return absl::OkStatus();
}

// --save-outputs: each output as DIR/NAME.npy (a collective's per rank:
// DIR/NAME.rankR.npy).
absl::Status SaveOutputs(const RunState& run) {
  const std::string& dir = run.flags.save_outputs;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("--save-outputs: cannot create '", dir, "': ", ec.message()));
  }
  for (size_t r = 0; r < run.problems.size(); ++r) {
    const std::string suffix = run.comms.empty() ? ".npy" : absl::StrCat(".rank", run.first_rank + r, ".npy");
    for (const auto& [out_name, tensor] : run.problems[r]->outputs()) {
      if (absl::Status s = WriteNpy(absl::StrCat(dir, "/", out_name, suffix), *tensor); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// Rank 0's (or the one problem's) line or JSON record on stdout.
void Report(const RunState& run) {
  const Flags& flags = run.flags;
  const Problem& p = *run.problems[0];
  const Measurement& m = run.measured[0];
  const bool failed_check = m.status == TrialStatus::kWrongResult;
  const Device* device = run.device.get();
  const OpKey key = p.key();
  std::string data_class;
  if (absl::StatusOr<std::string> d = DataClassOf(flags, run.spec, *p.args()); d.ok()) data_class = *d;
  if (flags.json) {
    Json out = Json::object();
    out["key"] = KeyJson(MakeProblemKey(run.spec.op->name(), key,
                                        device != nullptr ? MachineOf(device->info()).id() : ThisMachine().id(),
                                        data_class));
    out["kernel"] = Str(run.name);
    out["version"] = run.kernel->version();
    out["params"] = ParamsJson(ToProtoConfig(*run.kernel, run.config));
    out["median_ns"] = Ns(m.median_ns);
    out["min_ns"] = Ns(m.min_ns);
    out["max_ns"] = Ns(m.max_ns);
    out["reps"] = m.reps;
    out["check"] = !flags.check ? "skipped" : failed_check ? "failed" : "ok";
    out["error"] = failed_check ? Str(m.error) : Json(nullptr);
    out["chosen_by"] = run.chosen_by;
    // On a GPU: which, and how it was timed.
    out["device"] = device != nullptr ? Str(MachineSummary(MachineOf(device->info()))) : Json(nullptr);
    out["timing"] = TimingName(flags);
    std::cout << Dump(out) << "\n";
  } else {
    const std::string config_text = run.kernel->ConfigString(run.config);
    std::cout << ValidUtf8(absl::StrFormat(
        "%s %s %s%s%s  median %.3f us  min %.3f us  max %.3f us  check %s%s%s\n", run.name, key.dtype,
        DimsString(key.dims), config_text.empty() ? "" : "  ", config_text, m.median_ns / 1e3, m.min_ns / 1e3,
        m.max_ns / 1e3, !flags.check ? "skipped" : failed_check ? absl::StrCat("FAILED: ", m.error) : "ok",
        run.how.empty() ? "" : absl::StrCat("  (chosen by the table: ", run.how, ")"),
        device == nullptr ? "" : absl::StrCat("  on ", device->info().name, " (", TimingName(flags), ")")));
  }
  std::cout.flush();
}

}  // namespace

void SetupRun(CLI::App* run, HelpFormatter& help, Flags& f) {
  help.Set(run, {"kreg run OP/VARIANT [--dims NAME=V,...] [flags]\nkreg run OP --db FILE [--dims NAME=V,...] [flags]",
                 "Builds the problem's inputs (random, or from .npy files), prepares the kernel, runs it --warmup "
                 "times, then times up to --reps runs (the tuner's measurement) and prints the median, min and max. "
                 "--check compares the outputs with the op's reference kernel. With OP and --db, a tuning table "
                 "chooses the kernel and its parameters.",
                 "kreg run topk/sort --dims batch=8,n=1000,k=10 --check\n"
                 "kreg run topk/sort --dims batch=64,n=32768,k=2048 --dtype bf16 --param method=nth_element\n"
                 "kreg run topk/sort --dims k=64 --input input=logits.npy --save-outputs out/ --check\n"
                 "kreg run topk --db topk.lut --dims batch=48,n=40000,k=64 --check\n"
                 "kreg run allreduce/ring --ranks 5 --dims count=1000000 --check\n"
                 "mpirun -n 3 kreg run allreduce/ring --backend mpi --dims count=1000 --check"});
  run->add_option("KERNEL", f.target, "OP/VARIANT to run (kreg list shows them), or OP with --db")->required();
  AddDims(run, f, "the op's dims and attributes, e.g. batch=8,n=1000,k=10; dims an --input gives may be left out");
  AddDtype(run, f);
  AddWith(run, f);
  run->add_option("--param", f.params, "a kernel parameter (lists as 5,8,12); the others keep their defaults; repeatable")
      ->option_text("NAME=V")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  AddInput(run, f);
  run->add_option("--save-outputs,--save_outputs", f.save_outputs,
                  "write each output to DIR/NAME.npy (a collective's: DIR/NAME.rankR.npy)")
      ->option_text("DIR");
  AddGenerate(run, f);
  AddMeasure(run, f);
  run->add_flag("--check", f.check, "check the outputs against the op's reference kernel");
  AddDevice(run, f,
            "cpu, or cuda: run a CUDA kernel on the GPU (inputs made here, copied over once; timed with CUDA "
            "events, the L2 flushed before each run; outputs copied back for --check); with --db, the table's "
            "answer for the GPU");
  AddComm(run, f);
  run->add_option("--db", f.db, "a tuning table; with OP alone, run what it picks for the problem")->option_text("FILE");
  AddDataClass(run, f, "with --db: the data class to ask the table for (default: the op's classifier on the inputs, "
                       "else dist=NAME for a --dist other than normal)");
  AddTables(run, f);
}

absl::Status Run(const Flags& flags) {
  RunState run;
  run.flags = flags;
  run.name = flags.target;
  run.from_table = run.name.find('/') == std::string::npos;
  if (absl::Status s = Prepare(run); !s.ok()) return s;
  if (absl::Status s = OpenRanks(run); !s.ok()) return s;
  if (!run.comms.empty()) {
    if (absl::Status s = run.spec.op->SetRanks(&run.spec.values, run.comms[0]->size()); !s.ok()) return s;
    if (run.from_table) {
      if (absl::Status s = ChooseForRanks(run); !s.ok()) return s;
    }
  }
  if (absl::Status s = MeasureAll(run); !s.ok()) return s;
  const Measurement& m = run.measured[0];
  const bool failed_check = m.status == TrialStatus::kWrongResult;
  // Under mpirun, a rank that only relays another's failure lets the ranks
  // with a reason of their own say it first: mpirun ends the whole job at
  // the first rank to exit with an error, before the others print.
  if (!m.ok() && m.relayed && run.flags.backend == "mpi") std::this_thread::sleep_for(std::chrono::seconds(1));
  // Unchecked runs fail too where a kernel wrote past a tensor's end.
  if (!m.ok() && (!failed_check || !run.flags.check)) {
    return m.status == TrialStatus::kIllegal ? absl::InvalidArgumentError(m.error) : absl::InternalError(m.error);
  }
  if (!run.flags.save_outputs.empty()) {
    if (absl::Status s = SaveOutputs(run); !s.ok()) return s;
  }
  if (run.first_rank != 0) return absl::OkStatus();  // rank 0 reports
  Report(run);
  if (failed_check) return absl::InternalError("check failed: outputs differ from the reference");
  return absl::OkStatus();
}

}  // namespace kreg::cli
