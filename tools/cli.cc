// The helpers kreg's commands share (tools/cli.h).
#include <cmath>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/tuner.h"
#include "kreg/log.h"
#include "kreg/npy.h"
#include "kreg/text.h"
#include "tools/cli.h"

namespace kreg::cli {

absl::StatusOr<std::unique_ptr<Registry>> LoadRegistry(const Flags& flags) {
  LoadOptions options;
  if (!flags.plugin_path.empty()) options.plugin_paths.push_back(flags.plugin_path);
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
  if (!registry.ok()) {
    // Only a location named with --plugin-path can be missing.
    if (registry.status().code() == absl::StatusCode::kNotFound) {
      return absl::InvalidArgumentError(absl::StrCat("--plugin-path: ", registry.status().message()));
    }
    return registry.status();
  }
  for (const absl::Status& s : (*registry)->refusals()) Warn(flags, s.message());
  return registry;
}

void Warn(const Flags& flags, absl::string_view message) {
  if (!LogEnabled(LogLevel::kWarn)) return;  // KREG_LOG=error
  std::cerr << "kreg " << flags.command << ": warning: " << OneLine(message) << "\n";
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Pairs(const std::vector<std::string>& items,
                                                                       absl::string_view flag) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& item : items) {
    size_t eq = item.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == item.size()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " '", item, "': expected NAME=VALUE"));
    }
    for (const auto& [name, unused] : out) {
      if (name == item.substr(0, eq)) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", name, "=... is given twice"));
      }
    }
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

absl::StatusOr<ProblemOptions> OptionsFromFlags(const Flags& flags) {
  ProblemOptions options;
  absl::StatusOr<std::vector<std::string>> dtypes = SplitList(flags.dtype);
  if (!dtypes.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", dtypes.status().message()));
  absl::StatusOr<std::vector<std::string>> with = SplitList(flags.with);
  if (!with.ok()) return absl::InvalidArgumentError(absl::StrCat("--with: ", with.status().message()));
  for (absl::string_view item : *dtypes) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (item.find('=') == absl::string_view::npos) kv = {"", std::string(item)};
    absl::StatusOr<DType> d = ParseDType(kv.second);
    if (!d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--dtype '", item, "': expected f32, bf16 or i32, or NAME=TYPE,..."));
    }
    options.dtypes[kv.first] = *d;
  }
  options.with.insert(with->begin(), with->end());
  absl::StatusOr<Dist> dist = ParseDist(flags.dist);
  if (!dist.ok()) return absl::InvalidArgumentError(absl::StrCat("--dist: ", dist.status().message()));
  options.dist = *dist;
  absl::StatusOr<Partition> partition = ParsePartition(flags.partition);
  if (!partition.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--partition: ", partition.status().message()));
  }
  options.partition = *partition;
  options.seed = flags.seed;
  return options;
}

absl::StatusOr<TuningDb> LoadTable(const Flags& flags, const std::string& path) {
  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  if (!db.ok() && (db.status().code() == absl::StatusCode::kNotFound ||
                   db.status().code() == absl::StatusCode::kDataLoss)) {
    return absl::InvalidArgumentError(db.status().message());
  }
  if (db.ok() && !db->unchecked().empty()) Warn(flags, db->unchecked());
  return db;
}

