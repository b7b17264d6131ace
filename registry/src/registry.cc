#include "kreg/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <new>
#include <set>
#include <thread>

#include <oneapi/tbb/task_arena.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/limits.h"
#include "kreg/log.h"
#include "loaded_plugin.h"

#ifndef KREG_INSTALL_PLUGIN_DIR
#define KREG_INSTALL_PLUGIN_DIR ""
#endif
#ifndef KREG_INSTALL_LIBDIR  // relative to the prefix
#define KREG_INSTALL_LIBDIR "lib"
#endif

namespace kreg {

namespace fs = std::filesystem;

LoadedPlugin::LoadedPlugin(std::string path, void* handle, const kreg_plugin* table)
    : path_(std::move(path)), handle_(handle), table_(table), name_(table->name),
      version_(table->version ? table->version : "") {}

LoadedPlugin::~LoadedPlugin() {
  if (initialised_ && KREG_HAS_FIELD(table_, kreg_plugin, fini) && table_->fini != nullptr) table_->fini();
  dlclose(handle_);
}

namespace {

// A kernel's message about itself: "NAME: message", unless the kernel
// already put its name first.
std::string About(absl::string_view name, absl::string_view what, const char* msg) {
  absl::string_view m = msg;
  if (absl::StartsWith(m, name) && absl::StartsWith(m.substr(name.size()), ": ")) m.remove_prefix(name.size() + 2);
  return absl::StrCat(name, what, ": ", m);
}

}  // namespace

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
    case KREG_UNAVAILABLE:
      return absl::UnavailableError(msg);
  }
  return absl::UnknownError(absl::StrCat("unknown kreg_status ", static_cast<int>(code), ": ", msg));
}

namespace {

bool IsIdentifier(const char* s) {
  if (s == nullptr || *s == '\0') return false;
  for (; *s; ++s) {
    if (!absl::ascii_islower(*s) && !absl::ascii_isdigit(*s) && *s != '_') return false;
  }
  return true;
}

std::string Quoted(const char* s) { return s ? absl::StrCat("'", s, "'") : "NULL"; }

absl::Status Refuse(const std::string& path, absl::string_view reason) {
  return absl::FailedPreconditionError(absl::StrCat("plugin ", path, " refused: ", reason));
}

// The host table a kernel call sees, and what its function pointers reach.
struct HostCallbacks {
  static int Cancelled(void* ctx);
  static void Log(void* ctx, int level, const char* message);
  static void* Alloc(void* ctx, size_t bytes, size_t alignment);
  static void Free(void* ctx, void* p);
  static kreg_status Dispatch(void* ctx, const char* op, const kreg_args* args, char* msg, size_t cap);
};

}  // namespace

// ---- Workspace -----------------------------------------------------------------

void Workspace::Free::operator()(void* p) const { std::free(p); }

void* Workspace::Get(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > size_) {
    if (bytes > SIZE_MAX - 63) return nullptr;  // rounding up would wrap
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) return nullptr;
    data_.reset(static_cast<unsigned char*>(p));
    size_ = rounded;
  }
  return data_.get();
}

// ---- The host table ------------------------------------------------------------

struct PreparedRun::HostContext {
  std::string kernel;
  RunOptions options;
  kreg_host host{};
};

namespace {

int HostCallbacks::Cancelled(void* ctx) {
  const auto* c = static_cast<const PreparedRun::HostContext*>(ctx);
  return c->options.cancel_flag != nullptr && c->options.cancel_flag->load(std::memory_order_relaxed) != 0;
}

void HostCallbacks::Log(void* ctx, int level, const char* message) {
  const auto* c = static_cast<const PreparedRun::HostContext*>(ctx);
  absl::string_view text = message ? message : "";
  if (c->options.log) {
    c->options.log(level, text);
  } else {
    kreg::Log(level > 0 ? LogLevel::kWarn : LogLevel::kInfo, absl::StrCat(c->kernel, ": ", text));
  }
}

void* HostCallbacks::Alloc(void*, size_t bytes, size_t alignment) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return nullptr;
  if (bytes == 0) bytes = 1;
  if (bytes > SIZE_MAX - alignment) return nullptr;
  return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
}

void HostCallbacks::Free(void*, void* p) { std::free(p); }

