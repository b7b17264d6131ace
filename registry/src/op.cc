// Ops: named values and dims as text, and reading an op's descriptor
// (kreg_op_desc) into an Op. Values are op_values.cc; tensors, dtypes and
// arguments op_args.cc.
#include "kreg/op.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kreg/limits.h"
#include "loaded_plugin.h"
#include "op_internal.h"

namespace kreg {

using op_internal::IsIdentifier;
using op_internal::kAllTypes;

// ---- Named values -----------------------------------------------------------

absl::StatusOr<std::vector<std::string>> SplitList(absl::string_view text) {
  std::vector<std::string> items;
  if (absl::StripAsciiWhitespace(text).empty()) return items;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) return absl::InvalidArgumentError(absl::StrCat("'", text, "' has an empty item"));
    items.emplace_back(item);
  }
  return items;
}

absl::StatusOr<NamedValues> ParseNamedValues(absl::string_view text) {
  NamedValues out;
  absl::StatusOr<std::vector<std::string>> items = SplitList(text);
  if (!items.ok()) return items.status();
  for (absl::string_view item : *items) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    absl::string_view name = absl::StripAsciiWhitespace(kv.first);
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (name.empty() || value.empty() || item.find('=') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad item '", item, "' (expected NAME=VALUE, e.g. n=1000)"));
    }
    for (const auto& [seen, unused] : out) {
      if (seen == name) return absl::InvalidArgumentError(absl::StrCat("'", name, "' given twice"));
    }
    out.emplace_back(std::string(name), std::string(value));
  }
  return out;
}

absl::StatusOr<Dims> ParseDims(absl::string_view text) {
  absl::StatusOr<NamedValues> named = ParseNamedValues(text);
  if (!named.ok()) return named.status();
  Dims dims;
  for (const auto& [name, value] : *named) {
    int64_t v;
    if (!absl::SimpleAtoi(value, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad dimension '", name, "=", value, "' (expected NAME=INTEGER, e.g. n=1000)"));
    }
    dims.emplace_back(name, v);
  }
  return dims;
}

std::string DimsString(const Dims& dims) {
  std::string out;
  AppendDims(dims, &out);
  return out;
}

void AppendDims(const Dims& dims, std::string* out) {
  for (size_t i = 0; i < dims.size(); ++i) absl::StrAppend(out, i > 0 ? "," : "", dims[i].first, "=", dims[i].second);
}

uint32_t DTypeBit(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return KREG_DTYPE_F32;
    case DType::kBF16:
      return KREG_DTYPE_BF16;
    case DType::kI32:
      return KREG_DTYPE_I32;
  }
  return 0;
}

std::string DTypeSetString(uint32_t bits) {
  std::vector<absl::string_view> names;
  for (DType t : kAllTypes) {
    if (bits & DTypeBit(t)) names.push_back(DTypeName(t));
  }
  return names.empty() ? "none" : absl::StrJoin(names, "|");
}

bool TensorInfo::free_dtype() const {
  return same_dtype_as < 0 && (dtypes & (dtypes - 1)) != 0;
}

const Tolerance* TensorInfo::ToleranceFor(DType dtype) const {
  for (const Tolerance& t : tolerances) {
    if (t.dtype == dtype) return &t;
  }
  return nullptr;
}
// ---- Reading a descriptor ------------------------------------------------------

namespace {

// "op NAME: why", InvalidArgument: what a bad descriptor is refused with.
absl::Status BadOp(absl::string_view op, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("op ", op, ": ", why));
}

bool Fresh(const std::vector<std::string>& names, const char* name) {
  return std::find(names.begin(), names.end(), name) == names.end();
}

