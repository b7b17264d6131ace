// The machine kreg runs on: the CPU's ISA extensions, its fingerprint and
// class (what a tuning table names a machine by), and the CUDA GPUs the
// device backend module sees. The registry's kernels are filtered by the
// ISA; tables (kreg/lut.h) key their entries by a machine's fingerprint id.
//
// A machine is described by a plain struct, MachineInfo; the tuning
// database keeps it as its tuning::Machine message (kreg/lut.h converts).
// Fingerprint ids are stable: the same on every run, process and build of
// kreg on one machine, and the ids of shipped tables.
//
// The CUDA backend is a module, kreg_cuda_backend.so (kreg/cuda_backend.h),
// loaded at run time where it is built, so kreg never links CUDA. Where the
// module is missing, or there is no driver or no GPU, CudaDevices() says why
// (Unavailable), in one line.
//
// Thread-safety: every function here is thread-safe. What CpuIsa,
// HostMachine, CudaBackend and CudaDevices find is found once per process.
#ifndef KREG_REGISTRY_MACHINE_H_
#define KREG_REGISTRY_MACHINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/plugin_abi.h"

extern "C" {
struct kreg_cuda_backend;
}

namespace kreg {

// ---- The CPU's ISA ------------------------------------------------------------

// ISA bits (KREG_ISA_*) of the running CPU, and their names. Honours
// KREG_ISA_MASK=avx2,fma (pretend the CPU has only those). AMX bits are set
// only once the OS granted the tile state (requested here on first use).
uint32_t CpuIsa();
std::string IsaString(uint32_t bits);  // "avx512f,avx512bf16" or "none"

// ---- GPUs --------------------------------------------------------------------------

// A CUDA device as the backend module describes it.
struct GpuInfo {
  int ordinal = 0;
  std::string name;    // "NVIDIA H100 80GB HBM3"
  int sm = 0;          // compute capability, major * 10 + minor
  int num_sms = 0;
  uint64_t memory_bytes = 0;
  uint64_t l2_bytes = 0;
  std::string driver;   // the CUDA version the driver supports, "13.0"
  std::string runtime;  // the CUDA runtime kreg was built with
};

// Where a backend module (kreg_mpi.so, kreg_cuda_backend.so) may be, in order: the
// file `env_var` names, else beside kreg's library, next to the program,
// and in the configured install prefix.
std::vector<std::string> BackendModulePaths(const char* file, const char* env_var);

// The CUDA backend module's table (kreg_cuda_backend.so, found by
// BackendModulePaths with $KREG_CUDA_BACKEND), loaded once for the
// process's life; Unavailable with the reason otherwise.
absl::StatusOr<const kreg_cuda_backend*> CudaBackend();

// The CUDA devices of this machine (asked once per process); Unavailable
// with the reason (module missing, no driver, no GPU) otherwise.
absl::StatusOr<std::vector<GpuInfo>> CudaDevices();

// ---- Machines ---------------------------------------------------------------------

// What a GPU's fingerprint covers (name, sm, memory, driver), and its SM
// count.
struct GpuIdentity {
  std::string name;
  uint32_t sm = 0;
  uint32_t num_sms = 0;
  uint64_t memory_bytes = 0;
  std::string driver;
};

// A machine a table was tuned on or is asked about: a CPU, or a GPU (`gpu`
// set, the CPU fields empty). Fields as tuning::Machine documents them.
struct MachineInfo {
  std::string id;         // FingerprintId of the rest
  std::string cpu_model;  // /proc/cpuinfo "model name", or "unknown"
  std::vector<std::string> isa;  // IsaString's names, in kreg's bit order
  uint32_t cores = 0;     // logical CPUs
  std::string vendor;     // "AuthenticAMD", "GenuineIntel", Arm's implementer "0x41"
  std::string arch;       // uname: "x86_64", "aarch64"
  uint32_t family = 0;
  uint32_t model = 0;
  std::optional<GpuIdentity> gpu;
};

// Where a kernel runs and a table is asked for: this CPU, or CUDA device 0.
enum class DeviceKind { kCpu, kCuda };
// "cpu" or "cuda"; InvalidArgument otherwise ("device 'x': expected cpu or
// cuda").
absl::StatusOr<DeviceKind> ParseDevice(absl::string_view name);
absl::string_view DeviceName(DeviceKind device);
// Where a kernel of kreg_kernel.device `device` runs (0: the CPU).
inline DeviceKind DeviceKindOf(uint32_t device) {
  return device == KREG_DEVICE_CUDA ? DeviceKind::kCuda : DeviceKind::kCpu;
}

// This machine's CPU: model, the ISA bits kreg sees (CpuIsa(), so honouring
// KREG_ISA_MASK), logical cores, vendor, architecture, family and model, and
// their fingerprint id. Computed once.
const MachineInfo& HostMachine();

// The threads a run asking for `num_threads` (0: as many as it may) gets:
// no more than the CPUs this process may run on (its affinity mask, which
// taskset and container limits narrow), and 0 when that is every core of
// HostMachine() (what a measurement on all cores records).
int ThreadsAvailable(int num_threads);

// The stable id of a machine's fields: 16 lower-case hex digits of the
// 64-bit FNV-1a hash of "cpu_model\nisa,isa,...\ncores", followed by
// "\nvendor\narch\nfamily\nmodel" when `vendor` is set; a GPU's is
// kGpuIdPrefix and the hash of "cuda\nname\nsm\nmemory_bytes\ndriver".
std::string FingerprintId(const MachineInfo& machine);

// A GPU as a machine of its own, its id filled in: the machine of the keys
// of kernels that run on it.
inline constexpr absl::string_view kGpuIdPrefix = "cuda-";
MachineInfo GpuMachineInfo(const GpuIdentity& gpu);
// The same of a device the backend describes, or one the host opened
// (kreg_device: its name, SM version and count, memory and driver version).
MachineInfo GpuMachineInfo(const GpuInfo& gpu);
MachineInfo GpuMachineInfo(const kreg_device& device);
// Whether a machine id is a GPU's ("cuda-" and 16 hex digits).
bool IsGpuMachineId(absl::string_view id);

// A machine's vendor and architecture, inferred from its model name for
// records that predate those fields ("AMD ..." is "AuthenticAMD" on
// "x86_64"); "" when unknown.
std::string MachineVendor(const MachineInfo& machine);
std::string MachineArch(const MachineInfo& machine);
// Its core generation by vendor, family and model ("zen3",
// "sapphirerapids"), else "family F model M"; "" when not recorded.
std::string MicroArch(const MachineInfo& machine);
// "AMD EPYC, zen3, avx2, 2 cores": what answers name a machine by. A GPU's
// is "NVIDIA H100 80GB HBM3, sm_90, 80 GiB, driver CUDA 13.0".
std::string MachineSummary(const MachineInfo& machine);
// "amd-epyc-zen3-avx2-2c": the machine class a shipped table is named by
// (model, generation, widest vector ISA, cores); a GPU's is its name and SM
// version, "nvidia-h100-80gb-hbm3-sm90".
std::string MachineClass(const MachineInfo& machine);

}  // namespace kreg

#endif  // KREG_REGISTRY_MACHINE_H_
