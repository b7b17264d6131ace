#include "kreg/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <set>

#include <oneapi/tbb/task_arena.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/ops.h"

#ifndef KREG_INSTALL_PLUGIN_DIR
#define KREG_INSTALL_PLUGIN_DIR ""
#endif

namespace kreg {

namespace fs = std::filesystem;

// A dlopen()ed plugin; dlclose()d when the last kernel referring to it goes.
class LoadedPlugin {
 public:
  LoadedPlugin(std::string path, void* handle, const kreg_plugin* table)
      : path_(std::move(path)), handle_(handle), table_(table),
        name_(table->name), version_(table->version ? table->version : "") {}
  ~LoadedPlugin() { dlclose(handle_); }
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const kreg_plugin* table() const { return table_; }

 private:
  std::string path_;
  void* handle_;
  const kreg_plugin* table_;
  std::string name_;
  std::string version_;
};

absl::Status FromAbi(kreg_status code, absl::string_view message) {
  std::string msg(message.empty() ? "(no message)" : message);
  switch (code) {
    case KREG_OK:
      return absl::OkStatus();
    case KREG_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(msg);
    case KREG_UNIMPLEMENTED:
      return absl::UnimplementedError(msg);
    case KREG_RESOURCE_EXHAUSTED:
      return absl::ResourceExhaustedError(msg);
    case KREG_CANCELLED:
      return absl::CancelledError(msg);
    case KREG_INTERNAL:
      return absl::InternalError(msg);
  }
  return absl::UnknownError(absl::StrCat("unknown kreg_status ", static_cast<int>(code), ": ", msg));
}

namespace {

struct IsaName {
  uint32_t bit;
  const char* name;
};
constexpr IsaName kIsaNames[] = {
    {KREG_ISA_AVX2, "avx2"},           {KREG_ISA_FMA, "fma"},
    {KREG_ISA_AVX512F, "avx512f"},     {KREG_ISA_AVX512BW, "avx512bw"},
    {KREG_ISA_AVX512VL, "avx512vl"},   {KREG_ISA_AVX512DQ, "avx512dq"},
    {KREG_ISA_AVX512BF16, "avx512bf16"}, {KREG_ISA_AVX512VNNI, "avx512vnni"},
};

uint32_t DetectIsa() {
  uint32_t bits = 0;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) bits |= KREG_ISA_AVX2;
  if (__builtin_cpu_supports("fma")) bits |= KREG_ISA_FMA;
  if (__builtin_cpu_supports("avx512f")) bits |= KREG_ISA_AVX512F;
  if (__builtin_cpu_supports("avx512bw")) bits |= KREG_ISA_AVX512BW;
  if (__builtin_cpu_supports("avx512vl")) bits |= KREG_ISA_AVX512VL;
  if (__builtin_cpu_supports("avx512dq")) bits |= KREG_ISA_AVX512DQ;
  if (__builtin_cpu_supports("avx512bf16")) bits |= KREG_ISA_AVX512BF16;
  if (__builtin_cpu_supports("avx512vnni")) bits |= KREG_ISA_AVX512VNNI;
  // Lets tests and users pretend the CPU lacks extensions, e.g.
  // KREG_ISA_MASK=avx2,fma to see what a machine without AVX-512 would run.
  if (const char* mask = std::getenv("KREG_ISA_MASK")) {
    uint32_t allowed = 0;
    for (absl::string_view name : absl::StrSplit(mask, ',', absl::SkipEmpty())) {
      for (const IsaName& isa : kIsaNames) {
        if (name == isa.name) allowed |= isa.bit;
      }
    }
    bits &= allowed;
  }
  return bits;
}

bool IsIdentifier(const char* s) {
  if (s == nullptr || *s == '\0') return false;
  for (; *s; ++s) {
    if (!absl::ascii_islower(*s) && !absl::ascii_isdigit(*s) && *s != '_') return false;
  }
  return true;
}

std::string Quoted(const char* s) { return s ? absl::StrCat("'", s, "'") : "NULL"; }

// Checks one parameter descriptor; returns the problem or "".
std::string CheckParam(const kreg_param_desc& p) {
  if (p.struct_size < sizeof(kreg_param_desc)) {
    return absl::StrCat("struct_size ", p.struct_size, " is smaller than ABI v1's ",
                        sizeof(kreg_param_desc));
  }
  if (!IsIdentifier(p.name)) return absl::StrCat("name ", Quoted(p.name), " is not [a-z0-9_]+");
  switch (p.kind) {
    case KREG_PARAM_INT: {
      if (p.values == nullptr || p.num_values == 0) return "an int parameter with no legal values";
      if (std::find(p.values, p.values + p.num_values, p.default_value) ==
          p.values + p.num_values) {
        return absl::StrCat("default ", p.default_value, " is not among its legal values");
      }
      return "";
    }
    case KREG_PARAM_INT_LIST: {
      if (p.values == nullptr || p.num_values == 0) return "a list parameter with no candidate values";
      if (p.default_list_len > 0 && p.default_list == nullptr) return "default_list is NULL";
      for (size_t i = 0; i < p.default_list_len; ++i) {
        if (i > 0 && p.default_list[i] <= p.default_list[i - 1]) return "default list is not increasing";
      }
      return "";
    }
    case KREG_PARAM_CHOICE: {
      if (p.choices == nullptr || p.num_choices == 0) return "a choice parameter with no choices";
      for (size_t i = 0; i < p.num_choices; ++i) {
        if (!IsIdentifier(p.choices[i])) return absl::StrCat("choice ", i, " is not [a-z0-9_]+");
      }
      if (p.default_value < 0 || static_cast<size_t>(p.default_value) >= p.num_choices) {
        return absl::StrCat("default choice index ", p.default_value, " is out of range");
      }
      return "";
    }
  }
  return absl::StrCat("unknown parameter kind ", static_cast<int>(p.kind));
}

// Checks one kernel descriptor; returns the problem or "".
std::string CheckKernel(const kreg_kernel& k) {
  if (k.struct_size < sizeof(kreg_kernel)) {
    return absl::StrCat("struct_size ", k.struct_size, " is smaller than ABI v1's ",
                        sizeof(kreg_kernel));
  }
  if (!IsIdentifier(k.op)) return absl::StrCat("op ", Quoted(k.op), " is not [a-z0-9_]+");
  if (!IsIdentifier(k.variant)) {
    return absl::StrCat("variant ", Quoted(k.variant), " is not [a-z0-9_]+");
  }
  std::string name = absl::StrCat(k.op, "/", k.variant);
  if (FindOp(k.op) == nullptr) {
    std::vector<absl::string_view> known;
    for (const OpInfo* op : AllOps()) known.push_back(op->name);
    return absl::StrCat(name, ": op '", k.op, "' is not known to this kreg (known: ",
                        absl::StrJoin(known, ", "), ")");
  }
  if (k.version == 0) return absl::StrCat(name, ": version must be >= 1");
  if (k.run == nullptr) return absl::StrCat(name, ": run is NULL");
  if (k.num_params > 0 && k.params == nullptr) return absl::StrCat(name, ": params is NULL");
  std::set<absl::string_view> seen;
  for (size_t i = 0; i < k.num_params; ++i) {
    std::string problem = CheckParam(k.params[i]);
    if (!problem.empty()) return absl::StrCat(name, ": parameter ", i, ": ", problem);
    if (!seen.insert(k.params[i].name).second) {
      return absl::StrCat(name, ": parameter '", k.params[i].name, "' is declared twice");
    }
  }
  return "";
}

absl::Status Refuse(const std::string& path, absl::string_view reason) {
  return absl::FailedPreconditionError(absl::StrCat("plugin ", path, " refused: ", reason));
}

}  // namespace

