// A configurable test plugin. Built many times with different FLAW values by
// tests/CMakeLists.txt, each build broken in one way the loader must refuse
// (or, for FLAW_NONE and FLAW_FOREIGN_ISA, loadable). Its kernels implement
// op "topk", which the real topk plugin declares (this fake declares none),
// except where a flaw says otherwise.
//
//   NONE               healthy: topk/<VARIANT> and topk/<VARIANT>_two
//   NO_SYMBOL          exports no kreg_plugin_v* symbol at all
//   WRONG_ABI          kreg_plugin_v2 whose table says abi_version 99
//   NEWER_ABI          exports only kreg_plugin_v3 (a newer ABI)
//   NULL_RUN           kernel 0's run is NULL
//   BAD_DEFAULT        parameter tile's default 12 is not among 8, 16, 32
//   UNKNOWN_OP         kernel 0 implements op "frobnicate", which nobody declares
//   BAD_NAME           kernel 0's variant is "Bad-Name"
//   SMALL_STRUCT       kernel 0's struct_size is 8
//   DUP_PARAM          both parameters are named "tile"
//   SECOND_KERNEL_BAD  kernel 1's run is NULL
//   FOREIGN_ISA        kernel 0 requires an ISA bit the host does not know
//                      (loads; the kernel is unavailable)
//   NULL_TABLE         kreg_plugin_v2 returns NULL
//   OLD_ABI            exports only kreg_plugin_v1 (an older ABI)
//   BAD_OP             declares op "fake_op" whose tensor x has shape "m,q",
//                      but the op declares dim m only; plus a kernel of it
//   INIT_FAILS         init returns KREG_INTERNAL, "no license"
//   NULL_KERNEL_PTR    kernels[1] is NULL
//   RUN_LINGERS        healthy, but each run leaves a thread in the plugin's
//                      code for 300 ms after it returns, as a threading
//                      runtime's worker finishing a task's last lines does
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <thread>

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
#define FLAW_OLD_ABI 13
#define FLAW_BAD_OP 14
#define FLAW_INIT_FAILS 15
#define FLAW_NULL_KERNEL_PTR 16
#define FLAW_INIT_CRASHES 17   // each of these three in a folder of its own:
#define FLAW_INIT_HANGS 18     // a folder of them takes a process down
#define FLAW_CTOR_CRASHES 19
#define FLAW_RUN_LINGERS 20     // in a folder of its own too: its topk/fake would shadow test_none's

#ifndef FLAW
#define FLAW FLAW_NONE
#endif
#ifndef VARIANT
#define VARIANT "fake"
#endif

namespace {

const int64_t kTileValues[] = {8, 16, 32};

const kreg_param_desc kTileParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tile",
    .doc = "a tile size",
    .kind = KREG_PARAM_INT,
    .values = kTileValues,
    .num_values = 3,
    .default_value = FLAW == FLAW_BAD_DEFAULT ? 12 : 16,
};
const kreg_param_desc kRoundsParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = FLAW == FLAW_DUP_PARAM ? "tile" : "rounds",
    .doc = "a count",
    .kind = KREG_PARAM_INT,
    .values = kTileValues,
    .num_values = 3,
    .default_value = 8,
};
const kreg_param_desc* const kParams[] = {&kTileParam, &kRoundsParam};

// Looks at the configuration only.
kreg_status Check(const kreg_config* config, const kreg_args*, const kreg_host*, char* msg, size_t cap) {
  if (config->num_values >= 1 && config->values[0]->value == 32) {
    std::snprintf(msg, cap, "tile=32 is too big for this fake");
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

kreg_status Run(const kreg_config* config, const kreg_args*, void*, void*, size_t, const kreg_host*, char* msg,
                size_t cap) {
  if (FLAW == FLAW_RUN_LINGERS) {
    std::thread([] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
      while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }).detach();
  }
  std::snprintf(msg, cap, "fake kernel ran with tile=%lld",
                static_cast<long long>(config->num_values >= 1 ? config->values[0]->value : -1));
  return KREG_UNIMPLEMENTED;
}

const kreg_kernel kKernel0 = {
    .struct_size = FLAW == FLAW_SMALL_STRUCT ? 8 : sizeof(kreg_kernel),
    .op = FLAW == FLAW_UNKNOWN_OP ? "frobnicate" : "topk",
    .variant = FLAW == FLAW_BAD_NAME ? "Bad-Name" : VARIANT,
    .version = 1,
    .doc = "a fake for loader tests",
    .required_isa = FLAW == FLAW_FOREIGN_ISA ? (1u << 30) : 0u,
    .params = kParams,
    .num_params = 2,
    .check = Check,
    .run = FLAW == FLAW_NULL_RUN ? nullptr : Run,
};
const kreg_kernel kKernel1 = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = VARIANT "_two",
    .version = 1,
    .doc = "a second fake",
    .params = kParams,
    .num_params = 2,
    .check = Check,
    .run = FLAW == FLAW_SECOND_KERNEL_BAD ? nullptr : Run,
};

