// Lut: a TuningDb resolved against a registry's kernels and indexed for
// run-time queries.
//
// Exact lookups hash the asked key's fields in place (dims combined
// order-independently, attributes at their defaults skipped) into a
// flat_hash_map of entry indices, then compare fields: no allocation.
// Entry keys live in compact arrays with their strings interned, so a probe
// touches a few cache lines. Nearest lookups go to the entry's group (op,
// dtype signature, machine, data class, dim names): a k-d tree over log2 dims (median
// splits on the widest axis, leaves of up to 32) searched depth first, nearer child
// first, skipping any box farther (L1) than the eighth-best entry found.
// Ops are the registry's: keys are checked and shape-only arguments built by
// the Op, legality asked of the kernel's Check.
//
// Other machines answer through the same two lookups under their own ids:
// the similar machines of each known machine are ranked once at Build, and
// the measured defaults are items of their own under kMeasuredDefaultsId,
// one per shape tuned anywhere, found by exact and nearest lookups like any
// entry.
#include "kreg/lut.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kreg {
namespace {

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
constexpr size_t kCandidates = 8;  // nearest candidates kept per search pass
// A nearest answer weighs the kCandidates nearest entries' winners by how
// each fared at every one of them (Consensus): the fastest kRankedTrials
// trials of each entry, and each variant's fastest, are kept for it.
constexpr size_t kRankedTrials = 32;
// What a winner not measured at a neighbour (nor its variant) is taken to
// lose there: log2 of a 2x slowdown; a variant measured there with another
// configuration, its fastest there times kOtherConfig.
constexpr float kUnmeasuredLog2 = 1.0f;
constexpr float kOtherConfigLog2 = 0.1375f;  // log2(1.1)
constexpr size_t kLeafSize = 32;   // k-d tree leaves hold at most this many entries

// ---- Shape-only arguments ---------------------------------------------------

// Shape-only arguments of `op` for a key's tensor types (Op::TypesFromKey of
// its dtype signature) and dims, built by the op; InvalidArgument when the op
// does not take them.
absl::Status MakeShape(const Op& op, const TensorTypes& types, const Dims& dims, ShapeArgs* out) {
  absl::StatusOr<Values> values = op.ParseValues(dims);
  if (!values.ok()) return values.status();
  return op.MakeShapeArgs(*values, types, out);  // completes the dims (defaults), then checks
}

// Whether `config` is legal for the shape (validated when it was made).
absl::Status Legal(const Kernel& kernel, const Config& config, const ShapeArgs& shape) {
  return kernel.CheckConfig(config, *shape.args());
}

// ---- Hashing keys in place --------------------------------------------------

uint64_t Load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint64_t Load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// wyhash's multiply-mix: cheap, and good enough for an in-memory index.
inline uint64_t Mix(uint64_t a, uint64_t b) {
  const unsigned __int128 m =
      static_cast<unsigned __int128>(a ^ 0xa0761d6478bd642full) * (b ^ 0xe7037ed1a0b428dbull);
  return static_cast<uint64_t>(m) ^ static_cast<uint64_t>(m >> 64);
}

// Keys are short strings (op, dim names, a 16-digit machine id): hash them
// with a few overlapping loads, not a call.
inline uint64_t HashBytes(absl::string_view s) {
  const char* p = s.data();
  const size_t n = s.size();
  uint64_t a = 0, b = 0, h = n;
  if (n > 16) {
    for (size_t i = 0; i + 16 < n; i += 16) h = Mix(Load64(p + i) ^ h, Load64(p + i + 8));
    a = Load64(p + n - 16);
    b = Load64(p + n - 8);
  } else if (n >= 8) {
    a = Load64(p);
    b = Load64(p + n - 8);
  } else if (n >= 4) {
    a = Load32(p);
    b = Load32(p + n - 4);
  } else if (n > 0) {
    a = (uint64_t{static_cast<uint8_t>(p[0])} << 16) |
        (uint64_t{static_cast<uint8_t>(p[n >> 1])} << 8) | static_cast<uint8_t>(p[n - 1]);
  }
  return Mix(a ^ h, b ^ 0x8ebc6af09c88c6e3ull);
}

// String equality without a call for short strings.
inline bool Eq(absl::string_view x, absl::string_view y) {
  const size_t n = x.size();
  if (n != y.size()) return false;
  const char* p = x.data();
  const char* q = y.data();
  if (n >= 8 && n <= 16) return Load64(p) == Load64(q) && Load64(p + n - 8) == Load64(q + n - 8);
  if (n >= 4 && n < 8) return Load32(p) == Load32(q) && Load32(p + n - 4) == Load32(q + n - 4);
  if (n < 4) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] != q[i]) return false;
    }
    return true;
  }
  return std::memcmp(p, q, n) == 0;
}

// Whether `dim` is an integer attribute of `op` at its default value: such
// dims are not part of a canonical key.
bool IsDefaultAttribute(const Op* op, const std::pair<std::string, int64_t>& dim) {
  if (op == nullptr) return false;
  for (const AttrInfo& a : op->attrs()) {
    if (!a.is_float && Eq(a.name, dim.first)) return a.default_value.i == dim.second;
  }
  return false;
}

struct DimsDigest {
  uint64_t values = 0;  // order-independent combination of (name, value)
  uint64_t names = 0;   // order-independent combination of names
  size_t count = 0;
};

DimsDigest Digest(const Op* op, const Dims& dims) {
  DimsDigest d;
  for (const auto& dim : dims) {
    if (IsDefaultAttribute(op, dim)) continue;
    const uint64_t name = HashBytes(dim.first);
    d.names += name;
    d.values += Mix(name, static_cast<uint64_t>(dim.second));
    ++d.count;
  }
  return d;
}

