// An Op's values: dims and attributes parsed, completed and checked, the
// mesh of a collective, and the dims of a problem's key.
#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/limits.h"
#include "kreg/op.h"
#include "op_internal.h"

namespace kreg {

using op_internal::IsIdentifier;

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

}  // namespace kreg
