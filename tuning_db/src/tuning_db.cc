// TuningDb: machines, keys, configurations, and the database itself (files,
// recording, merging, printing). The run-time lookup is in lut.cc.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <unistd.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "file_util.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "kreg/limits.h"
#include "kreg/log.h"
#include "kreg/lut.h"
#include "kreg/text.h"

namespace kreg {
namespace {

using tuning::Trial;

// 64-bit FNV-1a: stable across processes, builds and compilers, unlike
// absl::Hash, which is salted per process.
uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// A parameter value as text: "11", "5,8,12", "partial_sort".
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

// Identity strings (not for display): fields joined by separators that do not
// occur in names, dims in name order so the order they were given in does not
// matter.
std::string KeyId(const tuning::ProblemKey& key) {
  std::vector<std::string> dims;
  for (const tuning::Dim& d : key.dims()) dims.push_back(absl::StrCat(d.name(), "=", d.value()));
  std::sort(dims.begin(), dims.end());
  // As Sanitize would store it, so raw and stored keys find each other.
  return ValidUtf8(absl::StrCat(key.op(), "\x1f", key.dtype(), "\x1f", absl::StrJoin(dims, ","), "\x1f",
                                key.machine_id(), "\x1f", key.data_class()));
}

std::string ConfigId(const tuning::Config& config) {
  std::vector<std::string> params;
  for (const tuning::ParamValue& p : config.params()) {
    params.push_back(
        absl::StrCat(p.name(), "\x1e", static_cast<int>(p.value_case()), "\x1e", ValueText(p)));
  }
  std::sort(params.begin(), params.end());
  return absl::StrJoin(params, "\x1f");
}

// A trial measured with a chosen thread count (threads > 0) is another
// trial than the same configuration on all cores.
std::string TrialId(absl::string_view variant, uint32_t version, const tuning::Config& config, int threads) {
  std::string id = absl::StrCat(variant, "\x1d", version, "\x1d", ConfigId(config));
  if (threads > 0) absl::StrAppend(&id, "\x1d", threads);
  return id;
}
std::string TrialIdOf(const Trial& t) {
  return TrialId(t.variant(), t.variant_version(), t.config(), t.threads());
}

// Every string field of `m`, recursively, made valid UTF-8 (proto3 refuses
// to parse anything else, so one bad byte would make a whole table
// unreadable).
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

bool Eligible(const Trial& t) { return t.status() == Trial::OK && std::isfinite(t.median_ns()); }

// Whether `a` ranks before `b` as a winner (both eligible).
bool Faster(const Trial& a, absl::string_view a_id, const Trial& b, absl::string_view b_id) {
  if (a.median_ns() != b.median_ns()) return a.median_ns() < b.median_ns();
  return a_id < b_id;
}

std::string Duration(double ns) {
  if (ns < 1e3) return absl::StrFormat("%.0f ns", ns);
  if (ns < 1e6) return absl::StrFormat("%.3g us", ns / 1e3);
  if (ns < 1e9) return absl::StrFormat("%.3g ms", ns / 1e6);
  return absl::StrFormat("%.3g s", ns / 1e9);
}

// "radix v1 first_bits=11 round_bits=8 capacity=4096"
std::string WinnerText(const Trial& t) {
  std::string params = ConfigText(t.config());
  return absl::StrCat(t.variant(), " v", t.variant_version(), params.empty() ? "" : " ", params,
                      t.threads() > 0 ? absl::StrCat(" threads=", t.threads()) : "");
}

class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error.empty()) error = absl::StrCat("line ", line + 1, ":", column + 1, ": ", message);
  }
  std::string error;
};

// The checksum field's tag (field 16, fixed64) and its size with the value.
constexpr char kChecksumTag[2] = {'\x81', '\x01'};
constexpr size_t kChecksumBytes = 10;

