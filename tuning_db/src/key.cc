// Problem keys, trial identities and configurations as a table stores
// them (kreg/lut.h: "Keys and configurations"), and the walks over a
// table's messages (valid UTF-8, unknown fields).
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/lut.h"
#include "kreg/text.h"
#include "oneapi/tbb/blocked_range.h"
#include "oneapi/tbb/parallel_for.h"
#include "tuning_db_internal.h"

namespace kreg {
namespace tuning_db_internal {
namespace {

// One parameter's part of a ConfigId.
void AppendParamId(const tuning::ParamValue& p, std::string* out) {
  absl::StrAppend(out, p.name(), "\x1e", static_cast<int>(p.value_case()), "\x1e");
  if (p.value_case() == tuning::ParamValue::kChoice) {
    out->append(p.choice());  // ValueText without a copy
  } else {
    out->append(ValueText(p));
  }
}

// Appends the configuration's id: its parameters' ids, sorted, joined.
void AppendConfigId(const tuning::Config& config, std::string* out) {
  // Most configurations have no parameter or one: nothing to sort.
  if (config.params_size() <= 1) {
    if (config.params_size() == 1) AppendParamId(config.params(0), out);
    return;
  }
  // The parameters' ids back to back in one string, then sorted as views.
  std::string pieces;
  absl::InlinedVector<size_t, 8> ends;
  for (const tuning::ParamValue& p : config.params()) {
    AppendParamId(p, &pieces);
    ends.push_back(pieces.size());
  }
  absl::InlinedVector<absl::string_view, 8> params;
  for (size_t i = 0, begin = 0; i < ends.size(); begin = ends[i++]) {
    params.emplace_back(pieces.data() + begin, ends[i] - begin);
  }
  std::sort(params.begin(), params.end());
  out->reserve(out->size() + pieces.size() + params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (i > 0) out->push_back('\x1f');
    out->append(params[i].data(), params[i].size());
  }
}

}  // namespace

std::string ValueText(const tuning::ParamValue& p) {
  switch (p.value_case()) {
    case tuning::ParamValue::kIntValue:
      return absl::StrCat(p.int_value());
    case tuning::ParamValue::kListValue:
      return absl::StrJoin(p.list_value().values(), ",");
    case tuning::ParamValue::kChoice:
      return p.choice();
    case tuning::ParamValue::VALUE_NOT_SET:
      break;
  }
  return "?";
}

std::string KeyId(const tuning::ProblemKey& key) {
  // "name=value" of each dim in (name, value) order, joined by ',', made in
  // one string sized beforehand (a table's load makes one per entry).
  absl::InlinedVector<std::pair<absl::string_view, int64_t>, 8> dims;
  size_t size = key.op().size() + key.dtype().size() + key.machine_id().size() + key.data_class().size() + 3;
  for (const tuning::Dim& d : key.dims()) {
    dims.emplace_back(d.name(), d.value());
    size += d.name().size() + 2 + absl::numbers_internal::kFastToBufferSize;
  }
  std::sort(dims.begin(), dims.end());
  std::string id;
  id.reserve(size);
  id.append(key.op()).append("\x1f").append(key.dtype()).append("\x1f");
  char digits[absl::numbers_internal::kFastToBufferSize];
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) id.push_back(',');
    id.append(dims[i].first.data(), dims[i].first.size()).push_back('=');
    id.append(digits, absl::numbers_internal::FastIntToBuffer(dims[i].second, digits));
  }
  id.append("\x1f").append(key.machine_id()).append("\x1f").append(key.data_class());
  // As Sanitize would store it, so raw and stored keys find each other
  // (ASCII is stored as it is).
  const bool ascii = std::all_of(id.begin(), id.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  return ascii ? id : ValidUtf8(id);
}

std::string TrialId(absl::string_view variant, uint32_t version, const tuning::Config& config, int threads) {
  std::string id = absl::StrCat(variant, "\x1d", version, "\x1d");
  AppendConfigId(config, &id);
  if (threads > 0) absl::StrAppend(&id, "\x1d", threads);
  return id;
}

std::string TrialIdOf(const tuning::Trial& t) {
  return TrialId(t.variant(), t.variant_version(), t.config(), t.threads());
}

void Sanitize(google::protobuf::Message* m) {
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  const google::protobuf::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
      if (f->is_repeated()) {
        for (int j = 0; j < r->FieldSize(*m, f); ++j) r->SetRepeatedString(m, f, j, ValidUtf8(r->GetRepeatedString(*m, f, j)));
      } else if (r->HasField(*m, f)) {
        r->SetString(m, f, ValidUtf8(r->GetString(*m, f)));
      }
    } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int j = 0; j < r->FieldSize(*m, f); ++j) Sanitize(r->MutableRepeatedMessage(m, f, j));
      } else if (r->HasField(*m, f)) {
        Sanitize(r->MutableMessage(m, f));
      }
    }
  }
}