uint32_t CpuIsa() {
  static const uint32_t bits = DetectIsa();
  return bits;
}

std::string IsaString(uint32_t bits) {
  std::vector<std::string> names;
  for (const IsaName& isa : kIsaNames) {
    if (bits & isa.bit) names.push_back(isa.name);
  }
  if (bits & ~static_cast<uint32_t>(KREG_ISA_KNOWN_MASK)) {
    names.push_back(absl::StrCat("unknown(0x", absl::Hex(bits & ~KREG_ISA_KNOWN_MASK), ")"));
  }
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

// ---- Config and Workspace ------------------------------------------------

Config::Config(std::vector<ParamValue> values) : values_(std::move(values)) {}

Config::AbiView::AbiView(const Config& config) : values_(config.values().size()) {
  for (size_t i = 0; i < values_.size(); ++i) {
    const ParamValue& v = config.values()[i];
    values_[i] = {v.value, v.list.data(), v.list.size()};
  }
  config_ = {sizeof(kreg_config), values_.data(), values_.size()};
}

void Workspace::Free::operator()(void* p) const { std::free(p); }

void* Workspace::Get(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > size_) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) return nullptr;
    data_.reset(static_cast<unsigned char*>(p));
    size_ = rounded;
  }
  return data_.get();
}

// ---- Kernel ---------------------------------------------------------------