// Parses one format; "" on success, else why not.
std::string ParseAs(FileFormat format, absl::string_view bytes, tuning::Database* db) {
  db->Clear();
  if (format == FileFormat::kBinary) {
    if (bytes.size() > static_cast<size_t>(INT_MAX)) return "larger than 2 GiB";
    // Malformed UTF-8 in a string field makes protobuf log; a corrupt file is
    // an error we return, not a log line.
    google::protobuf::LogSilencer silence;
    // The checksum is the last field: the hash of every byte before it. It
    // is read before parsing, so that damage which also breaks the parse
    // is named as damage.
    const size_t body = bytes.size() - std::min(bytes.size(), kChecksumBytes);
    const bool trailer = bytes.size() >= kChecksumBytes && bytes.substr(body, 2) == absl::string_view(kChecksumTag, 2);
    uint64_t stored = 0;
    for (size_t i = 0; trailer && i < 8; ++i) stored |= uint64_t{static_cast<uint8_t>(bytes[body + 2 + i])} << (8 * i);
    const bool sum_ok = trailer && Fnv1a(bytes.substr(0, body)) == stored;
    constexpr const char* kMismatch = "checksum mismatch (the file was changed or damaged after it was written)";
    if (!db->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return trailer && !sum_ok ? kMismatch : "not a binary protobuf Database";
    }
    // A file that ends like a checksum whose sum is wrong is damaged, unless
    // it is a whole schema-1 file (no checksum) that happens to end so.
    const bool old_file = db->has_entry_count() && db->schema_version() == 1;
    if (trailer && !sum_ok && !old_file) return kMismatch;
    if (!db->has_entry_count()) return "no entry_count trailer (truncated?)";
    if (db->schema_version() < 2) return "";  // older files carry no checksum
    if (!db->has_checksum() || !trailer) return "no checksum at its end (cut short or changed)";
    if (!sum_ok) return kMismatch;
    return "";
  }
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  if (!parser.Parse(&in, db)) return errors.error.empty() ? "not text format" : errors.error;
  return "";
}

// `db` in binary with the checksum trailer.
std::string BinaryBytes(const tuning::Database& db) {
  std::string bytes = db.SerializeAsString();
  const uint64_t sum = Fnv1a(bytes);
  bytes.append(kChecksumTag, 2);
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((sum >> (8 * i)) & 0xff));
  return bytes;
}

// `db` as the file `path` holds it: text or binary by its extension.
absl::StatusOr<std::string> FileBytes(const tuning::Database& db, const std::string& path) {
  if (FormatForPath(path) == FileFormat::kBinary) return BinaryBytes(db);
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(db, &text)) {
    return absl::InternalError(absl::StrCat("cannot print ", path, " as text"));
  }
  return text;
}

}  // namespace

std::string TrialId(const tuning::Trial& trial) { return TrialIdOf(trial); }

// ---- Keys and configurations --------------------------------------------------

Dims CanonicalDims(const Op& op, const Dims& dims) {
  Dims out;
  out.reserve(dims.size());
  std::vector<bool> used(dims.size());
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

FileFormat FormatForPath(absl::string_view path) {
  for (absl::string_view ext : {".txtpb", ".textproto", ".pbtxt"}) {
    if (absl::EndsWith(path, ext)) return FileFormat::kText;
  }
  return FileFormat::kBinary;
}

// ---- Files ---------------------------------------------------------------------

TuningDb::TuningDb() {
  db_.set_schema_version(kSchemaVersion);
  db_.set_entry_count(0);
}

absl::StatusOr<TuningDb> TuningDb::Load(const std::string& path) {
  // A link planted in a shared folder is not followed for reading either.
  if (absl::StatusOr<std::string> file = internal::ResolvePath(path); !file.ok()) return file.status();
  absl::StatusOr<std::string> bytes = internal::ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<TuningDb> db = Parse(*bytes, path);
  if (db.ok()) Log(LogLevel::kInfo, absl::StrCat("read table ", path, ": ", db->size(), " entries"));
  return db;
}

absl::StatusOr<TuningDb> TuningDb::Parse(absl::string_view bytes, absl::string_view name) {
  auto loss = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(name, ": not a kreg tuning database: ", why));
  };
  if (bytes.empty()) return loss("the file is empty");
  FileFormat first = FormatForPath(name);
  FileFormat second = first == FileFormat::kText ? FileFormat::kBinary : FileFormat::kText;
  tuning::Database db;
  std::string why = ParseAs(first, bytes, &db);
  // A file that parses but carries no schema_version is foreign: try the
  // other format before giving up.
  if (!why.empty() || db.schema_version() == 0) {
    tuning::Database other;
    std::string other_why = ParseAs(second, bytes, &other);
    if (other_why.empty() && other.schema_version() != 0) {
      db = std::move(other);
      why.clear();
      first = second;  // the format it is in
    } else if (why.empty()) {
      why = "no schema_version";
    } else {
      why = absl::StrCat(why, "; as ", first == FileFormat::kText ? "binary" : "text", ": ",
                         other_why.empty() ? "no schema_version" : other_why);
    }
  }
  if (!why.empty()) return loss(why);
  if (db.has_entry_count() && db.entry_count() != static_cast<uint64_t>(db.entries_size())) {
    return loss(absl::StrCat("entry_count says ", db.entry_count(), " entries, the file holds ",
                             db.entries_size(), " (truncated?)"));
  }
  const bool unchecked = first == FileFormat::kBinary && db.schema_version() < 2;
  // Binary strings are valid UTF-8 already (protobuf checks); text ones need
  // not be, and would make the table unreadable once saved as binary.
  if (first == FileFormat::kText) Sanitize(&db);
  absl::StatusOr<TuningDb> out = Adopt(std::move(db));
  if (!out.ok()) return absl::Status(out.status().code(), absl::StrCat(name, ": ", out.status().message()));
  if (unchecked) {
    out->unchecked_ = absl::StrCat(name, ": written by an older kreg (schema 1) without a checksum, so damage to "
                                   "it cannot be detected; it gets one when next saved");
  }
  return out;
}

