// kreg's Python module (_kreg): the registry, a call of any op on the
// caller's arrays (DLPack or the buffer protocol, without copying), tuning
// tables and their answers, the dispatcher and the tuner. Generic: nothing
// here knows an op; an op's tensors, dims and attributes are keyword
// arguments named as the op declares them (`kreg list`).
//
// It stands on the C++ library's typed API (kreg/answer.h, kreg/tuner.h,
// kreg/problem.h), not on the command line: values stay values, and answers
// and tune results are dicts with the fields of the command line's JSON
// records (records.h). Errors: errors.h.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bridge.h"
#include "call.h"
#include "errors.h"
#include "kreg/answer.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/dispatch.h"
#include "kreg/log.h"
#include "kreg/lut.h"
#include "kreg/record.h"
#include "kreg/registry.h"
#include "kreg/text.h"
#include "records.h"
#include "tune.h"

namespace kreg::python {
namespace {
std::string DimsText(const py::object& dims);
}  // namespace

NamedValues NamedFromPython(const py::object& dims) {
  absl::StatusOr<NamedValues> named = ParseNamedValues(DimsText(dims));
  if (!named.ok()) throw py::value_error(absl::StrCat("dims: ", named.status().message()));
  return *std::move(named);
}

namespace {

// "batch=8,n=1000" from a dict {"batch": 8, "n": 1000} or such a string.
std::string DimsText(const py::object& dims) {
  if (dims.is_none()) return "";
  if (py::isinstance<py::str>(dims)) return dims.cast<std::string>();
  if (!py::isinstance<py::dict>(dims)) throw py::value_error("dims: expected a dict {name: value} or 'name=value,...'");
  std::vector<std::string> items;
  for (auto [name, value] : dims.cast<py::dict>()) {
    items.push_back(absl::StrCat(py::str(name).cast<std::string>(), "=", py::str(value).cast<std::string>()));
  }
  return absl::StrJoin(items, ",");
}

py::dict KernelInfo(const Registry& registry, const Kernel& kernel) {
  for (const PluginInfo& plugin : registry.Plugins()) {
    if (plugin.path == kernel.plugin_path()) return KernelDict(plugin, kernel);
  }
  return KernelDict(PluginInfo{kernel.plugin_path(), kernel.plugin_name(), "", {}, {}}, kernel);
}

AnswerPolicy Policy(const std::string& machine, bool shipped, DeviceKind device) {
  absl::StatusOr<MachinePolicy> machines = ParseMachinePolicy(machine);
  if (!machines.ok()) throw py::value_error(std::string(machines.status().message()));
  return AnswerPolicy{*machines, shipped, device};
}

struct PyTuningDb {
  std::string path;
  TuningDb db;
  // The answering table (this one with the shipped ones behind it) of the
  // last query, kept for the next with the same registry and policy:
  // building it reads the shipped tables (~15 ms), a lookup takes microseconds.
  struct Answering {
    std::shared_ptr<const Registry> registry;
    AnswerPolicy policy;
    Lut lut;
  };
  std::optional<Answering> answering;

  const Lut& AnsweringLut(const std::shared_ptr<const Registry>& registry, const AnswerPolicy& policy) {
    if (!answering || answering->registry != registry || answering->policy.machines != policy.machines ||
        answering->policy.device != policy.device || answering->policy.shipped != policy.shipped) {
      answering.reset();
      std::vector<std::string> warnings;
      Lut lut = Value(kreg::AnsweringLut(*registry, db, path, policy, &warnings));
      for (const std::string& w : warnings) Log(LogLevel::kWarn, w);
      answering.emplace(Answering{registry, policy, std::move(lut)});
    }
    return answering->lut;
  }
};

PyTuningDb LoadDb(const std::string& path) {
  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  if (!db.ok()) ThrowFile(db.status());
  if (!db->unchecked().empty()) Log(LogLevel::kWarn, db->unchecked());
  return PyTuningDb{path, *std::move(db), std::nullopt};
}

// `kreg query --json`'s record, with "explanation": the text in its brackets.
py::dict Query(const Registry& registry, const Lut& lut, const std::string& op_name, const py::object& dims,
               const std::string& dtype, const std::string& with, const std::string& data_class, int threads,
               DeviceKind device, bool record_shape) {
  absl::StatusOr<std::shared_ptr<const Op>> op = registry.GetOp(op_name);
  if (!op.ok()) throw py::value_error(std::string(op.status().message()));
  const Values values = Value((*op)->ParseValues(NamedFromPython(dims)));
  const ProblemOptions options = OptionsOf(dtype, with);
  ShapeArgs shape;
  Check(MakeShapeArgs(**op, values, options, &shape));
  // A collective's key names its backend: thread ranks here.
  const std::string given = data_class.empty() && (*op)->collective() ? CollectiveDataClass("threads", 1) : data_class;
  const std::string asked = ValidUtf8(Value(DataClassOf(**op, *shape.args(), options, given)));
  std::vector<std::string> warnings;
  absl::StatusOr<QueryRecord> record = AskTable(lut, **op, *shape.args(), asked, device, threads, &warnings);
  for (const std::string& w : warnings) Log(LogLevel::kWarn, w);
  const QueryRecord answered = Value(std::move(record));
  // A query made for a run (kreg.jax's, at trace time) records as a
  // Dispatcher's call would (KREG_RECORD).
  if (std::shared_ptr<ShapeRecorder> recorder = ShapeRecorder::FromEnvironment();
      record_shape && recorder != nullptr && answered.answer.match != Match::kExact) {
    recorder->Add({answered.key.op(), answered.key.dtype(), KeyDims(answered.key), answered.key.data_class(), device});
  }
  py::dict out = AnswerDict(answered);
  out["explanation"] = AnswerHow(answered.answer, /*detailed=*/true);
  return out;
}

struct PyDispatcher {
  std::shared_ptr<const Registry> registry;
  std::optional<Dispatcher> dispatcher;
  std::optional<DispatchResult> last;  // what the last run ran

