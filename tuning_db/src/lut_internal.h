// What the Lut's files share (lut.cc, lut_index.cc, lut_nearest.cc,
// lut_defaults.cc): the in-place key hashing, the nearest-search helpers,
// and Lut::Impl, the index a Lut answers from. Not installed.
//
// Exact lookups hash the asked key's fields in place (dims combined
// order-independently, attributes at their defaults skipped) into a
// flat_hash_map of entry indices, then compare fields: no allocation.
// Entry keys live in compact arrays with their strings interned, so a probe
// touches a few cache lines. Nearest lookups go to the entry's group (op,
// dtype signature, machine, data class, dim names): a k-d tree over log2 dims (split
// on the axis of the entries' largest variance, at the boundary between unequal
// values nearest the median, so a grid's planes stay whole; leaves of up to 32)
// searched depth first, nearer child first, skipping any box farther (L1) than the
// eighth-best entry found. Boxes bound their entries exactly, so any split
// finds the same entries: the split only decides how many are looked at.
// Ops are the registry's: keys are checked and shape-only arguments built by
// the Op, legality asked of the kernel's Check.
//
// Other machines answer through the same two lookups under their own ids:
// the similar machines of each known machine are ranked once at Build, and
// the measured defaults are items of their own under kMeasuredDefaultsId,
// one per shape tuned anywhere, found by exact and nearest lookups like any
// entry.
#ifndef KREG_TUNING_DB_LUT_INTERNAL_H_
#define KREG_TUNING_DB_LUT_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/arena.h"
#include "kreg/lut.h"

