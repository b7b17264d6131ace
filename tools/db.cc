// kreg db: show, export, plot, merge, compare and slim tuning tables.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "kreg/lut.h"
#include "kreg/registry.h"
#include "kreg/text.h"
#include "tools/binders.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace kreg::cli {
namespace {

// kreg db plot: the table read here (a bad one is this command's error),
// drawn by the Python package's kreg.plot from its JSON export.
absl::StatusOr<int> Plot(const Flags& flags) {
  absl::StatusOr<TuningDb> db = LoadTable(flags, flags.file_a);
  if (!db.ok()) return db.status();
  char json_path[] = "/tmp/kreg-plot-XXXXXX.json";
  const int fd = mkstemps(json_path, 5);
  if (fd < 0) return absl::InternalError(absl::StrCat("db plot: cannot make a temporary file: ", std::strerror(errno)));
  const std::string json = db->ToJson();
  const bool written = write(fd, json.data(), json.size()) == static_cast<ssize_t>(json.size());
  close(fd);
  if (!written) {
    unlink(json_path);
    return absl::InternalError("db plot: cannot write a temporary file");
  }
  // The interpreter kreg was built for, isolated (-I: no current folder,
  // PYTHONPATH or user site on its path, so nothing planted there runs as
  // the caller), given kreg's own package beside its library (the build
  // tree's python/, or where it is installed) before its site packages.
  const std::string package = absl::StrCat(InstallPrefix(), "/python:", InstallPrefix(), "/", KREG_PYTHON_SUBDIR);
  static constexpr char kBoot[] =
      "import runpy, sys\n"
      "sys.path[:0] = [p for p in sys.argv[1].split(':') if p]\n"
      "sys.argv = ['kreg.plot'] + sys.argv[2:]\n"
      "try:\n"
      "    import kreg\n"
      "except ImportError as e:\n"
      "    sys.exit('kreg db plot: cannot import kreg (' + str(e) + '): it needs kreg built with Python')\n"
      "runpy.run_module('kreg.plot', run_name='__main__', alter_sys=True)\n";
  std::vector<std::string> args = {KREG_PYTHON_EXECUTABLE, "-I", "-c", kBoot, package, json_path, "--out",
                                   flags.out_dir, "--name", flags.file_a, "--prog", "kreg db plot"};
  if (!flags.key_filter.empty()) args.insert(args.end(), {"--key", flags.key_filter});
  std::cout << std::flush;
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  const bool waited = pid > 0 && waitpid(pid, &status, 0) == pid;
  unlink(json_path);
  if (!waited) return absl::InternalError("db plot: cannot start Python");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return absl::FailedPreconditionError(absl::StrCat("db plot needs Python 3 (", KREG_PYTHON_EXECUTABLE,
                                                      ") with kreg's Python package and matplotlib"));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;  // kreg.plot said why, in one line
}

}  // namespace

