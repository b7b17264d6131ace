#include "kreg/params.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/machine.h"

namespace kreg {
namespace {

bool IsIdentifier(const char* s) {
  if (s == nullptr || *s == '\0') return false;
  for (; *s; ++s) {
    if (!absl::ascii_islower(*s) && !absl::ascii_isdigit(*s) && *s != '_') return false;
  }
  return true;
}

// Increasing lists of 1..max_len values from `values` (sorted), shortest first.
void Lists(const std::vector<int64_t>& values, int max_len, std::vector<int64_t>& prefix, size_t from,
           std::vector<std::vector<int64_t>>& out) {
  if (!prefix.empty()) out.push_back(prefix);
  if (static_cast<int>(prefix.size()) == max_len) return;
  for (size_t i = from; i < values.size(); ++i) {
    prefix.push_back(values[i]);
    Lists(values, max_len, prefix, i + 1, out);
    prefix.pop_back();
  }
}

}  // namespace

std::vector<int64_t> ParamInfo::Values(const int64_t* dims) const {
  std::vector<int64_t> out;
  if (values_kind == KREG_VALUES_LISTED) {
    out = listed;
  } else {
    int64_t hi_capped = hi;
    if (dims != nullptr && cap_dim >= 0) hi_capped = std::min(hi_capped, dims[cap_dim]);
    if (values_kind == KREG_VALUES_RANGE) {
      for (int64_t v = lo; v <= hi_capped && out.size() < 4096; v += step) out.push_back(v);
    } else {
      for (int64_t v = 1; v <= hi_capped; v *= 2) {
        if (v >= lo) out.push_back(v);
        if (v > INT64_MAX / 2) break;
      }
    }
  }
  if (dims != nullptr && cap_dim >= 0) {
    const int64_t cap = dims[cap_dim];
    out.erase(std::remove_if(out.begin(), out.end(), [&](int64_t v) { return v > cap; }), out.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool ParamInfo::Legal(int64_t v, const int64_t* dims) const {
  if (dims != nullptr && cap_dim >= 0 && v > dims[cap_dim]) return false;
  switch (values_kind) {
    case KREG_VALUES_LISTED:
      return std::find(listed.begin(), listed.end(), v) != listed.end();
    case KREG_VALUES_RANGE:
      return v >= lo && v <= hi && (v - lo) % step == 0 && (v - lo) / step < 4096;
    case KREG_VALUES_POW2:
      return v >= lo && v <= hi && v > 0 && (v & (v - 1)) == 0;
  }
  return false;
}

bool ParamInfo::ChoiceAvailable(int64_t i, uint32_t isa) const {
  if (i < 0 || static_cast<size_t>(i) >= choices.size()) return false;
  if (choice_isa.empty()) return true;
  const uint32_t need = choice_isa[i];
  return (need & ~static_cast<uint32_t>(KREG_ISA_KNOWN_MASK)) == 0 && (need & ~isa) == 0;
}

absl::StatusOr<ParamInfo> ReadParam(const kreg_param_desc& d, const std::vector<std::string>& dims,
                                    const std::vector<ParamInfo>& earlier) {
  auto bad = [](absl::string_view why) { return absl::InvalidArgumentError(why); };
  if (d.struct_size < KREG_PARAM_DESC_MIN_SIZE) {
    return bad(absl::StrCat("struct_size ", d.struct_size, " is smaller than the minimum ",
                            KREG_PARAM_DESC_MIN_SIZE));
  }
  if (!IsIdentifier(d.name)) return bad("name is not [a-z0-9_]+");
  ParamInfo p;
  p.name = d.name;
  p.doc = d.doc ? d.doc : "";
  p.kind = static_cast<kreg_param_kind>(d.kind);
  auto in = [&](absl::string_view why) { return bad(absl::StrCat("'", p.name, "': ", why)); };
  if (KREG_HAS_FIELD(&d, kreg_param_desc, num_when_values)) {
    p.values_kind = static_cast<kreg_values_kind>(d.values_kind);
    if (p.values_kind != KREG_VALUES_LISTED && p.values_kind != KREG_VALUES_RANGE &&
        p.values_kind != KREG_VALUES_POW2) {
      return in(absl::StrCat("unknown values_kind ", d.values_kind));
    }
    p.lo = d.lo;
    p.hi = d.hi;
    p.step = d.step;
    if (d.cap_dim != nullptr) {
      auto it = std::find(dims.begin(), dims.end(), d.cap_dim);
      if (it == dims.end()) return in(absl::StrCat("cap_dim '", d.cap_dim, "' is not a dim of the op"));
      p.cap_dim = static_cast<int>(it - dims.begin());
    }
    if (d.when_param != nullptr) {
      auto it = std::find_if(earlier.begin(), earlier.end(),
                             [&](const ParamInfo& e) { return e.name == d.when_param; });
      if (it == earlier.end() || it->kind == KREG_PARAM_INT_LIST) {
        return in(absl::StrCat("when_param '", d.when_param, "' is not an earlier int or choice parameter"));
      }
      if (d.num_when_values == 0 || d.when_values == nullptr) return in("when_param without when_values");
      p.when_param = static_cast<int>(it - earlier.begin());
      p.when_values.assign(d.when_values, d.when_values + d.num_when_values);
    }
  }
  if (p.kind == KREG_PARAM_INT || p.kind == KREG_PARAM_INT_LIST) {
    if (p.values_kind == KREG_VALUES_LISTED) {
      if (d.values == nullptr || d.num_values == 0) return in("no legal values");
      p.listed.assign(d.values, d.values + d.num_values);
    } else if (p.lo > p.hi || (p.values_kind == KREG_VALUES_RANGE && p.step <= 0) ||
               (p.values_kind == KREG_VALUES_POW2 && p.hi < 1)) {
      return in(absl::StrCat("empty generated range [", p.lo, ", ", p.hi, "] step ", p.step));
    }
  }
  switch (p.kind) {
    case KREG_PARAM_INT: {
      p.default_value.value = d.default_value;
      std::vector<int64_t> values = p.Values();
      if (!std::binary_search(values.begin(), values.end(), d.default_value)) {
        return in(absl::StrCat("default ", d.default_value, " is not among its legal values"));
      }
      break;
    }
    case KREG_PARAM_INT_LIST: {
      if (d.default_list_len > 0 && d.default_list == nullptr) return in("default_list is NULL");
      p.default_value.list.assign(d.default_list, d.default_list + d.default_list_len);
      for (size_t i = 1; i < p.default_value.list.size(); ++i) {
        if (p.default_value.list[i] <= p.default_value.list[i - 1]) return in("default list is not increasing");
      }
      break;
    }
    case KREG_PARAM_CHOICE: {
      if (d.choices == nullptr || d.num_choices == 0) return in("no choices");
      for (size_t i = 0; i < d.num_choices; ++i) {
        if (!IsIdentifier(d.choices[i])) return in(absl::StrCat("choice ", i, " is not [a-z0-9_]+"));
        p.choices.emplace_back(d.choices[i]);
      }
      if (d.default_value < 0 || static_cast<size_t>(d.default_value) >= d.num_choices) {
        return in(absl::StrCat("default choice index ", d.default_value, " is out of range"));
      }
      p.default_value.value = d.default_value;
      if (KREG_HAS_FIELD(&d, kreg_param_desc, choice_isa) && d.choice_isa != nullptr) {
        p.choice_isa.assign(d.choice_isa, d.choice_isa + d.num_choices);
      }
      break;
    }
    default:
      return in(absl::StrCat("unknown kind ", d.kind));
  }
  return p;
}

// ---- Config ------------------------------------------------------------------

Config::AbiView::AbiView(const Config& config) : values_(config.values().size()) {
  pointers_.resize(values_.size());
  for (size_t i = 0; i < values_.size(); ++i) {
    const ParamValue& v = config.values()[i];
    values_[i] = {sizeof(kreg_param_value), v.value, v.list.data(), v.list.size()};
    pointers_[i] = &values_[i];
  }
  config_ = {sizeof(kreg_config), pointers_.data(), pointers_.size()};
}

// ---- ParamSpace ----------------------------------------------------------------

int ParamSpace::Find(absl::string_view name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

Config ParamSpace::Default(uint32_t isa) const {
  std::vector<ParamValue> values;
  for (const ParamInfo& p : params_) {
    ParamValue v = p.default_value;
    if (p.kind == KREG_PARAM_CHOICE && !p.ChoiceAvailable(v.value, isa)) {
      for (size_t c = 0; c < p.choices.size(); ++c) {
        if (p.ChoiceAvailable(static_cast<int64_t>(c), isa)) {
          v.value = static_cast<int64_t>(c);
          break;
        }
      }
    }
    values.push_back(std::move(v));
  }
  return Config(std::move(values));
}

bool ParamSpace::Active(const Config& config, size_t i) const {
  const ParamInfo& p = params_[i];
  if (p.when_param < 0) return true;
  if (!Active(config, static_cast<size_t>(p.when_param))) return false;
  const int64_t v = config.values()[p.when_param].value;
  return std::find(p.when_values.begin(), p.when_values.end(), v) != p.when_values.end();
}

absl::Status ParamSpace::Validate(const Config& config, absl::string_view kernel, uint32_t isa,
                                  const int64_t* dims) const {
  if (config.values().size() != params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, " takes ", params_.size(),
                                                   " parameters, the configuration has ",
                                                   config.values().size()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    const ParamValue& v = config.values()[i];
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' of ", kernel, ": ", why));
    };
    if (!Active(config, i)) {
      if (!(v == p.default_value)) {
        return bad(absl::StrCat("is inactive here (it applies when '", params_[p.when_param].name,
                                "' is ", absl::StrJoin(p.when_values, " or "), ") and must keep its default"));
      }
      continue;
    }
    if (p.kind == KREG_PARAM_CHOICE) {
      if (v.value < 0 || static_cast<size_t>(v.value) >= p.choices.size()) {
        return bad(absl::StrCat("choice #", v.value, " does not exist"));
      }
      if (!p.ChoiceAvailable(v.value, isa)) {
        return bad(absl::StrCat("'", p.choices[v.value], "' needs an ISA this CPU lacks"));
      }
      continue;
    }
    auto legal_text = [&] {
      const std::vector<int64_t> legal = p.Values(dims);
      if (legal.empty()) return std::string("(no value is legal here)");
      return legal.size() <= 24 ? absl::StrJoin(legal, ", ")
                                : absl::StrCat(legal.front(), " .. ", legal.back(), " (", legal.size(), " values)");
    };
    if (p.kind == KREG_PARAM_INT) {
      if (!p.Legal(v.value, dims)) return bad(absl::StrCat(v.value, " is not one of ", legal_text()));
    } else {
      for (size_t j = 0; j < v.list.size(); ++j) {
        if (!p.Legal(v.list[j], dims)) return bad(absl::StrCat(v.list[j], " is not one of ", legal_text()));
        if (j > 0 && v.list[j] <= v.list[j - 1]) return bad("the list must be increasing");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> ParamSpace::Parse(const std::vector<std::pair<std::string, std::string>>& overrides,
                                         absl::string_view kernel, uint32_t isa) const {
  Config config = Default(isa);
  std::set<std::string> given;
  for (const auto& [name, text] : overrides) {
    const int i = Find(name);
    if (i < 0) {
      std::vector<absl::string_view> known;
      for (const ParamInfo& p : params_) known.push_back(p.name);
      return absl::InvalidArgumentError(absl::StrCat(kernel, " has no parameter '", name, "' (parameters: ",
                                                     known.empty() ? "none" : absl::StrJoin(known, ", "), ")"));
    }
    if (!given.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' of ", kernel, " is given twice"));
    }
    const ParamInfo& p = params_[i];
    ParamValue& v = config.mutable_values()[i];
    auto bad = [&, &name = name](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' of ", kernel, ": ", why));
    };
    if (p.kind == KREG_PARAM_INT) {
      if (!absl::SimpleAtoi(text, &v.value)) return bad(absl::StrCat("'", text, "' is not an integer"));
    } else if (p.kind == KREG_PARAM_INT_LIST) {
      v.list.clear();
      // Every item an integer: "", "5,,8" and "5," are refused alike.
      for (absl::string_view item : absl::StrSplit(text, absl::ByAnyChar(",:"))) {
        int64_t x;
        if (item.empty()) return bad(absl::StrCat("'", text, "' has an empty item (expected integers, e.g. 5,8,12)"));
        if (!absl::SimpleAtoi(item, &x)) return bad(absl::StrCat("'", item, "' is not an integer"));
        v.list.push_back(x);
      }
    } else {
      auto it = std::find(p.choices.begin(), p.choices.end(), text);
      if (it == p.choices.end()) {
        return bad(absl::StrCat("'", text, "' is not one of ", absl::StrJoin(p.choices, ", ")));
      }
      v.value = it - p.choices.begin();
    }
  }
  if (absl::Status s = Validate(config, kernel, isa); !s.ok()) return s;
  return config;
}

std::vector<std::pair<std::string, std::string>> ParamSpace::Pairs(const Config& config) const {
  std::vector<std::pair<std::string, std::string>> parts;
  for (size_t i = 0; i < params_.size() && i < config.values().size(); ++i) {
    const ParamInfo& p = params_[i];
    const ParamValue& v = config.values()[i];
    std::string value;
    if (p.kind == KREG_PARAM_INT) value = absl::StrCat(v.value);
    if (p.kind == KREG_PARAM_INT_LIST) value = absl::StrJoin(v.list, ",");
    if (p.kind == KREG_PARAM_CHOICE) {
      value = v.value >= 0 && static_cast<size_t>(v.value) < p.choices.size() ? p.choices[v.value]
                                                                               : absl::StrCat("#", v.value);
    }
    parts.emplace_back(p.name, std::move(value));
  }
  return parts;
}

std::string ParamSpace::Format(const Config& config) const {
  return absl::StrJoin(Pairs(config), " ", absl::PairFormatter("="));
}

std::vector<Config> ParamSpace::Enumerate(uint32_t isa, const int64_t* dims, int max_list_len) const {
  const Config def = Default(isa);
  std::vector<Config> all = {def};
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    std::vector<ParamValue> choices;
    if (p.kind == KREG_PARAM_CHOICE) {
      for (size_t c = 0; c < p.choices.size(); ++c) {
        if (p.ChoiceAvailable(static_cast<int64_t>(c), isa)) choices.push_back({static_cast<int64_t>(c), {}});
      }
    } else if (p.kind == KREG_PARAM_INT) {
      for (int64_t v : p.Values(dims)) choices.push_back({v, {}});
    } else {
      std::vector<std::vector<int64_t>> lists;
      std::vector<int64_t> prefix;
      Lists(p.Values(dims), max_list_len, prefix, 0, lists);
      choices.push_back(p.default_value);
      for (std::vector<int64_t>& l : lists) {
        if (l != p.default_value.list) choices.push_back({0, std::move(l)});
      }
    }
    std::vector<Config> next;
    for (const Config& c : all) {
      if (!Active(c, i)) {  // an inactive parameter keeps its default: no copies
        next.push_back(c);
        continue;
      }
      for (const ParamValue& v : choices) {
        Config copy = c;
        copy.mutable_values()[i] = v;
        next.push_back(std::move(copy));
      }
    }
    all = std::move(next);
  }
  // The default first, then the rest in enumeration order, without repeats.
  std::vector<Config> out = {def};
  for (Config& c : all) {
    if (!(c == def)) out.push_back(std::move(c));
  }
  return out;
}

std::string ParamValuesText(const ParamInfo& p) {
  if (p.kind == KREG_PARAM_CHOICE) {
    std::vector<std::string> names;
    for (size_t c = 0; c < p.choices.size(); ++c) {
      names.push_back(p.choices[c] + (p.ChoiceAvailable(static_cast<int64_t>(c), CpuIsa()) ? "" : "(n/a)"));
    }
    return absl::StrCat("{", absl::StrJoin(names, ","), "}");
  }
  if (p.values_kind == KREG_VALUES_LISTED) return absl::StrCat("{", absl::StrJoin(p.listed, ","), "}");
  return absl::StrCat(p.values_kind == KREG_VALUES_POW2 ? "powers of two in [" : "[", p.lo, "..", p.hi,
                      p.values_kind == KREG_VALUES_RANGE ? absl::StrCat(" step ", p.step) : "", "]");
}

const char* ParamTypeName(const ParamInfo& p) {
  switch (p.kind) {
    case KREG_PARAM_INT:
      return "int";
    case KREG_PARAM_INT_LIST:
      return "int_list";
    case KREG_PARAM_CHOICE:
      return "choice";
  }
  return "?";
}

}  // namespace kreg