uint64_t KeyHash(absl::string_view op, absl::string_view dtype, absl::string_view machine,
                 absl::string_view data_class, uint64_t dims, size_t count) {
  uint64_t h = Mix(HashBytes(op), HashBytes(dtype));
  h = Mix(h ^ HashBytes(machine), HashBytes(data_class));
  return Mix(h ^ dims, count);
}

uint64_t ExactHash(absl::string_view op, absl::string_view dtype, absl::string_view machine,
                   absl::string_view data_class, const DimsDigest& d) {
  return KeyHash(op, dtype, machine, data_class, d.values, d.count);
}

uint64_t GroupHash(absl::string_view op, absl::string_view dtype, absl::string_view machine,
                   absl::string_view data_class, const DimsDigest& d) {
  return KeyHash(op, dtype, machine, data_class, d.names, d.count);
}

float Log2(int64_t v) { return std::log2(static_cast<float>(std::max<int64_t>(v, 0)) + 1.0f); }

// An item at a distance; ties go to the earlier entry.
struct Candidate {
  float dist;
  uint32_t item;
  bool operator<(const Candidate& o) const {
    return dist != o.dist ? dist < o.dist : item < o.item;
  }
};

// The best `limit` (<= kCandidates) candidates seen, sorted.
struct Best {
  explicit Best(size_t limit) : limit(limit) {}
  Candidate c[kCandidates];
  size_t n = 0;
  size_t limit;
  float Worst() const { return n < limit ? std::numeric_limits<float>::infinity() : c[n - 1].dist; }
  void Offer(const Candidate& x) {
    if (n == limit && !(x < c[n - 1])) return;
    size_t i = n < limit ? n++ : n - 1;
    for (; i > 0 && x < c[i - 1]; --i) c[i] = c[i - 1];
    c[i] = x;
  }
};

}  // namespace

// ---- The index -----------------------------------------------------------------

struct Lut::Impl {
  // What an entry answers with.
  struct Item {
    Dims dims;  // canonical
    std::string key_text;
    const Kernel* kernel = nullptr;  // nullptr: cannot answer, see `problem`
    Config config;
    tuning::Trial trial;
    bool incomplete = false;  // its sweep was cut short
    std::string problem;
    std::string note;  // a measured default's provenance
    // When the entry holds measurements on chosen thread counts: the
    // fastest usable one on each thread count (0: all cores), fastest first.
    struct OnThreads {
      int threads;
      const Kernel* kernel;
      Config config;
      tuning::Trial trial;
    };
    std::vector<OnThreads> on_threads;
    // For Consensus: log2(median / the fastest's) of the entry's fastest
    // kRankedTrials trials by hash of their TrialId, sorted; of each
    // variant's fastest, by variant.
    std::vector<std::pair<uint64_t, float>> ranked;
    std::vector<std::pair<std::string, float>> variants;
    uint64_t trial_hash = 0;  // of `trial`
  };
  // An entry's key, compact for the exact path: strings interned in
  // `strings`, dims in `dim_names` / `dim_values` [dims_begin, +dims_count).
  struct Key {
    uint32_t op, dtype, machine, data_class;
    uint32_t dims_begin, dims_count;
  };
  // The entries sharing op, dtype signature, machine, data class and dim
  // names, as a
  // k-d tree over log2 dims for nearest lookups.
  struct Group {
    Key key;                      // dims_*: the first item's (for the names)
    std::vector<uint32_t> names;  // interned dim names, in coordinate order
    std::vector<uint32_t> items;  // in tree order
    std::vector<float> coords;    // items.size() x names.size(), tree order
    struct Node {
      uint32_t begin, end;  // range of `items`
      int32_t left = -1, right = -1;
    };
    std::vector<Node> nodes;   // nodes[0] is the root
    std::vector<float> boxes;  // per node: lo[d] then hi[d]
  };
  // An op of the registry and what it answers with when nothing is tuned.
  struct OpEntry {
    std::shared_ptr<const Op> op;  // keeps its plugin loaded
    // Available kernels with their default configs: the op's
    // default_variants in order, the others by name, the reference last.
    std::vector<std::pair<const Kernel*, Config>> defaults;
    // The op's CUDA kernels by name, with their default configs: a GPU's
    // defaults (whether there is a GPU to run them on is the caller's
    // question: kreg/device.h CanRun).
    std::vector<std::pair<const Kernel*, Config>> gpu_defaults;
    // Op::TypesFromKey of the dtype signatures its entries use.
    std::vector<std::pair<std::string, TensorTypes>> types;

    const TensorTypes* FindTypes(absl::string_view dtype) const {
      for (const auto& [signature, t] : types) {
        if (Eq(signature, dtype)) return &t;
      }
      return nullptr;
    }
  };

