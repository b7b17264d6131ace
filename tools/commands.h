// kreg's commands, one file each (list.cc: list and machine; run.cc; tune.cc:
// tune and query; calibrate.cc; db.cc), run from the table in kreg.cc.
//
// Each command has a setup and an action. The setup is given the subcommand
// (made by Main with its name, one-line description and -h) and gives it its
// help page and its flags, bound to fields of `flags`; CLI11 keeps pointers
// into `help` and `flags`, which must outlive the parse. The action runs the
// command on the parsed flags and returns its status (tools/cli.h:
// InvalidArgument is bad input, exit 2; any other error exits 1); only Main
// prints errors.
#ifndef KREG_TOOLS_COMMANDS_H_
#define KREG_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/cli.h"
#include "tools/parse.h"

namespace kreg::cli {

// kreg list: the plugins, ops and kernels (--check-plugins: which plugins
// load, crash or hang, each in a child process).
void SetupList(CLI::App* list, HelpFormatter& help, Flags& flags);
absl::Status List(const Flags& flags);

// kreg machine: this machine's fingerprint and GPUs.
void SetupMachine(CLI::App* machine, HelpFormatter& help, Flags& flags);
absl::Status MachineCmd(const Flags& flags);

// kreg run: one kernel, or a table's choice, run, timed and checked.
void SetupRun(CLI::App* run, HelpFormatter& help, Flags& flags);
absl::Status Run(const Flags& flags);

// kreg tune: a sweep of an op's kernels into a table.
void SetupTune(CLI::App* tune, HelpFormatter& help, Flags& flags);
absl::Status Tune(const Flags& flags);

// kreg query: what the tables answer for problems.
void SetupQuery(CLI::App* query, HelpFormatter& help, Flags& flags);
absl::Status Query(const Flags& flags);

// kreg calibrate: a communicator backend's costs into a table.
void SetupCalibrate(CLI::App* calibrate, HelpFormatter& help, Flags& flags);
absl::Status Calibrate(const Flags& flags);

// kreg db show, export, plot, merge, diff and slim. The action returns the
// exit code on success (db diff: 1 when the tables differ).
void SetupDb(CLI::App* db, HelpFormatter& help, Flags& flags);
absl::StatusOr<int> Db(const Flags& flags);

}  // namespace kreg::cli

#endif  // KREG_TOOLS_COMMANDS_H_
