// kreg: the command line. A thin main: parse flags, pick the subcommand from
// one table, run it, print its result or one error line, return the code.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/npy.h"
#include "kreg/ops.h"
#include "kreg/registry.h"
#include "kreg/worker.h"
#include "tools/cli.h"
#include "tools/json.h"

ABSL_FLAG(std::string, plugin_path, "",
          "colon-separated plugin files or folders, searched before KREG_PLUGIN_PATH and the "
          "installed plugin folder");
ABSL_FLAG(bool, json, false, "print JSON instead of text");
ABSL_FLAG(Repeated, dims, {}, "problem dimensions NAME=V,... (e.g. batch=8,n=1000,k=10)");
ABSL_FLAG(std::string, dtype, "f32", "element type: f32 or bf16");
ABSL_FLAG(Repeated, param, {}, "kernel parameter NAME=VALUE (repeatable; lists as 5,8,12)");
ABSL_FLAG(Repeated, input, {}, "input NAME=FILE.npy instead of random data (repeatable)");
ABSL_FLAG(std::string, save_outputs, "", "folder to write each output as NAME.npy");
ABSL_FLAG(std::string, dist, "normal", "random inputs: normal, uniform, bits or ties");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(int, warmup, 3, "untimed runs before timing");
ABSL_FLAG(int, reps, 10, "timed runs");
ABSL_FLAG(bool, check, false, "check the outputs against the op's reference");
ABSL_FLAG(int, threads, 0, "threads per kernel run (0: all cores)");
ABSL_FLAG(std::string, db, "", "tuning database file (binary; text if it ends in .txtpb)");
ABSL_FLAG(std::string, variants, "", "tune: comma-separated variants to search (default: all available)");
ABSL_FLAG(std::string, strategy, "halving", "tune: exhaustive, random or halving");
ABSL_FLAG(double, budget, 0, "tune: seconds per problem for random and halving (0: no limit)");
ABSL_FLAG(double, timeout, 30, "tune: seconds one candidate may take before it is killed");
ABSL_FLAG(int, max_list_len, 2, "tune: longest list drawn for list parameters (m_schedule)");
ABSL_FLAG(std::string, data_class, "", "tune, query: a feature of the data kept in the key (e.g. dist=ties)");

namespace kreg {

absl::StatusOr<std::unique_ptr<Registry>> LoadRegistry() {
  LoadOptions options;
  if (std::string p = absl::GetFlag(FLAGS_plugin_path); !p.empty()) options.plugin_paths.push_back(p);
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
  if (registry.ok()) {
    for (const absl::Status& s : (*registry)->refusals()) {
      std::cerr << "kreg: warning: " << s.message() << "\n";
    }
  }
  return registry;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Pairs(const Repeated& flag,
                                                                       absl::string_view what) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& item : flag.items) {
    size_t eq = item.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == item.size()) {
      return absl::InvalidArgumentError(absl::StrCat("--", what, " '", item, "': expected NAME=VALUE"));
    }
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

absl::StatusOr<ProblemOptions> ProblemOptionsFromFlags(std::vector<std::pair<std::string, std::string>>* files) {
  ProblemOptions options;
  absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok() || *dtype == DType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat("--dtype '", absl::GetFlag(FLAGS_dtype), "': expected f32 or bf16"));
  }
  options.dtype = *dtype;
  absl::StatusOr<Dist> dist = ParseDist(absl::GetFlag(FLAGS_dist));
  if (!dist.ok()) return absl::InvalidArgumentError(absl::StrCat("--dist: ", dist.status().message()));
  options.dist = *dist;
  options.seed = absl::GetFlag(FLAGS_seed);
  auto inputs = Pairs(absl::GetFlag(FLAGS_input), "input");
  if (!inputs.ok()) return inputs.status();
  for (const auto& [input_name, file] : *inputs) {
    absl::StatusOr<Tensor> t = ReadNpy(file);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("--input ", input_name, ": ", t.status().message()));
    if (input_name == "input" && t->dtype() != DType::kI32) options.dtype = t->dtype();
    options.inputs[input_name] = *std::move(t);
  }
  if (files != nullptr) *files = *inputs;
  return options;
}