absl::StatusOr<ProblemSpec> SpecFromFlags(const Flags& flags, const Registry& registry, absl::string_view op_name,
                                          absl::string_view dims) {
  ProblemSpec spec;
  absl::StatusOr<std::shared_ptr<const Op>> op = registry.GetOp(op_name);
  if (!op.ok()) return absl::InvalidArgumentError(op.status().message());
  spec.op = *op;
  absl::StatusOr<NamedValues> named = ParseNamedValues(dims);
  if (!named.ok()) return absl::InvalidArgumentError(absl::StrCat("--dims: ", named.status().message()));
  absl::StatusOr<Values> values = spec.op->ParseValues(*named);
  if (!values.ok()) return absl::InvalidArgumentError(values.status().message());
  spec.values = *std::move(values);
  if (flags.ranks > 0) {
    if (absl::Status s = spec.op->SetRanks(&spec.values, flags.ranks); !s.ok()) return s;
  }
  if (!flags.mesh.empty()) {
    absl::StatusOr<Mesh> mesh = ParseMesh(flags.mesh);
    if (!mesh.ok()) return absl::InvalidArgumentError(absl::StrCat("--mesh: ", mesh.status().message()));
    if (absl::Status s = spec.op->SetMesh(&spec.values, *mesh); !s.ok()) return s;
    spec.mesh = *std::move(mesh);
  }
  absl::StatusOr<ProblemOptions> options = OptionsFromFlags(flags);
  if (!options.ok()) return options.status();
  spec.options = *std::move(options);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> inputs = Pairs(flags.inputs, "input");
  if (!inputs.ok()) return inputs.status();
  for (const auto& [input_name, file] : *inputs) {
    absl::StatusOr<Tensor> t = ReadNpy(file);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("--input ", input_name, ": ", t.status().message()));
    spec.options.inputs[input_name] = *std::move(t);
  }
  spec.files = *std::move(inputs);
  return spec;
}

absl::Status ShapeArgsOf(const ProblemSpec& spec, ShapeArgs* out) {
  return MakeShapeArgs(*spec.op, spec.values, spec.options, out);
}

absl::StatusOr<std::string> DataClassOf(const Flags& flags, const ProblemSpec& spec, const kreg_args& args) {
  const std::string given =
      flags.data_class.empty() && spec.op->collective() ? CollectiveDataClass(flags.backend, flags.nodes) : flags.data_class;
  absl::StatusOr<std::string> d = kreg::DataClassOf(*spec.op, args, spec.options, given);
  if (!d.ok()) return d.status();
  return ValidUtf8(*d);
}

// ---- JSON ------------------------------------------------------------------------

