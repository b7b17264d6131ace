// Lut::Build: every entry of a TuningDb resolved against the registry's
// kernels into an item, then the exact index and the nearest-lookup groups.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "in_order.h"
#include "lut_internal.h"
#include "tuning_db_internal.h"
#include "oneapi/tbb/parallel_for.h"
#include "oneapi/tbb/parallel_invoke.h"

namespace kreg {

using lut_internal::BuildScratch;
using lut_internal::Digest;
using lut_internal::ExactHash;
using lut_internal::GroupHash;
using lut_internal::kNone;
using lut_internal::kRankedTrials;
using lut_internal::Legal;
using lut_internal::Log2;
using lut_internal::MakeShape;

absl::StatusOr<Lut> Lut::Build(const TuningDb& db, const Registry& registry, const LutOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->policy = options.machines;
  impl->host.struct_size = sizeof(kreg_host);
  impl->host.num_threads = 0;
  impl->host.isa = CpuIsa();
  for (const tuning::CommModel& m : db.proto().comm_models()) {
    impl->comm_models[{m.machine_id(), m.backend()}] =
        kreg_comm_model{sizeof(kreg_comm_model), m.alpha_s(), m.beta_s_per_byte(), m.gamma_s_per_byte()};
  }
  // Kernels by name, looked up once each.
  Impl::KernelsByName by_name;
  for (std::shared_ptr<const Kernel>& k : registry.Kernels()) {
    impl->kernels.push_back(k);
    by_name.emplace(k->name(), std::move(k));
  }
  impl->AddOps(registry, by_name);
  const tuning::Database& proto = db.proto();
  lut_internal::BuildScratch scratch;
  // The machines share nothing with the entries' items.
  tbb::parallel_invoke([&] { impl->AddEntries(proto, by_name, &scratch); }, [&] { impl->AddMachines(proto); });
  impl->AddMeasuredDefaults(proto, by_name, &scratch);
  // The two indexes share nothing but the items they read.
  tbb::parallel_invoke([&] { impl->IndexExact(); }, [&] { impl->IndexGroups(); });
  return Lut(std::move(impl));
}

void Lut::Impl::AddOps(const Registry& registry, const KernelsByName& by_name) {
  // The ops, and their defaults: the op's preferred variants in its order,
  // the other available kernels by name, the reference last.
  for (std::shared_ptr<const Op>& op : registry.Ops()) {
    OpEntry entry;
    std::vector<const Kernel*> order;
    auto add = [&](const Kernel* k) {
      if (k == nullptr || !k->available()) return;
      if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
    };
    for (const std::string& variant : op->default_variants()) {
      auto it = by_name.find(absl::StrCat(op->name(), "/", variant));
      if (it != by_name.end()) add(it->second.get());
    }
    const Kernel* reference = nullptr;
    for (const std::shared_ptr<const Kernel>& k : kernels) {  // sorted by name
      if (k->op() != op->name()) continue;
      if (k->device() == KREG_DEVICE_CUDA) entry.gpu_defaults.emplace_back(k.get(), k->DefaultConfig());
      if (k->is_reference()) {
        if (reference == nullptr) reference = k.get();
        continue;
      }
      add(k.get());
    }
    add(reference);
    for (const Kernel* k : order) entry.defaults.emplace_back(k, k->DefaultConfig());
    entry.op = std::move(op);
    ops.push_back(std::move(entry));
  }
}

uint32_t Lut::Impl::Intern(absl::string_view s, absl::flat_hash_map<std::string, uint32_t>* interned) {
  auto [it, added] = interned->try_emplace(s, strings.size());
  if (added) strings.emplace_back(s);
  return it->second;
}

void Lut::Impl::AddEntries(const tuning::Database& proto, const KernelsByName& by_name, BuildScratch* scratch) {
  // One item per entry, answering from its fastest usable trial. Entries
  // go through in blocks: their ops and tensor types found in table order
  // (a dtype signature is parsed where it first appears), their items
  // worked out on every core (PrepareEntry reads only the entry and the
  // registry), then joined to the Lut in table order (JoinEntry), so that
  // strings, warnings and answers are those of one pass in order. A block
  // goes through while it is in cache; one core runs them in turn.
  const int n = proto.entries_size();
  items.reserve(n);
  keys.reserve(n);
  scratch->entry_item.assign(n, kNone);
  scratch->own_shape_ok.assign(n, false);
  std::vector<std::pair<std::string, int>> unknown_ops;  // op -> entries, first seen first
  lut_internal::InOrderOnEveryCore<PreparedEntry>(
      n,
      [&](int i, PreparedEntry* p) {
        const tuning::ProblemKey& key = proto.entries(i).key();
        auto found = std::find_if(ops.begin(), ops.end(), [&](const OpEntry& o) { return o.op->name() == key.op(); });
        if (found == ops.end()) {
          auto it = std::find_if(unknown_ops.begin(), unknown_ops.end(),
                                 [&](const auto& u) { return u.first == key.op(); });
          if (it == unknown_ops.end()) {
            unknown_ops.emplace_back(key.op(), 1);
          } else {
            ++it->second;
          }
          return;
        }
        p->op = &*found;
        p->types = found->FindTypes(key.dtype());
        if (p->types != nullptr) return;
        absl::StatusOr<TensorTypes> parsed = found->op->TypesFromKey(key.dtype());
        if (!parsed.ok()) {
          p->warnings.push_back(absl::StrCat(KeyString(key), ": ", parsed.status().message(), "; entry skipped"));
          return;
        }
        // A deque: the types already handed out stay where they are.
        found->types.emplace_back(key.dtype(), *std::move(parsed));
        p->types = &found->types.back().second;
      },
      [&](int i, PreparedEntry* p, const PreparedEntry* before) {
        if (p->types == nullptr) return;
        PrepareEntry(proto.entries(i), *p->op->op, *p->types, by_name, p);
        if (before == nullptr || before->types == nullptr) return;
        const tuning::ProblemKey& a = proto.entries(i - 1).key();
        const tuning::ProblemKey& b = proto.entries(i).key();
        const Dims& da = before->item.dims;
        const Dims& db = p->item.dims;
        p->like_before = a.op() == b.op() && a.dtype() == b.dtype() && a.machine_id() == b.machine_id() &&
                         a.data_class() == b.data_class() &&
                         std::equal(da.begin(), da.end(), db.begin(), db.end(),
                                    [](const auto& x, const auto& y) { return x.first == y.first; });
      },
      [&](int i, PreparedEntry* p) {
        if (p->types != nullptr) {
          JoinEntry(i, proto.entries(i), p, scratch);
        } else if (!p->warnings.empty()) {
          warnings.push_back(std::move(p->warnings.front()));
        }
      });
  for (const auto& [op, count] : unknown_ops) {
    warnings.push_back(absl::StrCat("op '", op, "' is not registered (no loaded plugin declares it): ", count,
                                    count == 1 ? " entry" : " entries", " cannot answer"));
  }
}

void Lut::Impl::PrepareEntry(const tuning::Entry& e, const Op& op, const TensorTypes& types,
                             const KernelsByName& by_name, PreparedEntry* p) {
  Item& item = p->item;
  item.dims = CanonicalDims(op, KeyDims(e.key()));
  // The key's text is made when needed (KeyText) unless its dims are not
  // in canonical order, when it cannot be made from the compact key.
  bool canonical = static_cast<size_t>(e.key().dims_size()) == item.dims.size();
  for (int d = 0; canonical && d < e.key().dims_size(); ++d) {
    canonical = e.key().dims(d).name() == item.dims[d].first && e.key().dims(d).value() == item.dims[d].second;
  }
  if (!canonical || e.key().machine_id() == kMeasuredDefaultsId) item.key_text = KeyString(e.key());
  item.incomplete = e.incomplete();
  std::vector<const tuning::Trial*> trials;
  for (const tuning::Trial& t : e.trials()) {
    if (t.status() == tuning::Trial::OK && std::isfinite(t.median_ns())) trials.push_back(&t);
  }
  if (trials.empty() && e.has_best()) trials.push_back(&e.best());
  // Ranked as the table ranks its best, so the answer is the entry's best
  // whichever order the trials came in.
  std::sort(trials.begin(), trials.end(),
            [](const tuning::Trial* a, const tuning::Trial* b) { return tuning_db_internal::Faster(*a, *b); });
  ShapeArgs own;
  const absl::Status own_shape = MakeShape(op, types, item.dims, &own);
  p->own_shape_ok = own_shape.ok();
  // What KeyText will say of the item (its key's KeyString), made if needed.
  std::optional<std::string> made;
  auto text = [&]() -> const std::string& {
    if (!made.has_value()) made = item.key_text.empty() ? KeyString(e.key()) : item.key_text;
    return *made;
  };
  if (!own_shape.ok()) p->warnings.push_back(absl::StrCat(text(), ": ", own_shape.message(), "; entry skipped"));
  // The fastest trial's staleness, if it was.
  const std::string stale =
      ChooseTrials(e.key().op(), text, trials, by_name, own, own_shape, IsGpuMachineId(e.key().machine_id()), p);
  if (item.kernel != nullptr) {
    item.problem.clear();
    if (!stale.empty()) {
      p->warnings.push_back(absl::StrCat(stale, "; answering from ", item.kernel->name(), " v",
                                         item.trial->variant_version(), " instead"));
    }
  } else {
    if (trials.empty()) item.problem = absl::StrCat(text(), ": no OK trial");
    if (!stale.empty()) p->warnings.push_back(absl::StrCat(stale, "; entry skipped"));
  }
}

void Lut::Impl::JoinEntry(int index, const tuning::Entry& e, PreparedEntry* p, BuildScratch* scratch) {
  Item& item = p->item;
  // Most entries share their strings with the entry before: its ids are
  // tried before the map.
  const Key* before = keys.empty() ? nullptr : &keys.back();
  const Item* item_before = items.empty() ? nullptr : &items.back();
  auto intern = [&](absl::string_view s, uint32_t id_before) {
    return id_before != kNone && lut_internal::Eq(strings[id_before], s) ? id_before
                                                                         : Intern(s, &scratch->interned);
  };
  Key key;
  if (p->like_before && before != nullptr && scratch->entry_item[index - 1] == keys.size() - 1) {
    // The entry before's strings (PrepareEntry compared them), without
    // reading this one's again.
    key = *before;
    key.dims_begin = static_cast<uint32_t>(dim_names.size());
    for (size_t d = 0; d < item.dims.size(); ++d) {
      const uint32_t name = dim_names[before->dims_begin + d];
      dim_names.push_back(name);
      dim_values.push_back(item.dims[d].second);
    }
  } else {
    key = Key{intern(e.key().op(), before ? before->op : kNone),
              intern(e.key().dtype(), before ? before->dtype : kNone),
              intern(e.key().machine_id(), before ? before->machine : kNone),
              intern(e.key().data_class(), before ? before->data_class : kNone),
              static_cast<uint32_t>(dim_names.size()),
              static_cast<uint32_t>(item.dims.size())};
    for (size_t d = 0; d < item.dims.size(); ++d) {
      const bool has_before = before != nullptr && d < before->dims_count;
      dim_names.push_back(intern(item.dims[d].first, has_before ? dim_names[before->dims_begin + d] : kNone));
      dim_values.push_back(item.dims[d].second);
    }
  }
  scratch->own_shape_ok[index] = p->own_shape_ok;
  for (auto& [trial, checked] : p->checked) scratch->checked.try_emplace(trial, std::move(checked));
  if (item.kernel != nullptr) {
    ++usable;
    item.variant = intern(p->winner_variant, item_before != nullptr ? item_before->variant : kNone);
    item.ranked_begin = static_cast<uint32_t>(trial_ranks.size());
    item.ranked_count = static_cast<uint32_t>(p->ranked.size());
    trial_ranks.insert(trial_ranks.end(), p->ranked.begin(), p->ranked.end());
    item.slowdowns_begin = static_cast<uint32_t>(slowdowns.size());
    item.slowdowns_count = static_cast<uint32_t>(p->slowdowns.size());
    for (size_t v = 0; v < p->slowdowns.size(); ++v) {
      // The entry before's variants, likely in the same order.
      const bool has_before = item_before != nullptr && item_before->kernel != nullptr &&
                              v < item_before->slowdowns_count;
      slowdowns.emplace_back(
          intern(p->slowdowns[v].first, has_before ? slowdowns[item_before->slowdowns_begin + v].first : kNone),
          p->slowdowns[v].second);
    }
  }
  for (std::string& w : p->warnings) warnings.push_back(std::move(w));
  scratch->entry_item[index] = static_cast<uint32_t>(items.size());
  keys.push_back(key);
  items.push_back(std::move(item));
}

std::string Lut::Impl::ChooseTrials(const std::string& op_name, absl::FunctionRef<const std::string&()> text,
                                    const std::vector<const tuning::Trial*>& trials,
                                    const KernelsByName& by_name, const ShapeArgs& own,
                                    const absl::Status& own_shape, bool on_gpu, PreparedEntry* p) {
  Item* item = &p->item;
  std::string stale;
  // Thread counts measured (past the fastest, looked for only when the
  // entry has measurements on chosen thread counts).
  absl::InlinedVector<int, 4> counts;
  for (const tuning::Trial* t : trials) {
    if (std::find(counts.begin(), counts.end(), t->threads()) == counts.end()) counts.push_back(t->threads());
  }
  if (counts.size() == 1) counts.clear();
  const tuning::Trial* winner = nullptr;
  auto copy = [&](const tuning::Trial* t) {
    if (t == winner && item->trial != nullptr) return item->trial;
    tuning::Trial* out = google::protobuf::Arena::CreateMessage<tuning::Trial>(&arena);
    *out = *t;
    return static_cast<const tuning::Trial*>(out);
  };
  for (size_t i = 0; i < trials.size() && (item->kernel == nullptr || item->on_threads.size() < counts.size()); ++i) {
    const tuning::Trial& t = *trials[i];
    if (item->kernel != nullptr &&
        std::any_of(item->on_threads.begin(), item->on_threads.end(),
                    [&](const Item::OnThreads& on) { return on.threads == t.threads(); })) {
      continue;  // a faster one on this thread count answers already
    }
    std::string name = absl::StrCat(op_name, "/", t.variant());
    std::string problem;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      problem = absl::StrCat(text(), ": ", name, " is not registered");
    } else if (it->second->version() != t.variant_version()) {
      problem = absl::StrCat("stale entry ", text(), ": ", name, " v", t.variant_version(), " was tuned, v",
                             it->second->version(), " is loaded");
      if (i == 0) stale = problem;
    } else if (on_gpu != (it->second->device() == KREG_DEVICE_CUDA)) {
      // A GPU's entry answers with its CUDA kernels, a CPU's with the others.
      problem = absl::StrCat(text(), ": ", name, on_gpu ? " does not run on a GPU" : " runs on a GPU");
    } else if (!on_gpu && !it->second->available()) {
      problem = absl::StrCat(text(), ": ", name, " needs ", IsaString(it->second->required_isa() & ~CpuIsa()),
                             ", which this CPU lacks");
    } else if (!own_shape.ok()) {
      problem = absl::StrCat(text(), ": ", own_shape.message());
    } else {
      absl::StatusOr<Config> config = FromProtoConfig(*it->second, t.config());
      absl::Status legal = config.ok() ? Legal(*it->second, *config, own) : config.status();
      p->checked.emplace_back(
          &t, lut_internal::BuildScratch::Checked{legal.ok() ? std::optional<Config>(*config) : std::nullopt});
      if (legal.ok() && item->kernel == nullptr) {
        winner = &t;
        item->kernel = it->second.get();
        item->config = *config;
        item->trial = copy(&t);
        item->threads = t.threads();
        p->checked.back().second.copy = item->trial;
      }
      if (legal.ok() && !counts.empty()) {
        item->on_threads.push_back({t.threads(), it->second.get(), *std::move(config), copy(&t)});
      } else if (!legal.ok()) {
        problem = absl::StrCat(text(), ": ", name, " ", ConfigText(t.config()), ": ", legal.message());
      }
    }
    if (item->problem.empty()) item->problem = std::move(problem);
  }
  if (item->kernel != nullptr) RankTrials(trials, winner, p);
  return stale;
}

