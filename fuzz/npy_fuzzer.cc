// Fuzzes the .npy reader (kreg/npy.h) with whole files.
//
// Properties, beyond "no crash, no sanitizer report":
//   - an array ParseNpy accepts has non-negative dims and its data within
//     the file;
//   - ReadNpy (which reads the same file in pieces from disk) agrees with
//     ParseNpy: both accept or both refuse with the same code, and accepted
//     arrays are identical;
//   - what WriteNpy writes of an accepted array parses back identical.
// Then each accepted array goes where `kreg run --input NAME=FILE` sends
// it: as every input of every op whose dtypes take it, its shape filling
// the op's dims (Op::DimsFromInputs, MakeShapeArgs), shape-only.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_registry.h"
#include "kreg/npy.h"
#include "kreg/op.h"
#include "kreg/problem.h"
#include "kreg/tensor.h"

namespace kreg::fuzz {
namespace {

// A scratch file per process, rewritten for each input.
class ScratchFile {
 public:
  explicit ScratchFile(const char* tag) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/kreg-fuzz-" + tag + "-XXXXXX";
    fd_ = mkstemp(path_.data());
    KREG_FUZZ_CHECK(fd_ >= 0);
  }
  ~ScratchFile() {
    close(fd_);
    unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  void Write(absl::string_view bytes) {
    KREG_FUZZ_CHECK(ftruncate(fd_, 0) == 0);
    KREG_FUZZ_CHECK(pwrite(fd_, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
  }
  std::string Read() const {
    std::string out;
    char buf[4096];
    for (off_t at = 0;;) {
      const ssize_t n = pread(fd_, buf, sizeof buf, at);
      KREG_FUZZ_CHECK(n >= 0);
      if (n == 0) return out;
      out.append(buf, static_cast<size_t>(n));
      at += n;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// The array as input `t` of `op`: its shape fills the dims it names, the
// op's other dims are 1.
void AsInput(const Op& op, int t, const Tensor& array) {
  const TensorInfo& info = op.tensors()[t];
  if (!info.is_input() || !(info.dtypes & DTypeBit(array.dtype()))) return;
  absl::StatusOr<Values> values = op.ParseValues(NamedValues{});
  if (!values.ok()) return;
  const std::vector<int>& shape = info.ShapeUnder(values->attrs.data());
  for (size_t d = 0; d < values->dims.size(); ++d) {
    if (std::find(shape.begin(), shape.end(), static_cast<int>(d)) == shape.end()) values->dims[d] = 1;
  }
  ProblemOptions options;
  options.inputs.emplace(info.name, array);
  ShapeArgs args;
  if (MakeShapeArgs(op, *values, options, &args).ok()) (void)op.KeyOf(*args.args());
}

}  // namespace
}  // namespace kreg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  using namespace kreg::fuzz;
  static ScratchFile* const file = new ScratchFile("npy");
  static ScratchFile* const written = new ScratchFile("npy-out");
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<Tensor> parsed = ParseNpy(bytes, file->path());
  file->Write(bytes);
  absl::StatusOr<Tensor> read = ReadNpy(file->path());
  KREG_FUZZ_CHECK(parsed.ok() == read.ok());
  if (!parsed.ok()) {
    KREG_FUZZ_CHECK(parsed.status().code() == read.status().code());
    return 0;
  }
  KREG_FUZZ_CHECK(SameTensor(*parsed, *read));
  for (int64_t d : parsed->shape()) KREG_FUZZ_CHECK(d >= 0);
  KREG_FUZZ_CHECK(parsed->nbytes() <= size);

  KREG_FUZZ_CHECK(WriteNpy(written->path(), *parsed).ok());
  absl::StatusOr<Tensor> back = ParseNpy(written->Read(), "written.npy");
  KREG_FUZZ_CHECK(back.ok() && SameTensor(*parsed, *back));

  for (const std::shared_ptr<const Op>& op : FuzzRegistry().Ops()) {
    for (size_t t = 0; t < op->tensors().size(); ++t) AsInput(*op, static_cast<int>(t), *parsed);
  }
  return 0;
}
