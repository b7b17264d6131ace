// The machine module, CPU side: ISA detection, this CPU's record and
// fingerprint, and how machines are named (summary, class). The GPUs are in
// machine_gpu.cc.
#include "kreg/machine.h"

#include <cpuid.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace kreg {
namespace {

// ---- ISA detection ------------------------------------------------------------

struct IsaName {
  uint32_t bit;
  const char* name;
};
constexpr IsaName kIsaNames[] = {
    {KREG_ISA_AVX2, "avx2"},           {KREG_ISA_FMA, "fma"},
    {KREG_ISA_AVX512F, "avx512f"},     {KREG_ISA_AVX512BW, "avx512bw"},
    {KREG_ISA_AVX512VL, "avx512vl"},   {KREG_ISA_AVX512DQ, "avx512dq"},
    {KREG_ISA_AVX512BF16, "avx512bf16"}, {KREG_ISA_AVX512VNNI, "avx512vnni"},
    {KREG_ISA_AVX512FP16, "avx512fp16"}, {KREG_ISA_AMX_TILE, "amx_tile"},
    {KREG_ISA_AMX_BF16, "amx_bf16"},   {KREG_ISA_AMX_INT8, "amx_int8"},
};

// AMX: CPUID says the unit exists, XCR0 that the OS saves tile state, and the
// kernel must grant this process the tile data (Linux >= 5.16).
uint32_t DetectAmx() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return 0;
  uint32_t bits = 0;
  if (edx & (1u << 24)) bits |= KREG_ISA_AMX_TILE;
  if (edx & (1u << 22)) bits |= KREG_ISA_AMX_BF16;
  if (edx & (1u << 25)) bits |= KREG_ISA_AMX_INT8;
  if (bits == 0) return 0;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return 0;  // XTILECFG, XTILEDATA
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtileData = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) != 0) return 0;
  return bits;
}

uint32_t DetectIsa() {
  uint32_t bits = 0;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) bits |= KREG_ISA_AVX2;
  if (__builtin_cpu_supports("fma")) bits |= KREG_ISA_FMA;
  if (__builtin_cpu_supports("avx512f")) bits |= KREG_ISA_AVX512F;
  if (__builtin_cpu_supports("avx512bw")) bits |= KREG_ISA_AVX512BW;
  if (__builtin_cpu_supports("avx512vl")) bits |= KREG_ISA_AVX512VL;
  if (__builtin_cpu_supports("avx512dq")) bits |= KREG_ISA_AVX512DQ;
  if (__builtin_cpu_supports("avx512bf16")) bits |= KREG_ISA_AVX512BF16;
  if (__builtin_cpu_supports("avx512vnni")) bits |= KREG_ISA_AVX512VNNI;
#if !defined(__clang__) || __clang_major__ >= 16  // older clang does not know the name
  if (__builtin_cpu_supports("avx512fp16")) bits |= KREG_ISA_AVX512FP16;
#endif
  // Lets tests and users pretend the CPU lacks extensions, e.g.
  // KREG_ISA_MASK=avx2,fma to see what a machine without AVX-512 would run.
  uint32_t allowed = KREG_ISA_KNOWN_MASK;
  if (const char* mask = std::getenv("KREG_ISA_MASK")) {
    allowed = 0;
    for (absl::string_view name : absl::StrSplit(mask, ',', absl::SkipEmpty())) {
      for (const IsaName& isa : kIsaNames) {
        if (name == isa.name) allowed |= isa.bit;
      }
    }
  }
  // AMX permission is asked for only when AMX is not masked away.
  if (allowed & (KREG_ISA_AMX_TILE | KREG_ISA_AMX_BF16 | KREG_ISA_AMX_INT8)) bits |= DetectAmx();
  return bits & allowed;
}

// ---- This CPU -------------------------------------------------------------------

// 64-bit FNV-1a: stable across processes, builds and compilers, unlike
// absl::Hash, which is salted per process.
uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// The fields of /proc/cpuinfo's first processor kreg fingerprints.
struct CpuInfo {
  std::string model_name = "unknown";
  std::string vendor;
  uint32_t family = 0, model = 0;
};

