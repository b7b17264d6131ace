// kreg tune --from-record FILE: a shape record (kreg/record.h) read as
// problems to sweep. The record is outside input: every line is checked
// against the registry's ops as --dims and --dtype are (Op::ParseValues
// bounds each dim and attribute), and must name the key it was recorded
// under; any bad line is InvalidArgument "FILE:LINE: problem".
#ifndef KREG_TOOLS_RECORD_H_
#define KREG_TOOLS_RECORD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kreg/lut.h"
#include "kreg/record.h"
#include "kreg/registry.h"
#include "tools/cli.h"

namespace kreg::cli {

// One recorded shape as a sweep: the flags a `kreg tune OP --dims ...`
// of it would take, and its problem options.
struct RecordedProblem {
  RecordedShape shape;  // as read, with its line
  std::shared_ptr<const Op> op;
  Values parsed;        // its dims and attributes, parsed by the op
  Flags flags;          // the command's, with the op, data class, device, ranks and mesh of the shape
  NamedValues values;   // its dims and attributes as --dims gives them
  ProblemOptions options;  // its tensors' dtypes and optional inputs
  // Why it is not swept (non-empty): recorded under MPI, or (SkipAnswered)
  // the table answers it exactly already.
  std::string skip;
};

// The shapes of flags.from_record as problems. InvalidArgument
// "--from-record: FILE:LINE: problem" for a bad line (its fields, an op the
// registry does not know, dims past the op's bounds, a dtype signature or
// dims that are not the key such a call has); InvalidArgument too for a
// missing or unreadable file, or flags the record gives per shape (OP,
// --dims, --dtype, ...). `options`: --dist, --partition and --seed.
absl::StatusOr<std::vector<RecordedProblem>> ReadRecordedProblems(const Flags& flags, const Registry& registry,
                                                                  const ProblemOptions& options);

// Marks the problems `db` answers exactly on this machine (and complete).
absl::Status SkipAnswered(const Flags& flags, const Registry& registry, const TuningDb& db,
                          std::vector<RecordedProblem>* problems);

// "FILE:LINE op dtype dims [data class] device" naming a shape in messages.
std::string RecordedName(const Flags& flags, const RecordedShape& shape);

}  // namespace kreg::cli

#endif  // KREG_TOOLS_RECORD_H_
