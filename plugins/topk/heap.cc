// topk/heap: the classic CPU baseline (FAISS-style). A min-heap holds the k
// best seen so far; its root is the threshold. Each element is first tested
// against the threshold's float value, a vector at a time (32 elements with
// AVX2, 64 with AVX-512: parameter `simd`), and only the rare ones that may
// beat it take the exact path: compare full (score, column) keys and
// replace the root.
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "common.h"
#include "heap.h"
#include "variants.h"

namespace kreg::topk {
namespace {

const kreg_param_desc kSimdParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "simd",
    .doc = "the threshold test's vectors: avx2 (32 elements a step) or avx512 (64)",
    .kind = KREG_PARAM_CHOICE,
    .choices = kSimdChoices,
    .num_choices = 2,
    .default_value = kAvx2,
    .choice_isa = kSimdIsa,
};
const kreg_param_desc* const kParams[] = {&kSimdParam};

// A row long enough is seeded from a prefix first: column-strided blocks,
// 4k of them (rounded up to 64) of this many elements each.
constexpr int64_t kSeedStripes = 64;

// A thread's scratch: the block bests and the prefix's survivors.
struct Scratch {
  Buffer<float> best;
  Buffer<uint64_t> keys;
};

// Leaves in `heap` the packed keys of the best min(k, end - start) columns
// of [start, end) of row, best first.
void SelectRow(const HeapOps& ops, const void* row, bool bf16, bool largest, int64_t start, int64_t end, int64_t k,
               Scratch& s, std::vector<uint64_t>& heap) {
  int64_t c = start + std::min<int64_t>(k, end - start);
  const int64_t blocks = (4 * k + 63) / 64 * 64, prefix = blocks * kSeedStripes;
  if (k > 0 && end - start >= 2 * prefix) {
    // Seed: the k-th best of the blocks' bests, t, is reached by at least k
    // elements of the prefix (each block's best), so no element worse
    // than t is among the top k. Those at least as good as t are a few
    // more than k: keep the best k. (A heap filled element by element from
    // the row's start takes most of its replacements in such a prefix, each
    // a mispredicted branch or more.)
    float* best = s.best.Get(blocks);
    uint64_t* keys = s.keys.Get(prefix);
    ops.block_bests(row, bf16, largest, start, blocks, kSeedStripes, best);
    uint64_t* ranked = keys;  // (score, the float's bits): the k-th best score's float
    for (int64_t j = 0; j < blocks; ++j) {
      uint32_t bits;
      std::memcpy(&bits, &best[j], 4);
      ranked[j] = uint64_t{Score(bits, largest)} << 32 | bits;
    }
    std::nth_element(ranked, ranked + (k - 1), ranked + blocks, std::greater<>());
    const uint32_t t_bits = static_cast<uint32_t>(ranked[k - 1]);
    float t;
    std::memcpy(&t, &t_bits, 4);
    const int64_t survivors = ops.collect(row, bf16, largest, start, start + prefix, t, keys);
    std::nth_element(keys, keys + (k - 1), keys + survivors, std::greater<>());
    heap.assign(keys, keys + k);
    c = start + prefix;
  } else {
    heap.resize(c - start);
    for (int64_t j = start; j < c; ++j) heap[j - start] = Pack(Score(FloatBits(row, bf16, j), largest), j);
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  if (!heap.empty()) ops.scan(row, bf16, largest, c, end, heap.data(), static_cast<int64_t>(heap.size()));
  std::sort_heap(heap.begin(), heap.end(), std::greater<>());
}

kreg_status Run(const TopKArgs& a, const kreg_config* config, const kreg_host* host, char* msg, size_t cap) {
  const bool bf16 = IsBf16(a);
  const HeapOps& ops = OpsOf(Param(config, 0).value);
  tbb::enumerable_thread_specific<Scratch> scratch;
  const kreg_status status =
      SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end, std::vector<uint64_t>& heap) {
        SelectRow(ops, InputRow(a, r), bf16, a.largest, start, end, a.k, scratch.local(), heap);
        return 0;
      });
  return Finish(status, msg, cap);
}

}  // namespace

extern const kreg_kernel kHeapKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "heap",
    .version = 1,
    .doc = "min-heap of the k best with a vector threshold prefilter (FAISS-style)",
    .required_isa = KREG_ISA_AVX2,
    .params = kParams,
    .num_params = sizeof kParams / sizeof kParams[0],
    .check = CheckTopK,
    .run = GuardedRun<Run>,
};

}  // namespace kreg::topk
