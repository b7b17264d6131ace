// Lut answers from other machines: the table's machine records and which
// are similar to which, and the measured defaults (each shape tuned on any
// machine, answered by the variant nearest each machine's best).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "oneapi/tbb/blocked_range.h"
#include "oneapi/tbb/parallel_for.h"
#include "oneapi/tbb/parallel_sort.h"
#include "in_order.h"
#include "lut_internal.h"

namespace kreg {

using lut_internal::KernelsByName;
using lut_internal::kNone;
using lut_internal::Legal;
using lut_internal::MakeShape;
using lut_internal::MeasuredOn;
using lut_internal::VariantScore;

namespace {

// Per machine that measured a shape: each current variant's fastest OK
// trial (by kernel name), and the best of them.
std::vector<MeasuredOn> Measure(absl::Span<const tuning::Entry* const> entries,
                                const KernelsByName& by_name) {
  std::vector<MeasuredOn> measured;
  std::string name;
  for (const tuning::Entry* e : entries) {
    MeasuredOn m{e, std::numeric_limits<double>::infinity(), {}};
    for (const tuning::Trial& t : e->trials()) {
      if (t.status() != tuning::Trial::OK || !std::isfinite(t.median_ns()) || t.median_ns() <= 0) continue;
      name.assign(e->key().op()).append("/").append(t.variant());
      auto it = by_name.find(name);
      if (it == by_name.end() || it->second->version() != t.variant_version()) continue;
      m.best = std::min(m.best, t.median_ns());
      auto f = std::find_if(m.fastest.begin(), m.fastest.end(),
                            [&](const lut_internal::Fastest& x) { return x.name == &it->first; });
      if (f == m.fastest.end()) {
        m.fastest.push_back({&it->first, it->second.get(), &t});
      } else if (t.median_ns() < f->trial->median_ns()) {
        f->trial = &t;
      }
    }
    if (!m.fastest.empty()) measured.push_back(std::move(m));
  }
  return measured;
}

// Variants by geometric-mean slowdown over the machines that measured them
// (those available here and measured on at least half of them), best first:
// ties to the more often measured, then by name.
std::vector<VariantScore> Score(const std::vector<MeasuredOn>& measured) {
  std::vector<VariantScore> sums;  // log_ratio: the sum so far
  sums.reserve(measured.empty() ? 0 : measured.front().fastest.size());
  for (const MeasuredOn& m : measured) {
    for (const lut_internal::Fastest& f : m.fastest) {
      auto it = std::find_if(sums.begin(), sums.end(), [&](const VariantScore& v) { return v.name == f.name; });
      if (it == sums.end()) it = sums.insert(sums.end(), {0, 0, f.name, f.kernel});
      it->log_ratio += std::log(f.trial->median_ns() / m.best);
      ++it->count;
    }
  }
  std::vector<VariantScore> scores;
  scores.reserve(sums.size());
  for (const VariantScore& v : sums) {
    if (2 * v.count < measured.size() || !v.kernel->available()) continue;
    scores.push_back({v.log_ratio / static_cast<double>(v.count), v.count, v.name, v.kernel});
  }
  std::sort(scores.begin(), scores.end(), [](const VariantScore& a, const VariantScore& b) {
    return std::tie(a.log_ratio, b.count, *a.name) < std::tie(b.log_ratio, a.count, *b.name);
  });
  return scores;
}

}  // namespace

// ---- Machines ----------------------------------------------------------------------

void Lut::Impl::AddMachines(const tuning::Database& proto) {
  for (const tuning::Machine& m : proto.machines()) machines[m.id()] = m;
  machines[ThisMachine().id()] = ThisMachine();
  // Entries of one machine, op and dtype usually come together: those
  // already recorded by the previous entry are not looked up again.
  const tuning::ProblemKey* previous = nullptr;
  for (const tuning::Entry& e : proto.entries()) {
    const tuning::ProblemKey& key = e.key();
    if (previous != nullptr && previous->machine_id() == key.machine_id() && previous->op() == key.op() &&
        previous->dtype() == key.dtype()) {
      continue;
    }
    previous = &key;
    tuned_machines.insert(key.machine_id());
    tuned_ops.insert(absl::StrCat(key.machine_id(), "\x1f", key.op(), "\x1f", key.dtype()));
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

std::vector<std::string> Lut::Impl::DefaultPreference() const {
  std::vector<std::string> preference = {HostMachine().id};
  if (auto it = similar.find(HostMachine().id); it != similar.end()) {
    preference.insert(preference.end(), it->second.begin(), it->second.end());
  }
  return preference;
}

void Lut::Impl::AddMeasuredDefaults(const tuning::Database& proto, const KernelsByName& by_name,
                                    lut_internal::BuildScratch* scratch) {
  // The machines' order of preference for a default's configuration: this
  // one, the similar ones, then the rest by id.
  const std::vector<std::string> preference = DefaultPreference();
  auto rank_of = [&](const std::string& id) {
    auto at = std::find(preference.begin(), preference.end(), id);
    return at == preference.end() ? preference.size() : static_cast<size_t>(at - preference.begin());
  };
  // Entries per shape (op, dtype signature, data class, canonical dims),
  // shapes in the order of that text, entries in the table's. Shapes and
  // their items are made on every core (they only read the table and the
  // entries' items); the items join the Lut in shape order after.
  std::vector<std::string> texts(proto.entries_size());  // empty: not a shape's entry
  tbb::parallel_for(tbb::blocked_range<int>(0, proto.entries_size(), 256), [&](const tbb::blocked_range<int>& r) {
    for (int i = r.begin(); i < r.end(); ++i) {
      const tuning::Entry& e = proto.entries(i);
      const OpEntry* op = FindOp(e.key().op());
      if (op == nullptr || op->FindTypes(e.key().dtype()) == nullptr ||
          e.key().machine_id() == kMeasuredDefaultsId || IsGpuMachineId(e.key().machine_id())) {
        continue;  // GPUs' entries neither: their defaults are the op's CUDA kernels
      }
      const uint32_t item = scratch->entry_item[i];
      texts[i] = absl::StrCat(e.key().op(), "\x1f", e.key().dtype(), "\x1f", e.key().data_class(), "\x1f");
      AppendDims(item != kNone ? items[item].dims : CanonicalDims(*op->op, KeyDims(e.key())), &texts[i]);
    }
  });
  std::vector<std::pair<absl::string_view, int>> by_shape;
  by_shape.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!texts[i].empty()) by_shape.emplace_back(texts[i], static_cast<int>(i));
  }
  // By text, then by entry: the table's order within a shape.
  tbb::parallel_sort(by_shape.begin(), by_shape.end());
  std::vector<std::pair<size_t, size_t>> shapes;  // [begin, end) of by_shape
  for (size_t begin = 0, end = 0; begin < by_shape.size(); begin = end) {
    for (end = begin; end < by_shape.size() && by_shape[end].first == by_shape[begin].first; ++end) {
    }
    shapes.emplace_back(begin, end);
  }
  // Each shape's item is worked out on any core and joins the Lut in
  // shape order. Its key: where the shape's first entry has an item, that
  // item's key under kMeasuredDefaultsId (its dims are the same, so it
  // shares their place in dim_names); else made when the item joins. Its
  // variant is looked up among the strings the entries interned (the map
  // is copied: joining items intern more).
  struct Chosen {
    Item item;
    Key key{kNone, 0, 0, 0, 0, 0};
  };
  const absl::flat_hash_map<std::string, uint32_t> interned = scratch->interned;
  const uint32_t machine = Intern(kMeasuredDefaultsId, &scratch->interned);
  items.reserve(items.size() + shapes.size());  // no entry's item moves while shapes read them
  keys.reserve(keys.size() + shapes.size());
  lut_internal::InOrderOnEveryCore<Chosen>(
      static_cast<int>(shapes.size()), [](int, Chosen*) {},
      [&](int s, Chosen* chosen, const Chosen*) {
        absl::InlinedVector<const tuning::Entry*, 4> entries;
        for (size_t at = shapes[s].first; at < shapes[s].second; ++at) {
          entries.push_back(&proto.entries(by_shape[at].second));
        }
        const int first = by_shape[shapes[s].first].second;
        const tuning::ProblemKey& key = proto.entries(first).key();
        const OpEntry& op = *FindOp(key.op());
        std::vector<MeasuredOn> measured = Measure(entries, by_name);
        if (measured.empty()) return;
        std::sort(measured.begin(), measured.end(), [&](const MeasuredOn& a, const MeasuredOn& b) {
          return rank_of(a.entry->key().machine_id()) < rank_of(b.entry->key().machine_id()) ||
                 (rank_of(a.entry->key().machine_id()) == rank_of(b.entry->key().machine_id()) &&
                  a.entry->key().machine_id() < b.entry->key().machine_id());
        });
        // The entry's item made the same shape-only arguments; they are made
        // again only for a configuration it did not check.
        const uint32_t item = scratch->entry_item[first];
        const Dims dims = item != kNone ? items[item].dims : CanonicalDims(*op.op, KeyDims(key));
        ShapeArgs own;
        absl::Status own_status = item != kNone && !scratch->own_shape_ok[first]
                                      ? absl::InvalidArgumentError("")
                                      : absl::OkStatus();
        bool made = false;
        auto make = [&]() -> const ShapeArgs& {
          if (!made) own_status = MakeShape(*op.op, *op.FindTypes(key.dtype()), dims, &own);
          made = true;
          return own;
        };
        if (item == kNone) make();
        if (!own_status.ok()) return;
        chosen->item = MeasuredDefault(dims, make, measured, Score(measured), *scratch);
        if (chosen->item.kernel == nullptr) return;
        if (auto it = interned.find(chosen->item.trial->variant()); it != interned.end()) {
          chosen->item.variant = it->second;
        }
        if (item != kNone) chosen->key = keys[item];
      },
      [&](int s, Chosen* chosen) {
        Item& item = chosen->item;
        if (item.kernel == nullptr) return;
        if (item.variant == kNone) item.variant = Intern(item.trial->variant(), &scratch->interned);
        Key& key = chosen->key;
        if (key.op == kNone) {
          const tuning::ProblemKey& shape_key = proto.entries(by_shape[shapes[s].first].second).key();
          key = Key{Intern(shape_key.op(), &scratch->interned),
                    Intern(shape_key.dtype(), &scratch->interned),
                    0,
                    Intern(shape_key.data_class(), &scratch->interned),
                    static_cast<uint32_t>(dim_names.size()),
                    static_cast<uint32_t>(item.dims.size())};
          for (const auto& [name, value] : item.dims) {
            dim_names.push_back(Intern(name, &scratch->interned));
            dim_values.push_back(value);
          }
        }
        key.machine = machine;
        keys.push_back(key);
        items.push_back(std::move(item));
      });
}

Lut::Impl::Item Lut::Impl::MeasuredDefault(const Dims& dims, const std::function<const ShapeArgs&()>& own,
                                           const std::vector<MeasuredOn>& measured,
                                           const std::vector<VariantScore>& scores,
                                           const lut_internal::BuildScratch& scratch) {
  // The best-scored variant with a configuration legal for the shape,
  // from the most similar machine that measured it.
  for (const VariantScore& score : scores) {
    const Kernel& kernel = *score.kernel;
    Item item;
    for (const MeasuredOn& m : measured) {
      const lut_internal::Fastest* f = m.Find(score.name);
      if (f == nullptr) continue;
      std::optional<Config> config;
      const tuning::Trial* copied = nullptr;
      if (auto checked = scratch.checked.find(f->trial); checked != scratch.checked.end()) {
        config = checked->second.config;
        copied = checked->second.copy;
      } else if (absl::StatusOr<Config> c = FromProtoConfig(kernel, f->trial->config()); c.ok()) {
        const ShapeArgs& shape = own();
        if (Legal(kernel, *c, shape).ok()) config = *std::move(c);
      }
      if (!config.has_value()) continue;
      item.kernel = &kernel;
      item.config = *std::move(config);
      if (copied == nullptr) {
        tuning::Trial* trial = google::protobuf::Arena::CreateMessage<tuning::Trial>(&arena);
        *trial = *f->trial;
        copied = trial;
      }
      item.trial = copied;
      item.threads = copied->threads();
      break;
    }
    if (item.kernel == nullptr) continue;
    item.dims = dims;
    item.mean_slowdown = std::exp(score.log_ratio);
    item.measured_on = static_cast<uint32_t>(score.count);
    item.measured_of = static_cast<uint32_t>(measured.size());
    return item;
  }
  return Item();
}

std::string Lut::Impl::Note(const Item& item) const {
  return absl::StrFormat("%s, %.2fx the best (geometric mean) on %d of the %d machines that tuned %s",
                         item.kernel->name(), item.mean_slowdown, item.measured_on, item.measured_of,
                         DimsString(item.dims));
}

}  // namespace kreg
