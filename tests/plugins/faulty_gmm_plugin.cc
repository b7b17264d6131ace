// A gmm kernel that misbehaves on request, for the faulty-plugin suite:
// parameter `mode` picks ok (gmm/reference's result), overrun (that result,
// then 16 bytes written just past the end of `out`) or scribble (that
// result, then 64 KiB written past the end of `out`, over whatever the
// heap holds there). A second kernel, gmm/flush, computes gmm/reference's
// result on lhs and rhs with their subnormals of one dtype read as zero
// (parameter `dtype`): bf16, as bf16 dot-product instructions do, is
// allowed; f32 is not. It declares no op: op gmm is the gmm plugin's.
#include <cstdint>
#include <cstring>
#include <vector>

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
const char* const kFlushDtypes[] = {"bf16", "f32"};
const kreg_param_desc kFlushDtypeParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "dtype",
    .doc = "whose subnormal inputs are read as zero",
    .kind = KREG_PARAM_CHOICE,
    .choices = kFlushDtypes,
    .num_choices = 2,
    .default_value = 0,
};
const kreg_param_desc* const kFlushParams[] = {&kFlushDtypeParam};

// A copy of t's elements with their subnormals zeroed if t has dtype code
// `code`, and *out: t pointing at the copy.
std::vector<char> Flushed(const DLTensor* t, uint8_t code, DLTensor* out) {
  int64_t count = 1;
  for (int d = 0; d < t->ndim; ++d) count *= t->shape[d];
  const size_t esize = t->dtype.bits / 8;
  std::vector<char> copy(static_cast<size_t>(count) * esize);
  std::memcpy(copy.data(), static_cast<const char*>(t->data) + t->byte_offset, copy.size());
  for (int64_t e = 0; t->dtype.code == code && e < count; ++e) {
    char* at = copy.data() + e * esize;
    uint32_t x = 0;
    std::memcpy(&x, at, esize);  // little-endian: the element's bits, zero-extended
    const uint32_t exponent = esize == 2 ? 0x7f80u : 0x7f800000u, sign = esize == 2 ? 0x8000u : 0x80000000u;
    if ((x & exponent) == 0) x &= sign;
    std::memcpy(at, &x, esize);
  }
  *out = *t;
  out->data = copy.data();
  out->byte_offset = 0;
  return copy;
}

kreg_status FlushRun(const kreg_config* config, const kreg_args* args, void* state, void* workspace,
                     size_t workspace_size, const kreg_host* host, char* msg, size_t cap) {
  const uint8_t code = config->values[0]->value == 0 ? kDLBfloat : kDLFloat;
  std::vector<DLTensor*> tensors(args->tensors, args->tensors + args->num_tensors);
  DLTensor inputs[2];
  std::vector<char> copies[2];
  for (int i : {kreg::gmm::kGmmLhs, kreg::gmm::kGmmRhs}) {
    copies[i] = Flushed(args->tensors[i], code, &inputs[i]);
    tensors[i] = &inputs[i];
  }
  kreg_args flushed = *args;
  flushed.tensors = tensors.data();
  return kreg::gmm::kGmmReferenceKernel.run(config, &flushed, state, workspace, workspace_size, host, msg, cap);
}

const kreg_kernel kFlushGmmKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "flush",
    .version = 1,
    .doc = "reads subnormal inputs of one dtype as zero",
    .params = kFlushParams,
    .num_params = 1,
    .run = FlushRun,
};
const kreg_kernel* const kKernels[] = {&kFaultyGmmKernel, &kFlushGmmKernel};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "faulty_gmm",
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = 2,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
