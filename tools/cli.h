// What the command line's subcommands share: the flags, and the helpers that
// turn them into kreg objects. Commands return absl::Status; only main()
// prints errors.
#ifndef KREG_TOOLS_CLI_H_
#define KREG_TOOLS_CLI_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kreg/op.h"
#include "kreg/problem.h"
#include "kreg/registry.h"

// A flag that may be given many times (--param a=1 --param b=2). main()
// gathers the occurrences into one value joined by '\x1f' before Abseil
// parses the command line.
struct Repeated {
  std::vector<std::string> items;
};
inline bool AbslParseFlag(absl::string_view text, Repeated* out, std::string*) {
  out->items = absl::StrSplit(text, '\x1f', absl::SkipEmpty());
  return true;
}
inline std::string AbslUnparseFlag(const Repeated& r) { return absl::StrJoin(r.items, "\x1f"); }

ABSL_DECLARE_FLAG(std::string, plugin_path);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(Repeated, dims);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(Repeated, param);
ABSL_DECLARE_FLAG(Repeated, input);
ABSL_DECLARE_FLAG(std::string, save_outputs);
ABSL_DECLARE_FLAG(std::string, dist);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(int, warmup);
ABSL_DECLARE_FLAG(int, reps);
ABSL_DECLARE_FLAG(bool, check);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, db);
ABSL_DECLARE_FLAG(std::string, variants);
ABSL_DECLARE_FLAG(std::string, strategy);
ABSL_DECLARE_FLAG(double, budget);
ABSL_DECLARE_FLAG(double, timeout);
ABSL_DECLARE_FLAG(int, max_list_len);
ABSL_DECLARE_FLAG(std::string, data_class);
ABSL_DECLARE_FLAG(std::string, with);
ABSL_DECLARE_FLAG(std::string, partition);

namespace kreg {

using Args = std::vector<char*>;  // positional arguments after the subcommand

// The registry from --plugin_path, KREG_PLUGIN_PATH and the default folders;
// refused plugins are warned about on stderr.
absl::StatusOr<std::unique_ptr<Registry>> LoadRegistry();

// NAME=VALUE pairs of a repeated flag; `what` names the flag in errors.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Pairs(const Repeated& flag,
                                                                       absl::string_view what);

// A problem as the flags describe it: the op, its dims and attributes from
// --dims (dims may stay unknown until inputs give them), and --dtype,
// --with, --dist, --partition, --seed and --input as ProblemOptions.
struct ProblemSpec {
  std::shared_ptr<const Op> op;
  Values values;
  ProblemOptions options;
  std::vector<std::pair<std::string, std::string>> files;  // --input NAME=FILE
};
absl::StatusOr<ProblemSpec> SpecFromFlags(const Registry& registry, absl::string_view op,
                                          absl::string_view dims);
// Shape-only arguments for `spec` (input files' shapes fill missing dims).
absl::Status ShapeArgsOf(const ProblemSpec& spec, ShapeArgs* out);
// The data class a key gets: --data-class if given; else the op's own
// classifier on `args` (when it has data); else "dist=NAME" for random
// inputs drawn from a --dist other than normal; else "".
absl::StatusOr<std::string> DataClassOf(const ProblemSpec& spec, const kreg_args& args);

// What a tuning table (--db) picks for `args` of `op`, and how it matched.
struct TableChoice {
  std::shared_ptr<const Kernel> kernel;
  Config config;
  std::string how;  // "exact", "nearest" or "default"
};
absl::StatusOr<TableChoice> ChooseFromTable(const ProblemSpec& spec, const Registry& registry,
                                            const kreg_args& args);

// The subcommands of tune.cc.
absl::Status Tune(const Args& args);
absl::Status Query(const Args& args);
absl::Status Db(const Args& args);

}  // namespace kreg

#endif  // KREG_TOOLS_CLI_H_
