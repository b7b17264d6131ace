// The helpers kreg's commands share (tools/cli.h).
#include <cmath>
#include <iostream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kreg/answer.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/tuner.h"
#include "kreg/log.h"
#include "kreg/npy.h"
#include "kreg/record.h"
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
  absl::StatusOr<std::map<std::string, DType>> dtypes = ParseDTypes(flags.dtype);
  if (!dtypes.ok()) {  // "--dtype 'x': expected ...", "--dtype: the value is empty"
    const absl::string_view m = dtypes.status().message();
    return absl::InvalidArgumentError(absl::StrCat("--dtype", absl::StartsWith(m, "'") ? " " : ": ", m));
  }
  options.dtypes = *std::move(dtypes);
  absl::StatusOr<std::vector<std::string>> with = SplitList(flags.with);
  if (!with.ok()) return absl::InvalidArgumentError(absl::StrCat("--with: ", with.status().message()));
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
  AnswerPolicy policy;
  absl::StatusOr<MachinePolicy> machines = ParseMachinePolicy(flags.machine);
  if (!machines.ok()) return absl::InvalidArgumentError(absl::StrCat("--", machines.status().message()));
  policy.machines = *machines;
  policy.shipped = !flags.no_shipped;
  absl::StatusOr<DeviceKind> device = DeviceOf(flags);
  if (!device.ok()) return device.status();
  policy.device = *device;
  std::vector<std::string> warnings;
  absl::StatusOr<Lut> lut = kreg::AnsweringLut(registry, std::move(db), given_name, policy, &warnings);
  for (const std::string& w : warnings) Warn(flags, w);
  return lut;
}

// ---- The table's choice ---------------------------------------------------------------

absl::StatusOr<CommBackend> BackendOf(const Flags& flags) {
  absl::StatusOr<CommBackend> backend = ParseCommBackend(flags.backend);
  if (!backend.ok()) return absl::InvalidArgumentError(absl::StrCat("--", backend.status().message()));
  return backend;
}

absl::StatusOr<DeviceKind> DeviceOf(const Flags& flags) {
  absl::StatusOr<DeviceKind> device = ParseDevice(flags.device);
  if (!device.ok()) return absl::InvalidArgumentError(absl::StrCat("--", device.status().message()));
  return device;
}

absl::StatusOr<tuning::Machine> DeviceMachine(const Flags& flags) {
  absl::StatusOr<DeviceKind> device = DeviceOf(flags);
  if (!device.ok()) return device.status();
  return kreg::DeviceMachine(*device);
}

std::string TimingName(const Flags& flags) {
  if (DeviceOf(flags).value_or(DeviceKind::kCpu) != DeviceKind::kCuda) return "host clock";
  return flags.warm ? "cuda events, warm L2" : "cuda events, cold L2";
}

absl::StatusOr<TableChoice> ChooseFromTable(const Flags& flags, const ProblemSpec& spec, const Registry& registry,
                                            const kreg_args& args) {
  absl::StatusOr<Lut> lut = AnsweringLut(flags, registry);
  if (!lut.ok()) return lut.status();
  absl::StatusOr<std::string> data_class = DataClassOf(flags, spec, args);
  if (!data_class.ok()) return data_class.status();
  absl::StatusOr<DeviceKind> device = DeviceOf(flags);
  if (!device.ok()) return device.status();
  std::vector<std::string> warnings;
  absl::StatusOr<QueryRecord> record =
      AskTable(*lut, *spec.op, args, *std::move(data_class), *device, flags.threads, &warnings);
  for (const std::string& w : warnings) Warn(flags, w);
  if (!record.ok()) return record.status();
  const LutAnswer* a = &record->answer;
  // KREG_RECORD: a shape the tables do not answer exactly is recorded, as
  // the Dispatcher records it.
  std::shared_ptr<ShapeRecorder> recorder = a->match == Match::kExact ? nullptr : ShapeRecorder::FromEnvironment();
  if (recorder != nullptr) {
    recorder->Add({spec.op->name(), record->key.dtype(), KeyDims(record->key), record->key.data_class(), *device});
  }
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry.Get(a->kernel->name());
  if (!kernel.ok()) return kernel.status();
  TableChoice choice;
  choice.kernel = *kernel;
  choice.config = *a->config;
  choice.how = AnswerHow(*a, /*detailed=*/false);
  choice.threads = a->threads;
  choice.answer = AnswerJson(record->key, *a);
  return choice;
}

}  // namespace kreg::cli
