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

namespace kreg {
namespace {

bool IsIdentifier(const char* s) {
  if (s == nullptr || *s == '\0') return false;
  for (; *s; ++s) {
    if (!absl::ascii_islower(*s) && !absl::ascii_isdigit(*s) && *s != '_') return false;
  }
  return true;
}

constexpr DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kI32};

std::string ShapeText(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// Never read: shape-only tensors point here so "has data" checks pass.
alignas(64) unsigned char kNoData[64];

}  // namespace

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
  return absl::StrJoin(dims, ",", [](std::string* out, const auto& d) {
    absl::StrAppend(out, d.first, "=", d.second);
  });
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
  auto in = [&](absl::string_view why) { return bad(absl::StrCat("op ", op->name_, ": ", why)); };
  std::vector<std::string> names;  // dims and attributes share one namespace
  auto fresh = [&](const char* name) {
    return std::find(names.begin(), names.end(), name) == names.end();
  };

  if (d.num_dims > 0 && d.dims == nullptr) return in("dims is NULL");
  for (size_t i = 0; i < d.num_dims; ++i) {
    const kreg_dim_desc* dim = d.dims[i];
    if (dim == nullptr || dim->struct_size < KREG_DIM_DESC_MIN_SIZE) return in(absl::StrCat("dim ", i, " is NULL or too small"));
    if (!IsIdentifier(dim->name) || !fresh(dim->name)) {
      return in(absl::StrCat("dim ", i, " has a bad or repeated name"));
    }
    names.emplace_back(dim->name);
    DimInfo info{dim->name, dim->doc ? dim->doc : "", dim->max > 0 ? dim->max : INT64_MAX};
    if (KREG_HAS_FIELD(dim, kreg_dim_desc, default_dim) && dim->default_dim != nullptr) {
      // Earlier dims only: defaults resolve in one pass, and never in a cycle.
      info.default_dim = op->FindDim(dim->default_dim);
      if (info.default_dim < 0) {
        return in(absl::StrCat("dim '", dim->name, "': default_dim '", dim->default_dim, "' is not an earlier dim"));
      }
    }
    if (KREG_HAS_FIELD(dim, kreg_dim_desc, denominator) && (dim->numerator != nullptr) != (dim->denominator != nullptr)) {
      return in(absl::StrCat("dim '", dim->name, "': give both numerator and denominator, or neither"));
    }
    if (KREG_HAS_FIELD(dim, kreg_dim_desc, denominator) && dim->numerator != nullptr) {
      info.numerator = op->FindDim(dim->numerator);
      info.denominator = op->FindDim(dim->denominator);
      if (info.numerator < 0 || info.denominator < 0) {
        return in(absl::StrCat("dim '", dim->name, "': numerator and denominator must be earlier dims"));
      }
    }
    if (KREG_HAS_FIELD(dim, kreg_dim_desc, bytes_per_unit)) {
      if (dim->bytes_per_unit < 0) return in(absl::StrCat("dim '", dim->name, "': bytes_per_unit is negative"));
      info.bytes_per_unit = dim->bytes_per_unit;
    }
    info.mesh_axis = KREG_HAS_FIELD(dim, kreg_dim_desc, flags) && (dim->flags & KREG_DIM_MESH_AXIS) != 0;
    if (KREG_HAS_FIELD(dim, kreg_dim_desc, flags) && (dim->flags & KREG_DIM_RANKS) != 0) {
      if (op->ranks_dim_ >= 0) return in("more than one dim is KREG_DIM_RANKS");
      if (info.default_dim >= 0) return in(absl::StrCat("dim '", dim->name, "' is KREG_DIM_RANKS and has a default_dim"));
      op->ranks_dim_ = static_cast<int>(i);
    }
    op->dims_.push_back(std::move(info));
  }
  if (d.num_attrs > 0 && d.attrs == nullptr) return in("attrs is NULL");
  for (size_t i = 0; i < d.num_attrs; ++i) {
    const kreg_attr_desc* a = d.attrs[i];
    if (a == nullptr || a->struct_size < KREG_ATTR_DESC_MIN_SIZE) return in(absl::StrCat("attribute ", i, " is NULL or too small"));
    if (!IsIdentifier(a->name) || !fresh(a->name)) {
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
    names.emplace_back(a->name);
    op->attrs_.push_back(std::move(info));
  }
  if (d.num_tensors == 0 || d.tensors == nullptr) return in("no tensors");
  for (size_t i = 0; i < d.num_tensors; ++i) {
    const kreg_tensor_desc* t = d.tensors[i];
    if (t == nullptr || t->struct_size < KREG_TENSOR_DESC_MIN_SIZE) return in(absl::StrCat("tensor ", i, " is NULL or too small"));
    if (!IsIdentifier(t->name) || op->FindTensor(t->name) >= 0) {
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
      info.same_dtype_as = op->FindTensor(t->same_dtype_as);
      if (info.same_dtype_as < 0) return tin(absl::StrCat("same_dtype_as '", t->same_dtype_as, "' is not an earlier tensor"));
    }
    if (t->shape == nullptr) return tin("shape is NULL");
    auto read_shape = [&](const char* text, std::vector<int>* shape) -> absl::Status {
      for (absl::string_view dim : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
        const int index = op->FindDim(absl::StripAsciiWhitespace(dim));
        if (index < 0) return tin(absl::StrCat("shape names '", dim, "', which is not a dim of the op"));
        shape->push_back(index);
      }
      return absl::OkStatus();
    };
    if (absl::Status s = read_shape(t->shape, &info.shape); !s.ok()) return s;
    if (KREG_HAS_FIELD(t, kreg_tensor_desc, alt_shape_attr) &&
        (t->alt_shape != nullptr || t->alt_shape_attr != nullptr)) {
      if (t->alt_shape == nullptr || t->alt_shape_attr == nullptr) {
        return tin("alt_shape and alt_shape_attr go together");
      }
      info.alt_shape_attr = op->FindAttr(t->alt_shape_attr);
      if (info.alt_shape_attr < 0 || op->attrs_[info.alt_shape_attr].is_float) {
        return tin(absl::StrCat("alt_shape_attr '", t->alt_shape_attr, "' is not an integer attribute of the op"));
      }
      if (absl::Status s = read_shape(t->alt_shape, &info.alt_shape); !s.ok()) return s;
    }
    if (KREG_HAS_FIELD(t, kreg_tensor_desc, gen_dim)) {
      if (t->gen > KREG_GEN_RANGE_END) return tin(absl::StrCat("unknown generator ", t->gen));
      info.gen = static_cast<kreg_gen>(t->gen);
      if (info.gen != KREG_GEN_VALUES) {
        info.gen_dim = t->gen_dim ? op->FindDim(t->gen_dim) : -1;
        if (info.gen_dim < 0) return tin("its generator needs gen_dim, a dim of the op");
        if (info.dtypes != KREG_DTYPE_I32 || info.shape.size() != 1 ||
            (info.alt_shape_attr >= 0 && info.alt_shape.size() != 1)) {
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
          out.scale_dim = op->FindDim(tol->scale_dim);
          if (out.scale_dim < 0) return tin(absl::StrCat("tolerance scale_dim '", tol->scale_dim, "' is not a dim"));
        }
        const uint32_t flags = KREG_HAS_FIELD(tol, kreg_tolerance, flags) ? tol->flags : 0;
        out.magnitude = (flags & KREG_TOLERANCE_MAGNITUDE) != 0;
        out.bf16_daz = (flags & KREG_TOLERANCE_BF16_DAZ) != 0;
        info.tolerances.push_back(out);
      }
    }
    op->tensors_.push_back(std::move(info));
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

// ---- Values -----------------------------------------------------------------------

absl::StatusOr<Values> Op::ParseValues(const NamedValues& named) const {
  Values v;
  v.dims.assign(dims_.size(), -1);
  for (const AttrInfo& a : attrs_) v.attrs.push_back(a.default_value);
  for (const auto& [name, text] : named) {
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", why));
    };
    if (const int d = FindDim(name); d >= 0) {
      int64_t x;
      if (!absl::SimpleAtoi(text, &x)) return bad(absl::StrCat("dimension '", name, "=", text, "' is not an integer"));
      if (x < 0) return bad(absl::StrCat("dimension ", name, "=", x, " is negative"));
      if (x > dims_[d].max) return bad(absl::StrCat("dimension ", name, "=", x, " exceeds its limit ", dims_[d].max));
      v.dims[d] = x;
    } else if (const int a = FindAttr(name); a >= 0) {
      const AttrInfo& info = attrs_[a];
      if (info.is_float) {
        double x;
        if (!absl::SimpleAtod(text, &x) || std::isnan(x)) return bad(absl::StrCat("attribute '", name, "=", text, "' is not a number"));
        if (x < info.min.f || x > info.max.f) {
          return bad(absl::StrCat("attribute ", name, "=", x, " is outside [", info.min.f, ", ", info.max.f, "]"));
        }
        v.attrs[a].f = x;
      } else {
        int64_t x;
        if (!absl::SimpleAtoi(text, &x)) return bad(absl::StrCat("attribute '", name, "=", text, "' is not an integer"));
        if (x < info.min.i || x > info.max.i) {
          return bad(absl::StrCat("attribute ", name, "=", x, " is outside [", info.min.i, ", ", info.max.i, "]"));
        }
        v.attrs[a].i = x;
      }
    } else {
      std::vector<absl::string_view> known;
      for (const DimInfo& info : dims_) known.push_back(info.name);
      std::vector<absl::string_view> attrs;
      for (const AttrInfo& at : attrs_) attrs.push_back(at.name);
      return bad(absl::StrCat("unknown dimension or attribute '", name, "' (dims: ", absl::StrJoin(known, ", "),
                              attrs.empty() ? "" : "; attributes: ", absl::StrJoin(attrs, ", "), ")"));
    }
  }
  return v;
}

absl::StatusOr<Values> Op::ParseValues(const Dims& dims) const {
  // Integers need no parsing: only names that are not plain dims or integer
  // attributes (or values out of range) take the general path, which words
  // the error.
  Values v;
  v.dims.assign(dims_.size(), -1);
  for (const AttrInfo& a : attrs_) v.attrs.push_back(a.default_value);
  for (const auto& [name, value] : dims) {
    const int d = FindDim(name);
    if (d >= 0 && value >= 0 && value <= dims_[d].max) {
      v.dims[d] = value;
      continue;
    }
    const int a = d < 0 ? FindAttr(name) : -1;
    if (a >= 0 && !attrs_[a].is_float && value >= attrs_[a].min.i && value <= attrs_[a].max.i) {
      v.attrs[a].i = value;
      continue;
    }
    NamedValues named;
    for (const auto& [n, x] : dims) named.emplace_back(n, absl::StrCat(x));
    return ParseValues(named);
  }
  return v;
}

absl::Status Op::CheckComplete(const Values& values) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (values.dims[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": dimension '", dims_[i].name, "' is missing (",
          static_cast<int>(i) == ranks_dim_ ? "give --ranks N"
          : dims_[i].mesh_axis              ? "give --mesh, e.g. 2x2"
                                            : "give it in --dims or through an input file",
          ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Op::SetRanks(Values* values, int ranks) const {
  if (ranks_dim_ < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name_, " is not a collective op: it runs on one rank"));
  }
  int64_t& dim = values->dims[ranks_dim_];
  if (dim >= 0 && dim != ranks) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", dims_[ranks_dim_].name, "=", dim,
                                                   " disagrees with the communicator's ", ranks, " ranks"));
  }
  dim = ranks;
  return absl::OkStatus();
}

