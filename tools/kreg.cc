// kreg: the command line. A thin main: CLI11 parses the flags each command
// defines, one function runs the command, main prints its result or one
// error line ("kreg COMMAND: message") and returns the exit code: 0 done,
// 1 failed, 2 bad input.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/dispatch.h"
#include "kreg/limits.h"
#include "kreg/measure.h"
#include "kreg/log.h"
#include "kreg/npy.h"
#include "kreg/op.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "kreg/text.h"
#include "kreg/tuner.h"
#include "tools/cli.h"

namespace kreg::cli {
namespace {

// ---- Help -----------------------------------------------------------------------------

// Help pages in one layout: usage, what the command does, its arguments and
// flags (one spelling each, with defaults), examples.
class HelpFormatter : public CLI::FormatterBase {
 public:
  struct Page {
    std::string usage;     // lines after "Usage: "
    std::string about;     // a paragraph
    std::string examples;  // lines
  };
  void Set(const CLI::App* app, Page page) { pages_[app] = std::move(page); }

  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode) const override {
    const Page* page = nullptr;
    if (auto it = pages_.find(app); it != pages_.end()) page = &it->second;
    std::string out = "Usage: ";
    if (page != nullptr && !page->usage.empty()) {
      out += absl::StrReplaceAll(page->usage, {{"\n", "\n       "}});
    } else {
      out += name + " [flags]";
    }
    out += "\n\n";
    out += Wrap(page != nullptr && !page->about.empty() ? page->about : app->get_description(), 0) + "\n";

    std::vector<std::pair<std::string, std::string>> rows;
    for (const CLI::Option* opt : app->get_options([](const CLI::Option* o) { return o->get_positional(); })) {
      rows.emplace_back(opt->get_name(true), opt->get_description());
    }
    if (!rows.empty()) out += "\nArguments:\n" + Table(rows);

    rows.clear();
    for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
      rows.emplace_back(sub->get_name(), sub->get_description());
    }
    if (!rows.empty()) out += "\nCommands:\n" + Table(rows);

    rows.clear();
    for (const CLI::Option* opt : app->get_options([](const CLI::Option* o) { return !o->get_positional(); })) {
      std::string left;
      for (const std::string& s : opt->get_snames()) absl::StrAppend(&left, "-", s, ", ");
      if (!opt->get_lnames().empty()) absl::StrAppend(&left, "--", opt->get_lnames()[0]);  // one spelling
      if (!opt->get_option_text().empty()) absl::StrAppend(&left, " ", opt->get_option_text());
      std::string desc = opt->get_description();
      if (opt->get_type_size() != 0 && !opt->get_default_str().empty()) {
        // Kept on one line (Wrap turns kGlue back into spaces).
        absl::StrAppend(&desc, " ", absl::StrReplaceAll(absl::StrCat("(default: ", opt->get_default_str(), ")"),
                                                        {{" ", std::string(1, kGlue)}}));
      }
      rows.emplace_back(left, desc);
    }
    if (!rows.empty()) out += absl::StrCat("\n", app->get_parent() == nullptr ? "Global flags" : "Flags", ":\n", Table(rows));
    if (app->get_parent() != nullptr) {
      out += "\nGlobal flags: --plugin-path PATHS, --json, -v (see kreg --help).\n";
    }
    if (page != nullptr && !page->examples.empty()) {
      out += "\nExamples:\n";
      for (absl::string_view line : absl::StrSplit(page->examples, '\n', absl::SkipEmpty())) {
        absl::StrAppend(&out, "  ", line, "\n");
      }
    }
    if (!app->get_footer().empty()) out += "\n" + Wrap(app->get_footer(), 0) + "\n";
    return out;
  }

 private:
  static constexpr size_t kWidth = 80;
  static constexpr char kGlue = '\x01';  // a space Wrap does not break at

  // `text` wrapped to kWidth, lines after the first indented by `indent`.
  static std::string Wrap(absl::string_view text, size_t indent) {
    std::string out;
    size_t column = indent;
    bool first = true;
    for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
      if (!first && column + 1 + word.size() > kWidth) {
        absl::StrAppend(&out, "\n", std::string(indent, ' '));
        column = indent;
        first = true;
      }
      if (!first) {
        out += ' ';
        ++column;
      }
      out += absl::StrReplaceAll(word, {{std::string(1, kGlue), " "}});
      column += word.size();
      first = false;
    }
    return out;
  }

  static std::string Table(const std::vector<std::pair<std::string, std::string>>& rows) {
    size_t width = 0;
    for (const auto& [left, right] : rows) width = std::max(width, left.size());
    width = std::min<size_t>(width, 24);
    std::string out;
    for (const auto& [left, right] : rows) {
      absl::StrAppend(&out, "  ", left);
      if (left.size() > width) {
        absl::StrAppend(&out, "\n", std::string(width + 4, ' '));
      } else {
        out += std::string(width - left.size() + 2, ' ');
      }
      absl::StrAppend(&out, Wrap(right, width + 4), "\n");
    }
    return out;
  }

  std::map<const CLI::App*, Page> pages_;
};

// ---- list ------------------------------------------------------------------------

std::string ParamKind(const ParamInfo& p) {
  const std::string when = p.when_param >= 0 ? " (when another parameter allows)" : "";
  switch (p.kind) {
    case KREG_PARAM_INT:
      return absl::StrCat("int ", ParamValuesText(p), when);
    case KREG_PARAM_INT_LIST:
      return absl::StrCat("list of ", ParamValuesText(p), when);
    case KREG_PARAM_CHOICE:
      return absl::StrCat("choice ", ParamValuesText(p), when);
  }
  return "?";
}

}  // namespace

// The kernel record.
Json KernelJson(const PluginInfo& plugin, const Kernel& k) {
  Json out = Json::object();
  out["kernel"] = Str(k.name());
  out["op"] = Str(k.op());
  out["variant"] = Str(k.variant());
  out["version"] = k.version();
  out["doc"] = Str(k.doc());
  out["isa"] = IsaString(k.required_isa());
  const absl::Status runs = CanRun(k);
  out["device"] = k.device() == KREG_DEVICE_CUDA ? "cuda" : "cpu";
  out["available"] = runs.ok();
  out["why_unavailable"] = runs.ok() ? Json(nullptr) : Str(runs.message());
  out["reference"] = k.is_reference();
  out["plugin"] = Str(plugin.name);
  const Config def = k.DefaultConfig();
  const tuning::Config def_proto = ToProtoConfig(k, def);
  out["default_params"] = ParamsJson(def_proto);
  Json space = Json::array();
  for (size_t i = 0; i < k.params().size(); ++i) {
    const ParamInfo& p = k.params()[i];
    Json param = Json::object();
    param["name"] = Str(p.name);
    param["type"] = ParamTypeName(p);
    param["values"] = Str(ParamValuesText(p));
    param["conditional"] = p.when_param >= 0;
    param["doc"] = Str(p.doc);
    space.push_back(std::move(param));
  }
  out["space"] = std::move(space);
  return out;
}


