// The machine module, GPU side: the CUDA backend module, the devices it
// sees, and a GPU as a machine.
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kreg/cuda_backend.h"
#include "kreg/machine.h"
#include "kreg/registry.h"

#ifndef KREG_INSTALL_BACKEND_DIR
#define KREG_INSTALL_BACKEND_DIR ""
#endif
#ifndef KREG_INSTALL_BACKEND_SUBDIR  // relative to the prefix
#define KREG_INSTALL_BACKEND_SUBDIR "lib/kreg/backends"
#endif

namespace kreg {
namespace {

// The CUDA backend module, or why there is none.
struct LoadedCudaBackend {
  const kreg_cuda_backend* table = nullptr;
  absl::Status status;
};

LoadedCudaBackend* LoadCudaBackend() {
  auto* b = new LoadedCudaBackend;
  std::string tried;
  for (const std::string& path : BackendModulePaths("kreg_cuda_backend.so", "KREG_CUDA_BACKEND")) {
    if (!std::filesystem::exists(path)) {
      absl::StrAppend(&tried, tried.empty() ? "" : ", ", path);
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      b->status = absl::UnavailableError(absl::StrCat("cuda backend: ", dlerror()));
      return b;
    }
    using Entry = const kreg_cuda_backend* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "kreg_cuda_backend_v1"));
    b->table = entry != nullptr ? entry() : nullptr;
    if (b->table == nullptr || b->table->struct_size < sizeof(kreg_cuda_backend)) {
      b->table = nullptr;
      b->status = absl::UnavailableError(absl::StrCat("cuda backend: ", path, " is not kreg's CUDA backend"));
    }
    return b;
  }
  b->status = absl::UnavailableError(absl::StrCat(
      "the CUDA backend is not installed (kreg was built without the CUDA toolkit): looked for ", tried));
  return b;
}

// A module function's failure as a status.
absl::Status Check(int rc, const char* msg) {
  return rc == 0 ? absl::OkStatus() : absl::UnavailableError(msg[0] != '\0' ? msg : "the CUDA backend failed");
}

std::string CudaVersion(int v) { return absl::StrCat(v / 1000, ".", v % 1000 / 10); }

GpuInfo FromModule(int ordinal, const kreg_gpu_info& g) {
  return GpuInfo{ordinal,        g.name, g.sm, g.num_sms, g.memory_bytes, g.l2_bytes, CudaVersion(g.driver_version),
                 CudaVersion(g.runtime_version)};
}

absl::StatusOr<std::vector<GpuInfo>> DescribeCudaDevices() {
  absl::StatusOr<const kreg_cuda_backend*> table = CudaBackend();
  if (!table.ok()) return table.status();
  char msg[512] = "";
  int n = 0;
  if (absl::Status s = Check((*table)->count(&n, msg, sizeof msg), msg); !s.ok()) return s;
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < n; ++i) {
    kreg_gpu_info g{};
    if (absl::Status s = Check((*table)->describe(i, &g, msg, sizeof msg), msg); !s.ok()) return s;
    gpus.push_back(FromModule(i, g));
  }
  return gpus;
}

}  // namespace

std::vector<std::string> BackendModulePaths(const char* file, const char* env_var) {
  if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> candidates;
  if (!InstallPrefix().empty()) {
    candidates.push_back(absl::StrCat(InstallPrefix(), "/", KREG_INSTALL_BACKEND_SUBDIR, "/", file));
  }
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((exe.parent_path().parent_path() / "lib/kreg/backends" / file).string());
  if (*KREG_INSTALL_BACKEND_DIR != '\0') candidates.push_back(absl::StrCat(KREG_INSTALL_BACKEND_DIR, "/", file));
  return candidates;
}

absl::StatusOr<const kreg_cuda_backend*> CudaBackend() {
  // Loaded once for the process's life.
  static const LoadedCudaBackend* const backend = LoadCudaBackend();
  if (backend->table == nullptr) return backend->status;
  return backend->table;
}

absl::StatusOr<std::vector<GpuInfo>> CudaDevices() {
  // Asked once per process: CanRun asks for every CUDA kernel it is shown.
  static const absl::StatusOr<std::vector<GpuInfo>>* const found =
      new absl::StatusOr<std::vector<GpuInfo>>(DescribeCudaDevices());
  return *found;
}

MachineInfo GpuMachineInfo(const GpuIdentity& gpu) {
  MachineInfo m;
  m.gpu = gpu;
  m.id = FingerprintId(m);
  return m;
}

MachineInfo GpuMachineInfo(const GpuInfo& gpu) {
  return GpuMachineInfo(GpuIdentity{gpu.name, static_cast<uint32_t>(std::max(gpu.sm, 0)),
                                    static_cast<uint32_t>(std::max(gpu.num_sms, 0)), gpu.memory_bytes, gpu.driver});
}

MachineInfo GpuMachineInfo(const kreg_device& device) {
  const int v = KREG_HAS_FIELD(&device, kreg_device, driver_version) ? device.driver_version : 0;
  return GpuMachineInfo(GpuIdentity{device.name != nullptr ? device.name : "",
                                    static_cast<uint32_t>(std::max(device.sm, 0)),
                                    static_cast<uint32_t>(std::max(device.num_sms, 0)), device.memory_bytes,
                                    CudaVersion(v)});
}

}  // namespace kreg
