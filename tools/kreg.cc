// kreg: the command line. A thin main: CLI11 parses the flags each command
// defines, one function runs the command, main prints its result or one
// error line ("kreg COMMAND: message") and returns the exit code: 0 done,
// 1 failed, 2 bad input. The commands come from one table (kCommands), each
// set up and run by its own file (tools/commands.h).
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/log.h"
#include "kreg/lut.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/parse.h"

namespace kreg::cli {
namespace {

// An action that has no exit code of its own: 0 when it succeeds.
template <absl::Status (*kAction)(const Flags&)>
absl::StatusOr<int> ExitZero(const Flags& flags) {
  if (absl::Status s = kAction(flags); !s.ok()) return s;
  return 0;
}

// A command: its name and one-line description (kreg --help lists them), a
// setup giving it its help page and flags, and its action.
struct Command {
  const char* name;
  const char* description;
  void (*setup)(CLI::App* command, HelpFormatter& help, Flags& flags);
  absl::StatusOr<int> (*action)(const Flags& flags);
};

// Every command, in the order kreg --help lists them (kreg help is Main's).
constexpr Command kCommands[] = {
    {"list", "plugins found, each op, each kernel: its ISA and parameter space", SetupList, ExitZero<List>},
    {"machine", "this machine's fingerprint: the key tables file its entries under", SetupMachine,
     ExitZero<MachineCmd>},
    {"run", "run one kernel (or a table's choice) on built inputs: time it, check it", SetupRun, ExitZero<Run>},
    {"tune", "search every variant's parameters for problems; results go into a table", SetupTune, ExitZero<Tune>},
    {"query", "what a table answers for problems: exact, nearest or default", SetupQuery, ExitZero<Query>},
    {"calibrate", "measure a communicator backend's alpha-beta-gamma costs into a table", SetupCalibrate,
     ExitZero<Calibrate>},
    {"db", "show, export, merge, compare and slim tuning tables", SetupDb, Db},
};

// kreg itself: how every command parses, the global flags, kreg's help page.
void SetupGlobal(CLI::App& app, HelpFormatter& help, Flags& f) {
  app.set_help_flag("-h,--help", "print this help, or a command's (kreg COMMAND --help)");
  app.set_version_flag("--version", "kreg " KREG_VERSION, "print the version (kreg " KREG_VERSION ") and exit");
  app.fallthrough();  // global flags after the command too
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // the last one given counts
  app.require_subcommand(0, 1);
  app.add_option("--plugin-path,--plugin_path", f.plugin_path,
                 "colon-separated plugin files or folders, searched before KREG_PLUGIN_PATH and the installed "
                 "plugin folder")
      ->option_text("PATHS");
  app.add_flag("--json", f.json, "print JSON records instead of text (list, run, tune, query, db export)");
  app.add_flag_function("-v,--verbose", [&f](std::int64_t count) { f.verbose = static_cast<int>(count); },
               "more messages on stderr: -v what kreg does (plugins loaded, tables read, plugins' own notes), "
               "-vv also each dispatch and location searched; KREG_LOG=error|warn|info|debug sets the level "
               "without a flag (warn by default)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  help.Set(&app, {"kreg [--plugin-path PATHS] [--json] [-v] COMMAND [ARGS] [FLAGS]\nkreg help COMMAND",
                  "kreg loads kernel plugins, runs and checks any kernel, tunes every variant's parameters into a "
                  "tuning table, and answers from the table which kernel to run for a problem on this machine.",
                  "kreg list\n"
                  "kreg run topk/sort --dims batch=8,n=1000,k=10 --check\n"
                  "kreg tune topk --dims batch=32,n=32000,k=50 --db topk.lut\n"
                  "kreg query topk --dims batch=48,n=40000,k=64 --db topk.lut"});
  app.footer("Exit status: 0 done; 1 failed (a runtime error, a failed check, tables that differ); 2 bad input. "
             "Errors are one line on stderr: \"kreg COMMAND: message\".");
}

// Parses argv into the flags. The exit code where kreg is done (help or
// version printed, or bad input said), nothing where a command is to run.
std::optional<int> Parse(CLI::App& app, const HelpFormatter& help, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << HelpOf(help, Selected(&app));
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << HelpOf(help, &app);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    // Arguments nothing took are the likeliest cause of anything else.
    const std::vector<std::string> extras = app.remaining(true);
    const std::string command = CommandName(Selected(&app));
    if (!extras.empty()) return Fail(command, ExtrasMessage(&app, extras), 2);
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && command == "db") {
      return Fail(command, "give one of: show FILE, export FILE, plot FILE --out DIR, merge OUT IN..., diff A B, slim IN OUT", 2);
    }
    std::string message = e.what();
    if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr && absl::StrContains(message, "missing")) {
      // "--dims: 1 required TEXT missing"
      message = absl::StrCat(message.substr(0, message.find(':')), " needs a value");
    }
    return Fail(command, absl::StrCat(message, " (see ", Prefix(command), " --help)"), 2);
  }
  return std::nullopt;
}