namespace {

std::string ParamKind(const kreg_param_desc& p) {
  switch (p.kind) {
    case KREG_PARAM_INT:
      return absl::StrCat("int {", absl::StrJoin(p.values, p.values + p.num_values, ","), "}");
    case KREG_PARAM_INT_LIST:
      return absl::StrCat("list of {", absl::StrJoin(p.values, p.values + p.num_values, ","), "}");
    case KREG_PARAM_CHOICE:
      return absl::StrCat("choice {", absl::StrJoin(p.choices, p.choices + p.num_choices, ","), "}");
  }
  return "?";
}

std::string ParamDefault(const Kernel& kernel, size_t i) {
  const kreg_param_desc& p = kernel.param(i);
  if (p.kind == KREG_PARAM_CHOICE) return p.choices[p.default_value];
  if (p.kind == KREG_PARAM_INT) return absl::StrCat(p.default_value);
  return p.default_list_len ? absl::StrJoin(p.default_list, p.default_list + p.default_list_len, ",")
                            : "(k)";
}

absl::Status List(const Args& args) {
  if (!args.empty()) return absl::InvalidArgumentError(absl::StrCat("list takes no arguments, got '", args[0], "'"));
  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry();
  if (!registry.ok()) return registry.status();
  const Registry& reg = **registry;
  const bool json = absl::GetFlag(FLAGS_json);
  Json out = Json::Object();
  Json plugins = Json::Array();
  for (const PluginInfo& info : reg.Plugins()) {
    Json plugin = Json::Object();
    plugin.Set("name", info.name).Set("version", info.version).Set("path", info.path);
    Json kernels = Json::Array();
    if (!json) std::cout << "plugin " << info.name << " " << info.version << "  (" << info.path << ")\n";
    for (const std::string& name : info.kernels) {
      std::shared_ptr<const Kernel> k = *reg.Get(name);
      Json kernel = Json::Object();
      kernel.Set("name", k->name()).Set("version", static_cast<int64_t>(k->version()))
          .Set("doc", std::string(k->doc())).Set("isa", IsaString(k->required_isa()))
          .Set("available", k->available());
      if (!json) {
        std::cout << absl::StrFormat("  %-18s v%-3d isa: %-12s %s  %s\n", k->name(), k->version(),
                                     IsaString(k->required_isa()),
                                     k->available() ? "available  " : "UNAVAILABLE", k->doc());
      }
      Json params = Json::Array();
      for (size_t i = 0; i < k->num_params(); ++i) {
        const kreg_param_desc& p = k->param(i);
        params.Push(Json::Object().Set("name", p.name).Set("kind", ParamKind(p))
                        .Set("default", ParamDefault(*k, i)).Set("doc", p.doc ? p.doc : ""));
        if (!json) {
          std::cout << absl::StrFormat("      %-14s %-40s default %-8s %s\n", p.name, ParamKind(p),
                                       ParamDefault(*k, i), p.doc ? p.doc : "");
        }
      }
      kernel.Set("params", std::move(params));
      kernels.Push(std::move(kernel));
    }
    plugin.Set("kernels", std::move(kernels));
    plugins.Push(std::move(plugin));
  }
  Json refused = Json::Array();
  for (const absl::Status& s : reg.refusals()) refused.Push(Json(std::string(s.message())));
  if (json) {
    out.Set("plugins", std::move(plugins)).Set("refused", std::move(refused))
        .Set("cpu_isa", IsaString(CpuIsa()));
    std::cout << out.Dump() << "\n";
  } else if (reg.Plugins().empty()) {
    std::cout << "no plugins found (searched: " << absl::StrJoin(reg.searched(), ":")
              << "); use --plugin-path or KREG_PLUGIN_PATH\n";
  }
  return absl::OkStatus();
}

absl::Status Run(const Args& args) {
  if (args.size() != 1) {
    return absl::InvalidArgumentError("run takes one kernel, e.g. kreg run topk/sort --dims batch=8,n=1000,k=10");
  }
  std::string name = args[0];
  const bool from_table = name.find('/') == std::string::npos;
  if (from_table && absl::GetFlag(FLAGS_db).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not OP/VARIANT (e.g. topk/sort); "
                                                   "give --db FILE to let a tuning table choose"));
  }
  const OpInfo* op = FindOp(name.substr(0, name.find('/')));
  if (op == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown op '", name.substr(0, name.find('/')), "'"));
  }
  absl::StatusOr<ProblemOptions> problem_options = ProblemOptionsFromFlags(nullptr);
  if (!problem_options.ok()) return problem_options.status();
  ProblemOptions& options = *problem_options;
  const int warmup = absl::GetFlag(FLAGS_warmup), reps = absl::GetFlag(FLAGS_reps);
  if (warmup < 0 || reps < 1) return absl::InvalidArgumentError("--warmup must be >= 0 and --reps >= 1");
  if (absl::GetFlag(FLAGS_dims).items.size() > 1) return absl::InvalidArgumentError("run takes one --dims");
  absl::StatusOr<Dims> dims = ParseDims(absl::StrJoin(absl::GetFlag(FLAGS_dims).items, ","));
  if (!dims.ok()) return absl::InvalidArgumentError(absl::StrCat("--dims: ", dims.status().message()));
  auto params = Pairs(absl::GetFlag(FLAGS_param), "param");
  if (!params.ok()) return params.status();

  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry();
  if (!registry.ok()) return registry.status();
  absl::StatusOr<std::unique_ptr<Problem>> problem = op->make_problem(*dims, options);
  if (!problem.ok()) return problem.status();
  Problem& p = **problem;
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel;
  absl::StatusOr<Config> config;
  std::string chosen_by;
  if (from_table) {
    if (!params->empty()) return absl::InvalidArgumentError("--param applies to OP/VARIANT, not to a table's choice");
    absl::StatusOr<TableChoice> choice = ChooseFromTable(*op, **registry, p.args());
    if (!choice.ok()) return choice.status();
    kernel = choice->kernel;
    config = choice->config;
    chosen_by = choice->how;
    name = (*kernel)->name();
  } else {
    kernel = (*registry)->Get(name);
    if (!kernel.ok()) return kernel.status();
    config = (*kernel)->ParseConfig(*params);
    if (!config.ok()) return config.status();
  }

  RunOptions run_options;
  run_options.num_threads = absl::GetFlag(FLAGS_threads);
  Workspace workspace;
  run_options.workspace = &workspace;
  // The first run writes over poisoned outputs, so --check also catches
  // elements a kernel never writes.
  p.PoisonOutputs();
  if (absl::Status s = (*kernel)->Run(*config, p.args(), run_options); !s.ok()) return s;
  std::string check = "skipped";
  absl::Status check_status;
  if (absl::GetFlag(FLAGS_check)) {
    check_status = p.CheckOutputs();
    check = check_status.ok() ? "ok" : absl::StrCat("FAILED: ", check_status.message());
  }
  for (int i = 1; i < warmup; ++i) (void)(*kernel)->Run(*config, p.args(), run_options);
  std::vector<int64_t> times;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    absl::Status s = (*kernel)->Run(*config, p.args(), run_options);
    auto t1 = std::chrono::steady_clock::now();
    if (!s.ok()) return s;
    times.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  const int64_t median = times.size() % 2 ? times[times.size() / 2]
                                          : (times[times.size() / 2 - 1] + times[times.size() / 2]) / 2;

  if (std::string dir = absl::GetFlag(FLAGS_save_outputs); !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat("--save-outputs: cannot create '", dir, "': ", ec.message()));
    for (const auto& [out_name, tensor] : p.outputs()) {
      if (absl::Status s = WriteNpy(absl::StrCat(dir, "/", out_name, ".npy"), *tensor); !s.ok()) return s;
    }
  }

  const std::string dims_text = DimsString(p.dims());
  const std::string config_text = (*kernel)->ConfigString(*config);
  if (absl::GetFlag(FLAGS_json)) {
    Json params_json = Json::Object();
    for (auto& [param, value] : (*kernel)->ConfigPairs(*config)) params_json.Set(param, value);
    Json dims_json = Json::Object();
    for (const auto& [d, v] : p.dims()) dims_json.Set(d, v);
    std::cout << Json::Object().Set("kernel", name).Set("version", static_cast<int64_t>((*kernel)->version()))
                     .Set("dtype", std::string(DTypeName(options.dtype))).Set("dims", std::move(dims_json))
                     .Set("params", std::move(params_json)).Set("reps", static_cast<int64_t>(reps))
                     .Set("chosen_by", chosen_by.empty() ? "user" : chosen_by)
                     .Set("median_ns", median).Set("min_ns", times.front()).Set("max_ns", times.back())
                     .Set("check", check).Dump()
              << "\n";
  } else {
    std::cout << absl::StrFormat("%s %s %s%s%s  median %.3f us  min %.3f us  max %.3f us  check %s%s\n", name,
                                 DTypeName(options.dtype), dims_text, config_text.empty() ? "" : "  ",
                                 config_text, median / 1e3, times.front() / 1e3, times.back() / 1e3, check,
                                 chosen_by.empty() ? "" : absl::StrCat("  (chosen by the table: ", chosen_by, ")"));
  }
  if (!check_status.ok()) return absl::DataLossError("check failed: outputs differ from the reference");
  return absl::OkStatus();
}

