// The run body the misbehaving topk test plugins (faulty_plugin.cc,
// bad_check_plugin.cc) share: a plain, correct top-k of every row.
#ifndef KREG_TESTS_PLUGINS_CORRECT_TOPK_H_
#define KREG_TESTS_PLUGINS_CORRECT_TOPK_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "plugins/topk/common.h"

namespace kreg::topk {

// Each row's k best, best first; with `reversed`, each row's k best in
// reverse order (a wrong result, on purpose).
inline kreg_status CorrectTopK(const TopKArgs& a, const kreg_host* host, char* msg, size_t cap,
                               bool reversed = false) {
  const bool bf16 = IsBf16(a);
  return Finish(SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end, std::vector<uint64_t>& keys) {
    const void* row = InputRow(a, r);
    keys.clear();
    for (int64_t c = start; c < end; ++c) keys.push_back(Pack(Score(FloatBits(row, bf16, c), a.largest), c));
    KeepBest(keys, a.k);
    if (reversed) std::reverse(keys.begin(), keys.end());
    return 0;
  }), msg, cap);
}

}  // namespace kreg::topk

#endif  // KREG_TESTS_PLUGINS_CORRECT_TOPK_H_