Kernel::Kernel(std::shared_ptr<const LoadedPlugin> plugin, const kreg_kernel* desc)
    : plugin_(std::move(plugin)), desc_(desc),
      name_(absl::StrCat(desc->op, "/", desc->variant)) {}

bool Kernel::available() const {
  uint32_t need = desc_->required_isa;
  return (need & ~static_cast<uint32_t>(KREG_ISA_KNOWN_MASK)) == 0 && (need & ~CpuIsa()) == 0;
}

const std::string& Kernel::plugin_path() const { return plugin_->path(); }
const std::string& Kernel::plugin_name() const { return plugin_->name(); }

int Kernel::FindParam(absl::string_view name) const {
  for (size_t i = 0; i < num_params(); ++i) {
    if (name == param(i).name) return static_cast<int>(i);
  }
  return -1;
}

Config Kernel::DefaultConfig() const {
  std::vector<ParamValue> values(num_params());
  for (size_t i = 0; i < num_params(); ++i) {
    const kreg_param_desc& p = param(i);
    values[i].value = p.default_value;
    if (p.kind == KREG_PARAM_INT_LIST) {
      values[i].list.assign(p.default_list, p.default_list + p.default_list_len);
    }
  }
  return Config(std::move(values));
}

absl::StatusOr<Config> Kernel::ParseConfig(
    const std::vector<std::pair<std::string, std::string>>& overrides) const {
  Config config = DefaultConfig();
  for (const auto& [name, text] : overrides) {
    int i = FindParam(name);
    if (i < 0) {
      std::vector<absl::string_view> known;
      for (size_t j = 0; j < num_params(); ++j) known.push_back(param(j).name);
      return absl::InvalidArgumentError(absl::StrCat(
          name_, " has no parameter '", name, "' (parameters: ",
          known.empty() ? "none" : absl::StrJoin(known, ", "), ")"));
    }
    const kreg_param_desc& p = param(i);
    ParamValue& v = config.mutable_values()[i];
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", name, "' of ", name_, ": ", why));
    };
    auto legal = [&](int64_t x) {
      return std::find(p.values, p.values + p.num_values, x) != p.values + p.num_values;
    };
    std::string legal_list = absl::StrJoin(p.values, p.values + p.num_values, ", ");
    if (p.kind == KREG_PARAM_INT) {
      if (!absl::SimpleAtoi(text, &v.value)) return bad(absl::StrCat("'", text, "' is not an integer"));
      if (!legal(v.value)) {
        return bad(absl::StrCat(v.value, " is not one of ", legal_list));
      }
    } else if (p.kind == KREG_PARAM_INT_LIST) {
      v.list.clear();
      for (absl::string_view item : absl::StrSplit(text, absl::ByAnyChar(",:"), absl::SkipEmpty())) {
        int64_t x;
        if (!absl::SimpleAtoi(item, &x)) return bad(absl::StrCat("'", item, "' is not an integer"));
        if (!legal(x)) return bad(absl::StrCat(x, " is not one of ", legal_list));
        if (!v.list.empty() && x <= v.list.back()) return bad("the list must be increasing");
        v.list.push_back(x);
      }
    } else {
      auto it = std::find_if(p.choices, p.choices + p.num_choices,
                             [&](const char* c) { return text == c; });
      if (it == p.choices + p.num_choices) {
        return bad(absl::StrCat("'", text, "' is not one of ",
                                absl::StrJoin(p.choices, p.choices + p.num_choices, ", ")));
      }
      v.value = it - p.choices;
    }
  }
  return config;
}