  std::vector<std::shared_ptr<const Kernel>> kernels;  // keeps plugins loaded
  std::vector<OpEntry> ops;
  std::vector<std::string> strings;
  std::vector<uint32_t> dim_names;
  std::vector<int64_t> dim_values;
  std::vector<Key> keys;  // parallel to items
  std::vector<Item> items;
  absl::flat_hash_map<uint64_t, uint32_t> exact;  // hash -> first item
  std::vector<uint32_t> exact_next;               // next item with that hash
  std::vector<Group> groups;
  absl::flat_hash_map<uint64_t, std::vector<uint32_t>> group_index;  // hash -> groups
  std::vector<std::string> warnings;
  size_t usable = 0;
  // What the op's default_variant sees: this CPU, the host's threads.
  kreg_host host{};
  // Calibrated communicator costs, by machine id and backend.
  std::map<std::pair<std::string, std::string>, kreg_comm_model> comm_models;
  MachinePolicy policy = MachinePolicy::kSimilar;
  // Machine records by id: the table's, and this machine's.
  absl::flat_hash_map<std::string, tuning::Machine> machines;
  // Per machine record: the other machines with entries that may answer for
  // it, most similar first (MachinePolicy::kSimilar).
  absl::flat_hash_map<std::string, std::vector<std::string>> similar;
  // What was tuned, for saying why a default answers: machines with any
  // entry, and "machine\x1fop\x1fdtype" of every entry.
  absl::flat_hash_set<std::string> tuned_machines, tuned_ops;

  const tuning::Machine* FindMachine(absl::string_view id) const {
    auto it = machines.find(id);
    return it == machines.end() ? nullptr : &it->second;
  }
  // Points `answer` at `item`: its fastest measurement, or with `threads`
  // (> 0) fewer than its machine's cores, its fastest on no more.
  void Fill(uint32_t i, Match match, float distance, int threads, LutAnswer* answer) const {
    const Item& item = items[i];
    answer->kernel = item.kernel;
    answer->config = &item.config;
    answer->match = match;
    answer->tuned_dims = &item.dims;
    answer->distance = distance;
    answer->trial = &item.trial;
    answer->threads = item.trial.threads();
    answer->incomplete = item.incomplete;
    answer->machine = FindMachine(strings[keys[i].machine]);
    const int cores = answer->machine != nullptr ? static_cast<int>(answer->machine->cores()) : 0;
    if (threads <= 0 || cores <= threads) return;
    for (const Item::OnThreads& on : item.on_threads) {
      if ((on.threads > 0 ? on.threads : cores) > threads) continue;
      answer->kernel = on.kernel;
      answer->config = &on.config;
      answer->trial = &on.trial;
      answer->threads = on.threads;
      return;
    }
  }
  // The entry of `machine` for exactly this problem, if it can answer;
  // else kNone, with an entry that cannot reported in answer->warnings and
  // in *unusable.
  uint32_t FindExact(absl::string_view op_name, absl::string_view dtype, absl::string_view machine,
                     absl::string_view data_class, const Dims& dims, const Op* op, const DimsDigest& digest,
                     LutAnswer* answer, uint32_t* unusable) const;
  // The nearest entry of `machine` (same op, dtype, data class and dim
  // names; not `skip`) whose config is legal for `shape`, and its distance;
  // kNone if none. Entries passed over are reported in answer->warnings.
  std::pair<uint32_t, float> FindNearest(absl::string_view op_name, absl::string_view dtype,
                                         absl::string_view machine, absl::string_view data_class,
                                         const Dims& dims, const Op* op, const DimsDigest& digest,
                                         const ShapeArgs& shape, uint32_t skip, LutAnswer* answer) const;
  // Records the table's machines and this one, what each tuned, and which
  // are similar to which.
  void AddMachines(const tuning::Database& proto);
  // Adds an item under kMeasuredDefaultsId per shape tuned on any machine
  // (see Lut::Build). Call after the entries' items, before the indexes.
  void AddMeasuredDefaults(const tuning::Database& proto,
                           const absl::flat_hash_map<std::string, std::shared_ptr<const Kernel>>& by_name);
  // Why no measurement answered for `machine`: the start of LutAnswer::why.
  std::string WhyDefault(absl::string_view op_name, absl::string_view dtype, absl::string_view machine) const;

  // The op called `name`, looked up without a call; nullptr if unknown.
  const OpEntry* FindOp(absl::string_view name) const {
    for (const OpEntry& e : ops) {
      if (Eq(e.op->name(), name)) return &e;
    }
    return nullptr;
  }

  // Whether `key` is (op, dtype, machine, data_class) with those (kept) dims.
  bool SameKey(const Key& key, absl::string_view op, absl::string_view dtype,
               absl::string_view machine, absl::string_view data_class, const Dims& dims,
               const Op* info, size_t count) const {
    if (key.dims_count != count || !Eq(strings[key.op], op) || !Eq(strings[key.dtype], dtype) ||
        !Eq(strings[key.machine], machine) || !Eq(strings[key.data_class], data_class)) {
      return false;
    }
    // Usually the dims come in the key's own order.
    size_t j = 0;
    for (const auto& dim : dims) {
      if (IsDefaultAttribute(info, dim)) continue;
      const uint32_t at = key.dims_begin + j;
      if (dim_values[at] != dim.second || !Eq(strings[dim_names[at]], dim.first)) break;
      ++j;
    }
    if (j == count) return true;
    for (const auto& dim : dims) {  // in another order
      if (IsDefaultAttribute(info, dim)) continue;
      bool found = false;
      for (uint32_t at = key.dims_begin; at < key.dims_begin + count && !found; ++at) {
        found = dim_values[at] == dim.second && Eq(strings[dim_names[at]], dim.first);
      }
      if (!found) return false;
    }
    for (uint32_t at = key.dims_begin; at < key.dims_begin + count; ++at) {
      bool found = false;
      for (const auto& dim : dims) found = found || Eq(strings[dim_names[at]], dim.first);
      if (!found) return false;
    }
    return true;
  }