kreg_status HostCallbacks::Dispatch(void* ctx, const char* op, const kreg_args* args, char* msg, size_t cap) {
  const auto* c = static_cast<const PreparedRun::HostContext*>(ctx);
  absl::Status s;
  if (!c->options.dispatch) {
    s = absl::UnimplementedError("this host runs no dispatcher (run the kernel through a Dispatcher)");
  } else if (op == nullptr || args == nullptr) {
    s = absl::InvalidArgumentError("dispatch: op or args is NULL");
  } else {
    s = c->options.dispatch(op, *args);
  }
  if (s.ok()) return KREG_OK;
  std::snprintf(msg, cap, "%s", std::string(s.message()).c_str());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return KREG_INVALID_ARGUMENT;
    case absl::StatusCode::kUnimplemented:
      return KREG_UNIMPLEMENTED;
    case absl::StatusCode::kResourceExhausted:
      return KREG_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kCancelled:
      return KREG_CANCELLED;
    case absl::StatusCode::kUnavailable:
      return KREG_UNAVAILABLE;
    default:
      return KREG_INTERNAL;
  }
}

std::unique_ptr<PreparedRun::HostContext> MakeHost(const std::string& kernel, const RunOptions& options) {
  auto c = std::make_unique<PreparedRun::HostContext>();
  c->kernel = kernel;
  c->options = options;
  kreg_host& h = c->host;
  h.struct_size = sizeof(kreg_host);
  h.ctx = c.get();
  h.num_threads = options.num_threads;
  h.isa = CpuIsa();
  h.cancelled = HostCallbacks::Cancelled;
  h.log = HostCallbacks::Log;
  h.alloc = HostCallbacks::Alloc;
  h.free = HostCallbacks::Free;
  h.dispatch = HostCallbacks::Dispatch;
  h.comm = options.comm;
  h.device = options.device;
  return c;
}

// A host table for calls outside a run (check, workspace_bytes, init).
const kreg_host& PlainHost() {
  static const PreparedRun::HostContext* const context = MakeHost("kreg", {}).release();
  return context->host;
}

}  // namespace

// ---- Kernel ---------------------------------------------------------------------

Kernel::Kernel(std::shared_ptr<const LoadedPlugin> plugin, std::shared_ptr<const Op> op,
               const kreg_kernel* desc, ParamSpace params)
    : plugin_(std::move(plugin)), op_(std::move(op)), desc_(desc),
      name_(absl::StrCat(desc->op, "/", desc->variant)), variant_(desc->variant),
      doc_(desc->doc ? desc->doc : ""), flags_(desc->flags), params_(std::move(params)) {
  if (KREG_HAS_FIELD(desc, kreg_kernel, release)) {
    prepare_ = desc->prepare;
    release_ = desc->release;
  }
  if (KREG_HAS_FIELD(desc, kreg_kernel, device)) device_ = desc->device;
}

bool Kernel::available() const {
  if (device_ != 0) return false;  // it runs on its device, not here (kreg/device.h: CanRun)
  const uint32_t need = desc_->required_isa;
  return (need & ~static_cast<uint32_t>(KREG_ISA_KNOWN_MASK)) == 0 && (need & ~CpuIsa()) == 0;
}

const std::string& Kernel::plugin_path() const { return plugin_->path(); }
const std::string& Kernel::plugin_name() const { return plugin_->name(); }

Config Kernel::DefaultConfig() const { return params_.Default(CpuIsa()); }

absl::StatusOr<Config> Kernel::ParseConfig(
    const std::vector<std::pair<std::string, std::string>>& overrides) const {
  return params_.Parse(overrides, name_, CpuIsa());
}

absl::Status Kernel::Check(const Config& config, const kreg_args& args) const {
  // A CPU kernel on device tensors, or a device kernel on CPU ones.
  const bool on_device = (args.flags & KREG_ARGS_ON_DEVICE) != 0;
  if (device_ != 0 && !on_device && !(args.flags & KREG_ARGS_SHAPE_ONLY)) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " runs on a CUDA device (run it with --device cuda)"));
  }
  if (device_ == 0 && on_device) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " runs on the CPU, not on a device"));
  }
  if (absl::Status s = op_->Validate(args); !s.ok()) return s;
  return CheckConfig(config, args);
}

