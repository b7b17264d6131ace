// The kernel registry: loads plugins (shared objects speaking
// kreg/plugin_abi.h), checks them, and registers the ops they declare (by
// name, kreg/op.h) and their kernels (by "op/variant").
//
// Ownership: a Registry owns the plugins it loaded. Ops and kernels are handed
// out as shared pointers; each keeps its plugin loaded, so a kernel obtained
// from a registry stays callable after the registry is gone (the plugin's
// fini() runs and it is dlclose()d when its last op or kernel is released;
// its code stays mapped until the process ends, for threads still in it).
//
// Thread-safety: all const methods of Registry and Kernel are thread-safe;
// LoadPlugin may run concurrently with lookups.
#ifndef KREG_REGISTRY_REGISTRY_H_
#define KREG_REGISTRY_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kreg/machine.h"  // CpuIsa, IsaString: what Kernel::available asks
#include "kreg/op.h"
#include "kreg/params.h"
#include "kreg/plugin_abi.h"

namespace kreg {

// Maps an ABI status and its message onto absl::Status.
absl::Status FromAbi(kreg_status code, absl::string_view message);

// Where kreg is installed or built: the prefix of the shared library that
// holds the registry (<prefix>/<libdir>/libkreg_registry.so, found with
// dladdr), so a moved install, a Python module or a program linked against
// the package finds its plugins (<prefix>/<libdir>/kreg/plugins), shipped
// tables, backends and worker beside it; "" where it cannot be told.
const std::string& InstallPrefix();

// Scratch memory reused across runs (64-byte aligned, grows on demand).
class Workspace {
 public:
  // nullptr when `bytes` cannot be allocated.
  void* Get(size_t bytes);

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<unsigned char[], Free> data_;
  size_t size_ = 0;
};

struct RunOptions {
  int num_threads = 0;             // 0: oneTBB's default
  const std::atomic<int>* cancel_flag = nullptr;  // non-zero asks the kernel to stop
  Workspace* workspace = nullptr;  // nullptr: a fresh one per call
  // Where kreg_host.log goes; unset: stderr, "kreg: KERNEL: message".
  std::function<void(int level, absl::string_view message)> log;
  // kreg_host.dispatch: runs an op through a tuning table (the Dispatcher
  // sets it); unset: kernels that dispatch get UNIMPLEMENTED.
  std::function<absl::Status(absl::string_view op, const kreg_args& args)> dispatch;
  // kreg_host.comm: this rank's communicator, for collective ops.
  const kreg_comm* comm = nullptr;
  // kreg_host.device: the device a device kernel runs on (kreg/device.h's
  // Device::abi()); nullptr on the CPU.
  const kreg_device* device = nullptr;
};

class LoadedPlugin;
class Kernel;

// A kernel prepared for one call: its state (kreg_kernel.prepare), its
// workspace and host table, so repeated runs do nothing but run. Releases the
// state when destroyed. Not thread-safe.
class PreparedRun {
 public:
  ~PreparedRun();
  PreparedRun(const PreparedRun&) = delete;
  PreparedRun& operator=(const PreparedRun&) = delete;
  // Runs the kernel once on the args it was prepared for.
  absl::Status Run();

  struct HostContext;  // what kreg_host's callbacks reach
  struct Arena;        // the oneTBB arena runs execute in, made once

 private:
  friend class Kernel;
  PreparedRun() = default;
  const Kernel* kernel_ = nullptr;
  std::unique_ptr<Config::AbiView> abi_;
  const kreg_args* args_ = nullptr;
  void* state_ = nullptr;
  bool prepared_ = false;
  Workspace own_workspace_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::unique_ptr<Arena> arena_;  // with num_threads > 0
  std::unique_ptr<HostContext> host_;
};

// A registered kernel variant. Its descriptor is read once at load time
// (only fields its struct_size covers).
class Kernel {
 public:
  Kernel(std::shared_ptr<const LoadedPlugin> plugin, std::shared_ptr<const Op> op,
         const kreg_kernel* desc, ParamSpace params);

  const std::string& name() const { return name_; }  // "op/variant"
  const std::string& op() const { return op_->name(); }
  const Op& op_info() const { return *op_; }
  const std::shared_ptr<const Op>& op_ptr() const { return op_; }
  const std::string& variant() const { return variant_; }
  uint32_t version() const { return desc_->version; }
  const std::string& doc() const { return doc_; }
  uint32_t required_isa() const { return desc_->required_isa; }
  // KREG_DEVICE_* where it runs; 0 for the CPU.
  uint32_t device() const { return device_; }
  bool is_reference() const { return (flags_ & KREG_KERNEL_REFERENCE) != 0; }
  // Whether it runs here on the CPU: false when the CPU lacks an ISA
  // extension the kernel requires, and for a device kernel (which runs on
  // its device's arguments: kreg/device.h's CanRun says whether it can).
  bool available() const;
  const std::string& plugin_path() const;
  const std::string& plugin_name() const;

  const ParamSpace& params() const { return params_; }
  // The default configuration on this CPU (see ParamSpace::Default).
  Config DefaultConfig() const;
  // ParamSpace::Parse for this kernel on this CPU.
  absl::StatusOr<Config> ParseConfig(
      const std::vector<std::pair<std::string, std::string>>& overrides) const;
  // "num_blocks=128 m_schedule=5,8,64"; empty for no parameters.
  std::string ConfigString(const Config& config) const { return params_.Format(config); }
  std::vector<std::pair<std::string, std::string>> ConfigPairs(const Config& config) const {
    return params_.Pairs(config);
  }

