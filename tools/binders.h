// The flags' validators and the binders of flags more than one command
// takes: each binder adds its flags (their help text, option text, default
// shown and check) to a command and binds them to a field of `Flags`, which
// must outlive the parse. A check's failure is CLI11's ValidationError with
// kreg/limits.h's message ("--threads: expected 0 (all cores) to 1024, got
// 5000"), which the command line prints as bad input.
#ifndef KREG_TOOLS_BINDERS_H_
#define KREG_TOOLS_BINDERS_H_

#include <cstdint>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "kreg/limits.h"
#include "tools/cli.h"

namespace kreg::cli {

// A validator from one of kreg/limits.h's checks: the flag's text as an
// integer, then checked.
CLI::Validator IntWithin(std::function<absl::Status(int64_t)> check);
// The same for a duration in seconds (finite, at most a week; `zero` says
// whether 0 is allowed).
CLI::Validator SecondsWithin(limits::Zero zero);
// A list flag given must list something: `--dtype ''` is a slip, not the
// default. (Empty items, "a,,b", are refused where the list is split.)
CLI::Validator NotBlank();

// --dims, repeatable; `what` is its help text. Returns the option (query
// makes it required).
CLI::Option* AddDims(CLI::App* c, Flags& f, const char* what);
void AddDtype(CLI::App* c, Flags& f);  // --dtype
void AddWith(CLI::App* c, Flags& f);   // --with
void AddInput(CLI::App* c, Flags& f);  // --input, repeatable
void AddDist(CLI::App* c, Flags& f);   // --dist
// --dist, --partition and --seed: how random inputs are made.
void AddGenerate(CLI::App* c, Flags& f);
// --threads with help text `help`.
void AddThreads(CLI::App* c, Flags& f, const std::string& help);
// --warmup, --reps and --threads: how a kernel is timed.
void AddMeasure(CLI::App* c, Flags& f);
// --ranks, --backend, --mesh and --comm-timeout: collective ops' ranks.
void AddComm(CLI::App* c, Flags& f);
// Writers of a table: --lock-timeout, how long to wait for another
// process's lock on it.
void AddLockTimeout(CLI::App* c, Flags& f);
// --data-class with help text `what`.
void AddDataClass(CLI::App* c, Flags& f, const char* what);
// --device (cpu or cuda) with help text `help`, and --warm.
void AddDevice(CLI::App* c, Flags& f, const std::string& help);
// --machine and --no-shipped: which tables answer, and whose measurements.
void AddTables(CLI::App* c, Flags& f);

}  // namespace kreg::cli

#endif  // KREG_TOOLS_BINDERS_H_