void Lut::Impl::RankTrials(const std::vector<const tuning::Trial*>& trials, const tuning::Trial* winner,
                           PreparedEntry* p) {
  Item* item = &p->item;
  p->winner_variant = winner->variant();
  item->trial_hash = absl::HashOf(TrialId(*winner));
  const double fastest = trials.front()->median_ns();
  for (const tuning::Trial* t : trials) {
    const float slower = static_cast<float>(std::log2(std::max(1.0, t->median_ns() / std::max(fastest, 1e-9))));
    if (p->ranked.size() < kRankedTrials) {
      p->ranked.emplace_back(t == winner ? item->trial_hash : absl::HashOf(TrialId(*t)), slower);
    }
    if (std::none_of(p->slowdowns.begin(), p->slowdowns.end(),
                     [&](const auto& v) { return v.first == t->variant(); })) {
      p->slowdowns.emplace_back(t->variant(), slower);
    }
  }
  std::sort(p->ranked.begin(), p->ranked.end());
}

void Lut::Impl::IndexExact() {
  const uint32_t num_items = static_cast<uint32_t>(items.size());
  exact_next.assign(num_items, kNone);
  for (uint32_t i = num_items; i-- > 0;) {
    const Key& key = keys[i];
    const std::string& op = strings[key.op];
    const uint64_t h = ExactHash(op, strings[key.dtype], strings[key.machine], strings[key.data_class],
                                 Digest(FindOp(op)->op.get(), items[i].dims));
    auto [it, added] = exact.try_emplace(h, i);
    if (!added) {
      exact_next[i] = it->second;
      it->second = i;
    }
  }
}