// Dim `i` of `op`, whose earlier dims are read; `names` are the dims' and
// attributes' names so far (one namespace).
absl::StatusOr<DimInfo> ReadDim(const Op& op, const kreg_dim_desc* dim, size_t i,
                                const std::vector<std::string>& names) {
  auto in = [&](absl::string_view why) { return BadOp(op.name(), why); };
  if (dim == nullptr || dim->struct_size < KREG_DIM_DESC_MIN_SIZE) return in(absl::StrCat("dim ", i, " is NULL or too small"));
  if (!IsIdentifier(dim->name) || !Fresh(names, dim->name)) {
    return in(absl::StrCat("dim ", i, " has a bad or repeated name"));
  }
  DimInfo info{dim->name, dim->doc ? dim->doc : "", dim->max > 0 ? dim->max : INT64_MAX};
  if (KREG_HAS_FIELD(dim, kreg_dim_desc, default_dim) && dim->default_dim != nullptr) {
    // Earlier dims only: defaults resolve in one pass, and never in a cycle.
    info.default_dim = op.FindDim(dim->default_dim);
    if (info.default_dim < 0) {
      return in(absl::StrCat("dim '", dim->name, "': default_dim '", dim->default_dim, "' is not an earlier dim"));
    }
  }
  if (KREG_HAS_FIELD(dim, kreg_dim_desc, denominator) && (dim->numerator != nullptr) != (dim->denominator != nullptr)) {
    return in(absl::StrCat("dim '", dim->name, "': give both numerator and denominator, or neither"));
  }
  if (KREG_HAS_FIELD(dim, kreg_dim_desc, denominator) && dim->numerator != nullptr) {
    info.numerator = op.FindDim(dim->numerator);
    info.denominator = op.FindDim(dim->denominator);
    if (info.numerator < 0 || info.denominator < 0) {
      return in(absl::StrCat("dim '", dim->name, "': numerator and denominator must be earlier dims"));
    }
  }
  if (KREG_HAS_FIELD(dim, kreg_dim_desc, bytes_per_unit)) {
    if (dim->bytes_per_unit < 0) return in(absl::StrCat("dim '", dim->name, "': bytes_per_unit is negative"));
    info.bytes_per_unit = dim->bytes_per_unit;
  }
  info.mesh_axis = KREG_HAS_FIELD(dim, kreg_dim_desc, flags) && (dim->flags & KREG_DIM_MESH_AXIS) != 0;
  return info;
}

absl::StatusOr<AttrInfo> ReadAttr(const Op& op, const kreg_attr_desc* a, size_t i,
                                  const std::vector<std::string>& names) {
  auto in = [&](absl::string_view why) { return BadOp(op.name(), why); };
  if (a == nullptr || a->struct_size < KREG_ATTR_DESC_MIN_SIZE) return in(absl::StrCat("attribute ", i, " is NULL or too small"));
  if (!IsIdentifier(a->name) || !Fresh(names, a->name)) {
    return in(absl::StrCat("attribute ", i, " has a bad or repeated name"));
  }
  if (a->kind != KREG_ATTR_INT && a->kind != KREG_ATTR_FLOAT) {
    return in(absl::StrCat("attribute '", a->name, "' has unknown kind ", a->kind));
  }
  AttrInfo info{a->name, a->doc ? a->doc : "", a->kind == KREG_ATTR_FLOAT, a->default_value, a->min, a->max};
  const bool in_range = info.is_float
                            ? info.min.f <= info.default_value.f && info.default_value.f <= info.max.f
                            : info.min.i <= info.default_value.i && info.default_value.i <= info.max.i;
  if (!in_range) return in(absl::StrCat("attribute '", a->name, "': default outside [min, max]"));
  return info;
}

// A tensor's shape ("m, k"): indices of dims of `op`.
absl::Status ReadShape(const Op& op, const TensorInfo& info, const char* text, std::vector<int>* shape) {
  for (absl::string_view dim : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const int index = op.FindDim(absl::StripAsciiWhitespace(dim));
    if (index < 0) {
      return BadOp(op.name(), absl::StrCat("tensor '", info.name, "': shape names '", dim,
                                           "', which is not a dim of the op"));
    }
    shape->push_back(index);
  }
  return absl::OkStatus();
}