// Whether any message of `db` holds fields this schema does not know. A
// walk over the generated types, as protobuf's reflective
// DiscardUnknownFields lists every field of every message (a sixth of a
// load); Files.UnknownFieldsAreDroppedFromEveryMessage checks that the walk
// reaches every message type of the schema. The entries' types take their
// Reflection once (the few top-level messages ask their own): a message's
// GetReflection() goes through its descriptors' one-time set-up check on
// every call.
bool HasUnknownFields(const tuning::Database& db) {
  // A test for unknown fields in messages of the prototype's type.
  auto unknown_in = [](const auto& prototype) {
    const google::protobuf::Reflection* r = prototype.GetReflection();
    return [r](const google::protobuf::Message& m) { return !r->GetUnknownFields(m).empty(); };
  };
  const auto unknown_trial = unknown_in(tuning::Trial::default_instance());
  const auto unknown_config = unknown_in(tuning::Config::default_instance());
  const auto unknown_param = unknown_in(tuning::ParamValue::default_instance());
  const auto unknown_list = unknown_in(tuning::IntList::default_instance());
  const auto unknown_entry = unknown_in(tuning::Entry::default_instance());
  const auto unknown_key = unknown_in(tuning::ProblemKey::default_instance());
  const auto unknown_dim = unknown_in(tuning::Dim::default_instance());
  auto trial_unknown = [&](const tuning::Trial& t) {
    if (unknown_trial(t) || unknown_config(t.config())) return true;
    for (const tuning::ParamValue& p : t.config().params()) {
      if (unknown_param(p) || (p.has_list_value() && unknown_list(p.list_value()))) return true;
    }
    return false;
  };
  auto unknown = [](const google::protobuf::Message& m) {
    return !m.GetReflection()->GetUnknownFields(m).empty();
  };
  if (unknown(db)) return true;
  for (const tuning::Machine& m : db.machines()) {
    if (unknown(m) || (m.has_gpu() && unknown(m.gpu()))) return true;
  }
  for (const tuning::CommModel& m : db.comm_models()) {
    if (unknown(m)) return true;
  }
  auto entry_unknown = [&](const tuning::Entry& e) {
    if (unknown_entry(e) || unknown_key(e.key())) return true;
    for (const tuning::Dim& d : e.key().dims()) {
      if (unknown_dim(d)) return true;
    }
    if ((e.has_best() && trial_unknown(e.best())) || (e.has_runner_up() && trial_unknown(e.runner_up()))) return true;
    for (const tuning::Trial& t : e.trials()) {
      if (trial_unknown(t)) return true;
    }
    for (const tuning::Trial& t : e.partial()) {
      if (trial_unknown(t)) return true;
    }
    return false;
  };
  // The entries on every core (Reflection is safe to share).
  std::atomic<bool> found{false};
  tbb::parallel_for(tbb::blocked_range<int>(0, db.entries_size(), 256), [&](const tbb::blocked_range<int>& r) {
    for (int i = r.begin(); i < r.end() && !found.load(std::memory_order_relaxed); ++i) {
      if (entry_unknown(db.entries(i))) found.store(true, std::memory_order_relaxed);
    }
  });
  return found.load();
}

}  // namespace tuning_db_internal

using tuning::Trial;
using tuning_db_internal::TrialIdOf;
using tuning_db_internal::ValueText;

std::string TrialId(const tuning::Trial& trial) { return TrialIdOf(trial); }

// ---- Keys and configurations --------------------------------------------------

Dims CanonicalDims(const Op& op, const Dims& dims) {
  Dims out;
  out.reserve(dims.size());
  absl::InlinedVector<bool, 8> used(dims.size());
  auto take = [&](absl::string_view name, const int64_t* default_value) {
    for (size_t i = 0; i < dims.size(); ++i) {
      if (used[i] || dims[i].first != name) continue;
      used[i] = true;
      if (default_value == nullptr || dims[i].second != *default_value) out.push_back(dims[i]);
      return;
    }
  };
  for (const DimInfo& d : op.dims()) take(d.name, nullptr);
  for (const AttrInfo& a : op.attrs()) {
    if (!a.is_float) take(a.name, &a.default_value.i);
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!used[i]) out.push_back(dims[i]);
  }
  return out;
}

tuning::ProblemKey MakeProblemKey(absl::string_view op, absl::string_view dtype, const Dims& dims,
                                  absl::string_view machine_id, absl::string_view data_class) {
  tuning::ProblemKey key;
  key.set_op(std::string(op));
  key.set_dtype(std::string(dtype));
  for (const auto& [name, value] : dims) {
    tuning::Dim* d = key.add_dims();
    d->set_name(name);
    d->set_value(value);
  }
  key.set_machine_id(std::string(machine_id));
  key.set_data_class(std::string(data_class));
  return key;
}

