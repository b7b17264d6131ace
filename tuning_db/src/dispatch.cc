#include "kreg/dispatch.h"

#include "absl/strings/str_cat.h"
#include "kreg/ops.h"

namespace kreg {

absl::StatusOr<Dispatcher> Dispatcher::Create(const Registry& registry, const TuningDb& db,
                                              std::string machine_id, std::string data_class) {
  absl::StatusOr<Lut> lut = Lut::Build(db, registry);
  if (!lut.ok()) return lut.status();
  if (machine_id.empty()) machine_id = ThisMachine().id();
  return Dispatcher(*std::move(lut), std::move(machine_id), std::move(data_class));
}

absl::StatusOr<DispatchResult> Dispatcher::Run(absl::string_view op_name, const void* args,
                                               const RunOptions& options) const {
  const OpInfo* op = FindOp(op_name);
  if (op == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown op '", op_name, "'"));
  if (absl::Status s = op->validate(args); !s.ok()) return s;
  DType dtype;
  Dims dims;
  op->describe(args, &dtype, &dims);
  absl::StatusOr<LutAnswer> answer = lut_.Query(op_name, dtype, dims, machine_id_, data_class_);
  if (!answer.ok()) return answer.status();
  // A copy: Config caches its ABI view, so threads must not share one.
  const Config config = *answer->config;
  if (absl::Status s = answer->kernel->Run(config, args, options); !s.ok()) return s;
  return DispatchResult{answer->kernel->name(), answer->kernel->ConfigString(config),
                        answer->match};
}

absl::StatusOr<TopKResult> Dispatcher::TopK(const Tensor& input, int64_t k,
                                            const TopKOptions& options, DispatchResult* how) const {
  TopKResult result;
  absl::StatusOr<kreg_topk_args> args = PrepareTopK(input, k, options, &result);
  if (!args.ok()) return args.status();
  absl::StatusOr<DispatchResult> ran = Run("topk", &*args, options.run);
  if (!ran.ok()) return ran.status();
  if (how != nullptr) *how = *std::move(ran);
  return result;
}

}  // namespace kreg
