// Lut: a TuningDb resolved against a registry's kernels and indexed for
// run-time queries (the index: lut_internal.h). Here: the queries, in the
// order they try answers. Building is lut_index.cc, the lookups
// lut_nearest.cc, other machines' answers lut_defaults.cc.
#include "kreg/lut.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lut_internal.h"

namespace kreg {

using lut_internal::Digest;
using lut_internal::kNone;
using lut_internal::Legal;
using lut_internal::MakeShape;

Lut::Lut(std::unique_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Lut::Lut(Lut&&) noexcept = default;
Lut& Lut::operator=(Lut&&) noexcept = default;
Lut::~Lut() = default;

const std::vector<std::string>& Lut::warnings() const { return impl_->warnings; }
size_t Lut::size() const { return impl_->usable + (behind_ != nullptr ? behind_->size() : 0); }

Lut Lut::Layered(Lut front, std::string front_name, Lut behind, std::string behind_name) {
  behind.name_ = std::move(behind_name);
  front.name_ = std::move(front_name);
  front.behind_ = std::make_unique<const Lut>(std::move(behind));
  return front;
}

namespace {

// Match levels, best first (see Lut::Layered).
int Level(Match match) {
  switch (match) {
    case Match::kExact:
      return 0;
    case Match::kNearest:
      return 1;
    case Match::kSimilar:
      return 2;
    case Match::kModel:
      return 3;
    case Match::kDefault:
      return 4;
  }
  return 4;
}

}  // namespace

absl::StatusOr<LutAnswer> Lut::Query(absl::string_view op, absl::string_view dtype, const Dims& dims,
                                     absl::string_view machine_id, absl::string_view data_class, int threads) const {
  absl::StatusOr<LutAnswer> own = QueryOwn(op, dtype, dims, machine_id, data_class, threads);
  if (behind_ == nullptr || !own.ok()) return own;
  own->table = name_;
  if (own->match == Match::kExact) return own;
  absl::StatusOr<LutAnswer> other = behind_->Query(op, dtype, dims, machine_id, data_class, threads);
  if (!other.ok()) return own;
  other->table = behind_->name_;
  const bool behind_wins = Level(other->match) < Level(own->match) ||
                           (other->match == Match::kDefault && own->match == Match::kDefault);
  return behind_wins ? other : own;
}

absl::string_view MatchName(Match match) {
  switch (match) {
    case Match::kExact:
      return "exact";
    case Match::kNearest:
      return "nearest";
    case Match::kDefault:
      return "default";
    case Match::kModel:
      return "model";
    case Match::kSimilar:
      return "similar machine";
  }
  return "?";
}

std::string Lut::Impl::WhyDefault(absl::string_view op_name, absl::string_view dtype,
                                  absl::string_view machine) const {
  const tuning::Machine* record = FindMachine(machine);
  const char* const self = IsGpuMachineId(machine) ? "this GPU" : "this machine";
  const std::string name = record != nullptr ? absl::StrCat(self, " (", MachineSummary(*record), ")") : self;
  std::string why;
  if (!tuned_machines.contains(machine)) {
    why = absl::StrCat("no table for ", name);
  } else if (!tuned_ops.contains(absl::StrCat(machine, "\x1f", op_name, "\x1f", dtype))) {
    why = absl::StrCat("no entry for ", op_name, " ", dtype, " on ", name);
  } else {
    why = absl::StrCat("no entry for ", op_name, " ", dtype, " on ", name, " fits");
  }
  if (policy == MachinePolicy::kStrict) {
    absl::StrAppend(&why, " (strict: no other machine asked)");
  } else if (auto it = similar.find(machine); it == similar.end() || it->second.empty()) {
    absl::StrAppend(&why, IsGpuMachineId(machine) ? ", none for a GPU like it (same SM version)"
                                                  : ", none for a machine like it (same vendor and architecture)");
  } else {
    absl::StrAppend(&why, ", nor for a similar machine");
  }
  return why;
}

absl::Status Lut::Impl::ShapeOf(const OpEntry& op_entry, absl::string_view dtype, const Dims& dims,
                                ShapeArgs* shape) {
  const TensorTypes* types = op_entry.FindTypes(dtype);
  absl::StatusOr<TensorTypes> parsed;
  if (types == nullptr) {
    parsed = op_entry.op->TypesFromKey(dtype);
    if (!parsed.ok()) return parsed.status();
    types = &*parsed;
  }
  return MakeShape(*op_entry.op, *types, dims, shape);
}

uint32_t Lut::Impl::AnswerFrom(absl::string_view op_name, absl::string_view dtype, absl::string_view machine,
                               absl::string_view data_class, const Dims& dims, const Op* op,
                               const DimsDigest& digest, const ShapeArgs& shape, Match match, int threads,
                               LutAnswer* answer) const {
  uint32_t skip = kNone;
  uint32_t i = FindExact(op_name, dtype, machine, data_class, dims, op, digest, answer, &skip);
  float distance = 0;
  if (i == kNone) {
    std::tie(i, distance) = FindNearest(op_name, dtype, machine, data_class, dims, op, digest, shape, skip, answer);
  }
  if (i != kNone) Fill(i, match, distance, threads, answer);
  return i;
}

absl::StatusOr<LutAnswer> Lut::Impl::GpuDefault(absl::string_view op_name, const OpEntry& op_entry,
                                                const ShapeArgs& shape, LutAnswer answer) {
  std::string refusals;
  for (const auto& [kernel, config] : op_entry.gpu_defaults) {
    absl::Status s = Legal(*kernel, config, shape);
    if (s.ok()) {
      answer.kernel = kernel;
      answer.config = &config;
      answer.match = Match::kDefault;
      absl::StrAppend(&answer.why, "; the op's first CUDA kernel that takes it");
      return answer;
    }
    absl::StrAppend(&refusals, refusals.empty() ? "" : "; ", kernel->name(), ": ", s.message());
  }
  if (refusals.empty()) {
    return absl::NotFoundError(absl::StrCat("no CUDA kernel of op '", op_name, "' is registered"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no CUDA kernel of op '", op_name, "' takes this problem: ", refusals));
}

absl::StatusOr<LutAnswer> Lut::Impl::OpDefault(absl::string_view op_name, const OpEntry& op_entry, size_t chosen,
                                               const ShapeArgs& shape, LutAnswer answer) {
  // The op's own choice for this shape first, then its list.
  const auto& defaults = op_entry.defaults;
  std::string refusals;
  for (size_t n = 0; n <= defaults.size(); ++n) {
    // n == 0: the op's choice (if any); then the list in order, without it.
    const size_t i = n == 0 ? chosen : n - 1;
    if (i >= defaults.size() || (n > 0 && i == chosen)) continue;
    const auto& [kernel, config] = defaults[i];
    absl::Status s = Legal(*kernel, config, shape);
    if (s.ok()) {
      answer.kernel = kernel;
      answer.config = &config;
      answer.match = Match::kDefault;
      absl::StrAppend(&answer.why, "; no measurement on any machine answers it: the op's default");
      return answer;
    }
    absl::StrAppend(&refusals, refusals.empty() ? "" : "; ", kernel->name(), ": ", s.message());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no kernel of op '", op_name, "' takes this problem: ", refusals));
}

absl::StatusOr<LutAnswer> Lut::QueryOwn(absl::string_view op_name, absl::string_view dtype,
                                        const Dims& dims, absl::string_view machine_id,
                                        absl::string_view data_class, int threads) const {
  const Impl& impl = *impl_;
  const Impl::OpEntry* op_entry = impl.FindOp(op_name);
  if (op_entry == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("op '", op_name, "' is not registered (no loaded plugin declares it)"));
  }
  const Op* op = op_entry->op.get();
  const lut_internal::DimsDigest digest = Digest(op, dims);
  LutAnswer answer;

  // Exact.
  uint32_t unusable = kNone;
  if (uint32_t i = impl.FindExact(op_name, dtype, machine_id, data_class, dims, op, digest, &answer, &unusable);
      i != kNone) {
    impl.Fill(i, Match::kExact, 0, threads, &answer);
    return answer;
  }

  // The shape, for legality checks from here on.
  ShapeArgs shape;
  if (absl::Status s = Impl::ShapeOf(*op_entry, dtype, dims, &shape); !s.ok()) return s;

  // Nearest.
  if (auto [i, distance] =
          impl.FindNearest(op_name, dtype, machine_id, data_class, dims, op, digest, shape, unusable, &answer);
      i != kNone) {
    impl.Fill(i, Match::kNearest, distance, threads, &answer);
    return answer;
  }

  // Similar machines, most similar first: the same shape, else the nearest.
  if (impl.policy == MachinePolicy::kSimilar) {
    if (auto it = impl.similar.find(machine_id); it != impl.similar.end()) {
      for (const std::string& other : it->second) {
        if (impl.AnswerFrom(op_name, dtype, other, data_class, dims, op, digest, shape, Match::kSimilar, threads,
                            &answer) != kNone) {
          return answer;
        }
      }
    }
  }

  // A GPU: the op's CUDA kernels, the first legal for the shape.
  if (IsGpuMachineId(machine_id)) {
    answer.why = impl.WhyDefault(op_name, dtype, machine_id);
    return Impl::GpuDefault(op_name, *op_entry, shape, std::move(answer));
  }

  // A collective's backend (its data class, "backend=NAME") calibrated on
  // this machine: the op chooses by its costs.
  const auto& defaults = op_entry->defaults;
  if (defaults.empty()) {
    return absl::NotFoundError(absl::StrCat("no available kernel of op '", op_name, "' is registered"));
  }
  kreg_host host = impl.host;
  if (op->collective() && absl::StartsWith(data_class, "backend=")) {
    auto model = impl.comm_models.find({std::string(machine_id), std::string(data_class.substr(8))});
    if (model != impl.comm_models.end()) host.comm_model = &model->second;
  }
  const std::string variant = op->DefaultVariant(*shape.args(), host);
  size_t chosen = defaults.size();
  for (size_t i = 0; i < defaults.size() && chosen == defaults.size() && !variant.empty(); ++i) {
    if (defaults[i].first->variant() == variant) chosen = i;
  }
  if (host.comm_model != nullptr && chosen < defaults.size() &&
      Legal(*defaults[chosen].first, defaults[chosen].second, shape).ok()) {
    answer.kernel = defaults[chosen].first;
    answer.config = &defaults[chosen].second;
    answer.match = Match::kModel;
    return answer;
  }

  // The measured default of the nearest shape measured on any machine.
  answer.why = impl.WhyDefault(op_name, dtype, machine_id);
  if (uint32_t i = impl.AnswerFrom(op_name, dtype, kMeasuredDefaultsId, data_class, dims, op, digest, shape,
                                    Match::kDefault, threads, &answer);
      i != kNone) {
    answer.trial = nullptr;  // measured elsewhere
    answer.incomplete = false;
    absl::StrAppend(&answer.why, "; measured default: ", impl.Note(impl.items[i]));
    return answer;
  }
  return Impl::OpDefault(op_name, *op_entry, chosen, shape, std::move(answer));
}

}  // namespace kreg
