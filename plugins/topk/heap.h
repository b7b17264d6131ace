// topk/heap's vector work, one set per ISA (heap_avx2.cc, heap_avx512.cc,
// both from heap_scan.h). Each runs only on a CPU with its ISA (the `simd`
// parameter's choice_isa); heap.cc drives them.
#ifndef KREG_PLUGINS_TOPK_HEAP_H_
#define KREG_PLUGINS_TOPK_HEAP_H_

#include <cstdint>

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
};

extern const HeapOps kHeapAvx2;
extern const HeapOps kHeapAvx512;

}  // namespace kreg::topk

#endif  // KREG_PLUGINS_TOPK_HEAP_H_
