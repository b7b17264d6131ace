// CUDA kernels for the host-memory test device (host_device_backend.cc):
// they declare kreg_kernel.device = KREG_DEVICE_CUDA, so kreg treats them as
// GPU kernels (their tensors copied to the device, timed with the device's
// events, keyed under the GPU), and run on the tensors they are given in
// place, which that backend keeps in host memory. topk/host_device is a
// correct top-k; `passes` > 1 computes it that many times (a slower
// configuration for the tuner to tell apart). gmm/host_device and
// tgmm/host_device are gmm's reference on the device's tensors. It
// declares no op.
#include <vector>

#include "plugins/topk/common.h"
#include "tests/plugins/correct_topk.h"

namespace kreg::gmm {
extern const kreg_kernel kGmmReferenceKernel;   // plugins/gmm/reference.cc, built in
extern const kreg_kernel kTgmmReferenceKernel;
}  // namespace kreg::gmm

namespace {

using namespace kreg::topk;

const int64_t kPasses[] = {1, 3};
const kreg_param_desc kPassesParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "passes",
    .doc = "times the top-k is computed",
    .kind = KREG_PARAM_INT,
    .values = kPasses,
    .num_values = 2,
    .default_value = 3,
};
const kreg_param_desc* const kParams[] = {&kPassesParam};

kreg_status Check(const kreg_config*, const kreg_args* args, const kreg_host*, char* msg, size_t cap) {
  TopKArgs a;
  return MakeTopKArgs(args, &a, msg, cap) ? KREG_OK : KREG_INVALID_ARGUMENT;
}

// Whether the host gave a CUDA device and every tensor is on it.
kreg_status OnDevice(const kreg_args* args, const kreg_host* host, char* msg, size_t cap) {
  if (host == nullptr || !KREG_HAS_FIELD(host, kreg_host, device) || host->device == nullptr ||
      host->device->kind != KREG_DEVICE_CUDA || !(args->flags & KREG_ARGS_ON_DEVICE)) {
    return Fail(KREG_UNAVAILABLE, msg, cap, "a host_device kernel runs on a CUDA device (the host gave none)");
  }
  for (size_t i = 0; i < args->num_tensors; ++i) {
    if (args->tensors[i] != nullptr && args->tensors[i]->device.device_type != kDLCUDA) {
      return Fail(KREG_INVALID_ARGUMENT, msg, cap, "a tensor is not on the CUDA device");
    }
  }
  return KREG_OK;
}

kreg_status Run(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                char* msg, size_t cap) {
  if (kreg_status s = OnDevice(args, host, msg, cap); s != KREG_OK) return s;
  return Guarded(msg, cap, [&] {
    TopKArgs a;
    if (!MakeTopKArgs(args, &a, msg, cap)) return KREG_INVALID_ARGUMENT;
    kreg_status s = KREG_OK;
    for (int64_t i = 0; i < Param(config, 0).value && s == KREG_OK; ++i) s = CorrectTopK(a, host, msg, cap);
    return s;
  });
}

const kreg_kernel kHostDeviceKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "topk",
    .variant = "host_device",
    .version = 1,
    .doc = "a correct top-k as a CUDA kernel of the host-memory test device",
    .params = kParams,
    .num_params = 1,
    .check = Check,
    .run = Run,
    .device = KREG_DEVICE_CUDA,
};
// A CPU kernel run on the device's tensors, which are host memory here:
// the same call seen as the CPU's.
template <const kreg_kernel& kCpu>
kreg_status AsCpu(const kreg_config* config, const kreg_args* args, void* state, void* workspace, size_t size,
                  const kreg_host* host, char* msg, size_t cap) {
  if (kreg_status s = OnDevice(args, host, msg, cap); s != KREG_OK) return s;
  std::vector<DLTensor> tensors(args->num_tensors);
  std::vector<DLTensor*> pointers(args->num_tensors, nullptr);
  for (size_t i = 0; i < args->num_tensors; ++i) {
    if (args->tensors[i] == nullptr) continue;
    tensors[i] = *args->tensors[i];
    tensors[i].device = {kDLCPU, 0};
    pointers[i] = &tensors[i];
  }
  kreg_args cpu = *args;
  cpu.tensors = pointers.data();
  cpu.flags &= ~KREG_ARGS_ON_DEVICE;
  kreg_host plain = *host;
  plain.device = nullptr;
  return kCpu.run(config, &cpu, state, workspace, size, &plain, msg, cap);
}

const kreg_kernel kGmmHostDevice = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "host_device",
    .version = 1,
    .doc = "gmm's reference as a CUDA kernel of the host-memory test device",
    .run = AsCpu<kreg::gmm::kGmmReferenceKernel>,
    .device = KREG_DEVICE_CUDA,
};
const kreg_kernel kTgmmHostDevice = {
    .struct_size = sizeof(kreg_kernel),
    .op = "tgmm",
    .variant = "host_device",
    .version = 1,
    .doc = "tgmm's reference as a CUDA kernel of the host-memory test device",
    .run = AsCpu<kreg::gmm::kTgmmReferenceKernel>,
    .device = KREG_DEVICE_CUDA,
};

const kreg_kernel* const kKernels[] = {&kHostDeviceKernel, &kGmmHostDevice, &kTgmmHostDevice};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "host_device",
    .version = "0.1",
    .kernels = kKernels,
    .num_kernels = 3,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
