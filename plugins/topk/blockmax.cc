// topk/blockmax: two passes over a row, the first at the memory's pace. It
// streams the row once and keeps the best of each block of `block`
// consecutive elements, a vector max per element and no branch on them. The
// k-th best of those block bests, t, is reached by at least k elements
// (each block's best), so every one of the row's top k is at least as good
// as t, and they lie in the blocks whose best reaches t: about k blocks,
// read again from cache for their elements at least as good as t (a few k
// of them). The best k of those are placed by counting. Where topk/heap's
// scan stops the stream for each newcomer to its heap, this one only reads.
#include <algorithm>
#include <vector>

#include "common.h"
#include "heap.h"
#include "variants.h"

namespace kreg::topk {
namespace {

const kreg_param_desc kSimdParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "simd",
    .doc = "the passes' vectors: avx2 (8 lanes) or avx512 (16)",
    .kind = KREG_PARAM_CHOICE,
    .choices = kSimdChoices,
    .num_choices = 2,
    .default_value = kAvx2,
    .choice_isa = kSimdIsa,
};
const int64_t kBlocks[] = {128, 256, 512};
const kreg_param_desc kBlockParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "block",
    .doc = "elements per block: fewer re-read, more block bests to rank",
    .kind = KREG_PARAM_INT,
    .values = kBlocks,
    .num_values = 3,
    .default_value = 256,
};
const kreg_param_desc* const kParams[] = {&kSimdParam, &kBlockParam};

// A thread's scratch.
struct Scratch {
  Buffer<float> best;
  Buffer<uint32_t> score, scores;
  Buffer<uint64_t> keys, above;
};

// Leaves in `out` the packed keys of the best min(k, end - start) columns
// of [start, end) of row, best first.
void SelectRow(const HeapOps& ops, const void* row, bool bf16, bool largest, int64_t start, int64_t end, int64_t k,
               int64_t block, Scratch& s, std::vector<uint64_t>& out) {
  // Rows of fewer than k blocks (a short row, or k near n, where the tuner
  // will prefer another variant) take every element as a candidate.
  const int64_t len = end - start, blocks = len / block;
  uint64_t* keys = s.keys.Get(len);  // at most every element
  int64_t m = 0;
  const bool blocked = k > 0 && blocks >= k;
  if (blocked) {
    float* best = s.best.Get(blocks);
    uint32_t* score = s.score.Get(blocks);
    ops.block_max(row, bf16, largest, start, block, blocks, best);
    const float t = ops.block_threshold(best, blocks, k, largest, score);
    m = ops.collect_blocks(row, bf16, largest, start, block, blocks, score, t, keys);
  }
  // The tail after the last whole block (or a row too short for blocks):
  // every element a candidate.
  for (int64_t c = start + (blocked ? blocks * block : 0); c < end; ++c) {
    keys[m++] = Pack(Score(FloatBits(row, bf16, c), largest), c);
  }
  k = std::min(k, len);
  out.resize(k);
  if (k > 0) ops.best_of_collected(keys, m, k, s.scores.Get(m), s.above.Get(m), out.data());
}

kreg_status Run(const TopKArgs& a, const kreg_config* config, const kreg_host* host, char* msg, size_t cap) {
  const bool bf16 = IsBf16(a);
  const HeapOps& ops = OpsOf(Param(config, 0).value);
  const int64_t block = Param(config, 1).value;
  tbb::enumerable_thread_specific<Scratch> scratch;
  const kreg_status status =
      SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end, std::vector<uint64_t>& out) {
        SelectRow(ops, InputRow(a, r), bf16, a.largest, start, end, a.k, block, scratch.local(), out);
        return 0;
      });
  return Finish(status, msg, cap);
}

}  // namespace

extern const kreg_kernel kBlockMaxKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "blockmax",
    .version = 1,
    .doc = "block bests in one streaming pass bound the k-th best; the blocks that reach it are read again",
    .required_isa = KREG_ISA_AVX2,
    .params = kParams,
    .num_params = sizeof kParams / sizeof kParams[0],
    .check = CheckTopK,
    .run = GuardedRun<Run>,
};

}  // namespace kreg::topk
