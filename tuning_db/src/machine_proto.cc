// Machines as the tuning database keeps them: the registry's MachineInfo
// (kreg/machine.h) as a tuning::Machine message and back, and what that
// module says of a machine, said of a record.
#include <algorithm>
#include <string>
#include <utility>

#include "kreg/lut.h"
#include "kreg/machine.h"

namespace kreg {

tuning::Machine ToProtoMachine(const MachineInfo& machine) {
  tuning::Machine m;
  m.set_id(machine.id);
  m.set_cpu_model(machine.cpu_model);
  for (const std::string& isa : machine.isa) m.add_isa(isa);
  m.set_cores(machine.cores);
  m.set_vendor(machine.vendor);
  m.set_arch(machine.arch);
  m.set_family(machine.family);
  m.set_model(machine.model);
  if (machine.gpu.has_value()) {
    tuning::Gpu* g = m.mutable_gpu();
    g->set_name(machine.gpu->name);
    g->set_sm(machine.gpu->sm);
    g->set_num_sms(machine.gpu->num_sms);
    g->set_memory_bytes(machine.gpu->memory_bytes);
    g->set_driver(machine.gpu->driver);
  }
  return m;
}

MachineInfo FromProtoMachine(const tuning::Machine& machine) {
  MachineInfo m;
  m.id = machine.id();
  m.cpu_model = machine.cpu_model();
  m.isa.assign(machine.isa().begin(), machine.isa().end());
  m.cores = machine.cores();
  m.vendor = machine.vendor();
  m.arch = machine.arch();
  m.family = machine.family();
  m.model = machine.model();
  if (machine.has_gpu()) {
    const tuning::Gpu& g = machine.gpu();
    m.gpu = GpuIdentity{g.name(), g.sm(), g.num_sms(), g.memory_bytes(), g.driver()};
  }
  return m;
}

const tuning::Machine& ThisMachine() {
  static const tuning::Machine* const machine = new tuning::Machine(ToProtoMachine(HostMachine()));
  return *machine;
}

std::string FingerprintId(const tuning::Machine& machine) { return FingerprintId(FromProtoMachine(machine)); }

tuning::Machine GpuMachine(absl::string_view name, int sm, int num_sms, uint64_t memory_bytes,
                           absl::string_view driver) {
  return ToProtoMachine(GpuMachineInfo(GpuIdentity{std::string(name), static_cast<uint32_t>(std::max(sm, 0)),
                                                   static_cast<uint32_t>(std::max(num_sms, 0)), memory_bytes,
                                                   std::string(driver)}));
}

tuning::Machine GpuMachine(const kreg_device& device) { return ToProtoMachine(GpuMachineInfo(device)); }

tuning::Machine MachineOf(const GpuInfo& gpu) { return ToProtoMachine(GpuMachineInfo(gpu)); }

std::string MachineVendor(const tuning::Machine& machine) { return MachineVendor(FromProtoMachine(machine)); }
std::string MachineArch(const tuning::Machine& machine) { return MachineArch(FromProtoMachine(machine)); }
std::string MicroArch(const tuning::Machine& machine) { return MicroArch(FromProtoMachine(machine)); }
std::string MachineSummary(const tuning::Machine& machine) { return MachineSummary(FromProtoMachine(machine)); }
std::string MachineClass(const tuning::Machine& machine) { return MachineClass(FromProtoMachine(machine)); }

}  // namespace kreg
