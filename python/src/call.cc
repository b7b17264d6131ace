#include "call.h"

#include <pybind11/numpy.h>

#include <mutex>

#include "kreg/device.h"

namespace kreg::python {

ProblemOptions OptionsOf(const std::string& dtype, const std::string& with, const std::string& dist, uint64_t seed) {
  ProblemOptions options;
  if (!dtype.empty()) {
    absl::StatusOr<std::map<std::string, DType>> dtypes = ParseDTypes(dtype);
    if (!dtypes.ok()) throw py::value_error(absl::StrCat("dtype ", dtypes.status().message()));
    options.dtypes = *std::move(dtypes);
  }
  absl::StatusOr<std::vector<std::string>> names = SplitList(with);
  if (!names.ok()) throw py::value_error(absl::StrCat("with_: ", names.status().message()));
  options.with.insert(names->begin(), names->end());
  absl::StatusOr<Dist> d = ParseDist(dist);
  if (!d.ok()) throw py::value_error(absl::StrCat("dist: ", d.status().message()));
  options.dist = *d;
  options.seed = seed;
  return options;
}

// The NumPy array an output is returned in (NumPy 1 or 2), made through
// NumPy's C API (pybind11's npy_api), uninitialised: the kernel writes every element (the
// conformance suite poisons outputs and checks).
py::object NewArray(DType dtype, const std::vector<int64_t>& shape) {
  static const py::dtype* types[] = {new py::dtype("float32"), new py::dtype("int32"), new py::dtype("uint16")};
  const py::dtype& type = *types[dtype == DType::kF32 ? 0 : dtype == DType::kI32 ? 1 : 2];
  // C-order strides from kreg's own element size: pybind11 2.10 reads the
  // item size from NumPy 1's descriptor layout, which NumPy 2 changed.
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(DTypeSize(dtype));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return py::array(type, std::vector<py::ssize_t>(shape.begin(), shape.end()), strides);
}

CallStream StreamOf(const py::object& stream) {
  CallStream s;
  if (stream.is_none()) return s;
  int overflow = 0;
  const long long v = PyLong_Check(stream.ptr()) ? PyLong_AsLongLongAndOverflow(stream.ptr(), &overflow) : -1;
  if (!PyLong_Check(stream.ptr()) || overflow != 0 || v < 0) {
    throw py::value_error(absl::StrCat("stream: expected a CUDA stream's handle, an integer >= 0 (0 the legacy "
                                       "default stream; torch.cuda.current_stream().cuda_stream), got ",
                                       py::str(py::repr(stream)).cast<std::string>()));
  }
  s.handle = static_cast<uintptr_t>(v);
  s.given = true;
  return s;
}

namespace {

std::string Where(const Borrowed& b) {
  return b.device().device_type == kDLCPU ? "the host" : absl::StrCat("cuda:", b.device().device_id);
}

}  // namespace

int PlacementOf(const std::map<std::string, std::unique_ptr<Borrowed>>& given,
                const std::map<std::string, std::unique_ptr<Borrowed>>& outs) {
  const Borrowed* first = nullptr;
  std::string first_name;
  for (const auto* arrays : {&given, &outs}) {
    for (const auto& [name, b] : *arrays) {
      const std::string named = arrays == &outs ? absl::StrCat("out '", name, "'") : absl::StrCat("'", name, "'");
      if (first == nullptr) {
        first = b.get();
        first_name = named;
      } else if (b->device().device_type != first->device().device_type ||
                 b->device().device_id != first->device().device_id) {
        throw py::value_error(absl::StrCat(first_name, " is on ", Where(*first), " and ", named, " on ", Where(*b),
                                           ": a call's arrays must all be on the host or all on one CUDA device"));
      }
    }
  }
  return first != nullptr && first->device().device_type == kDLCUDA ? first->device().device_id : -1;
}

namespace {

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

}  // namespace

// `run` on a call's arrays: on the CPU in place; with device "cuda" on GPU
// 0 (the arrays copied there, the run, then its outputs copied back into
// them). Called without the GIL.
absl::Status RunOn(DeviceKind device, const Call& call, RunOptions options,
                   const std::function<absl::Status(const kreg_args&, const RunOptions&)>& run) {
  if (call.device_ordinal() >= 0) {
    // In place, on the caller's stream, not waited for. Data the host
    // cannot read unsynchronised (group sizes, row ranges) is not
    // validated: the device kernels clamp it.
    absl::StatusOr<std::unique_ptr<Device>> gpu = OpenCudaOnStream(call.device_ordinal(), call.stream());
    if (!gpu.ok()) return gpu.status();
    options.device = (*gpu)->abi();
    return run(call.args(), options);
  }
  if (device == DeviceKind::kCpu) return run(call.args(), options);
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

DeviceKind DeviceOf(const std::string& device) {
  absl::StatusOr<DeviceKind> kind = ParseDevice(device);
  if (!kind.ok()) throw py::value_error(absl::StrCat("device '", device, "': expected 'cpu' or 'cuda'"));
  if (*kind == DeviceKind::kCuda) {
    absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
    if (!gpus.ok()) Throw(absl::UnavailableError(absl::StrCat("device='cuda': ", gpus.status().message())));
  }
  return *kind;
}

DeviceKind WhereToRun(const std::string& device, const Call& call) {
  const int ordinal = call.device_ordinal();
  const DeviceKind kind = DeviceOf(device.empty() ? (ordinal >= 0 ? "cuda" : "cpu") : device);
  if (kind == DeviceKind::kCpu && ordinal >= 0) {
    throw py::value_error(absl::StrCat("device='cpu', but the arrays are on cuda:", ordinal,
                                       ": leave device= out (or 'cuda') to run there, or pass host arrays"));
  }
  return kind;
}

py::dict RunKernel(const Kernel& kernel, const py::dict& params, const py::object& out, const std::string& dtype,
                   const py::object& threads, const std::string& device, const py::object& stream,
                   const py::kwargs& kwargs) {
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
  const Config config = overrides.empty() ? kernel.DefaultConfig() : Value(kernel.ParseConfig(overrides));
  Call call(kernel.op_ptr(), kwargs, out, dtype, StreamOf(stream));
  const DeviceKind where = WhereToRun(device, call);
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

}  // namespace kreg::python