std::vector<std::pair<std::string, std::string>> Kernel::ConfigPairs(const Config& config) const {
  std::vector<std::pair<std::string, std::string>> parts;
  for (size_t i = 0; i < num_params() && i < config.values().size(); ++i) {
    const kreg_param_desc& p = param(i);
    const ParamValue& v = config.values()[i];
    std::string value;
    if (p.kind == KREG_PARAM_INT) value = absl::StrCat(v.value);
    if (p.kind == KREG_PARAM_INT_LIST) value = absl::StrJoin(v.list, ",");
    if (p.kind == KREG_PARAM_CHOICE) {
      value = v.value >= 0 && static_cast<size_t>(v.value) < p.num_choices
                  ? p.choices[v.value] : absl::StrCat("#", v.value);
    }
    parts.emplace_back(p.name, std::move(value));
  }
  return parts;
}

std::string Kernel::ConfigString(const Config& config) const {
  return absl::StrJoin(ConfigPairs(config), " ", absl::PairFormatter("="));
}

absl::Status Kernel::Check(const Config& config, const void* args) const {
  const OpInfo* op = FindOp(desc_->op);
  if (absl::Status s = op->validate(args); !s.ok()) return s;
  if (config.values().size() != num_params()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, " takes ", num_params(), " parameters, the config has ", config.values().size()));
  }
  // Every value is one the descriptor declares, so kernels never see others.
  for (size_t i = 0; i < num_params(); ++i) {
    const kreg_param_desc& p = param(i);
    const ParamValue& v = config.values()[i];
    auto declared = [&](int64_t x) {
      return std::find(p.values, p.values + p.num_values, x) != p.values + p.num_values;
    };
    bool ok = true;
    if (p.kind == KREG_PARAM_INT) ok = declared(v.value);
    if (p.kind == KREG_PARAM_CHOICE) ok = v.value >= 0 && static_cast<size_t>(v.value) < p.num_choices;
    if (p.kind == KREG_PARAM_INT_LIST) {
      for (size_t j = 0; j < v.list.size() && ok; ++j) ok = declared(v.list[j]) && (j == 0 || v.list[j] > v.list[j - 1]);
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": parameter '", p.name, "' holds a value it does not declare"));
    }
  }
  if (desc_->check == nullptr) return absl::OkStatus();
  char msg[512] = "";
  kreg_status code = desc_->check(Config::AbiView(config).get(), args, msg, sizeof msg);
  if (code == KREG_OK) return absl::OkStatus();
  msg[sizeof msg - 1] = '\0';
  return FromAbi(code, absl::StrCat(name_, " [", ConfigString(config), "]: ", msg));
}

namespace {
int PollCancel(void* ctx) { return static_cast<const std::atomic<int>*>(ctx)->load(std::memory_order_relaxed); }
}  // namespace