CpuInfo ReadCpuInfo() {
  CpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  bool seen_model = false, seen_vendor = false, seen_family = false, seen_number = false;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const absl::string_view name = absl::StripAsciiWhitespace(absl::string_view(line).substr(0, colon));
    const std::string value(absl::StripAsciiWhitespace(absl::string_view(line).substr(colon + 1)));
    uint32_t number = 0;
    if (name == "model name" && !seen_model && !value.empty()) {
      info.model_name = value;
      seen_model = true;
    } else if ((name == "vendor_id" || name == "CPU implementer") && !seen_vendor) {
      info.vendor = value;
      seen_vendor = true;
    } else if (name == "cpu family" && !seen_family && absl::SimpleAtoi(value, &number)) {
      info.family = number;
      seen_family = true;
    } else if ((name == "model" || name == "CPU part") && !seen_number &&
               (absl::SimpleAtoi(value, &number) || absl::SimpleHexAtoi(value, &number))) {
      info.model = number;
      seen_number = true;
    }
  }
  return info;
}

// ---- Names ------------------------------------------------------------------------

// The widest vector ISA a machine record names: "amx", "avx512", "avx2" or
// "sse".
std::string WidestIsa(const MachineInfo& machine) {
  auto has = [&](absl::string_view name) {
    return std::find(machine.isa.begin(), machine.isa.end(), name) != machine.isa.end();
  };
  if (has("amx_tile")) return "amx";
  if (has("avx512f")) return "avx512";
  if (has("avx2")) return "avx2";
  return "sse";
}

}  // namespace

uint32_t CpuIsa() {
  static const uint32_t bits = DetectIsa();
  return bits;
}

std::string IsaString(uint32_t bits) {
  std::vector<std::string> names;
  for (const IsaName& isa : kIsaNames) {
    if (bits & isa.bit) names.push_back(isa.name);
  }
  if (bits & ~static_cast<uint32_t>(KREG_ISA_KNOWN_MASK)) {
    names.push_back(absl::StrCat("unknown(0x", absl::Hex(bits & ~KREG_ISA_KNOWN_MASK), ")"));
  }
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

const MachineInfo& HostMachine() {
  static const MachineInfo* const machine = [] {
    auto* m = new MachineInfo;
    const CpuInfo cpu = ReadCpuInfo();
    m->cpu_model = cpu.model_name;
    uint32_t isa = CpuIsa();
    if (isa != 0) {
      for (absl::string_view name : absl::StrSplit(IsaString(isa), ',')) m->isa.emplace_back(name);
    }
    m->cores = std::max(1u, std::thread::hardware_concurrency());
    struct utsname uts;
    m->vendor = cpu.vendor.empty() ? "unknown" : cpu.vendor;
    m->arch = uname(&uts) == 0 ? uts.machine : "unknown";
    m->family = cpu.family;
    m->model = cpu.model;
    m->id = FingerprintId(*m);
    return m;
  }();
  return *machine;
}

int ThreadsAvailable(int num_threads) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  const int cores = static_cast<int>(HostMachine().cores);
  if (cpus <= 0 || cpus > cores) cpus = cores;
  const int threads = num_threads > 0 ? std::min(num_threads, cpus) : cpus;
  return threads >= cores ? 0 : threads;
}

std::string FingerprintId(const MachineInfo& machine) {
  if (machine.gpu.has_value()) {
    const GpuIdentity& g = *machine.gpu;
    return absl::StrFormat("%s%016x", kGpuIdPrefix,
                           Fnv1a(absl::StrCat("cuda\n", g.name, "\n", g.sm, "\n", g.memory_bytes, "\n", g.driver)));
  }
  std::string text = absl::StrCat(machine.cpu_model, "\n", absl::StrJoin(machine.isa, ","), "\n", machine.cores);
  if (!machine.vendor.empty()) {
    absl::StrAppend(&text, "\n", machine.vendor, "\n", machine.arch, "\n", machine.family, "\n", machine.model);
  }
  return absl::StrFormat("%016x", Fnv1a(text));
}

bool IsGpuMachineId(absl::string_view id) { return absl::StartsWith(id, kGpuIdPrefix); }

std::string MachineVendor(const MachineInfo& machine) {
  if (!machine.vendor.empty()) return machine.vendor;
  // Records from before kreg kept the vendor: the model name says it.
  if (absl::StrContains(machine.cpu_model, "AMD")) return "AuthenticAMD";
  if (absl::StrContains(machine.cpu_model, "Intel")) return "GenuineIntel";
  return "";
}