std::string Dump(const Json& json) { return json.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json Str(absl::string_view text) { return ValidUtf8(text); }

int64_t Ns(double ns) { return std::isfinite(ns) ? static_cast<int64_t>(std::llround(ns)) : 0; }

std::string Ms(double ns) { return absl::StrFormat("%.3f ms", ns / 1e6); }

Json DimsJson(const Dims& dims) {
  Json out = Json::object();
  for (const auto& [name, value] : dims) out[ValidUtf8(name)] = value;
  return out;
}

Json ParamsJson(const tuning::Config& config) {
  Json out = Json::object();
  for (const tuning::ParamValue& p : config.params()) {
    Json& v = out[ValidUtf8(p.name())];
    switch (p.value_case()) {
      case tuning::ParamValue::kIntValue:
        v = p.int_value();
        break;
      case tuning::ParamValue::kListValue:
        v = Json::array();
        for (int64_t x : p.list_value().values()) v.push_back(x);
        break;
      case tuning::ParamValue::kChoice:
        v = ValidUtf8(p.choice());
        break;
      case tuning::ParamValue::VALUE_NOT_SET:
        break;  // null
    }
  }
  return out;
}

Json KeyJson(const tuning::ProblemKey& key) {
  Json out = Json::object();
  out["op"] = Str(key.op());
  out["dtype"] = Str(key.dtype());
  out["dims"] = DimsJson(KeyDims(key));
  out["data_class"] = Str(key.data_class());
  out["machine"] = Str(key.machine_id());
  return out;
}

Json TrialJson(absl::string_view op, const tuning::Trial& trial) {
  Json out = Json::object();
  out["kernel"] = Str(absl::StrCat(op, "/", trial.variant()));
  out["version"] = trial.variant_version();
  out["params"] = ParamsJson(trial.config());
  out["median_ns"] = Ns(trial.median_ns());
  out["min_ns"] = Ns(trial.min_ns());
  out["max_ns"] = Ns(trial.max_ns());
  out["reps"] = trial.reps();
  out["threads"] = trial.threads();
  return out;
}

Json AnswerJson(const tuning::ProblemKey& asked, const LutAnswer& answer) {
  Json out = Json::object();
  out["key"] = KeyJson(asked);
  out["kernel"] = Str(answer.kernel->name());
  out["version"] = answer.kernel->version();
  out["params"] = ParamsJson(ToProtoConfig(*answer.kernel, *answer.config));
  out["match"] = std::string(MatchName(answer.match));
  out["incomplete"] = answer.incomplete;
  out["tuned_dims"] = answer.tuned_dims != nullptr ? DimsJson(*answer.tuned_dims) : Json(nullptr);
  out["distance"] = answer.distance;
  out["median_ns"] = answer.trial != nullptr ? Json(Ns(answer.trial->median_ns())) : Json(nullptr);
  out["machine"] = answer.machine != nullptr ? MachineJson(*answer.machine) : Json(nullptr);
  out["why"] = answer.why.empty() ? Json(nullptr) : Str(answer.why);
  out["threads"] = answer.threads;
  out["table"] = answer.table.empty() ? Json(nullptr) : Str(answer.table);
  return out;
}

Json MachineJson(const tuning::Machine& machine) {
  Json out = Json::object();
  out["id"] = Str(machine.id());
  out["model"] = Str(machine.cpu_model());
  out["vendor"] = Str(MachineVendor(machine));
  out["arch"] = Str(MachineArch(machine));
  out["uarch"] = Str(MicroArch(machine));
  out["isa"] = Json::array();
  for (const std::string& isa : machine.isa()) out["isa"].push_back(Str(isa));
  out["cores"] = machine.cores();
  out["class"] = Str(MachineClass(machine));
  if (machine.has_gpu()) {
    const tuning::Gpu& g = machine.gpu();
    out["gpu"] = {{"name", Str(g.name())}, {"sm", g.sm()},           {"num_sms", g.num_sms()},
                  {"memory_bytes", g.memory_bytes()}, {"driver", Str(g.driver())}};
  }
  return out;
}

std::string AnswerHow(const LutAnswer& answer, bool detailed) {
  std::string how(MatchName(answer.match));
  if (answer.match == Match::kSimilar && answer.machine != nullptr) {
    absl::StrAppend(&how, " (", MachineSummary(*answer.machine), ")");
  }
  if (!detailed) {
    // run's one line: how it matched
  } else if (answer.match == Match::kDefault) {
    absl::StrAppend(&how, ": ", answer.why);
  } else if (answer.tuned_dims != nullptr) {
    absl::StrAppend(&how, " from ", DimsString(*answer.tuned_dims),
                    answer.trial != nullptr ? ", " + Ms(answer.trial->median_ns()) : "");
  }
  if (answer.threads > 0) absl::StrAppend(&how, ", on ", answer.threads, answer.threads == 1 ? " thread" : " threads");
  if (answer.incomplete) absl::StrAppend(&how, ", incomplete");
  if (detailed && !answer.table.empty()) absl::StrAppend(&how, ", in ", answer.table);
  return how;
}

absl::StatusOr<Lut> AnsweringLut(const Flags& flags, const Registry& registry) {
  TuningDb db;
  if (!flags.db.empty()) {
    absl::StatusOr<TuningDb> given = LoadTable(flags, flags.db);
    if (!given.ok()) return given.status();
    db = *std::move(given);
  }
  return AnsweringLut(flags, registry, std::move(db), flags.db);
}

absl::StatusOr<Lut> AnsweringLut(const Flags& flags, const Registry& registry, TuningDb db,
                                 absl::string_view given_name) {
  if (absl::Status s = CheckConfigs(db, registry, given_name); !s.ok()) return s;
  LutOptions options;
  if (flags.machine == "strict") {
    options.machines = MachinePolicy::kStrict;
  } else if (flags.machine != "similar") {
    return absl::InvalidArgumentError(absl::StrCat("--machine '", flags.machine, "': expected similar or strict"));
  }
  // Asked for a GPU: its record joins each table's, so an untuned GPU finds
  // a tuned one of its SM version.
  std::vector<tuning::Machine> gpus;
  if (flags.device == "cuda") {
    if (absl::StatusOr<std::vector<GpuInfo>> found = CudaDevices(); found.ok()) {
      for (const GpuInfo& g : *found) gpus.push_back(MachineOf(g));
    }
  }
  auto build = [&](TuningDb table) -> absl::StatusOr<Lut> {
    for (const tuning::Machine& m : gpus) table.AddMachine(m);
    absl::StatusOr<Lut> lut = Lut::Build(table, registry, options);
    if (lut.ok()) {
      for (const std::string& w : lut->warnings()) Warn(flags, w);
    }
    return lut;
  };
  const bool given = !given_name.empty() || db.size() > 0;
  if (flags.no_shipped) return build(std::move(db));
  // The shipped tables behind the user's, not pooled with it (Lut::Layered):
  // the user's answers where it has as good a match.
  std::vector<std::string> warnings;
  TuningDb shipped = ShippedTables(&warnings);
  for (const std::string& w : warnings) Warn(flags, w);
  tuning::Database known;  // the entries of loaded ops
  *known.mutable_machines() = shipped.proto().machines();
  for (const tuning::Entry& e : shipped.proto().entries()) {
    if (registry.GetOp(e.key().op()).ok()) *known.add_entries() = e;
  }
  known.set_schema_version(kSchemaVersion);
  absl::StatusOr<TuningDb> adopted = TuningDb::FromProto(std::move(known));
  if (!adopted.ok()) return adopted.status();
  absl::StatusOr<Lut> behind = build(*std::move(adopted));
  if (!behind.ok() || !given) return behind;
  absl::StatusOr<Lut> front = build(std::move(db));
  if (!front.ok() || behind->size() == 0) return front;  // nothing shipped (KREG_TABLE_PATH=)
  return Lut::Layered(*std::move(front), given_name.empty() ? "the given table" : std::string(given_name),
                      *std::move(behind), "the shipped tables");
}

// ---- The table's choice ---------------------------------------------------------------

absl::StatusOr<tuning::Machine> DeviceMachine(const Flags& flags) {
  if (flags.device == "cpu") return ThisMachine();
  if (flags.device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--device '", flags.device, "': expected cpu or cuda"));
  }
  absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
  if (!gpus.ok()) return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", gpus.status().message()));
  return MachineOf(gpus->front());
}

std::string TimingName(const Flags& flags) {
  if (flags.device != "cuda") return "host clock";
  return flags.warm ? "cuda events, warm L2" : "cuda events, cold L2";
}

absl::StatusOr<TableChoice> ChooseFromTable(const Flags& flags, const ProblemSpec& spec, const Registry& registry,
                                            const kreg_args& args) {
  absl::StatusOr<Lut> lut = AnsweringLut(flags, registry);
  if (!lut.ok()) return lut.status();
  const OpKey key = spec.op->KeyOf(args);
  absl::StatusOr<std::string> data_class = DataClassOf(flags, spec, args);
  if (!data_class.ok()) return data_class.status();
  absl::StatusOr<tuning::Machine> asked = DeviceMachine(flags);
  if (!asked.ok()) return asked.status();
  const std::string& machine = asked->id();
  absl::StatusOr<LutAnswer> a =
      lut->Query(spec.op->name(), key.dtype, key.dims, machine, *data_class, ThreadsAvailable(flags.threads));
  if (!a.ok()) return a.status();
  for (const std::string& w : a->warnings) Warn(flags, w);
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry.Get(a->kernel->name());
  if (!kernel.ok()) return kernel.status();
  TableChoice choice;
  choice.kernel = *kernel;
  choice.config = *a->config;
  choice.how = AnswerHow(*a, /*detailed=*/false);
  choice.threads = a->threads;
  choice.answer = AnswerJson(MakeProblemKey(spec.op->name(), key, machine, *data_class), *a);
  return choice;
}

}  // namespace kreg::cli