absl::Status MachineCmd(const Flags& flags) {
  const tuning::Machine& m = ThisMachine();
  // The GPUs the CUDA backend sees, or why there are none.
  const absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
  if (flags.json) {
    Json out = MachineJson(m);
    out["gpus"] = Json::array();
    for (const GpuInfo& g : gpus.ok() ? *gpus : std::vector<GpuInfo>{}) {
      Json gpu = Json::object();
      gpu["ordinal"] = g.ordinal;
      gpu["name"] = Str(g.name);
      gpu["sm"] = g.sm;
      gpu["sms"] = g.num_sms;
      gpu["memory_bytes"] = g.memory_bytes;
      gpu["driver"] = Str(g.driver);
      out["gpus"].push_back(std::move(gpu));
    }
    out["gpus_why_none"] = gpus.ok() ? Json(nullptr) : Str(gpus.status().message());
    std::cout << Dump(out) << "\n";
    return absl::OkStatus();
  }
  const std::string uarch = MicroArch(m);
  std::cout << ValidUtf8(absl::StrFormat(
      "id      %s\nclass   %s\nmodel   %s\nvendor  %s, %s, family %d model %d%s\nisa     %s\ncores   %d\n", m.id(),
      MachineClass(m), m.cpu_model(), m.vendor(), m.arch(), m.family(), m.model(),
      uarch.empty() ? "" : " (" + uarch + ")", absl::StrJoin(m.isa(), ","), m.cores()));
  if (!gpus.ok()) {
    std::cout << ValidUtf8(absl::StrCat("gpus    none: ", gpus.status().message(), "\n"));
  }
  for (const GpuInfo& g : gpus.ok() ? *gpus : std::vector<GpuInfo>{}) {
    std::cout << ValidUtf8(absl::StrCat("gpu ", g.ordinal, "   ", MachineSummary(MachineOf(g)), "\n"));
  }
  return absl::OkStatus();
}

// kreg list --check-plugins: each plugin loaded in a child process of its
// own (with those that loaded before it, whose ops it may use), so one that
// crashes or hangs while loading is named rather than taking kreg down.
absl::Status CheckPlugins(const Flags& flags) {
  LoadOptions options;
  if (!flags.plugin_path.empty()) options.plugin_paths.push_back(flags.plugin_path);
  absl::StatusOr<std::vector<std::string>> files = Registry::PluginFiles(options);
  if (!files.ok()) {
    if (files.status().code() == absl::StatusCode::kNotFound) {
      return absl::InvalidArgumentError(absl::StrCat("--plugin-path: ", files.status().message()));
    }
    return files.status();
  }
  // One file loaded in a child with `with` before it: {verdict, message}.
  auto check = [](const std::string& file, const std::vector<std::string>& with)
      -> absl::StatusOr<std::pair<std::string, std::string>> {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return absl::InternalError("check-plugins: cannot make a pipe");
    std::cout << std::flush;
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError("check-plugins: cannot fork");
    if (pid == 0) {  // the child: load, say how it went, exit
      close(pipe_fds[0]);
      if (int null = open("/dev/null", O_WRONLY); null >= 0) dup2(null, STDERR_FILENO);  // the parent reports
      std::vector<std::string> paths = with;
      paths.push_back(file);
      Registry registry;
      std::string said = "ok";
      for (const absl::Status& s : registry.LoadPlugins(paths)) {
        if (absl::StrContains(s.message(), file)) said = std::string(s.message());
      }
      (void)!write(pipe_fds[1], said.data(), said.size());
      _exit(0);
    }
    close(pipe_fds[1]);
    int status = 0;
    bool hung = false;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(2 * limits::kPluginLoadSeconds);
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        hung = true;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string said;
    char buf[4096];
    for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<size_t>(n));
    close(pipe_fds[0]);
    if (hung) {
      return std::pair{std::string("hung"),
                       absl::StrCat("still loading after ", 2 * limits::kPluginLoadSeconds, " s (killed)")};
    }
    if (WIFSIGNALED(status)) {
      return std::pair{std::string("crashed"), absl::StrCat("signal ", WTERMSIG(status), " (",
                                                            strsignal(WTERMSIG(status)), ") while loading")};
    }
    return said == "ok" ? std::pair{std::string("ok"), std::string()} : std::pair{std::string("refused"), said};
  };
  // Each file with those that loaded before it; a refused one once more with
  // every one that loaded (the ops it needs may come from a later file).
  std::vector<std::string> good;
  std::vector<std::pair<std::string, std::string>> verdicts;
  for (const std::string& file : *files) {
    absl::StatusOr<std::pair<std::string, std::string>> v = check(file, good);
    if (!v.ok()) return v.status();
    if (v->first == "ok") good.push_back(file);
    verdicts.push_back(*std::move(v));
  }
  for (size_t i = 0; i < files->size(); ++i) {
    if (verdicts[i].first != "refused") continue;
    absl::StatusOr<std::pair<std::string, std::string>> v = check((*files)[i], good);
    if (v.ok() && v->first == "ok") verdicts[i] = *std::move(v);
  }
  Json out = Json::array();
  int broken = 0;
  for (size_t i = 0; i < files->size(); ++i) {
    const auto& [verdict, message] = verdicts[i];
    broken += verdict == "hung" || verdict == "crashed";
    out.push_back({{"path", Str((*files)[i])},
                   {"status", verdict},
                   {"message", message.empty() ? Json(nullptr) : Str(message)}});
    if (!flags.json) {
      std::cout << ValidUtf8(absl::StrFormat("%-8s %s%s\n", verdict, (*files)[i], message.empty() ? "" : ": " + message));
    }
  }
  if (flags.json) std::cout << Dump(Json{{"plugins", out}}) << "\n";
  if (broken > 0) {
    return absl::FailedPreconditionError(absl::StrCat(broken, broken == 1 ? " plugin" : " plugins",
                                                      " crashed or hung while loading: remove or fix them"));
  }
  return absl::OkStatus();
}

absl::Status List(const Flags& flags) {
  if (flags.check_plugins) return CheckPlugins(flags);
  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry(flags);
  if (!registry.ok()) return registry.status();
  const Registry& reg = **registry;
  Json plugins = Json::array();
  for (const PluginInfo& info : reg.Plugins()) {
    Json plugin = Json::object();
    plugin["name"] = Str(info.name);
    plugin["version"] = Str(info.version);
    plugin["path"] = Str(info.path);
    if (!flags.json) std::cout << ValidUtf8(absl::StrCat("plugin ", info.name, " ", info.version, "  (", info.path, ")\n"));
    Json ops = Json::array();
    for (const std::string& name : info.ops) {
      std::shared_ptr<const Op> op = *reg.GetOp(name);
      Json op_json = Json::object();
      op_json["op"] = Str(name);
      op_json["doc"] = Str(op->doc());
      op_json["signature"] = Str(op->Describe());
      ops.push_back(std::move(op_json));
      if (!flags.json) std::cout << ValidUtf8(absl::StrCat("  op ", name, ": ", op->doc(), "\n      ", op->Describe(), "\n"));
    }
    plugin["ops"] = std::move(ops);
    Json kernels = Json::array();
    for (const std::string& name : info.kernels) {
      std::shared_ptr<const Kernel> k = *reg.Get(name);
      kernels.push_back(KernelJson(info, *k));
      if (flags.json) continue;
      const absl::Status runs = CanRun(*k);
      std::cout << ValidUtf8(absl::StrFormat(
          "  %-18s v%-3d %-17s %s  %s%s\n", k->name(), k->version(),
          k->device() == KREG_DEVICE_CUDA ? "device: cuda" : absl::StrCat("isa: ", IsaString(k->required_isa())),
          runs.ok() ? (k->is_reference() ? "reference  " : "available  ") : "UNAVAILABLE", k->doc(),
          runs.ok() ? "" : absl::StrCat("\n      (", runs.message(), ")")));
      const auto defaults = k->ConfigPairs(k->DefaultConfig());
      for (size_t i = 0; i < k->params().size(); ++i) {
        const ParamInfo& p = k->params()[i];
        const std::string shown = defaults[i].second.empty() ? "(none)" : defaults[i].second;
        std::cout << ValidUtf8(absl::StrFormat("      %-14s %-40s default %-8s %s\n", p.name, ParamKind(p), shown, p.doc));
      }
    }
    plugin["kernels"] = std::move(kernels);
    plugins.push_back(std::move(plugin));
  }
  if (flags.json) {
    Json out = Json::object();
    out["cpu_isa"] = IsaString(CpuIsa());
    out["plugins"] = std::move(plugins);
    Json refused = Json::array();
    for (const absl::Status& s : reg.refusals()) refused.push_back(Str(s.message()));
    out["refused"] = std::move(refused);
    std::cout << Dump(out) << "\n";
  } else if (reg.Plugins().empty()) {
    std::cout << ValidUtf8(absl::StrCat("no plugins found (searched: ", absl::StrJoin(reg.searched(), ":"),
                                        "); use --plugin-path or KREG_PLUGIN_PATH\n"));
  }
  return absl::OkStatus();
}

