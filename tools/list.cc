// kreg list and kreg machine: what this kreg can run, and on what.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kreg/device.h"
#include "kreg/limits.h"
#include "kreg/op.h"
#include "kreg/registry.h"
#include "kreg/text.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace kreg::cli {
namespace {

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

// kreg list --check-plugins: `file` loaded in a child process with `with`
// (plugins that loaded before it, whose ops it may use) before it:
// {verdict, message}, the verdict ok, refused, crashed or hung.
absl::StatusOr<std::pair<std::string, std::string>> LoadInChild(const std::string& file,
                                                                const std::vector<std::string>& with) {
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
  // Each file with those that loaded before it; a refused one once more with
  // every one that loaded (the ops it needs may come from a later file).
  std::vector<std::string> good;
  std::vector<std::pair<std::string, std::string>> verdicts;
  for (const std::string& file : *files) {
    absl::StatusOr<std::pair<std::string, std::string>> v = LoadInChild(file, good);
    if (!v.ok()) return v.status();
    if (v->first == "ok") good.push_back(file);
    verdicts.push_back(*std::move(v));
  }
  for (size_t i = 0; i < files->size(); ++i) {
    if (verdicts[i].first != "refused") continue;
    absl::StatusOr<std::pair<std::string, std::string>> v = LoadInChild((*files)[i], good);
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

}  // namespace

void SetupList(CLI::App* list, HelpFormatter& help, Flags& f) {
  help.Set(list, {"kreg list [--json] [--check-plugins]",
                  "Lists the plugins found, the ops they declare (dims, tensors, attributes) and every kernel: its "
                  "version, the ISA it needs, whether this CPU can run it, and its parameters with their values "
                  "and defaults. With --check-plugins, loads each plugin in a child process instead and says "
                  "which load (ok), are refused, crash or hang (exit 1 if any crashes or hangs).",
                  "kreg list\nkreg list --json\nKREG_ISA_MASK=fma kreg list   # as a CPU without AVX2 sees it\n"
                  "kreg list --check-plugins"});
  list->add_flag("--check-plugins,--check_plugins", f.check_plugins,
                 "load each plugin in a child process and report those that crash or hang while loading");
}

void SetupMachine(CLI::App* machine, HelpFormatter& help, Flags&) {
  help.Set(machine, {"kreg machine [--json]",
                     "Prints what kreg fingerprints this machine by (CPU model, vendor, architecture, family and "
                     "model, the ISA extensions kernels may need, logical cores), its id, and its class: the name "
                     "of the shipped table for machines like it.",
                     "kreg machine\nKREG_ISA_MASK=fma kreg machine   # another machine to kreg"});
}

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
  out["device"] = std::string(DeviceName(DeviceKindOf(k.device())));
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

}  // namespace kreg::cli
