// A TuningDb printed: text format, JSON, CSV, a summary, and the
// difference of two tables' winners.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "kreg/lut.h"
#include "kreg/text.h"
#include "tuning_db_internal.h"

namespace kreg {

using tuning::Trial;
using tuning_db_internal::KeyId;
using tuning_db_internal::TrialIdOf;
using tuning_db_internal::WinnerText;

namespace {

std::string Duration(double ns) {
  if (ns < 1e3) return absl::StrFormat("%.0f ns", ns);
  if (ns < 1e6) return absl::StrFormat("%.3g us", ns / 1e3);
  if (ns < 1e9) return absl::StrFormat("%.3g ms", ns / 1e6);
  return absl::StrFormat("%.3g s", ns / 1e9);
}

}  // namespace

namespace tuning_db_internal {

std::string WinnerText(const Trial& t) {
  std::string params = ConfigText(t.config());
  return absl::StrCat(t.variant(), " v", t.variant_version(), params.empty() ? "" : " ", params,
                      t.threads() > 0 ? absl::StrCat(" threads=", t.threads()) : "");
}

}  // namespace tuning_db_internal

std::string TuningDb::Diff(const TuningDb& a, const TuningDb& b) {
  std::vector<std::string> lines;
  for (const tuning::Entry& ea : a.db_->entries()) {
    const tuning::Entry* found = b.FindEntry(ea.key());
    if (found == nullptr) {
      lines.push_back(absl::StrCat("only in a: ", KeyString(ea.key())));
      continue;
    }
    const tuning::Entry& eb = *found;
    std::string wa = ea.has_best() ? TrialIdOf(ea.best()) : "";
    std::string wb = eb.has_best() ? TrialIdOf(eb.best()) : "";
    if (wa != wb) {
      lines.push_back(absl::StrCat("differs: ", KeyString(ea.key()),
                                   ": a=", ea.has_best() ? WinnerText(ea.best()) : "none",
                                   " b=", eb.has_best() ? WinnerText(eb.best()) : "none"));
    } else if (ea.has_best() && ea.best().measured_at() == eb.best().measured_at() &&
               ea.best().SerializeAsString() != eb.best().SerializeAsString()) {
      // The same winner, two results claiming one moment: they cannot both be true.
      lines.push_back(absl::StrCat("differs: ", KeyString(ea.key()), ": ", WinnerText(ea.best()),
                                   " measured at the same time as ", absl::StrFormat("%.0f ns in a, %.0f ns in b",
                                   ea.best().median_ns(), eb.best().median_ns())));
    }
  }
  for (const tuning::Entry& eb : b.db_->entries()) {
    if (a.FindEntry(eb.key()) == nullptr) {
      lines.push_back(absl::StrCat("only in b: ", KeyString(eb.key())));
    }
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& line : lines) absl::StrAppend(&out, line, "\n");
  return out;
}

// ---- Reading -------------------------------------------------------------------------

std::string TuningDb::ToText() const {
  std::string text;
  google::protobuf::TextFormat::PrintToString(*db_, &text);
  return text;
}

std::string TuningDb::ToJson() const {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Cannot fail: the message is valid and has no Any fields to resolve.
  (void)google::protobuf::util::MessageToJsonString(*db_, &json, options);
  return json;
}

namespace {

// A CSV field (RFC 4180): quoted where it holds a comma, a quote or a line
// break, its quotes doubled.
std::string CsvField(absl::string_view v) {
  if (v.find_first_of(",\"\r\n") == absl::string_view::npos) return std::string(v);
  return absl::StrCat("\"", absl::StrReplaceAll(v, {{"\"", "\"\""}}), "\"");
}

}  // namespace

std::string TuningDb::ToCsv() const {
  std::string out =
      "op,dtype,dims,data_class,machine,variant,version,params,threads,status,median_ns,min_ns,max_ns,"
      "relative_iqr,reps,measured_at,error\n";
  for (const tuning::Entry& e : db_->entries()) {
    const tuning::ProblemKey& k = e.key();
    const std::string key = absl::StrJoin({CsvField(k.op()), CsvField(k.dtype()), CsvField(DimsString(KeyDims(k))),
                                           CsvField(k.data_class()), CsvField(k.machine_id())}, ",");
    for (const Trial& t : e.trials()) {
      absl::StrAppend(&out, key, ",", CsvField(t.variant()), ",", t.variant_version(), ",",
                      CsvField(ConfigText(t.config())), ",", t.threads(), ",", Trial::Status_Name(t.status()), ",",
                      absl::StrFormat("%.17g,%.17g,%.17g,%.17g", t.median_ns(), t.min_ns(), t.max_ns(),
                                      t.relative_iqr()),
                      ",", t.reps(), ",", t.measured_at(), ",", CsvField(t.error()), "\n");
    }
  }
  return out;
}

std::string TuningDb::Summary() const {
  std::vector<std::string> lines;
  for (const tuning::Entry& e : db_->entries()) {
    std::string line = absl::StrCat(KeyString(e.key()), " -> ");
    if (e.has_best()) {
      absl::StrAppend(&line, WinnerText(e.best()), "  ", Duration(e.best().median_ns()));
      if (e.has_runner_up()) {
        absl::StrAppend(&line, " (runner-up ", e.runner_up().variant(), " ",
                        Duration(e.runner_up().median_ns()), ", ");
      } else {
        absl::StrAppend(&line, " (");
      }
    } else {
      absl::StrAppend(&line, "no OK trial (");
    }
    absl::StrAppend(&line, e.trials_size(), e.trials_size() == 1 ? " trial)" : " trials)");
    lines.push_back(std::move(line));
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& line : lines) absl::StrAppend(&out, line, "\n");
  return out;
}

}  // namespace kreg