  const Group* FindGroup(absl::string_view op, absl::string_view dtype, absl::string_view machine,
                         absl::string_view data_class, const Dims& dims, const Op* info,
                         const DimsDigest& digest) const {
    auto it = group_index.find(GroupHash(op, dtype, machine, data_class, digest));
    if (it == group_index.end()) return nullptr;
    for (uint32_t g : it->second) {
      const Group& group = groups[g];
      const Key& key = group.key;
      if (group.names.size() != digest.count || !Eq(strings[key.op], op) ||
          !Eq(strings[key.dtype], dtype) || !Eq(strings[key.machine], machine) ||
          !Eq(strings[key.data_class], data_class)) {
        continue;
      }
      bool same = true;
      for (const auto& dim : dims) {
        if (IsDefaultAttribute(info, dim)) continue;
        bool found = false;
        for (uint32_t name : group.names) found = found || Eq(strings[name], dim.first);
        same = same && found;
      }
      if (same) return &group;
    }
    return nullptr;
  }

  // The best->limit items of `group` nearest `q` (log2 coordinates in the
  // group's order).
  void Nearest(const Group& group, const float* q, Best* best) const {
    const size_t d = group.names.size();
    auto box_distance = [&](int32_t node) {
      const float* lo = &group.boxes[2 * d * node];
      const float* hi = lo + d;
      float sum = 0;
      for (size_t j = 0; j < d; ++j) sum += std::max(0.0f, std::max(lo[j] - q[j], q[j] - hi[j]));
      return sum;
    };
    struct Frame {
      int32_t node;
      float bound;
    };
    Frame stack[2 * 64 + 2];  // two per level; a median split is at most 64 deep
    int top = 0;
    stack[top++] = {0, box_distance(0)};
    while (top > 0) {
      const Frame f = stack[--top];
      if (f.bound > best->Worst()) continue;
      const Group::Node& node = group.nodes[f.node];
      if (node.left < 0) {
        for (uint32_t p = node.begin; p < node.end; ++p) {
          const float* c = &group.coords[p * d];
          float sum = 0;
          for (size_t j = 0; j < d; ++j) sum += std::fabs(c[j] - q[j]);
          best->Offer({sum, group.items[p]});
        }
        continue;
      }
      Frame near{node.left, box_distance(node.left)}, far{node.right, box_distance(node.right)};
      if (far.bound < near.bound) std::swap(near, far);
      stack[top++] = far;
      stack[top++] = near;
    }
  }

  // Builds the k-d tree of `g` over items [begin, end) of `coords` (row-major,
  // `d` per item, permuted along with g->items). Returns the node.
  static int32_t BuildTree(Group* g, std::vector<float>& coords, size_t d, uint32_t begin,
                           uint32_t end, int depth);

  // Neighbours can disagree, and the nearest entry's winner can be slow a
  // step away. Among the winners of the kCandidates nearest entries that
  // are legal here, the one least slower than each neighbour's fastest, as
  // that neighbour measured it (log2 of the ratio; kOtherConfigLog2 more
  // than its variant's fastest there when not that configuration;
  // kUnmeasuredLog2 when not the variant), weighted by nearness (1 / (d +
  // 1/4)^2 for an L1 distance d in log2 dims: a neighbour twice as far
  // counts about a quarter as much; with the cube, the nearer of two
  // grid points a crossover lies between outvoted the farther one even
  // where the farther one's winner was 1.3x faster). Ties go to the nearer; the
  // nearest usable entry, `nearest`, answers when it is not among them.
  std::pair<uint32_t, float> Consensus(const Group& group, const float* q, const ShapeArgs& shape, uint32_t skip,
                                       std::pair<uint32_t, float> nearest) const {
    Best best(kCandidates);
    Nearest(group, q, &best);
    auto answers = [&](uint32_t i) { return i != skip && items[i].kernel != nullptr; };
    size_t neighbours = 0;
    bool has_nearest = false;
    for (size_t b = 0; b < best.n; ++b) {
      neighbours += answers(best.c[b].item);
      has_nearest = has_nearest || best.c[b].item == nearest.first;
    }
    if (neighbours < 2 || !has_nearest) return nearest;
    std::pair<uint32_t, float> chosen = nearest;
    float least = std::numeric_limits<float>::infinity();
    for (size_t a = 0; a < best.n; ++a) {
      const uint32_t j = best.c[a].item;
      if (!answers(j)) continue;
      const Item& winner = items[j];
      if (j != nearest.first && !Legal(*winner.kernel, winner.config, shape).ok()) continue;
      float sum = 0, weights = 0;
      for (size_t b = 0; b < best.n; ++b) {
        if (!answers(best.c[b].item)) continue;
        const float r = best.c[b].dist + 0.25f;
        const float w = 1.0f / (r * r);
        sum += w * SlowerAt(items[best.c[b].item], winner);
        weights += w;
      }
      if (sum / weights < least - 1e-6f) {
        least = sum / weights;
        chosen = {j, best.c[a].dist};
      }
    }
    return chosen;
  }
  static float SlowerAt(const Item& at, const Item& winner) {
    auto it = std::lower_bound(at.ranked.begin(), at.ranked.end(),
                               std::make_pair(winner.trial_hash, -std::numeric_limits<float>::infinity()));
    if (it != at.ranked.end() && it->first == winner.trial_hash) return it->second;
    for (const auto& [variant, slower] : at.variants) {
      if (variant == winner.trial.variant()) return slower + kOtherConfigLog2;
    }
    return kUnmeasuredLog2;
  }

