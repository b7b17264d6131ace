#include "kreg/log.h"

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kreg/text.h"

namespace kreg {
namespace {

// KREG_LOG, read once; an unknown value says so once and keeps warn.
int LevelFromEnv() {
  const char* env = std::getenv("KREG_LOG");
  if (env == nullptr || *env == '\0') return static_cast<int>(LogLevel::kWarn);
  absl::StatusOr<LogLevel> level = ParseLogLevel(env);
  if (!level.ok()) {
    std::cerr << "kreg: warning: KREG_LOG: " << level.status().message() << "; using warn\n";
    return static_cast<int>(LogLevel::kWarn);
  }
  return static_cast<int>(*level);
}

std::atomic<int>& Level() {
  static std::atomic<int> level{LevelFromEnv()};
  return level;
}

struct Sink {
  absl::Mutex mu;
  LogSink fn ABSL_GUARDED_BY(mu);
};

Sink& TheSink() {
  static Sink* const sink = new Sink;  // never destroyed: threads may log at exit
  return *sink;
}

}  // namespace

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "warning") return LogLevel::kWarn;
  for (LogLevel level : {LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo, LogLevel::kDebug}) {
    if (lower == LogLevelName(level)) return level;
  }
  return absl::InvalidArgumentError(absl::StrCat("log level '", name, "' is not one of error, warn, info, debug"));
}

LogLevel GetLogLevel() { return static_cast<LogLevel>(Level().load(std::memory_order_relaxed)); }

void SetLogLevel(LogLevel level) { Level().store(static_cast<int>(level), std::memory_order_relaxed); }

void SetLogSink(LogSink sink) {
  Sink& s = TheSink();
  absl::MutexLock lock(&s.mu);
  s.fn = std::move(sink);
}

void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  Sink& s = TheSink();
  absl::MutexLock lock(&s.mu);  // one message at a time, whole lines
  if (s.fn) {
    s.fn(level, message);
    return;
  }
  std::cerr << "kreg: " << (level == LogLevel::kError ? "error: " : level == LogLevel::kWarn ? "warning: " : "")
            << OneLine(message) << "\n";
}

}  // namespace kreg