namespace kreg {
namespace lut_internal {


inline constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
inline constexpr size_t kCandidates = 8;  // nearest candidates kept per search pass
// A nearest answer weighs the kCandidates nearest entries' winners by how
// each fared at every one of them (Consensus): the fastest kRankedTrials
// trials of each entry, and each variant's fastest, are kept for it.
inline constexpr size_t kRankedTrials = 32;
// What a winner not measured at a neighbour (nor its variant) is taken to
// lose there: log2 of a 2x slowdown; a variant measured there with another
// configuration, its fastest there times kOtherConfig.
inline constexpr float kUnmeasuredLog2 = 1.0f;
inline constexpr float kOtherConfigLog2 = 0.1375f;  // log2(1.1)
inline constexpr size_t kLeafSize = 32;   // k-d tree leaves hold at most this many entries

// ---- Shape-only arguments ---------------------------------------------------

// Shape-only arguments of `op` for a key's tensor types (Op::TypesFromKey of
// its dtype signature) and dims, built by the op; InvalidArgument when the op
// does not take them.
inline absl::Status MakeShape(const Op& op, const TensorTypes& types, const Dims& dims, ShapeArgs* out) {
  absl::StatusOr<Values> values = op.ParseValues(dims);
  if (!values.ok()) return values.status();
  return op.MakeShapeArgs(*values, types, out);  // completes the dims (defaults), then checks
}

// Whether `config` is legal for the shape (validated when it was made).
inline absl::Status Legal(const Kernel& kernel, const Config& config, const ShapeArgs& shape) {
  return kernel.CheckConfig(config, *shape.args());
}

// ---- Hashing keys in place --------------------------------------------------

inline uint64_t Load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint64_t Load32(const char* p) {
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
inline bool IsDefaultAttribute(const Op* op, const std::pair<std::string, int64_t>& dim) {
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

inline DimsDigest Digest(const Op* op, const Dims& dims) {
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

inline uint64_t KeyHash(absl::string_view op, absl::string_view dtype, absl::string_view machine,
                 absl::string_view data_class, uint64_t dims, size_t count) {
  uint64_t h = Mix(HashBytes(op), HashBytes(dtype));
  h = Mix(h ^ HashBytes(machine), HashBytes(data_class));
  return Mix(h ^ dims, count);
}

inline uint64_t ExactHash(absl::string_view op, absl::string_view dtype, absl::string_view machine,
                   absl::string_view data_class, const DimsDigest& d) {
  return KeyHash(op, dtype, machine, data_class, d.values, d.count);
}

inline uint64_t GroupHash(absl::string_view op, absl::string_view dtype, absl::string_view machine,
                   absl::string_view data_class, const DimsDigest& d) {
  return KeyHash(op, dtype, machine, data_class, d.names, d.count);
}

inline float Log2(int64_t v) { return std::log2(static_cast<float>(std::max<int64_t>(v, 0)) + 1.0f); }

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

// The registry's kernels by name ("op/variant").
using KernelsByName = absl::flat_hash_map<std::string, std::shared_ptr<const Kernel>>;

// Building measured defaults: what one machine measured of a shape (each
// current variant's fastest OK trial, by kernel name, and the best of them),
// and a variant's geometric-mean slowdown over the machines that measured it.
// Kernels are named by their key in the registry's KernelsByName, so a
// name compares by address.
struct Fastest {
  const std::string* name;
  const Kernel* kernel;
  const tuning::Trial* trial;
};
struct MeasuredOn {
  const tuning::Entry* entry;
  double best = std::numeric_limits<double>::infinity();
  absl::InlinedVector<Fastest, 4> fastest;
  const Fastest* Find(const std::string* name) const {
    for (const Fastest& f : fastest) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }
};
struct VariantScore {
  double log_ratio;
  size_t count;
  const std::string* name;
  const Kernel* kernel;
};

// What Lut::Build's steps share while it runs.
struct BuildScratch {
  // Per entry of the table, its item; kNone for an entry without one.
  std::vector<uint32_t> entry_item;
  // Per entry of the table: whether its own shape-only arguments could be
  // made (meaningful where it has an item).
  std::vector<bool> own_shape_ok;
  // Trials whose configuration was converted and checked against their
  // entry's own shape: the Config where it converts and is legal there,
  // and the copy on the Lut's arena of an entry's winner (measured
  // defaults answering with the same trial share it).
  struct Checked {
    std::optional<Config> config;
    const tuning::Trial* copy = nullptr;
  };
  absl::flat_hash_map<const tuning::Trial*, Checked> checked;
  // Strings interned so far (see Lut::Impl::Intern).
  absl::flat_hash_map<std::string, uint32_t> interned;
};

}  // namespace lut_internal

// ---- The index -----------------------------------------------------------------

struct Lut::Impl {
  using Best = lut_internal::Best;
  using Candidate = lut_internal::Candidate;
  using DimsDigest = lut_internal::DimsDigest;
  using KernelsByName = lut_internal::KernelsByName;

  // What an entry answers with. What a nearest search reads of its
  // neighbours comes first; the trials live on `arena` and the consensus's
  // rankings in `trial_ranks` and `slowdowns`, so an item costs few
  // allocations to build and to free.
  struct Item {
    const Kernel* kernel = nullptr;  // nullptr: cannot answer, see `problem`
    const tuning::Trial* trial = nullptr;
    int threads = 0;          // trial->threads(), read without a cache miss
    uint64_t trial_hash = 0;  // of `trial`'s TrialId
    uint32_t variant = lut_internal::kNone;  // `trial`'s variant, interned in `strings`
    // For Consensus: log2(median / the fastest's) of the entry's fastest
    // kRankedTrials trials by hash of their TrialId, sorted, in `trial_ranks`
    // [ranked_begin, +ranked_count); of each variant's fastest, by interned
    // variant, in `slowdowns` [slowdowns_begin, +slowdowns_count).
    uint32_t ranked_begin = 0, ranked_count = 0;
    uint32_t slowdowns_begin = 0, slowdowns_count = 0;
    bool incomplete = false;  // its sweep was cut short
    Config config;
    Dims dims;  // canonical
    std::string key_text;  // KeyString of its key; empty where KeyText can make it
    std::string problem;
    // When the entry holds measurements on chosen thread counts: the
    // fastest usable one on each thread count (0: all cores), fastest first.
    struct OnThreads {
      int threads;
      const Kernel* kernel;
      Config config;
      const tuning::Trial* trial;
    };
    std::vector<OnThreads> on_threads;
    // A measured default's provenance (see Note): its variant's geometric
    // mean slowdown, and on how many of how many machines.
    double mean_slowdown = 0;
    uint32_t measured_on = 0, measured_of = 0;
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
    std::deque<std::pair<std::string, TensorTypes>> types;

    const TensorTypes* FindTypes(absl::string_view dtype) const {
      for (const auto& [signature, t] : types) {
        if (lut_internal::Eq(signature, dtype)) return &t;
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
  // The items' trials (copies: a Lut outlives its TuningDb), and their
  // rankings for Consensus (see Item).
  google::protobuf::Arena arena;
  std::vector<std::pair<uint64_t, float>> trial_ranks;
  std::vector<std::pair<uint32_t, float>> slowdowns;
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
    answer->trial = item.trial;
    answer->threads = item.threads;
    answer->incomplete = item.incomplete;
    answer->machine = FindMachine(strings[keys[i].machine]);
    const int cores = answer->machine != nullptr ? static_cast<int>(answer->machine->cores()) : 0;
    if (threads <= 0 || cores <= threads) return;
    for (const Item::OnThreads& on : item.on_threads) {
      if ((on.threads > 0 ? on.threads : cores) > threads) continue;
      answer->kernel = on.kernel;
      answer->config = &on.config;
      answer->trial = on.trial;
      answer->threads = on.threads;
      return;
    }
  }

  // ---- Lookups (lut_nearest.cc)
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

  // The text of item `item`'s key `key`: KeyString of its entry's key; a
  // measured default's "OP DTYPE DIMS [DATA CLASS] (measured default)".
  std::string KeyText(const Key& key, const Item& item) const {
    if (!item.key_text.empty()) return item.key_text;
    const std::string& data_class = strings[key.data_class];
    const std::string& machine = strings[key.machine];
    return absl::StrCat(strings[key.op], " ", strings[key.dtype], " ", DimsString(item.dims),
                        data_class.empty() ? "" : absl::StrCat(" [", data_class, "]"),
                        machine == kMeasuredDefaultsId ? " (measured default)" : absl::StrCat(" @", machine));
  }

  // The op called `name`, looked up without a call; nullptr if unknown.
  const OpEntry* FindOp(absl::string_view name) const {
    for (const OpEntry& e : ops) {
      if (lut_internal::Eq(e.op->name(), name)) return &e;
    }
    return nullptr;
  }

  // Whether `key` is (op, dtype, machine, data_class) with those (kept) dims.
  bool SameKey(const Key& key, absl::string_view op, absl::string_view dtype,
               absl::string_view machine, absl::string_view data_class, const Dims& dims,
               const Op* info, size_t count) const;

  // The group of (op, dtype, machine, data_class) with these dims' names
  // (attributes at their defaults left out); nullptr if none.
  const Group* FindGroup(absl::string_view op, absl::string_view dtype, absl::string_view machine,
                         absl::string_view data_class, const Dims& dims, const Op* info,
                         const DimsDigest& digest) const;

  // The best->limit items of `group` nearest `q` (log2 coordinates in the
  // group's order).
  void Nearest(const Group& group, const float* q, Best* best) const;
  // Nearest's search over `d` coordinates (kD of them when kD > 0, so the
  // loops unroll; the sums are in the same order either way, so the
  // distances are the same to the bit).
  template <size_t kD>
  static void SearchTree(const Group& group, size_t d, const float* q, Best* best);

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
  // `best`: the kCandidates nearest entries.
  std::pair<uint32_t, float> Consensus(const Best& best, const ShapeArgs& shape, uint32_t skip,
                                       std::pair<uint32_t, float> nearest) const;
  // How much slower than each neighbour of `best` (all but `skip` and those
  // that cannot answer) `winner` is, weighted by nearness.
  float Slowdown(const Best& best, uint32_t skip, const Item& winner) const;
  float SlowerAt(const Item& at, const Item& winner) const;

  // Every item of `group` by distance from `q`.
  std::vector<Candidate> All(const Group& group, const float* q) const;

  // ---- Queries (lut.cc)
  // Answers from `machine`'s entry for exactly this problem, else its
  // nearest (as FindExact, FindNearest), filled in as `match`: the item, or
  // kNone.
  uint32_t AnswerFrom(absl::string_view op_name, absl::string_view dtype, absl::string_view machine,
                      absl::string_view data_class, const Dims& dims, const Op* op, const DimsDigest& digest,
                      const ShapeArgs& shape, Match match, int threads, LutAnswer* answer) const;
  // Shape-only arguments of a query (its dtype signature's tensor types and
  // its dims); InvalidArgument when the op does not take them.
  static absl::Status ShapeOf(const OpEntry& op_entry, absl::string_view dtype, const Dims& dims, ShapeArgs* shape);
  // With nothing tuned: a GPU's answer, the op's first CUDA kernel legal
  // for the shape; a CPU's, the op's choice `chosen` (an index into its
  // defaults, or their size for none), then its defaults in order.
  static absl::StatusOr<LutAnswer> GpuDefault(absl::string_view op_name, const OpEntry& op_entry,
                                              const ShapeArgs& shape, LutAnswer answer);
  static absl::StatusOr<LutAnswer> OpDefault(absl::string_view op_name, const OpEntry& op_entry, size_t chosen,
                                             const ShapeArgs& shape, LutAnswer answer);

  // ---- Building (lut_index.cc)
  // The registry's ops and their defaults: the op's preferred variants in
  // its order, the other available kernels by name, the reference last.
  // `kernels` first.
  void AddOps(const Registry& registry, const KernelsByName& by_name);
  // One item per entry of an op `ops` holds, answering from its fastest
  // usable trial; a warning per op it does not.
  void AddEntries(const tuning::Database& proto, const KernelsByName& by_name, lut_internal::BuildScratch* scratch);
  // What PrepareEntry works out for an entry before JoinEntry adds it: its
  // item less what is interned (variant, key, rankings' places), what it
  // records in BuildScratch, its warnings in order.
  struct PreparedEntry {
    Item item;
    bool own_shape_ok = false;
    // Inline: most entries check a trial or two and rank a few (an
    // allocation per entry each would cost more than the rest of its work).
    absl::InlinedVector<std::pair<const tuning::Trial*, lut_internal::BuildScratch::Checked>, 2> checked;
    absl::string_view winner_variant;
    absl::InlinedVector<std::pair<uint64_t, float>, 8> ranked;              // as in trial_ranks, sorted
    absl::InlinedVector<std::pair<absl::string_view, float>, 4> slowdowns;  // by variant, first seen first
    std::vector<std::string> warnings;
    // Its op and tensor types: null for an unknown op or a refused dtype.
    const OpEntry* op = nullptr;
    const TensorTypes* types = nullptr;
    // Whether the entry before has its op, dtype, machine, data class, dim names.
    bool like_before = false;
  };
  // Entry `e` of op `op` with the tensor types of its dtype signature.
  // Reads only the entry and the registry, and allocates only on `arena`:
  // safe to call on several threads at once.
  void PrepareEntry(const tuning::Entry& e, const Op& op, const TensorTypes& types, const KernelsByName& by_name,
                    PreparedEntry* p);
  // Adds entry `index` of the table, `e`, as PrepareEntry made it.
  void JoinEntry(int index, const tuning::Entry& e, PreparedEntry* p, lut_internal::BuildScratch* scratch);
  // The index of `s` in `strings`, added if new (`interned` maps them).
  uint32_t Intern(absl::string_view s, absl::flat_hash_map<std::string, uint32_t>* interned);
  // Points p->item at the fastest of `trials` (sorted, fastest first) whose
  // kernel is registered at the trial's version, runs on the entry's
  // machine (a GPU's entry: CUDA kernels only; a CPU's: the others, which
  // this CPU has the ISA for) and is legal for the entry's own shape `own`
  // (`own_shape` says whether there is one); and, when the trials were
  // measured on several thread counts, the fastest such on each (their
  // copies on `arena`). The first problem met is item.problem, each naming
  // the entry as text() does; each configuration checked is recorded in
  // p->checked. Returns why the fastest trial is stale, or "".
  std::string ChooseTrials(const std::string& op_name, absl::FunctionRef<const std::string&()> text,
                           const std::vector<const tuning::Trial*>& trials, const KernelsByName& by_name,
                           const ShapeArgs& own, const absl::Status& own_shape, bool on_gpu, PreparedEntry* p);
  // The item's rankings for Consensus (p->ranked, p->slowdowns, trial_hash),
  // `winner` being the trial of `trials` it answers with.
  void RankTrials(const std::vector<const tuning::Trial*>& trials, const tuning::Trial* winner, PreparedEntry* p);
  // The exact index (`exact`, `exact_next`) and the groups with their k-d
  // trees, over every item.
  void IndexExact();
  void IndexGroups();

  // ---- Other machines (lut_defaults.cc)
  // Records the table's machines and this one, what each tuned, and which
  // are similar to which.
  void AddMachines(const tuning::Database& proto);
  // Adds an item under kMeasuredDefaultsId per shape tuned on any machine
  // (see Lut::Build). Call after the entries' items, before the indexes.
  void AddMeasuredDefaults(const tuning::Database& proto, const KernelsByName& by_name,
                           lut_internal::BuildScratch* scratch);
  // The item for one shape (canonical `dims`; its shape-only arguments
  // made by `own` when a configuration was not checked against it
  // already): the best-scored variant with a configuration legal for the
  // shape, from the most similar machine that measured it (`measured`,
  // most similar first); no kernel where none is. Its trial is on `arena`;
  // its variant and key are the caller's to intern. Safe to call on
  // several threads at once.
  Item MeasuredDefault(const Dims& dims, const std::function<const ShapeArgs&()>& own,
                       const std::vector<lut_internal::MeasuredOn>& measured,
                       const std::vector<lut_internal::VariantScore>& scores,
                       const lut_internal::BuildScratch& scratch);
  // A measured default's provenance ("topk/radix, 1.00x the best ...").
  std::string Note(const Item& item) const;
  // The machines a default's configuration is preferably taken from: this
  // one, then its similar ones.
  std::vector<std::string> DefaultPreference() const;
  // Why no measurement answered for `machine`: the start of LutAnswer::why.
  std::string WhyDefault(absl::string_view op_name, absl::string_view dtype, absl::string_view machine) const;
};

}  // namespace kreg

#endif  // KREG_TUNING_DB_LUT_INTERNAL_H_
