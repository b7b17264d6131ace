// A topk plugin that misbehaves on request, for the tuner's isolation tests:
// parameter `mode` picks ok (a correct top-k), slow (correct, 20 ms per
// call), wrong (reversed rows), crash (SIGSEGV), hang (never returns),
// killed (SIGKILL, as the OOM killer sends) or greedy (asks for nearly
// SIZE_MAX bytes of workspace).
// It declares no op: its one kernel implements op "topk", which the topk
// plugin declares. Built as test_shadow (FAULTY_VARIANT "sort") it is a
// third party's topk/sort, shadowing the built-in one.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "plugins/topk/common.h"
#include "tests/plugins/correct_topk.h"

namespace {

using namespace kreg::topk;

const char* const kModes[] = {"ok", "slow", "wrong", "crash", "hang", "killed", "greedy"};
enum Mode { kOk, kSlow, kWrong, kCrash, kHang, kKilled, kGreedy };

const kreg_param_desc kModeParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "mode",
    .doc = "how to behave",
    .kind = KREG_PARAM_CHOICE,
    .choices = kModes,
    .num_choices = 7,
    .default_value = kOk,
};
const kreg_param_desc* const kParams[] = {&kModeParam};

kreg_status Run(const TopKArgs& a, const kreg_config* config, const kreg_host* host, char* msg, size_t cap) {
  const int64_t mode = Param(config, 0).value;
  // KREG_FAULTY_ALL_CRASH: every mode crashes (a sweep in which nothing succeeds).
  if (mode == kCrash || std::getenv("KREG_FAULTY_ALL_CRASH") != nullptr) std::raise(SIGSEGV);
  if (mode == kKilled) std::raise(SIGKILL);
  while (mode == kHang) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (mode == kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return CorrectTopK(a, host, msg, cap, /*reversed=*/mode == kWrong);
}

#ifndef FAULTY_VARIANT
#define FAULTY_VARIANT "faulty"
#endif

kreg_status WorkspaceBytes(const kreg_config* config, const kreg_args*, const kreg_host*, size_t* bytes, char*,
                           size_t) {
  *bytes = Param(config, 0).value == kGreedy ? SIZE_MAX - 10 : 0;
  return KREG_OK;
}

const kreg_kernel kFaultyKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = FAULTY_VARIANT,
    .version = 1,
    .doc = "misbehaves on request",
    .params = kParams,
    .num_params = 1,
    .check = CheckTopK,
    .workspace_bytes = WorkspaceBytes,
    .run = GuardedRun<Run>,
};
const kreg_kernel* const kKernels[] = {&kFaultyKernel};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "faulty",
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = 1,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