struct Command {
  const char* name;
  const char* usage;
  const char* help;
  absl::Status (*fn)(const Args&);
  std::vector<absl::string_view> flags;  // the flags it takes, beyond plugin_path
};

const Command kCommands[] = {
    {"list", "kreg list [--json]", "plugins found, each kernel, its ISA and parameter space", List, {"json"}},
    {"run",
     "kreg run OP/VARIANT --dims NAME=V,... [--dtype f32|bf16] [--param NAME=V]... "
     "[--input NAME=FILE.npy]... [--save_outputs DIR] [--dist normal|uniform|bits|ties] [--seed S] "
     "[--warmup N] [--reps N] [--threads N] [--check] [--json]\n  kreg run OP --db FILE --dims ... [...]",
     "build inputs, run one kernel (or the one a tuning table picks), time it, optionally check it", Run,
     {"json", "dims", "dtype", "param", "input", "save_outputs", "dist", "seed", "warmup", "reps", "check",
      "threads", "db", "data_class"}},
    {"tune",
     "kreg tune OP --dims NAME=V,... [--dims ...]... --db FILE [--variants a,b] "
     "[--strategy exhaustive|random|halving] [--budget SECONDS] [--timeout SECONDS] [--reps N] [--warmup N] "
     "[--dtype ...] [--input NAME=FILE.npy]... [--dist ...] [--seed S] [--threads N] [--max_list_len N] "
     "[--data_class TEXT] [--json]",
     "search every variant's parameter space; each result is checkpointed into the table", Tune,
     {"json", "dims", "dtype", "input", "dist", "seed", "warmup", "reps", "threads", "db", "variants", "strategy",
      "budget", "timeout", "max_list_len", "data_class"}},
    {"query", "kreg query OP --dims NAME=V,... [--dims ...]... --db FILE [--dtype f32|bf16] [--data_class TEXT] [--json]",
     "what the table answers, and whether the match was exact, nearest or default", Query,
     {"json", "dims", "dtype", "db", "data_class", "dist"}},
    {"db", "kreg db show FILE | export FILE | merge OUT IN... | diff A B",
     "read and combine tuning tables (export prints the text format)", Db, {}},
};