  // Every item of `group` by distance from `q`.
  std::vector<Candidate> All(const Group& group, const float* q) const {
    const size_t d = group.names.size();
    std::vector<Candidate> out;
    for (size_t p = 0; p < group.items.size(); ++p) {
      float sum = 0;
      for (size_t j = 0; j < d; ++j) sum += std::fabs(group.coords[p * d + j] - q[j]);
      out.push_back({sum, group.items[p]});
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

int32_t Lut::Impl::BuildTree(Group* g, std::vector<float>& coords, size_t d, uint32_t begin,
                             uint32_t end, int depth) {
  const int32_t index = static_cast<int32_t>(g->nodes.size());
  g->nodes.push_back({begin, end});
  g->boxes.resize(g->boxes.size() + 2 * d);
  float* lo = &g->boxes[2 * d * index];
  float* hi = lo + d;
  std::fill(lo, lo + d, std::numeric_limits<float>::infinity());
  std::fill(hi, hi + d, -std::numeric_limits<float>::infinity());
  for (uint32_t p = begin; p < end; ++p) {
    for (size_t j = 0; j < d; ++j) {
      lo[j] = std::min(lo[j], coords[p * d + j]);
      hi[j] = std::max(hi[j], coords[p * d + j]);
    }
  }
  size_t axis = 0;
  for (size_t j = 1; j < d; ++j) {
    if (hi[j] - lo[j] > hi[axis] - lo[axis]) axis = j;
  }
  if (end - begin <= kLeafSize || d == 0 || hi[axis] <= lo[axis] || depth >= 60) return index;
  // Split at the median along the widest axis.
  std::vector<uint32_t> order(end - begin);
  for (uint32_t p = begin; p < end; ++p) order[p - begin] = p;
  const uint32_t mid = begin + (end - begin) / 2;
  std::nth_element(
      order.begin(), order.begin() + (mid - begin), order.end(),
      [&](uint32_t a, uint32_t b) { return coords[a * d + axis] < coords[b * d + axis]; });
  std::vector<float> c(order.size() * d);
  std::vector<uint32_t> items(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    std::copy_n(&coords[order[i] * d], d, &c[i * d]);
    items[i] = g->items[order[i]];
  }
  std::copy(c.begin(), c.end(), coords.begin() + begin * d);
  std::copy(items.begin(), items.end(), g->items.begin() + begin);
  const int32_t left = BuildTree(g, coords, d, begin, mid, depth + 1);
  const int32_t right = BuildTree(g, coords, d, mid, end, depth + 1);
  g->nodes[index].left = left;
  g->nodes[index].right = right;
  return index;
}

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

void Lut::Impl::AddMeasuredDefaults(
    const tuning::Database& proto,
    const absl::flat_hash_map<std::string, std::shared_ptr<const Kernel>>& by_name) {
  // The machines' order of preference for a default's configuration: this
  // one, the similar ones, then the rest by id.
  std::vector<std::string> preference = {HostMachine().id};
  if (auto it = similar.find(HostMachine().id); it != similar.end()) {
    preference.insert(preference.end(), it->second.begin(), it->second.end());
  }
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
  auto intern = [&](absl::string_view text) {  // few strings: ops, dtypes, dim names, machines
    for (uint32_t i = 0; i < strings.size(); ++i) {
      if (strings[i] == text) return i;
    }
    strings.emplace_back(text);
    return static_cast<uint32_t>(strings.size() - 1);
  };
  const uint32_t machine = intern(kMeasuredDefaultsId);
  for (auto& [id, shape] : shapes) {
    // Per machine: each current variant's fastest OK trial, and the best.
    struct Measured {
      const tuning::Entry* entry;
      double best = std::numeric_limits<double>::infinity();
      absl::flat_hash_map<std::string, const tuning::Trial*> fastest;  // by kernel name
    };
    std::vector<Measured> measured;
    for (const tuning::Entry* e : shape.entries) {
      Measured m{e, std::numeric_limits<double>::infinity(), {}};
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
    if (measured.empty()) continue;
    std::sort(measured.begin(), measured.end(), [&](const Measured& a, const Measured& b) {
      return rank_of(a.entry->key().machine_id()) < rank_of(b.entry->key().machine_id()) ||
             (rank_of(a.entry->key().machine_id()) == rank_of(b.entry->key().machine_id()) &&
              a.entry->key().machine_id() < b.entry->key().machine_id());
    });
    ShapeArgs own;
    if (!MakeShape(*shape.op->op, *shape.op->FindTypes(shape.key->dtype()), shape.dims, &own).ok()) continue;
    // Variants by geometric-mean slowdown over the machines that measured them.
    struct Score {
      double log_ratio;
      size_t count;
      std::string name;
    };
    std::map<std::string, std::pair<double, size_t>> sums;
    for (const Measured& m : measured) {
      for (const auto& [name, t] : m.fastest) {
        auto& [sum, count] = sums[name];
        sum += std::log(t->median_ns() / m.best);
        ++count;
      }
    }
    std::vector<Score> scores;
    for (const auto& [name, sum_count] : sums) {
      const auto& [sum, count] = sum_count;
      if (2 * count < measured.size() || !by_name.at(name)->available()) continue;
      scores.push_back({sum / static_cast<double>(count), count, name});
    }
    std::sort(scores.begin(), scores.end(), [](const Score& a, const Score& b) {
      return std::tie(a.log_ratio, b.count, a.name) < std::tie(b.log_ratio, a.count, b.name);
    });
    // The best-scored variant with a configuration legal for the shape,
    // from the most similar machine that measured it.
    for (const Score& score : scores) {
      const Kernel& kernel = *by_name.at(score.name);
      Item item;
      for (const Measured& m : measured) {
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
      item.dims = shape.dims;
      item.key_text = absl::StrCat(shape.key->op(), " ", shape.key->dtype(), " ", DimsString(shape.dims),
                                   shape.key->data_class().empty() ? "" : " [" + shape.key->data_class() + "]",
                                   " (measured default)");
      item.note = absl::StrFormat("%s, %.2fx the best (geometric mean) on %d of the %d machines that tuned %s",
                                  kernel.name(), std::exp(score.log_ratio), score.count, measured.size(),
                                  DimsString(shape.dims));
      Key key{intern(shape.key->op()),
              intern(shape.key->dtype()),
              machine,
              intern(shape.key->data_class()),
              static_cast<uint32_t>(dim_names.size()),
              static_cast<uint32_t>(item.dims.size())};
      for (const auto& [name, value] : item.dims) {
        dim_names.push_back(intern(name));
        dim_values.push_back(value);
      }
      keys.push_back(key);
      items.push_back(std::move(item));
      break;
    }
  }
}

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
  absl::flat_hash_map<std::string, uint32_t> interned;
  auto intern = [&](absl::string_view s) {
    auto [it, added] = interned.try_emplace(s, impl->strings.size());
    if (added) impl->strings.emplace_back(s);
    return it->second;
  };

  // Kernels by name, looked up once each.
  absl::flat_hash_map<std::string, std::shared_ptr<const Kernel>> by_name;
  for (std::shared_ptr<const Kernel>& k : registry.Kernels()) {
    impl->kernels.push_back(k);
    by_name.emplace(k->name(), std::move(k));
  }

  // The ops, and their defaults: the op's preferred variants in its order,
  // the other available kernels by name, the reference last.
  for (std::shared_ptr<const Op>& op : registry.Ops()) {
    Impl::OpEntry entry;
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
    for (const std::shared_ptr<const Kernel>& k : impl->kernels) {  // sorted by name
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
    impl->ops.push_back(std::move(entry));
  }

  // One item per entry, answering from its fastest usable trial.
  const tuning::Database& proto = db.proto();
  impl->items.reserve(proto.entries_size());
  impl->keys.reserve(proto.entries_size());
  std::vector<std::pair<std::string, int>> unknown_ops;  // op -> entries, first seen first
  for (const tuning::Entry& e : proto.entries()) {
    const std::string& op_name = e.key().op();
    auto found = std::find_if(impl->ops.begin(), impl->ops.end(),
                              [&](const Impl::OpEntry& o) { return o.op->name() == op_name; });
    if (found == impl->ops.end()) {
      auto it = std::find_if(unknown_ops.begin(), unknown_ops.end(),
                             [&](const auto& u) { return u.first == op_name; });
      if (it == unknown_ops.end()) {
        unknown_ops.emplace_back(op_name, 1);
      } else {
        ++it->second;
      }
      continue;
    }
    Impl::OpEntry* op_entry = &*found;
    const Op& op = *op_entry->op;
    Impl::Item item;
    item.dims = CanonicalDims(op, KeyDims(e.key()));
    item.key_text = KeyString(e.key());
    item.incomplete = e.incomplete();
    const TensorTypes* types = op_entry->FindTypes(e.key().dtype());
    if (types == nullptr) {
      absl::StatusOr<TensorTypes> parsed = op.TypesFromKey(e.key().dtype());
      if (!parsed.ok()) {
        impl->warnings.push_back(
            absl::StrCat(item.key_text, ": ", parsed.status().message(), "; entry skipped"));
        continue;
      }
      // Valid for this entry (the vector may move for the next one).
      op_entry->types.emplace_back(e.key().dtype(), *std::move(parsed));
      types = &op_entry->types.back().second;
    }
    Impl::Key key{intern(op_name),
                  intern(e.key().dtype()),
                  intern(e.key().machine_id()),
                  intern(e.key().data_class()),
                  static_cast<uint32_t>(impl->dim_names.size()),
                  static_cast<uint32_t>(item.dims.size())};
    for (const auto& [name, value] : item.dims) {
      impl->dim_names.push_back(intern(name));
      impl->dim_values.push_back(value);
    }

    std::vector<const tuning::Trial*> trials;
    for (const tuning::Trial& t : e.trials()) {
      if (t.status() == tuning::Trial::OK && std::isfinite(t.median_ns())) trials.push_back(&t);
    }
    if (trials.empty() && e.has_best()) trials.push_back(&e.best());
    std::stable_sort(trials.begin(), trials.end(),
                     [](const tuning::Trial* a, const tuning::Trial* b) {
                       return a->median_ns() < b->median_ns();
                     });
    ShapeArgs own;
    const absl::Status own_shape = MakeShape(op, *types, item.dims, &own);
    if (!own_shape.ok()) {
      impl->warnings.push_back(absl::StrCat(item.key_text, ": ", own_shape.message(), "; entry skipped"));
    }
    std::string stale;  // the fastest trial's staleness, if it was
    // A GPU's entry answers with its CUDA kernels, a CPU's with the others.
    const bool on_gpu = IsGpuMachineId(e.key().machine_id());
    // Thread counts measured (past the fastest, looked for only when the
    // entry has measurements on chosen thread counts).
    absl::flat_hash_set<int> counts;
    for (const tuning::Trial* t : trials) counts.insert(t->threads());
    if (counts.size() == 1) counts.clear();
    for (size_t i = 0; i < trials.size() && (item.kernel == nullptr || item.on_threads.size() < counts.size()); ++i) {
      const tuning::Trial& t = *trials[i];
      if (item.kernel != nullptr &&
          std::any_of(item.on_threads.begin(), item.on_threads.end(),
                      [&](const Impl::Item::OnThreads& on) { return on.threads == t.threads(); })) {
        continue;  // a faster one on this thread count answers already
      }
      std::string name = absl::StrCat(op_name, "/", t.variant());
      std::string problem;
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        problem = absl::StrCat(item.key_text, ": ", name, " is not registered");
      } else if (it->second->version() != t.variant_version()) {
        problem = absl::StrCat("stale entry ", item.key_text, ": ", name, " v", t.variant_version(),
                               " was tuned, v", it->second->version(), " is loaded");
        if (i == 0) stale = problem;
      } else if (on_gpu != (it->second->device() == KREG_DEVICE_CUDA)) {
        problem = absl::StrCat(item.key_text, ": ", name, on_gpu ? " does not run on a GPU" : " runs on a GPU");
      } else if (!on_gpu && !it->second->available()) {
        problem = absl::StrCat(item.key_text, ": ", name, " needs ",
                               IsaString(it->second->required_isa() & ~CpuIsa()),
                               ", which this CPU lacks");
      } else if (!own_shape.ok()) {
        problem = absl::StrCat(item.key_text, ": ", own_shape.message());
      } else {
        absl::StatusOr<Config> config = FromProtoConfig(*it->second, t.config());
        absl::Status legal = config.ok() ? Legal(*it->second, *config, own) : config.status();
        if (legal.ok() && item.kernel == nullptr) {
          item.kernel = it->second.get();
          item.config = *config;
          item.trial = t;
        }
        if (legal.ok() && !counts.empty()) {
          item.on_threads.push_back({t.threads(), it->second.get(), *std::move(config), t});
        } else if (!legal.ok()) {
          problem = absl::StrCat(item.key_text, ": ", name, " ", ConfigText(t.config()), ": ",
                                 legal.message());
        }
      }
      if (item.problem.empty()) item.problem = std::move(problem);
    }
    if (item.kernel != nullptr) {
      item.trial_hash = absl::HashOf(TrialId(item.trial));
      const double fastest = trials.front()->median_ns();
      for (const tuning::Trial* t : trials) {
        const float slower = static_cast<float>(std::log2(std::max(1.0, t->median_ns() / std::max(fastest, 1e-9))));
        if (item.ranked.size() < kRankedTrials) item.ranked.emplace_back(absl::HashOf(TrialId(*t)), slower);
        if (std::none_of(item.variants.begin(), item.variants.end(),
                         [&](const auto& v) { return v.first == t->variant(); })) {
          item.variants.emplace_back(t->variant(), slower);
        }
      }
      std::sort(item.ranked.begin(), item.ranked.end());
      item.problem.clear();
      ++impl->usable;
      if (!stale.empty()) {
        impl->warnings.push_back(absl::StrCat(stale, "; answering from ", item.kernel->name(), " v",
                                              item.trial.variant_version(), " instead"));
      }
    } else {
      if (trials.empty()) item.problem = absl::StrCat(item.key_text, ": no OK trial");
      if (!stale.empty()) impl->warnings.push_back(absl::StrCat(stale, "; entry skipped"));
    }
    impl->keys.push_back(key);
    impl->items.push_back(std::move(item));
  }
  for (const auto& [op, count] : unknown_ops) {
    impl->warnings.push_back(absl::StrCat("op '", op, "' is not registered (no loaded plugin declares it): ", count,
                                          count == 1 ? " entry" : " entries", " cannot answer"));
  }

  impl->AddMachines(proto);
  impl->AddMeasuredDefaults(proto, by_name);

  // The exact index.
  const uint32_t num_items = static_cast<uint32_t>(impl->items.size());
  impl->exact_next.assign(num_items, kNone);
  for (uint32_t i = num_items; i-- > 0;) {
    const Impl::Key& key = impl->keys[i];
    const std::string& op = impl->strings[key.op];
    const uint64_t h = ExactHash(op, impl->strings[key.dtype], impl->strings[key.machine],
                                 impl->strings[key.data_class],
                                 Digest(impl->FindOp(op)->op.get(), impl->items[i].dims));
    auto [it, added] = impl->exact.try_emplace(h, i);
    if (!added) {
      impl->exact_next[i] = it->second;
      it->second = i;
    }
  }

  // Groups for nearest lookups.
  absl::flat_hash_map<std::string, uint32_t> group_of;
  for (uint32_t i = 0; i < num_items; ++i) {
    const Impl::Key& key = impl->keys[i];
    std::vector<uint32_t> names(impl->dim_names.begin() + key.dims_begin,
                                impl->dim_names.begin() + key.dims_begin + key.dims_count);
    std::vector<uint32_t> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    std::string id = absl::StrCat(key.op, ",", key.dtype, ",", key.machine, ",", key.data_class,
                                  ":", absl::StrJoin(sorted, ","));
    auto [it, added] = group_of.try_emplace(id, impl->groups.size());
    if (added) {
      impl->groups.emplace_back();
      impl->groups.back().key = key;
      impl->groups.back().names = std::move(names);
      const std::string& op = impl->strings[key.op];
      impl->group_index[GroupHash(op, impl->strings[key.dtype], impl->strings[key.machine],
                                  impl->strings[key.data_class],
                                  Digest(impl->FindOp(op)->op.get(), impl->items[i].dims))]
          .push_back(it->second);
    }
    impl->groups[it->second].items.push_back(i);
  }
  for (Impl::Group& g : impl->groups) {
    const size_t d = g.names.size();
    g.coords.resize(g.items.size() * d);
    for (size_t p = 0; p < g.items.size(); ++p) {
      const Impl::Key& key = impl->keys[g.items[p]];
      for (size_t j = 0; j < d; ++j) {
        for (uint32_t at = key.dims_begin; at < key.dims_begin + key.dims_count; ++at) {
          if (impl->dim_names[at] == g.names[j]) g.coords[p * d + j] = Log2(impl->dim_values[at]);
        }
      }
    }
    Impl::BuildTree(&g, g.coords, d, 0, static_cast<uint32_t>(g.items.size()), 0);
  }
  return Lut(std::move(impl));
}

uint32_t Lut::Impl::FindExact(absl::string_view op_name, absl::string_view dtype, absl::string_view machine,
                              absl::string_view data_class, const Dims& dims, const Op* op,
                              const DimsDigest& digest, LutAnswer* answer, uint32_t* unusable) const {
  auto it = exact.find(ExactHash(op_name, dtype, machine, data_class, digest));
  if (it == exact.end()) return kNone;
  for (uint32_t i = it->second; i != kNone; i = exact_next[i]) {
    if (!SameKey(keys[i], op_name, dtype, machine, data_class, dims, op, digest.count)) continue;
    if (items[i].kernel != nullptr) return i;
    answer->warnings.push_back(items[i].problem);
    *unusable = i;
    return kNone;
  }
  return kNone;
}

std::pair<uint32_t, float> Lut::Impl::FindNearest(absl::string_view op_name, absl::string_view dtype,
                                                  absl::string_view machine, absl::string_view data_class,
                                                  const Dims& dims, const Op* op, const DimsDigest& digest,
                                                  const ShapeArgs& shape, uint32_t skip,
                                                  LutAnswer* answer) const {
  const Group* group = FindGroup(op_name, dtype, machine, data_class, dims, op, digest);
  if (group == nullptr) return {kNone, 0};
  const size_t d = group->names.size();
  absl::InlinedVector<float, 8> q(d);
  for (size_t j = 0; j < d; ++j) {
    for (const auto& dim : dims) {
      if (Eq(dim.first, strings[group->names[j]])) q[j] = Log2(dim.second);
    }
  }
  // The nearest entry usually answers; only when it cannot are more looked
  // at: the kCandidates nearest, then (rarely) all by distance.
  Best best(1);
  Nearest(*group, q.data(), &best);
  std::vector<Candidate> all;
  const Candidate* candidates = best.c;
  size_t count = best.n, first = 0;
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 1) {
      if (best.n < best.limit) break;  // saw every item already
      best = Best(kCandidates);
      Nearest(*group, q.data(), &best);
      count = best.n;
      first = 1;
    } else if (pass == 2) {
      if (best.n < best.limit) break;
      all = All(*group, q.data());
      candidates = all.data();
      count = all.size();
      first = kCandidates;
    }
    for (size_t c = first; c < count; ++c) {
      const uint32_t i = candidates[c].item;
      const Item& item = items[i];
      if (i == skip) continue;
      if (item.kernel == nullptr) {
        answer->warnings.push_back(item.problem);
        continue;
      }
      if (absl::Status s = Legal(*item.kernel, item.config, shape); !s.ok()) {
        answer->warnings.push_back(absl::StrCat(item.key_text, ": ", item.kernel->name(), " ",
                                                item.kernel->ConfigString(item.config),
                                                " is not legal here: ", s.message()));
        continue;
      }
      return Consensus(*group, q.data(), shape, skip, {i, candidates[c].dist});
    }
  }
  return {kNone, 0};
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
  const DimsDigest digest = Digest(op, dims);
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
  {
    const TensorTypes* types = op_entry->FindTypes(dtype);
    absl::StatusOr<TensorTypes> parsed;
    if (types == nullptr) {
      parsed = op->TypesFromKey(dtype);
      if (!parsed.ok()) return parsed.status();
      types = &*parsed;
    }
    if (absl::Status s = MakeShape(*op, *types, dims, &shape); !s.ok()) return s;
  }

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
        uint32_t skip = kNone;
        uint32_t i = impl.FindExact(op_name, dtype, other, data_class, dims, op, digest, &answer, &skip);
        float distance = 0;
        if (i == kNone) {
          std::tie(i, distance) =
              impl.FindNearest(op_name, dtype, other, data_class, dims, op, digest, shape, skip, &answer);
        }
        if (i != kNone) {
          impl.Fill(i, Match::kSimilar, distance, threads, &answer);
          return answer;
        }
      }
    }
  }

  // A GPU: the op's CUDA kernels, the first legal for the shape.
  if (IsGpuMachineId(machine_id)) {
    answer.why = impl.WhyDefault(op_name, dtype, machine_id);
    std::string refusals;
    for (const auto& [kernel, config] : op_entry->gpu_defaults) {
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
  {
    uint32_t skip = kNone;
    uint32_t i = impl.FindExact(op_name, dtype, kMeasuredDefaultsId, data_class, dims, op, digest, &answer, &skip);
    float distance = 0;
    if (i == kNone) {
      std::tie(i, distance) = impl.FindNearest(op_name, dtype, kMeasuredDefaultsId, data_class, dims, op, digest,
                                               shape, skip, &answer);
    }
    if (i != kNone) {
      impl.Fill(i, Match::kDefault, distance, threads, &answer);
      answer.trial = nullptr;  // measured elsewhere
      answer.incomplete = false;
      absl::StrAppend(&answer.why, "; measured default: ", impl.items[i].note);
      return answer;
    }
  }

  // The op's own choice for this shape first, then its list.
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

}  // namespace kreg
