// A topk plugin that misbehaves on request, for the tuner's isolation tests:
// parameter `mode` picks ok (a correct top-k), slow (correct, 20 ms per
// call), wrong (reversed rows), crash (SIGSEGV) or hang (never returns).
// It declares no op: its one kernel implements op "topk", which the topk
// plugin declares.
#include <chrono>
#include <csignal>
#include <thread>

#include "plugins/topk/common.h"

namespace {

using namespace kreg::topk;

const char* const kModes[] = {"ok", "slow", "wrong", "crash", "hang"};
enum Mode { kOk, kSlow, kWrong, kCrash, kHang };

const kreg_param_desc kModeParam = [] {
  kreg_param_desc d{};
  d.struct_size = sizeof(kreg_param_desc);
  d.name = "mode";
  d.doc = "how to behave";
  d.kind = KREG_PARAM_CHOICE;
  d.choices = kModes;
  d.num_choices = 5;
  d.default_value = kOk;
  return d;
}();
const kreg_param_desc* const kParams[] = {&kModeParam};

kreg_status Run(const TopKArgs& a, const kreg_config* config, const kreg_host* host, char* msg, size_t cap) {
  const int64_t mode = Param(config, 0).value;
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

const kreg_kernel kFaultyKernel = [] {
  kreg_kernel d{};
  d.struct_size = sizeof(kreg_kernel);
  d.op = "topk";
  d.variant = "faulty";
  d.version = 1;
  d.doc = "misbehaves on request";
  d.params = kParams;
  d.num_params = 1;
  d.check = CheckTopK;
  d.run = GuardedRun<Run>;
  return d;
}();
const kreg_kernel* const kKernels[] = {&kFaultyKernel};

const kreg_plugin kPlugin = [] {
  kreg_plugin d{};
  d.struct_size = sizeof(kreg_plugin);
  d.abi_version = KREG_ABI_VERSION;
  d.name = "faulty";
  d.version = "0.1";
  d.ops = nullptr;  // op "topk" is the topk plugin's
  d.num_ops = 0;
  d.kernels = kKernels;
  d.num_kernels = 1;
  return d;
}();

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
