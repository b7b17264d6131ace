// What kreg's commands share: the flags' values, the helpers that turn them
// into kreg objects, and the --json records. Commands return absl::Status
// (InvalidArgument: bad input, exit 2; anything else: exit 1); only main()
// prints errors.
#ifndef KREG_TOOLS_CLI_H_
#define KREG_TOOLS_CLI_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/answer.h"
#include "kreg/comm.h"
#include "kreg/kreg_tuning.pb.h"
#include "kreg/limits.h"
#include "kreg/lut.h"
#include "kreg/op.h"
#include "kreg/problem.h"
#include "kreg/registry.h"

namespace kreg {
struct TuneResult;  // kreg/tuner.h
}  // namespace kreg

namespace kreg::cli {

// Every flag's value. Each command binds the flags it takes (its setup,
// tools/commands.h); the defaults here are the ones --help shows.
struct Flags {
  std::string command;  // "list", "run", "tune", "query", "db show", ...

  // Global.
  std::string plugin_path;
  bool json = false;
  int verbose = 0;  // -v: info messages, -vv: debug (KREG_LOG otherwise)

  // Positionals.
  std::string target;               // run: OP/VARIANT or OP; tune, query: OP
  std::string file_a, file_b;       // db: FILE, IN, OUT, A, B
  std::vector<std::string> files;   // db merge: IN...
  bool csv = false;                 // db export: CSV instead of protobuf text
  bool check_plugins = false;       // list: load each plugin in a child process
  std::string out_dir, key_filter;  // db plot: --out, --key

  // The problem.
  std::vector<std::string> dims;    // one problem per --dims
  std::string dtype, with;
  std::vector<std::string> params;  // run: --param NAME=V
  std::vector<std::string> inputs;  // --input NAME=FILE
  std::string dist = "normal", partition = "random";
  uint64_t seed = 1;
  std::string data_class;
  std::string db;
  // Which machines' measurements answer (query, run OP): "similar" or
  // "strict"; and whether the shipped tables answer behind --db.
  std::string machine = "similar";
  bool no_shipped = false;

  // Measuring.
  int warmup = 3, reps = 10, threads = 0;
  // Collectives: thread ranks in this process, and how long a wait may last.
  int ranks = 0;
  std::string mesh;  // "2x2", "x=2,y=4"
  std::string backend = "threads";
  int nodes = 1;  // an MPI job's nodes: query's --nodes; run and tune count them
  std::string device = "cpu";  // run, tune, query: cpu or cuda (a device kernel on the GPU)
  bool warm = false;           // run, tune on a device: time with the L2 warm, not flushed
  double comm_timeout = 30;
  bool check = false;
  std::string save_outputs;

  // Tuning.
  std::string variants, strategy = "halving";
  double budget = 0, timeout = 30;
  // Writers (tune, calibrate, db merge, db slim): seconds to wait for a
  // table another process holds locked.
  double lock_timeout = limits::kDefaultLockTimeoutSeconds;
  int max_list_len = 2, list_growth_rounds = 4;
  bool no_thread_round = false;
  std::string from_record;  // tune: the shape record (KREG_RECORD's file) to sweep
};

// The registry from --plugin-path, KREG_PLUGIN_PATH and the default folders;
// refused plugins are warned about on stderr. A --plugin-path that does not
// exist is bad input.
absl::StatusOr<std::unique_ptr<Registry>> LoadRegistry(const Flags& flags);

// "kreg COMMAND: warning: MESSAGE" on stderr (valid UTF-8).
void Warn(const Flags& flags, absl::string_view message);

// NAME=VALUE items of a repeated flag; `flag` names it in errors.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Pairs(const std::vector<std::string>& items,
                                                                       absl::string_view flag);

// --dtype, --with, --dist, --partition and --seed as ProblemOptions (not
// --input).
absl::StatusOr<ProblemOptions> OptionsFromFlags(const Flags& flags);

// A tuning table named on the command line: a file that is missing or is not
// a table is bad input (InvalidArgument naming it); an older binary table
// without a checksum is read with a warning.
absl::StatusOr<TuningDb> LoadTable(const Flags& flags, const std::string& path);

// What query and run OP ask: the --db table (if given) with the shipped
// tables behind it (unless --no-shipped; Lut::Layered: the user's table
// answers unless the shipped ones match better), resolved against
// `registry` with --machine's policy; warnings printed. Shipped entries of ops the registry
// does not know are left out silently (their plugins are simply not
// loaded). With --device cuda this machine's GPUs' records join the table's
// (an untuned GPU then finds a tuned one of its SM version).
absl::StatusOr<Lut> AnsweringLut(const Flags& flags, const Registry& registry);
// The same over a table read already (`given`, read from file
// `given_name`; flags.db is not read). Its trials' configurations must lie
// in their kernels' spaces (CheckConfigs).
absl::StatusOr<Lut> AnsweringLut(const Flags& flags, const Registry& registry, TuningDb given,
                                 absl::string_view given_name);

