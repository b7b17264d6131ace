#include "kreg/answer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kreg {

absl::StatusOr<MachinePolicy> ParseMachinePolicy(absl::string_view name) {
  if (name == "similar") return MachinePolicy::kSimilar;
  if (name == "strict") return MachinePolicy::kStrict;
  return absl::InvalidArgumentError(absl::StrCat("machine '", name, "': expected similar or strict"));
}

namespace {

// The shipped tables' entries of the ops `registry` knows.
absl::StatusOr<TuningDb> KnownShipped(const Registry& registry, std::vector<std::string>* warnings) {
  TuningDb shipped = ShippedTables(warnings);
  tuning::Database known;
  *known.mutable_machines() = shipped.proto().machines();
  for (const tuning::Entry& e : shipped.proto().entries()) {
    if (registry.GetOp(e.key().op()).ok()) *known.add_entries() = e;
  }
  known.set_schema_version(kSchemaVersion);
  return TuningDb::FromProto(std::move(known));
}

}  // namespace

absl::StatusOr<Lut> AnsweringLut(const Registry& registry, TuningDb given, absl::string_view given_name,
                                 const AnswerPolicy& policy, std::vector<std::string>* warnings) {
  if (absl::Status s = CheckConfigs(given, registry, given_name); !s.ok()) return s;
  LutOptions options;
  options.machines = policy.machines;
  std::vector<tuning::Machine> gpus;
  if (policy.device == DeviceKind::kCuda) {
    if (absl::StatusOr<std::vector<GpuInfo>> found = CudaDevices(); found.ok()) {
      for (const GpuInfo& g : *found) gpus.push_back(MachineOf(g));
    }
  }
  auto build = [&](TuningDb table) -> absl::StatusOr<Lut> {
    for (const tuning::Machine& m : gpus) table.AddMachine(m);
    absl::StatusOr<Lut> lut = Lut::Build(table, registry, options);
    if (lut.ok()) warnings->insert(warnings->end(), lut->warnings().begin(), lut->warnings().end());
    return lut;
  };
  const bool has_given = !given_name.empty() || given.size() > 0;
  if (!policy.shipped) return build(std::move(given));
  absl::StatusOr<TuningDb> shipped = KnownShipped(registry, warnings);
  if (!shipped.ok()) return shipped.status();
  absl::StatusOr<Lut> behind = build(*std::move(shipped));
  if (!behind.ok() || !has_given) return behind;
  absl::StatusOr<Lut> front = build(std::move(given));
  if (!front.ok() || behind->size() == 0) return front;  // nothing shipped (KREG_TABLE_PATH=)
  return Lut::Layered(*std::move(front), given_name.empty() ? "the given table" : std::string(given_name),
                      *std::move(behind), "the shipped tables");
}

absl::StatusOr<tuning::Machine> DeviceMachine(DeviceKind device) {
  if (device == DeviceKind::kCpu) return ThisMachine();
  absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
  if (!gpus.ok()) return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", gpus.status().message()));
  return MachineOf(gpus->front());
}

absl::StatusOr<QueryRecord> AskTable(const Lut& lut, const Op& op, const kreg_args& args, std::string data_class,
                                     DeviceKind device, int threads, std::vector<std::string>* warnings) {
  absl::StatusOr<tuning::Machine> machine = DeviceMachine(device);
  if (!machine.ok()) return machine.status();
  const OpKey key = op.KeyOf(args);
  absl::StatusOr<LutAnswer> answer =
      lut.Query(op.name(), key.dtype, key.dims, machine->id(), data_class, ThreadsAvailable(threads));
  if (!answer.ok()) return answer.status();
  warnings->insert(warnings->end(), answer->warnings.begin(), answer->warnings.end());
  return QueryRecord{MakeProblemKey(op.name(), key, machine->id(), data_class), *std::move(answer)};
}

std::string AnswerHow(const LutAnswer& answer, bool detailed) {
  std::string how(MatchName(answer.match));
  if (answer.match == Match::kSimilar && answer.machine != nullptr) {
    absl::StrAppend(&how, " (", MachineSummary(*answer.machine), ")");
  }
  if (!detailed) {
    // run's one line: how it matched
  } else if (answer.match == Match::kDefault) {
    absl::StrAppend(&how, ": ", answer.why);
  } else if (answer.tuned_dims != nullptr) {
    absl::StrAppend(&how, " from ", DimsString(*answer.tuned_dims),
                    answer.trial != nullptr ? absl::StrFormat(", %.3f ms", answer.trial->median_ns() / 1e6) : "");
  }
  if (answer.threads > 0) absl::StrAppend(&how, ", on ", answer.threads, answer.threads == 1 ? " thread" : " threads");
  if (answer.incomplete) absl::StrAppend(&how, ", incomplete");
  if (detailed && !answer.table.empty()) absl::StrAppend(&how, ", in ", answer.table);
  return how;
}

}  // namespace kreg
