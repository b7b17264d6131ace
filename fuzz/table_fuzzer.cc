// Fuzzes the tuning-table loader (kreg/lut.h), binary and text, and what
// runs on a table once it loaded: the Lut built against the build's plugins,
// and queries of it.
//
// Each input is read three ways: as a file named .kdb (binary first, then
// text), as one named .txtpb (text first), and — since a mutated binary
// table almost never keeps its checksum — as a bare Database message given to
// TuningDb::FromProto, as a program would. Properties of every table that
// loads, beyond "no crash, no sanitizer report":
//   - it agrees with itself (Diff is empty) and merging it into itself adds
//     no entry;
//   - what ToBinary and ToText write of it loads again, with the same
//     entries and winners.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_registry.h"
#include "google/protobuf/stubs/logging.h"
#include "kreg/kreg_tuning.pb.h"
#include "kreg/lut.h"
#include "kreg/op.h"

namespace kreg::fuzz {
namespace {

// Queries of a built Lut per table, at most.
constexpr int kMaxQueries = 8;

void Exercise(const TuningDb& db) {
  (void)db.ToText();
  (void)db.Summary();
  (void)db.ToJson();
  (void)db.ToCsv();
  KREG_FUZZ_CHECK(TuningDb::Diff(db, db).empty());
  TuningDb merged = db;
  merged.MergeFrom(db);
  KREG_FUZZ_CHECK(merged.size() == db.size());

  absl::StatusOr<TuningDb> binary = TuningDb::Parse(db.ToBinary(), "written.kdb");
  KREG_FUZZ_CHECK_OK(binary.status());
  KREG_FUZZ_CHECK(binary->size() == db.size() && TuningDb::Diff(db, *binary).empty());
  absl::StatusOr<TuningDb> text = TuningDb::Parse(db.ToText(), "written.txtpb");
  KREG_FUZZ_CHECK_OK(text.status());
  KREG_FUZZ_CHECK(text->size() == db.size() && TuningDb::Diff(db, *text).empty());

  const Registry& registry = FuzzRegistry();
  TuningDb fresh = db;
  (void)fresh.DropStale(registry);
  absl::StatusOr<Lut> lut = Lut::Build(db, registry);
  if (!lut.ok()) return;
  int queries = 0;
  for (const tuning::Entry& entry : db.proto().entries()) {
    if (queries++ == kMaxQueries) break;
    const tuning::ProblemKey& key = entry.key();
    Dims dims = KeyDims(key);
    (void)lut->Query(key.op(), key.dtype(), dims, key.machine_id(), key.data_class());
    // Off the tuned point: the nearest-neighbour and default paths, with
    // the legality checks they make.
    for (auto& [name, value] : dims) value = value > 0 && value < (int64_t{1} << 40) ? value * 2 + 1 : value;
    (void)lut->Query(key.op(), key.dtype(), dims, key.machine_id(), key.data_class());
    (void)lut->Query(key.op(), key.dtype(), dims, ThisMachine().id(), "");
  }
}

}  // namespace
}  // namespace kreg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  using namespace kreg::fuzz;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (const char* name : {"fuzz.kdb", "fuzz.txtpb"}) {
    absl::StatusOr<TuningDb> db = TuningDb::Parse(bytes, name);
    if (db.ok()) Exercise(*db);
  }
  tuning::Database proto;
  google::protobuf::LogSilencer silence;  // protobuf logs malformed UTF-8
  if (proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    absl::StatusOr<TuningDb> db = TuningDb::FromProto(std::move(proto));
    if (db.ok()) Exercise(*db);
  }
  return 0;
}
