// kreg's Python module (_kreg): the registry, a call of any op on the
// caller's arrays (DLPack or the buffer protocol, without copying), tuning
// tables and their answers, the dispatcher and the tuner. Generic: nothing
// here knows an op; an op's tensors, dims and attributes are keyword
// arguments named as the op declares them (`kreg list`).
//
// Answers and tune results are the command line's JSON records (tools/cli.h),
// so Python and `kreg query --json` / `kreg tune --json` say the same thing.
// Errors: ValueError for bad arguments, OSError (FileNotFoundError) for
// files, MemoryError, RuntimeError for what failed at run time.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <bit>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/device.h"
#include "kreg/dispatch.h"
#include "kreg/limits.h"
#include "kreg/log.h"
#include "kreg/lut.h"
#include "kreg/registry.h"
#include "kreg/tuner.h"
#include "tools/cli.h"

namespace py = pybind11;

namespace kreg::python {
namespace {

// ---- Errors -------------------------------------------------------------------

[[noreturn]] void Throw(const absl::Status& status) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kNotFound:  // an unknown kernel, op or name
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      throw py::value_error(message);
    case absl::StatusCode::kResourceExhausted:
      PyErr_SetString(PyExc_MemoryError, message.c_str());
      throw py::error_already_set();
    case absl::StatusCode::kUnimplemented:
      PyErr_SetString(PyExc_NotImplementedError, message.c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(message);
  }
}

// A file's error: FileNotFoundError when it is missing, OSError when it is
// unreadable or not a table.
[[noreturn]] void ThrowFile(const absl::Status& status) {
  PyObject* type = status.code() == absl::StatusCode::kNotFound ? PyExc_FileNotFoundError : PyExc_OSError;
  PyErr_SetString(type, std::string(status.message()).c_str());
  throw py::error_already_set();
}

template <typename T>
T Value(absl::StatusOr<T> s) {
  if (!s.ok()) Throw(s.status());
  return *std::move(s);
}

void Check(const absl::Status& s) {
  if (!s.ok()) Throw(s);
}

py::object JsonToPython(const cli::Json& json) {
  return py::module_::import("json").attr("loads")(cli::Dump(json));
}

// An integer argument from Python, of any size, checked by one of
// kreg/limits.h's checks: TypeError for what is not an integer, ValueError
// (the check's line, quoting the number as given) for one out of bounds.
int64_t Checked(const py::handle& value, const char* name, const std::function<absl::Status(int64_t)>& check) {
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) {
    throw py::type_error(absl::StrCat(name, ": expected an integer, got ", py::str(py::type::of(value)).cast<std::string>()));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  const int64_t clamped = overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : v;
  absl::Status s = check(clamped);
  if (s.ok()) return clamped;
  std::string message(s.message());
  if (overflow != 0) message = absl::StrCat(message.substr(0, message.rfind(", got ")), ", got ", py::str(value).cast<std::string>());
  throw py::value_error(message);
}

// A thread count as the command line takes it.
int Threads(const py::handle& threads) {
  return static_cast<int>(Checked(threads, "threads", [](int64_t v) { return limits::CheckThreads(v); }));
}

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

// ---- The caller's arrays ---------------------------------------------------------

// A caller's array seen as a DLTensor, without copying: through the buffer
// protocol (NumPy, array.array, memoryview), else DLPack's __dlpack__
// (PyTorch, JAX). Holds the array for the call.
class Borrowed {
 public:
  Borrowed(const std::string& name, const py::handle& array, bool write) : object_(py::reinterpret_borrow<py::object>(array)) {
    if (PyObject_CheckBuffer(array.ptr())) {
      FromBuffer(name, write);
    } else if (py::hasattr(array, "__dlpack__")) {
      FromDlpack(name);
    } else {
      throw py::value_error(absl::StrCat("'", name, "': expected an array (NumPy, a DLPack tensor such as PyTorch's "
                                         "or JAX's, or a buffer), got ", py::str(py::type::of(array)).cast<std::string>()));
    }
    dl_.shape = shape_.data();
    dl_.strides = strides_.data();
    dl_.ndim = static_cast<int32_t>(shape_.size());
  }
  ~Borrowed() {
    if (has_buffer_) PyBuffer_Release(&buffer_);
  }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;

