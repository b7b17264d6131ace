// The command line's parsing aids around CLI11: one layout for every help
// page, the innermost command a parse selected and its name, the message for
// arguments nothing took (with a did-you-mean), and the one error line a
// failure prints. Not thread-safe (like CLI11's apps, set up and read on one
// thread).
#ifndef KREG_TOOLS_PARSE_H_
#define KREG_TOOLS_PARSE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/string_view.h"

namespace kreg::cli {

// Help pages in one layout: usage, what the command does, its arguments and
// flags (one spelling each, with defaults), examples. Pages are keyed by the
// app they describe, which must outlive the formatter's use.
class HelpFormatter : public CLI::FormatterBase {
 public:
  struct Page {
    std::string usage;     // lines after "Usage: "
    std::string about;     // a paragraph
    std::string examples;  // lines
  };
  void Set(const CLI::App* app, Page page) { pages_[app] = std::move(page); }

  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode) const override;

 private:
  static constexpr size_t kWidth = 80;
  static constexpr char kGlue = '\x01';  // a space Wrap does not break at

  // `text` wrapped to kWidth, lines after the first indented by `indent`.
  static std::string Wrap(absl::string_view text, size_t indent);
  static std::string Table(const std::vector<std::pair<std::string, std::string>>& rows);

  std::map<const CLI::App*, Page> pages_;
};

// The innermost command selected on the command line, or `root`.
CLI::App* Selected(CLI::App* root);

// A command's full name under the root ("db diff"); "" for the root.
std::string CommandName(const CLI::App* app);

// "kreg COMMAND", or "kreg" for "".
std::string Prefix(const std::string& command);

// The message for arguments nothing took (`extras`, not empty): an unknown
// command or flag with the closest known one, or a flag given to the wrong
// command with those that take it.
std::string ExtrasMessage(CLI::App* root, const std::vector<std::string>& extras);

// The help page of `app` (not of the command selected under it, as
// CLI::App::help gives).
std::string HelpOf(const HelpFormatter& help, const CLI::App* app);

// Prints "kreg COMMAND: MESSAGE" (one line) on stderr and returns `code`.
int Fail(const std::string& command, absl::string_view message, int code);

}  // namespace kreg::cli

#endif  // KREG_TOOLS_PARSE_H_
