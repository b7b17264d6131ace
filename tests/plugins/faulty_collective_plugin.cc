// An allreduce kernel that misbehaves on one rank, for the fault tests:
// parameter `mode` picks ok (a correct f32 sum: everyone sends x to
// everyone), silent (rank `culprit` returns at once, never answering),
// fail (rank `culprit` returns an error before communicating), mismatch
// (rank `culprit` sends one element more than the others expect) or die
// (rank `culprit` kills its process). With KREG_FAULTY_STOP=1, silent's
// culprit stops its process instead (SIGSTOP: alive, answering nothing, not
// even MPI_Finalize). It declares no op: op "allreduce" is the collectives
// plugin's.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kreg/plugin_abi.h"

namespace {

const char* const kModes[] = {"ok", "silent", "fail", "mismatch", "die"};
enum Mode { kOk, kSilent, kFail, kMismatch, kDie };
const int64_t kRanks[] = {0, 1, 2, 3};

const kreg_param_desc kModeParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "mode",
    .doc = "how rank `culprit` behaves",
    .kind = KREG_PARAM_CHOICE,
    .choices = kModes,
    .num_choices = 5,
    .default_value = kOk,
};
const kreg_param_desc kCulpritParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "culprit",
    .doc = "the misbehaving rank",
    .kind = KREG_PARAM_INT,
    .values = kRanks,
    .num_values = 4,
    .default_value = 1,
};
const kreg_param_desc* const kParams[] = {&kModeParam, &kCulpritParam};

kreg_status Check(const kreg_config*, const kreg_args* args, const kreg_host*, char* msg, size_t cap) {
  if (args->tensors[0]->dtype.code != kDLFloat || args->tensors[0]->dtype.bits != 32 || args->attrs[0].i != 0) {
    std::snprintf(msg, cap, "allreduce/faulty: f32 sums only");
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

kreg_status Run(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                char* msg, size_t cap) {
  const kreg_comm* c = host->comm;
  const int64_t mode = config->values[0]->value;
  const bool culprit = c->rank == config->values[1]->value;
  if (culprit && mode == kSilent) {
    if (const char* stop = std::getenv("KREG_FAULTY_STOP"); stop != nullptr && stop[0] == '1') std::raise(SIGSTOP);
    return KREG_OK;
  }
  if (culprit && mode == kFail) {
    std::snprintf(msg, cap, "rank %d gives up on purpose", c->rank);
    return KREG_INTERNAL;
  }
  if (culprit && mode == kDie) std::raise(SIGKILL);
  const int64_t count = args->dims[0];
  // x, and one more element for the mismatch.
  std::vector<float> x(static_cast<const float*>(args->tensors[0]->data),
                       static_cast<const float*>(args->tensors[0]->data) + count);
  x.push_back(0);
  std::vector<float> all(static_cast<size_t>(count * c->size) + 1);
  std::vector<void*> requests;
  kreg_status status = KREG_OK;
  for (int q = 0; q < c->size && status == KREG_OK; ++q) {
    if (q == c->rank) continue;
    void* r = nullptr;
    const size_t send = (count + (culprit && mode == kMismatch ? 1 : 0)) * sizeof(float);
    status = c->isend(c->ctx, q, 0, x.data(), send, &r, msg, cap);
    if (status == KREG_OK) requests.push_back(r);
    if (status == KREG_OK) status = c->irecv(c->ctx, q, 0, &all[q * count], count * sizeof(float), &r, msg, cap);
    if (status == KREG_OK) requests.push_back(r);
  }
  for (void* r : requests) {
    char why[512] = "";
    const kreg_status s = c->wait(c->ctx, r, why, sizeof why);
    if (s != KREG_OK && status == KREG_OK) {
      status = s;
      std::snprintf(msg, cap, "%s", why);
    }
  }
  if (status != KREG_OK) return status;
  std::memcpy(&all[c->rank * count], x.data(), count * sizeof(float));
  auto* out = static_cast<float*>(args->tensors[1]->data);
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int q = 0; q < c->size; ++q) sum += all[q * count + i];
    out[i] = static_cast<float>(sum);
  }
  return KREG_OK;
}

const kreg_kernel kFaultyKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "allreduce",
    .variant = "faulty",
    .version = 1,
    .doc = "misbehaves on one rank on request (mode, culprit)",
    .params = kParams,
    .num_params = 2,
    .check = Check,
    .run = Run,
};
const kreg_kernel* const kKernels[] = {&kFaultyKernel};

const kreg_plugin kPlugin = {
    .struct_size = sizeof(kreg_plugin),
    .abi_version = KREG_ABI_VERSION,
    .name = "faulty_collective",
    .version = "1",
    .kernels = kKernels,
    .num_kernels = 1,
};

}  // namespace

extern "C" KREG_PLUGIN_EXPORT const kreg_plugin* kreg_plugin_v2(void) { return &kPlugin; }