absl::Status Kernel::CheckConfig(const Config& config, const kreg_args& args) const {
  if (absl::Status s = params_.Validate(config, name_, CpuIsa(), args.dims); !s.ok()) return s;
  if (desc_->check == nullptr) return absl::OkStatus();
  char msg[512] = "";
  const Config::AbiView abi(config);
  const kreg_status code = desc_->check(abi.get(), &args, &PlainHost(), msg, sizeof msg);
  if (code == KREG_OK) return absl::OkStatus();
  msg[sizeof msg - 1] = '\0';
  return FromAbi(code, About(name_, absl::StrCat(" [", ConfigString(config), "]"), msg));
}

absl::StatusOr<std::unique_ptr<PreparedRun>> Kernel::Prepare(const Config& config, const kreg_args& args,
                                                             const RunOptions& options) const {
  if (device_ == 0 && !available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, " needs ", IsaString(required_isa() & ~CpuIsa()), ", which this CPU lacks"));
  }
  if (args.flags & KREG_ARGS_SHAPE_ONLY) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": shape-only arguments cannot run"));
  }
  if (absl::Status s = Check(config, args); !s.ok()) return s;
  auto run = std::unique_ptr<PreparedRun>(new PreparedRun());
  run->kernel_ = this;
  run->abi_ = std::make_unique<Config::AbiView>(config);
  run->args_ = &args;
  if (options.num_threads > 0) run->arena_ = std::make_unique<PreparedRun::Arena>(options.num_threads);
  run->host_ = MakeHost(name_, options);
  char msg[512] = "";
  if (desc_->workspace_bytes != nullptr) {
    const kreg_status code =
        desc_->workspace_bytes(run->abi_->get(), &args, &run->host_->host, &run->workspace_bytes_, msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    if (code != KREG_OK) return FromAbi(code, About(name_, "", msg));
  }
  Workspace* ws = options.workspace ? options.workspace : &run->own_workspace_;
  run->workspace_ = ws->Get(run->workspace_bytes_);
  if (run->workspace_bytes_ > 0 && run->workspace_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, ": cannot allocate ", run->workspace_bytes_, " bytes of workspace"));
  }
  if (prepare_ != nullptr) {
    const kreg_status code = prepare_(run->abi_->get(), &args, &run->host_->host, &run->state_, msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    if (code != KREG_OK) {
      if (run->state_ != nullptr && release_ != nullptr) release_(run->state_);
      run->state_ = nullptr;
      return FromAbi(code, About(name_, ": prepare", msg));
    }
    run->prepared_ = true;
  }
  return run;
}

// Made once per prepared run: an arena costs microseconds to set up, as
// much as a small kernel's whole run.
struct PreparedRun::Arena {
  explicit Arena(int threads) : arena(threads) {}
  tbb::task_arena arena;
};

PreparedRun::~PreparedRun() {
  if (prepared_ && kernel_->release_ != nullptr) kernel_->release_(state_);
}

absl::Status PreparedRun::Run() {
  char msg[512] = "";
  kreg_status code;
  auto run = [&] {
    code = kernel_->desc_->run(abi_->get(), args_, state_, workspace_, workspace_bytes_, &host_->host, msg,
                               sizeof msg);
  };
  if (arena_ != nullptr) {
    // oneTBB plugins run inside the host's arena of that many threads.
    arena_->arena.execute(run);
  } else {
    run();
  }
  msg[sizeof msg - 1] = '\0';
  if (code != KREG_OK) return FromAbi(code, About(kernel_->name(), "", msg));
  return absl::OkStatus();
}

absl::Status Kernel::Run(const Config& config, const kreg_args& args, const RunOptions& options) const {
  absl::StatusOr<std::unique_ptr<PreparedRun>> run = Prepare(config, args, options);
  if (!run.ok()) return run.status();
  return (*run)->Run();
}

// ---- Naming a plugin that crashes or hangs while it loads -------------------------

namespace {

// While a plugin's own code runs at load (its constructors, entry point and
// init), its file is named on a fatal signal, as the process's last line,
// and in a warning if it takes more than limits::kPluginLoadSeconds: with a
// broken plugin installed every command would otherwise die or hang with
// nothing saying why. (kreg list --check-plugins loads each in a child.)
// One plugin loads at a time (the registry's loads are serial per call;
// concurrent calls share the one guard under its mutex).
class LoadingGuard {
 public:
  explicit LoadingGuard(const std::string& path) : state_(ThisProcess()), lock_(state_.load_mu) {
    const size_t n = std::min(path.size(), sizeof path_ - 1);
    std::memcpy(path_, path.data(), n);
    path_[n] = '\0';
    struct sigaction ours {};
    ours.sa_handler = OnFatal;
    sigemptyset(&ours.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &ours, &saved_[i]);
    std::lock_guard<std::mutex> watch_lock(state_.mu);
    state_.loading = path_;
    state_.since = std::chrono::steady_clock::now();
    ++state_.generation;
    if (state_.idle) state_.cv.notify_one();  // else it wakes at its deadline and sees this load
  }
  ~LoadingGuard() {
    {
      std::lock_guard<std::mutex> watch_lock(state_.mu);
      state_.loading = nullptr;
      ++state_.generation;
    }
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &saved_[i], nullptr);
  }
  LoadingGuard(const LoadingGuard&) = delete;
  LoadingGuard& operator=(const LoadingGuard&) = delete;

