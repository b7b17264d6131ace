// An Op's tensors and dtypes (resolving a call's types, dims from its
// inputs' shapes) and its arguments: validating a call, its key and data
// class, and shape-only arguments.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/limits.h"
#include "kreg/op.h"
#include "op_internal.h"

namespace kreg {

using op_internal::kAllTypes;

namespace {

std::string ShapeText(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// Never read: shape-only tensors point here so "has data" checks pass.
alignas(64) unsigned char kNoData[64];

}  // namespace

// ---- Tensors and dtypes -------------------------------------------------------------

absl::StatusOr<TensorTypes> Op::ResolveTypes(const std::map<std::string, DType>& requested,
                                             const std::set<std::string>& with,
                                             const std::map<std::string, DType>& given) const {
  auto bad = [&](absl::string_view why) { return absl::InvalidArgumentError(absl::StrCat(name_, ": ", why)); };
  for (const std::string& name : with) {
    const int t = FindTensor(name);
    if (t < 0 || !tensors_[t].optional || !tensors_[t].is_input()) {
      return bad(absl::StrCat("'", name, "' is not an optional input"));
    }
  }
  for (const auto& [name, dtype] : given) {
    const int t = FindTensor(name);
    if (t < 0 || !tensors_[t].is_input()) {
      std::vector<absl::string_view> inputs;
      for (const TensorInfo& info : tensors_) {
        if (info.is_input()) inputs.push_back(info.name);
      }
      return bad(absl::StrCat("unknown input '", name, "' (inputs: ", absl::StrJoin(inputs, ", "), ")"));
    }
  }
  bool any_takes_default = !requested.contains("");
  for (const auto& [name, dtype] : requested) {
    if (name.empty()) continue;
    const int t = FindTensor(name);
    if (t < 0) return bad(absl::StrCat("--dtype names '", name, "', which is not a tensor"));
    if (!(tensors_[t].dtypes & DTypeBit(dtype))) {
      return bad(absl::StrCat("tensor '", name, "' takes ", DTypeSetString(tensors_[t].dtypes), ", not ",
                              DTypeName(dtype)));
    }
  }
  TensorTypes types(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    const bool present = !t.optional || !t.is_input() || with.contains(t.name) || given.contains(t.name);
    if (!present) continue;
    if (t.same_dtype_as >= 0) {
      types[i] = types[t.same_dtype_as];
      if (!types[i] || !(t.dtypes & DTypeBit(*types[i]))) {
        return bad(absl::StrCat("tensor '", t.name, "' must have the dtype of '", tensors_[t.same_dtype_as].name,
                                "', which it does not allow"));
      }
      if (auto g = given.find(t.name); g != given.end() && g->second != *types[i]) {
        return bad(absl::StrCat("input '", t.name, "' holds ", DTypeName(g->second), " but must have the dtype of '",
                                tensors_[t.same_dtype_as].name, "' (", DTypeName(*types[i]), ")"));
      }
      // Its dtype is not its own to choose: one asked for it must be what it gets.
      if (auto r = requested.find(t.name); r != requested.end() && r->second != *types[i]) {
        return bad(absl::StrCat("tensor '", t.name, "' has the dtype of '", tensors_[t.same_dtype_as].name, "' (",
                                DTypeName(*types[i]), "), not ", DTypeName(r->second), ": set that of '",
                                tensors_[t.same_dtype_as].name, "'"));
      }
    } else if (auto g = given.find(t.name); g != given.end()) {
      if (!(t.dtypes & DTypeBit(g->second))) {
        return bad(absl::StrCat("input '", t.name, "' takes ", DTypeSetString(t.dtypes), ", the file holds ",
                                DTypeName(g->second)));
      }
      // A --dtype for this input (by name, or for every free dtype) must be
      // what its file holds.
      auto r = requested.find(t.name);
      if (r == requested.end() && t.free_dtype()) r = requested.find("");
      if (r != requested.end()) {
        if (r->second != g->second) {
          return bad(absl::StrCat("--dtype ", DTypeName(r->second), " contradicts input '", t.name,
                                  "', whose file holds ", DTypeName(g->second)));
        }
        any_takes_default = true;
      }
      types[i] = g->second;
    } else if (auto r = requested.find(t.name); r != requested.end()) {
      types[i] = r->second;
    } else if (auto all = requested.find(""); all != requested.end() && (t.dtypes & DTypeBit(all->second))) {
      types[i] = all->second;
      any_takes_default = any_takes_default || t.free_dtype();
    } else {
      for (DType dt : kAllTypes) {
        if (t.dtypes & DTypeBit(dt)) {
          types[i] = dt;
          break;
        }
      }
    }
  }
  if (!any_takes_default) {
    return bad(absl::StrCat("no tensor whose dtype is a choice takes ", DTypeName(requested.at("")), " (",
                            Describe(), ")"));
  }
  return types;
}

absl::StatusOr<TensorTypes> Op::TypesFromKey(absl::string_view key_dtype) const {
  std::vector<absl::string_view> parts = absl::StrSplit(key_dtype, '+');
  std::map<std::string, DType> requested;
  std::set<std::string> with;
  for (size_t i = 1; i < parts.size(); ++i) with.emplace(parts[i]);
  std::vector<absl::string_view> dtypes;
  if (!parts[0].empty()) dtypes = absl::StrSplit(parts[0], ',');
  // The free tensors in order take the listed dtypes.
  size_t next = 0;
  for (const TensorInfo& t : tensors_) {
    const bool present = !t.optional || !t.is_input() || with.contains(t.name);
    if (!present || !t.free_dtype()) continue;
    if (next >= dtypes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": dtype '", key_dtype, "' names too few dtypes"));
    }
    absl::StatusOr<DType> dt = ParseDType(dtypes[next++]);
    if (!dt.ok()) return dt.status();
    requested[t.name] = *dt;
  }
  if (next != dtypes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": dtype '", key_dtype, "' names too many dtypes"));
  }
  return ResolveTypes(requested, with, {});
}