// ---- run -------------------------------------------------------------------------

absl::Status Run(const Flags& given) {
  Flags flags = given;  // under mpirun, with the job's nodes
  std::string name = flags.target;
  const bool from_table = name.find('/') == std::string::npos;
  if (from_table && flags.db.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not OP/VARIANT (e.g. topk/sort); "
                                                   "give --db FILE to let a tuning table choose"));
  }
  if (flags.dims.size() > 1) return absl::InvalidArgumentError("run takes one --dims");
  if (!from_table && (!flags.db.empty() || !flags.data_class.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(flags.db.empty() ? "--data-class" : "--db",
                                                   " applies to 'kreg run OP --db FILE' (a table's choice), not to "
                                                   "OP/VARIANT"));
  }
  auto params = Pairs(flags.params, "param");
  if (!params.ok()) return params.status();
  if (from_table && !params->empty()) {
    return absl::InvalidArgumentError("--param applies to OP/VARIANT, not to a table's choice");
  }

  absl::StatusOr<std::unique_ptr<Registry>> registry = LoadRegistry(flags);
  if (!registry.ok()) return registry.status();
  absl::StatusOr<ProblemSpec> spec = SpecFromFlags(flags, **registry, name.substr(0, name.find('/')),
                                                   flags.dims.empty() ? "" : flags.dims[0]);
  if (!spec.ok()) return spec.status();
  // Before the inputs are built: an unknown variant is found at once.
  std::shared_ptr<const Kernel> kernel;
  Config config;
  int threads = flags.threads;  // per run; the table's answer may ask for fewer
  if (!from_table) {
    absl::StatusOr<std::shared_ptr<const Kernel>> k = (*registry)->Get(name);
    if (!k.ok()) return absl::InvalidArgumentError(k.status().message());
    kernel = *k;
    absl::StatusOr<Config> c = kernel->ParseConfig(*params);
    if (!c.ok()) return absl::InvalidArgumentError(c.status().message());
    config = *c;
  }
  const Op& op = *spec->op;
  // A device kernel runs on the GPU, its problem made here and copied over.
  std::unique_ptr<Device> device;
  if (flags.device == "cuda") {
    if (op.collective()) return absl::InvalidArgumentError("--device cuda: collective ops run on the CPU's ranks");
    absl::StatusOr<std::unique_ptr<Device>> opened = OpenCuda();
    if (!opened.ok()) return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", opened.status().message()));
    device = *std::move(opened);
  } else if (flags.device != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("--device '", flags.device, "': expected cpu or cuda"));
  }
  // Collectives run on every rank at once: each builds its own problem (its
  // inputs seeded by its rank) and they measure together; rank 0 reports.
  // Ranks are threads of this process (--ranks N), or this process is one
  // rank of an MPI job (--backend mpi under mpirun).
  std::vector<std::unique_ptr<Comm>> comms;
  CommOptions comm_options;
  comm_options.timeout_seconds = flags.comm_timeout;
  comm_options.mesh = spec->mesh;
  // --mesh without --ranks: the mesh's size.
  const int thread_ranks = flags.ranks > 0 || spec->mesh.empty() || !op.collective()
                               ? flags.ranks
                               : static_cast<int>(spec->values.dims[op.ranks_dim()]);
  absl::StatusOr<CommBackend> backend = BackendOf(flags);
  if (!backend.ok()) return backend.status();
  if (*backend == CommBackend::kMpi && !op.collective()) {
    return absl::InvalidArgumentError(absl::StrCat("--backend mpi: ", op.name(), " is not a collective op"));
  }
  if (*backend == CommBackend::kThreads && thread_ranks > 0) {
    if (absl::Status s = limits::CheckThreadRanks(thread_ranks, "--mesh's size"); !s.ok()) return s;
  }
  absl::StatusOr<std::vector<std::unique_ptr<Comm>>> opened =
      OpenComms(*backend, *backend == CommBackend::kMpi ? flags.ranks : thread_ranks, comm_options);
  if (!opened.ok()) return opened.status();
  comms = *std::move(opened);
  if (*backend == CommBackend::kMpi) {
    flags.nodes = comms.front()->nodes();
  } else if (thread_ranks == 0 && op.collective()) {
    return absl::InvalidArgumentError(absl::StrCat(op.name(), " is a collective op: give --ranks N"));
  }
  Json chosen_by = nullptr;
  std::string how;
  if (!comms.empty()) {
    if (absl::Status s = op.SetRanks(&spec->values, comms[0]->size()); !s.ok()) return s;
    // A collective's table choice: one rank reads the table and every rank
    // runs its answer, so ranks whose tables or machines differ cannot pick
    // different algorithms and deadlock.
    if (from_table) {
      std::string choice_text;  // rank 0's choice: "kernel\nNAME=VALUE\n..."
      if (comms[0]->rank() == 0) {
        ShapeArgs shape;
        absl::Status shaped = ShapeArgsOf(*spec, &shape);
        absl::StatusOr<TableChoice> choice = shaped.ok() ? ChooseFromTable(flags, *spec, **registry, *shape.args())
                                                         : absl::StatusOr<TableChoice>(shaped);
        if (!choice.ok()) {
          comms[0]->Abort(choice.status().message());  // the other ranks wait for the choice
          return choice.status();
        }
        kernel = choice->kernel;
        config = choice->config;
        how = choice->how;
        chosen_by = std::move(choice->answer);
        choice_text = kernel->name();
        for (const auto& [param, value] : kernel->ConfigPairs(config)) {
          absl::StrAppend(&choice_text, "\n", param, "=", value);
        }
      }
      if (comms.size() == 1 && comms[0]->size() > 1) {  // an MPI job: rank 0 tells the others
        if (absl::Status s = comms[0]->Broadcast(&choice_text); !s.ok()) return s;
        const std::vector<std::string> lines = absl::StrSplit(choice_text, '\n');
        absl::StatusOr<std::shared_ptr<const Kernel>> k = (*registry)->Get(lines[0]);
        if (!k.ok()) return k.status();
        std::vector<std::pair<std::string, std::string>> pairs;
        for (size_t i = 1; i < lines.size(); ++i) {
          const std::vector<std::string> kv = absl::StrSplit(lines[i], absl::MaxSplits('=', 1));
          pairs.emplace_back(kv[0], kv.size() > 1 ? kv[1] : "");
        }
        absl::StatusOr<Config> c = (*k)->ParseConfig(pairs);
        if (!c.ok()) return c.status();
        kernel = *k;
        config = *c;
      }
      name = kernel->name();
    }
  }
  const int first_rank = comms.empty() ? 0 : comms[0]->rank();
  std::vector<std::unique_ptr<Problem>> problems(std::max<size_t>(comms.size(), 1));
  std::vector<Measurement> measured(problems.size());
  auto make_problem = [&](Comm* comm) -> absl::Status {
    ProblemOptions options = spec->options;
    if (comm != nullptr) options.comm = comm->abi();
    absl::StatusOr<std::unique_ptr<Problem>> problem =
        Problem::Make(spec->op, (*registry)->Reference(op.name()), spec->values, options);
    if (!problem.ok()) return problem.status();
    problems[comm != nullptr ? comm->rank() - first_rank : 0] = *std::move(problem);
    return absl::OkStatus();
  };
  // Composite ops (a kernel running another op: sharded_matmul's local
  // multiplies) get their sub-ops run by a dispatcher: the --db table's
  // choice, else each op's default.
  absl::StatusOr<TuningDb> sub_table = flags.db.empty() ? TuningDb() : LoadTable(flags, flags.db);
  if (!sub_table.ok()) return sub_table.status();
  absl::StatusOr<Dispatcher> dispatcher = Dispatcher::Create(**registry, *sub_table);
  if (!dispatcher.ok()) return dispatcher.status();
  RunOptions sub_options;
  sub_options.num_threads = flags.threads;
  auto measure = [&](Comm* comm) {
    const int rank = comm != nullptr ? comm->rank() - first_rank : 0;
    MeasureOptions options;
    options.run.dispatch = [&](absl::string_view sub_op, const kreg_args& args) {
      return dispatcher->Run(sub_op, args, sub_options).status();
    };
    options.warmup = flags.warmup;
    options.reps = flags.reps;
    options.check = flags.check;
    options.run.num_threads = threads;
    options.comm = comm;
    options.device = device.get();
    options.cold = !flags.warm;
    measured[rank] = MeasureKernel(*kernel, config, {problems[rank].get()}, options);
  };
  if (!comms.empty()) {
    absl::Status s = RunRanks(comms, [&](Comm& c) {
      absl::Status made = make_problem(&c);
      if (made.ok()) measure(&c);
      return made;
    });
    if (!s.ok()) return s;
  } else {
    if (absl::Status s = make_problem(nullptr); !s.ok()) return s;
    if (from_table) {
      absl::StatusOr<TableChoice> choice = ChooseFromTable(flags, *spec, **registry, *problems[0]->args());
      if (!choice.ok()) return choice.status();
      kernel = choice->kernel;
      config = choice->config;
      how = choice->how;
      chosen_by = std::move(choice->answer);
      name = kernel->name();
      if (choice->threads > 0 && (threads == 0 || choice->threads < threads)) threads = choice->threads;
    }
    measure(nullptr);
  }
  Problem& p = *problems[0];
  const Measurement& m = measured[0];
  const bool failed_check = m.status == TrialStatus::kWrongResult;
  // Under mpirun, a rank that only relays another's failure lets the ranks
  // with a reason of their own say it first: mpirun ends the whole job at
  // the first rank to exit with an error, before the others print.
  if (!m.ok() && m.relayed && flags.backend == "mpi") std::this_thread::sleep_for(std::chrono::seconds(1));
  // Unchecked runs fail too where a kernel wrote past a tensor's end.
  if (!m.ok() && (!failed_check || !flags.check)) {
    return m.status == TrialStatus::kIllegal ? absl::InvalidArgumentError(m.error) : absl::InternalError(m.error);
  }

  if (!flags.save_outputs.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(flags.save_outputs, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("--save-outputs: cannot create '", flags.save_outputs, "': ", ec.message()));
    }
    // A collective's outputs per rank: DIR/NAME.rankR.npy.
    for (size_t r = 0; r < problems.size(); ++r) {
      const std::string suffix = comms.empty() ? ".npy" : absl::StrCat(".rank", first_rank + r, ".npy");
      for (const auto& [out_name, tensor] : problems[r]->outputs()) {
        if (absl::Status s = WriteNpy(absl::StrCat(flags.save_outputs, "/", out_name, suffix), *tensor); !s.ok()) {
          return s;
        }
      }
    }
  }

  if (first_rank != 0) return absl::OkStatus();  // rank 0 reports
  const OpKey key = p.key();
  std::string data_class;
  if (absl::StatusOr<std::string> d = DataClassOf(flags, *spec, *p.args()); d.ok()) data_class = *d;
  if (flags.json) {
    Json out = Json::object();
    out["key"] = KeyJson(MakeProblemKey(spec->op->name(), key,
                                        device != nullptr ? MachineOf(device->info()).id() : ThisMachine().id(),
                                        data_class));
    out["kernel"] = Str(name);
    out["version"] = kernel->version();
    out["params"] = ParamsJson(ToProtoConfig(*kernel, config));
    out["median_ns"] = Ns(m.median_ns);
    out["min_ns"] = Ns(m.min_ns);
    out["max_ns"] = Ns(m.max_ns);
    out["reps"] = m.reps;
    out["check"] = !flags.check ? "skipped" : failed_check ? "failed" : "ok";
    out["error"] = failed_check ? Str(m.error) : Json(nullptr);
    out["chosen_by"] = std::move(chosen_by);
    // On a GPU: which, and how it was timed.
    out["device"] = device != nullptr ? Str(MachineSummary(MachineOf(device->info()))) : Json(nullptr);
    out["timing"] = TimingName(flags);
    std::cout << Dump(out) << "\n";
  } else {
    const std::string config_text = kernel->ConfigString(config);
    std::cout << ValidUtf8(absl::StrFormat(
        "%s %s %s%s%s  median %.3f us  min %.3f us  max %.3f us  check %s%s%s\n", name, key.dtype,
        DimsString(key.dims), config_text.empty() ? "" : "  ", config_text, m.median_ns / 1e3, m.min_ns / 1e3,
        m.max_ns / 1e3, !flags.check ? "skipped" : failed_check ? absl::StrCat("FAILED: ", m.error) : "ok",
        how.empty() ? "" : absl::StrCat("  (chosen by the table: ", how, ")"),
        device == nullptr ? "" : absl::StrCat("  on ", device->info().name, " (", TimingName(flags), ")")));
  }
  std::cout.flush();
  if (failed_check) return absl::InternalError("check failed: outputs differ from the reference");
  return absl::OkStatus();
}

