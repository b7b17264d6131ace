// Ops as data. An Op is the host's reading of a plugin's kreg_op_desc: its
// dims, tensors and attributes. From it, and nowhere else, the host derives
// what every op needs:
//
//   Validate     shapes, dtypes, strides, dim limits, attribute ranges, and
//                the op's own validator, for any kreg_args;
//   ParseValues  "batch=8,n=1000,largest=0" into dims and attributes;
//   Complete     dims left out that default to another dim (default_dim);
//   ResolveTypes which tensors a problem has and their dtypes;
//   KeyOf        the tuning key of a call (dtype signature and key dims),
//                from its arguments: tune, query and dispatch all use it;
//   ShapeArgs    shape-only arguments, for legality checks without data.
//
// An Op keeps its plugin loaded (the descriptor lives in it). Immutable after
// loading; all methods are thread-safe.
#ifndef KREG_REGISTRY_OP_H_
#define KREG_REGISTRY_OP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/plugin_abi.h"
#include "kreg/tensor.h"

namespace kreg {

// Named problem dimensions and integer attributes, in the op's order
// ("batch=8,n=1000,k=10").
using Dims = std::vector<std::pair<std::string, int64_t>>;
// NAME=INTEGER items; InvalidArgument naming a bad one.
absl::StatusOr<Dims> ParseDims(absl::string_view text);
std::string DimsString(const Dims& dims);
// DimsString(dims) appended to *out.
void AppendDims(const Dims& dims, std::string* out);
// NAME=VALUE items ("n=10,alpha=0.5"), values as text.
using NamedValues = std::vector<std::pair<std::string, std::string>>;
absl::StatusOr<NamedValues> ParseNamedValues(absl::string_view text);
// The items of a comma-separated list, trimmed; none for blank text.
// InvalidArgument for an empty item ("a,,b", "a,").
absl::StatusOr<std::vector<std::string>> SplitList(absl::string_view text);

// DType <-> KREG_DTYPE_* bit.
uint32_t DTypeBit(DType dtype);
// "f32", "f32|bf16".
std::string DTypeSetString(uint32_t bits);

class LoadedPlugin;

struct DimInfo {
  std::string name, doc;
  int64_t max = INT64_MAX;
  int default_dim = -1;  // index of an earlier dim whose value it takes when not given, or -1
  bool mesh_axis = false;  // KREG_DIM_MESH_AXIS: the mesh axis of its name's size
  int numerator = -1, denominator = -1;  // a derived dim: dims[numerator] / dims[denominator]
  int64_t bytes_per_unit = 0;            // kernels' memory per unit beyond the tensors
};

// A device mesh: its axes' names and sizes, the first varying slowest
// ({{"x", 2}, {"y", 4}} is "2x4").
using Mesh = std::vector<std::pair<std::string, int>>;
// "2x4" (axes x, y, z, w in order) or "x=2,y=4"; InvalidArgument naming
// the problem.
absl::StatusOr<Mesh> ParseMesh(absl::string_view text);
std::string MeshString(const Mesh& mesh);  // "x=2,y=4"

struct Tolerance {
  DType dtype;
  double atol = 0, rtol = 0;
  int scale_dim = -1;  // index into dims, or -1
  bool magnitude = false;        // KREG_TOLERANCE_MAGNITUDE
  bool bf16_daz = false;         // KREG_TOLERANCE_BF16_DAZ
  bool exact_nonfinite = false;  // KREG_TOLERANCE_EXACT_NONFINITE
};

struct TensorInfo {
  std::string name, doc;
  kreg_role role = KREG_ROLE_IN;
  bool optional = false, unchecked = false;
  uint32_t dtypes = 0;  // KREG_DTYPE_* bits
  int same_dtype_as = -1;  // index of an earlier tensor, or -1
  std::vector<int> shape;  // indices into dims
  // The shape in force while INT attribute alt_shape_attr (an index into
  // attrs, or -1 for none) is non-zero.
  std::vector<int> alt_shape;
  int alt_shape_attr = -1;
  kreg_gen gen = KREG_GEN_VALUES;
  int gen_dim = -1;
  std::vector<Tolerance> tolerances;
  bool is_input() const { return role != KREG_ROLE_OUT; }
  bool is_output() const { return role != KREG_ROLE_IN; }
  // Free: its dtype is a choice (several allowed, not tied to another's).
  bool free_dtype() const;
  const Tolerance* ToleranceFor(DType dtype) const;
  // Its shape (indices into dims) under the op's attribute values `attrs`.
  const std::vector<int>& ShapeUnder(const kreg_scalar* attrs) const {
    return alt_shape_attr >= 0 && attrs[alt_shape_attr].i != 0 ? alt_shape : shape;
  }
};

struct AttrInfo {
  std::string name, doc;
  bool is_float = false;
  kreg_scalar default_value{}, min{}, max{};
};

// A problem's values: every dim (-1 while unknown) and every attribute.
struct Values {
  std::vector<int64_t> dims;
  std::vector<kreg_scalar> attrs;
};

// Which tensors a problem has and their dtypes: one per tensor of the op,
// nullopt for an absent optional one.
using TensorTypes = std::vector<std::optional<DType>>;

// What the tuning key holds of a call, derived from its arguments.
struct OpKey {
  // The dtypes of the present tensors whose dtype is free, comma-separated in
  // the op's order, then "+NAME" for each optional input present:
  // "f32", "bf16,f32", "f32+row_starts+row_ends".
  std::string dtype;
  // The op's dims, then the integer attributes that differ from their
  // defaults.
  Dims dims;
};

// Shape-only arguments: tensors with shapes and dtypes whose data must not be
// read (KREG_ARGS_SHAPE_ONLY). Not copyable (args() points into it).
class ShapeArgs {
 public:
  ShapeArgs() = default;
  ShapeArgs(const ShapeArgs&) = delete;
  ShapeArgs& operator=(const ShapeArgs&) = delete;
  const kreg_args* args() const { return &args_; }