std::string Usage() {
  std::string s = "kreg: a kernel registry with an autotuner.\n\nCommands:\n";
  for (const Command& c : kCommands) absl::StrAppend(&s, "  ", c.usage, "\n      ", c.help, "\n");
  absl::StrAppend(&s, "\nPlugins are found through --plugin_path, then KREG_PLUGIN_PATH, then the\n"
                      "installed plugin folder. Flags may be spelled --flag=V or --flag V.");
  return s;
}

// Flags this binary defines that were set but do not apply to `command`.
absl::Status CheckFlagsApply(const Command& command) {
  static const char* const kOwn[] = {"json",  "dims",   "dtype",    "param",    "input",  "save_outputs",
                                     "dist",  "seed",   "warmup",   "reps",     "check",  "threads",
                                     "db",    "variants", "strategy", "budget", "timeout", "max_list_len",
                                     "data_class"};
  for (const char* name : kOwn) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag->CurrentValue() == flag->DefaultValue()) continue;
    if (std::find(command.flags.begin(), command.flags.end(), name) == command.flags.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " does not apply to 'kreg ", command.name, "'"));
    }
  }
  return absl::OkStatus();
}

// Gathers repeated --dims/--param/--input occurrences into one, and accepts
// --save-outputs / --plugin-path spellings as aliases of the underscored
// flags.
std::vector<std::string> Normalize(int argc, char** argv) {
  static const char* const kRepeated[] = {"dims", "param", "input"};
  std::map<std::string, std::vector<std::string>> gathered;
  std::vector<std::string> out = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      for (; i < argc; ++i) out.push_back(argv[i]);
      break;
    }
    if (absl::StartsWith(arg, "--")) {
      std::string body = arg.substr(2);
      size_t eq = body.find('=');
      std::string flag = body.substr(0, eq);
      std::replace(flag.begin(), flag.end(), '-', '_');
      bool repeated = std::find(std::begin(kRepeated), std::end(kRepeated), flag) != std::end(kRepeated);
      if (repeated) {
        if (eq != std::string::npos) {
          gathered[flag].push_back(body.substr(eq + 1));
        } else if (i + 1 < argc) {
          gathered[flag].push_back(argv[++i]);
        } else {
          gathered[flag];  // let Abseil report the missing value
          out.push_back("--" + flag);
        }
        continue;
      }
      arg = "--" + flag + (eq == std::string::npos ? "" : body.substr(eq));
    }
    out.push_back(arg);
  }
  for (const auto& [flag, values] : gathered) {
    if (!values.empty()) out.push_back(absl::StrCat("--", flag, "=", absl::StrJoin(values, "\x1f")));
  }
  return out;
}