namespace {

// ---- Parsing -------------------------------------------------------------------------

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The candidate closest to `typed`, if close enough to be a typo (or a
// prefix of it); "" otherwise.
std::string Closest(absl::string_view typed, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, typed.size() / 3) + 1;
  for (const std::string& c : candidates) {
    size_t d = EditDistance(typed, c);
    if (typed.size() >= 3 && absl::StartsWith(c, typed)) d = std::min<size_t>(d, 1);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

// "--max_list_len=3" -> "max-list-len".
std::string FlagName(absl::string_view arg) {
  arg = absl::StripPrefix(arg, "-");
  arg = absl::StripPrefix(arg, "-");
  std::string name(arg.substr(0, arg.find('=')));
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

bool HasFlag(const CLI::App* app, const std::string& name) {
  for (const CLI::Option* o : app->get_options()) {
    if (!o->get_positional() && o->check_lname(name)) return true;
  }
  return false;
}

// Commands (by full name) that take flag `name`.
void CommandsWithFlag(const CLI::App* app, const std::string& prefix, const std::string& name,
                      std::vector<std::string>* out) {
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
    const std::string full = absl::StrCat(prefix, prefix.empty() ? "" : " ", sub->get_name());
    if (HasFlag(sub, name)) out->push_back(full);
    CommandsWithFlag(sub, full, name, out);
  }
}

// The innermost command selected on the command line, or `root`.
CLI::App* Selected(CLI::App* root) {
  CLI::App* app = root;
  while (!app->get_subcommands().empty()) app = app->get_subcommands().front();
  return app;
}

std::string CommandName(const CLI::App* app) {
  std::vector<std::string> names;
  for (; app != nullptr && app->get_parent() != nullptr; app = app->get_parent()) names.push_back(app->get_name());
  std::reverse(names.begin(), names.end());
  return absl::StrJoin(names, " ");
}

std::string Prefix(const std::string& command) { return command.empty() ? "kreg" : "kreg " + command; }

// The message for arguments nothing took.
std::string ExtrasMessage(CLI::App* root, const std::vector<std::string>& extras) {
  CLI::App* app = Selected(root);
  const std::string command = CommandName(app);
  const std::string& arg = extras.front();
  const bool is_flag = arg.size() > 1 && arg[0] == '-';
  if (!is_flag) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
    }
    if (!names.empty()) {  // kreg WORD, kreg db WORD
      const std::string close = Closest(arg, names);
      return absl::StrCat("unknown command '", arg, "'", close.empty() ? "" : absl::StrCat("; did you mean ", close, "?"),
                          " (commands: ", absl::StrJoin(names, ", "), ")");
    }
    return absl::StrCat("unexpected argument '", arg, "' (see ", Prefix(command), " --help)");
  }
  const std::string name = FlagName(arg);
  std::vector<std::string> others;
  CommandsWithFlag(root, "", name, &others);
  if (!others.empty()) {
    if (app == root) {
      return absl::StrCat("--", name, " is a flag of 'kreg ", others.front(), "'; give it after the command");
    }
    return absl::StrCat("--", name, " does not apply to '", Prefix(command), "' (it is a flag of ",
                        absl::StrJoin(others, ", "), ")");
  }
  std::vector<std::string> candidates;
  for (const CLI::App* a = app; a != nullptr; a = a->get_parent()) {
    for (const CLI::Option* o : a->get_options()) {
      if (!o->get_positional() && !o->get_lnames().empty()) candidates.push_back(o->get_lnames()[0]);
    }
  }
  const std::string close = Closest(name, candidates);
  return absl::StrCat("unknown flag '", arg.substr(0, arg.find('=')), "'",
                      close.empty() ? absl::StrCat(" (see ", Prefix(command), " --help)")
                                    : absl::StrCat("; did you mean --", close, "?"));
}

// The help page of `app` (not of the command selected under it, as
// CLI::App::help gives).
std::string HelpOf(const HelpFormatter& help, const CLI::App* app) {
  return help.make_help(app, Prefix(CommandName(app)), CLI::AppFormatMode::Normal);
}

int Fail(const std::string& command, absl::string_view message, int code) {
  std::cerr << Prefix(command) << ": " << OneLine(message) << "\n";
  return code;
}

// A validator from one of kreg/limits.h's checks: the flag's text as an
// integer, then checked ("--threads: expected 0 (all cores) to 1024, got 5000").
CLI::Validator IntWithin(std::function<absl::Status(int64_t)> check) {
  return CLI::Validator(
      [check](std::string& text) -> std::string {
        int64_t v = 0;
        if (!absl::SimpleAtoi(text, &v)) return absl::StrCat("'", text, "' is not an integer");
        absl::Status s = check(v);
        return s.ok() ? std::string() : std::string(s.message());
      },
      "");
}
// The same for a duration in seconds (finite, at most a week; `zero` says
// whether 0 is allowed).
CLI::Validator SecondsWithin(limits::Zero zero) {
  return CLI::Validator(
      [zero](std::string& text) -> std::string {
        double v = 0;
        if (!absl::SimpleAtod(text, &v)) return absl::StrCat("'", text, "' is not a number");
        absl::Status s = limits::CheckSeconds(v, "", zero);
        return s.ok() ? std::string() : std::string(s.message());
      },
      "");
}

// A list flag given must list something: `--dtype ''` is a slip, not the
// default. (Empty items, "a,,b", are refused where the list is split.)
CLI::Validator NotBlank() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return absl::StripAsciiWhitespace(text).empty() ? "the value is empty" : std::string();
      },
      "");
}

