// A gmm kernel that misbehaves on request, for the faulty-plugin suite:
// parameter `mode` picks ok (gmm/reference's result), overrun (that result,
// then 16 bytes written just past the end of `out`) or scribble (that
// result, then 64 KiB written past the end of `out`, over whatever the
// heap holds there). It declares no op: op gmm is the gmm plugin's.
#include <cstring>

#include "plugins/gmm/common.h"

namespace kreg::gmm {
extern const kreg_kernel kGmmReferenceKernel;  // plugins/gmm/reference.cc, built in
}  // namespace kreg::gmm

namespace {

const char* const kModes[] = {"ok", "overrun", "scribble"};
enum Mode { kOk, kOverrun, kScribble };

const kreg_param_desc kModeParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "mode",
    .doc = "how to behave",
    .kind = KREG_PARAM_CHOICE,
    .choices = kModes,
    .num_choices = 3,
    .default_value = kOk,
};
const kreg_param_desc* const kParams[] = {&kModeParam};

kreg_status Run(const kreg_config* config, const kreg_args* args, void* state, void* workspace, size_t workspace_size,
                const kreg_host* host, char* msg, size_t cap) {
  const kreg_status s =
      kreg::gmm::kGmmReferenceKernel.run(config, args, state, workspace, workspace_size, host, msg, cap);
  if (s != KREG_OK) return s;
  kreg::gmm::GroupedView v;
  if (!kreg::gmm::ViewGmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
  const size_t bytes = static_cast<size_t>(v.m * v.n) * (v.out_bf16 ? 2 : 4);
  char* end = static_cast<char*>(v.out->data) + v.out->byte_offset + bytes;
  const int64_t mode = config->values[0]->value;
  if (mode == kOverrun) std::memset(end, 0x5a, 16);
  if (mode == kScribble) std::memset(end, 0x5a, 65536);
  return KREG_OK;
}

const kreg_kernel kFaultyGmmKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "faulty",
    .version = 1,
    .doc = "writes past its output on request",
    .params = kParams,
    .num_params = 1,
    .run = Run,
};
const kreg_kernel* const kKernels[] = {&kFaultyGmmKernel};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "faulty_gmm",
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = 1,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