// The tensor's alternative shape, generator and tolerances (fields a
// descriptor may lack).
absl::Status ReadTensorExtras(const Op& op, const kreg_tensor_desc* t, TensorInfo* info) {
  auto tin = [&](absl::string_view why) { return BadOp(op.name(), absl::StrCat("tensor '", info->name, "': ", why)); };
  if (KREG_HAS_FIELD(t, kreg_tensor_desc, alt_shape_attr) &&
      (t->alt_shape != nullptr || t->alt_shape_attr != nullptr)) {
    if (t->alt_shape == nullptr || t->alt_shape_attr == nullptr) {
      return tin("alt_shape and alt_shape_attr go together");
    }
    info->alt_shape_attr = op.FindAttr(t->alt_shape_attr);
    if (info->alt_shape_attr < 0 || op.attrs()[info->alt_shape_attr].is_float) {
      return tin(absl::StrCat("alt_shape_attr '", t->alt_shape_attr, "' is not an integer attribute of the op"));
    }
    if (absl::Status s = ReadShape(op, *info, t->alt_shape, &info->alt_shape); !s.ok()) return s;
  }
  if (KREG_HAS_FIELD(t, kreg_tensor_desc, gen_dim)) {
    if (t->gen > KREG_GEN_RANGE_END) return tin(absl::StrCat("unknown generator ", t->gen));
    info->gen = static_cast<kreg_gen>(t->gen);
    if (info->gen != KREG_GEN_VALUES) {
      info->gen_dim = t->gen_dim ? op.FindDim(t->gen_dim) : -1;
      if (info->gen_dim < 0) return tin("its generator needs gen_dim, a dim of the op");
      if (info->dtypes != KREG_DTYPE_I32 || info->shape.size() != 1 ||
          (info->alt_shape_attr >= 0 && info->alt_shape.size() != 1)) {
        return tin("partition and range generators make 1-D int32 tensors");
      }
    }
  }
  if (KREG_HAS_FIELD(t, kreg_tensor_desc, num_tolerances) && t->num_tolerances > 0) {
    if (t->tolerances == nullptr) return tin("tolerances is NULL");
    for (size_t j = 0; j < t->num_tolerances; ++j) {
      const kreg_tolerance* tol = t->tolerances[j];
      if (tol == nullptr || tol->struct_size < KREG_TOLERANCE_MIN_SIZE) return tin("a tolerance is NULL or too small");
      Tolerance out;
      bool known = false;
      for (DType dt : kAllTypes) {
        if (tol->dtype == DTypeBit(dt)) {
          out.dtype = dt;
          known = true;
        }
      }
      if (!known || !(tol->atol >= 0) || !(tol->rtol >= 0)) return tin("a tolerance has an unknown dtype or a negative bound");
      out.atol = tol->atol;
      out.rtol = tol->rtol;
      if (tol->scale_dim != nullptr) {
        out.scale_dim = op.FindDim(tol->scale_dim);
        if (out.scale_dim < 0) return tin(absl::StrCat("tolerance scale_dim '", tol->scale_dim, "' is not a dim"));
      }
      const uint32_t flags = KREG_HAS_FIELD(tol, kreg_tolerance, flags) ? tol->flags : 0;
      out.magnitude = (flags & KREG_TOLERANCE_MAGNITUDE) != 0;
      out.bf16_daz = (flags & KREG_TOLERANCE_BF16_DAZ) != 0;
      out.exact_nonfinite = (flags & KREG_TOLERANCE_EXACT_NONFINITE) != 0;
      info->tolerances.push_back(out);
    }
  }
  return absl::OkStatus();
}