  DLTensor* dl() { return &dl_; }
  DType dtype() const { return dtype_; }
  // The bytes its elements span, [first, last); empty for no elements.
  std::pair<uintptr_t, uintptr_t> Span() const {
    const uintptr_t first = reinterpret_cast<uintptr_t>(dl_.data) + dl_.byte_offset;
    int64_t last = 0;
    for (size_t i = 0; i < shape_.size(); ++i) {
      if (shape_[i] == 0) return {first, first};
      last += (shape_[i] - 1) * strides_[i];
    }
    return {first, first + static_cast<uintptr_t>(last + 1) * DTypeSize(dtype_)};
  }
  const std::vector<int64_t>& shape() const { return shape_; }
  const py::object& object() const { return object_; }

 private:
  void FromBuffer(const std::string& name, bool write) {
    const int flags = PyBUF_STRIDES | PyBUF_FORMAT | (write ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object_.ptr(), &buffer_, flags) != 0) {
      PyErr_Clear();
      throw py::value_error(absl::StrCat("'", name, "': ",
                                         write ? "an output must be a writable array" : "cannot read the array"));
    }
    has_buffer_ = true;
    const std::string format = buffer_.format != nullptr ? buffer_.format : "B";
    const char code = format.empty() ? 'B' : format.back();  // "<f", "=i", "f"
    // The byte order: '@', '=' or none is native; '<' little, '>' and '!' big.
    const char order = format.size() > 1 ? format[0] : '@';
    const bool little = std::endian::native == std::endian::little;
    if ((little && (order == '>' || order == '!')) || (!little && order == '<')) {
      const std::string dtype = py::hasattr(object_, "dtype") ? py::str(object_.attr("dtype")).cast<std::string>()
                                                              : absl::StrCat("'", format, "'");
      throw py::value_error(absl::StrCat("'", name, "': its bytes are in ", little ? "big" : "little",
                                         "-endian order (dtype ", dtype, "), not this machine's; pass "
                                         "x.astype(x.dtype.newbyteorder('='))"));
    }
    if (code == 'f' && buffer_.itemsize == 4) {
      dtype_ = DType::kF32;
    } else if ((code == 'i' || code == 'l') && buffer_.itemsize == 4) {
      dtype_ = DType::kI32;
    } else if (code == 'H' && buffer_.itemsize == 2) {
      dtype_ = DType::kBF16;  // NumPy has no bfloat16: uint16 arrays carry bf16 bits
    } else {
      const std::string dtype = py::hasattr(object_, "dtype") ? py::str(object_.attr("dtype")).cast<std::string>()
                                                              : absl::StrCat("'", format, "'");
      throw py::value_error(absl::StrCat("'", name, "': dtype ", dtype, " is not one kreg speaks: float32, int32, "
                                         "or bfloat16 (PyTorch's torch.bfloat16, or NumPy uint16 holding the bits)"));
    }
    dl_.data = buffer_.buf;
    dl_.device = {kDLCPU, 0};
    dl_.dtype = ToDLDataType(dtype_);
    for (int i = 0; i < buffer_.ndim; ++i) {
      shape_.push_back(buffer_.shape[i]);
      const Py_ssize_t stride = buffer_.strides[i];
      if (stride < 0 || stride % buffer_.itemsize != 0) {
        throw py::value_error(absl::StrCat("'", name, "': its strides are not a whole, non-negative number of "
                                           "elements; pass a contiguous copy (numpy.ascontiguousarray)"));
      }
      strides_.push_back(stride / buffer_.itemsize);
    }
  }

  void FromDlpack(const std::string& name) {
    capsule_ = object_.attr("__dlpack__")();
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
    if (managed == nullptr) {
      PyErr_Clear();
      throw py::value_error(absl::StrCat("'", name, "': __dlpack__ did not give a DLPack tensor capsule"));
    }
    // Not consumed: the capsule's destructor frees the tensor when we let go.
    const DLTensor& t = managed->dl_tensor;
    if (t.device.device_type != kDLCPU) {
      throw py::value_error(absl::StrCat("'", name, "': the tensor is on DLPack device ", t.device.device_type,
                                         ", not the CPU: pass host arrays (.cpu()); device='cuda' copies them to the GPU"));
    }
    absl::StatusOr<DType> dtype = FromDLDataType(t.dtype);
    if (!dtype.ok()) throw py::value_error(absl::StrCat("'", name, "': ", dtype.status().message()));
    dtype_ = *dtype;
    dl_ = t;
    shape_.assign(t.shape, t.shape + t.ndim);
    int64_t compact = 1;
    strides_.resize(t.ndim);
    for (int i = t.ndim - 1; i >= 0; --i) {
      strides_[i] = t.strides != nullptr ? t.strides[i] : compact;
      if (strides_[i] < 0) {
        throw py::value_error(absl::StrCat("'", name, "': negative strides; pass a contiguous copy (.contiguous())"));
      }
      compact *= shape_[i];
    }
  }