absl::Status Op::DimsFromInputs(const std::map<std::string, const Tensor*>& given, Values* values) const {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : given) shapes.emplace(name, tensor->shape());
  return DimsFromShapes(shapes, values);
}

absl::Status Op::DimsFromShapes(const std::map<std::string, std::vector<int64_t>>& shapes, Values* values) const {
  for (const auto& [name, given] : shapes) {
    const int t = FindTensor(name);
    if (t < 0) continue;  // ResolveTypes names it
    const TensorInfo& info = tensors_[t];
    const std::vector<int>& shape = info.ShapeUnder(values->attrs.data());
    const std::string layout = AltShapeNote(info, values->attrs.data());
    const std::string shape_text = absl::StrCat("[", absl::StrJoin(given, ", "), "]");
    if (given.size() != shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": input '", name, "' has shape ", shape_text,
                                                     ", expected ", shape.size(), " dimensions", layout));
    }
    for (size_t j = 0; j < shape.size(); ++j) {
      int64_t& dim = values->dims[shape[j]];
      const int64_t got = given[j];
      if (dim >= 0 && dim != got) {
        return absl::InvalidArgumentError(absl::StrCat(name_, ": input '", name, "' has shape ", shape_text, " but ",
                                                       dims_[shape[j]].name, "=", dim, layout));
      }
      if (got > dims_[shape[j]].max) {
        return absl::InvalidArgumentError(absl::StrCat(name_, ": input '", name, "': ", dims_[shape[j]].name,
                                                       "=", got, " exceeds its limit ", dims_[shape[j]].max));
      }
      dim = got;
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> Op::ShapeOf(int t, const Values& values) const {
  std::vector<int64_t> shape;
  for (int d : tensors_[t].ShapeUnder(values.attrs.data())) shape.push_back(values.dims[d]);
  return shape;
}

// ---- Arguments ------------------------------------------------------------------------

absl::Status Op::Validate(const kreg_args& a) const {
  auto bad = [&](absl::string_view why) { return absl::InvalidArgumentError(absl::StrCat(name_, ": ", why)); };
  if (a.struct_size < KREG_ARGS_MIN_SIZE) return bad("args struct_size is too small");
  if (a.num_tensors != tensors_.size() || a.num_dims != dims_.size() || a.num_attrs != attrs_.size() ||
      (a.num_tensors > 0 && a.tensors == nullptr) || (a.num_dims > 0 && a.dims == nullptr) ||
      (a.num_attrs > 0 && a.attrs == nullptr)) {
    return bad(absl::StrCat("args hold ", a.num_tensors, " tensors, ", a.num_dims, " dims and ", a.num_attrs,
                            " attributes; the op has ", tensors_.size(), ", ", dims_.size(), " and ", attrs_.size()));
  }
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (a.dims[i] < 0) return bad(absl::StrCat("dimension ", dims_[i].name, "=", a.dims[i], " is negative"));
    if (a.dims[i] > dims_[i].max) {
      return bad(absl::StrCat("dimension ", dims_[i].name, "=", a.dims[i], " exceeds its limit ", dims_[i].max));
    }
  }
  for (size_t i = 0; i < attrs_.size(); ++i) {
    const AttrInfo& info = attrs_[i];
    const bool ok = info.is_float ? (a.attrs[i].f >= info.min.f && a.attrs[i].f <= info.max.f)
                                  : (a.attrs[i].i >= info.min.i && a.attrs[i].i <= info.max.i);
    if (!ok) {
      return bad(absl::StrCat("attribute ", info.name, "=",
                              info.is_float ? absl::StrCat(a.attrs[i].f) : absl::StrCat(a.attrs[i].i),
                              " is out of range"));
    }
  }
  const bool shape_only = (a.flags & KREG_ARGS_SHAPE_ONLY) != 0;  // data is never read then
  const bool on_device = (a.flags & KREG_ARGS_ON_DEVICE) != 0;    // nor here then
  std::vector<std::optional<DType>> types(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& info = tensors_[i];
    const DLTensor* t = a.tensors[i];
    auto tbad = [&](absl::string_view why) { return bad(absl::StrCat(info.name, " ", why)); };
    if (t == nullptr) {
      if (!info.optional) return tbad("is missing");
      continue;
    }
    if (!on_device && t->device.device_type != kDLCPU) return tbad("is not a CPU tensor");
    if (on_device && t->device.device_type != kDLCUDA) return tbad("is not a CUDA tensor (the args are on a device)");
    absl::StatusOr<DType> dt = FromDLDataType(t->dtype);
    if (!dt.ok() || !(info.dtypes & DTypeBit(*dt))) {
      return tbad(absl::StrCat("must be ", DTypeSetString(info.dtypes),
                               dt.ok() ? absl::StrCat(", not ", DTypeName(*dt)) : std::string()));
    }
    types[i] = *dt;
    if (info.same_dtype_as >= 0 && types[info.same_dtype_as] != types[i]) {
      const std::optional<DType>& other = types[info.same_dtype_as];
      return tbad(absl::StrCat("is ", DTypeName(*dt), " but must have the dtype of ", tensors_[info.same_dtype_as].name,
                               other ? absl::StrCat(" (", DTypeName(*other), ")") : std::string()));
    }
    const std::vector<int>& shape = info.ShapeUnder(a.attrs);
    const int ndim = static_cast<int>(shape.size());
    bool same = t->ndim == ndim && (ndim == 0 || t->shape != nullptr);
    for (int j = 0; same && j < ndim; ++j) same = t->shape[j] == a.dims[shape[j]];
    if (!same) {
      std::vector<int64_t> want;
      for (int dim : shape) want.push_back(a.dims[dim]);
      return tbad(absl::StrCat("has shape ", t->shape ? ShapeText(t->shape, t->ndim) : "NULL", ", expected ",
                               ShapeText(want.data(), ndim), AltShapeNote(info, a.attrs)));
    }
    int64_t numel = 1;
    for (int j = 0; j < ndim; ++j) {
      if (__builtin_mul_overflow(numel, t->shape[j], &numel)) return tbad("has more elements than a 64-bit count holds");
    }
    if (t->strides != nullptr && numel > 0) {
      if (ndim > 0 && t->shape[ndim - 1] > 1 && t->strides[ndim - 1] != 1) {
        return tbad("must be contiguous in its last dimension");
      }
      // Each dimension's stride covers everything inside it, so no two
      // elements share memory.
      int64_t extent = ndim > 0 ? t->shape[ndim - 1] : 1;
      for (int j = ndim - 2; j >= 0; --j) {
        if (t->shape[j] > 1 && t->strides[j] < extent) {
          return tbad(absl::StrCat("has stride ", t->strides[j], " in dimension ", j, ", below the ", extent,
                                   " elements inside it"));
        }
        int64_t span = 0;
        if (__builtin_mul_overflow(t->strides[j], t->shape[j] - 1, &span) ||
            __builtin_add_overflow(span, extent, &span)) {
          return tbad(absl::StrCat("spans more than a 64-bit offset reaches, in dimension ", j));
        }
        extent = std::max(extent, span);
      }
    }
    if (numel > 0 && !shape_only && t->data == nullptr) return tbad("has no data");
  }
  if (validate_ != nullptr) {
    char msg[512] = "";
    // Device data is the host's to check before copying: the op's
    // validator sees shapes only.
    kreg_args shapes = a;
    if (on_device) shapes.flags |= KREG_ARGS_SHAPE_ONLY;
    const kreg_status code = validate_(&shapes, msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    if (code != KREG_OK) return bad(msg[0] ? msg : "arguments refused by the op's validator");
  }
  return absl::OkStatus();
}

OpKey Op::KeyOf(const kreg_args& a) const {
  OpKey key;
  std::vector<absl::string_view> dtypes;
  std::string optional;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& info = tensors_[i];
    const DLTensor* t = a.tensors[i];
    if (t == nullptr) continue;
    if (info.free_dtype()) {
      absl::StatusOr<DType> dt = FromDLDataType(t->dtype);
      dtypes.push_back(dt.ok() ? DTypeName(*dt) : "?");
    }
    if (info.optional && info.is_input()) absl::StrAppend(&optional, "+", info.name);
  }
  key.dtype = absl::StrCat(absl::StrJoin(dtypes, ","), optional);
  Values values;
  values.dims.assign(a.dims, a.dims + a.num_dims);
  values.attrs.assign(a.attrs, a.attrs + a.num_attrs);
  key.dims = KeyDims(values);
  return key;
}