// kreg help [COMMAND [SUBCOMMAND]]: that command's page, or kreg's.
int ShowHelp(const CLI::App& app, const HelpFormatter& help, const std::vector<std::string>& topic) {
  const CLI::App* page = &app;
  for (const std::string& t : topic) {
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : page->get_subcommands([](const CLI::App*) { return true; })) {
      if (sub->get_name() == t) next = sub;
    }
    if (next == nullptr) {
      return Fail("help", absl::StrCat("no command '", absl::StrJoin(topic, " "), "' (see kreg --help)"), 2);
    }
    page = next;
  }
  std::cout << HelpOf(help, page);
  return 0;
}

// Runs the action of the command `selected` is (or is a subcommand of, as
// db show is of db) and returns the exit code, printing its error if any.
int Dispatch(const CLI::App& app, const CLI::App* selected, const Flags& f) {
  const CLI::App* top = selected;
  while (top->get_parent() != &app) top = top->get_parent();
  absl::StatusOr<int> code = absl::InternalError(absl::StrCat("no command '", f.command, "'"));
  try {
    for (const Command& c : kCommands) {
      if (top->get_name() == c.name) code = c.action(f);
    }
  } catch (const std::bad_alloc&) {
    code = absl::ResourceExhaustedError("out of memory (are the dims what you meant?)");
  }
  if (!code.ok()) {
    return Fail(f.command, code.status().message(), code.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  return *code;
}

}  // namespace

int Main(int argc, char** argv) {
  Flags f;
  auto help = std::make_shared<HelpFormatter>();
  CLI::App app("a kernel registry with an autotuner", "kreg");
  app.formatter(help);
  SetupGlobal(app, *help, f);
  for (const Command& c : kCommands) {
    CLI::App* command = app.add_subcommand(c.name, c.description);
    command->set_help_flag("-h,--help", "print this help");
    c.setup(command, *help, f);
  }
  std::vector<std::string> topic;
  CLI::App* help_cmd = app.add_subcommand("help", "help for a command (kreg help tune)");
  help_cmd->set_help_flag("-h,--help", "print this help");
  help->Set(help_cmd, {"kreg help [COMMAND [SUBCOMMAND]]", "Prints the help of a command, or kreg's.", "kreg help tune\nkreg help db diff"});
  help_cmd->add_option("COMMAND", topic, "the command");

  if (argc < 2) {
    std::cerr << HelpOf(*help, &app);
    return 2;
  }
  if (std::optional<int> done = Parse(app, *help, argc, argv)) return *done;

  CLI::App* selected = Selected(&app);
  f.command = CommandName(selected);
  SetLockWait(f.lock_timeout);
  if (f.verbose > 0) {
    const LogLevel asked = f.verbose > 1 ? LogLevel::kDebug : LogLevel::kInfo;
    if (!LogEnabled(asked)) {
      SetLogLevel(asked);
      // The tuner's worker processes say as much.
      setenv("KREG_LOG", std::string(LogLevelName(asked)).c_str(), 1);
    }
  }
  if (selected == help_cmd) return ShowHelp(app, *help, topic);
  if (selected == &app) {
    // Flags alone, no command.
    std::cerr << HelpOf(*help, &app);
    return 2;
  }
  if (f.json && f.csv) return Fail(f.command, "give --json or --csv, not both", 2);
  if (f.json && f.command.rfind("db", 0) == 0 && f.command != "db export") {
    return Fail(f.command, absl::StrCat("--json does not apply to 'kreg ", f.command, "'"), 2);
  }
  return Dispatch(app, selected, f);
}

}  // namespace kreg::cli