  py::object object_;
  py::object capsule_;
  Py_buffer buffer_{};
  bool has_buffer_ = false;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_, strides_;
  DLTensor dl_{};
};

// The NumPy array an output is returned in.
py::object NewArray(DType dtype, const std::vector<int64_t>& shape) {
  py::module_ np = py::module_::import("numpy");
  const char* name = dtype == DType::kF32 ? "float32" : dtype == DType::kI32 ? "int32" : "uint16";
  return np.attr("zeros")(py::cast(shape), np.attr(name));
}

// One call of an op: its arguments over the caller's arrays and the outputs
// made for it. Built with the GIL held; run without it.
class Call {
 public:
  // `kwargs`: the op's tensors (arrays), dims and attributes by name;
  // `out`: arrays for outputs; `dtype`: as `kreg run --dtype` ("bf16",
  // "out=f32,...") for tensors no array decides.
  Call(std::shared_ptr<const Op> op, const py::kwargs& kwargs, const py::object& out, const std::string& dtype)
      : op_(std::move(op)) {
    const Op& o = *op_;
    NamedValues named;
    std::map<std::string, std::unique_ptr<Borrowed>> given, outs;
    for (auto [key, value] : kwargs) {
      const std::string name = py::str(key).cast<std::string>();
      const int t = o.FindTensor(name);
      if (t >= 0) {
        if (o.tensors()[t].role == KREG_ROLE_OUT) {
          throw py::value_error(absl::StrCat(o.name(), ": '", name, "' is an output; pass an array for it in out={'",
                                             name, "': array}"));
        }
        if (value.is_none()) continue;  // an optional input left out
        given[name] = std::make_unique<Borrowed>(name, value, o.tensors()[t].role == KREG_ROLE_INOUT);
      } else if (o.FindDim(name) >= 0 || o.FindAttr(name) >= 0) {
        std::string text = py::isinstance<py::bool_>(value) ? (value.cast<bool>() ? "1" : "0")
                                                            : py::str(value).cast<std::string>();
        named.emplace_back(name, std::move(text));
      } else {
        throw py::value_error(absl::StrCat(o.name(), ": no tensor, dim or attribute '", name, "' (", o.Describe(), ")"));
      }
    }
    if (!out.is_none()) {
      if (!py::isinstance<py::dict>(out)) throw py::value_error("out: expected a dict {output name: array}");
      for (auto [key, value] : out.cast<py::dict>()) {
        const std::string name = py::str(key).cast<std::string>();
        const int t = o.FindTensor(name);
        if (t < 0 || o.tensors()[t].role != KREG_ROLE_OUT) {
          std::vector<std::string> names;
          for (const TensorInfo& info : o.tensors()) {
            if (info.role == KREG_ROLE_OUT) names.push_back(info.name);
          }
          throw py::value_error(absl::StrCat("out: ", o.name(), " has no output '", name, "' (its outputs: ",
                                             absl::StrJoin(names, ", "), ")"));
        }
        outs[name] = std::make_unique<Borrowed>(name, value, /*write=*/true);
      }
    }

    cli::Flags flags;
    flags.dtype = dtype;
    ProblemOptions options = Value(cli::OptionsFromFlags(flags));
    std::map<std::string, DType> given_types;
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [name, b] : given) {
      given_types[name] = b->dtype();
      shapes[name] = b->shape();
    }
    for (const auto& [name, b] : outs) {
      options.dtypes[name] = b->dtype();  // an output array decides its dtype
      shapes[name] = b->shape();
    }
    values_ = Value(o.ParseValues(named));
    Check(o.DimsFromShapes(shapes, &values_));
    Check(o.Complete(&values_));
    const TensorTypes types = Value(o.ResolveTypes(options.dtypes, {}, given_types));

