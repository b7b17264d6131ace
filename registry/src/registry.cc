// The registry: finding plugins, loading and checking them (under the
// load guard, load_guard.h), and registering their ops and kernels.
// Kernels and their runs are kernel.cc.
#include "kreg/registry.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "host_table.h"
#include "kreg/log.h"
#include "load_guard.h"
#include "loaded_plugin.h"
#include "op_internal.h"

#ifndef KREG_INSTALL_PLUGIN_DIR
#define KREG_INSTALL_PLUGIN_DIR ""
#endif
#ifndef KREG_INSTALL_LIBDIR  // relative to the prefix
#define KREG_INSTALL_LIBDIR "lib"
#endif

namespace kreg {

namespace fs = std::filesystem;
using op_internal::IsIdentifier;

LoadedPlugin::LoadedPlugin(std::string path, void* handle, const kreg_plugin* table)
    : path_(std::move(path)), handle_(handle), table_(table), name_(table->name),
      version_(table->version ? table->version : "") {}

LoadedPlugin::~LoadedPlugin() {
  if (initialised_ && KREG_HAS_FIELD(table_, kreg_plugin, fini) && table_->fini != nullptr) table_->fini();
  dlclose(handle_);
}


namespace {

std::string Quoted(const char* s) { return s ? absl::StrCat("'", s, "'") : "NULL"; }

absl::Status Refuse(const std::string& path, absl::string_view reason) {
  return absl::FailedPreconditionError(absl::StrCat("plugin ", path, " refused: ", reason));
}

// Which file a path named: device, inode, size and modification time.
using FileId = std::tuple<dev_t, ino_t, off_t, time_t, long>;

std::optional<FileId> IdOf(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
}

// The plugins this process keeps mapped, by the path they were opened by,
// with the file each path named then.
struct Mapped {
  absl::Mutex mu;
  std::map<std::string, std::optional<FileId>> files ABSL_GUARDED_BY(mu);
};

Mapped& MappedPlugins() {
  static auto* mapped = new Mapped;
  return *mapped;
}

// A plugin that passed its checks stays mapped until the process ends
// (RTLD_NODELETE; dlclose() then only drops a reference): from init on, its
// code may run on threads the host does not join. A threading runtime's
// worker finishes a task's last lines, in the plugin's code (oneTBB's
// parallel_for tasks are templates instantiated there), after it has woken
// the run that waited for the task, so unmapping the plugin when that run's
// caller lets go would pull code from under the worker.
void KeepMapped(const std::string& path) {
  if (void* again = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD | RTLD_NODELETE)) dlclose(again);
  Mapped& mapped = MappedPlugins();
  absl::MutexLock lock(&mapped.mu);
  if (!mapped.files.contains(path)) mapped.files.emplace(path, IdOf(path));  // the file it named when first kept
}

// dlopen() of a path this process has mapped answers the copy mapped then,
// whatever the file holds now: say so where the file was replaced since.
void WarnIfReplaced(const std::string& path) {
  Mapped& mapped = MappedPlugins();
  {
    absl::MutexLock lock(&mapped.mu);
    auto it = mapped.files.find(path);
    if (it == mapped.files.end() || it->second == IdOf(path)) return;
  }
  Log(LogLevel::kWarn, absl::StrCat("plugin ", path, " has changed on disk since this process loaded it; the copy "
                                    "loaded then stays in use (a plugin's code is never unloaded): restart the "
                                    "process to load the new one"));
}

}  // namespace

// ---- Registry --------------------------------------------------------------------

struct Registry::Opened {
  std::string path;
  std::shared_ptr<LoadedPlugin> plugin;
  std::vector<std::shared_ptr<const Op>> ops;
};