// Tensor `i` of `op`, whose dims, attributes and earlier tensors are read.
absl::StatusOr<TensorInfo> ReadTensor(const Op& op, const kreg_tensor_desc* t, size_t i) {
  auto in = [&](absl::string_view why) { return BadOp(op.name(), why); };
  if (t == nullptr || t->struct_size < KREG_TENSOR_DESC_MIN_SIZE) return in(absl::StrCat("tensor ", i, " is NULL or too small"));
  if (!IsIdentifier(t->name) || op.FindTensor(t->name) >= 0) {
    return in(absl::StrCat("tensor ", i, " has a bad or repeated name"));
  }
  TensorInfo info;
  info.name = t->name;
  info.doc = t->doc ? t->doc : "";
  auto tin = [&](absl::string_view why) { return in(absl::StrCat("tensor '", info.name, "': ", why)); };
  if (t->role != KREG_ROLE_IN && t->role != KREG_ROLE_OUT && t->role != KREG_ROLE_INOUT) {
    return tin(absl::StrCat("unknown role ", t->role));
  }
  info.role = static_cast<kreg_role>(t->role);
  info.optional = (t->flags & KREG_TENSOR_OPTIONAL) != 0;
  info.unchecked = (t->flags & KREG_TENSOR_UNCHECKED) != 0;
  info.dtypes = t->dtypes;
  if (info.dtypes == 0 || (info.dtypes & ~(KREG_DTYPE_F32 | KREG_DTYPE_BF16 | KREG_DTYPE_I32)) != 0) {
    return tin(absl::StrCat("dtypes 0x", absl::Hex(info.dtypes), " are none or unknown to this kreg"));
  }
  if (t->same_dtype_as != nullptr) {
    info.same_dtype_as = op.FindTensor(t->same_dtype_as);
    if (info.same_dtype_as < 0) return tin(absl::StrCat("same_dtype_as '", t->same_dtype_as, "' is not an earlier tensor"));
  }
  if (t->shape == nullptr) return tin("shape is NULL");
  if (absl::Status s = ReadShape(op, info, t->shape, &info.shape); !s.ok()) return s;
  if (absl::Status s = ReadTensorExtras(op, t, &info); !s.ok()) return s;
  return info;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Op>> Op::Read(const kreg_op_desc& d,
                                                   std::shared_ptr<const LoadedPlugin> plugin) {
  auto bad = [](absl::string_view why) { return absl::InvalidArgumentError(why); };
  if (d.struct_size < KREG_OP_DESC_MIN_SIZE) {
    return bad(absl::StrCat("op struct_size ", d.struct_size, " is smaller than the minimum ",
                            KREG_OP_DESC_MIN_SIZE));
  }
  if (!IsIdentifier(d.name)) return bad("op name is not [a-z0-9_]+");
  auto op = std::shared_ptr<Op>(new Op());
  op->plugin_ = std::move(plugin);
  op->desc_ = &d;
  op->name_ = d.name;
  op->doc_ = d.doc ? d.doc : "";
  auto in = [&](absl::string_view why) { return BadOp(op->name_, why); };
  std::vector<std::string> names;  // dims and attributes share one namespace

  if (d.num_dims > 0 && d.dims == nullptr) return in("dims is NULL");
  for (size_t i = 0; i < d.num_dims; ++i) {
    const kreg_dim_desc* dim = d.dims[i];
    absl::StatusOr<DimInfo> info = ReadDim(*op, dim, i, names);
    if (!info.ok()) return info.status();
    names.emplace_back(dim->name);
    if (KREG_HAS_FIELD(dim, kreg_dim_desc, flags) && (dim->flags & KREG_DIM_RANKS) != 0) {
      if (op->ranks_dim_ >= 0) return in("more than one dim is KREG_DIM_RANKS");
      if (info->default_dim >= 0) return in(absl::StrCat("dim '", dim->name, "' is KREG_DIM_RANKS and has a default_dim"));
      op->ranks_dim_ = static_cast<int>(i);
    }
    op->dims_.push_back(*std::move(info));
  }
  if (d.num_attrs > 0 && d.attrs == nullptr) return in("attrs is NULL");
  for (size_t i = 0; i < d.num_attrs; ++i) {
    absl::StatusOr<AttrInfo> info = ReadAttr(*op, d.attrs[i], i, names);
    if (!info.ok()) return info.status();
    names.emplace_back(d.attrs[i]->name);
    op->attrs_.push_back(*std::move(info));
  }
  if (d.num_tensors == 0 || d.tensors == nullptr) return in("no tensors");
  for (size_t i = 0; i < d.num_tensors; ++i) {
    absl::StatusOr<TensorInfo> info = ReadTensor(*op, d.tensors[i], i);
    if (!info.ok()) return info.status();
    op->tensors_.push_back(*std::move(info));
  }
  op->validate_ = d.validate;
  if (KREG_HAS_FIELD(&d, kreg_op_desc, data_class)) op->data_class_ = d.data_class;
  if (KREG_HAS_FIELD(&d, kreg_op_desc, default_variant)) op->default_variant_ = d.default_variant;
  if (KREG_HAS_FIELD(&d, kreg_op_desc, num_default_variants) && d.num_default_variants > 0) {
    if (d.default_variants == nullptr) return in("default_variants is NULL");
    for (size_t i = 0; i < d.num_default_variants; ++i) {
      if (!IsIdentifier(d.default_variants[i])) return in("a default variant name is not [a-z0-9_]+");
      op->default_variants_.emplace_back(d.default_variants[i]);
    }
  }
  return std::shared_ptr<const Op>(std::move(op));
}


const std::string& Op::plugin_path() const { return plugin_->path(); }

int Op::FindDim(absl::string_view name) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}
int Op::FindTensor(absl::string_view name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}
int Op::FindAttr(absl::string_view name) const {
  for (size_t i = 0; i < attrs_.size(); ++i) {
    if (attrs_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string Op::DefaultVariant(const kreg_args& args, const kreg_host& host) const {
  if (default_variant_ == nullptr) return "";
  const char* name = default_variant_(&args, &host);
  return name != nullptr && IsIdentifier(name) ? name : "";
}

std::string Op::DimNames(const std::vector<int>& shape) const {
  std::vector<absl::string_view> names;
  for (int i : shape) names.push_back(dims_[i].name);
  return absl::StrCat("[", absl::StrJoin(names, ","), "]");
}

std::string Op::AltShapeNote(const TensorInfo& t, const kreg_scalar* attrs) const {
  if (t.alt_shape_attr < 0) return "";
  return absl::StrCat(" (", t.name, " is ", DimNames(t.ShapeUnder(attrs)), " with ", attrs_[t.alt_shape_attr].name, "=",
                      attrs[t.alt_shape_attr].i, ")");
}

std::string Op::Describe() const {
  std::vector<std::string> dims, tensors, attrs;
  for (const DimInfo& d : dims_) {
    if (static_cast<int>(dims.size()) == ranks_dim_) {
      dims.push_back(absl::StrCat(d.name, " (the communicator's size: --ranks)"));
    } else {
      dims.push_back(d.default_dim < 0 ? d.name : absl::StrCat(d.name, " (default ", dims_[d.default_dim].name, ")"));
    }
  }
  for (const TensorInfo& t : tensors_) {
    const char* role = t.role == KREG_ROLE_IN ? "in" : t.role == KREG_ROLE_OUT ? "out" : "in-out";
    const std::string alt = t.alt_shape_attr < 0 ? ""
                                                 : absl::StrCat(" (", attrs_[t.alt_shape_attr].name, "!=0: ",
                                                                DimNames(t.alt_shape), ")");
    tensors.push_back(absl::StrCat(t.name, " ", DimNames(t.shape), alt, " ", DTypeSetString(t.dtypes), " ", role,
                                   t.optional ? ", optional" : ""));
  }
  for (const AttrInfo& a : attrs_) {
    attrs.push_back(absl::StrCat(a.name, "=", a.is_float ? absl::StrCat(a.default_value.f)
                                                          : absl::StrCat(a.default_value.i)));
  }
  return absl::StrCat("dims ", absl::StrJoin(dims, ", "), "; tensors ", absl::StrJoin(tensors, "; "),
                      attrs.empty() ? "" : "; attributes ", absl::StrJoin(attrs, ", "));
}

}  // namespace kreg
