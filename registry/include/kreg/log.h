// kreg's messages: one level for the process, one place they go.
//
// The level is read once from KREG_LOG (error, warn, info or debug; warn when
// unset) and may be changed with SetLogLevel (`kreg -v` sets info, `-vv`
// debug). A message at or below the level goes to the sink: stderr as
// "kreg: warning: message" unless SetLogSink replaced it. Plugins'
// kreg_host.log messages arrive here too (0 info, 1 warning), prefixed with
// the kernel's name, unless a run's RunOptions.log takes them.
//
// Thread-safe.
#ifndef KREG_REGISTRY_LOG_H_
#define KREG_REGISTRY_LOG_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kreg {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// "error", "warn", "info", "debug".
absl::string_view LogLevelName(LogLevel level);
// Those names (and "warning"); InvalidArgument naming them otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);

LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
inline bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= static_cast<int>(GetLogLevel()); }

// Replaces where messages go; an empty function restores stderr.
using LogSink = std::function<void(LogLevel level, absl::string_view message)>;
void SetLogSink(LogSink sink);

// Sends `message` to the sink if `level` is enabled.
void Log(LogLevel level, absl::string_view message);

}  // namespace kreg

#endif  // KREG_REGISTRY_LOG_H_