tuning::ProblemKey MakeProblemKey(absl::string_view op, const OpKey& key,
                                  absl::string_view machine_id, absl::string_view data_class) {
  return MakeProblemKey(op, key.dtype, key.dims, machine_id, data_class);
}

Dims KeyDims(const tuning::ProblemKey& key) {
  Dims dims;
  dims.reserve(key.dims_size());
  for (const tuning::Dim& d : key.dims()) dims.emplace_back(d.name(), d.value());
  return dims;
}

std::string KeyString(const tuning::ProblemKey& key) {
  std::string data =
      key.data_class().empty() ? std::string() : absl::StrCat(" [", key.data_class(), "]");
  return absl::StrCat(key.op(), " ", key.dtype(), " ", DimsString(KeyDims(key)), data, " @",
                      key.machine_id());
}

tuning::Config ToProtoConfig(const Kernel& kernel, const Config& config) {
  tuning::Config out;
  const ParamSpace& params = kernel.params();
  for (size_t i = 0; i < params.size() && i < config.values().size(); ++i) {
    const ParamInfo& p = params[i];
    const ParamValue& v = config.values()[i];
    tuning::ParamValue* pv = out.add_params();
    pv->set_name(p.name);
    if (p.kind == KREG_PARAM_INT) {
      pv->set_int_value(v.value);
    } else if (p.kind == KREG_PARAM_INT_LIST) {
      pv->mutable_list_value()->mutable_values()->Add(v.list.begin(), v.list.end());
    } else if (v.value >= 0 && static_cast<size_t>(v.value) < p.choices.size()) {
      pv->set_choice(p.choices[static_cast<size_t>(v.value)]);
    } else {
      pv->set_choice(absl::StrCat("#", v.value));  // not a choice: refused on the way back
    }
  }
  return out;
}

absl::StatusOr<Config> FromProtoConfig(const Kernel& kernel, const tuning::Config& config, uint32_t isa) {
  const ParamSpace& params = kernel.params();
  std::vector<ParamValue> values(params.size());
  std::vector<bool> seen(params.size());
  for (const tuning::ParamValue& pv : config.params()) {
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", pv.name(), "' of ", kernel.name(), ": ", why));
    };
    const int i = params.Find(pv.name());
    if (i < 0) return bad("no such parameter");
    if (seen[i]) return bad("given twice");
    seen[i] = true;
    const ParamInfo& p = params[i];
    ParamValue& v = values[i];
    // The form of the value only; what values are legal is Validate's.
    if (p.kind == KREG_PARAM_INT) {
      if (pv.value_case() != tuning::ParamValue::kIntValue) return bad("expected an integer");
      v.value = pv.int_value();
    } else if (p.kind == KREG_PARAM_INT_LIST) {
      if (pv.value_case() != tuning::ParamValue::kListValue) return bad("expected an integer list");
      v.list.assign(pv.list_value().values().begin(), pv.list_value().values().end());
    } else {
      if (pv.value_case() != tuning::ParamValue::kChoice) return bad("expected a choice name");
      auto it = std::find(p.choices.begin(), p.choices.end(), pv.choice());
      if (it == p.choices.end()) return bad(absl::StrCat("'", pv.choice(), "' is not a choice"));
      v.value = it - p.choices.begin();
    }
  }
  // A parameter the variant gained after the configuration was stored
  // keeps its default: the version did not change, so the default is what
  // the variant did then.
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) values[i] = params[i].default_value;
  }
  Config out(std::move(values));
  if (absl::Status s = params.Validate(out, kernel.name(), isa); !s.ok()) return s;
  return out;
}

absl::Status CheckConfigs(const TuningDb& db, const Registry& registry, absl::string_view name) {
  for (int i = 0; i < db.proto().entries_size(); ++i) {
    const tuning::Entry& e = db.proto().entries(i);
    auto check = [&](const Trial& t) -> absl::Status {
      absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry.Get(absl::StrCat(e.key().op(), "/", t.variant()));
      if (!kernel.ok() || (*kernel)->version() != t.variant_version()) return absl::OkStatus();
      absl::StatusOr<Config> config = FromProtoConfig(**kernel, t.config(), ~uint32_t{0});
      if (config.ok()) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(name, ": entry ", i, " (", KeyString(e.key()), "): trial ",
                                                     t.variant(), " ", ConfigText(t.config()), ": ",
                                                     config.status().message()));
    };
    for (const Trial& t : e.trials()) {
      if (absl::Status s = check(t); !s.ok()) return s;
    }
    for (const Trial& t : e.partial()) {
      if (absl::Status s = check(t); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

std::string ConfigText(const tuning::Config& config) {
  return absl::StrJoin(config.params(), " ", [](std::string* out, const tuning::ParamValue& p) {
    absl::StrAppend(out, p.name(), "=", ValueText(p));
  });
}

}  // namespace kreg