// Flags more than one command takes.
CLI::Option* AddDims(CLI::App* c, Flags& f, const char* what) {
  return c->add_option("--dims", f.dims, what)
      ->option_text("NAME=V,...")
      ->check(NotBlank())
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}
void AddDtype(CLI::App* c, Flags& f) {
  c->add_option("--dtype", f.dtype,
                "element type of every tensor whose dtype is a choice (f32, bf16, i32), or NAME=TYPE,... per tensor "
                "(default: each tensor's first)")
      ->option_text("TYPE")
      ->check(NotBlank());
}
void AddWith(CLI::App* c, Flags& f) {
  c->add_option("--with", f.with, "optional inputs to generate at random, comma-separated (e.g. row_ends)")
      ->option_text("NAME,...")
      ->check(NotBlank());
}
void AddInput(CLI::App* c, Flags& f) {
  c->add_option("--input", f.inputs, "an input read from a .npy file instead of random data; repeatable")
      ->option_text("NAME=FILE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}
void AddDist(CLI::App* c, Flags& f) {
  c->add_option("--dist", f.dist, "random inputs: normal, uniform, bits or ties")->option_text("NAME")->capture_default_str();
}
void AddGenerate(CLI::App* c, Flags& f) {
  AddDist(c, f);
  c->add_option("--partition", f.partition, "group sizes (partition inputs): random, balanced or skewed")
      ->option_text("NAME")
      ->capture_default_str();
  c->add_option("--seed", f.seed, "random seed")->option_text("N")->capture_default_str()->check(IntWithin([](int64_t v) {
    return limits::CheckCount(v, "", 0, std::numeric_limits<int64_t>::max());
  }));
}
void AddThreads(CLI::App* c, Flags& f, const std::string& help) {
  c->add_option("--threads", f.threads, help)->option_text("N")->capture_default_str()->check(IntWithin([](int64_t v) {
    return limits::CheckThreads(v, "");
  }));
}
void AddMeasure(CLI::App* c, Flags& f) {
  c->add_option("--warmup", f.warmup, "untimed runs before timing")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckReps(v, "", 0); }));
  c->add_option("--reps", f.reps, "timed runs at most (fewer once the median is stable)")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckReps(v, "", 1); }));
  AddThreads(c, f, absl::StrCat("threads per kernel run (0: all cores; at most ", limits::kMaxThreads, ")"));
}
void AddComm(CLI::App* c, Flags& f) {
  c->add_option("--ranks", f.ranks,
                absl::StrCat("collective ops: run on N ranks, threads of this process (at most ",
                             limits::kMaxThreadRanks, ")"))
      ->option_text("N")
      ->check(IntWithin([](int64_t v) { return limits::CheckThreadRanks(v, ""); }));
  c->add_option("--backend", f.backend,
                "collective ops: threads (ranks are threads of this process) or mpi (this process is one rank "
                "of the job mpirun started)")
      ->option_text("NAME")
      ->capture_default_str();
  c->add_option("--mesh", f.mesh,
                "collective ops on a device mesh: its axes, 2x4 (axes x, y) or x=2,y=4; the ranks are its size")
      ->option_text("AXES");
  c->add_option("--comm-timeout,--comm_timeout", f.comm_timeout,
                "collective ops: seconds a rank waits for another before failing")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(SecondsWithin(limits::Zero::kRefused));
}
// Writers of a table: how long to wait for another process's lock on it.
void AddLockTimeout(CLI::App* c, Flags& f) {
  c->add_option("--lock-timeout,--lock_timeout", f.lock_timeout,
                "seconds to wait for a table another process is writing (0: not at all)")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(SecondsWithin(limits::Zero::kAllowed));
}
void AddDataClass(CLI::App* c, Flags& f, const char* what) {
  c->add_option("--data-class,--data_class", f.data_class, what)->option_text("TEXT");
}
void AddDevice(CLI::App* c, Flags& f, const std::string& help) {
  c->add_option("--device", f.device, help)->option_text("NAME")->capture_default_str()->check(
      CLI::IsMember({"cpu", "cuda"}));
  c->add_flag("--warm", f.warm, "with --device cuda: time with the L2 warm (not flushed before each run)");
}
void AddTables(CLI::App* c, Flags& f) {
  c->add_option("--machine", f.machine,
                "whose measurements answer: similar (this machine's, else the most similar tuned machine's) or "
                "strict (this machine's only)")
      ->option_text("similar|strict")
      ->capture_default_str()
      ->check(CLI::IsMember({"similar", "strict"}));
  c->add_flag("--no-shipped,--no_shipped", f.no_shipped,
              "ask only --db, not the tables shipped with kreg (share/kreg/tables, or KREG_TABLE_PATH)");
}

}  // namespace

