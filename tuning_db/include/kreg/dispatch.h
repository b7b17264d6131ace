// The run-time half of kreg: given an op's arguments, ask the tuning table
// which variant and parameters to use on this machine, and run them.
//
//   auto registry = kreg::Registry::Load({});
//   auto db = kreg::TuningDb::Load("topk.lut");
//   auto dispatcher = kreg::Dispatcher::Create(**registry, *db);
//   auto result = dispatcher->TopK(logits, /*k=*/64);   // values + indices
//
// Ownership: a Dispatcher owns its Lut, which keeps the kernels it answers
// with loaded; it outlives the Registry and TuningDb it was built from.
// Thread-safety: const methods are thread-safe.
#ifndef KREG_TUNING_DB_DISPATCH_H_
#define KREG_TUNING_DB_DISPATCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "kreg/lut.h"
#include "kreg/registry.h"
#include "kreg/topk.h"

namespace kreg {

struct DispatchResult {
  std::string kernel;  // "op/variant"
  std::string config;  // "name=value ..."
  Match match = Match::kDefault;
};

class Dispatcher {
 public:
  // `machine_id` defaults to this machine's fingerprint.
  static absl::StatusOr<Dispatcher> Create(const Registry& registry, const TuningDb& db,
                                           std::string machine_id = "", std::string data_class = "");

  // Looks up the args' problem (the op's describe()) and runs the answer.
  absl::StatusOr<DispatchResult> Run(absl::string_view op, const void* args,
                                     const RunOptions& options = {}) const;

  // The typed front of op "topk": outputs allocated, answer run.
  absl::StatusOr<TopKResult> TopK(const Tensor& input, int64_t k, const TopKOptions& options = {},
                                  DispatchResult* how = nullptr) const;

  const Lut& lut() const { return lut_; }

 private:
  Dispatcher(Lut lut, std::string machine_id, std::string data_class)
      : lut_(std::move(lut)), machine_id_(std::move(machine_id)), data_class_(std::move(data_class)) {}
  Lut lut_;
  std::string machine_id_, data_class_;
};

}  // namespace kreg

#endif  // KREG_TUNING_DB_DISPATCH_H_