std::string MachineArch(const MachineInfo& machine) {
  if (!machine.arch.empty()) return machine.arch;
  const std::string vendor = MachineVendor(machine);
  return vendor == "AuthenticAMD" || vendor == "GenuineIntel" ? "x86_64" : "";
}

std::string MicroArch(const MachineInfo& machine) {
  const uint32_t f = machine.family, m = machine.model;
  if (machine.vendor == "AuthenticAMD") {
    if (f == 0x17) return m < 0x30 ? "zen" : "zen2";
    if (f == 0x19) return (m >= 0x10 && m <= 0x1f) || (m >= 0x60 && m <= 0xaf) ? "zen4" : "zen3";
    if (f == 0x1a) return "zen5";
  } else if (machine.vendor == "GenuineIntel" && f == 6) {
    switch (m) {
      case 0x3f: return "haswell";
      case 0x4f: case 0x56: return "broadwell";
      case 0x55: return "skylake-x";
      case 0x6a: case 0x6c: return "icelake-x";
      case 0x7d: case 0x7e: return "icelake";
      case 0x8c: case 0x8d: return "tigerlake";
      case 0x8f: return "sapphirerapids";
      case 0x97: case 0x9a: return "alderlake";
      case 0xad: case 0xae: return "graniterapids";
      case 0xaf: return "sierraforest";
      case 0xb7: case 0xba: case 0xbf: return "raptorlake";
      case 0xcf: return "emeraldrapids";
      default: break;
    }
  }
  if (machine.vendor.empty() || machine.vendor == "unknown") return "";
  return absl::StrCat("family ", machine.family, " model ", machine.model);
}

std::string MachineSummary(const MachineInfo& machine) {
  if (machine.gpu.has_value()) {
    const GpuIdentity& g = *machine.gpu;
    return absl::StrFormat("%s, sm_%d, %.0f GiB, driver CUDA %s", g.name, g.sm,
                           static_cast<double>(g.memory_bytes) / (1ull << 30), g.driver);
  }
  std::vector<std::string> parts = {machine.cpu_model};
  if (std::string uarch = MicroArch(machine); !uarch.empty()) parts.push_back(std::move(uarch));
  parts.push_back(machine.isa.empty() ? "no vector ISA" : WidestIsa(machine));
  parts.push_back(absl::StrCat(machine.cores, machine.cores == 1 ? " core" : " cores"));
  return absl::StrJoin(parts, ", ");
}

std::string MachineClass(const MachineInfo& machine) {
  // The model without its marks, clock and generic words ("Intel(R)
  // Xeon(R) Processor", "... CPU @ 2.60GHz"), then the generation, the
  // widest ISA and the cores, as one lower-case slug.
  // A GPU: its name and SM version ("nvidia-h100-80gb-hbm3-sm90").
  std::string model = absl::AsciiStrToLower(machine.gpu.has_value() ? machine.gpu->name : machine.cpu_model);
  model = model.substr(0, model.find('@'));
  absl::StrReplaceAll({{"(r)", " "}, {"(tm)", " "}}, &model);
  std::vector<std::string> words;
  for (absl::string_view word : absl::StrSplit(model, absl::ByAnyChar(" -_,()/"), absl::SkipEmpty())) {
    if (word != "processor" && word != "cpu") words.emplace_back(word);
  }
  std::string text = machine.gpu.has_value()
                         ? absl::StrCat(absl::StrJoin(words, "-"), "-sm", machine.gpu->sm)
                         : absl::AsciiStrToLower(absl::StrCat(absl::StrJoin(words, "-"), "-", MicroArch(machine), "-",
                                                              WidestIsa(machine), "-", machine.cores, "c"));
  std::string out;
  for (char c : text) {
    if (absl::ascii_isalnum(c)) {
      out.push_back(c);
    } else if (!out.empty() && out.back() != '-') {
      out.push_back('-');
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

absl::StatusOr<DeviceKind> ParseDevice(absl::string_view name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return absl::InvalidArgumentError(absl::StrCat("device '", name, "': expected cpu or cuda"));
}

absl::string_view DeviceName(DeviceKind device) { return device == DeviceKind::kCuda ? "cuda" : "cpu"; }

}  // namespace kreg
