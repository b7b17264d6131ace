// Fuzzes text tables as a careless or hostile person edits them: the input
// is a table in protobuf text format, its seeds well-formed tables carrying
// the hostile values of the second hardening round (a 2^31 thread count, a
// negative, NaN or 1e308 median, negative reps, a choice no variant has),
// and the dictionary (text_table_fuzzer.dict) offers such numbers and
// names, so mutations change values rather than only break the syntax
// (table_fuzzer covers damaged bytes). Properties of every table that
// loads, beyond "no crash, no sanitizer report":
//   - each of its numbers lies within kreg/limits.h's bounds;
//   - if CheckConfigs accepts it, every trial of a loaded kernel at its
//     version converts to a configuration in the kernel's space;
//   - the Lut built from it answers with a thread count within bounds, and
//     a measured answer's median within bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_registry.h"
#include "kreg/kreg_tuning.pb.h"
#include "kreg/limits.h"
#include "kreg/lut.h"
#include "kreg/op.h"

namespace kreg::fuzz {
namespace {

constexpr int kMaxQueries = 8;

void CheckTrial(const tuning::Trial& t) {
  KREG_FUZZ_CHECK_OK(limits::CheckThreads(t.threads()));
  KREG_FUZZ_CHECK_OK(limits::CheckNs(t.median_ns(), "median_ns"));
  KREG_FUZZ_CHECK_OK(limits::CheckNs(t.min_ns(), "min_ns"));
  KREG_FUZZ_CHECK_OK(limits::CheckNs(t.max_ns(), "max_ns"));
  KREG_FUZZ_CHECK_OK(limits::CheckFinite(t.relative_iqr(), "relative_iqr"));
  KREG_FUZZ_CHECK_OK(limits::CheckReps(t.reps(), "reps", 0));
}

void Exercise(const TuningDb& db) {
  for (const tuning::Machine& m : db.proto().machines()) KREG_FUZZ_CHECK_OK(limits::CheckCores(m.cores()));
  for (const tuning::CommModel& m : db.proto().comm_models()) {
    KREG_FUZZ_CHECK_OK(limits::CheckFinite(m.alpha_s(), "alpha_s"));
    KREG_FUZZ_CHECK_OK(limits::CheckRanks(m.ranks()));
  }
  for (const tuning::Entry& e : db.proto().entries()) {
    for (const tuning::Trial& t : e.trials()) CheckTrial(t);
    for (const tuning::Trial& t : e.partial()) CheckTrial(t);
  }
  const Registry& registry = FuzzRegistry();
  if (!CheckConfigs(db, registry, "t.txtpb").ok()) return;
  for (const tuning::Entry& e : db.proto().entries()) {
    for (const tuning::Trial& t : e.trials()) {
      absl::StatusOr<std::shared_ptr<const Kernel>> kernel =
          registry.Get(absl::StrCat(e.key().op(), "/", t.variant()));
      if (!kernel.ok() || (*kernel)->version() != t.variant_version()) continue;
      KREG_FUZZ_CHECK_OK(FromProtoConfig(**kernel, t.config(), ~uint32_t{0}).status());
    }
  }
  absl::StatusOr<Lut> lut = Lut::Build(db, registry);
  if (!lut.ok()) return;
  int queries = 0;
  for (const tuning::Entry& entry : db.proto().entries()) {
    if (queries++ == kMaxQueries) break;
    const tuning::ProblemKey& key = entry.key();
    for (int threads : {0, 1, 3}) {
      absl::StatusOr<LutAnswer> a = lut->Query(key.op(), key.dtype(), KeyDims(key), key.machine_id(),
                                               key.data_class(), threads);
      if (!a.ok()) continue;
      KREG_FUZZ_CHECK_OK(limits::CheckThreads(a->threads));
      if (a->trial != nullptr) KREG_FUZZ_CHECK_OK(limits::CheckNs(a->trial->median_ns(), "answer's median_ns"));
    }
  }
}

}  // namespace
}  // namespace kreg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kreg::TuningDb> db = kreg::TuningDb::Parse(text, "t.txtpb");
  if (db.ok()) kreg::fuzz::Exercise(*db);
  return 0;
}
