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
#include "tests/plugins/correct_topk.h"

namespace {

using namespace kreg::topk;

const char* const kChecks[] = {"ok", "crash", "hang", "refuse"};
enum CheckMode { kOk, kCrash, kHang, kRefuse };

const kreg_param_desc kCheckParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "check",
    .doc = "how the legality check behaves",
    .kind = KREG_PARAM_CHOICE,
    .choices = kChecks,
    .num_choices = 4,
    .default_value = kOk,
};
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
  return CorrectTopK(a, host, msg, cap);
}

const kreg_kernel kBadCheckKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "bad_check",
    .version = 1,
    .doc = "a correct top-k whose check misbehaves on request",
    .params = kParams,
    .num_params = 1,
    .check = Check,
    .run = GuardedRun<Run>,
};
const kreg_kernel* const kKernels[] = {&kBadCheckKernel};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "bad_check",
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = 1,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
