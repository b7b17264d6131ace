// The run-time half of kreg: given an op's arguments, ask the tuning table
// which variant and parameters to use on this machine, and run them. Generic
// over ops: the call is the op's kreg_args (see kreg/plugin_abi.h and the
// op's descriptor); typed fronts for particular ops sit on top (kreg/topk.h).
//
//   auto registry = kreg::Registry::Load({});
//   auto db = kreg::TuningDb::Load("topk.lut");
//   auto dispatcher = kreg::Dispatcher::Create(**registry, *db);
//   auto ran = dispatcher->Run("topk", args);   // kernel, config, match
//
// Ownership: a Dispatcher owns its Lut, which keeps the kernels it answers
// with loaded, and holds the registry's ops; it outlives the Registry and
// TuningDb it was built from. Thread-safety: const methods are thread-safe.
#ifndef KREG_TUNING_DB_DISPATCH_H_
#define KREG_TUNING_DB_DISPATCH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/lut.h"
#include "kreg/op.h"
#include "kreg/plugin_abi.h"
#include "kreg/record.h"
#include "kreg/registry.h"

namespace kreg {

struct DispatchResult {
  std::string kernel;      // "op/variant"
  std::string config;      // "name=value ..."
  Match match = Match::kDefault;
  std::string data_class;  // the data class the table was asked with ("" for none)
  // The same kernel and configuration as objects, owned by the Dispatcher
  // (valid while it lives).
  const Kernel* ran = nullptr;
  const Config* ran_config = nullptr;
  // The thread count the table's answer was fastest with (0: all); Run ran
  // it with no more.
  int threads = 0;
};

class Dispatcher {
 public:
  // `machine_id` defaults to this machine's fingerprint. A non-empty
  // `data_class` is used for every call instead of asking the op.
  static absl::StatusOr<Dispatcher> Create(const Registry& registry, const TuningDb& db,
                                           std::string machine_id = "", std::string data_class = "");
  // The same over a Lut built already (its own LutOptions: a machine
  // policy, several tables merged).
  static absl::StatusOr<Dispatcher> Create(const Registry& registry, Lut lut, std::string machine_id = "",
                                           std::string data_class = "");

  Dispatcher(Dispatcher&& other) noexcept;
  Dispatcher& operator=(Dispatcher&& other) noexcept;
  ~Dispatcher();

  // Runs op `op` on `args`: validates them (Op::Validate), keys them
  // (Op::KeyOf), takes the data class (the override given to Create, else
  // the op's classifier, asked per call), asks the table (Lut::Query) and
  // runs its answer. The answer is remembered per call shape (op, dims,
  // attributes, tensors present and their dtypes, data class, device
  // (its kind and ordinal), threads asked; up to kMemoEntries shapes, then forgotten all at once):
  // a shape asked again costs the validation, its classifier and a hash
  // lookup, and the table, never changed once built, answers the same.
  // With KREG_RECORD=FILE set when the Dispatcher was created, a shape the
  // table does not answer exactly (nearest, similar machine, model,
  // default) is appended to FILE once (kreg/record.h), when first asked.
  // With options.device (a GPU; args flagged
  // KREG_ARGS_ON_DEVICE, their tensors in its memory) the table is asked
  // for that GPU (GpuMachine of it) and answers with its CUDA kernels.
  // Kernels that dispatch sub-ops (composite ops) have them
  // run through this Dispatcher, unless `options.dispatch` is set. NotFound
  // for an op the registry does not know; the validation's, the table's or
  // the kernel's error otherwise.
  absl::StatusOr<DispatchResult> Run(absl::string_view op, const kreg_args& args,
                                     const RunOptions& options = {}) const;

  // The op called `name`, or nullptr.
  const Op* FindOp(absl::string_view name) const;

  // The most call shapes whose answers Run remembers.
  static constexpr size_t kMemoEntries = 4096;
  const Lut& lut() const { return lut_; }
  const std::string& machine_id() const { return machine_id_; }

 private:
  using OpMap = std::map<std::string, std::shared_ptr<const Op>, std::less<>>;
  struct Memo;  // dispatch.cc
  Dispatcher(Lut lut, OpMap ops, std::string machine_id, std::string data_class);
  // The table's answer for `op` on `args` (their key, data class and
  // options), remembered.
  absl::StatusOr<DispatchResult> Answer(const Op& op, const kreg_args& args, std::string data_class,
                                        const RunOptions& options) const;
  Lut lut_;
  OpMap ops_;
  std::string machine_id_, data_class_;
  std::unique_ptr<Memo> memo_;  // never null; a moved Dispatcher starts a new one
  std::shared_ptr<ShapeRecorder> recorder_;  // KREG_RECORD's; null when unset
};

}  // namespace kreg

#endif  // KREG_TUNING_DB_DISPATCH_H_
