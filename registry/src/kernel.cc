// Kernels and their runs: the host table a kernel call sees, checking a
// configuration, preparing and running. Loading is registry.cc.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <oneapi/tbb/task_arena.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "host_table.h"
#include "kreg/limits.h"
#include "kreg/log.h"
#include "kreg/registry.h"
#include "loaded_plugin.h"

namespace kreg {
namespace {

// A kernel's message about itself: "NAME: message", unless the kernel
// already put its name first.
std::string About(absl::string_view name, absl::string_view what, const char* msg) {
  absl::string_view m = msg;
  if (absl::StartsWith(m, name) && absl::StartsWith(m.substr(name.size()), ": ")) m.remove_prefix(name.size() + 2);
  return absl::StrCat(name, what, ": ", m);
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

}  // namespace

const kreg_host& PlainHost() {
  static const PreparedRun::HostContext* const context = MakeHost("kreg", {}).release();
  return context->host;
}

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
  // The library holds the bound, not only the front ends (an arena of a
  // million threads would be made as asked).
  if (absl::Status s = limits::CheckThreads(options.num_threads); !s.ok()) return s;
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
  char msg[512];  // not zeroed: a collective's small run is a microsecond
  msg[0] = '\0';
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

}  // namespace kreg