    tensors_.assign(o.tensors().size(), nullptr);
    for (size_t t = 0; t < o.tensors().size(); ++t) {
      const TensorInfo& info = o.tensors()[t];
      if (!types[t]) continue;
      std::unique_ptr<Borrowed> b;
      if (auto it = given.find(info.name); it != given.end()) {
        b = std::move(it->second);
      } else if (auto o_it = outs.find(info.name); o_it != outs.end()) {
        b = std::move(o_it->second);
        if (b->dtype() != *types[t]) {
          throw py::value_error(absl::StrCat("out: '", info.name, "' is ", DTypeName(b->dtype()), "; ", o.name(),
                                             " writes ", DTypeName(*types[t]), " here"));
        }
      } else if (info.role == KREG_ROLE_OUT) {
        b = std::make_unique<Borrowed>(info.name, NewArray(*types[t], o.ShapeOf(static_cast<int>(t), values_)), true);
      } else {
        throw py::value_error(absl::StrCat(o.name(), ": missing input '", info.name, "' (", o.Describe(), ")"));
      }
      tensors_[t] = b->dl();
      if (info.is_output()) results_.emplace_back(info.name, b->object());
      // A tensor written may share no byte with another of the call: a
      // kernel writes it while reading the others, and two outputs over one
      // buffer garble each other.
      const auto [first, last] = b->Span();
      for (size_t h = 0; h < held_.size(); ++h) {
        const auto [other_first, other_last] = held_[h]->Span();
        const bool written = info.is_output() || o.tensors()[held_names_[h]].is_output();
        if (written && first < last && other_first < other_last && first < other_last && other_first < last) {
          throw py::value_error(absl::StrCat("'", info.name, "' and '", o.tensors()[held_names_[h]].name,
                                             "' share memory; an output may not overlap another array of the call: "
                                             "pass separate arrays"));
        }
      }
      held_.push_back(std::move(b));
      held_names_.push_back(static_cast<int>(t));
    }
    args_.struct_size = sizeof(kreg_args);
    args_.tensors = tensors_.data();
    args_.num_tensors = tensors_.size();
    args_.dims = values_.dims.data();
    args_.num_dims = values_.dims.size();
    args_.attrs = values_.attrs.data();
    args_.num_attrs = values_.attrs.size();
  }

  const kreg_args& args() const { return args_; }
  const Op& op() const { return *op_; }

  // {output name: array}: the caller's `out` arrays themselves, or new ones.
  py::dict Results() const {
    py::dict d;
    for (const auto& [name, array] : results_) d[py::str(name)] = array;
    return d;
  }

 private:
  std::shared_ptr<const Op> op_;
  Values values_;
  std::vector<std::unique_ptr<Borrowed>> held_;
  std::vector<int> held_names_;  // each held array's tensor index
  std::vector<DLTensor*> tensors_;
  std::vector<std::pair<std::string, py::object>> results_;
  kreg_args args_{};
};

// ---- Objects ----------------------------------------------------------------------

struct PyRegistry {
  std::shared_ptr<const Registry> registry;
};

// GPU 0, opened once for the process (its stream, its L2-flush buffer),
// used by one call at a time.
std::mutex gpu_mutex;
absl::StatusOr<Device*> Gpu() {
  static const absl::StatusOr<Device*> gpu = []() -> absl::StatusOr<Device*> {
    absl::StatusOr<std::unique_ptr<Device>> opened = OpenCuda(0);
    if (!opened.ok()) return opened.status();
    return opened->release();
  }();
  return gpu;
}

