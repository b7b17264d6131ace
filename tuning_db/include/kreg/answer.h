// Asking the tables, as the command line (kreg query, kreg run OP) and
// Python (TuningDb.query, Dispatcher) both do: which table answers (the
// user's with the shipped ones behind it), for which machine (this CPU or
// its GPU), and the answer as a typed record each front end prints its own
// way (text, JSON, a dict).
//
//   AnswerPolicy policy;                       // similar machines, shipped tables, the CPU
//   auto lut = AnsweringLut(registry, std::move(db), "t.lut", policy, &warnings);
//   auto record = AskTable(*lut, *op, *shape.args(), data_class, DeviceKind::kCpu, 0);
#ifndef KREG_TUNING_DB_ANSWER_H_
#define KREG_TUNING_DB_ANSWER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/kreg_tuning.pb.h"
#include "kreg/lut.h"
#include "kreg/machine.h"
#include "kreg/op.h"
#include "kreg/registry.h"

namespace kreg {

// "similar" or "strict"; InvalidArgument otherwise ("machine 'x': expected
// similar or strict").
absl::StatusOr<MachinePolicy> ParseMachinePolicy(absl::string_view name);

// Which measurements answer a query.
struct AnswerPolicy {
  MachinePolicy machines = MachinePolicy::kSimilar;
  // The shipped tables (ShippedTables) behind the given one: the given one
  // answers unless they match better (Lut::Layered).
  bool shipped = true;
  // kCuda: this machine's GPUs' records join the tables', so an untuned GPU
  // finds a tuned one of its SM version.
  DeviceKind device = DeviceKind::kCpu;
};

// The table that answers: `given` (read from the file `given_name`, "" if
// none; its configurations must lie in their kernels' spaces, CheckConfigs)
// with, per `policy`, the shipped tables behind it, resolved against
// `registry`. Shipped entries of ops the registry does not know are left
// out (their plugins are not loaded). Warnings (unknown variants, tables
// that could not be read) are appended to `warnings`.
absl::StatusOr<Lut> AnsweringLut(const Registry& registry, TuningDb given, absl::string_view given_name,
                                 const AnswerPolicy& policy, std::vector<std::string>* warnings);

// The machine a table is asked for: this CPU, or CUDA device 0
// (FailedPrecondition saying why where there is none).
absl::StatusOr<tuning::Machine> DeviceMachine(DeviceKind device);

// One answer: the key asked and what the table said.
struct QueryRecord {
  tuning::ProblemKey key;
  LutAnswer answer;  // its pointers are owned by the Lut asked
};

// Asks `lut` for `op` on `args` (shape-only will do): their key, the data
// class given (DataClassOf's), the machine `device` names and the threads
// available to `threads`. The answer's warnings are appended to `warnings`.
absl::StatusOr<QueryRecord> AskTable(const Lut& lut, const Op& op, const kreg_args& args, std::string data_class,
                                     DeviceKind device, int threads, std::vector<std::string>* warnings);

// How an answer matched, for people: "exact", "similar machine (AMD EPYC,
// zen2, avx2, 2 cores)", "default"; `detailed` adds where from ("exact from
// DIMS, 1.2 ms") or why ("default: WHY"); then the threads, ", incomplete"
// and the table ("in t.lut") where they apply.
std::string AnswerHow(const LutAnswer& answer, bool detailed);

}  // namespace kreg

#endif  // KREG_TUNING_DB_ANSWER_H_