int Main(int argc, char** argv) {
  // The tuner's measuring process (kreg/worker.h): a protocol, not a command.
  if (argc == 2 && std::string_view(argv[1]) == "__worker") return WorkerMain(0, 1);
  absl::SetProgramUsageMessage(Usage());
  std::vector<std::string> normalized = Normalize(argc, argv);
  std::vector<char*> cargs;
  for (std::string& s : normalized) cargs.push_back(s.data());
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  if (positional.size() < 2 || absl::string_view(positional[1]) == "help") {
    std::cout << Usage() << "\n";
    return positional.size() < 2 ? 2 : 0;
  }
  absl::string_view name = positional[1];
  for (const Command& command : kCommands) {
    if (name != command.name) continue;
    absl::Status status = CheckFlagsApply(command);
    try {
      if (status.ok()) status = command.fn(Args(positional.begin() + 2, positional.end()));
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError("out of memory (are the dims what you meant?)");
    }
    if (status.ok()) return 0;
    std::cerr << "kreg " << command.name << ": " << status.message() << "\n";
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cerr << "kreg: unknown command '" << name << "' (commands: list, run, tune, query, db; see kreg help)\n";
  return 2;
}

}  // namespace
}  // namespace kreg

int main(int argc, char** argv) { return kreg::Main(argc, argv); }