absl::Status Kernel::Run(const Config& config, const void* args,
                         const RunOptions& options) const {
  if (!available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, " needs ", IsaString(required_isa() & ~CpuIsa()), ", which this CPU lacks"));
  }
  if (absl::Status s = Check(config, args); !s.ok()) return s;
  char msg[512] = "";
  size_t bytes = 0;
  const Config::AbiView abi(config);
  if (desc_->workspace_bytes != nullptr) {
    kreg_status code = desc_->workspace_bytes(abi.get(), args, &bytes, msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    if (code != KREG_OK) return FromAbi(code, absl::StrCat(name_, ": ", msg));
  }
  Workspace local;
  Workspace* ws = options.workspace ? options.workspace : &local;
  void* workspace = ws->Get(bytes);
  if (bytes > 0 && workspace == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, ": cannot allocate ", bytes, " bytes of workspace"));
  }
  kreg_host host{};
  host.struct_size = sizeof host;
  host.num_threads = options.num_threads;
  host.isa = CpuIsa();
  if (options.cancel_flag != nullptr) {
    host.ctx = const_cast<std::atomic<int>*>(options.cancel_flag);
    host.cancelled = PollCancel;
  }
  kreg_status code;
  auto run = [&] { code = desc_->run(abi.get(), args, workspace, bytes, &host, msg, sizeof msg); };
  if (options.num_threads > 0) {
    // oneTBB plugins run inside the host's arena of that many threads.
    tbb::task_arena arena(options.num_threads);
    arena.execute(run);
  } else {
    run();
  }
  msg[sizeof msg - 1] = '\0';
  if (code != KREG_OK) return FromAbi(code, absl::StrCat(name_, ": ", msg));
  return absl::OkStatus();
}

// ---- Registry -------------------------------------------------------------

absl::Status Registry::LoadPlugin(const std::string& path) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return Refuse(path, absl::StrCat("cannot be loaded: ", err ? err : "unknown dlopen error"));
  }
  auto refuse = [&](absl::string_view reason) {
    dlclose(handle);
    return Refuse(path, reason);
  };
  void* entry = dlsym(handle, KREG_PLUGIN_ENTRY_V1);
  if (entry == nullptr) {
    for (int v = 9; v >= 2; --v) {
      if (dlsym(handle, absl::StrCat("kreg_plugin_v", v).c_str()) != nullptr) {
        return refuse(absl::StrCat("it exports kreg_plugin_v", v, ", a newer ABI than this kreg speaks (v",
                                   KREG_ABI_VERSION, ")"));
      }
    }
    return refuse("no symbol " KREG_PLUGIN_ENTRY_V1 " (not a kreg plugin, or built for another ABI)");
  }
  const kreg_plugin* table = reinterpret_cast<kreg_plugin_entry_v1>(entry)();
  if (table == nullptr) return refuse(KREG_PLUGIN_ENTRY_V1 "() returned NULL");
  if (table->struct_size < sizeof(kreg_plugin)) {
    return refuse(absl::StrCat("plugin table struct_size ", table->struct_size,
                               " is smaller than ABI v1's ", sizeof(kreg_plugin)));
  }
  if (table->abi_version != KREG_ABI_VERSION) {
    return refuse(absl::StrCat("it speaks ABI version ", table->abi_version,
                               "; this kreg speaks version ", KREG_ABI_VERSION));
  }
  if (!IsIdentifier(table->name)) {
    return refuse(absl::StrCat("plugin name ", Quoted(table->name), " is not [a-z0-9_]+"));
  }
  if (table->num_kernels > 0 && table->kernels == nullptr) return refuse("kernels is NULL");
  std::set<std::string> own;
  for (size_t i = 0; i < table->num_kernels; ++i) {
    std::string problem = CheckKernel(table->kernels[i]);
    if (!problem.empty()) return refuse(absl::StrCat("kernel ", i, ": ", problem));
    std::string name = absl::StrCat(table->kernels[i].op, "/", table->kernels[i].variant);
    if (!own.insert(name).second) return refuse(absl::StrCat(name, " is declared twice"));
  }

  absl::MutexLock lock(&mu_);
  for (const std::string& name : own) {
    auto it = kernels_.find(name);
    if (it != kernels_.end()) {
      return refuse(absl::StrCat("duplicate kernel ", name, ": already registered by ",
                                 it->second->plugin_path()));
    }
  }
  auto plugin = std::make_shared<const LoadedPlugin>(path, handle, table);
  PluginInfo info{path, plugin->name(), plugin->version(), {}};
  for (size_t i = 0; i < table->num_kernels; ++i) {
    auto kernel = std::make_shared<const Kernel>(plugin, &table->kernels[i]);
    info.kernels.push_back(kernel->name());
    kernels_.emplace(kernel->name(), std::move(kernel));
  }
  plugins_.push_back(std::move(info));
  return absl::OkStatus();
}

