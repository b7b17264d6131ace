// The kernel registry: loads plugins (shared objects speaking
// kreg/plugin_abi.h), checks them, and registers their kernels by
// "op/variant".
//
// Ownership: a Registry owns the plugins it loaded. Kernels are handed out as
// std::shared_ptr<const Kernel>; each keeps its plugin loaded, so a kernel
// obtained from a registry stays callable after the registry is gone (the
// plugin is dlclose()d when its last kernel is released).
//
// Thread-safety: all const methods of Registry and Kernel are thread-safe;
// LoadPlugin may run concurrently with lookups.
#ifndef KREG_REGISTRY_REGISTRY_H_
#define KREG_REGISTRY_REGISTRY_H_

#include <atomic>
#include <cstdint>
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
#include "kreg/plugin_abi.h"

namespace kreg {

// Maps an ABI status and its message onto absl::Status.
absl::Status FromAbi(kreg_status code, absl::string_view message);

// ISA bits (KREG_ISA_*) of the running CPU, and their names.
uint32_t CpuIsa();
std::string IsaString(uint32_t bits);  // "avx512f,avx512bf16" or "none"

// One parameter value; see kreg_param_value.
struct ParamValue {
  int64_t value = 0;
  std::vector<int64_t> list;
  bool operator==(const ParamValue&) const = default;
};

// A configuration of a kernel: one value per parameter, in order. A value
// type; const methods are thread-safe.
class Config {
 public:
  Config() = default;
  explicit Config(std::vector<ParamValue> values);
  const std::vector<ParamValue>& values() const { return values_; }
  std::vector<ParamValue>& mutable_values() { return values_; }
  bool operator==(const Config& o) const { return values_ == o.values_; }

  // The ABI view of a Config; valid while both it and the Config live and
  // the Config is unchanged.
  class AbiView {
   public:
    explicit AbiView(const Config& config);
    const kreg_config* get() const { return &config_; }

   private:
    std::vector<kreg_param_value> values_;
    kreg_config config_;
  };

 private:
  std::vector<ParamValue> values_;
};

// Scratch memory reused across runs (64-byte aligned, grows on demand).
class Workspace {
 public:
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
};

class LoadedPlugin;

// A registered kernel variant.
class Kernel {
 public:
  Kernel(std::shared_ptr<const LoadedPlugin> plugin, const kreg_kernel* desc);

  const std::string& name() const { return name_; }  // "op/variant"
  absl::string_view op() const { return desc_->op; }
  absl::string_view variant() const { return desc_->variant; }
  uint32_t version() const { return desc_->version; }
  absl::string_view doc() const { return desc_->doc ? desc_->doc : ""; }
  uint32_t required_isa() const { return desc_->required_isa; }
  // False when the CPU lacks an ISA extension the kernel requires.
  bool available() const;
  const std::string& plugin_path() const;
  const std::string& plugin_name() const;

  size_t num_params() const { return desc_->num_params; }
  const kreg_param_desc& param(size_t i) const { return desc_->params[i]; }
  // Index of the parameter called `name`, or -1.
  int FindParam(absl::string_view name) const;

  Config DefaultConfig() const;
  // Parses NAME=VALUE overrides onto the default config. VALUE is an integer,
  // a comma-separated integer list, or a choice name. InvalidArgument naming
  // the parameter for an unknown name or an illegal value.
  absl::StatusOr<Config> ParseConfig(
      const std::vector<std::pair<std::string, std::string>>& overrides) const;
  // (name, value) of each parameter, values as ParseConfig reads them.
  std::vector<std::pair<std::string, std::string>> ConfigPairs(const Config& config) const;
  // "num_blocks=128 m_schedule=5,8,64"; empty for no parameters.
  std::string ConfigString(const Config& config) const;

  // Validates `args` for the op, then asks the kernel whether `config` is
  // legal for them.
  absl::Status Check(const Config& config, const void* args) const;
  // Validates, checks, sizes the workspace and runs. Unavailable kernels
  // return FailedPrecondition without running.
  absl::Status Run(const Config& config, const void* args,
                   const RunOptions& options = {}) const;

 private:
  std::shared_ptr<const LoadedPlugin> plugin_;
  const kreg_kernel* desc_;
  std::string name_;
};

struct PluginInfo {
  std::string path;
  std::string name;
  std::string version;
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
  // shadowed (like PATH). Plugins that are refused are recorded in
  // refusals(); only a location given explicitly that does not exist is an
  // error.
  static absl::StatusOr<std::unique_ptr<Registry>> Load(
      const LoadOptions& options);

  // Loads one plugin, all or nothing: on error nothing of it is registered,
  // and the message names the file and the reason.
  absl::Status LoadPlugin(const std::string& path);

  // NotFound naming the known kernels of that op if there is none.
  absl::StatusOr<std::shared_ptr<const Kernel>> Get(absl::string_view name) const;
  // All kernels, or those of one op, sorted by name.
  std::vector<std::shared_ptr<const Kernel>> Kernels(absl::string_view op = {}) const;
  std::vector<PluginInfo> Plugins() const;
  std::vector<absl::Status> refusals() const;
  std::vector<std::string> searched() const;

  // The default plugin folders: next to the running executable
  // (<exe>/../lib/kreg/plugins) and the install prefix's.
  static std::vector<std::string> DefaultDirs();

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const Kernel>, std::less<>> kernels_
      ABSL_GUARDED_BY(mu_);
  std::vector<PluginInfo> plugins_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> refusals_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> searched_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREG_REGISTRY_REGISTRY_H_
