// topk/heap's and topk/blockmax's vector work, one set per ISA
// (heap_avx2.cc, heap_avx512.cc, both from heap_scan.h). Each runs only on a
// CPU with its ISA (the `simd` parameter's choice_isa); heap.cc and
// blockmax.cc drive them.
#ifndef KREG_PLUGINS_TOPK_HEAP_H_
#define KREG_PLUGINS_TOPK_HEAP_H_

#include <cstdint>
#include <memory>

#include "kreg/plugin_abi.h"

namespace kreg::topk {

struct HeapOps {
  // Offers columns [c, end) of row to the min-heap heap[0, k) of packed
  // keys (the best so far; its root the worst of them).
  void (*scan)(const void* row, bool bf16, bool largest, int64_t c, int64_t end, uint64_t* heap, int64_t k);
  // best[j] = the best float of the elements c + s * blocks + j, s in
  // [0, stripes): an element's value (NaN or not). blocks % 64 == 0.
  void (*block_bests)(const void* row, bool bf16, bool largest, int64_t c, int64_t blocks, int64_t stripes,
                      float* best);
  // The packed keys of the elements of [c, end) at least as good as t (or
  // NaN) into keys; returns how many. (end - c) % 64 == 0.
  int64_t (*collect)(const void* row, bool bf16, bool largest, int64_t c, int64_t end, float t, uint64_t* keys);
  // topk/blockmax's passes (blockmax.cc), in their order:
  // best[j] = the best float of the `block` elements from c + j * block, j
  // < blocks: an element's value (NaN or not). block % 64 == 0.
  void (*block_max)(const void* row, bool bf16, bool largest, int64_t c, int64_t block, int64_t blocks,
                    float* best);
  // score[j] = best[j]'s Score; returns the k-th best of best[0, blocks),
  // one of them. 0 < k <= blocks.
  float (*block_threshold)(const float* best, int64_t blocks, int64_t k, bool largest, uint32_t* score);
  // The packed keys of the elements at least as good as t (or NaN) of the
  // blocks whose score reaches t's, in column order; returns how many.
  int64_t (*collect_blocks)(const void* row, bool bf16, bool largest, int64_t c, int64_t block, int64_t blocks,
                            const uint32_t* score, float t, uint64_t* keys);
  // out[0, k) = the best k of keys[0, m) (distinct, in column order, m >=
  // k), best first; scores and above: room for m each.
  void (*best_of_collected)(const uint64_t* keys, int64_t m, int64_t k, uint32_t* scores, uint64_t* above,
                            uint64_t* out);
};

extern const HeapOps kHeapAvx2;
extern const HeapOps kHeapAvx512;

// Room for n Ts per thread, grown and never shrunk, never initialised
// (value-initialising a row's worth of keys per call cost more than the
// passes over a long row).
template <typename T>
class Buffer {
 public:
  T* Get(int64_t n) {
    if (size_ < n) data_.reset(new T[size_ = n]);
    return data_.get();
  }

 private:
  std::unique_ptr<T[]> data_;
  int64_t size_ = 0;
};

// The kernels' `simd` parameter: which set of HeapOps runs. avx2 needs
// nothing beyond the kernels' own required_isa.
enum Simd { kAvx2 = 0, kAvx512 = 1 };
inline constexpr const char* kSimdChoices[] = {"avx2", "avx512"};
inline constexpr uint32_t kSimdIsa[] = {0, KREG_ISA_AVX2 | KREG_ISA_AVX512F | KREG_ISA_AVX512BW};
inline const HeapOps& OpsOf(int64_t simd) { return simd == kAvx512 ? kHeapAvx512 : kHeapAvx2; }

}  // namespace kreg::topk

#endif  // KREG_PLUGINS_TOPK_HEAP_H_