namespace {

// The numbers of a table's records within kreg/limits.h's bounds: a hostile
// or careless value fails the load, naming its record (a 2^31 thread count
// would crash oneTBB's arena; a -1 median win every query; NaN break every
// comparison).
absl::Status CheckNumbers(const tuning::Database& db) {
  for (const tuning::Machine& m : db.machines()) {
    if (absl::Status s = limits::CheckCores(m.cores(), absl::StrCat("machine ", m.id(), ": cores")); !s.ok()) return s;
  }
  for (const tuning::CommModel& m : db.comm_models()) {
    const std::string where = absl::StrCat("communicator model ", m.backend(), " @", m.machine_id(), ": ");
    for (const auto& [value, name] : {std::pair{m.alpha_s(), "alpha_s"}, std::pair{m.beta_s_per_byte(), "beta_s_per_byte"},
                                      std::pair{m.gamma_s_per_byte(), "gamma_s_per_byte"}}) {
      if (absl::Status s = limits::CheckFinite(value, absl::StrCat(where, name)); !s.ok()) return s;
    }
    if (absl::Status s = limits::CheckRanks(m.ranks(), absl::StrCat(where, "ranks")); !s.ok()) return s;
  }
  for (int i = 0; i < db.entries_size(); ++i) {
    const tuning::Entry& e = db.entries(i);
    // The checks first; the record's name only for a failure (a table of
    // 10k entries is checked on every load).
    auto check = [&](const Trial& t, absl::string_view which) -> absl::Status {
      const std::pair<const char*, absl::Status> checks[] = {
          {"threads", limits::CheckThreads(t.threads(), "")},
          {"median_ns", limits::CheckNs(t.median_ns(), "")},
          {"min_ns", limits::CheckNs(t.min_ns(), "")},
          {"max_ns", limits::CheckNs(t.max_ns(), "")},
          {"relative_iqr", limits::CheckFinite(t.relative_iqr(), "")},
          {"reps", limits::CheckReps(t.reps(), "", 0)},
      };
      for (const auto& [field, s] : checks) {
        if (s.ok()) continue;
        return absl::InvalidArgumentError(absl::StrCat("entry ", i, " (", KeyString(e.key()), "): ", which, " ",
                                                       t.variant(), " ", ConfigText(t.config()), ": ", field, ": ",
                                                       s.message()));
      }
      return absl::OkStatus();
    };
    for (const Trial& t : e.trials()) {
      if (absl::Status s = check(t, "trial"); !s.ok()) return s;
    }
    for (const Trial& t : e.partial()) {
      if (absl::Status s = check(t, "partial trial"); !s.ok()) return s;
    }
    if (e.has_best()) {
      if (absl::Status s = check(e.best(), "best"); !s.ok()) return s;
    }
    if (e.has_runner_up()) {
      if (absl::Status s = check(e.runner_up(), "runner_up"); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TuningDb> TuningDb::FromProto(tuning::Database database) {
  Sanitize(&database);
  return Adopt(std::move(database));
}

absl::StatusOr<TuningDb> TuningDb::Adopt(tuning::Database database) {
  // Fields this kreg does not know (a newer kreg's: it bumps schema_version
  // for any it needs kept) are dropped, so what it prints parses again.
  database.DiscardUnknownFields();
  if (database.schema_version() == 0) {
    return absl::DataLossError("no schema_version: not a kreg tuning database");
  }
  if (database.schema_version() > kSchemaVersion) {
    return absl::DataLossError(absl::StrCat("schema_version ", database.schema_version(),
                                            " is newer than this kreg reads (", kSchemaVersion,
                                            "); upgrade kreg"));
  }
  for (int i = 0; i < database.entries_size(); ++i) {
    if (database.entries(i).key().op().empty()) {
      return absl::DataLossError(absl::StrCat("entry ", i, " has no op"));
    }
  }
  if (absl::Status s = CheckNumbers(database); !s.ok()) return s;
  TuningDb out;
  for (tuning::Machine& m : *database.mutable_machines()) out.AddMachine(std::move(m));
  for (const tuning::CommModel& m : database.comm_models()) out.SetCommModel(m);
  for (tuning::Entry& e : *database.mutable_entries()) {
    const int index = out.FindOrAddEntry(e.key());
    tuning::Entry* entry = out.db_.mutable_entries(index);
    // A slim file's only trials are its winners. Where the winners are
    // among the trials too, the trials are the truth: the winner fields
    // are copies (an edited trial beats a stale copy of itself).
    absl::flat_hash_set<std::string> listed;
    for (const Trial& t : e.trials()) {
      out.PutTrial(index, t, /*keep_newer=*/true);
      listed.insert(TrialIdOf(t));
    }
    for (const Trial& t : e.partial()) out.PutPartial(index, t);
    if (e.has_best() && !listed.contains(TrialIdOf(e.best()))) out.PutTrial(index, e.best(), /*keep_newer=*/true);
    if (e.has_runner_up() && !listed.contains(TrialIdOf(e.runner_up()))) {
      out.PutTrial(index, e.runner_up(), /*keep_newer=*/true);
    }
    if (e.tuned_at() >= entry->tuned_at()) {
      entry->set_tool_version(e.tool_version());
      entry->set_strategy(e.strategy());
      entry->set_tuned_at(e.tuned_at());
      entry->set_incomplete(e.incomplete());
    }
  }
  for (int i = 0; i < out.db_.entries_size(); ++i) out.RecomputeWinners(i);
  return out;
}

absl::Status TuningDb::Save(const std::string& path, const SaveOptions& options) const {
  const tuning::Database* db = &db_;
  tuning::Database slim;
  if (options.winners_only || options.best_per_variant) {
    slim = db_;
    for (tuning::Entry& e : *slim.mutable_entries()) {
      e.clear_partial();
      if (options.winners_only) {
        e.clear_trials();
        continue;
      }
      // Each variant's fastest OK trial (the entry's winners among them),
      // per combination of its named choices: a choice may need an ISA
      // (topk/heap's simd, gmm/tiled's micro), and a machine without it
      // must still find the variant's best that it can run.
      auto choices = [](const Trial& t) {
        std::string out;
        for (const tuning::ParamValue& p : t.config().params()) {
          if (p.value_case() == tuning::ParamValue::kChoice) absl::StrAppend(&out, p.name(), "=", p.choice(), ";");
        }
        return out;
      };
      std::vector<Trial> kept;
      std::vector<std::string> kept_choices;  // choices(kept[i])
      for (const Trial& t : e.trials()) {
        if (!Eligible(t)) continue;
        const std::string mine = choices(t);
        size_t i = 0;
        while (i < kept.size() && !(kept[i].variant() == t.variant() &&
                                    kept[i].variant_version() == t.variant_version() && kept_choices[i] == mine)) {
          ++i;
        }
        if (i == kept.size()) {
          kept.push_back(t);
          kept_choices.push_back(mine);
        } else if (t.median_ns() < kept[i].median_ns()) {
          kept[i] = t;
        }
      }
      std::sort(kept.begin(), kept.end(), [](const Trial& a, const Trial& b) { return a.median_ns() < b.median_ns(); });
      // best and runner_up are the first two: readers derive them again.
      e.clear_trials();
      e.clear_best();
      e.clear_runner_up();
      for (Trial& t : kept) *e.add_trials() = std::move(t);
    }
    db = &slim;
  }
  absl::StatusOr<std::string> file = internal::ResolvePath(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<std::string> bytes = FileBytes(*db, *file);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<internal::FileLock> lock = internal::FileLock::Acquire(*file);
  if (!lock.ok()) return lock.status();
  internal::RemoveStaleTemporaries(*file);
  return internal::AtomicWrite(*file, *bytes);
}

absl::Status TuningDb::CheckWritable(const std::string& path) {
  absl::StatusOr<std::string> file = internal::ResolvePath(path);
  if (!file.ok()) return file.status();
  const std::filesystem::path parent = std::filesystem::path(*file).parent_path();
  const std::string folder = parent.empty() ? std::string(".") : parent.string();
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no folder ", folder));
  }
  if (access(file->c_str(), F_OK) == 0 && access(file->c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(*file, ": this user may not write it; not replaced"));
  }
  if (access(folder.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": this user may not create files in ", folder));
  }
  return internal::FileLock::Acquire(*file).status();
}

absl::Status TuningDb::SaveMerged(const std::string& path) {
  absl::StatusOr<std::string> file = internal::ResolvePath(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<internal::FileLock> lock = internal::FileLock::Acquire(*file);
  if (!lock.ok()) return lock.status();
  internal::RemoveStaleTemporaries(*file);
  absl::StatusOr<TuningDb> current = Load(*file);
  if (!current.ok() && !absl::IsNotFound(current.status())) return current.status();
  TuningDb merged = current.ok() ? *std::move(current) : TuningDb();
  merged.MergeFrom(*this);
  absl::StatusOr<std::string> bytes = FileBytes(merged.db_, *file);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = internal::AtomicWrite(*file, *bytes); !s.ok()) return s;
  merged.unchecked_.clear();
  *this = std::move(merged);
  return absl::OkStatus();
}

std::string TuningDb::ToBinary() const { return BinaryBytes(db_); }

// ---- Recording -------------------------------------------------------------------

void TuningDb::AddMachine(tuning::Machine machine) {
  Sanitize(&machine);
  if (machine.id().empty()) machine.set_id(FingerprintId(machine));
  for (tuning::Machine& m : *db_.mutable_machines()) {
    if (m.id() == machine.id()) {
      m = std::move(machine);
      return;
    }
  }
  *db_.add_machines() = std::move(machine);
}

int TuningDb::FindOrAddEntry(const tuning::ProblemKey& key) {
  auto [it, added] = entries_.try_emplace(KeyId(key), db_.entries_size());
  if (added) {
    tuning::ProblemKey* stored = db_.add_entries()->mutable_key();
    *stored = key;
    Sanitize(stored);
    index_.emplace_back();
    db_.set_entry_count(static_cast<uint64_t>(db_.entries_size()));
  }
  return it->second;
}

int TuningDb::FindEntryIndex(const tuning::ProblemKey& key) const {
  auto it = entries_.find(KeyId(key));
  return it == entries_.end() ? -1 : it->second;
}

void TuningDb::AddTrial(const tuning::ProblemKey& key, const Trial& raw) {
  Trial trial = raw;
  Sanitize(&trial);
  PutTrial(FindOrAddEntry(key), trial, /*keep_newer=*/false);
}

void TuningDb::SetTuningInfo(const tuning::ProblemKey& key, absl::string_view tool_version,
                             absl::string_view strategy, int64_t tuned_at, bool complete) {
  tuning::Entry* e = db_.mutable_entries(FindOrAddEntry(key));
  e->set_tool_version(ValidUtf8(tool_version));
  e->set_strategy(ValidUtf8(strategy));
  e->set_tuned_at(tuned_at);
  e->set_incomplete(!complete);
}

void TuningDb::AddPartial(const tuning::ProblemKey& key, const Trial& trial) {
  PutPartial(FindOrAddEntry(key), trial);
}

void TuningDb::PutPartial(int entry, const Trial& trial) {
  tuning::Entry& e = *db_.mutable_entries(entry);
  auto [it, added] = index_[entry].partial.try_emplace(TrialIdOf(trial), e.partial_size());
  if (added) {
    *e.add_partial() = trial;
    return;
  }
  // The one of more runs; between as many, the newer, and at the same
  // second a result over the mark of one in flight.
  const Trial& old = e.partial(it->second);
  const auto rank = [](const Trial& t) { return std::make_tuple(t.reps(), t.measured_at(), t.status() == Trial::OK); };
  if (rank(trial) >= rank(old)) *e.mutable_partial(it->second) = trial;
}

void TuningDb::PutTrial(int entry, const Trial& trial, bool keep_newer, Ties ties) {
  tuning::Entry& e = *db_.mutable_entries(entry);
  EntryIndex& index = index_[entry];
  std::string id = TrialIdOf(trial);
  auto [it, added] = index.trials.try_emplace(id, e.trials_size());
  const int i = it->second;
  if (added) {
    *e.add_trials() = trial;
    index.ids.push_back(std::move(id));
  } else {
    if (keep_newer && e.trials(i).measured_at() > trial.measured_at()) return;
    // Two measurements of one candidate at the same second, canonically:
    // the same one whichever came first.
    if (keep_newer && ties == Ties::kCanonical && e.trials(i).measured_at() == trial.measured_at() &&
        trial.SerializeAsString() >= e.trials(i).SerializeAsString()) {
      return;
    }
    *e.mutable_trials(i) = trial;
    if (i == index.best || i == index.runner_up) {
      RecomputeWinners(entry);  // the replaced trial held a place
      return;
    }
  }
  // Only the new trial can move: slot it in if it beats a winner.
  if (!Eligible(trial)) return;
  const std::string& tid = index.ids[i];
  auto beats = [&](int other) {
    return other < 0 || Faster(trial, tid, e.trials(other), index.ids[other]);
  };
  if (beats(index.best)) {
    index.runner_up = index.best;
    index.best = i;
  } else if (beats(index.runner_up)) {
    index.runner_up = i;
  } else {
    return;
  }
  SyncWinners(entry);
}

void TuningDb::RecomputeWinners(int entry) {
  const tuning::Entry& e = db_.entries(entry);
  EntryIndex& index = index_[entry];
  index.best = index.runner_up = -1;
  for (int i = 0; i < e.trials_size(); ++i) {
    const Trial& t = e.trials(i);
    if (!Eligible(t)) continue;
    auto beats = [&](int other) {
      return other < 0 || Faster(t, index.ids[i], e.trials(other), index.ids[other]);
    };
    if (beats(index.best)) {
      index.runner_up = index.best;
      index.best = i;
    } else if (beats(index.runner_up)) {
      index.runner_up = i;
    }
  }
  SyncWinners(entry);
}

void TuningDb::SyncWinners(int entry) {
  tuning::Entry& e = *db_.mutable_entries(entry);
  const EntryIndex& index = index_[entry];
  if (index.best >= 0) {
    *e.mutable_best() = e.trials(index.best);
  } else {
    e.clear_best();
  }
  if (index.runner_up >= 0) {
    *e.mutable_runner_up() = e.trials(index.runner_up);
  } else {
    e.clear_runner_up();
  }
}

void TuningDb::Reindex() {
  entries_.clear();
  index_.assign(db_.entries_size(), EntryIndex());
  for (int i = 0; i < db_.entries_size(); ++i) {
    const tuning::Entry& e = db_.entries(i);
    entries_.emplace(KeyId(e.key()), i);
    for (int j = 0; j < e.trials_size(); ++j) {
      std::string id = TrialIdOf(e.trials(j));
      index_[i].trials.emplace(id, j);
      index_[i].ids.push_back(std::move(id));
    }
    for (int j = 0; j < e.partial_size(); ++j) index_[i].partial.emplace(TrialIdOf(e.partial(j)), j);
    RecomputeWinners(i);
  }
  db_.set_entry_count(static_cast<uint64_t>(db_.entries_size()));
}

const tuning::Entry* TuningDb::FindEntry(const tuning::ProblemKey& key) const {
  int i = FindEntryIndex(key);
  return i < 0 ? nullptr : &db_.entries(i);
}

const Trial* TuningDb::FindTrial(const tuning::ProblemKey& key, absl::string_view variant,
                                 uint32_t variant_version, const tuning::Config& config, int threads) const {
  int i = FindEntryIndex(key);
  if (i < 0) return nullptr;
  const EntryIndex& index = index_[i];
  auto it = index.trials.find(TrialId(variant, variant_version, config, threads));
  return it == index.trials.end() ? nullptr : &db_.entries(i).trials(it->second);
}

const Trial* TuningDb::FindPartial(const tuning::ProblemKey& key, absl::string_view variant,
                                   uint32_t variant_version, const tuning::Config& config, int threads) const {
  const int i = FindEntryIndex(key);
  if (i < 0) return nullptr;
  const EntryIndex& index = index_[i];
  auto it = index.partial.find(TrialId(variant, variant_version, config, threads));
  return it == index.partial.end() ? nullptr : &db_.entries(i).partial(it->second);
}

int TuningDb::DropStale(const Registry& registry) {
  int dropped = 0, stale_partial = 0;
  for (tuning::Entry& e : *db_.mutable_entries()) {
    auto stale = [&](const Trial& t) {
      absl::StatusOr<std::shared_ptr<const Kernel>> k =
          registry.Get(absl::StrCat(e.key().op(), "/", t.variant()));
      return k.ok() && (*k)->version() != t.variant_version();
    };
    // Removes the stale ones of `list`; returns how many.
    auto drop = [&](google::protobuf::RepeatedPtrField<Trial>* list) {
      auto keep = std::stable_partition(list->begin(), list->end(), [&](const Trial& t) { return !stale(t); });
      const int n = static_cast<int>(list->end() - keep);
      list->DeleteSubrange(static_cast<int>(keep - list->begin()), n);
      return n;
    };
    dropped += drop(e.mutable_trials());
    stale_partial += drop(e.mutable_partial());
  }
  if (dropped > 0 || stale_partial > 0) Reindex();
  return dropped;
}

// ---- Combining ---------------------------------------------------------------------

void TuningDb::SetCommModel(const tuning::CommModel& model) {
  for (tuning::CommModel& m : *db_.mutable_comm_models()) {
    if (m.machine_id() == model.machine_id() && m.backend() == model.backend()) {
      if (model.measured_at() >= m.measured_at()) m = model;
      return;
    }
  }
  *db_.add_comm_models() = model;
}

const tuning::CommModel* TuningDb::FindCommModel(absl::string_view machine_id, absl::string_view backend) const {
  for (const tuning::CommModel& m : db_.comm_models()) {
    if (m.machine_id() == machine_id && m.backend() == backend) return &m;
  }
  return nullptr;
}

void TuningDb::MergeFrom(const TuningDb& other, Ties ties) {
  for (const tuning::Machine& m : other.db_.machines()) AddMachine(m);
  for (const tuning::CommModel& m : other.db_.comm_models()) SetCommModel(m);
  for (const tuning::Entry& theirs : other.db_.entries()) {
    const int index = FindOrAddEntry(theirs.key());
    tuning::Entry* mine = db_.mutable_entries(index);
    for (const Trial& t : theirs.trials()) PutTrial(index, t, /*keep_newer=*/true, ties);
    for (const Trial& t : theirs.partial()) PutPartial(index, t);
    const auto sweep = [](const tuning::Entry& e) {
      return std::make_tuple(e.tool_version(), e.strategy(), e.incomplete());
    };
    const bool tie_to_theirs = ties == Ties::kIncoming || sweep(theirs) < sweep(*mine);
    if (theirs.tuned_at() > mine->tuned_at() || (theirs.tuned_at() == mine->tuned_at() && tie_to_theirs)) {
      mine->set_tool_version(theirs.tool_version());
      mine->set_strategy(theirs.strategy());
      mine->set_tuned_at(theirs.tuned_at());
      mine->set_incomplete(theirs.incomplete());
    }
  }
}

TuningDb TuningDb::Merge(const TuningDb& a, const TuningDb& b) {
  TuningDb out = a;
  out.MergeFrom(b);
  return out;
}

std::string TuningDb::Diff(const TuningDb& a, const TuningDb& b) {
  std::vector<std::string> lines;
  for (const tuning::Entry& ea : a.db_.entries()) {
    const tuning::Entry* found = b.FindEntry(ea.key());
    if (found == nullptr) {
      lines.push_back(absl::StrCat("only in a: ", KeyString(ea.key())));
      continue;
    }
    const tuning::Entry& eb = *found;
    std::string wa = ea.has_best() ? TrialIdOf(ea.best()) : "";
    std::string wb = eb.has_best() ? TrialIdOf(eb.best()) : "";
    if (wa != wb) {
      lines.push_back(absl::StrCat("differs: ", KeyString(ea.key()),
                                   ": a=", ea.has_best() ? WinnerText(ea.best()) : "none",
                                   " b=", eb.has_best() ? WinnerText(eb.best()) : "none"));
    } else if (ea.has_best() && ea.best().measured_at() == eb.best().measured_at() &&
               ea.best().SerializeAsString() != eb.best().SerializeAsString()) {
      // The same winner, two results claiming one moment: they cannot both be true.
      lines.push_back(absl::StrCat("differs: ", KeyString(ea.key()), ": ", WinnerText(ea.best()),
                                   " measured at the same time as ", absl::StrFormat("%.0f ns in a, %.0f ns in b",
                                   ea.best().median_ns(), eb.best().median_ns())));
    }
  }
  for (const tuning::Entry& eb : b.db_.entries()) {
    if (a.FindEntry(eb.key()) == nullptr) {
      lines.push_back(absl::StrCat("only in b: ", KeyString(eb.key())));
    }
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& line : lines) absl::StrAppend(&out, line, "\n");
  return out;
}

// ---- Reading -------------------------------------------------------------------------

std::string TuningDb::ToText() const {
  std::string text;
  google::protobuf::TextFormat::PrintToString(db_, &text);
  return text;
}

std::string TuningDb::ToJson() const {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Cannot fail: the message is valid and has no Any fields to resolve.
  (void)google::protobuf::util::MessageToJsonString(db_, &json, options);
  return json;
}

namespace {

// A CSV field (RFC 4180): quoted where it holds a comma, a quote or a line
// break, its quotes doubled.
std::string CsvField(absl::string_view v) {
  if (v.find_first_of(",\"\r\n") == absl::string_view::npos) return std::string(v);
  return absl::StrCat("\"", absl::StrReplaceAll(v, {{"\"", "\"\""}}), "\"");
}

}  // namespace

std::string TuningDb::ToCsv() const {
  std::string out =
      "op,dtype,dims,data_class,machine,variant,version,params,threads,status,median_ns,min_ns,max_ns,"
      "relative_iqr,reps,measured_at,error\n";
  for (const tuning::Entry& e : db_.entries()) {
    const tuning::ProblemKey& k = e.key();
    const std::string key = absl::StrJoin({CsvField(k.op()), CsvField(k.dtype()), CsvField(DimsString(KeyDims(k))),
                                           CsvField(k.data_class()), CsvField(k.machine_id())}, ",");
    for (const Trial& t : e.trials()) {
      absl::StrAppend(&out, key, ",", CsvField(t.variant()), ",", t.variant_version(), ",",
                      CsvField(ConfigText(t.config())), ",", t.threads(), ",", Trial::Status_Name(t.status()), ",",
                      absl::StrFormat("%.17g,%.17g,%.17g,%.17g", t.median_ns(), t.min_ns(), t.max_ns(),
                                      t.relative_iqr()),
                      ",", t.reps(), ",", t.measured_at(), ",", CsvField(t.error()), "\n");
    }
  }
  return out;
}

std::string TuningDb::Summary() const {
  std::vector<std::string> lines;
  for (const tuning::Entry& e : db_.entries()) {
    std::string line = absl::StrCat(KeyString(e.key()), " -> ");
    if (e.has_best()) {
      absl::StrAppend(&line, WinnerText(e.best()), "  ", Duration(e.best().median_ns()));
      if (e.has_runner_up()) {
        absl::StrAppend(&line, " (runner-up ", e.runner_up().variant(), " ",
                        Duration(e.runner_up().median_ns()), ", ");
      } else {
        absl::StrAppend(&line, " (");
      }
    } else {
      absl::StrAppend(&line, "no OK trial (");
    }
    absl::StrAppend(&line, e.trials_size(), e.trials_size() == 1 ? " trial)" : " trials)");
    lines.push_back(std::move(line));
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& line : lines) absl::StrAppend(&out, line, "\n");
  return out;
}

// ---- Shipped tables ----------------------------------------------------------------

std::vector<std::string> ShippedTableDirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("KREG_TABLE_PATH")) {
    for (absl::string_view part : absl::StrSplit(env, ':', absl::SkipEmpty())) dirs.emplace_back(part);
    return dirs;
  }
  auto add = [&dirs](std::string dir) {
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(std::move(dir));
  };
  if (!InstallPrefix().empty()) add(absl::StrCat(InstallPrefix(), "/", KREG_INSTALL_TABLE_SUBDIR));
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) add((exe.parent_path().parent_path() / "share" / "kreg" / "tables").string());
  add(KREG_INSTALL_TABLE_DIR);
  return dirs;
}

TuningDb ShippedTables(std::vector<std::string>* warnings) {
  TuningDb merged;
  std::vector<std::string> seen;  // file names
  for (const std::string& dir : ShippedTableDirs()) {
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".txtpb") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const std::filesystem::path& file : files) {
      if (std::find(seen.begin(), seen.end(), file.filename().string()) != seen.end()) continue;
      seen.push_back(file.filename().string());
      absl::StatusOr<TuningDb> db = TuningDb::Load(file.string());
      if (!db.ok()) {
        warnings->push_back(absl::StrCat("shipped table skipped: ", db.status().message()));
        continue;
      }
      merged.MergeFrom(*db);
    }
  }
  return merged;
}

}  // namespace kreg
