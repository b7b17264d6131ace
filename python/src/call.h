// One call of an op from Python: the caller's arrays seen as DLTensors
// without copying (the buffer protocol, else DLPack), dims and attributes
// from keyword arguments as values (integers stay integers), outputs made
// as NumPy arrays; and running it on the CPU, on GPU 0 (host arrays copied
// there and back), or in place on the CUDA device the arrays are on, on the
// caller's stream.
#ifndef KREG_PYTHON_CALL_H_
#define KREG_PYTHON_CALL_H_

#include <pybind11/pybind11.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "errors.h"
#include "kreg/op.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "kreg/tensor.h"

namespace kreg::python {

// The CUDA stream a call on CUDA arrays runs on: the caller's `stream=`, a
// cudaStream_t as an integer (torch.cuda.Stream.cuda_stream), else 0, the
// legacy default stream.
struct CallStream {
  uintptr_t handle = 0;
  bool given = false;
  // The value __dlpack__(stream=) takes for it: DLPack numbers the legacy
  // default stream 1 (0 is ambiguous there), the per-thread one 2, others
  // by their handle, as CUDA's own cudaStreamLegacy and cudaStreamPerThread.
  py::int_ dlpack() const { return py::int_(handle == 0 ? uintptr_t{1} : handle); }
};

// `stream=` as a CallStream (ValueError for what is not a handle).
CallStream StreamOf(const py::object& stream);

// A caller's array seen as a DLTensor, without copying: through the buffer
// protocol (NumPy, array.array, memoryview), else DLPack's __dlpack__
// (PyTorch, JAX, CuPy). A CUDA array (kDLCUDA, or kDLCUDAManaged, seen as
// kDLCUDA) is asked for with `stream`, so its producer orders its pending
// work before what kreg enqueues there. Holds the array for the call.
class Borrowed {
 public:
  Borrowed(const std::string& name, const py::handle& array, bool write, const CallStream& stream)
      : object_(py::reinterpret_borrow<py::object>(array)) {
    if (PyObject_CheckBuffer(array.ptr())) {
      FromBuffer(name, write);
    } else if (py::hasattr(array, "__dlpack__")) {
      FromDlpack(name, stream);
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
  // kDLCPU, or kDLCUDA with the device's ordinal.
  DLDevice device() const { return dl_.device; }
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

  static bool IsCuda(int device_type) { return device_type == kDLCUDA || device_type == kDLCUDAManaged; }

  void FromDlpack(const std::string& name, const CallStream& stream) {
    // DLPack's stream protocol: a device array is exported for a stream.
    bool cuda = false;
    if (py::hasattr(object_, "__dlpack_device__")) {
      const py::tuple where = object_.attr("__dlpack_device__")();
      cuda = where.size() == 2 && IsCuda(py::int_(where[0]).cast<int>());
    }
    capsule_ = cuda ? object_.attr("__dlpack__")(py::arg("stream") = stream.dlpack()) : object_.attr("__dlpack__")();
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
    if (managed == nullptr) {
      PyErr_Clear();
      throw py::value_error(absl::StrCat("'", name, "': __dlpack__ did not give a DLPack tensor capsule"));
    }
    // Not consumed: the capsule's destructor frees the tensor when we let go.
    const DLTensor& t = managed->dl_tensor;
    if (IsCuda(t.device.device_type) && !cuda) {
      throw py::value_error(absl::StrCat("'", name, "': a CUDA tensor without __dlpack_device__, so kreg cannot "
                                         "ask for it on the stream it runs on"));
    }
    if (t.device.device_type != kDLCPU && !IsCuda(t.device.device_type)) {
      throw py::value_error(absl::StrCat("'", name, "': the tensor is on DLPack device ", t.device.device_type,
                                         "; kreg takes host arrays and CUDA ones"));
    }
    absl::StatusOr<DType> dtype = FromDLDataType(t.dtype);
    if (!dtype.ok()) throw py::value_error(absl::StrCat("'", name, "': ", dtype.status().message()));
    dtype_ = *dtype;
    dl_ = t;
    if (cuda) dl_.device = {kDLCUDA, t.device.device_id};  // managed memory is the device's too
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

// dtype=, with_=, dist= and seed= as kreg run's --dtype, --with, --dist
// and --seed take them (ValueError naming the argument otherwise).
ProblemOptions OptionsOf(const std::string& dtype, const std::string& with = "",
                         const std::string& dist = "normal", uint64_t seed = 1);

// The NumPy array an output is returned in.
py::object NewArray(DType dtype, const std::vector<int64_t>& shape);

// Where a call's arrays are: -1 for all on the host, else the ordinal of
// the one CUDA device all are on; ValueError naming two that disagree.
int PlacementOf(const std::map<std::string, std::unique_ptr<Borrowed>>& given,
                const std::map<std::string, std::unique_ptr<Borrowed>>& outs);

// One call of an op: its arguments over the caller's arrays and the outputs
// made for it. Built with the GIL held; run without it. On CUDA arrays
// (device_ordinal() >= 0) its args are KREG_ARGS_ON_DEVICE and its outputs
// are the caller's (out=; an optional one not given is left out): kreg
// makes host arrays only.
class Call {
 public:
  // `kwargs`: the op's tensors (arrays), dims and attributes by name;
  // `out`: arrays for outputs; `dtype`: as `kreg run --dtype` ("bf16",
  // "out=f32,...") for tensors no array decides; `stream`: what CUDA
  // arrays are exported for and the call runs on.
  Call(std::shared_ptr<const Op> op, const py::kwargs& kwargs, const py::object& out, const std::string& dtype,
       const CallStream& stream = {})
      : op_(std::move(op)), stream_(stream) {
    const Op& o = *op_;
    NamedValues named;  // values that are not integers, as text (float attributes)
    Dims ints;          // integers (and bools) as they are
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
        given[name] = std::make_unique<Borrowed>(name, value, o.tensors()[t].role == KREG_ROLE_INOUT, stream);
      } else if (o.FindDim(name) >= 0 || o.FindAttr(name) >= 0) {
        int overflow = 0;
        const long long v = PyLong_Check(value.ptr()) ? PyLong_AsLongLongAndOverflow(value.ptr(), &overflow) : 0;
        if (PyLong_Check(value.ptr()) && overflow == 0) {
          ints.emplace_back(name, v);  // a bool is an int: 1 or 0
        } else {
          named.emplace_back(name, py::str(value).cast<std::string>());
        }
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
        outs[name] = std::make_unique<Borrowed>(name, value, /*write=*/true, stream);
      }
    }
    ordinal_ = PlacementOf(given, outs);
    if (stream.given && ordinal_ < 0) {
      throw py::value_error("stream: only a call on CUDA arrays runs on a caller's stream; these are host arrays");
    }

    ProblemOptions options = OptionsOf(dtype);
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
    if (named.empty()) {
      values_ = Value(o.ParseValues(ints));
    } else {
      for (const auto& [name, v] : ints) named.emplace_back(name, absl::StrCat(v));
      values_ = Value(o.ParseValues(named));
    }
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
        const std::vector<int64_t> shape = o.ShapeOf(static_cast<int>(t), values_);
        if (ordinal_ >= 0 && info.optional) continue;  // left out: only the caller's arrays are on the device
        if (ordinal_ >= 0) {
          throw py::value_error(absl::StrCat("'", info.name, "': a call on cuda:", ordinal_, " writes into arrays you "
                                             "give: pass out={'", info.name, "': a ", DTypeName(*types[t]), " array [",
                                             absl::StrJoin(shape, ", "), "] on cuda:", ordinal_,
                                             "} (kreg makes host arrays only)"));
        }
        b = std::make_unique<Borrowed>(info.name, NewArray(*types[t], shape), true, stream);
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
    if (ordinal_ >= 0) args_.flags |= KREG_ARGS_ON_DEVICE;
    args_.tensors = tensors_.data();
    args_.num_tensors = tensors_.size();
    args_.dims = values_.dims.data();
    args_.num_dims = values_.dims.size();
    args_.attrs = values_.attrs.data();
    args_.num_attrs = values_.attrs.size();
  }

  const kreg_args& args() const { return args_; }
  const Op& op() const { return *op_; }
  // -1: host arrays; else the CUDA device they are on.
  int device_ordinal() const { return ordinal_; }
  void* stream() const { return reinterpret_cast<void*>(stream_.handle); }

  // {output name: array}: the caller's `out` arrays themselves, or new ones.
  py::dict Results() const {
    py::dict d;
    for (const auto& [name, array] : results_) d[py::str(name)] = array;
    return d;
  }

 private:
  std::shared_ptr<const Op> op_;
  CallStream stream_;
  int ordinal_ = -1;
  Values values_;
  std::vector<std::unique_ptr<Borrowed>> held_;
  std::vector<int> held_names_;  // each held array's tensor index
  std::vector<DLTensor*> tensors_;
  std::vector<std::pair<std::string, py::object>> results_;
  kreg_args args_{};
};

// `run` on a call's arrays: on the CPU in place; on CUDA arrays in place,
// on their device and the call's stream, enqueued and not waited for (the
// caller orders later work on that stream after it); on host arrays with
// DeviceKind::kCuda on GPU 0 (the arrays copied there, the run, then its
// outputs copied back into them). Called without the GIL.
absl::Status RunOn(DeviceKind device, const Call& call, RunOptions options,
                   const std::function<absl::Status(const kreg_args&, const RunOptions&)>& run);

// "cpu" or "cuda" (ValueError otherwise); "cuda" where there is no GPU
// raises RuntimeError saying why.
DeviceKind DeviceOf(const std::string& device);

// Where `call` runs: `device` ("cpu", "cuda", or "" for where its arrays
// are) against where its arrays are; ValueError for "cpu" with CUDA arrays.
DeviceKind WhereToRun(const std::string& device, const Call& call);

// Registry.run: `kernel` with `params` (overrides of its default
// configuration) on the call's arrays.
py::dict RunKernel(const Kernel& kernel, const py::dict& params, const py::object& out, const std::string& dtype,
                   const py::object& threads, const std::string& device, const py::object& stream,
                   const py::kwargs& kwargs);

}  // namespace kreg::python

#endif  // KREG_PYTHON_CALL_H_