// `run` on a call's arrays: on the CPU in place; with device "cuda" on GPU
// 0 (the arrays copied there, the run, then its outputs copied back into
// them). Called without the GIL.
absl::Status RunOn(const std::string& device, const Call& call, RunOptions options,
                   const std::function<absl::Status(const kreg_args&, const RunOptions&)>& run) {
  if (device == "cpu") return run(call.args(), options);
  // The data is checked here, on the host (on the device the op's
  // validator sees shapes only).
  if (absl::Status s = call.op().Validate(call.args()); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(gpu_mutex);
  absl::StatusOr<Device*> opened = Gpu();
  if (!opened.ok()) return opened.status();
  Device& gpu = **opened;
  absl::StatusOr<std::unique_ptr<DeviceCall>> on = DeviceCall::Make(gpu, call.args());
  if (!on.ok()) return on.status();
  if (absl::Status s = (*on)->CopyIn(); !s.ok()) return s;
  options.device = gpu.abi();
  absl::Status ran = run(*(*on)->args(), options);
  if (absl::Status s = gpu.Synchronize(); ran.ok()) ran = s;
  if (!ran.ok()) return ran;
  std::vector<bool> written;
  for (const TensorInfo& t : call.op().tensors()) written.push_back(t.is_output());
  return (*on)->CopyBack(&written);
}

// "cpu" or "cuda" (ValueError otherwise); "cuda" where there is no GPU
// raises RuntimeError saying why.
std::string DeviceName(const std::string& device) {
  if (device != "cpu" && device != "cuda") {
    throw py::value_error(absl::StrCat("device '", device, "': expected 'cpu' or 'cuda'"));
  }
  if (device == "cuda") {
    absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
    if (!gpus.ok()) Throw(absl::UnavailableError(absl::StrCat("device='cuda': ", gpus.status().message())));
  }
  return device;
}

py::dict RunKernel(const Kernel& kernel, const py::dict& params, const py::object& out, const std::string& dtype,
                   const py::object& threads, const std::string& device, const py::kwargs& kwargs) {
  std::vector<std::pair<std::string, std::string>> overrides;
  for (auto [key, value] : params) {
    std::string text;
    if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
      std::vector<std::string> items;
      for (py::handle item : value) items.push_back(py::str(item).cast<std::string>());
      text = absl::StrJoin(items, ",");
    } else {
      text = py::str(value).cast<std::string>();
    }
    overrides.emplace_back(py::str(key).cast<std::string>(), std::move(text));
  }
  const Config config = Value(kernel.ParseConfig(overrides));
  const std::string where = DeviceName(device);
  Call call(kernel.op_ptr(), kwargs, out, dtype);
  RunOptions options;
  options.num_threads = Threads(threads);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = RunOn(where, call, options,
                   [&](const kreg_args& args, const RunOptions& o) { return kernel.Run(config, args, o); });
  }
  Check(status);
  return call.Results();
}

py::dict KernelInfo(const Registry& registry, const Kernel& kernel) {
  for (const PluginInfo& plugin : registry.Plugins()) {
    if (plugin.path == kernel.plugin_path()) return JsonToPython(cli::KernelJson(plugin, kernel));
  }
  return JsonToPython(cli::KernelJson(PluginInfo{kernel.plugin_path(), kernel.plugin_name(), "", {}, {}}, kernel));
}

struct PyTuningDb {
  std::string path;
  TuningDb db;
  // The answering table (this one with the shipped ones behind it) of the
  // last query, kept for the next with the same registry and policy:
  // building it reads the shipped tables (~15 ms), a lookup takes microseconds.
  struct Answering {
    std::shared_ptr<const Registry> registry;
    std::string machine, device;
    bool shipped;
    Lut lut;
  };
  std::optional<Answering> answering;

