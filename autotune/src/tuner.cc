// Tune: one problem's sweep, from a request to the table's entry. The
// sweep itself (candidates measured and recorded, the thread round, list
// growth) is sweep.h; sweeps shared across MPI ranks are tune_across.cc.
#include "kreg/tuner.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/limits.h"
#include "kreg/measure.h"
#include "kreg/npy.h"
#include "kreg/worker.h"
#include "sweep.h"

#ifndef KREG_VERSION
#define KREG_VERSION "unknown"
#endif

namespace kreg {

using internal::RankRunner;
using internal::Sweep;

namespace {

// Checks the request; reads its values (the ranks set for a collective)
// and its input files into `options`.
absl::Status ReadRequest(const Op& op, const TuneRequest& request, Values* values, ProblemOptions* options) {
  if (request.search.reps < 1 || request.timeout_seconds <= 0 || request.max_list_len < 1 ||
      request.list_growth_rounds < 0) {
    return absl::InvalidArgumentError("reps, timeout and max list length must be positive");
  }
  if (request.slices < 1 || request.slice < 0 || request.slice >= request.slices) {
    return absl::InvalidArgumentError(absl::StrCat("share ", request.slice, " of ", request.slices,
                                                   ": expected 0 <= slice < slices"));
  }
  absl::StatusOr<Values> parsed = op.ParseValues(request.values);
  if (!parsed.ok()) return parsed.status();
  *values = *std::move(parsed);
  if (request.comm != nullptr) {
    if (request.search.budget_seconds > 0) {
      return absl::InvalidArgumentError("under MPI a sweep takes no budget (the ranks would stop at different times)");
    }
    if (absl::Status s = op.SetRanks(values, request.comm->size()); !s.ok()) return s;
  } else if (request.ranks > 0) {
    if (absl::Status s = op.SetRanks(values, request.ranks); !s.ok()) return s;
  } else if (op.collective()) {
    return absl::InvalidArgumentError(absl::StrCat(op.name(), " is a collective op: give the ranks to tune on"));
  }
  *options = request.options;
  options->inputs.clear();
  for (const auto& [name, path] : request.input_files) {
    absl::StatusOr<Tensor> t = ReadNpy(path);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("input ", name, ": ", t.status().message()));
    options->inputs[name] = *std::move(t);
  }
  return absl::OkStatus();
}

// The key's data class: the request's, else a collective's backend, else
// the op's classifier of the inputs (generated inputs need real arguments).
absl::StatusOr<std::string> KeyDataClass(const std::shared_ptr<const Op>& op_ptr, const TuneRequest& request,
                                         const Values& values, const ProblemOptions& options,
                                         const ShapeArgs& shape) {
  const Op& op = *op_ptr;
  std::string data_class = request.data_class;
  if (data_class.empty() && op.collective()) {
    data_class = request.comm != nullptr ? CollectiveDataClass(*request.comm) : CollectiveDataClass("threads", 1);
  }
  if (!data_class.empty()) return data_class;
  if (op.has_data_class()) {
    absl::StatusOr<std::unique_ptr<Problem>> real = Problem::Make(op_ptr, nullptr, values, options);
    if (!real.ok()) return real.status();
    return DataClassOf(op, *(*real)->args(), options);
  }
  return DataClassOf(op, *shape.args(), options);
}

// The machine the key names: this CPU's, or the GPU's the kernels run on
// (recorded in `db`).
absl::StatusOr<tuning::Machine> KeyMachine(const Op& op, const TuneRequest& request, TuningDb* db) {
  tuning::Machine machine = ThisMachine();
  if (request.device == KREG_DEVICE_CUDA) {
    if (op.collective() || request.comm != nullptr) {
      return absl::InvalidArgumentError("--device cuda: collective ops and sweeps under mpirun run on the CPU");
    }
    absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
    if (!gpus.ok()) return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", gpus.status().message()));
    if (request.device_ordinal < 0 || request.device_ordinal >= static_cast<int>(gpus->size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("no CUDA device ", request.device_ordinal, " (this machine has ", gpus->size(), ")"));
    }
    machine = MachineOf((*gpus)[request.device_ordinal]);
    db->AddMachine(machine);
  } else if (request.device != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown device kind ", request.device));
  }
  return machine;
}

// The kernels to tune: the request's variants, else every one of the op
// this machine can run on the request's device (the reference is the
// oracle, not a contender).
absl::StatusOr<std::vector<std::shared_ptr<const Kernel>>> KernelsToTune(const Registry& registry, const Op& op,
                                                                         const TuneRequest& request) {
  std::vector<std::shared_ptr<const Kernel>> kernels;
  for (const std::string& v : request.variants) {
    absl::StatusOr<std::shared_ptr<const Kernel>> k = registry.Get(absl::StrCat(op.name(), "/", v));
    if (!k.ok()) return absl::InvalidArgumentError(k.status().message());
    if (static_cast<int>((*k)->device()) != request.device) {
      return absl::InvalidArgumentError(absl::StrCat((*k)->name(), (*k)->device() != 0
                                                                       ? " runs on a CUDA device: tune it with --device cuda"
                                                                       : " runs on the CPU, not on a device"));
    }
    if (absl::Status s = CanRun(**k); !s.ok()) return absl::InvalidArgumentError(s.message());
    kernels.push_back(*k);
  }
  if (request.variants.empty()) {
    // Device kernels tune on their device, the CPU's here.
    for (std::shared_ptr<const Kernel>& k : registry.Kernels(op.name())) {
      if (k->is_reference() || static_cast<int>(k->device()) != request.device || !CanRun(*k).ok()) continue;
      kernels.push_back(std::move(k));
    }
  }
  if (kernels.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no available ", op.name(), request.device != 0 ? " CUDA" : "", " kernel to tune"));
  }
  return kernels;
}

// What a measuring worker is told to set up.
WorkerJob JobOf(const Registry& registry, const Op& op, const TuneRequest& request, const ProblemOptions& options) {
  WorkerJob job;
  job.op = op.name();
  for (const auto& [name, dtype] : options.dtypes) job.dtypes.emplace_back(name, DTypeName(dtype));
  job.with.assign(options.with.begin(), options.with.end());
  job.values = request.values;
  job.dist = options.dist;
  job.partition = options.partition;
  job.seed = options.seed;
  job.input_files = request.input_files;
  job.plugins = registry.Files();
  job.warmup = request.warmup;
  job.threads = request.threads;
  job.max_seconds_per_run = request.max_seconds_per_candidate;
  job.ranks = request.ranks;
  job.comm_timeout = request.comm_timeout;
  job.mesh = request.mesh;
  job.device = request.device;
  job.device_ordinal = request.device_ordinal;
  job.warm = request.device_warm;
  return job;
}

// The search over the sweep's candidates: grouped by variant, and in
// families by variant and choices.
SearchOptions SearchOf(const TuneRequest& request, Sweep& sweep, const std::atomic<bool>* stop) {
  SearchOptions search = request.search;
  search.stop = stop;
  search.groups.clear();  // by variant
  search.families.clear();  // by variant and choices
  std::map<const Kernel*, int> group_of;
  std::map<std::pair<const Kernel*, std::vector<int64_t>>, int> family_of;
  for (size_t i = 0; i < sweep.size(); ++i) {
    const Kernel* k = sweep[i].kernel.get();
    search.groups.push_back(group_of.try_emplace(k, static_cast<int>(group_of.size())).first->second);
    std::vector<int64_t> choices;
    for (size_t p = 0; p < k->params().params().size(); ++p) {
      if (k->params().params()[p].kind == KREG_PARAM_CHOICE) choices.push_back(sweep[i].config.values()[p].value);
    }
    search.families.push_back(
        family_of.try_emplace({k, std::move(choices)}, static_cast<int>(family_of.size())).first->second);
  }
  return search;
}

}  // namespace