absl::StatusOr<std::string> Op::DataClass(const kreg_args& args) const {
  if (data_class_ == nullptr || (args.flags & (KREG_ARGS_SHAPE_ONLY | KREG_ARGS_ON_DEVICE))) return std::string();
  char out[256] = "";
  const kreg_status code = data_class_(&args, out, sizeof out);
  out[sizeof out - 1] = '\0';
  if (code != KREG_OK) return absl::InternalError(absl::StrCat(name_, ": data_class failed: ", out));
  for (const char* c = out; *c; ++c) {
    if (!absl::ascii_islower(*c) && !absl::ascii_isdigit(*c) && !std::strchr("_=.,-", *c)) {
      return absl::InternalError(absl::StrCat(name_, ": data_class returned a character outside [a-z0-9_=.,-]"));
    }
  }
  return std::string(out);
}

absl::Status Op::MakeShapeArgs(const Values& values, const TensorTypes& types, ShapeArgs* out) const {
  out->values_ = values;
  if (absl::Status s = Complete(&out->values_); !s.ok()) return s;
  out->shapes_.assign(tensors_.size(), {});
  out->tensors_.assign(tensors_.size(), DLTensor{});
  out->pointers_.assign(tensors_.size(), nullptr);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!types[i]) continue;
    for (int d : tensors_[i].ShapeUnder(out->values_.attrs.data())) out->shapes_[i].push_back(out->values_.dims[d]);
    DLTensor& t = out->tensors_[i];
    t.data = kNoData;
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(out->shapes_[i].size());
    t.dtype = ToDLDataType(*types[i]);
    t.shape = out->shapes_[i].data();
    out->pointers_[i] = &t;
  }
  out->args_ = {};
  out->args_.struct_size = sizeof(kreg_args);
  out->args_.flags = KREG_ARGS_SHAPE_ONLY;
  out->args_.tensors = out->pointers_.data();
  out->args_.num_tensors = out->pointers_.size();
  out->args_.dims = out->values_.dims.data();
  out->args_.num_dims = out->values_.dims.size();
  out->args_.attrs = out->values_.attrs.data();
  out->args_.num_attrs = out->values_.attrs.size();
  return Validate(out->args_);
}

}  // namespace kreg