  const Lut& AnsweringLut(const std::shared_ptr<const Registry>& registry, const cli::Flags& flags) {
    if (!answering || answering->registry != registry || answering->machine != flags.machine ||
        answering->device != flags.device || answering->shipped == flags.no_shipped) {
      answering.reset();
      answering.emplace(Answering{registry, flags.machine, flags.device, !flags.no_shipped,
                                  Value(cli::AnsweringLut(flags, *registry, db, path))});
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

cli::Flags AnswerFlags(const std::string& machine, bool shipped, int threads, const std::string& dtype,
                       const std::string& with, const std::string& data_class) {
  cli::Flags flags;
  flags.command = "query";
  flags.machine = machine;
  flags.no_shipped = !shipped;
  flags.threads = threads;
  flags.dtype = dtype;
  flags.with = with;
  flags.data_class = data_class;
  return flags;
}

// `kreg query --json`'s record, with "explanation": the text in its brackets.
py::dict Query(const Registry& registry, const Lut& lut, const std::string& op, const py::object& dims,
               const cli::Flags& flags) {
  cli::ProblemSpec spec = Value(cli::SpecFromFlags(flags, registry, op, DimsText(dims)));
  ShapeArgs shape;
  Check(cli::ShapeArgsOf(spec, &shape));
  const OpKey key = spec.op->KeyOf(*shape.args());
  const std::string data_class = Value(cli::DataClassOf(flags, spec, *shape.args()));
  const std::string machine = Value(cli::DeviceMachine(flags)).id();
  LutAnswer a = Value(lut.Query(spec.op->name(), key.dtype, key.dims, machine, data_class,
                                ThreadsAvailable(flags.threads)));
  for (const std::string& w : a.warnings) Log(LogLevel::kWarn, w);
  py::dict record = JsonToPython(cli::AnswerJson(MakeProblemKey(spec.op->name(), key, machine, data_class), a));
  record["explanation"] = cli::AnswerHow(a, /*detailed=*/true);
  return record;
}

struct PyDispatcher {
  std::shared_ptr<const Registry> registry;
  std::optional<Dispatcher> dispatcher;
  py::object last = py::none();
};

// Progress and warnings of a sweep, handed to Python (the sweep runs
// without the GIL); a callback that raises, or Ctrl-C, stops the sweep.
class PyObserver : public TuneObserver {
 public:
  PyObserver(py::object progress, std::atomic<bool>* stop) : progress_(std::move(progress)), stop_(stop) {}
  void OnProgress(const TuneProgress& p) override {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      Fail(py::error_already_set());  // KeyboardInterrupt, fetched
      return;
    }
    if (progress_.is_none() || error_) return;
    py::dict d;
    d["key"] = p.key;
    d["done"] = p.done;
    d["candidates"] = p.candidates;
    d["best"] = p.best;
    d["best_ns"] = p.best_ns;
    d["elapsed_seconds"] = p.elapsed_seconds;
    d["eta_seconds"] = p.eta_seconds;
    try {
      progress_(d);
    } catch (py::error_already_set& e) {
      Fail(std::move(e));
    }
  }
  void OnWarning(absl::string_view message) override { Log(LogLevel::kWarn, message); }
  // Raises the callback's exception (or KeyboardInterrupt) if there was one.
  void Rethrow() {
    if (error_) {
      error_->restore();
      throw py::error_already_set();
    }
  }

 private:
  void Fail(py::error_already_set error) {
    error_.emplace(std::move(error));
    stop_->store(true);
  }
  py::object progress_;
  std::atomic<bool>* stop_;
  std::optional<py::error_already_set> error_;
};

// Ctrl-C during a sweep, which runs without the GIL: Python's own handler
// would run only at the next progress report, after the candidate in
// flight, which may take seconds. While the sweep runs, a handler of ours
// sets its stop flag (the tuner then cuts the candidate short and keeps what
// was measured); afterwards Python's is put back and the interrupt handed to
// it (KeyboardInterrupt, or the program's own handler). A SIGINT the
// program ignores stays ignored.
class SigintStops {
 public:
  explicit SigintStops(std::atomic<bool>* stop) {
    struct sigaction ours {};
    ours.sa_handler = [](int) {
      fired_ = 1;
      if (stop_ != nullptr) stop_->store(true);
    };
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGINT, nullptr, &old_) != 0 || old_.sa_handler == SIG_IGN) return;
    stop_ = stop;
    fired_ = 0;
    installed_ = sigaction(SIGINT, &ours, nullptr) == 0;
  }
  ~SigintStops() {
    if (!installed_) return;
    sigaction(SIGINT, &old_, nullptr);
    stop_ = nullptr;
    if (fired_) PyErr_SetInterrupt();  // Python's handler runs at its next check
  }
  SigintStops(const SigintStops&) = delete;
  SigintStops& operator=(const SigintStops&) = delete;

 private:
  static inline std::atomic<bool>* stop_ = nullptr;
  static inline volatile sig_atomic_t fired_ = 0;
  struct sigaction old_ {};
  bool installed_ = false;
};