  // Validates `args` for the op, checks the configuration's values against
  // them, then asks the kernel's own check. `args` may be shape-only.
  absl::Status Check(const Config& config, const kreg_args& args) const;
  // Check for args already validated for the op (e.g. Op::MakeShapeArgs'):
  // the values and the kernel's own check only.
  absl::Status CheckConfig(const Config& config, const kreg_args& args) const;
  // Checks, sizes the workspace and prepares: the returned run may be
  // repeated. Unavailable kernels give FailedPrecondition.
  absl::StatusOr<std::unique_ptr<PreparedRun>> Prepare(const Config& config, const kreg_args& args,
                                                       const RunOptions& options = {}) const;
  // Prepare, run once, release.
  absl::Status Run(const Config& config, const kreg_args& args,
                   const RunOptions& options = {}) const;

 private:
  friend class PreparedRun;
  std::shared_ptr<const LoadedPlugin> plugin_;
  std::shared_ptr<const Op> op_;
  const kreg_kernel* desc_;
  std::string name_, variant_, doc_;
  uint32_t flags_ = 0;
  ParamSpace params_;
  // Optional entry points, NULL where struct_size does not cover them.
  decltype(kreg_kernel::prepare) prepare_ = nullptr;
  decltype(kreg_kernel::release) release_ = nullptr;
  uint32_t device_ = 0;
};

struct PluginInfo {
  std::string path;
  std::string name;
  std::string version;
  std::vector<std::string> ops;
  std::vector<std::string> kernels;
};

struct LoadOptions {
  // Files or folders, searched first (a folder contributes every *.so in it).
  std::vector<std::string> plugin_paths;
  bool use_env = true;           // then KREG_PLUGIN_PATH (colon-separated)
  bool use_default_dirs = true;  // then the build's / install's plugin folder
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Searches the locations of `options` in order and loads every plugin
  // found. A plugin file name already loaded from an earlier location is
  // shadowed (like PATH), and so is a kernel name (or an op's reference
  // kernel) that a plugin from an earlier location registers: that kernel
  // alone is skipped, the rest of its plugin loads. Refused plugins and
  // skipped kernels are recorded in refusals(); only a location given
  // explicitly that does not exist is an error.
  static absl::StatusOr<std::unique_ptr<Registry>> Load(
      const LoadOptions& options);
  // The plugin files Load would load, in order (shadowed names left out).
  static absl::StatusOr<std::vector<std::string>> PluginFiles(const LoadOptions& options);

  // Loads one plugin, all or nothing: on error nothing of it is registered,
  // and the message names the file and the reason. Its kernels' ops must be
  // declared by it or by a plugin loaded before (LoadPlugins loads ops
  // first). Kernels registered already are skipped (the error names the
  // first); the rest of the plugin is registered.
  absl::Status LoadPlugin(const std::string& path);
  // Loads several plugins: every plugin's ops first, then the kernels, so
  // the order of files does not matter; kernels in path order (a name
  // registered already is skipped). Refusals are recorded (refusals())
  // and returned, one per refused plugin or skipped kernel.
  std::vector<absl::Status> LoadPlugins(const std::vector<std::string>& paths);

  // NotFound naming the known kernels of that op if there is none.
  absl::StatusOr<std::shared_ptr<const Kernel>> Get(absl::string_view name) const;
  // The op called `name`; NotFound listing the known ops.
  absl::StatusOr<std::shared_ptr<const Op>> GetOp(absl::string_view name) const;
  std::vector<std::shared_ptr<const Op>> Ops() const;
  // The op's reference kernel (KREG_KERNEL_REFERENCE), or nullptr.
  std::shared_ptr<const Kernel> Reference(absl::string_view op) const;
  // The plugin files loaded, in load order.
  std::vector<std::string> Files() const;
  // All kernels, or those of one op, sorted by name.
  std::vector<std::shared_ptr<const Kernel>> Kernels(absl::string_view op = {}) const;
  std::vector<PluginInfo> Plugins() const;
  std::vector<absl::Status> refusals() const;
  std::vector<std::string> searched() const;

  // The default plugin folders: beside kreg's library
  // (InstallPrefix()/<libdir>/kreg/plugins), next to the running executable
  // (<exe>/../lib/kreg/plugins), and the configured install prefix's.
  static std::vector<std::string> DefaultDirs();

 private:
  struct Opened;
  static absl::StatusOr<std::vector<std::string>> FindPlugins(const LoadOptions& options,
                                                              std::vector<std::string>* searched);
  absl::StatusOr<Opened> Open(const std::string& path) const;
  absl::Status AddOps(Opened& opened) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the kernels of `opened`, all or nothing, except those whose
  // name (or op's reference kernel) is registered already: each of those is
  // skipped and added to *skipped.
  absl::Status AddKernels(Opened& opened, std::vector<absl::Status>* skipped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const Kernel>, std::less<>> kernels_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const Op>, std::less<>> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<PluginInfo> plugins_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> refusals_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> searched_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> files_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREG_REGISTRY_REGISTRY_H_
