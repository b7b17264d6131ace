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
#include "kreg/measure.h"
#include "kreg/op.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "kreg/worker.h"
#include "tools/cli.h"
#include "tools/json.h"

ABSL_FLAG(std::string, plugin_path, "",
          "colon-separated plugin files or folders, searched before KREG_PLUGIN_PATH and the "
          "installed plugin folder");
ABSL_FLAG(bool, json, false, "print JSON instead of text");
ABSL_FLAG(Repeated, dims, {}, "problem dimensions NAME=V,... (e.g. batch=8,n=1000,k=10)");
ABSL_FLAG(std::string, dtype, "",
          "element type of every tensor that allows it (f32, bf16, i32), or NAME=TYPE,... per tensor");
ABSL_FLAG(std::string, with, "", "optional inputs to generate at random, comma-separated (e.g. row_ends)");
ABSL_FLAG(std::string, partition, "random",
          "how partition inputs (group sizes) are drawn: random, balanced or skewed");
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

absl::StatusOr<ProblemSpec> SpecFromFlags(const Registry& registry, absl::string_view op_name,
                                          absl::string_view dims) {
  ProblemSpec spec;
  absl::StatusOr<std::shared_ptr<const Op>> op = registry.GetOp(op_name);
  if (!op.ok()) return absl::InvalidArgumentError(op.status().message());
  spec.op = *op;
  absl::StatusOr<NamedValues> named = ParseNamedValues(dims);
  if (!named.ok()) return absl::InvalidArgumentError(absl::StrCat("--dims: ", named.status().message()));
  absl::StatusOr<Values> values = spec.op->ParseValues(*named);
  if (!values.ok()) return values.status();
  spec.values = *std::move(values);
  ProblemOptions& options = spec.options;
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  for (absl::string_view item : absl::StrSplit(dtype, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (item.find('=') == absl::string_view::npos) kv = {"", std::string(item)};
    absl::StatusOr<DType> d = ParseDType(kv.second);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype '", item, "': expected f32, bf16 or i32"));
    options.dtypes[kv.first] = *d;
  }
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_with), ',', absl::SkipEmpty())) {
    options.with.emplace(name);
  }
  absl::StatusOr<Dist> dist = ParseDist(absl::GetFlag(FLAGS_dist));
  if (!dist.ok()) return absl::InvalidArgumentError(absl::StrCat("--dist: ", dist.status().message()));
  options.dist = *dist;
  absl::StatusOr<Partition> partition = ParsePartition(absl::GetFlag(FLAGS_partition));
  if (!partition.ok()) return absl::InvalidArgumentError(absl::StrCat("--partition: ", partition.status().message()));
  options.partition = *partition;
  options.seed = absl::GetFlag(FLAGS_seed);
  auto inputs = Pairs(absl::GetFlag(FLAGS_input), "input");
  if (!inputs.ok()) return inputs.status();
  for (const auto& [input_name, file] : *inputs) {
    absl::StatusOr<Tensor> t = ReadNpy(file);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("--input ", input_name, ": ", t.status().message()));
    options.inputs[input_name] = *std::move(t);
  }
  spec.files = *inputs;
  return spec;
}

absl::Status ShapeArgsOf(const ProblemSpec& spec, ShapeArgs* out) {
  const Op& op = *spec.op;
  Values values = spec.values;
  std::map<std::string, const Tensor*> given;
  std::map<std::string, DType> given_types;
  for (const auto& [name, t] : spec.options.inputs) {
    given[name] = &t;
    given_types[name] = t.dtype();
  }
  absl::StatusOr<TensorTypes> types = op.ResolveTypes(spec.options.dtypes, spec.options.with, given_types);
  if (!types.ok()) return types.status();
  if (absl::Status s = op.DimsFromInputs(given, &values); !s.ok()) return s;
  return op.MakeShapeArgs(values, *types, out);
}

absl::StatusOr<std::string> DataClassOf(const ProblemSpec& spec, const kreg_args& args) {
  if (std::string d = absl::GetFlag(FLAGS_data_class); !d.empty()) return d;
  if (spec.op->has_data_class() && !(args.flags & KREG_ARGS_SHAPE_ONLY)) return spec.op->DataClass(args);
  if (spec.options.dist == Dist::kNormal || !spec.options.inputs.empty()) return std::string();
  return absl::StrCat("dist=", DistName(spec.options.dist));
}