void SetupDb(CLI::App* db, HelpFormatter& help, Flags& f) {
  db->require_subcommand(1, 1);
  help.Set(db, {"kreg db show FILE | export FILE | merge OUT IN... | diff A B | slim IN OUT",
                "Reads and combines tuning tables (binary, or protobuf text when the name ends in .txtpb).",
                "kreg db show topk.lut\nkreg db merge all.lut a.lut b.lut\nkreg db diff a.lut b.lut\n"
                "kreg db slim topk.lut topk.txtpb"});
  CLI::App* show = db->add_subcommand("show", "one line per problem: its winner and runner-up");
  show->set_help_flag("-h,--help", "print this help");
  help.Set(show, {"kreg db show FILE", "One line per tuned problem: its key, the winning kernel and parameters, "
                                       "its median time, the runner-up and the number of trials.",
                  "kreg db show topk.lut"});
  show->add_option("FILE", f.file_a, "the table")->required();
  CLI::App* exp = db->add_subcommand("export", "the whole table in protobuf text format, JSON or CSV");
  exp->set_help_flag("-h,--help", "print this help");
  help.Set(exp, {"kreg db export FILE [--json | --csv]",
                 "Prints the whole table, every trial included: in protobuf text format; with --json in protobuf's "
                 "JSON mapping (field names as in tuning_db/kreg_tuning.proto); with --csv one row per trial under "
                 "a header naming the columns (the problem's op, dtype, dims, data class and machine; the trial's "
                 "variant, version, params, threads, status, times, repetitions, when measured and error), for "
                 "pandas or a spreadsheet.",
                 "kreg db export topk.lut > topk.txtpb\nkreg db export topk.lut --csv > topk.csv\n"
                 "kreg db export topk.lut --json | jq '.entries | length'"});
  exp->add_option("FILE", f.file_a, "the table")->required();
  exp->add_flag("--csv", f.csv, "one CSV row per trial");
  CLI::App* plot = db->add_subcommand("plot", "PNG pictures of a table: each problem's candidates, the winners by shape");
  plot->set_help_flag("-h,--help", "print this help");
  help.Set(plot, {"kreg db plot FILE --out DIR [--key TEXT]",
                  "Draws the table with matplotlib (python3 -m kreg.plot; Debian python3-matplotlib) into DIR: per "
                  "problem, every candidate's median time by variant and parameters, the best starred and failures "
                  "listed, and a heat map over two tiling parameters of a variant (e.g. gmm/tiled's); per op and "
                  "dtype, the winning variant by shape. Prints the files written.",
                  "kreg db plot gmm.lut --out plots/\nkreg db plot topk.lut --out plots/ --key n=4096"});
  plot->add_option("FILE", f.file_a, "the table")->required();
  plot->add_option("--out", f.out_dir, "the folder for the PNGs (created)")->required()->option_text("DIR");
  plot->add_option("--key", f.key_filter, "only problems whose label holds TEXT (e.g. n=4096)")->option_text("TEXT");
  CLI::App* merge = db->add_subcommand("merge", "the union of tables, merged into OUT");
  merge->set_help_flag("-h,--help", "print this help");
  help.Set(merge, {"kreg db merge OUT IN...",
                   "Merges every IN table into OUT (created if missing, else merged into): per problem the union "
                   "of trials, the newer measurement of the same candidate winning.",
                   "kreg db merge all.lut machine_a.lut machine_b.lut"});
  merge->add_option("OUT", f.file_a, "the table to write")->required();
  merge->add_option("IN", f.files, "the tables to merge")->required()->expected(1, -1);
  AddLockTimeout(merge, f);
  CLI::App* diff = db->add_subcommand("diff", "where two tables' winners differ; exit 1 if they do");
  diff->set_help_flag("-h,--help", "print this help");
  help.Set(diff, {"kreg db diff A B",
                  "One line per problem whose winner (variant, version or parameters) differs, or that only one "
                  "table has. Exits 0 when the winners agree everywhere and 1 when they differ, as diff(1) does.",
                  "kreg db diff old.lut new.lut"});
  diff->add_option("A", f.file_a, "a table")->required();
  diff->add_option("B", f.file_b, "another table")->required();
  CLI::App* slim = db->add_subcommand("slim", "a copy keeping each variant's best trial per problem (per choice combination)");
  slim->set_help_flag("-h,--help", "print this help");
  help.Set(slim, {"kreg db slim IN OUT",
                  "Writes OUT with, per problem, only the fastest successful trial of each variant (the shipped "
                  "tables' form); failures and slower configurations are dropped.",
                  "kreg db slim all.lut data/tables/amd-epyc-avx2-2c.txtpb"});
  slim->add_option("IN", f.file_a, "the table to read")->required();
  slim->add_option("OUT", f.file_b, "the table to write")->required();
  AddLockTimeout(slim, f);
}

absl::StatusOr<int> Db(const Flags& flags) {
  const std::string& verb = flags.command;
  if (verb == "db show" || verb == "db export") {
    absl::StatusOr<TuningDb> db = LoadTable(flags, flags.file_a);
    if (!db.ok()) return db.status();
    std::cout << ValidUtf8(verb == "db show" ? db->Summary()
                           : flags.json   ? db->ToJson()
                           : flags.csv    ? db->ToCsv()
                                          : db->ToText());
    return 0;
  }
  if (verb == "db plot") return Plot(flags);
  if (verb == "db merge") {
    TuningDb merged;
    for (const std::string& in : flags.files) {
      absl::StatusOr<TuningDb> db = LoadTable(flags, in);
      if (!db.ok()) return db.status();
      merged.MergeFrom(*db, TuningDb::Ties::kCanonical);  // the same table whatever the order of IN...
    }
    if (absl::Status s = merged.SaveMerged(flags.file_a); !s.ok()) {
      if (s.code() == absl::StatusCode::kDataLoss) return absl::InvalidArgumentError(s.message());
      return s;
    }
    std::cout << ValidUtf8(absl::StrCat("merged ", flags.files.size(), " tables into ", flags.file_a, " (",
                                        merged.size(), " problems)\n"));
    return 0;
  }
  if (verb == "db diff") {
    absl::StatusOr<TuningDb> a = LoadTable(flags, flags.file_a);
    if (!a.ok()) return a.status();
    absl::StatusOr<TuningDb> b = LoadTable(flags, flags.file_b);
    if (!b.ok()) return b.status();
    const std::string diff = TuningDb::Diff(*a, *b);
    std::cout << (diff.empty() ? "the winners agree everywhere\n" : ValidUtf8(diff));
    return diff.empty() ? 0 : 1;
  }
  if (verb == "db slim") {
    absl::StatusOr<TuningDb> db = LoadTable(flags, flags.file_a);
    if (!db.ok()) return db.status();
    SaveOptions options;
    options.best_per_variant = true;
    if (absl::Status s = db->Save(flags.file_b, options); !s.ok()) return s;
    std::cout << ValidUtf8(absl::StrCat("wrote ", flags.file_b, ": ", db->size(),
                                        " problems, the fastest trial of each variant (per choice combination) kept\n"));
    return 0;
  }
  return absl::InvalidArgumentError("give one of: show FILE, export FILE, merge OUT IN..., diff A B, slim IN OUT");
}

}  // namespace kreg::cli
