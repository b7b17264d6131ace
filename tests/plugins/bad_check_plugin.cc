// A topk plugin whose legality check misbehaves on request, for the tuner's
// isolation tests: kernel topk/bad_check's parameter `check` picks ok (the
// check passes), crash (the check raises SIGSEGV), hang (the check never
// returns) or refuse (the check says no). Its run is a correct top-k. It
// declares no op: its one kernel implements op "topk", which the topk plugin
// declares.
#include <chrono>
#include <csignal>
#include <thread>

#include "plugins/topk/common.h"

namespace {

using namespace kreg::topk;

const char* const kChecks[] = {"ok", "crash", "hang", "refuse"};
enum CheckMode { kOk, kCrash, kHang, kRefuse };

const kreg_param_desc kCheckParam = [] {
  kreg_param_desc d{};
  d.struct_size = sizeof(kreg_param_desc);
  d.name = "check";
  d.doc = "how the legality check behaves";
  d.kind = KREG_PARAM_CHOICE;
  d.choices = kChecks;
  d.num_choices = 4;
  d.default_value = kOk;
  return d;
}();
const kreg_param_desc* const kParams[] = {&kCheckParam};

kreg_status Check(const kreg_config* config, const kreg_args* args, const kreg_host* host, char* msg,
                  size_t cap) {
  const int64_t mode = Param(config, 0).value;
  if (mode == kCrash) std::raise(SIGSEGV);
  while (mode == kHang) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (mode == kRefuse) return Fail(KREG_INVALID_ARGUMENT, msg, cap, "refused; as asked");
  return CheckTopK(config, args, host, msg, cap);
}

kreg_status Run(const TopKArgs& a, const kreg_config*, const kreg_host* host, char* msg, size_t cap) {
  const bool bf16 = IsBf16(a);
  return Finish(SelectRows(a, host, [&](int64_t r, int64_t start, int64_t end, std::vector<uint64_t>& keys) {
    const void* row = InputRow(a, r);
    keys.clear();
    for (int64_t c = start; c < end; ++c) keys.push_back(Pack(Score(FloatBits(row, bf16, c), a.largest), c));
    KeepBest(keys, a.k);
    return 0;
  }), msg, cap);
}

const kreg_kernel kBadCheckKernel = [] {
  kreg_kernel d{};
  d.struct_size = sizeof(kreg_kernel);
  d.op = "topk";
  d.variant = "bad_check";
  d.version = 1;
  d.doc = "a correct top-k whose check misbehaves on request";
  d.params = kParams;
  d.num_params = 1;
  d.check = Check;
  d.run = GuardedRun<Run>;
  return d;
}();
const kreg_kernel* const kKernels[] = {&kBadCheckKernel};

const kreg_plugin kPlugin = [] {
  kreg_plugin d{};
  d.struct_size = sizeof(kreg_plugin);
  d.abi_version = KREG_ABI_VERSION;
  d.name = "bad_check";
  d.version = "0.1";
  d.ops = nullptr;  // op "topk" is the topk plugin's
  d.num_ops = 0;
  d.kernels = kKernels;
  d.num_kernels = 1;
  return d;
}();

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