absl::Status Op::Complete(Values* values) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    const DimInfo& d = dims_[i];
    if (values->dims[i] < 0 && d.default_dim >= 0) values->dims[i] = values->dims[d.default_dim];
    if (d.numerator < 0) continue;
    const int64_t num = values->dims[d.numerator], den = values->dims[d.denominator];
    if (num < 0 || den < 0) continue;  // CheckComplete names what is missing
    if (den == 0 || num % den != 0) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", dims_[d.numerator].name, "=", num,
                                                     " is not divisible by ", dims_[d.denominator].name, "=", den));
    }
    if (values->dims[i] >= 0 && values->dims[i] != num / den) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", d.name, "=", values->dims[i], " but ",
                                                     dims_[d.numerator].name, " / ", dims_[d.denominator].name,
                                                     " = ", num / den));
    }
    values->dims[i] = num / den;
  }
  return CheckComplete(*values);
}

bool Op::uses_mesh() const {
  return std::any_of(dims_.begin(), dims_.end(), [](const DimInfo& d) { return d.mesh_axis; });
}

absl::Status Op::SetMesh(Values* values, const Mesh& mesh) const {
  int64_t ranks = 1;
  for (const auto& [axis, size] : mesh) ranks *= size;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (!dims_[i].mesh_axis) continue;
    auto it = std::find_if(mesh.begin(), mesh.end(), [&](const auto& a) { return a.first == dims_[i].name; });
    if (it == mesh.end()) {
      return absl::InvalidArgumentError(absl::StrCat(name_, " needs mesh axis '", dims_[i].name, "' (the mesh is ",
                                                     mesh.empty() ? "none: give --mesh" : MeshString(mesh), ")"));
    }
    if (values->dims[i] >= 0 && values->dims[i] != it->second) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", dims_[i].name, "=", values->dims[i],
                                                     " disagrees with the mesh's ", MeshString(mesh)));
    }
    values->dims[i] = it->second;
  }
  return SetRanks(values, static_cast<int>(ranks));
}