namespace {

std::string ParamKind(const ParamInfo& p) {
  std::string values;
  if (p.kind != KREG_PARAM_CHOICE) {
    if (p.values_kind == KREG_VALUES_LISTED) {
      values = absl::StrCat("{", absl::StrJoin(p.listed, ","), "}");
    } else {
      values = absl::StrCat(p.values_kind == KREG_VALUES_POW2 ? "powers of two in [" : "[", p.lo, "..", p.hi,
                            p.values_kind == KREG_VALUES_RANGE ? absl::StrCat(" step ", p.step) : "", "]");
    }
  }
  std::string when;
  if (p.when_param >= 0) when = " (when another parameter allows)";
  switch (p.kind) {
    case KREG_PARAM_INT:
      return absl::StrCat("int ", values, when);
    case KREG_PARAM_INT_LIST:
      return absl::StrCat("list of ", values, when);
    case KREG_PARAM_CHOICE: {
      std::vector<std::string> names;
      for (size_t c = 0; c < p.choices.size(); ++c) {
        names.push_back(p.choices[c] + (p.ChoiceAvailable(static_cast<int64_t>(c), CpuIsa()) ? "" : "(n/a)"));
      }
      return absl::StrCat("choice {", absl::StrJoin(names, ","), "}", when);
    }
  }
  return "?";
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
    Json ops = Json::Array();
    for (const std::string& name : info.ops) {
      std::shared_ptr<const Op> op = *reg.GetOp(name);
      ops.Push(Json::Object().Set("name", name).Set("doc", op->doc()).Set("signature", op->Describe()));
      if (!json) std::cout << "  op " << name << ": " << op->doc() << "\n      " << op->Describe() << "\n";
    }
    plugin.Set("ops", std::move(ops));
    for (const std::string& name : info.kernels) {
      std::shared_ptr<const Kernel> k = *reg.Get(name);
      Json kernel = Json::Object();
      kernel.Set("name", k->name()).Set("version", static_cast<int64_t>(k->version()))
          .Set("doc", std::string(k->doc())).Set("isa", IsaString(k->required_isa()))
          .Set("available", k->available()).Set("reference", k->is_reference());
      if (!json) {
        std::cout << absl::StrFormat("  %-18s v%-3d isa: %-12s %s  %s\n", k->name(), k->version(),
                                     IsaString(k->required_isa()),
                                     k->available() ? (k->is_reference() ? "reference  " : "available  ")
                                                    : "UNAVAILABLE",
                                     k->doc());
      }
      Json params = Json::Array();
      const Config def = k->DefaultConfig();
      const auto defaults = k->ConfigPairs(def);
      for (size_t i = 0; i < k->params().size(); ++i) {
        const ParamInfo& p = k->params()[i];
        const std::string shown = defaults[i].second.empty() ? "(none)" : defaults[i].second;
        params.Push(Json::Object().Set("name", p.name).Set("kind", ParamKind(p))
                        .Set("default", shown).Set("doc", p.doc));
        if (!json) {
          std::cout << absl::StrFormat("      %-14s %-40s default %-8s %s\n", p.name, ParamKind(p), shown, p.doc);
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
  const int warmup = absl::GetFlag(FLAGS_warmup), reps = absl::GetFlag(FLAGS_reps);
  if (warmup < 0 || reps < 1) return absl::InvalidArgumentError("--warmup must be >= 0 and --reps >= 1");
  if (absl::GetFlag(FLAGS_dims).items.size() > 1) return absl::InvalidArgumentError("run takes one --dims");
  auto params = Pairs(absl::GetFlag(FLAGS_param), "param");
  if (!params.ok()) return params.status();

  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry();
  if (!registry.ok()) return registry.status();
  absl::StatusOr<ProblemSpec> spec =
      SpecFromFlags(**registry, name.substr(0, name.find('/')), absl::StrJoin(absl::GetFlag(FLAGS_dims).items, ","));
  if (!spec.ok()) return spec.status();
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(spec->op, (*registry)->Reference(spec->op->name()), spec->values, spec->options);
  if (!problem.ok()) return problem.status();
  Problem& p = **problem;
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel;
  absl::StatusOr<Config> config;
  std::string chosen_by;
  if (from_table) {
    if (!params->empty()) return absl::InvalidArgumentError("--param applies to OP/VARIANT, not to a table's choice");
    absl::StatusOr<TableChoice> choice = ChooseFromTable(*spec, **registry, *p.args());
    if (!choice.ok()) return choice.status();
    kernel = choice->kernel;
    config = choice->config;
    chosen_by = choice->how;
    name = (*kernel)->name();
  } else {
    kernel = (*registry)->Get(name);
    if (!kernel.ok()) return absl::InvalidArgumentError(kernel.status().message());
    config = (*kernel)->ParseConfig(*params);
    if (!config.ok()) return config.status();
  }

  MeasureOptions measure;
  measure.warmup = warmup;
  measure.reps = reps;
  measure.check = absl::GetFlag(FLAGS_check);
  measure.run.num_threads = absl::GetFlag(FLAGS_threads);
  const Measurement m = MeasureKernel(**kernel, *config, {&p}, measure);
  std::string check = measure.check ? "ok" : "skipped";
  if (m.status == TrialStatus::kWrongResult) {
    check = absl::StrCat("FAILED: ", m.error);
  } else if (!m.ok()) {
    return m.status == TrialStatus::kIllegal ? absl::InvalidArgumentError(m.error) : absl::InternalError(m.error);
  }

  if (std::string dir = absl::GetFlag(FLAGS_save_outputs); !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat("--save-outputs: cannot create '", dir, "': ", ec.message()));
    for (const auto& [out_name, tensor] : p.outputs()) {
      if (absl::Status s = WriteNpy(absl::StrCat(dir, "/", out_name, ".npy"), *tensor); !s.ok()) return s;
    }
  }

  const OpKey key = p.key();
  const std::string config_text = (*kernel)->ConfigString(*config);
  if (absl::GetFlag(FLAGS_json)) {
    Json params_json = Json::Object();
    for (auto& [param, value] : (*kernel)->ConfigPairs(*config)) params_json.Set(param, value);
    Json dims_json = Json::Object();
    for (const auto& [d, v] : key.dims) dims_json.Set(d, v);
    std::cout << Json::Object().Set("kernel", name).Set("version", static_cast<int64_t>((*kernel)->version()))
                     .Set("dtype", key.dtype).Set("dims", std::move(dims_json))
                     .Set("params", std::move(params_json)).Set("reps", static_cast<int64_t>(m.reps))
                     .Set("chosen_by", chosen_by.empty() ? "user" : chosen_by)
                     .Set("median_ns", static_cast<int64_t>(m.median_ns)).Set("min_ns", static_cast<int64_t>(m.min_ns))
                     .Set("max_ns", static_cast<int64_t>(m.max_ns)).Set("check", check).Dump()
              << "\n";
  } else {
    std::cout << absl::StrFormat("%s %s %s%s%s  median %.3f us  min %.3f us  max %.3f us  check %s%s\n", name,
                                 key.dtype, DimsString(key.dims), config_text.empty() ? "" : "  ", config_text,
                                 m.median_ns / 1e3, m.min_ns / 1e3, m.max_ns / 1e3, check,
                                 chosen_by.empty() ? "" : absl::StrCat("  (chosen by the table: ", chosen_by, ")"));
  }
  if (m.status == TrialStatus::kWrongResult) return absl::DataLossError("check failed: outputs differ from the reference");
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
     "kreg run OP/VARIANT --dims NAME=V,... [--dtype f32|bf16|NAME=TYPE,...] [--with NAME,...] [--param NAME=V]... "
     "[--input NAME=FILE.npy]... [--save_outputs DIR] [--dist normal|uniform|bits|ties] [--partition P] [--seed S] "
     "[--warmup N] [--reps N] [--threads N] [--check] [--json]\n  kreg run OP --db FILE --dims ... [...]",
     "build inputs, run one kernel (or the one a tuning table picks), time it, optionally check it", Run,
     {"json", "dims", "dtype", "param", "input", "save_outputs", "dist", "seed", "warmup", "reps", "check",
      "threads", "db", "data_class", "with", "partition"}},
    {"tune",
     "kreg tune OP --dims NAME=V,... [--dims ...]... --db FILE [--variants a,b] "
     "[--strategy exhaustive|random|halving] [--budget SECONDS] [--timeout SECONDS] [--reps N] [--warmup N] "
     "[--dtype ...] [--input NAME=FILE.npy]... [--dist ...] [--seed S] [--threads N] [--max_list_len N] "
     "[--data_class TEXT] [--json]",
     "search every variant's parameter space; each result is checkpointed into the table", Tune,
     {"json", "dims", "dtype", "input", "dist", "seed", "warmup", "reps", "threads", "db", "variants", "strategy",
      "budget", "timeout", "max_list_len", "data_class", "with", "partition"}},
    {"query", "kreg query OP --dims NAME=V,... [--dims ...]... --db FILE [--dtype f32|bf16] [--data_class TEXT] [--json]",
     "what the table answers, and whether the match was exact, nearest or default", Query,
     {"json", "dims", "dtype", "db", "data_class", "dist", "with"}},
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
                                     "data_class", "with", "partition"};
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
