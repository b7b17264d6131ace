#include "kreg/record.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "file_util.h"
#include "kreg/limits.h"
#include "kreg/log.h"
#include "kreg/text.h"

namespace kreg {
namespace {

constexpr absl::string_view kNone = "-";
constexpr absl::string_view kHeader =
    "# kreg shape record 1: op dtype dims data_class device ('-': none), one shape per line, "
    "each a call the tables did not answer exactly; tune them with: kreg tune --from-record FILE --db TABLE\n";

// The characters each field may hold besides ASCII letters and digits.
constexpr absl::string_view kOpChars = "_.-";
constexpr absl::string_view kDtypeChars = "_,+";
constexpr absl::string_view kNameChars = "_";
constexpr absl::string_view kClassChars = "_=.,:+/-";

bool Within(absl::string_view text, absl::string_view extra) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && extra.find(c) == absl::string_view::npos) return false;
  }
  return true;
}

absl::Status Bad(absl::string_view field, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(field, " '", Printable(value), "': expected ", expected));
}

// NAME=INTEGER,... with distinct names ("-": none).
absl::StatusOr<Dims> ParseRecordDims(absl::string_view text) {
  Dims dims;
  if (text == kNone) return dims;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    absl::string_view digits = kv.second;
    absl::ConsumePrefix(&digits, "-");
    const bool number = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
      return absl::ascii_isdigit(static_cast<unsigned char>(c));
    });
    int64_t value;
    if (!Within(kv.first, kNameChars) || !number || !absl::SimpleAtoi(item.substr(item.find('=') + 1), &value)) {
      return Bad("dims item", item, "NAME=INTEGER (a 64-bit integer)");
    }
    for (const auto& [seen, unused] : dims) {
      if (seen == kv.first) return Bad("dims", text, absl::StrCat("each name once ('", kv.first, "' twice)"));
    }
    dims.emplace_back(std::string(kv.first), value);
  }
  return dims;
}

bool IsShapeLine(absl::string_view line) { return !line.empty() && line[0] != '#'; }

// A record of kMaxRecordShapes full lines.
constexpr int64_t kMostRecordBytes = limits::kMaxRecordShapes * limits::kMaxRecordLineBytes;
absl::Status TooLarge() {
  return absl::InvalidArgumentError(absl::StrCat("not a shape record (over ", kMostRecordBytes, " bytes)"));
}

}  // namespace

absl::StatusOr<std::string> RecordLine(const RecordedShape& shape) {
  if (!Within(shape.op, kOpChars)) return Bad("op", shape.op, "letters, digits and _.-");
  if (!shape.dtype.empty() && !Within(shape.dtype, kDtypeChars)) {
    return Bad("dtype", shape.dtype, "letters, digits and _,+");
  }
  for (const auto& [name, value] : shape.dims) {
    if (!Within(name, kNameChars)) return Bad("dim name", name, "letters, digits and _");
  }
  if (!shape.data_class.empty() && (!Within(shape.data_class, kClassChars) || shape.data_class == kNone)) {
    return Bad("data class", shape.data_class, "letters, digits and _=.,:+/- (not '-' alone)");
  }
  std::string line = absl::StrCat(shape.op, " ", shape.dtype.empty() ? kNone : shape.dtype, " ",
                                  shape.dims.empty() ? std::string(kNone) : DimsString(shape.dims), " ",
                                  shape.data_class.empty() ? kNone : shape.data_class, " ", DeviceName(shape.device));
  if (line.size() > static_cast<size_t>(limits::kMaxRecordLineBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("a line of ", line.size(), " bytes: expected at most ",
                                                   limits::kMaxRecordLineBytes));
  }
  return line;
}

absl::StatusOr<RecordedShape> ParseRecordLine(absl::string_view line) {
  if (line.size() > static_cast<size_t>(limits::kMaxRecordLineBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("a line of ", line.size(), " bytes: expected at most ",
                                                   limits::kMaxRecordLineBytes));
  }
  std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
  if (fields.size() != 5 || std::any_of(fields.begin(), fields.end(), [](absl::string_view f) { return f.empty(); })) {
    return absl::InvalidArgumentError(absl::StrCat("'", Printable(line),
                                                   "': expected five fields separated by single spaces: op dtype "
                                                   "dims data_class device ('-' for none)"));
  }
  RecordedShape shape;
  if (!Within(fields[0], kOpChars) || fields[0] == kNone) return Bad("op", fields[0], "letters, digits and _.-");
  shape.op = std::string(fields[0]);
  if (fields[1] != kNone) {
    if (!Within(fields[1], kDtypeChars)) return Bad("dtype", fields[1], "letters, digits and _,+, or '-'");
    shape.dtype = std::string(fields[1]);
  }
  absl::StatusOr<Dims> dims = ParseRecordDims(fields[2]);
  if (!dims.ok()) return dims.status();
  shape.dims = *std::move(dims);
  if (fields[3] != kNone) {
    if (!Within(fields[3], kClassChars)) return Bad("data class", fields[3], "letters, digits and _=.,:+/-, or '-'");
    shape.data_class = std::string(fields[3]);
  }
  absl::StatusOr<DeviceKind> device = ParseDevice(fields[4]);
  if (!device.ok()) return Bad("device", fields[4], "cpu or cuda");
  shape.device = *device;
  return shape;
}

absl::StatusOr<std::vector<RecordedShape>> ReadShapeRecord(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > kMostRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", TooLarge().message()));
  }
  absl::StatusOr<std::string> text = internal::ReadFile(path);
  if (!text.ok()) return text.status();
  std::vector<RecordedShape> shapes;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++number;
    if (!IsShapeLine(line)) continue;
    absl::StatusOr<RecordedShape> shape = ParseRecordLine(line);
    absl::Status s = shape.status();
    if (s.ok()) s = limits::CheckRecordShapes(static_cast<int64_t>(shapes.size()) + 1, "the record");
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", s.message()));
    shape->line = number;
    shapes.push_back(*std::move(shape));
  }
  return shapes;
}

