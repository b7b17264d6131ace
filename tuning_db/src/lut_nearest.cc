// Lut lookups: the exact index's probe, and the nearest entries of a group
// (op, dtype signature, machine, data class, dim names) in its k-d tree,
// built here too, with the consensus of the nearest neighbours' winners.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "lut_internal.h"

namespace kreg {

using lut_internal::Eq;
using lut_internal::ExactHash;
using lut_internal::GroupHash;
using lut_internal::IsDefaultAttribute;
using lut_internal::kCandidates;
using lut_internal::kLeafSize;
using lut_internal::kNone;
using lut_internal::kOtherConfigLog2;
using lut_internal::kUnmeasuredLog2;
using lut_internal::Legal;
using lut_internal::Log2;

// ---- Exact -------------------------------------------------------------------------

bool Lut::Impl::SameKey(const Key& key, absl::string_view op, absl::string_view dtype,
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

// ---- The k-d tree ----------------------------------------------------------------

int32_t Lut::Impl::BuildTree(Group* g, std::vector<float>& coords, size_t d, uint32_t begin,
                             uint32_t end, int depth) {
  const int32_t index = static_cast<int32_t>(g->nodes.size());
  g->nodes.push_back({begin, end});
  g->boxes.resize(g->boxes.size() + 2 * d);
  float* lo = g->boxes.data() + 2 * d * index;  // no boxes at all where d == 0
  float* hi = lo + d;
  std::fill(lo, lo + d, std::numeric_limits<float>::infinity());
  std::fill(hi, hi + d, -std::numeric_limits<float>::infinity());
  for (uint32_t p = begin; p < end; ++p) {
    for (size_t j = 0; j < d; ++j) {
      lo[j] = std::min(lo[j], coords[p * d + j]);
      hi[j] = std::max(hi[j], coords[p * d + j]);
    }
  }
  // Split on the axis along which the entries spread most (variance), at
  // the boundary of equal values nearest the median: a grid's planes are
  // kept whole, so a leaf spans few of them.
  size_t axis = 0;
  double spread = -1;
  const double count = static_cast<double>(end - begin);
  for (size_t j = 0; j < d; ++j) {
    double sum = 0, squares = 0;
    for (uint32_t p = begin; p < end; ++p) {
      const double v = coords[p * d + j];
      sum += v;
      squares += v * v;
    }
    const double var = squares - sum * sum / count;
    if (hi[j] > lo[j] && var > spread) {
      spread = var;
      axis = j;
    }
  }
  if (end - begin <= kLeafSize || d == 0 || spread < 0 || depth >= 60) return index;
  std::vector<uint32_t> order(end - begin);
  for (uint32_t p = begin; p < end; ++p) order[p - begin] = p;
  auto at = [&](uint32_t p) { return coords[p * d + axis]; };
  // The median, then the run of entries equal to it: the boundary nearer
  // the middle at either end of the run (the upper one on a tie) is the cut.
  const size_t n = order.size(), half = n / 2;
  std::nth_element(order.begin(), order.begin() + half, order.end(),
                   [&](uint32_t a, uint32_t b) { return at(a) < at(b); });
  const float median = at(order[half]);
  const size_t run_begin = static_cast<size_t>(
      std::partition(order.begin(), order.begin() + half, [&](uint32_t p) { return at(p) < median; }) -
      order.begin());
  const size_t run_end = static_cast<size_t>(
      std::partition(order.begin() + half, order.end(), [&](uint32_t p) { return at(p) == median; }) -
      order.begin());
  // Some entry differs from the median (the axis has spread), so one of
  // the two is a boundary inside the range.
  size_t cut = run_end;
  if (run_end >= n || (run_begin >= 1 && half - run_begin < run_end - half)) cut = run_begin;
  const uint32_t mid = begin + static_cast<uint32_t>(cut);
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

const Lut::Impl::Group* Lut::Impl::FindGroup(absl::string_view op, absl::string_view dtype,
                                             absl::string_view machine, absl::string_view data_class,
                                             const Dims& dims, const Op* info, const DimsDigest& digest) const {
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

template <size_t kD>
void Lut::Impl::SearchTree(const Group& group, size_t d, const float* q, Best* best) {
  if constexpr (kD > 0) d = kD;
  auto box_distance = [&](int32_t node) {
    const float* lo = group.boxes.data() + 2 * d * node;  // none where d == 0
    const float* hi = lo + d;
    float sum = 0;
    for (size_t j = 0; j < d; ++j) sum += std::max(0.0f, std::max(lo[j] - q[j], q[j] - hi[j]));
    return sum;
  };
  struct Frame {
    int32_t node;
    float bound;
  };
  Frame stack[2 * 64 + 2];  // two per level; BuildTree stops at depth 60
  int top = 0;
  stack[top++] = {0, box_distance(0)};
  float dist[kLeafSize];
  while (top > 0) {
    const Frame f = stack[--top];
    float worst = best->Worst();
    if (f.bound > worst) continue;
    const Group::Node& node = group.nodes[f.node];
    if (node.left < 0) {
      // Distances first (a loop without branches), then the few that may
      // enter the list; in chunks, as a leaf of equal points may be large.
      for (uint32_t begin = node.begin; begin < node.end; begin += kLeafSize) {
        const uint32_t count = std::min<uint32_t>(kLeafSize, node.end - begin);
        const float* c = group.coords.data() + begin * d;
        for (uint32_t p = 0; p < count; ++p) {
          float sum = 0;
          for (size_t j = 0; j < d; ++j) sum += std::fabs(c[p * d + j] - q[j]);
          dist[p] = sum;
        }
        for (uint32_t p = 0; p < count; ++p) {
          if (dist[p] > worst) continue;
          best->Offer({dist[p], group.items[begin + p]});
          worst = best->Worst();
        }
      }
      continue;
    }
    Frame near{node.left, box_distance(node.left)}, far{node.right, box_distance(node.right)};
    if (far.bound < near.bound) std::swap(near, far);
    stack[top++] = far;
    stack[top++] = near;
  }
}

void Lut::Impl::Nearest(const Group& group, const float* q, Best* best) const {
  const size_t d = group.names.size();
  switch (d) {
    case 1:
      return SearchTree<1>(group, d, q, best);
    case 2:
      return SearchTree<2>(group, d, q, best);
    case 3:
      return SearchTree<3>(group, d, q, best);
    case 4:
      return SearchTree<4>(group, d, q, best);
    default:
      return SearchTree<0>(group, d, q, best);
  }
}

// ---- Nearest -----------------------------------------------------------------------

std::pair<uint32_t, float> Lut::Impl::Consensus(const Best& best, const ShapeArgs& shape, uint32_t skip,
                                                std::pair<uint32_t, float> nearest) const {
  auto answers = [&](uint32_t i) { return i != skip && items[i].kernel != nullptr; };
  size_t neighbours = 0;
  bool has_nearest = false;
  for (size_t b = 0; b < best.n; ++b) {
    neighbours += answers(best.c[b].item);
    has_nearest = has_nearest || best.c[b].item == nearest.first;
  }
  if (neighbours < 2 || !has_nearest) return nearest;
  // Neighbours often share a winner: its legality (the kernel's check, by
  // kernel and configuration) and its score (by trial and variant) are
  // worked out once.
  absl::InlinedVector<std::pair<const Item*, bool>, kCandidates> legal;
  absl::InlinedVector<std::pair<const Item*, float>, kCandidates> scored;
  auto is_legal = [&](const Item& winner) {
    for (const auto& [seen, ok] : legal) {
      if (seen->kernel == winner.kernel && seen->config == winner.config) return ok;
    }
    legal.emplace_back(&winner, Legal(*winner.kernel, winner.config, shape).ok());
    return legal.back().second;
  };
  auto score = [&](const Item& winner) {
    for (const auto& [seen, s] : scored) {
      if (seen->trial_hash == winner.trial_hash && seen->variant == winner.variant) return s;
    }
    scored.emplace_back(&winner, Slowdown(best, skip, winner));
    return scored.back().second;
  };
  std::pair<uint32_t, float> chosen = nearest;
  float least = std::numeric_limits<float>::infinity();
  for (size_t a = 0; a < best.n; ++a) {
    const uint32_t j = best.c[a].item;
    if (!answers(j)) continue;
    const Item& winner = items[j];
    if (j != nearest.first && !is_legal(winner)) continue;
    if (const float s = score(winner); s < least - 1e-6f) {
      least = s;
      chosen = {j, best.c[a].dist};
    }
  }
  return chosen;
}

float Lut::Impl::Slowdown(const Best& best, uint32_t skip, const Item& winner) const {
  float sum = 0, weights = 0;
  for (size_t b = 0; b < best.n; ++b) {
    const uint32_t i = best.c[b].item;
    if (i == skip || items[i].kernel == nullptr) continue;
    const float r = best.c[b].dist + 0.25f;
    const float w = 1.0f / (r * r);
    sum += w * SlowerAt(items[i], winner);
    weights += w;
  }
  return sum / weights;
}

float Lut::Impl::SlowerAt(const Item& at, const Item& winner) const {
  const auto* begin = trial_ranks.data() + at.ranked_begin;
  const auto* end = begin + at.ranked_count;
  const auto* it = std::lower_bound(begin, end, std::make_pair(winner.trial_hash, -std::numeric_limits<float>::infinity()));
  if (it != end && it->first == winner.trial_hash) return it->second;
  for (uint32_t v = at.slowdowns_begin; v < at.slowdowns_begin + at.slowdowns_count; ++v) {
    if (slowdowns[v].first == winner.variant) return slowdowns[v].second + kOtherConfigLog2;
  }
  return kUnmeasuredLog2;
}

std::vector<Lut::Impl::Candidate> Lut::Impl::All(const Group& group, const float* q) const {
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
  // at: the kCandidates nearest (found at once: the consensus weighs them
  // too), then (rarely) all by distance.
  Best best(kCandidates);
  Nearest(*group, q.data(), &best);
  std::vector<Candidate> all;
  const Candidate* candidates = best.c;
  size_t count = best.n, first = 0;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      if (best.n < best.limit) break;  // saw every item already
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
        answer->warnings.push_back(absl::StrCat(KeyText(keys[i], item), ": ", item.kernel->name(), " ",
                                                item.kernel->ConfigString(item.config),
                                                " is not legal here: ", s.message()));
        continue;
      }
      return Consensus(best, shape, skip, {i, candidates[c].dist});
    }
  }
  return {kNone, 0};
}

}  // namespace kreg