absl::StatusOr<Registry::Opened> Registry::Open(const std::string& path) const {
  Log(LogLevel::kDebug, absl::StrCat("loading plugin ", path));
  WarnIfReplaced(path);
  LoadingGuard guard(path);
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
  void* entry = dlsym(handle, KREG_PLUGIN_ENTRY);
  if (entry == nullptr) {
    for (int v = 9; v >= 1; --v) {
      if (v == KREG_ABI_VERSION || dlsym(handle, absl::StrCat("kreg_plugin_v", v).c_str()) == nullptr) continue;
      return refuse(absl::StrCat("it exports kreg_plugin_v", v, ", ABI v", v, "; this kreg speaks v",
                                 KREG_ABI_VERSION, v < KREG_ABI_VERSION ? " (rebuild the plugin against this kreg)"
                                                                        : " (upgrade kreg)"));
    }
    return refuse("no symbol " KREG_PLUGIN_ENTRY " (not a kreg plugin)");
  }
  const kreg_plugin* table = reinterpret_cast<kreg_plugin_entry>(entry)();
  if (table == nullptr) return refuse(KREG_PLUGIN_ENTRY "() returned NULL");
  if (table->struct_size < KREG_PLUGIN_MIN_SIZE) {
    return refuse(absl::StrCat("plugin table struct_size ", table->struct_size, " is smaller than the minimum ",
                               KREG_PLUGIN_MIN_SIZE));
  }
  if (table->abi_version != KREG_ABI_VERSION) {
    return refuse(absl::StrCat("it speaks ABI version ", table->abi_version, "; this kreg speaks version ",
                               KREG_ABI_VERSION));
  }
  if (!IsIdentifier(table->name)) return refuse(absl::StrCat("plugin name ", Quoted(table->name), " is not [a-z0-9_]+"));
  if (table->num_kernels > 0 && table->kernels == nullptr) return refuse("kernels is NULL");
  if (table->num_ops > 0 && table->ops == nullptr) return refuse("ops is NULL");
  for (size_t i = 0; i < table->num_kernels; ++i) {
    if (table->kernels[i] == nullptr) return refuse(absl::StrCat("kernel ", i, " is NULL"));
  }
  for (size_t i = 0; i < table->num_ops; ++i) {
    if (table->ops[i] == nullptr) return refuse(absl::StrCat("op ", i, " is NULL"));
  }
  KeepMapped(path);
  Opened opened;
  opened.path = path;
  opened.plugin = std::make_shared<LoadedPlugin>(path, handle, table);
  if (KREG_HAS_FIELD(table, kreg_plugin, init) && table->init != nullptr) {
    char msg[512] = "";
    const kreg_status code = table->init(&PlainHost(), msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    if (code != KREG_OK) return Refuse(path, absl::StrCat("init failed: ", FromAbi(code, msg).message()));
  }
  opened.plugin->set_initialised();
  for (size_t i = 0; i < table->num_ops; ++i) {
    absl::StatusOr<std::shared_ptr<const Op>> op = Op::Read(*table->ops[i], opened.plugin);
    if (!op.ok()) return Refuse(path, op.status().message());
    for (const auto& other : opened.ops) {
      if (other->name() == (*op)->name()) return Refuse(path, absl::StrCat("op ", other->name(), " is declared twice"));
    }
    opened.ops.push_back(*std::move(op));
  }
  return opened;
}

absl::Status Registry::AddOps(Opened& opened) {
  for (const auto& op : opened.ops) {
    if (auto it = ops_.find(op->name()); it != ops_.end()) {
      return Refuse(opened.path, absl::StrCat("op ", op->name(), " is already declared by ", it->second->plugin_path()));
    }
  }
  for (const auto& op : opened.ops) ops_.emplace(op->name(), op);
  return absl::OkStatus();
}

absl::Status Registry::AddKernels(Opened& opened, std::vector<absl::Status>* skipped) {
  const kreg_plugin* table = opened.plugin->table();
  std::vector<std::shared_ptr<const Kernel>> kernels;
  std::set<std::string> own;
  for (size_t i = 0; i < table->num_kernels; ++i) {
    const kreg_kernel& k = *table->kernels[i];
    auto bad = [&](absl::string_view why) { return Refuse(opened.path, absl::StrCat("kernel ", i, ": ", why)); };
    if (k.struct_size < KREG_KERNEL_MIN_SIZE) {
      return bad(absl::StrCat("struct_size ", k.struct_size, " is smaller than the minimum ", KREG_KERNEL_MIN_SIZE));
    }
    if (!IsIdentifier(k.op)) return bad(absl::StrCat("op ", Quoted(k.op), " is not [a-z0-9_]+"));
    if (!IsIdentifier(k.variant)) return bad(absl::StrCat("variant ", Quoted(k.variant), " is not [a-z0-9_]+"));
    const std::string name = absl::StrCat(k.op, "/", k.variant);
    auto op = ops_.find(k.op);
    if (op == ops_.end()) {
      std::vector<absl::string_view> known;
      for (const auto& [n, unused] : ops_) known.push_back(n);
      return bad(absl::StrCat(name, ": op '", k.op, "' is declared by no plugin loaded (known ops: ",
                              known.empty() ? "none" : absl::StrJoin(known, ", "), ")"));
    }
    if (k.version == 0) return bad(absl::StrCat(name, ": version must be >= 1"));
    if (k.run == nullptr) return bad(absl::StrCat(name, ": run is NULL"));
    if (k.num_params > 0 && k.params == nullptr) return bad(absl::StrCat(name, ": params is NULL"));
    std::vector<std::string> dims;
    for (const DimInfo& d : op->second->dims()) dims.push_back(d.name);
    std::vector<ParamInfo> params;
    for (size_t j = 0; j < k.num_params; ++j) {
      if (k.params[j] == nullptr) return bad(absl::StrCat(name, ": parameter ", j, " is NULL"));
      absl::StatusOr<ParamInfo> p = ReadParam(*k.params[j], dims, params);
      if (!p.ok()) return bad(absl::StrCat(name, ": parameter ", j, ": ", p.status().message()));
      for (const ParamInfo& q : params) {
        if (q.name == p->name) return bad(absl::StrCat(name, ": parameter '", q.name, "' is declared twice"));
      }
      params.push_back(*std::move(p));
    }
    if (!own.insert(name).second) return Refuse(opened.path, absl::StrCat(name, " is declared twice"));
    // A name registered already (by a plugin earlier on the path) keeps
    // that kernel: this one is skipped, the rest of its plugin loads.
    if (auto it = kernels_.find(name); it != kernels_.end()) {
      skipped->push_back(Refuse(opened.path, absl::StrCat("kernel ", name, " skipped: ", it->second->plugin_path(),
                                                          ", earlier on the plugin path, registers it")));
      continue;
    }
    kernels.push_back(std::make_shared<const Kernel>(opened.plugin, op->second, &k, ParamSpace(std::move(params))));
  }
  for (size_t i = 0; i < kernels.size(); ++i) {
    const auto& k = kernels[i];
    if (!k->is_reference()) continue;
    for (size_t j = 0; j < i; ++j) {
      if (kernels[j]->op() == k->op() && kernels[j]->is_reference()) {
        return Refuse(opened.path, absl::StrCat("op ", k->op(), " has two reference kernels, ", kernels[j]->name(),
                                                " and ", k->name()));
      }
    }
  }
  // An op keeps the reference kernel registered first.
  for (auto k = kernels.begin(); k != kernels.end();) {
    auto other = std::find_if(kernels_.begin(), kernels_.end(), [&](const auto& named) {
      return named.second->op() == (*k)->op() && named.second->is_reference();
    });
    if ((*k)->is_reference() && other != kernels_.end()) {
      skipped->push_back(Refuse(opened.path, absl::StrCat("kernel ", (*k)->name(), " skipped: op ", (*k)->op(),
                                                          " has a reference kernel already, ", other->second->name())));
      k = kernels.erase(k);
    } else {
      ++k;
    }
  }
  // A plugin left with nothing to register (every kernel registered
  // already) is not kept.
  if (kernels.empty() && opened.ops.empty() && table->num_kernels > 0) return absl::OkStatus();
  PluginInfo info{opened.path, opened.plugin->name(), opened.plugin->version(), {}, {}};
  for (const auto& op : opened.ops) info.ops.push_back(op->name());
  for (auto& k : kernels) {
    info.kernels.push_back(k->name());
    kernels_.emplace(k->name(), std::move(k));
  }
  Log(LogLevel::kInfo, absl::StrCat("loaded plugin ", info.name, " ", info.version, " from ", info.path, ": ",
                                     info.kernels.size(), " kernels, ", info.ops.size(), " ops"));
  plugins_.push_back(std::move(info));
  files_.push_back(opened.path);
  return absl::OkStatus();
}

std::vector<absl::Status> Registry::LoadPlugins(const std::vector<std::string>& paths) {
  std::vector<absl::Status> refused;
  std::vector<Opened> opened;
  for (const std::string& path : paths) {
    absl::StatusOr<Opened> o = Open(path);
    if (o.ok()) {
      opened.push_back(*std::move(o));
    } else {
      refused.push_back(o.status());
    }
  }
  absl::MutexLock lock(&mu_);
  // Ops first, so a plugin's kernels may use ops of plugins after it.
  std::vector<Opened*> with_ops;
  for (Opened& o : opened) {
    if (absl::Status s = AddOps(o); !s.ok()) {
      refused.push_back(s);
    } else {
      with_ops.push_back(&o);
    }
  }
  for (Opened* o : with_ops) {
    if (absl::Status s = AddKernels(*o, &refused); !s.ok()) {
      // All or nothing: its ops go too, unless kernels already use them.
      for (const auto& op : o->ops) {
        bool used = false;
        for (const auto& [n, k] : kernels_) used = used || k->op() == op->name();
        if (!used) ops_.erase(op->name());
      }
      refused.push_back(s);
    }
  }
  for (const absl::Status& s : refused) refusals_.push_back(s);
  return refused;
}

absl::Status Registry::LoadPlugin(const std::string& path) {
  std::vector<absl::Status> refused = LoadPlugins({path});
  return refused.empty() ? absl::OkStatus() : refused.front();
}

const std::string& InstallPrefix() {
  static const std::string* prefix = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&InstallPrefix), &info) == 0 || info.dli_fname == nullptr) {
      return new std::string();
    }
    std::error_code ec;
    fs::path dir = fs::canonical(info.dli_fname, ec).parent_path();
    if (ec) return new std::string();
    // Up one folder per component of the library folder ("lib",
    // "lib/x86_64-linux-gnu").
    for (fs::path part : fs::path(KREG_INSTALL_LIBDIR)) {
      if (!part.empty() && part != ".") dir = dir.parent_path();
    }
    return new std::string(dir.string());
  }();
  return *prefix;
}