// ---- Appending ------------------------------------------------------------------

struct ShapeRecorder::State {
  std::mutex mu;
  int fd = -1;             // guarded by mu; open once the first shape comes
  bool stopped = false;    // guarded by mu; the file failed (warned): nothing more is written
  std::set<std::string> warned;  // guarded by mu; kinds of warning given
  off_t offset = 0;        // guarded by mu; bytes of whole lines read into `lines`
  bool cut = false;        // guarded by mu; the file ends inside a line
  absl::flat_hash_set<std::string> lines;  // guarded by mu; shapes in the file, normalized
};

ShapeRecorder::ShapeRecorder(std::string path) : path_(std::move(path)), state_(std::make_unique<State>()) {}

ShapeRecorder::~ShapeRecorder() {
  if (state_->fd >= 0) close(state_->fd);
}

std::shared_ptr<ShapeRecorder> ShapeRecorder::FromEnvironment() {
  const char* path = std::getenv(kRecordEnv);
  if (path == nullptr || *path == '\0') return nullptr;
  return ForPath(path);
}

std::shared_ptr<ShapeRecorder> ShapeRecorder::ForPath(const std::string& path) {
  static std::mutex mu;
  static auto* recorders = new std::map<std::string, std::shared_ptr<ShapeRecorder>>();
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<ShapeRecorder>& recorder = (*recorders)[path];
  if (recorder == nullptr) recorder.reset(new ShapeRecorder(path));
  return recorder;
}

namespace {

// Warns once per kind of trouble.
void WarnOnce(absl::string_view path, std::set<std::string>& warned, absl::string_view kind,
              absl::string_view message) {
  if (!warned.emplace(kind).second) return;
  Log(LogLevel::kWarn, OneLine(absl::StrCat(kRecordEnv, "=", path, ": ", message)));
}

// Reads the lines appended since `offset` into `lines` (a line the file
// ends inside is left for the next read).
absl::Status ReadNew(int fd, off_t* offset, bool* cut, absl::flat_hash_set<std::string>* lines) {
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, "cannot read it");
  if (st.st_size > kMostRecordBytes) return TooLarge();
  std::string text;
  char buf[1 << 16];
  while (true) {
    ssize_t n = pread(fd, buf, sizeof buf, *offset + static_cast<off_t>(text.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, "cannot read it");
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  const size_t whole = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  *cut = whole < text.size();
  if (text.size() - whole > static_cast<size_t>(limits::kMaxRecordLineBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a shape record (a line over ", limits::kMaxRecordLineBytes, " bytes)"));
  }
  for (absl::string_view line : absl::StrSplit(absl::string_view(text).substr(0, whole), '\n')) {
    if (!IsShapeLine(line)) continue;
    absl::StatusOr<RecordedShape> shape = ParseRecordLine(line);
    absl::StatusOr<std::string> normal = shape.ok() ? RecordLine(*shape) : std::string(line);
    lines->insert(normal.ok() ? *normal : std::string(line));
  }
  *offset += static_cast<off_t>(whole);
  return absl::OkStatus();
}

}  // namespace

void ShapeRecorder::Add(const RecordedShape& shape) {
  State& s = *state_;
  absl::StatusOr<std::string> line = RecordLine(shape);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.stopped) return;
  if (!line.ok()) {
    WarnOnce(path_, s.warned, "shape",
             absl::StrCat("a shape of ", shape.op, " is not recorded: ", line.status().message()));
    return;
  }
  if (s.lines.contains(*line)) return;
  auto give_up = [&](absl::string_view why) {
    s.stopped = true;
    WarnOnce(path_, s.warned, "file", absl::StrCat(why, "; calls go on without recording"));
  };
  if (s.fd < 0) {
    // O_NONBLOCK: a FIFO must not block the caller (it is refused below).
    s.fd = open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (s.fd < 0) return give_up(absl::StrCat("cannot open it: ", std::strerror(errno)));
    struct stat st;
    if (fstat(s.fd, &st) != 0 || !S_ISREG(st.st_mode)) return give_up("not a regular file");
  }
  // Other processes append too: under the lock, read what they wrote first.
  while (flock(s.fd, LOCK_EX) != 0) {
    if (errno != EINTR) return give_up(absl::StrCat("cannot lock it: ", std::strerror(errno)));
  }
  absl::Status read = ReadNew(s.fd, &s.offset, &s.cut, &s.lines);
  if (read.ok() && !s.lines.contains(*line)) {
    if (limits::CheckRecordShapes(static_cast<int64_t>(s.lines.size()) + 1).ok()) {
      const std::string out = absl::StrCat(s.offset == 0 && !s.cut ? kHeader : "", s.cut ? "\n" : "", *line, "\n");
      ssize_t n;
      do {
        n = write(s.fd, out.data(), out.size());
      } while (n < 0 && errno == EINTR);
      if (n != static_cast<ssize_t>(out.size())) {
        read = absl::InternalError(absl::StrCat("cannot write it: ", n < 0 ? std::strerror(errno) : "a short write"));
      } else {
        s.lines.insert(*line);
      }
    } else {
      WarnOnce(path_, s.warned, "full",
               absl::StrCat("holds ", limits::kMaxRecordShapes, " shapes; no more are recorded"));
    }
  }
  flock(s.fd, LOCK_UN);
  if (!read.ok()) give_up(read.message());
}

}  // namespace kreg
