#include "kreg/dispatch.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/log.h"

namespace kreg {

absl::StatusOr<Dispatcher> Dispatcher::Create(const Registry& registry, const TuningDb& db,
                                              std::string machine_id, std::string data_class) {
  absl::StatusOr<Lut> lut = Lut::Build(db, registry);
  if (!lut.ok()) return lut.status();
  return Create(registry, *std::move(lut), std::move(machine_id), std::move(data_class));
}

absl::StatusOr<Dispatcher> Dispatcher::Create(const Registry& registry, Lut lut, std::string machine_id,
                                              std::string data_class) {
  if (machine_id.empty()) machine_id = HostMachine().id;
  OpMap ops;
  for (std::shared_ptr<const Op>& op : registry.Ops()) {
    std::string name = op->name();
    ops.emplace(std::move(name), std::move(op));
  }
  return Dispatcher(std::move(lut), std::move(ops), std::move(machine_id), std::move(data_class));
}

const Op* Dispatcher::FindOp(absl::string_view name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

absl::StatusOr<DispatchResult> Dispatcher::Run(absl::string_view op_name, const kreg_args& args,
                                               const RunOptions& options) const {
  const Op* op = FindOp(op_name);
  if (op == nullptr) {
    std::vector<absl::string_view> known;
    for (const auto& entry : ops_) known.push_back(entry.first);
    return absl::NotFoundError(absl::StrCat("unknown op '", op_name, "' (known: ",
                                            known.empty() ? "none" : absl::StrJoin(known, ", "),
                                            ")"));
  }
  if (absl::Status s = op->Validate(args); !s.ok()) return s;
  const OpKey key = op->KeyOf(args);
  std::string data_class = data_class_;
  if (data_class.empty()) {
    absl::StatusOr<std::string> asked = op->DataClass(args);
    if (!asked.ok()) return asked.status();
    data_class = *std::move(asked);
  }
  // On a device (its tensors there): the GPU's entries, answered with its kernels.
  const std::string gpu = options.device != nullptr ? GpuMachine(*options.device).id() : std::string();
  absl::StatusOr<LutAnswer> answer = lut_.Query(op->name(), key.dtype, key.dims, gpu.empty() ? machine_id_ : gpu,
                                                data_class, ThreadsAvailable(options.num_threads));
  if (!answer.ok()) return answer.status();

  // The thread count the answer was fastest with, if fewer than asked.
  RunOptions with_threads;
  const RunOptions* given = &options;
  if (answer->threads > 0 && (options.num_threads == 0 || answer->threads < options.num_threads)) {
    with_threads = options;
    with_threads.num_threads = answer->threads;
    given = &with_threads;
  }
  const RunOptions& opts = *given;
  const RunOptions* run_options = &opts;
  RunOptions with_dispatch;
  if (!opts.dispatch) {
    // Sub-ops of a composite op go through this Dispatcher, each with a
    // workspace of its own (the caller's is in use by the kernel that
    // dispatches).
    with_dispatch = opts;
    with_dispatch.dispatch = [this, &opts](absl::string_view sub_op, const kreg_args& sub_args) {
      // `opts` outlives the kernel's run, and so this call.
      RunOptions sub = opts;
      sub.workspace = nullptr;
      return Run(sub_op, sub_args, sub).status();
    };
    run_options = &with_dispatch;
  }
  if (LogEnabled(LogLevel::kDebug)) {
    Log(LogLevel::kDebug, absl::StrCat("dispatch ", op->name(), " ", key.dtype, " ", DimsString(key.dims), ": ",
                                       answer->kernel->name(), " ", answer->kernel->ConfigString(*answer->config),
                                       " (", MatchName(answer->match), ")"));
  }
  if (absl::Status s = answer->kernel->Run(*answer->config, args, *run_options); !s.ok()) {
    return s;
  }
  return DispatchResult{answer->kernel->name(), answer->kernel->ConfigString(*answer->config),
                        answer->match, std::move(data_class)};
}

}  // namespace kreg