// A problem as the flags describe it: the op, its dims and attributes from
// `dims` (dims may stay unknown until inputs give them; a collective's ranks
// from --ranks), and the options and --input files read.
struct ProblemSpec {
  std::shared_ptr<const Op> op;
  Values values;
  ProblemOptions options;
  std::vector<std::pair<std::string, std::string>> files;  // --input NAME=FILE
  Mesh mesh;  // --mesh
};
absl::StatusOr<ProblemSpec> SpecFromFlags(const Flags& flags, const Registry& registry, absl::string_view op,
                                          absl::string_view dims);
// Shape-only arguments for `spec` (input files' shapes fill missing dims).
absl::Status ShapeArgsOf(const ProblemSpec& spec, ShapeArgs* out);

// The data class a table is asked with (run --db, query; kreg::Tune decides
// its own from the same flags): --data-class if given; else a collective's
// backend ("backend=threads", "backend=mpi,nodes=N"); else the op's
// classifier on `args` when they carry data; else "dist=NAME" for random
// inputs of a --dist other than normal; else "". Valid UTF-8, as tables
// store it.
absl::StatusOr<std::string> DataClassOf(const Flags& flags, const ProblemSpec& spec, const kreg_args& args);

// --backend as a CommBackend (InvalidArgument naming the flag).
absl::StatusOr<CommBackend> BackendOf(const Flags& flags);
// --device as a DeviceKind (InvalidArgument naming the flag).
absl::StatusOr<DeviceKind> DeviceOf(const Flags& flags);
// The machine --device names: this CPU (cpu), or CUDA device 0 as a table's
// machine (cuda; FailedPrecondition saying why where there is none).
absl::StatusOr<tuning::Machine> DeviceMachine(const Flags& flags);
// What timed a run: "host clock", "cuda events, cold L2" or "cuda events, warm L2".
std::string TimingName(const Flags& flags);

// ---- JSON records (README.md, "--json") ----------------------------------------
//
// Objects keep the order fields were set in; strings are valid UTF-8; times
// are integer nanoseconds; dims and params are objects.
using Json = nlohmann::ordered_json;

// One line of JSON, never throwing (any invalid UTF-8 left is replaced).
std::string Dump(const Json& json);
// `text` made valid UTF-8 (kreg::ValidUtf8).
Json Str(absl::string_view text);
// {"batch":8,"n":1000}.
Json DimsJson(const Dims& dims);
// {"method":"nth_element","num_blocks":128,"m_schedule":[5,8]}.
Json ParamsJson(const tuning::Config& config);
// The key object: {"op","dtype","dims","data_class","machine"}.
Json KeyJson(const tuning::ProblemKey& key);
// A measured candidate: {"kernel","version","params","median_ns","min_ns",
// "max_ns","reps"}.
Json TrialJson(absl::string_view op, const tuning::Trial& trial);
// A machine record: {"id","model","vendor","arch","uarch","isa","cores"}.
Json MachineJson(const tuning::Machine& machine);
// The answer record: {"key","kernel","version","params","match",
// "incomplete","tuned_dims","distance","median_ns","machine","why",
// "threads","table"}.
Json AnswerJson(const tuning::ProblemKey& asked, const LutAnswer& answer);
// A kernel in `kreg list --json`: {"kernel","op","variant","version","doc",
// "isa","available","reference","plugin","default_params","space"}.
Json KernelJson(const PluginInfo& plugin, const Kernel& kernel);
// A `kreg tune --json` result: {"key","best","runner_up","counts","seconds",
// "strategy","complete"}.
Json TuneResultJson(const TuneResult& result, absl::string_view strategy);
int64_t Ns(double ns);  // rounded

// "1.234 ms".
std::string Ms(double ns);

// What a tuning table (--db) picks for `args` of `spec`, and how it matched.
struct TableChoice {
  std::shared_ptr<const Kernel> kernel;
  Config config;
  std::string how;  // AnswerHow's
  Json answer;      // the answer record
  int threads = 0;  // LutAnswer::threads
};
absl::StatusOr<TableChoice> ChooseFromTable(const Flags& flags, const ProblemSpec& spec, const Registry& registry,
                                            const kreg_args& args);

// The kreg command: parses argv, runs the command (tools/commands.h),
// returns the exit status.
int Main(int argc, char** argv);

}  // namespace kreg::cli

#endif  // KREG_TOOLS_CLI_H_
