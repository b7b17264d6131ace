// Shape records: the call shapes a program met that its tables did not
// answer exactly, written down so they can be tuned offline (as PyTorch's
// TunableOp records, then tunes). With KREG_RECORD=FILE set, the Dispatcher
// (and `kreg run OP --db`) appends each such shape to FILE once; `kreg tune
// --from-record FILE --db T` tunes them into T.
//
// The file is text, one shape per line, five fields separated by spaces:
//
//   # kreg shape record 1: op dtype dims data_class device ('-': none); ...
//   topk f32 batch=4,n=1000,k=8 - cpu
//   gmm bf16 m=512,k=256,n=128,groups=8 skewed cpu
//
// op; the key's dtype signature (OpKey::dtype); its key dims (the op's dims,
// then integer attributes off their defaults, NAME=INTEGER,...); its data
// class; cpu or cuda. Blank lines and lines starting with '#' are comments.
//
// Ownership: a ShapeRecorder is shared (one per file per process) and keeps
// its file open. Thread-safety: every function is thread-safe; processes
// appending to one file at once write each shape once (flock).
#ifndef KREG_TUNING_DB_RECORD_H_
#define KREG_TUNING_DB_RECORD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/machine.h"
#include "kreg/op.h"

namespace kreg {

// The environment variable naming the file shapes are recorded in.
inline constexpr char kRecordEnv[] = "KREG_RECORD";

// One recorded shape: what a table's key holds of a call, less the machine.
struct RecordedShape {
  std::string op;
  std::string dtype;  // the dtype signature ("f32", "bf16,f32", "f32+row_ends")
  Dims dims;          // key dims, as Op::KeyOf gives them
  std::string data_class;
  DeviceKind device = DeviceKind::kCpu;
  int line = 0;  // where ReadShapeRecord found it (1-based); 0 otherwise
};

// The line for `shape`, without its newline. InvalidArgument when a field
// cannot be written in the format (empty op, a space or a character outside
// the field's set, a data class of "-").
absl::StatusOr<std::string> RecordLine(const RecordedShape& shape);

// One line (no newline) read back: exactly five fields, each within its
// set, dims NAME=INTEGER with distinct names, the line at most
// limits::kMaxRecordLineBytes. InvalidArgument naming the problem. Names
// and values are not checked against the op here (the caller has its
// registry: Op::ParseValues bounds dims as --dims does).
absl::StatusOr<RecordedShape> ParseRecordLine(absl::string_view line);

// Every shape in the record file `path`, in order, each with its line
// number. NotFound for a missing file; InvalidArgument
// "PATH:LINE: problem" for a bad line, more than limits::kMaxRecordShapes
// shapes, or a file that is not a regular file.
absl::StatusOr<std::vector<RecordedShape>> ReadShapeRecord(const std::string& path);

// Appends shapes to one record file, each once: the file's lines are read
// when it is first written and again, under flock, before each append, so
// other processes' shapes are not written twice; each line goes in one
// write() on an O_APPEND descriptor. A new file starts with the header
// line. Never fails a caller: a file that cannot be opened or written, a
// shape that cannot be written, or a record full at
// limits::kMaxRecordShapes is warned about once (kreg's log, kWarn) and
// recording goes on without it.
class ShapeRecorder {
 public:
  // The recorder of the file KREG_RECORD names (shared by every caller in
  // this process), or null when it is unset or empty.
  static std::shared_ptr<ShapeRecorder> FromEnvironment();
  // The recorder of `path`, one per path in this process.
  static std::shared_ptr<ShapeRecorder> ForPath(const std::string& path);

  ShapeRecorder(const ShapeRecorder&) = delete;
  ShapeRecorder& operator=(const ShapeRecorder&) = delete;
  ~ShapeRecorder();

  // Records `shape` unless the file holds it already.
  void Add(const RecordedShape& shape);
  const std::string& path() const { return path_; }

 private:
  struct State;  // record.cc
  explicit ShapeRecorder(std::string path);
  const std::string path_;
  std::unique_ptr<State> state_;
};

}  // namespace kreg

#endif  // KREG_TUNING_DB_RECORD_H_
