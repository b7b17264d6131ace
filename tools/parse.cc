// The command line's parsing aids: the help layout, did-you-mean for
// arguments nothing took, and the one error line.
#include "tools/parse.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "kreg/text.h"

namespace kreg::cli {

std::string HelpFormatter::make_help(const CLI::App* app, std::string name, CLI::AppFormatMode) const {
  const Page* page = nullptr;
  if (auto it = pages_.find(app); it != pages_.end()) page = &it->second;
  std::string out = "Usage: ";
  if (page != nullptr && !page->usage.empty()) {
    out += absl::StrReplaceAll(page->usage, {{"\n", "\n       "}});
  } else {
    out += name + " [flags]";
  }
  out += "\n\n";
  out += Wrap(page != nullptr && !page->about.empty() ? page->about : app->get_description(), 0) + "\n";

  std::vector<std::pair<std::string, std::string>> rows;
  for (const CLI::Option* opt : app->get_options([](const CLI::Option* o) { return o->get_positional(); })) {
    rows.emplace_back(opt->get_name(true), opt->get_description());
  }
  if (!rows.empty()) out += "\nArguments:\n" + Table(rows);

  rows.clear();
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
    rows.emplace_back(sub->get_name(), sub->get_description());
  }
  if (!rows.empty()) out += "\nCommands:\n" + Table(rows);

  rows.clear();
  for (const CLI::Option* opt : app->get_options([](const CLI::Option* o) { return !o->get_positional(); })) {
    std::string left;
    for (const std::string& s : opt->get_snames()) absl::StrAppend(&left, "-", s, ", ");
    if (!opt->get_lnames().empty()) absl::StrAppend(&left, "--", opt->get_lnames()[0]);  // one spelling
    if (!opt->get_option_text().empty()) absl::StrAppend(&left, " ", opt->get_option_text());
    std::string desc = opt->get_description();
    if (opt->get_type_size() != 0 && !opt->get_default_str().empty()) {
      // Kept on one line (Wrap turns kGlue back into spaces).
      absl::StrAppend(&desc, " ", absl::StrReplaceAll(absl::StrCat("(default: ", opt->get_default_str(), ")"),
                                                      {{" ", std::string(1, kGlue)}}));
    }
    rows.emplace_back(left, desc);
  }
  if (!rows.empty()) out += absl::StrCat("\n", app->get_parent() == nullptr ? "Global flags" : "Flags", ":\n", Table(rows));
  if (app->get_parent() != nullptr) {
    out += "\nGlobal flags: --plugin-path PATHS, --json, -v (see kreg --help).\n";
  }
  if (page != nullptr && !page->examples.empty()) {
    out += "\nExamples:\n";
    for (absl::string_view line : absl::StrSplit(page->examples, '\n', absl::SkipEmpty())) {
      absl::StrAppend(&out, "  ", line, "\n");
    }
  }
  if (!app->get_footer().empty()) out += "\n" + Wrap(app->get_footer(), 0) + "\n";
  return out;
}

std::string HelpFormatter::Wrap(absl::string_view text, size_t indent) {
  std::string out;
  size_t column = indent;
  bool first = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!first && column + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
      first = true;
    }
    if (!first) {
      out += ' ';
      ++column;
    }
    out += absl::StrReplaceAll(word, {{std::string(1, kGlue), " "}});
    column += word.size();
    first = false;
  }
  return out;
}

std::string HelpFormatter::Table(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t width = 0;
  for (const auto& [left, right] : rows) width = std::max(width, left.size());
  width = std::min<size_t>(width, 24);
  std::string out;
  for (const auto& [left, right] : rows) {
    absl::StrAppend(&out, "  ", left);
    if (left.size() > width) {
      absl::StrAppend(&out, "\n", std::string(width + 4, ' '));
    } else {
      out += std::string(width - left.size() + 2, ' ');
    }
    absl::StrAppend(&out, Wrap(right, width + 4), "\n");
  }
  return out;
}

namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The candidate closest to `typed`, if close enough to be a typo (or a
// prefix of it); "" otherwise.
std::string Closest(absl::string_view typed, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, typed.size() / 3) + 1;
  for (const std::string& c : candidates) {
    size_t d = EditDistance(typed, c);
    if (typed.size() >= 3 && absl::StartsWith(c, typed)) d = std::min<size_t>(d, 1);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

// "--max_list_len=3" -> "max-list-len".
std::string FlagName(absl::string_view arg) {
  arg = absl::StripPrefix(arg, "-");
  arg = absl::StripPrefix(arg, "-");
  std::string name(arg.substr(0, arg.find('=')));
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

bool HasFlag(const CLI::App* app, const std::string& name) {
  for (const CLI::Option* o : app->get_options()) {
    if (!o->get_positional() && o->check_lname(name)) return true;
  }
  return false;
}

// Commands (by full name) that take flag `name`.
void CommandsWithFlag(const CLI::App* app, const std::string& prefix, const std::string& name,
                      std::vector<std::string>* out) {
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
    const std::string full = absl::StrCat(prefix, prefix.empty() ? "" : " ", sub->get_name());
    if (HasFlag(sub, name)) out->push_back(full);
    CommandsWithFlag(sub, full, name, out);
  }
}

}  // namespace

CLI::App* Selected(CLI::App* root) {
  CLI::App* app = root;
  while (!app->get_subcommands().empty()) app = app->get_subcommands().front();
  return app;
}

std::string CommandName(const CLI::App* app) {
  std::vector<std::string> names;
  for (; app != nullptr && app->get_parent() != nullptr; app = app->get_parent()) names.push_back(app->get_name());
  std::reverse(names.begin(), names.end());
  return absl::StrJoin(names, " ");
}

std::string Prefix(const std::string& command) { return command.empty() ? "kreg" : "kreg " + command; }

std::string ExtrasMessage(CLI::App* root, const std::vector<std::string>& extras) {
  CLI::App* app = Selected(root);
  const std::string command = CommandName(app);
  const std::string& arg = extras.front();
  const bool is_flag = arg.size() > 1 && arg[0] == '-';
  if (!is_flag) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
    }
    if (!names.empty()) {  // kreg WORD, kreg db WORD
      const std::string close = Closest(arg, names);
      return absl::StrCat("unknown command '", arg, "'", close.empty() ? "" : absl::StrCat("; did you mean ", close, "?"),
                          " (commands: ", absl::StrJoin(names, ", "), ")");
    }
    return absl::StrCat("unexpected argument '", arg, "' (see ", Prefix(command), " --help)");
  }
  const std::string name = FlagName(arg);
  std::vector<std::string> others;
  CommandsWithFlag(root, "", name, &others);
  if (!others.empty()) {
    if (app == root) {
      return absl::StrCat("--", name, " is a flag of 'kreg ", others.front(), "'; give it after the command");
    }
    return absl::StrCat("--", name, " does not apply to '", Prefix(command), "' (it is a flag of ",
                        absl::StrJoin(others, ", "), ")");
  }
  std::vector<std::string> candidates;
  for (const CLI::App* a = app; a != nullptr; a = a->get_parent()) {
    for (const CLI::Option* o : a->get_options()) {
      if (!o->get_positional() && !o->get_lnames().empty()) candidates.push_back(o->get_lnames()[0]);
    }
  }
  const std::string close = Closest(name, candidates);
  return absl::StrCat("unknown flag '", arg.substr(0, arg.find('=')), "'",
                      close.empty() ? absl::StrCat(" (see ", Prefix(command), " --help)")
                                    : absl::StrCat("; did you mean --", close, "?"));
}

std::string HelpOf(const HelpFormatter& help, const CLI::App* app) {
  return help.make_help(app, Prefix(CommandName(app)), CLI::AppFormatMode::Normal);
}

int Fail(const std::string& command, absl::string_view message, int code) {
  std::cerr << Prefix(command) << ": " << OneLine(message) << "\n";
  return code;
}

}  // namespace kreg::cli