 private:
  static constexpr std::array<int, 5> kSignals = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  // A process's: the lock one load holds at a time, and what its watcher
  // thread watches (the load under way, since when, a count of loads begun
  // and ended). Std mutexes, not Abseil's: TSan sees through them (Debian's
  // Abseil is not instrumented).
  struct State {
    pid_t pid = 0;
    std::mutex load_mu;
    std::mutex mu;
    std::condition_variable cv;
    const char* loading = nullptr;
    std::chrono::steady_clock::time_point since;
    uint64_t generation = 0;
    bool idle = false;  // the watcher waits for a load (not for a deadline)
  };
  // This process's State, and its watcher thread started, on first use. A
  // forked child gets fresh ones: a thread of the parent may have held the
  // old locks at the fork, and the parent's watcher is not in the child.
  // Never freed (the detached thread may outlive static destructors).
  static State& ThisProcess() {
    static std::atomic<State*> current{nullptr};
    const pid_t me = getpid();
    State* s = current.load();
    if (s != nullptr && s->pid == me) return *s;
    auto* fresh = new State;
    fresh->pid = me;
    if (!current.compare_exchange_strong(s, fresh)) {  // another thread of this process was first
      delete fresh;
      return *s;
    }
    std::thread(WatchLoads, fresh).detach();
    return *fresh;
  }
  // Warns once about a load past limits::kPluginLoadSeconds. One thread for
  // the process, not one per load (a thread costs about what a plugin's load
  // does), woken only to start following loads: it then sleeps to each
  // load's deadline, and finds there whether that load is still under way.
  static void WatchLoads(State* w) {
    const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(limits::kPluginLoadSeconds));
    std::unique_lock<std::mutex> lock(w->mu);
    uint64_t warned = 0;
    while (true) {
      w->idle = true;
      w->cv.wait(lock, [&] { return w->loading != nullptr; });
      w->idle = false;
      while (w->loading != nullptr) {
        const uint64_t generation = w->generation;
        const auto deadline = w->since + limit;
        if (std::chrono::steady_clock::now() < deadline) {
          w->cv.wait_until(lock, deadline);
        } else if (warned != generation) {
          warned = generation;
          Log(LogLevel::kWarn, absl::StrCat("plugin ", w->loading, " has been loading for ",
                                            limits::kPluginLoadSeconds, " s (its constructor or init may hang; kreg "
                                            "list --check-plugins tests each plugin apart)"));
        } else {
          w->cv.wait_for(lock, std::chrono::seconds(1));  // until the hung load ends, if it does
        }
      }
    }
  }
  // Async-signal-safe: write(2), then the handler that was there, again.
  static void OnFatal(int sig) {
    auto say = [](const char* text) { (void)!write(STDERR_FILENO, text, std::strlen(text)); };
    say("kreg: plugin ");
    say(path_);
    say(" crashed while loading (its constructor, entry point or init); kreg list --check-plugins tests each "
        "plugin apart\n");
    for (size_t i = 0; i < kSignals.size(); ++i) {
      if (kSignals[i] == sig) sigaction(sig, &saved_[i], nullptr);
    }
    raise(sig);
  }
  static inline char path_[4096] = {};
  static inline struct sigaction saved_[kSignals.size()] = {};
  State& state_;
  std::lock_guard<std::mutex> lock_;
};

}  // namespace

// ---- Registry --------------------------------------------------------------------

struct Registry::Opened {
  std::string path;
  std::shared_ptr<LoadedPlugin> plugin;
  std::vector<std::shared_ptr<const Op>> ops;
};

absl::StatusOr<Registry::Opened> Registry::Open(const std::string& path) const {
  Log(LogLevel::kDebug, absl::StrCat("loading plugin ", path));
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
