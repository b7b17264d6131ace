#include "records.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kreg/lut.h"
#include "kreg/machine.h"
#include "kreg/text.h"

namespace kreg::python {
namespace {

py::str Str(absl::string_view text) { return py::str(ValidUtf8(text)); }

py::int_ Ns(double ns) { return py::int_(std::isfinite(ns) ? static_cast<int64_t>(std::llround(ns)) : 0); }

py::dict DimsDict(const Dims& dims) {
  py::dict out;
  for (const auto& [name, value] : dims) out[Str(name)] = value;
  return out;
}

py::dict KeyDict(const tuning::ProblemKey& key) {
  py::dict out;
  out["op"] = Str(key.op());
  out["dtype"] = Str(key.dtype());
  out["dims"] = DimsDict(KeyDims(key));
  out["data_class"] = Str(key.data_class());
  out["machine"] = Str(key.machine_id());
  return out;
}

py::object TrialDict(absl::string_view op, const tuning::Trial& trial) {
  py::dict out;
  out["kernel"] = Str(absl::StrCat(op, "/", trial.variant()));
  out["version"] = trial.variant_version();
  out["params"] = ParamsDict(trial.config());
  out["median_ns"] = Ns(trial.median_ns());
  out["min_ns"] = Ns(trial.min_ns());
  out["max_ns"] = Ns(trial.max_ns());
  out["reps"] = trial.reps();
  out["threads"] = trial.threads();
  return out;
}

}  // namespace

py::dict ParamsDict(const tuning::Config& config) {
  py::dict out;
  for (const tuning::ParamValue& p : config.params()) {
    py::object v = py::none();
    switch (p.value_case()) {
      case tuning::ParamValue::kIntValue:
        v = py::int_(p.int_value());
        break;
      case tuning::ParamValue::kListValue: {
        py::list values;
        for (int64_t x : p.list_value().values()) values.append(x);
        v = values;
        break;
      }
      case tuning::ParamValue::kChoice:
        v = Str(p.choice());
        break;
      case tuning::ParamValue::VALUE_NOT_SET:
        break;
    }
    out[Str(p.name())] = v;
  }
  return out;
}

py::dict ParamsDict(const Kernel& kernel, const Config& config) { return ParamsDict(ToProtoConfig(kernel, config)); }

py::dict MachineDict(const tuning::Machine& machine) {
  py::dict out;
  out["id"] = Str(machine.id());
  out["model"] = Str(machine.cpu_model());
  out["vendor"] = Str(MachineVendor(machine));
  out["arch"] = Str(MachineArch(machine));
  out["uarch"] = Str(MicroArch(machine));
  py::list isa;
  for (const std::string& i : machine.isa()) isa.append(Str(i));
  out["isa"] = isa;
  out["cores"] = machine.cores();
  out["class"] = Str(MachineClass(machine));
  if (machine.has_gpu()) {
    const tuning::Gpu& g = machine.gpu();
    py::dict gpu;
    gpu["name"] = Str(g.name());
    gpu["sm"] = g.sm();
    gpu["num_sms"] = g.num_sms();
    gpu["memory_bytes"] = g.memory_bytes();
    gpu["driver"] = Str(g.driver());
    out["gpu"] = gpu;
  }
  return out;
}

py::dict ThisMachineDict() {
  py::dict out = MachineDict(ThisMachine());
  const absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
  py::list list;
  for (const GpuInfo& g : gpus.ok() ? *gpus : std::vector<GpuInfo>{}) {
    py::dict gpu;
    gpu["ordinal"] = g.ordinal;
    gpu["name"] = Str(g.name);
    gpu["sm"] = g.sm;
    gpu["sms"] = g.num_sms;
    gpu["memory_bytes"] = g.memory_bytes;
    gpu["driver"] = Str(g.driver);
    list.append(gpu);
  }
  out["gpus"] = list;
  out["gpus_why_none"] = gpus.ok() ? py::object(py::none()) : py::object(Str(gpus.status().message()));
  return out;
}

py::dict AnswerDict(const QueryRecord& record) {
  const LutAnswer& a = record.answer;
  py::dict out;
  out["key"] = KeyDict(record.key);
  out["kernel"] = Str(a.kernel->name());
  out["version"] = a.kernel->version();
  out["params"] = ParamsDict(*a.kernel, *a.config);
  out["match"] = std::string(MatchName(a.match));
  out["incomplete"] = a.incomplete;
  out["tuned_dims"] = a.tuned_dims != nullptr ? py::object(DimsDict(*a.tuned_dims)) : py::object(py::none());
  out["distance"] = a.distance;
  out["median_ns"] = a.trial != nullptr ? py::object(Ns(a.trial->median_ns())) : py::object(py::none());
  out["machine"] = a.machine != nullptr ? py::object(MachineDict(*a.machine)) : py::object(py::none());
  out["why"] = a.why.empty() ? py::object(py::none()) : py::object(Str(a.why));
  out["threads"] = a.threads;
  out["table"] = a.table.empty() ? py::object(py::none()) : py::object(Str(a.table));
  return out;
}

py::dict KernelDict(const PluginInfo& plugin, const Kernel& k) {
  py::dict out;
  out["kernel"] = Str(k.name());
  out["op"] = Str(k.op());
  out["variant"] = Str(k.variant());
  out["version"] = k.version();
  out["doc"] = Str(k.doc());
  out["isa"] = IsaString(k.required_isa());
  const absl::Status runs = CanRun(k);
  out["device"] = std::string(DeviceName(DeviceKindOf(k.device())));
  out["available"] = runs.ok();
  out["why_unavailable"] = runs.ok() ? py::object(py::none()) : py::object(Str(runs.message()));
  out["reference"] = k.is_reference();
  out["plugin"] = Str(plugin.name);
  out["default_params"] = ParamsDict(k, k.DefaultConfig());
  py::list space;
  for (size_t i = 0; i < k.params().size(); ++i) {
    const ParamInfo& p = k.params()[i];
    py::dict param;
    param["name"] = Str(p.name);
    param["type"] = ParamTypeName(p);
    param["values"] = Str(ParamValuesText(p));
    param["conditional"] = p.when_param >= 0;
    param["doc"] = Str(p.doc);
    space.append(param);
  }
  out["space"] = space;
  return out;
}

py::dict TuneResultDict(const TuneResult& r, absl::string_view strategy) {
  const std::string& op = r.key.op();
  py::dict out;
  out["key"] = KeyDict(r.key);
  out["best"] = r.entry.has_best() ? TrialDict(op, r.entry.best()) : py::object(py::none());
  out["runner_up"] = r.entry.has_runner_up() ? TrialDict(op, r.entry.runner_up()) : py::object(py::none());
  py::dict counts;
  counts["candidates"] = r.candidates;
  counts["measured"] = r.measured;
  counts["reused"] = r.reused;
  counts["failed"] = r.failed;
  out["counts"] = counts;
  out["seconds"] = r.seconds;
  out["strategy"] = std::string(strategy);
  out["complete"] = r.complete;
  return out;
}

}  // namespace kreg::python