std::vector<std::string> Registry::DefaultDirs() {
  std::vector<std::string> dirs;
  auto add = [&dirs](std::string dir) {
    if (!dir.empty() && std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(std::move(dir));
  };
  if (!InstallPrefix().empty()) add((fs::path(InstallPrefix()) / KREG_INSTALL_LIBDIR / "kreg" / "plugins").string());
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) add((exe.parent_path().parent_path() / "lib" / "kreg" / "plugins").string());
  add(KREG_INSTALL_PLUGIN_DIR);
  return dirs;
}

absl::StatusOr<std::unique_ptr<Registry>> Registry::Load(const LoadOptions& options) {
  auto registry = std::make_unique<Registry>();
  std::vector<std::string> searched;
  absl::StatusOr<std::vector<std::string>> files = FindPlugins(options, &searched);
  if (!files.ok()) return files.status();
  {
    absl::MutexLock lock(&registry->mu_);
    registry->searched_ = std::move(searched);
  }
  registry->LoadPlugins(*files);
  return registry;
}

absl::StatusOr<std::vector<std::string>> Registry::PluginFiles(const LoadOptions& options) {
  std::vector<std::string> searched;
  return FindPlugins(options, &searched);
}

absl::StatusOr<std::vector<std::string>> Registry::FindPlugins(const LoadOptions& options,
                                                               std::vector<std::string>* searched) {
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

  std::set<std::string> loaded_names;  // file names, for shadowing
  std::vector<std::string> files;
  for (const Location& loc : locations) {
    std::error_code ec;
    std::vector<fs::path> found;
    if (fs::is_directory(loc.path, ec)) {
      for (const fs::directory_entry& e : fs::directory_iterator(loc.path, ec)) {
        if (e.path().extension() == ".so") found.push_back(e.path());
      }
      std::sort(found.begin(), found.end());
    } else if (fs::exists(loc.path, ec)) {
      found.push_back(loc.path);
    } else if (loc.explicit_path) {
      return absl::NotFoundError(absl::StrCat("plugin path '", loc.path, "' does not exist"));
    } else {
      continue;
    }
    searched->push_back(loc.path);
    Log(LogLevel::kDebug, absl::StrCat("plugin location ", loc.path, ": ", found.size(), " files"));
    for (const fs::path& file : found) {
      if (loaded_names.insert(file.filename().string()).second) files.push_back(file.string());
    }
  }
  return files;
}

absl::StatusOr<std::shared_ptr<const Op>> Registry::GetOp(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = ops_.find(name);
  if (it != ops_.end()) return it->second;
  std::vector<absl::string_view> known;
  for (const auto& [n, op] : ops_) known.push_back(n);
  return absl::NotFoundError(absl::StrCat("unknown op '", name, "' (ops the loaded plugins declare: ",
                                          known.empty() ? "none" : absl::StrJoin(known, ", "), ")"));
}

std::vector<std::shared_ptr<const Op>> Registry::Ops() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const Op>> out;
  for (const auto& [n, op] : ops_) out.push_back(op);
  return out;
}

std::shared_ptr<const Kernel> Registry::Reference(absl::string_view op) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [n, k] : kernels_) {
    if (k->op() == op && k->is_reference()) return k;
  }
  return nullptr;
}

std::vector<std::string> Registry::Files() const {
  absl::MutexLock lock(&mu_);
  return files_;
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