absl::StatusOr<Mesh> ParseMesh(absl::string_view text) {
  Mesh mesh;
  const bool named = absl::StrContains(text, '=');
  static constexpr const char* kAxisNames[] = {"x", "y", "z", "w"};
  std::vector<std::string> parts = absl::StrSplit(text, named ? ',' : 'x');
  if (parts.size() > static_cast<size_t>(limits::kMaxMeshAxes)) {
    return absl::InvalidArgumentError(absl::StrCat("mesh '", text, "': at most ", limits::kMaxMeshAxes, " axes"));
  }
  int64_t size = 1;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string name = named ? "" : kAxisNames[i];
    absl::string_view axis_size = parts[i];
    if (named) {
      std::vector<std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
      if (kv.size() != 2 || !IsIdentifier(kv[0].c_str())) {
        return absl::InvalidArgumentError(absl::StrCat("mesh '", text, "': '", parts[i], "' is not AXIS=SIZE"));
      }
      name = kv[0];
      axis_size = absl::string_view(parts[i]).substr(kv[0].size() + 1);  // a view of parts[i], not of a copy
    }
    int n = 0;
    if (!absl::SimpleAtoi(axis_size, &n) || n < 1 || n > limits::kMaxRanks) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh '", text, "': axis size '", axis_size, "' is not in [1, ", limits::kMaxRanks, "]"));
    }
    size *= n;  // at most kMaxRanks^2 before the check below
    if (absl::Status s = limits::CheckRanks(size, absl::StrCat("mesh '", text, "': its size")); !s.ok()) return s;
    for (const auto& [existing, unused] : mesh) {
      if (existing == name) return absl::InvalidArgumentError(absl::StrCat("mesh '", text, "': axis ", name, " twice"));
    }
    mesh.emplace_back(name, n);
  }
  if (mesh.empty()) return absl::InvalidArgumentError("empty mesh");
  return mesh;
}

std::string MeshString(const Mesh& mesh) {
  return absl::StrJoin(mesh, ",", absl::PairFormatter("="));
}

Dims Op::KeyDims(const Values& values) const {
  Dims out;
  for (size_t i = 0; i < dims_.size(); ++i) out.emplace_back(dims_[i].name, values.dims[i]);
  for (size_t i = 0; i < attrs_.size(); ++i) {
    if (!attrs_[i].is_float && values.attrs[i].i != attrs_[i].default_value.i) {
      out.emplace_back(attrs_[i].name, values.attrs[i].i);
    }
  }
  return out;
}

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
    out->shapes_[i] = ShapeOf(static_cast<int>(i), out->values_);
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