py::object Tune(PyRegistry& reg, const std::string& op, const py::object& dims_list, const std::string& db_path,
                const std::string& strategy, double budget, const py::object& reps, const py::object& warmup,
                const std::vector<std::string>& variants, const std::string& dtype, const std::string& with,
                const std::string& dist, uint64_t seed, const py::object& threads,
                double timeout, bool thread_round, const std::string& data_class, const std::string& device,
                const py::object& progress) {
  cli::Flags flags;
  flags.command = "tune";
  flags.dtype = dtype;
  flags.with = with;
  flags.dist = dist;
  flags.seed = seed;
  Check(limits::CheckSeconds(budget, "budget", limits::Zero::kAllowed));
  Check(limits::CheckSeconds(timeout, "timeout", limits::Zero::kRefused));
  const int64_t reps_n = Checked(reps, "reps", [](int64_t v) { return limits::CheckReps(v, "reps", 1); });
  const int64_t warmup_n = Checked(warmup, "warmup", [](int64_t v) { return limits::CheckReps(v, "warmup", 0); });
  const Strategy parsed = Value(ParseStrategy(strategy));
  TuneRequest base;
  base.op = op;
  base.options = Value(cli::OptionsFromFlags(flags));
  base.variants = variants;
  base.data_class = data_class;
  base.search.strategy = parsed;
  base.search.reps = static_cast<int>(reps_n);
  base.search.budget_seconds = budget;
  base.search.seed = seed;
  base.warmup = static_cast<int>(warmup_n);
  base.threads = Threads(threads);
  base.thread_round = thread_round;
  base.timeout_seconds = timeout;
  base.db_path = db_path;
  base.device = DeviceName(device) == "cuda" ? KREG_DEVICE_CUDA : 0;

  std::vector<py::object> problems;
  const bool one = !py::isinstance<py::list>(dims_list) && !py::isinstance<py::tuple>(dims_list);
  if (one) {
    problems.push_back(dims_list);
  } else {
    for (py::handle d : dims_list) problems.push_back(py::reinterpret_borrow<py::object>(d));
  }
  std::shared_ptr<const Op> the_op = Value(reg.registry->GetOp(op));
  std::vector<NamedValues> named;
  for (const py::object& d : problems) {
    NamedValues values = Value(ParseNamedValues(DimsText(d)));
    Check(the_op->ParseValues(values).status());
    named.push_back(std::move(values));
  }
  absl::StatusOr<TuningDb> db = TuningDb::Load(db_path);
  if (db.status().code() == absl::StatusCode::kNotFound) db = TuningDb();  // a new table
  if (!db.ok()) ThrowFile(db.status());
  // The table must be writable before anything is measured.
  if (absl::Status s = TuningDb::CheckWritable(db_path); !s.ok()) ThrowFile(s);
  db->AddMachine(ThisMachine());

  py::list results;
  for (NamedValues& values : named) {
    TuneRequest request = base;
    request.values = std::move(values);
    std::atomic<bool> stop{false};
    PyObserver observer(progress, &stop);
    absl::StatusOr<TuneResult> result;
    {
      SigintStops sigint(&stop);
      py::gil_scoped_release release;
      result = kreg::Tune(*reg.registry, request, &*db, &observer, &stop);
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C: KeyboardInterrupt
    observer.Rethrow();
    if (!result.ok()) {
      if (result.status().code() == absl::StatusCode::kPermissionDenied ||
          result.status().code() == absl::StatusCode::kDataLoss) {
        ThrowFile(result.status());
      }
      Throw(result.status());
    }
    results.append(JsonToPython(cli::TuneResultJson(*result, StrategyName(parsed))));
  }
  return one ? results[0] : py::object(results);
}

}  // namespace