const char* ToolVersion() { return "kreg " KREG_VERSION; }

absl::Status CheckTuneRequest(const TuneRequest& request) {
  if (absl::Status s = limits::CheckReps(request.search.reps, "reps", 1); !s.ok()) return s;
  if (absl::Status s = limits::CheckReps(request.warmup, "warmup", 0); !s.ok()) return s;
  if (absl::Status s = limits::CheckSeconds(request.search.budget_seconds, "budget", limits::Zero::kAllowed);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = limits::CheckSeconds(request.timeout_seconds, "timeout", limits::Zero::kRefused); !s.ok()) {
    return s;
  }
  if (absl::Status s = limits::CheckThreads(request.threads); !s.ok()) return s;
  if (absl::Status s = limits::CheckCount(request.max_list_len, "max_list_len", 1, limits::kMaxListLen); !s.ok()) {
    return s;
  }
  return limits::CheckCount(request.list_growth_rounds, "list_growth_rounds", 0, limits::kMaxListGrowthRounds);
}

absl::StatusOr<TuneResult> Tune(const Registry& registry, const TuneRequest& request, TuningDb* db,
                                TuneObserver* observer, const std::atomic<bool>* stop) {
  if (absl::Status s = CheckTuneRequest(request); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<const Op>> op_or = registry.GetOp(request.op);
  if (!op_or.ok()) return absl::InvalidArgumentError(op_or.status().message());
  const Op& op = **op_or;
  Values values;
  ProblemOptions options;
  if (absl::Status s = ReadRequest(op, request, &values, &options); !s.ok()) return s;
  // The key and legality from shape-only arguments; the data class of
  // generated inputs needs real ones.
  ShapeArgs shape;
  if (absl::Status s = MakeShapeArgs(op, values, options, &shape); !s.ok()) return s;
  // A problem too large for this machine fails once, here, not in every
  // candidate's worker.
  if (absl::Status s = FitsInMemory(op, values, options); !s.ok()) return s;
  absl::StatusOr<std::string> data_class = KeyDataClass(*op_or, request, values, options, shape);
  if (!data_class.ok()) return data_class.status();
  absl::StatusOr<tuning::Machine> machine = KeyMachine(op, request, db);
  if (!machine.ok()) return machine.status();
  const bool on_device = request.device != 0;
  const tuning::ProblemKey key = MakeProblemKey(op.name(), op.KeyOf(*shape.args()), machine->id(), *data_class);
  absl::StatusOr<std::vector<std::shared_ptr<const Kernel>>> kernels = KernelsToTune(registry, op, request);
  if (!kernels.ok()) return kernels.status();

  std::vector<std::string> command = request.worker_command;
  if (command.empty() && request.comm == nullptr) {
    absl::StatusOr<std::vector<std::string>> found = FindWorker();
    if (!found.ok()) return found.status();
    command = *std::move(found);
  }
  std::unique_ptr<CandidateRunner> runner;
  std::unique_ptr<Problem> rank_problem;  // under MPI: this rank's
  if (request.comm != nullptr) {
    ProblemOptions rank_options = options;
    rank_options.comm = request.comm->abi();
    absl::StatusOr<std::unique_ptr<Problem>> p = Problem::Make(*op_or, registry.Reference(op.name()), values, rank_options);
    if (!p.ok()) return p.status();
    rank_problem = *std::move(p);
    runner = std::make_unique<RankRunner>(registry, request, std::vector<Problem*>{rank_problem.get()});
  } else {
    auto isolated = std::make_unique<IsolatedRunner>(command, JobOf(registry, op, request, options),
                                                     request.timeout_seconds);
    isolated->set_stop(stop);
    runner = std::move(isolated);
  }

  Sweep sweep(request, db, observer, stop, runner.get(), *machine, key, shape.args()->dims);
  size_t enumerated = 0;  // for this sweep's share
  for (const std::shared_ptr<const Kernel>& k : *kernels) {
    std::vector<Config> mine;
    for (Config& c : k->params().Enumerate(CpuIsa(), shape.args()->dims, request.max_list_len)) {
      if (enumerated++ % request.slices == static_cast<size_t>(request.slice)) mine.push_back(std::move(c));
    }
    sweep.AddLegal(k, std::move(mine));
    if (sweep.stopped()) break;
  }
  TuneResult& result = sweep.result();
  result.key = key;
  if (sweep.size() == 0 && request.slices > 1 && sweep.error().empty()) return result;  // an empty share
  if (sweep.size() == 0 && !sweep.stopped()) {
    if (!sweep.error().empty()) return absl::InvalidArgumentError(sweep.error());
    return absl::InvalidArgumentError(absl::StrCat("no configuration of any ", op.name(),
                                                   " kernel is legal for ", KeyString(key)));
  }
  // The entry is marked incomplete until the search finishes.
  sweep.SetTuningInfo(/*complete=*/false);
  const SearchResult searched = Search(
      sweep.size(), [&](size_t i, int reps, bool again) { return sweep.Measure(i, reps, again); },
      SearchOf(request, sweep, stop));
  for (const auto& [i, m] : searched.raced) sweep.Record(i, m);
  bool complete = searched.complete && !sweep.stopped();
  if (complete && request.list_growth_rounds > 0) complete = sweep.GrowLists(request.search.budget_seconds);
  // The thread round, where the sweep ran on every core it may use and
  // they are several.
  const int available = ThreadsAvailable(0);
  const int cores = available > 0 ? available : static_cast<int>(HostMachine().cores);
  if (complete && request.thread_round && request.threads == 0 && request.comm == nullptr && !op.collective() &&
      !on_device && cores > 1) {
    complete = sweep.ThreadRound(cores, request.search.budget_seconds);
  }
  complete = complete && !sweep.stopped();
  result.candidates = sweep.size();
  result.stopped = sweep.stopped();
  result.complete = complete;
  sweep.SetTuningInfo(complete);
  sweep.Checkpoint();
  if (!sweep.save_error().ok()) return sweep.save_error();
  result.seconds = sweep.Elapsed();
  if (const tuning::Entry* entry = db->FindEntry(key); entry != nullptr) result.entry = *entry;
  return result;
}

}  // namespace kreg
