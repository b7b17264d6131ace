// TuningDb files: parsing and writing binary (with its checksum trailer)
// and text tables (adopt.cc checks what a file holds and adopts it),
// saving atomically under the table's lock, and the tables kreg ships.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <oneapi/tbb/task_group.h>
#include <unistd.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "file_util.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/text_format.h"
#include "kreg/log.h"
#include "kreg/lut.h"
#include "tuning_db_internal.h"

namespace kreg {

using tuning::Trial;
using tuning_db_internal::Eligible;
using tuning_db_internal::Faster;
using tuning_db_internal::Sanitize;

namespace {

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
// Files from this size on are summed on a second thread while they parse.
constexpr size_t kSumBesideBytes = size_t{256} << 10;

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
    // A large file's sum is taken beside the parse: FNV-1a is one dependent
    // multiply per byte, a tenth of a 2 MB table's load on one core.
    uint64_t sum = 0;
    tbb::task_group summing;
    auto take_sum = [&] { sum = trailer ? Fnv1a(bytes.substr(0, body)) : 0; };
    if (body >= kSumBesideBytes) {
      summing.run(take_sum);
    } else {
      take_sum();
    }
    const bool parsed = db->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
    summing.wait();
    const bool sum_ok = trailer && sum == stored;
    constexpr const char* kMismatch = "checksum mismatch (the file was changed or damaged after it was written)";
    if (!parsed) {
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

FileFormat FormatForPath(absl::string_view path) {
  for (absl::string_view ext : {".txtpb", ".textproto", ".pbtxt"}) {
    if (absl::EndsWith(path, ext)) return FileFormat::kText;
  }
  return FileFormat::kBinary;
}

// ---- Files ---------------------------------------------------------------------

TuningDb::TuningDb()
    : arena_(std::make_unique<google::protobuf::Arena>()),
      db_(google::protobuf::Arena::CreateMessage<tuning::Database>(arena_.get())) {
  db_->set_schema_version(kSchemaVersion);
  db_->set_entry_count(0);
}

TuningDb::TuningDb(std::unique_ptr<google::protobuf::Arena> arena)
    : arena_(std::move(arena)), db_(google::protobuf::Arena::CreateMessage<tuning::Database>(arena_.get())) {
  db_->set_schema_version(kSchemaVersion);
  db_->set_entry_count(0);
}

TuningDb::TuningDb(const TuningDb& other) : TuningDb() { *this = other; }

TuningDb& TuningDb::operator=(const TuningDb& other) {
  if (this == &other) return *this;
  *db_ = *other.db_;
  unchecked_ = other.unchecked_;
  entries_ = other.entries_;
  index_ = other.index_;
  return *this;
}

TuningDb::TuningDb(TuningDb&& other) noexcept
    : arena_(std::make_unique<google::protobuf::Arena>()),
      db_(google::protobuf::Arena::CreateMessage<tuning::Database>(arena_.get())) {
  *this = std::move(other);
}

TuningDb& TuningDb::operator=(TuningDb&& other) noexcept {
  if (this == &other) return *this;
  std::swap(arena_, other.arena_);
  std::swap(db_, other.db_);
  std::swap(unchecked_, other.unchecked_);
  std::swap(entries_, other.entries_);
  std::swap(index_, other.index_);
  other.db_->Clear();
  other.unchecked_.clear();
  other.entries_.clear();
  other.index_.clear();
  return *this;
}

TuningDb::~TuningDb() = default;

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
  // The parsed messages live on an arena that the TuningDb keeps: what
  // Adopt keeps it moves there rather than copies, and
  // freeing the arena costs little next to freeing ten thousand entries'
  // messages one by one.
  auto arena = std::make_unique<google::protobuf::Arena>();
  tuning::Database* parsed = google::protobuf::Arena::CreateMessage<tuning::Database>(arena.get());
  tuning::Database& db = *parsed;
  std::string why = ParseAs(first, bytes, &db);
  // A file that parses but carries no schema_version is foreign: try the
  // other format before giving up.
  if (!why.empty() || db.schema_version() == 0) {
    tuning::Database& other = *google::protobuf::Arena::CreateMessage<tuning::Database>(arena.get());
    std::string other_why = ParseAs(second, bytes, &other);
    if (other_why.empty() && other.schema_version() != 0) {
      db.Swap(&other);
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
  absl::StatusOr<TuningDb> out = Adopt(&db, std::move(arena));
  if (!out.ok()) return absl::Status(out.status().code(), absl::StrCat(name, ": ", out.status().message()));
  if (unchecked) {
    out->unchecked_ = absl::StrCat(name, ": written by an older kreg (schema 1) without a checksum, so damage to "
                                   "it cannot be detected; it gets one when next saved");
  }
  return out;
}

absl::Status TuningDb::Save(const std::string& path, const SaveOptions& options) const {
  const tuning::Database* db = db_;
  tuning::Database slim;
  if (options.winners_only || options.best_per_variant) {
    slim = *db_;
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
        } else if (Faster(t, kept[i])) {
          kept[i] = t;
        }
      }
      std::sort(kept.begin(), kept.end(), [](const Trial& a, const Trial& b) { return Faster(a, b); });
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
  absl::StatusOr<std::string> bytes = FileBytes(*merged.db_, *file);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = internal::AtomicWrite(*file, *bytes); !s.ok()) return s;
  merged.unchecked_.clear();
  *this = std::move(merged);
  return absl::OkStatus();
}

std::string TuningDb::ToBinary() const { return BinaryBytes(*db_); }

// ---- Shipped tables ----------------------------------------------------------------

std::vector<std::string> ShippedTableDirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("KREG_TABLE_PATH")) {
    for (absl::string_view part : absl::StrSplit(env, ':', absl::SkipEmpty())) dirs.emplace_back(part);
    return dirs;
  }
  auto add = [&dirs](std::string dir) {
    if (!dir.empty() && std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(std::move(dir));
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