  // {"kernel", "params" (a dict, as query's), "match", "data_class"}, or None.
  py::object Last() const {
    if (!last) return py::none();
    py::dict out;
    out["kernel"] = last->kernel;
    out["params"] = ParamsDict(*last->ran, *last->ran_config);
    out["match"] = std::string(MatchName(last->match));
    out["data_class"] = last->data_class;
    return out;
  }
};

void BindFunctions(py::module_& m) {
  m.doc() = "kreg's C++ core: the registry, calls of any op on your arrays, tuning tables, the dispatcher, the tuner";

  m.attr("__version__") = KREG_VERSION;
  m.def("install_prefix", [] { return InstallPrefix(); },
        "Where kreg's library is installed or built; plugins and tables are found beside it.");
  m.def("set_log_level", [](const std::string& level) { SetLogLevel(Value(ParseLogLevel(level))); },
        py::arg("level"), "'error', 'warn', 'info' or 'debug' (KREG_LOG's values); messages go to stderr.");
  m.def("log_level", [] { return std::string(LogLevelName(GetLogLevel())); });
  m.def("machine", &ThisMachineDict,
        "This machine's fingerprint and the GPUs kreg sees (or why none), as `kreg machine --json`.");
}

void BindKernel(py::module_& m) {
  py::class_<Kernel, std::shared_ptr<Kernel>>(m, "Kernel", "A registered kernel, op/variant.")
      .def_property_readonly("name", &Kernel::name)
      .def_property_readonly("op", &Kernel::op)
      .def_property_readonly("variant", &Kernel::variant)
      .def_property_readonly("version", &Kernel::version)
      .def_property_readonly("doc", &Kernel::doc)
      .def_property_readonly("available", [](const Kernel& k) { return CanRun(k).ok(); },
                             "False where this machine cannot run it (its ISA, or a CUDA device)")
      .def_property_readonly("why_unavailable",
                             [](const Kernel& k) {
                               const absl::Status s = CanRun(k);
                               return s.ok() ? py::object(py::none()) : py::object(py::str(std::string(s.message())));
                             })
      .def_property_readonly("device", [](const Kernel& k) { return std::string(DeviceName(DeviceKindOf(k.device()))); })
      .def_property_readonly("isa", [](const Kernel& k) { return IsaString(k.required_isa()); })
      .def_property_readonly("reference", &Kernel::is_reference)
      .def("__repr__", [](const Kernel& k) {
        return absl::StrCat("<kreg.Kernel ", k.name(), k.available() ? "" : " (unavailable)", ">");
      });
}

void BindRegistry(py::module_& m) {
  py::class_<PyRegistry>(m, "Registry")
      .def(py::init([](const py::object& plugin_path, bool use_env) {
             LoadOptions options;
             if (py::isinstance<py::str>(plugin_path)) {
               options.plugin_paths.push_back(plugin_path.cast<std::string>());
             } else if (!plugin_path.is_none()) {
               for (py::handle p : plugin_path) options.plugin_paths.push_back(py::str(p).cast<std::string>());
             }
             options.use_env = use_env;
             absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
             if (!registry.ok()) ThrowFile(registry.status());
             for (const absl::Status& s : (*registry)->refusals()) Log(LogLevel::kWarn, s.message());
             return PyRegistry{std::shared_ptr<const Registry>(*std::move(registry))};
           }),
           py::arg("plugin_path") = py::none(), py::arg("use_env") = true)
      .def("kernels",
           [](const PyRegistry& r, const std::string& op) {
             std::vector<std::shared_ptr<Kernel>> out;
             for (const auto& k : r.registry->Kernels(op)) out.push_back(std::const_pointer_cast<Kernel>(k));
             return out;
           },
           py::arg("op") = "")
      .def("kernel",
           [](const PyRegistry& r, const std::string& name) {
             return std::const_pointer_cast<Kernel>(Value(r.registry->Get(name)));
           })
      .def("kernel_info",
           [](const PyRegistry& r, const std::string& name) {
             return KernelInfo(*r.registry, *Value(r.registry->Get(name)));
           })
      .def("ops",
           [](const PyRegistry& r) {
             py::list out;
             for (const auto& op : r.registry->Ops()) {
               py::dict d;
               d["op"] = op->name();
               d["doc"] = op->doc();
               d["signature"] = op->Describe();
               out.append(d);
             }
             return out;
           })
      .def_property_readonly("files", [](const PyRegistry& r) { return r.registry->Files(); })
      .def_property_readonly("refusals",
                             [](const PyRegistry& r) {
                               std::vector<std::string> out;
                               for (const absl::Status& s : r.registry->refusals()) out.emplace_back(s.message());
                               return out;
                             })
      .def(
          "run",
          [](const PyRegistry& r, const std::string& name, const py::dict& params, const py::object& out,
             const std::string& dtype, const py::object& threads, const std::string& device, const py::object& stream,
             const py::kwargs& kwargs) {
            return RunKernel(*Value(r.registry->Get(name)), params, out, dtype, threads, device, stream, kwargs);
          },
          py::arg("kernel"), py::kw_only(), py::arg("params") = py::dict(), py::arg("out") = py::none(),
          py::arg("dtype") = "", py::arg("threads") = 0, py::arg("device") = "", py::arg("stream") = py::none());
}

void BindTuningDb(py::module_& m) {
  py::class_<PyTuningDb>(m, "TuningDb")
      .def(py::init([](const std::string& path) { return LoadDb(path); }), py::arg("path"))
      .def(py::init([] { return PyTuningDb{}; }))
      .def_readonly("path", &PyTuningDb::path)
      .def("__len__", [](const PyTuningDb& d) { return d.db.size(); })
      .def("summary", [](const PyTuningDb& d) { return d.db.Summary(); })
      .def("to_json", [](const PyTuningDb& d) { return d.db.ToJson(); })
      .def("to_csv", [](const PyTuningDb& d) { return d.db.ToCsv(); })
      .def(
          "query",
          [](PyTuningDb& d, const PyRegistry& r, const std::string& op, const py::object& dims,
             const std::string& dtype, const std::string& with, const std::string& data_class, const py::object& threads,
             const std::string& machine, bool shipped, const std::string& device, bool record) {
            AnswerPolicy policy = Policy(machine, shipped, DeviceOf(device));
            return Query(*r.registry, d.AnsweringLut(r.registry, policy), op, dims, dtype, with, data_class,
                         Threads(threads), policy.device, record);
          },
          py::arg("registry"), py::arg("op"), py::arg("dims"), py::kw_only(), py::arg("dtype") = "",
          py::arg("with_") = "", py::arg("data_class") = "", py::arg("threads") = 0, py::arg("machine") = "similar",
          py::arg("shipped") = true, py::arg("device") = "cpu", py::arg("record") = false);
}

// A bridge call's failure: its line into `error`, its code as bridge.h's.
int BridgeError(const absl::Status& status, char* error, size_t error_cap) {
  if (error_cap > 0) {
    const absl::string_view message = status.message();
    const size_t n = std::min(message.size(), error_cap - 1);
    std::copy_n(message.data(), n, error);
    error[n] = '\0';
  }
  switch (KindOf(status.code())) {
    case ErrorKind::kValue:
      return KREG_BRIDGE_BAD_ARGUMENT;
    case ErrorKind::kMemory:
      return KREG_BRIDGE_NO_MEMORY;
    case ErrorKind::kNotImplemented:
    case ErrorKind::kRuntime:
      break;
  }
  return KREG_BRIDGE_FAILED;
}

// kreg_bridge_run (bridge.h) over a Dispatcher.
int BridgeRun(const void* dispatcher, const char* op, const kreg_args* args, int32_t threads, char* error,
              size_t error_cap) {
  RunOptions options;
  options.num_threads = threads;
  absl::StatusOr<DispatchResult> result = static_cast<const Dispatcher*>(dispatcher)->Run(op, *args, options);
  return result.ok() ? KREG_BRIDGE_OK : BridgeError(result.status(), error, error_cap);
}

// kreg_bridge_run_on_stream (bridge.h): a device over the caller's stream,
// made per call (it creates nothing), the run enqueued there, not waited for.
int BridgeRunOnStream(const void* dispatcher, const char* op, const kreg_args* args, int32_t device_ordinal,
                      void* stream, char* error, size_t error_cap) {
  absl::StatusOr<std::unique_ptr<Device>> gpu = OpenCudaOnStream(device_ordinal, stream);
  if (!gpu.ok()) return BridgeError(gpu.status(), error, error_cap);
  kreg_args on_device = *args;
  on_device.flags |= KREG_ARGS_ON_DEVICE;
  RunOptions options;
  options.device = (*gpu)->abi();
  absl::StatusOr<DispatchResult> result = static_cast<const Dispatcher*>(dispatcher)->Run(op, on_device, options);
  return result.ok() ? KREG_BRIDGE_OK : BridgeError(result.status(), error, error_cap);
}

void BindDispatcher(py::module_& m) {
  py::class_<PyDispatcher>(m, "Dispatcher")
      .def(py::init([](const PyRegistry& r, const PyTuningDb* db, const std::string& machine, bool shipped) {
             // The GPUs' records too, for run(device="cuda").
             AnswerPolicy policy = Policy(machine, shipped, CudaDevices().ok() ? DeviceKind::kCuda : DeviceKind::kCpu);
             std::vector<std::string> warnings;
             Lut lut = Value(AnsweringLut(*r.registry, db != nullptr ? db->db : TuningDb(), db != nullptr ? db->path : "",
                                          policy, &warnings));
             for (const std::string& w : warnings) Log(LogLevel::kWarn, w);
             PyDispatcher d;
             d.registry = r.registry;
             d.dispatcher.emplace(Value(Dispatcher::Create(*r.registry, std::move(lut))));
             return d;
           }),
           py::arg("registry"), py::arg("db") = nullptr, py::arg("machine") = "similar", py::arg("shipped") = true)
      .def(
          "run",
          [](PyDispatcher& d, const std::string& op, const py::object& out, const std::string& dtype,
             const py::object& threads, const std::string& device, const py::object& stream,
             const py::kwargs& kwargs) {
            const Op* found = d.dispatcher->FindOp(op);
            if (found == nullptr) Check(d.registry->GetOp(op).status());  // names the known ops
            Call call(Value(d.registry->GetOp(op)), kwargs, out, dtype, StreamOf(stream));
            const DeviceKind where = WhereToRun(device, call);
            RunOptions options;
            options.num_threads = Threads(threads);
            absl::StatusOr<DispatchResult> result;
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = RunOn(where, call, options, [&](const kreg_args& args, const RunOptions& o) {
                result = d.dispatcher->Run(op, args, o);
                return result.status();
              });
            }
            Check(status);
            d.last = *std::move(result);  // `last` is made from it when asked
            return call.Results();
          },
          py::arg("op"), py::kw_only(), py::arg("out") = py::none(), py::arg("dtype") = "", py::arg("threads") = 0,
          py::arg("device") = "", py::arg("stream") = py::none())
      .def(
          "_bridge",
          [](const PyDispatcher& d) {
            const kreg_bridge_run_fn run = &BridgeRun;
            const kreg_bridge_run_on_stream_fn run_on_stream = &BridgeRunOnStream;
            return py::make_tuple(reinterpret_cast<uintptr_t>(run), reinterpret_cast<uintptr_t>(&*d.dispatcher),
                                  reinterpret_cast<uintptr_t>(run_on_stream));
          },
          "(kreg_bridge_run's address, this Dispatcher's, kreg_bridge_run_on_stream's): for a framework shim "
          "(bridge.h); valid while this Dispatcher lives.")
      .def_property_readonly("last", &PyDispatcher::Last,
                    "What the last run ran: kernel, params (a dict, as query's), match, data_class.");
}

void BindTune(py::module_& m) {
  m.def("tune", &Tune, py::arg("registry"), py::arg("op"), py::arg("dims"), py::arg("db"), py::kw_only(),
        py::arg("strategy") = "halving", py::arg("budget") = 0.0, py::arg("reps") = 10, py::arg("warmup") = 3,
        py::arg("variants") = std::vector<std::string>{}, py::arg("dtype") = "", py::arg("with_") = "",
        py::arg("dist") = "normal", py::arg("seed") = 1, py::arg("threads") = 0, py::arg("timeout") = 30.0,
        py::arg("thread_round") = true, py::arg("data_class") = "", py::arg("device") = "cpu",
        py::arg("progress") = py::none());
}

}  // namespace
}  // namespace kreg::python

PYBIND11_MODULE(_kreg, m) {
  using namespace kreg::python;
  BindFunctions(m);
  BindKernel(m);
  BindRegistry(m);
  BindTuningDb(m);
  BindDispatcher(m);
  BindTune(m);
}