int Main(int argc, char** argv) {

  Flags f;
  auto help = std::make_shared<HelpFormatter>();
  CLI::App app("a kernel registry with an autotuner", "kreg");
  app.formatter(help);
  app.set_help_flag("-h,--help", "print this help, or a command's (kreg COMMAND --help)");
  app.set_version_flag("--version", "kreg " KREG_VERSION, "print the version (kreg " KREG_VERSION ") and exit");
  app.fallthrough();  // global flags after the command too
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // the last one given counts
  app.require_subcommand(0, 1);
  app.add_option("--plugin-path,--plugin_path", f.plugin_path,
                 "colon-separated plugin files or folders, searched before KREG_PLUGIN_PATH and the installed "
                 "plugin folder")
      ->option_text("PATHS");
  app.add_flag("--json", f.json, "print JSON records instead of text (list, run, tune, query, db export)");
  app.add_flag_function("-v,--verbose", [&f](std::int64_t count) { f.verbose = static_cast<int>(count); },
               "more messages on stderr: -v what kreg does (plugins loaded, tables read, plugins' own notes), "
               "-vv also each dispatch and location searched; KREG_LOG=error|warn|info|debug sets the level "
               "without a flag (warn by default)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  help->Set(&app, {"kreg [--plugin-path PATHS] [--json] [-v] COMMAND [ARGS] [FLAGS]\nkreg help COMMAND",
                   "kreg loads kernel plugins, runs and checks any kernel, tunes every variant's parameters into a "
                   "tuning table, and answers from the table which kernel to run for a problem on this machine.",
                   "kreg list\n"
                   "kreg run topk/sort --dims batch=8,n=1000,k=10 --check\n"
                   "kreg tune topk --dims batch=32,n=32000,k=50 --db topk.lut\n"
                   "kreg query topk --dims batch=48,n=40000,k=64 --db topk.lut"});
  app.footer("Exit status: 0 done; 1 failed (a runtime error, a failed check, tables that differ); 2 bad input. "
             "Errors are one line on stderr: \"kreg COMMAND: message\".");

  // list
  CLI::App* list = app.add_subcommand("list", "plugins found, each op, each kernel: its ISA and parameter space");
  list->set_help_flag("-h,--help", "print this help");
  help->Set(list, {"kreg list [--json] [--check-plugins]",
                   "Lists the plugins found, the ops they declare (dims, tensors, attributes) and every kernel: its "
                   "version, the ISA it needs, whether this CPU can run it, and its parameters with their values "
                   "and defaults. With --check-plugins, loads each plugin in a child process instead and says "
                   "which load (ok), are refused, crash or hang (exit 1 if any crashes or hangs).",
                   "kreg list\nkreg list --json\nKREG_ISA_MASK=fma kreg list   # as a CPU without AVX2 sees it\n"
                   "kreg list --check-plugins"});
  list->add_flag("--check-plugins,--check_plugins", f.check_plugins,
                 "load each plugin in a child process and report those that crash or hang while loading");

  // machine
  CLI::App* machine = app.add_subcommand("machine", "this machine's fingerprint: the key tables file its entries under");
  machine->set_help_flag("-h,--help", "print this help");
  help->Set(machine, {"kreg machine [--json]",
                      "Prints what kreg fingerprints this machine by (CPU model, vendor, architecture, family and "
                      "model, the ISA extensions kernels may need, logical cores), its id, and its class: the name "
                      "of the shipped table for machines like it.",
                      "kreg machine\nKREG_ISA_MASK=fma kreg machine   # another machine to kreg"});

  // run
  CLI::App* run = app.add_subcommand("run", "run one kernel (or a table's choice) on built inputs: time it, check it");
  run->set_help_flag("-h,--help", "print this help");
  help->Set(run, {"kreg run OP/VARIANT [--dims NAME=V,...] [flags]\nkreg run OP --db FILE [--dims NAME=V,...] [flags]",
                  "Builds the problem's inputs (random, or from .npy files), prepares the kernel, runs it --warmup "
                  "times, then times up to --reps runs (the tuner's measurement) and prints the median, min and max. "
                  "--check compares the outputs with the op's reference kernel. With OP and --db, a tuning table "
                  "chooses the kernel and its parameters.",
                  "kreg run topk/sort --dims batch=8,n=1000,k=10 --check\n"
                  "kreg run topk/sort --dims batch=64,n=32768,k=2048 --dtype bf16 --param method=nth_element\n"
                  "kreg run topk/sort --dims k=64 --input input=logits.npy --save-outputs out/ --check\n"
                  "kreg run topk --db topk.lut --dims batch=48,n=40000,k=64 --check\n"
                  "kreg run allreduce/ring --ranks 5 --dims count=1000000 --check\n"
                  "mpirun -n 3 kreg run allreduce/ring --backend mpi --dims count=1000 --check"});
  run->add_option("KERNEL", f.target, "OP/VARIANT to run (kreg list shows them), or OP with --db")->required();
  AddDims(run, f, "the op's dims and attributes, e.g. batch=8,n=1000,k=10; dims an --input gives may be left out");
  AddDtype(run, f);
  AddWith(run, f);
  run->add_option("--param", f.params, "a kernel parameter (lists as 5,8,12); the others keep their defaults; repeatable")
      ->option_text("NAME=V")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  AddInput(run, f);
  run->add_option("--save-outputs,--save_outputs", f.save_outputs,
                  "write each output to DIR/NAME.npy (a collective's: DIR/NAME.rankR.npy)")
      ->option_text("DIR");
  AddGenerate(run, f);
  AddMeasure(run, f);
  run->add_flag("--check", f.check, "check the outputs against the op's reference kernel");
  AddDevice(run, f,
            "cpu, or cuda: run a CUDA kernel on the GPU (inputs made here, copied over once; timed with CUDA "
            "events, the L2 flushed before each run; outputs copied back for --check); with --db, the table's "
            "answer for the GPU");
  AddComm(run, f);
  run->add_option("--db", f.db, "a tuning table; with OP alone, run what it picks for the problem")->option_text("FILE");
  AddDataClass(run, f, "with --db: the data class to ask the table for (default: the op's classifier on the inputs, "
                       "else dist=NAME for a --dist other than normal)");
  AddTables(run, f);

  // tune
  CLI::App* tune = app.add_subcommand("tune", "search every variant's parameters for problems; results go into a table");
  tune->set_help_flag("-h,--help", "print this help");
  help->Set(tune, {"kreg tune OP --dims NAME=V,... [--dims NAME=V,...]... --db FILE [flags]",
                   "Searches every available kernel's parameter space (the op's reference left out unless named "
                   "with --variants) for each problem, one per --dims, in a worker process: a candidate that "
                   "crashes or hangs is recorded as failed. Every result is saved into the table as it comes, so "
                   "a sweep that is interrupted (Ctrl-C) or re-run with a new variant measures only what is "
                   "missing. Progress goes to stderr, results to stdout.",
                   "kreg tune topk --dims batch=32,n=32000,k=50 --dims batch=64,n=32768,k=1024 --db topk.lut\n"
                   "kreg tune topk --dims k=64 --input input=logits.npy --db topk.lut --strategy exhaustive\n"
                   "kreg tune topk --dims batch=8,n=4000,k=16 --variants sort,heap --budget 60 --db topk.lut"});
  tune->add_option("OP", f.target, "the op to tune (kreg list shows the ops)")->required();
  AddDims(tune, f, "a problem: the op's dims and attributes; repeatable, one problem each");
  tune->add_option("--db", f.db, "the table to record into (created if missing)")->option_text("FILE")->required();
  tune->add_option("--variants", f.variants, "variants to search (default: every available one but the reference)")
      ->option_text("V,...")
      ->check(NotBlank());
  tune->add_option("--strategy", f.strategy,
                   "exhaustive, random, or halving: everyone measured once, the best quarter kept with four times "
                   "the repetitions, and so on")
      ->option_text("NAME")
      ->capture_default_str();
  tune->add_option("--budget", f.budget, "random and halving: seconds per problem (0: no limit)")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(SecondsWithin(limits::Zero::kAllowed));
  tune->add_option("--timeout", f.timeout, "seconds a candidate may take before it is killed")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(SecondsWithin(limits::Zero::kRefused));
  AddMeasure(tune, f);
  AddComm(tune, f);
  AddDtype(tune, f);
  AddWith(tune, f);
  AddInput(tune, f);
  AddGenerate(tune, f);
  tune->add_option("--max-list-len,--max_list_len", f.max_list_len,
                   "list parameters (e.g. m_schedule): lists of up to N values at first")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckCount(v, "", 1, limits::kMaxListLen); }));
  tune->add_option("--list-growth-rounds,--list_growth_rounds", f.list_growth_rounds,
                   "then up to N rounds extending the best lists by one value")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckCount(v, "", 0, limits::kMaxListGrowthRounds); }));
  tune->add_flag("--no-thread-round,--no_thread_round", f.no_thread_round,
                 "do not measure the leaders again on fewer threads than cores (without --threads they are: "
                 "a kernel faster on fewer threads is chosen with them)");
  AddDataClass(tune, f, "the data class kept in the key (default: the op's classifier on the inputs, else "
                        "dist=NAME for a --dist other than normal)");
  AddDevice(tune, f,
            "cpu, or cuda: tune the op's CUDA kernels on GPU 0 (timed with CUDA events, the L2 flushed before "
            "each run), keyed under the GPU (its name, SM version, memory and driver) beside the CPU's entries");
  AddLockTimeout(tune, f);

  // query
  CLI::App* query = app.add_subcommand("query", "what a table answers for problems: exact, nearest or default");
  query->set_help_flag("-h,--help", "print this help");
  help->Set(query, {"kreg query OP --dims NAME=V,... [--dims NAME=V,...]... [--db FILE] [flags]",
                    "Prints, for each problem (one per --dims), the kernel and parameters the tables (--db, then "
                    "the shipped ones) answer with on this machine and how: exact (tuned for this problem here), "
                    "nearest (the nearest problem tuned here whose choice is legal), similar machine (nothing "
                    "tuned here; the most similar tuned machine's exact or nearest answer, named), model (a "
                    "collective's calibrated costs) or default (why, and the default measured across machines, "
                    "else the op's own). \"incomplete\" marks an answer from a sweep that was cut short.",
                    "kreg query topk --dims batch=48,n=40000,k=64 --db topk.lut\n"
                    "kreg query topk --dims batch=128,n=201088,k=64 --machine strict\n"
                    "kreg query topk --dims batch=8,n=4000,k=16 --dims batch=6,n=3000,k=8 --with row_ends --db topk.lut --json"});
  query->add_option("OP", f.target, "the op to ask about")->required();
  AddDims(query, f, "a problem: the op's dims and attributes; repeatable, one answer each")->required();
  query->add_option("--db", f.db, "a table to ask before the shipped ones")->option_text("FILE");
  AddTables(query, f);
  AddDtype(query, f);
  AddWith(query, f);
  AddDist(query, f);
  AddThreads(query, f, "the threads the caller will run with (0: all cores): an entry measured on several thread counts answers with its fastest on no more");
  AddDataClass(query, f, "the data class to ask for (default: dist=NAME for a --dist other than normal)");
  query->add_option("--device", f.device, "cpu, or cuda: the answer for this machine's GPU (its CUDA kernels)")
      ->option_text("NAME")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  AddComm(query, f);
  query->add_option("--nodes", f.nodes, "with --backend mpi: the nodes of the job to ask for (kreg run and tune "
                                        "under mpirun count them)")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckRanks(v, ""); }));

  // calibrate
  CLI::App* calibrate =
      app.add_subcommand("calibrate", "measure a communicator backend's alpha-beta-gamma costs into a table");
  calibrate->set_help_flag("-h,--help", "print this help");
  help->Set(calibrate,
            {"kreg calibrate --db FILE [--backend threads|mpi] [--ranks N]",
             "Measures the backend's latency per message (alpha: half an 8-byte round trip), its time per byte "
             "(beta: half a 4 MiB round trip) and the time per byte of a float reduction (gamma) on this machine, "
             "and records them in the table. A query for a collective nothing was tuned for then answers by the "
             "cost model (match \"model\"); measured entries still come first. Under mpirun with --backend mpi, "
             "ranks 0 and 1 of the job measure.",
             "kreg calibrate --db c.lut\nmpirun -n 2 kreg calibrate --backend mpi --db c.lut"});
  calibrate->add_option("--db", f.db, "the table to record into (created if missing)")->option_text("FILE")->required();
  AddComm(calibrate, f);
  AddLockTimeout(calibrate, f);

  // db
  CLI::App* db = app.add_subcommand("db", "show, export, merge, compare and slim tuning tables");
  db->set_help_flag("-h,--help", "print this help");
  db->require_subcommand(1, 1);
  help->Set(db, {"kreg db show FILE | export FILE | merge OUT IN... | diff A B | slim IN OUT",
                 "Reads and combines tuning tables (binary, or protobuf text when the name ends in .txtpb).",
                 "kreg db show topk.lut\nkreg db merge all.lut a.lut b.lut\nkreg db diff a.lut b.lut\n"
                 "kreg db slim topk.lut topk.txtpb"});
  CLI::App* show = db->add_subcommand("show", "one line per problem: its winner and runner-up");
  show->set_help_flag("-h,--help", "print this help");
  help->Set(show, {"kreg db show FILE", "One line per tuned problem: its key, the winning kernel and parameters, "
                                        "its median time, the runner-up and the number of trials.",
                   "kreg db show topk.lut"});
  show->add_option("FILE", f.file_a, "the table")->required();
  CLI::App* exp = db->add_subcommand("export", "the whole table in protobuf text format, JSON or CSV");
  exp->set_help_flag("-h,--help", "print this help");
  help->Set(exp, {"kreg db export FILE [--json | --csv]",
                  "Prints the whole table, every trial included: in protobuf text format; with --json in protobuf's "
                  "JSON mapping (field names as in tuning_db/kreg_tuning.proto); with --csv one row per trial under "
                  "a header naming the columns (the problem's op, dtype, dims, data class and machine; the trial's "
                  "variant, version, params, threads, status, times, repetitions, when measured and error), for "
                  "pandas or a spreadsheet.",
                  "kreg db export topk.lut > topk.txtpb\nkreg db export topk.lut --csv > topk.csv\n"
                  "kreg db export topk.lut --json | jq '.entries | length'"});
  exp->add_option("FILE", f.file_a, "the table")->required();
  exp->add_flag("--csv", f.csv, "one CSV row per trial");
  CLI::App* plot = db->add_subcommand("plot", "PNG pictures of a table: each problem's candidates, the winners by shape");
  plot->set_help_flag("-h,--help", "print this help");
  help->Set(plot, {"kreg db plot FILE --out DIR [--key TEXT]",
                   "Draws the table with matplotlib (python3 -m kreg.plot; Debian python3-matplotlib) into DIR: per "
                   "problem, every candidate's median time by variant and parameters, the best starred and failures "
                   "listed, and a heat map over two tiling parameters of a variant (e.g. gmm/tiled's); per op and "
                   "dtype, the winning variant by shape. Prints the files written.",
                   "kreg db plot gmm.lut --out plots/\nkreg db plot topk.lut --out plots/ --key n=4096"});
  plot->add_option("FILE", f.file_a, "the table")->required();
  plot->add_option("--out", f.out_dir, "the folder for the PNGs (created)")->required()->option_text("DIR");
  plot->add_option("--key", f.key_filter, "only problems whose label holds TEXT (e.g. n=4096)")->option_text("TEXT");
  CLI::App* merge = db->add_subcommand("merge", "the union of tables, merged into OUT");
  merge->set_help_flag("-h,--help", "print this help");
  help->Set(merge, {"kreg db merge OUT IN...",
                    "Merges every IN table into OUT (created if missing, else merged into): per problem the union "
                    "of trials, the newer measurement of the same candidate winning.",
                    "kreg db merge all.lut machine_a.lut machine_b.lut"});
  merge->add_option("OUT", f.file_a, "the table to write")->required();
  merge->add_option("IN", f.files, "the tables to merge")->required()->expected(1, -1);
  AddLockTimeout(merge, f);
  CLI::App* diff = db->add_subcommand("diff", "where two tables' winners differ; exit 1 if they do");
  diff->set_help_flag("-h,--help", "print this help");
  help->Set(diff, {"kreg db diff A B",
                   "One line per problem whose winner (variant, version or parameters) differs, or that only one "
                   "table has. Exits 0 when the winners agree everywhere and 1 when they differ, as diff(1) does.",
                   "kreg db diff old.lut new.lut"});
  diff->add_option("A", f.file_a, "a table")->required();
  diff->add_option("B", f.file_b, "another table")->required();
  CLI::App* slim = db->add_subcommand("slim", "a copy keeping each variant's best trial per problem (per choice combination)");
  slim->set_help_flag("-h,--help", "print this help");
  help->Set(slim, {"kreg db slim IN OUT",
                   "Writes OUT with, per problem, only the fastest successful trial of each variant (the shipped "
                   "tables' form); failures and slower configurations are dropped.",
                   "kreg db slim all.lut data/tables/amd-epyc-avx2-2c.txtpb"});
  slim->add_option("IN", f.file_a, "the table to read")->required();
  slim->add_option("OUT", f.file_b, "the table to write")->required();
  AddLockTimeout(slim, f);

  // help
  std::vector<std::string> topic;
  CLI::App* help_cmd = app.add_subcommand("help", "help for a command (kreg help tune)");
  help_cmd->set_help_flag("-h,--help", "print this help");
  help->Set(help_cmd, {"kreg help [COMMAND [SUBCOMMAND]]", "Prints the help of a command, or kreg's.", "kreg help tune\nkreg help db diff"});
  help_cmd->add_option("COMMAND", topic, "the command");

  if (argc < 2) {
    std::cerr << HelpOf(*help, &app);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << HelpOf(*help, Selected(&app));
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << HelpOf(*help, &app);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    // Arguments nothing took are the likeliest cause of anything else.
    const std::vector<std::string> extras = app.remaining(true);
    const std::string command = CommandName(Selected(&app));
    if (!extras.empty()) return Fail(command, ExtrasMessage(&app, extras), 2);
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && Selected(&app) == db) {
      return Fail(command, "give one of: show FILE, export FILE, plot FILE --out DIR, merge OUT IN..., diff A B, slim IN OUT", 2);
    }
    std::string message = e.what();
    if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr && absl::StrContains(message, "missing")) {
      // "--dims: 1 required TEXT missing"
      message = absl::StrCat(message.substr(0, message.find(':')), " needs a value");
    }
    return Fail(command, absl::StrCat(message, " (see ", Prefix(command), " --help)"), 2);
  }

  CLI::App* selected = Selected(&app);
  f.command = CommandName(selected);
  SetLockWait(f.lock_timeout);
  if (f.verbose > 0) {
    const LogLevel asked = f.verbose > 1 ? LogLevel::kDebug : LogLevel::kInfo;
    if (!LogEnabled(asked)) {
      SetLogLevel(asked);
      // The tuner's worker processes say as much.
      setenv("KREG_LOG", std::string(LogLevelName(asked)).c_str(), 1);
    }
  }
  if (selected == help_cmd) {
    const CLI::App* page = &app;
    for (const std::string& t : topic) {
      const CLI::App* next = nullptr;
      for (const CLI::App* sub : page->get_subcommands([](const CLI::App*) { return true; })) {
        if (sub->get_name() == t) next = sub;
      }
      if (next == nullptr) {
        return Fail("help", absl::StrCat("no command '", absl::StrJoin(topic, " "), "' (see kreg --help)"), 2);
      }
      page = next;
    }
    std::cout << HelpOf(*help, page);
    return 0;
  }
  if (selected == &app) {
    // Flags alone, no command.
    std::cerr << HelpOf(*help, &app);
    return 2;
  }
  if (f.json && f.csv) return Fail(f.command, "give --json or --csv, not both", 2);
  if (f.json && f.command.rfind("db", 0) == 0 && f.command != "db export") {
    return Fail(f.command, absl::StrCat("--json does not apply to 'kreg ", f.command, "'"), 2);
  }

  absl::Status status;
  int code = 0;
  try {
    if (selected == list) {
      status = List(f);
    } else if (selected == machine) {
      status = MachineCmd(f);
    } else if (selected == run) {
      status = Run(f);
    } else if (selected == tune) {
      status = Tune(f);
    } else if (selected == query) {
      status = Query(f);
    } else if (selected == calibrate) {
      status = Calibrate(f);
    } else {
      absl::StatusOr<int> db_code = Db(f);
      status = db_code.status();
      if (db_code.ok()) code = *db_code;
    }
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory (are the dims what you meant?)");
  }
  if (!status.ok()) return Fail(f.command, status.message(), status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  return code;
}

}  // namespace kreg::cli