 private:
  friend class Op;
  // Inline for ops of up to 8 tensors of rank 4: a Lut query makes one per
  // nearest lookup, without allocating them.
  absl::InlinedVector<absl::InlinedVector<int64_t, 4>, 8> shapes_;
  absl::InlinedVector<DLTensor, 8> tensors_;
  absl::InlinedVector<DLTensor*, 8> pointers_;
  Values values_;
  kreg_args args_{};
};

class Op {
 public:
  // Reads `desc` (fields covered by its struct_size only) and checks it:
  // InvalidArgument naming the problem. `plugin` is kept loaded.
  static absl::StatusOr<std::shared_ptr<const Op>> Read(const kreg_op_desc& desc,
                                                        std::shared_ptr<const LoadedPlugin> plugin);

  const std::string& name() const { return name_; }
  const std::string& doc() const { return doc_; }
  const std::string& plugin_path() const;
  const std::vector<DimInfo>& dims() const { return dims_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<AttrInfo>& attrs() const { return attrs_; }
  int FindDim(absl::string_view name) const;
  int FindTensor(absl::string_view name) const;
  int FindAttr(absl::string_view name) const;
  // Collective ops have a dim the communicator's size sets (KREG_DIM_RANKS):
  // its index, or -1.
  int ranks_dim() const { return ranks_dim_; }
  bool collective() const { return ranks_dim_ >= 0; }
  // Sets the ranks dim of `values` to `ranks`; InvalidArgument when the op
  // is not collective or the dim was given another value.
  absl::Status SetRanks(Values* values, int ranks) const;
  // Whether the op has mesh-axis dims, and setting them (and the ranks dim,
  // to the mesh's size) from `mesh`: InvalidArgument for a mesh without one
  // of the op's axes, or values given that disagree.
  bool uses_mesh() const;
  absl::Status SetMesh(Values* values, const Mesh& mesh) const;
  // Preferred variants when nothing is tuned (descriptor order).
  const std::vector<std::string>& default_variants() const { return default_variants_; }
  // The op's own choice for shape-only `args` on `host`, or "" for none.
  std::string DefaultVariant(const kreg_args& args, const kreg_host& host) const;
  // "dims batch, n, k; tensors input [batch,n] f32|bf16 in; ...": for help
  // and errors. A dim with a default reads "local_groups (default groups)",
  // a tensor with an alternative shape "rhs [g,k,n] (transpose_rhs!=0:
  // [g,n,k]) ...".
  std::string Describe() const;

  // ---- Values
  // Parses dims and attributes by name: dims and INT attributes take
  // integers, FLOAT attributes numbers. Dims not given stay -1; attributes
  // not given take their defaults. InvalidArgument for an unknown name (the
  // message lists the op's names), a bad number, a negative or too large dim
  // or an attribute out of range.
  absl::StatusOr<Values> ParseValues(const NamedValues& named) const;
  absl::StatusOr<Values> ParseValues(const Dims& dims) const;
  // InvalidArgument naming the first dim still -1.
  absl::Status CheckComplete(const Values& values) const;
  // Gives each dim still -1 that has a default_dim that dim's value, and
  // each derived dim its quotient (InvalidArgument where the division is
  // not exact, or a derived dim given disagrees), then CheckComplete. Call it once every source of dims (the user's names,
  // DimsFromInputs) has been read.
  absl::Status Complete(Values* values) const;
  // The key dims of `values`: dims, then INT attributes differing from their
  // defaults.
  Dims KeyDims(const Values& values) const;

  // ---- Tensors and dtypes
  // Resolves which tensors are present and their dtypes. Optional inputs are
  // present when named in `with` or in `given`; optional outputs always.
  // A tensor's dtype: its same_dtype_as tensor's; else a given input's; else
  // `requested[name]`; else requested[""] if the tensor allows it; else the
  // first dtype it allows. InvalidArgument for a requested dtype no tensor
  // allows, an unknown name, or a given/with name that is not an optional
  // input.
  absl::StatusOr<TensorTypes> ResolveTypes(const std::map<std::string, DType>& requested,
                                           const std::set<std::string>& with,
                                           const std::map<std::string, DType>& given) const;
  // The tensor types an OpKey's dtype string names (its inverse).
  absl::StatusOr<TensorTypes> TypesFromKey(absl::string_view key_dtype) const;
  // Fills the dims that given inputs' shapes determine (each input read by
  // its shape under values->attrs); InvalidArgument when an input's rank or
  // a dim disagrees.
  absl::Status DimsFromInputs(const std::map<std::string, const Tensor*>& given, Values* values) const;
  // The same from tensors' shapes by name (a caller's arrays).
  absl::Status DimsFromShapes(const std::map<std::string, std::vector<int64_t>>& shapes, Values* values) const;
  // The shape of tensor `t` under complete `values` (its alt_shape where its
  // attribute says so).
  std::vector<int64_t> ShapeOf(int t, const Values& values) const;

  // ---- Arguments
  // Validates `args` for this op: counts, dims within limits, attributes in
  // range, every mandatory tensor present, each present tensor on the CPU
  // with an allowed dtype (and its same_dtype_as's), the shape its dims
  // say, a contiguous last dimension, non-overlapping rows, and data unless
  // shape-only; then the op's validator. InvalidArgument naming the op and
  // the problem.
  absl::Status Validate(const kreg_args& args) const;
  // The key of a valid call.
  OpKey KeyOf(const kreg_args& args) const;
  // The op's data class of a valid call with data ("" without a classifier,
  // or for shape-only args).
  absl::StatusOr<std::string> DataClass(const kreg_args& args) const;
  bool has_data_class() const { return data_class_ != nullptr; }
  // Shape-only arguments for `values` (completed: see Complete) and
  // `types`, validated.
  absl::Status MakeShapeArgs(const Values& values, const TensorTypes& types, ShapeArgs* out) const;

  const kreg_op_desc& desc() const { return *desc_; }

 private:
  Op() = default;
  std::shared_ptr<const LoadedPlugin> plugin_;
  const kreg_op_desc* desc_ = nullptr;
  std::string name_, doc_;
  std::vector<DimInfo> dims_;
  std::vector<TensorInfo> tensors_;
  std::vector<AttrInfo> attrs_;
  std::vector<std::string> default_variants_;
  int ranks_dim_ = -1;
  // "[batch,n]": a shape's dim names.
  std::string DimNames(const std::vector<int>& shape) const;
  // For a tensor with an alt_shape: " (rhs is [groups,n,k] with
  // transpose_rhs=1)", the layout in force under `attrs`; else "".
  std::string AltShapeNote(const TensorInfo& t, const kreg_scalar* attrs) const;

  kreg_status (*validate_)(const kreg_args*, char*, size_t) = nullptr;
  kreg_status (*data_class_)(const kreg_args*, char*, size_t) = nullptr;
  const char* (*default_variant_)(const kreg_args*, const kreg_host*) = nullptr;
};

}  // namespace kreg

#endif  // KREG_REGISTRY_OP_H_
