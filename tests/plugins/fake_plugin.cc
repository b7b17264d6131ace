// A configurable test plugin. Built many times with different FLAW values by
// tests/CMakeLists.txt, each build broken in one way the loader must refuse
// (or, for FLAW_NONE and FLAW_FOREIGN_ISA, loadable).
#include <cstdio>

#include "kreg/plugin_abi.h"

#define FLAW_NONE 0
#define FLAW_NO_SYMBOL 1
#define FLAW_WRONG_ABI 2
#define FLAW_NEWER_ABI 3
#define FLAW_NULL_RUN 4
#define FLAW_BAD_DEFAULT 5
#define FLAW_UNKNOWN_OP 6
#define FLAW_BAD_NAME 7
#define FLAW_SMALL_STRUCT 8
#define FLAW_DUP_PARAM 9
#define FLAW_SECOND_KERNEL_BAD 10
#define FLAW_FOREIGN_ISA 11
#define FLAW_NULL_TABLE 12

#ifndef FLAW
#define FLAW FLAW_NONE
#endif
#ifndef VARIANT
#define VARIANT "fake"
#endif

namespace {

const int64_t kTileValues[] = {8, 16, 32};

const kreg_param_desc kParams[] = {
    {sizeof(kreg_param_desc), "tile", "a tile size", KREG_PARAM_INT, kTileValues, 3,
     nullptr, 0, FLAW == FLAW_BAD_DEFAULT ? 12 : 16, nullptr, 0},
    {sizeof(kreg_param_desc), FLAW == FLAW_DUP_PARAM ? "tile" : "rounds", "a count", KREG_PARAM_INT,
     kTileValues, 3, nullptr, 0, 8, nullptr, 0},
};

kreg_status Check(const kreg_config* config, const void*, char* msg, size_t cap) {
  if (config->values[0].value == 32) {
    std::snprintf(msg, cap, "tile=32 is too big for this fake");
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

kreg_status Run(const kreg_config* config, const void*, void*, size_t, const kreg_host*, char* msg,
                size_t cap) {
  std::snprintf(msg, cap, "fake kernel ran with tile=%lld", static_cast<long long>(config->values[0].value));
  return KREG_UNIMPLEMENTED;
}

const kreg_kernel kKernels[] = {
    {FLAW == FLAW_SMALL_STRUCT ? 8 : sizeof(kreg_kernel),
     FLAW == FLAW_UNKNOWN_OP ? "frobnicate" : "topk",
     FLAW == FLAW_BAD_NAME ? "Bad-Name" : VARIANT, 1, "a fake for loader tests",
     FLAW == FLAW_FOREIGN_ISA ? (1u << 30) : 0u, kParams, 2, Check, nullptr,
     FLAW == FLAW_NULL_RUN ? nullptr : Run},
    {sizeof(kreg_kernel), "topk", VARIANT "_two", 1, "a second fake", 0, kParams, 2, Check, nullptr,
     FLAW == FLAW_SECOND_KERNEL_BAD ? nullptr : Run},
};

const kreg_plugin kPlugin = {
    sizeof(kreg_plugin), FLAW == FLAW_WRONG_ABI ? 99u : static_cast<uint32_t>(KREG_ABI_VERSION), "fake",
    "0.1", kKernels, 2,
};

}  // namespace

#if FLAW == FLAW_NEWER_ABI
extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
#elif FLAW == FLAW_NO_SYMBOL
extern "C" KREG_PLUGIN_EXPORT int not_a_kreg_plugin(void) { return 42; }
#elif FLAW == FLAW_NULL_TABLE
extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v1(void) { return nullptr; }
#else
extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v1(void) { return &kPlugin; }
#endif
