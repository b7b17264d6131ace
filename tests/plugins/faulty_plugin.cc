// A topk plugin that misbehaves on request, for the tuner's isolation tests:
// parameter `mode` picks ok (a correct top-k), slow (correct, 20 ms per
// call), wrong (reversed rows), crash (SIGSEGV) or hang (never returns).
#include <csignal>
#include <thread>

#include "plugins/topk/common.h"

namespace {

const char* const kModes[] = {"ok", "slow", "wrong", "crash", "hang"};
enum Mode { kOk, kSlow, kWrong, kCrash, kHang };

const kreg_param_desc kParams[] = {
    {sizeof(kreg_param_desc), "mode", "how to behave", KREG_PARAM_CHOICE, nullptr, 0, kModes, 5, kOk, nullptr, 0},
};

kreg_status Run(const kreg_config* config, const void* args, void*, size_t, const kreg_host* host, char* msg,
                size_t cap) {
  using namespace kreg::topk;
  const kreg_topk_args& a = *static_cast<const kreg_topk_args*>(args);
  const int64_t mode = config->values[0].value;
  if (mode == kCrash) std::raise(SIGSEGV);
  while (mode == kHang) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (mode == kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const bool bf16 = IsBf16(a);
  return Finish(SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end, std::vector<uint64_t>& keys) {
    const void* row = InputRow(a, r);
    keys.clear();
    for (int64_t c = start; c < end; ++c) keys.push_back(Pack(Score(FloatBits(row, bf16, c), a.largest), c));
    KeepBest(keys, a.k);
    if (mode == kWrong) std::reverse(keys.begin(), keys.end());
    return 0;
  }), msg, cap);
}

const kreg_kernel kKernels[] = {
    {sizeof(kreg_kernel), "topk", "faulty", 1, "misbehaves on request", 0, kParams, 1, nullptr, nullptr, Run},
};
const kreg_plugin kPlugin = {sizeof(kreg_plugin), KREG_ABI_VERSION, "faulty", "0.1", kKernels, 1};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v1(void) { return &kPlugin; }