void Lut::Impl::IndexGroups() {
  const uint32_t num_items = static_cast<uint32_t>(items.size());
  absl::flat_hash_map<std::string, uint32_t> group_of;
  // Items of one group usually come together: an item with the previous
  // one's key fields and dim names (in the same order) joins its group
  // without building the group's id.
  uint32_t previous = kNone, previous_group = 0;
  auto same_group = [&](const Key& a, const Key& b) {
    return a.op == b.op && a.dtype == b.dtype && a.machine == b.machine && a.data_class == b.data_class &&
           a.dims_count == b.dims_count &&
           std::equal(dim_names.begin() + a.dims_begin, dim_names.begin() + a.dims_begin + a.dims_count,
                      dim_names.begin() + b.dims_begin);
  };
  for (uint32_t i = 0; i < num_items; ++i) {
    const Key& key = keys[i];
    if (previous != kNone && same_group(keys[previous], key)) {
      groups[previous_group].items.push_back(i);
      previous = i;
      continue;
    }
    std::vector<uint32_t> names(dim_names.begin() + key.dims_begin,
                                dim_names.begin() + key.dims_begin + key.dims_count);
    std::vector<uint32_t> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    std::string id = absl::StrCat(key.op, ",", key.dtype, ",", key.machine, ",", key.data_class,
                                  ":", absl::StrJoin(sorted, ","));
    auto [it, added] = group_of.try_emplace(id, groups.size());
    if (added) {
      groups.emplace_back();
      groups.back().key = key;
      groups.back().names = std::move(names);
      const std::string& op = strings[key.op];
      group_index[GroupHash(op, strings[key.dtype], strings[key.machine], strings[key.data_class],
                            Digest(FindOp(op)->op.get(), items[i].dims))]
          .push_back(it->second);
    }
    groups[it->second].items.push_back(i);
    previous = i;
    previous_group = it->second;
  }
  // Each group's tree on its own: they share nothing.
  tbb::parallel_for(size_t{0}, groups.size(), [&](size_t i) {
    Group& g = groups[i];
    const size_t d = g.names.size();
    g.coords.resize(g.items.size() * d);
    for (size_t p = 0; p < g.items.size(); ++p) {
      const Key& key = keys[g.items[p]];
      for (size_t j = 0; j < d; ++j) {
        for (uint32_t at = key.dims_begin; at < key.dims_begin + key.dims_count; ++at) {
          if (dim_names[at] == g.names[j]) g.coords[p * d + j] = Log2(dim_values[at]);
        }
      }
    }
    BuildTree(&g, g.coords, d, 0, static_cast<uint32_t>(g.items.size()), 0);
  });
}

}  // namespace kreg
