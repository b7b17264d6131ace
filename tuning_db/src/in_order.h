// Work over a sequence on every core whose results join in order: what
// Lut::Build uses for its entries and measured defaults. Not installed.
#ifndef KREG_TUNING_DB_IN_ORDER_H_
#define KREG_TUNING_DB_IN_ORDER_H_
#include <algorithm>
#include <cstddef>
#include <vector>

#include "oneapi/tbb/parallel_pipeline.h"
#include "oneapi/tbb/task_arena.h"

namespace kreg {
namespace lut_internal {

// For each i in [0, n): start(i, &slot) in order of i, then work(i, &slot,
// before) on any core, then finish(i, &slot) in order of i, one call of
// start or finish at a time. `before` is slot i - 1 when work has done it
// on the same core (within a block), else null. Items go through in blocks
// of 64, each while it is in cache; a block's slots are made anew for each
// block. With one core, each item goes through alone.
template <typename Slot, typename Start, typename Work, typename Finish>
void InOrderOnEveryCore(int n, Start&& start, Work&& work, Finish&& finish) {
  if (tbb::this_task_arena::max_concurrency() == 1) {  // one at a time, in place (a pipeline costs more)
    for (int i = 0; i < n; ++i) {
      Slot slot;
      start(i, &slot);
      work(i, &slot, nullptr);
      finish(i, &slot);
    }
    return;
  }
  constexpr int kBlock = 64;
  struct Block {
    int begin = 0, end = 0;
    std::vector<Slot> slots;
  };
  // A block is reused `tokens` blocks later: by then it has finished, as
  // finishes go in order and at most `tokens` blocks are in flight.
  const size_t tokens = 2 * static_cast<size_t>(tbb::this_task_arena::max_concurrency());
  std::vector<Block> ring(tokens);
  int next = 0;
  size_t started = 0;
  auto begin_block = [&](tbb::flow_control& control) -> Block* {
    if (next >= n) {
      control.stop();
      return nullptr;
    }
    Block* b = &ring[started++ % tokens];
    b->begin = next;
    b->end = next = std::min(n, next + kBlock);
    b->slots.clear();
    b->slots.resize(b->end - b->begin);
    for (int i = b->begin; i < b->end; ++i) start(i, &b->slots[i - b->begin]);
    return b;
  };
  auto work_block = [&](Block* b) {
    for (int i = b->begin; i < b->end; ++i) {
      Slot* slot = &b->slots[i - b->begin];
      work(i, slot, i > b->begin ? slot - 1 : nullptr);
    }
    return b;
  };
  auto finish_block = [&](Block* b) {
    for (int i = b->begin; i < b->end; ++i) finish(i, &b->slots[i - b->begin]);
  };
  tbb::parallel_pipeline(tokens, tbb::make_filter<void, Block*>(tbb::filter_mode::serial_in_order, begin_block) &
                                     tbb::make_filter<Block*, Block*>(tbb::filter_mode::parallel, work_block) &
                                     tbb::make_filter<Block*, void>(tbb::filter_mode::serial_in_order, finish_block));
}

}  // namespace lut_internal
}  // namespace kreg

#endif  // KREG_TUNING_DB_IN_ORDER_H_