#if FLAW == FLAW_BAD_OP
// An op whose tensor names a dim the op does not declare ("q"); otherwise
// well formed, with a reference kernel.
const kreg_dim_desc kDimM = {.struct_size = sizeof(kreg_dim_desc), .name = "m", .doc = "rows"};
const kreg_dim_desc* const kBadOpDims[] = {&kDimM};
const kreg_tensor_desc kBadOpX = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "x",
    .doc = "an input",
    .role = KREG_ROLE_IN,
    .dtypes = KREG_DTYPE_F32,
    .shape = "m,q",
};
const kreg_tensor_desc kBadOpY = {
    .struct_size = sizeof(kreg_tensor_desc),
    .name = "y",
    .doc = "an output",
    .role = KREG_ROLE_OUT,
    .dtypes = KREG_DTYPE_F32,
    .shape = "m",
};
const kreg_tensor_desc* const kBadOpTensors[] = {&kBadOpX, &kBadOpY};
const char* const kBadOpDefaults[] = {VARIANT};
const kreg_op_desc kBadOp = {
    .struct_size = sizeof(kreg_op_desc),
    .name = "fake_op",
    .doc = "an op with a shape naming an undeclared dim",
    .dims = kBadOpDims,
    .num_dims = 1,
    .tensors = kBadOpTensors,
    .num_tensors = 2,
    .default_variants = kBadOpDefaults,
    .num_default_variants = 1,
};
const kreg_op_desc* const kOps[] = {&kBadOp};

const kreg_kernel kBadOpKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "fake_op",
    .variant = VARIANT,
    .version = 1,
    .doc = "a kernel of the malformed op",
    .flags = KREG_KERNEL_REFERENCE,
    .run = Run,
};
const kreg_kernel* const kKernels[] = {&kKernel0, &kKernel1, &kBadOpKernel};
#else
const kreg_op_desc* const* const kOps = nullptr;
const kreg_kernel* const kKernels[] = {&kKernel0, FLAW == FLAW_NULL_KERNEL_PTR ? nullptr : &kKernel1};
#endif

kreg_status Init(const kreg_host*, char* msg, size_t cap) {
  if (FLAW == FLAW_INIT_FAILS) {
    std::snprintf(msg, cap, "no license");
    return KREG_INTERNAL;
  }
  if (FLAW == FLAW_INIT_CRASHES) std::raise(SIGSEGV);
  if (FLAW == FLAW_INIT_HANGS) {
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return KREG_OK;
}

#if FLAW == FLAW_CTOR_CRASHES
[[maybe_unused]] const int kCrashOnLoad = [] {
  std::raise(SIGSEGV);
  return 0;
}();
#endif

// Unused by the builds that export no kreg_plugin_v2/v3 entry.
[[maybe_unused]] const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = FLAW == FLAW_WRONG_ABI    ? 99u
                   : FLAW == FLAW_NEWER_ABI ? 3u
                                            : static_cast<uint32_t>(KREG_ABI_VERSION),
    .name = "fake",
    .version = "0.1",
    .ops = kOps,
    .num_ops = FLAW == FLAW_BAD_OP ? 1u : 0u,
    .kernels = kKernels,
    .num_kernels = sizeof kKernels / sizeof kKernels[0],
    .init = Init,
};

#if FLAW == FLAW_OLD_ABI
// A table shaped like ABI v1's kreg_plugin (no kernels). The host must refuse
// the plugin as built against an older ABI, whatever this points at.
struct PluginV1 {
  size_t struct_size;
  uint32_t abi_version;
  const char* name;
  const char* version;
  const void* kernels;
  size_t num_kernels;
};
const PluginV1 kPluginV1 = {sizeof(PluginV1), 1, "fake", "0.1", nullptr, 0};
#endif

}  // namespace

#if FLAW == FLAW_NO_SYMBOL
extern "C" KREG_PLUGIN_EXPORT int not_a_kreg_plugin(void) { return 42; }
#elif FLAW == FLAW_NEWER_ABI
extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v3(void) { return &kPlugin; }
#elif FLAW == FLAW_OLD_ABI
extern "C" KREG_PLUGIN_EXPORT const void* kreg_plugin_v1(void) { return &kPluginV1; }
#elif FLAW == FLAW_NULL_TABLE
extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return nullptr; }
#else
extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
#endif