std::vector<std::string> Registry::DefaultDirs() {
  std::vector<std::string> dirs;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back((exe.parent_path().parent_path() / "lib" / "kreg" / "plugins").string());
  std::string installed = KREG_INSTALL_PLUGIN_DIR;
  if (!installed.empty() && std::find(dirs.begin(), dirs.end(), installed) == dirs.end()) {
    dirs.push_back(installed);
  }
  return dirs;
}

absl::StatusOr<std::unique_ptr<Registry>> Registry::Load(const LoadOptions& options) {
  struct Location {
    std::string path;
    bool explicit_path;
  };
  std::vector<Location> locations;
  for (const std::string& p : options.plugin_paths) {
    for (absl::string_view part : absl::StrSplit(p, ':', absl::SkipEmpty())) {
      locations.push_back({std::string(part), true});
    }
  }
  if (options.use_env) {
    if (const char* env = std::getenv("KREG_PLUGIN_PATH")) {
      for (absl::string_view part : absl::StrSplit(env, ':', absl::SkipEmpty())) {
        locations.push_back({std::string(part), false});
      }
    }
  }
  if (options.use_default_dirs) {
    for (std::string& dir : DefaultDirs()) {
      locations.push_back({std::move(dir), false});
    }
  }

  auto registry = std::make_unique<Registry>();
  std::set<std::string> loaded_names;  // file names, for shadowing
  for (const Location& loc : locations) {
    std::error_code ec;
    std::vector<fs::path> files;
    if (fs::is_directory(loc.path, ec)) {
      for (const fs::directory_entry& e : fs::directory_iterator(loc.path, ec)) {
        if (e.path().extension() == ".so") files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
    } else if (fs::exists(loc.path, ec)) {
      files.push_back(loc.path);
    } else if (loc.explicit_path) {
      return absl::NotFoundError(absl::StrCat("plugin path '", loc.path, "' does not exist"));
    } else {
      continue;
    }
    {
      absl::MutexLock lock(&registry->mu_);
      registry->searched_.push_back(loc.path);
    }
    for (const fs::path& file : files) {
      if (!loaded_names.insert(file.filename().string()).second) continue;
      absl::Status s = registry->LoadPlugin(file.string());
      if (!s.ok()) {
        absl::MutexLock lock(&registry->mu_);
        registry->refusals_.push_back(std::move(s));
      }
    }
  }
  return registry;
}

absl::StatusOr<std::shared_ptr<const Kernel>> Registry::Get(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = kernels_.find(name);
  if (it != kernels_.end()) return it->second;
  absl::string_view op = name.substr(0, name.find('/'));
  std::vector<absl::string_view> same_op;
  for (const auto& [n, k] : kernels_) {
    if (k->op() == op) same_op.push_back(n);
  }
  if (same_op.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no kernel '", name, "': no plugin loaded provides op '", op, "'"));
  }
  return absl::NotFoundError(absl::StrCat("no kernel '", name, "' (known ", op, " kernels: ",
                                          absl::StrJoin(same_op, ", "), ")"));
}

std::vector<std::shared_ptr<const Kernel>> Registry::Kernels(absl::string_view op) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const Kernel>> out;
  for (const auto& [name, kernel] : kernels_) {
    if (op.empty() || kernel->op() == op) out.push_back(kernel);
  }
  return out;
}

std::vector<PluginInfo> Registry::Plugins() const {
  absl::MutexLock lock(&mu_);
  return plugins_;
}

std::vector<absl::Status> Registry::refusals() const {
  absl::MutexLock lock(&mu_);
  return refusals_;
}

std::vector<std::string> Registry::searched() const {
  absl::MutexLock lock(&mu_);
  return searched_;
}

}  // namespace kreg
