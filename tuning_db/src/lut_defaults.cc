// Lut answers from other machines: the table's machine records and which
// are similar to which, and the measured defaults (each shape tuned on any
// machine, answered by the variant nearest each machine's best).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lut_internal.h"

namespace kreg {

using lut_internal::KernelsByName;
using lut_internal::Legal;
using lut_internal::MakeShape;
using lut_internal::MeasuredOn;
using lut_internal::VariantScore;

namespace {

// Per machine that measured a shape: each current variant's fastest OK
// trial (by kernel name), and the best of them.
std::vector<MeasuredOn> Measure(const std::vector<const tuning::Entry*>& entries,
                                const KernelsByName& by_name) {
  std::vector<MeasuredOn> measured;
  for (const tuning::Entry* e : entries) {
    MeasuredOn m{e, std::numeric_limits<double>::infinity(), {}};
    for (const tuning::Trial& t : e->trials()) {
      if (t.status() != tuning::Trial::OK || !std::isfinite(t.median_ns()) || t.median_ns() <= 0) continue;
      auto it = by_name.find(absl::StrCat(e->key().op(), "/", t.variant()));
      if (it == by_name.end() || it->second->version() != t.variant_version()) continue;
      m.best = std::min(m.best, t.median_ns());
      const tuning::Trial*& f = m.fastest[it->first];
      if (f == nullptr || t.median_ns() < f->median_ns()) f = &t;
    }
    if (!m.fastest.empty()) measured.push_back(std::move(m));
  }
  return measured;
}

// Variants by geometric-mean slowdown over the machines that measured them
// (those available here and measured on at least half of them), best first:
// ties to the more often measured, then by name.
std::vector<VariantScore> Score(const std::vector<MeasuredOn>& measured, const KernelsByName& by_name) {
  std::map<std::string, std::pair<double, size_t>> sums;
  for (const MeasuredOn& m : measured) {
    for (const auto& [name, t] : m.fastest) {
      auto& [sum, count] = sums[name];
      sum += std::log(t->median_ns() / m.best);
      ++count;
    }
  }
  std::vector<VariantScore> scores;
  for (const auto& [name, sum_count] : sums) {
    const auto& [sum, count] = sum_count;
    if (2 * count < measured.size() || !by_name.at(name)->available()) continue;
    scores.push_back({sum / static_cast<double>(count), count, name});
  }
  std::sort(scores.begin(), scores.end(), [](const VariantScore& a, const VariantScore& b) {
    return std::tie(a.log_ratio, b.count, a.name) < std::tie(b.log_ratio, a.count, b.name);
  });
  return scores;
}

}  // namespace

// ---- Machines ----------------------------------------------------------------------

void Lut::Impl::AddMachines(const tuning::Database& proto) {
  for (const tuning::Machine& m : proto.machines()) machines[m.id()] = m;
  machines[ThisMachine().id()] = ThisMachine();
  for (const tuning::Entry& e : proto.entries()) {
    tuned_machines.insert(e.key().machine_id());
    tuned_ops.insert(absl::StrCat(e.key().machine_id(), "\x1f", e.key().op(), "\x1f", e.key().dtype()));
  }
  for (const auto& [id, m] : machines) {
    if (m.has_gpu()) {
      // A GPU's: the tuned GPUs of the same SM version, nearest memory size
      // (in log2) first, then the same driver, then by id.
      std::vector<std::tuple<double, bool, std::string>> ranked;
      for (const auto& [other_id, o] : machines) {
        if (other_id == id || !o.has_gpu() || !tuned_machines.contains(other_id) || o.gpu().sm() != m.gpu().sm()) {
          continue;
        }
        const double memory = std::fabs(std::log2(static_cast<double>(std::max<uint64_t>(1, m.gpu().memory_bytes()))) -
                                        std::log2(static_cast<double>(std::max<uint64_t>(1, o.gpu().memory_bytes()))));
        ranked.emplace_back(memory, o.gpu().driver() != m.gpu().driver(), other_id);
      }
      std::sort(ranked.begin(), ranked.end());
      std::vector<std::string>& out = similar[id];
      for (auto& r : ranked) out.push_back(std::move(std::get<2>(r)));
      continue;
    }
    const std::string vendor = MachineVendor(m), arch = MachineArch(m);
    if (vendor.empty() || arch.empty()) continue;
    const absl::flat_hash_set<std::string> isa(m.isa().begin(), m.isa().end());
    struct Ranked {
      int isa_apart;
      double cores_apart;
      int other_generation;
      std::string id;
      bool operator<(const Ranked& o) const {
        return std::tie(isa_apart, cores_apart, other_generation, id) <
               std::tie(o.isa_apart, o.cores_apart, o.other_generation, o.id);
      }
    };
    std::vector<Ranked> ranked;
    for (const auto& [other_id, o] : machines) {
      if (other_id == id || !tuned_machines.contains(other_id)) continue;
      if (MachineVendor(o) != vendor || MachineArch(o) != arch) continue;
      int apart = 0;
      for (const std::string& x : o.isa()) apart += isa.contains(x) ? 0 : 1;
      for (const std::string& x : isa) {
        apart += std::find(o.isa().begin(), o.isa().end(), x) == o.isa().end() ? 1 : 0;
      }
      const bool same_generation = m.family() != 0 && m.family() == o.family() && m.model() == o.model();
      const double cores = std::fabs(std::log2(std::max(1u, m.cores())) - std::log2(std::max(1u, o.cores())));
      ranked.push_back({apart, cores, same_generation ? 0 : 1, other_id});
    }
    std::sort(ranked.begin(), ranked.end());
    std::vector<std::string>& out = similar[id];
    for (Ranked& r : ranked) out.push_back(std::move(r.id));
  }
}

// ---- Measured defaults --------------------------------------------------------------

uint32_t Lut::Impl::InternFew(absl::string_view text) {
  for (uint32_t i = 0; i < strings.size(); ++i) {
    if (strings[i] == text) return i;
  }
  strings.emplace_back(text);
  return static_cast<uint32_t>(strings.size() - 1);
}

std::vector<std::string> Lut::Impl::DefaultPreference() const {
  std::vector<std::string> preference = {HostMachine().id};
  if (auto it = similar.find(HostMachine().id); it != similar.end()) {
    preference.insert(preference.end(), it->second.begin(), it->second.end());
  }
  return preference;
}

void Lut::Impl::AddMeasuredDefaults(const tuning::Database& proto, const KernelsByName& by_name) {
  // The machines' order of preference for a default's configuration: this
  // one, the similar ones, then the rest by id.
  const std::vector<std::string> preference = DefaultPreference();
  auto rank_of = [&](const std::string& id) {
    auto at = std::find(preference.begin(), preference.end(), id);
    return at == preference.end() ? preference.size() : static_cast<size_t>(at - preference.begin());
  };
  // Entries per shape (op, dtype signature, data class, canonical dims).
  struct Shape {
    const OpEntry* op = nullptr;
    const tuning::ProblemKey* key = nullptr;
    Dims dims;
    std::vector<const tuning::Entry*> entries;
  };
  std::map<std::string, Shape> shapes;
  for (const tuning::Entry& e : proto.entries()) {
    const OpEntry* op = FindOp(e.key().op());
    if (op == nullptr || op->FindTypes(e.key().dtype()) == nullptr || e.key().machine_id() == kMeasuredDefaultsId ||
        IsGpuMachineId(e.key().machine_id())) {
      continue;  // GPUs' entries neither: their defaults are the op's CUDA kernels
    }
    Dims dims = CanonicalDims(*op->op, KeyDims(e.key()));
    Shape& shape = shapes[absl::StrCat(e.key().op(), "\x1f", e.key().dtype(), "\x1f", e.key().data_class(), "\x1f",
                                       DimsString(dims))];
    if (shape.op == nullptr) {
      shape.op = op;
      shape.key = &e.key();
      shape.dims = std::move(dims);
    }
    shape.entries.push_back(&e);
  }
  const uint32_t machine = InternFew(kMeasuredDefaultsId);
  for (auto& [id, shape] : shapes) {
    std::vector<MeasuredOn> measured = Measure(shape.entries, by_name);
    if (measured.empty()) continue;
    std::sort(measured.begin(), measured.end(), [&](const MeasuredOn& a, const MeasuredOn& b) {
      return rank_of(a.entry->key().machine_id()) < rank_of(b.entry->key().machine_id()) ||
             (rank_of(a.entry->key().machine_id()) == rank_of(b.entry->key().machine_id()) &&
              a.entry->key().machine_id() < b.entry->key().machine_id());
    });
    ShapeArgs own;
    if (!MakeShape(*shape.op->op, *shape.op->FindTypes(shape.key->dtype()), shape.dims, &own).ok()) continue;
    AddMeasuredDefault(*shape.key, shape.dims, own, measured, Score(measured, by_name), by_name, machine);
  }
}

void Lut::Impl::AddMeasuredDefault(const tuning::ProblemKey& shape_key, const Dims& dims, const ShapeArgs& own,
                                   const std::vector<MeasuredOn>& measured, const std::vector<VariantScore>& scores,
                                   const KernelsByName& by_name, uint32_t machine) {
  // The best-scored variant with a configuration legal for the shape,
  // from the most similar machine that measured it.
  for (const VariantScore& score : scores) {
    const Kernel& kernel = *by_name.at(score.name);
    Item item;
    for (const MeasuredOn& m : measured) {
      auto it = m.fastest.find(score.name);
      if (it == m.fastest.end()) continue;
      absl::StatusOr<Config> config = FromProtoConfig(kernel, it->second->config());
      if (!config.ok() || !Legal(kernel, *config, own).ok()) continue;
      item.kernel = &kernel;
      item.config = *std::move(config);
      item.trial = *it->second;
      break;
    }
    if (item.kernel == nullptr) continue;
    item.dims = dims;
    item.key_text = absl::StrCat(shape_key.op(), " ", shape_key.dtype(), " ", DimsString(dims),
                                 shape_key.data_class().empty() ? "" : " [" + shape_key.data_class() + "]",
                                 " (measured default)");
    item.note = absl::StrFormat("%s, %.2fx the best (geometric mean) on %d of the %d machines that tuned %s",
                                kernel.name(), std::exp(score.log_ratio), score.count, measured.size(),
                                DimsString(dims));
    Key key{InternFew(shape_key.op()),
            InternFew(shape_key.dtype()),
            machine,
            InternFew(shape_key.data_class()),
            static_cast<uint32_t>(dim_names.size()),
            static_cast<uint32_t>(item.dims.size())};
    for (const auto& [name, value] : item.dims) {
      dim_names.push_back(InternFew(name));
      dim_values.push_back(value);
    }
    keys.push_back(key);
    items.push_back(std::move(item));
    break;
  }
}

}  // namespace kreg
