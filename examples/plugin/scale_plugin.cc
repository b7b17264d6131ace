// An out-of-tree kreg plugin: it declares op "scale" (y = alpha * x) and one
// kernel of it, which is also the op's reference. Build it against an
// installed kreg (see CMakeLists.txt), then
//   kreg run scale/plain --plugin-path DIR --dims n=1000,alpha=2 --check
// It uses the installed plugin SDK (kreg/plugin_sdk.h: element access, the
// exported table), header-only over the ABI.
#include "kreg/plugin_sdk.h"

namespace {

const kreg_dim_desc kN = {sizeof(kreg_dim_desc), "n", "elements", 0};
const kreg_dim_desc* const kDims[] = {&kN};

const kreg_tensor_desc kX = {sizeof(kreg_tensor_desc), "x", "the input", KREG_ROLE_IN, 0,
                             KREG_DTYPE_F32, nullptr, "n"};
const kreg_tensor_desc kY = {sizeof(kreg_tensor_desc), "y", "alpha * x", KREG_ROLE_OUT, 0,
                             KREG_DTYPE_F32, nullptr, "n"};
const kreg_tensor_desc* const kTensors[] = {&kX, &kY};

kreg_attr_desc Alpha() {
  kreg_attr_desc a{};
  a.struct_size = sizeof a;
  a.name = "alpha";
  a.doc = "the factor";
  a.kind = KREG_ATTR_FLOAT;
  a.default_value.f = 1.0;
  a.min.f = -1e30;
  a.max.f = 1e30;
  return a;
}
const kreg_attr_desc kAlpha = Alpha();
const kreg_attr_desc* const kAttrs[] = {&kAlpha};

const kreg_op_desc kScale = {sizeof(kreg_op_desc), "scale", "y = alpha * x", kDims, 1, kTensors, 2, kAttrs, 1};
const kreg_op_desc* const kOps[] = {&kScale};

// The host has validated shapes and dtypes: x and y are float32 [n].
kreg_status Run(const kreg_config*, const kreg_args* args, void*, void*, size_t, const kreg_host*, char*,
                size_t) {
  const float alpha = static_cast<float>(args->attrs[0].f);
  const float* x = kreg::sdk::Data<const float>(args->tensors[0]);
  float* y = kreg::sdk::Data<float>(args->tensors[1]);
  for (int64_t i = 0; i < args->dims[0]; ++i) y[i] = alpha * x[i];
  return KREG_OK;
}

kreg_kernel Plain() {
  kreg_kernel k{};
  k.struct_size = sizeof k;
  k.op = "scale";
  k.variant = "plain";
  k.version = 1;
  k.doc = "one multiply per element";
  k.flags = KREG_KERNEL_REFERENCE;
  k.run = Run;
  return k;
}
const kreg_kernel kPlain = Plain();
const kreg_kernel* const kKernels[] = {&kPlain};

}  // namespace

KREG_DEFINE_PLUGIN("scale", "1.0", kOps, kKernels)