PYBIND11_MODULE(_kreg, m) {
  m.doc() = "kreg's C++ core: the registry, calls of any op on your arrays, tuning tables, the dispatcher, the tuner";

  m.def("install_prefix", [] { return InstallPrefix(); },
        "Where kreg's library is installed or built; plugins and tables are found beside it.");
  m.def("set_log_level", [](const std::string& level) { SetLogLevel(Value(ParseLogLevel(level))); },
        py::arg("level"), "'error', 'warn', 'info' or 'debug' (KREG_LOG's values); messages go to stderr.");
  m.def("log_level", [] { return std::string(LogLevelName(GetLogLevel())); });
  m.def("machine", [] { return JsonToPython(cli::MachineJson(ThisMachine())); },
        "This machine's fingerprint, as `kreg machine --json`.");

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
      .def_property_readonly("device", [](const Kernel& k) { return k.device() == KREG_DEVICE_CUDA ? "cuda" : "cpu"; })
      .def_property_readonly("isa", [](const Kernel& k) { return IsaString(k.required_isa()); })
      .def_property_readonly("reference", &Kernel::is_reference)
      .def("__repr__", [](const Kernel& k) {
        return absl::StrCat("<kreg.Kernel ", k.name(), k.available() ? "" : " (unavailable)", ">");
      });

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
             const std::string& dtype, const py::object& threads, const std::string& device, const py::kwargs& kwargs) {
            return RunKernel(*Value(r.registry->Get(name)), params, out, dtype, threads, device, kwargs);
          },
          py::arg("kernel"), py::kw_only(), py::arg("params") = py::dict(), py::arg("out") = py::none(),
          py::arg("dtype") = "", py::arg("threads") = 0, py::arg("device") = "cpu");

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
             const std::string& machine, bool shipped, const std::string& device) {
            cli::Flags flags = AnswerFlags(machine, shipped, Threads(threads), dtype, with, data_class);
            flags.device = DeviceName(device);
            return Query(*r.registry, d.AnsweringLut(r.registry, flags), op, dims, flags);
          },
          py::arg("registry"), py::arg("op"), py::arg("dims"), py::kw_only(), py::arg("dtype") = "",
          py::arg("with_") = "", py::arg("data_class") = "", py::arg("threads") = 0, py::arg("machine") = "similar",
          py::arg("shipped") = true, py::arg("device") = "cpu");

  py::class_<PyDispatcher>(m, "Dispatcher")
      .def(py::init([](const PyRegistry& r, const PyTuningDb* db, const std::string& machine, bool shipped) {
             cli::Flags flags = AnswerFlags(machine, shipped, 0, "", "", "");
             if (CudaDevices().ok()) flags.device = "cuda";  // the GPUs' records, for run(device="cuda")
             Lut lut = Value(cli::AnsweringLut(flags, *r.registry, db != nullptr ? db->db : TuningDb(), db != nullptr ? db->path : ""));
             PyDispatcher d;
             d.registry = r.registry;
             d.dispatcher.emplace(Value(Dispatcher::Create(*r.registry, std::move(lut))));
             return d;
           }),
           py::arg("registry"), py::arg("db") = nullptr, py::arg("machine") = "similar", py::arg("shipped") = true)
      .def(
          "run",
          [](PyDispatcher& d, const std::string& op, const py::object& out, const std::string& dtype,
             const py::object& threads,
             const std::string& device, const py::kwargs& kwargs) {
            const Op* found = d.dispatcher->FindOp(op);
            if (found == nullptr) Check(d.registry->GetOp(op).status());  // names the known ops
            const std::string where = DeviceName(device);
            Call call(Value(d.registry->GetOp(op)), kwargs, out, dtype);
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
            // The params as a dict, as query's answers have them.
            std::shared_ptr<const Kernel> kernel = Value(d.registry->Get(result->kernel));
            std::vector<std::pair<std::string, std::string>> pairs;
            for (absl::string_view item : absl::StrSplit(result->config, ' ', absl::SkipEmpty())) {
              pairs.emplace_back(absl::StrSplit(item, absl::MaxSplits('=', 1)));
            }
            const Config config = Value(kernel->ParseConfig(pairs));
            py::dict last;
            last["kernel"] = result->kernel;
            last["params"] = JsonToPython(cli::ParamsJson(ToProtoConfig(*kernel, config)));
            last["match"] = std::string(MatchName(result->match));
            last["data_class"] = result->data_class;
            d.last = last;
            return call.Results();
          },
          py::arg("op"), py::kw_only(), py::arg("out") = py::none(), py::arg("dtype") = "", py::arg("threads") = 0,
          py::arg("device") = "cpu")
      .def_readonly("last", &PyDispatcher::last,
                    "What the last run ran: kernel, params (a dict, as query's), match, data_class.");

  m.def("tune", &Tune, py::arg("registry"), py::arg("op"), py::arg("dims"), py::arg("db"), py::kw_only(),
        py::arg("strategy") = "halving", py::arg("budget") = 0.0, py::arg("reps") = 10, py::arg("warmup") = 3,
        py::arg("variants") = std::vector<std::string>{}, py::arg("dtype") = "", py::arg("with_") = "",
        py::arg("dist") = "normal", py::arg("seed") = 1, py::arg("threads") = 0, py::arg("timeout") = 30.0,
        py::arg("thread_round") = true, py::arg("data_class") = "", py::arg("device") = "cpu",
        py::arg("progress") = py::none());
}

}  // namespace kreg::python
