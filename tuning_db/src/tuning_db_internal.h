// What the TuningDb's files share (key.cc, table_file.cc, tuning_db.cc,
// export.cc): identity strings of keys and trials, making strings valid
// UTF-8, and how winners rank and print. Not installed.
#ifndef KREG_TUNING_DB_TUNING_DB_INTERNAL_H_
#define KREG_TUNING_DB_TUNING_DB_INTERNAL_H_

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "kreg/kreg_tuning.pb.h"

namespace kreg {
namespace tuning_db_internal {

// A parameter value as text: "11", "5,8,12", "partial_sort".
std::string ValueText(const tuning::ParamValue& p);

// Identity strings (not for display): fields joined by separators that do
// not occur in names, dims sorted by name and value so that the order they
// were given in does not matter. A trial's: variant, version, configuration, and its
// chosen thread count (threads > 0: another trial than the same
// configuration on all cores).
std::string KeyId(const tuning::ProblemKey& key);
std::string TrialId(absl::string_view variant, uint32_t version, const tuning::Config& config, int threads);
std::string TrialIdOf(const tuning::Trial& t);

// Every string field of `m`, recursively, made valid UTF-8 (proto3 refuses
// to parse anything else, so one bad byte would make a whole table
// unreadable).
void Sanitize(google::protobuf::Message* m);
// Whether any message of `db` holds fields this schema does not know (a
// newer kreg's), which a load then drops.
bool HasUnknownFields(const tuning::Database& db);

// Whether a trial may win (OK, a finite median), and whether `a` ranks
// before `b` as a winner (both eligible): the lower median, on a tie the
// lower trial id (TrialIdOf), here given or made only for the tie. Every
// reader ranks so: the table's best, a lookup's answer, a slim copy.
bool Eligible(const tuning::Trial& t);
bool Faster(const tuning::Trial& a, absl::string_view a_id, const tuning::Trial& b, absl::string_view b_id);
bool Faster(const tuning::Trial& a, const tuning::Trial& b);

// "radix v1 first_bits=11 round_bits=8 capacity=4096"
std::string WinnerText(const tuning::Trial& t);

}  // namespace tuning_db_internal
}  // namespace kreg

#endif  // KREG_TUNING_DB_TUNING_DB_INTERNAL_H_
