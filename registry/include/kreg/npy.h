// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// Element types: '<f4' (float32), '<i4' (int32) and '<u2', which kreg reads
// and writes as bfloat16 bit patterns (NumPy has no bfloat16; view a
// ml_dtypes.bfloat16 array as np.uint16 before saving). Only C-order arrays.
//
// The header is parsed strictly as the Python dict literal numpy writes:
// exactly the keys 'descr' (a string), 'fortran_order' (True or False) and
// 'shape' (a tuple of non-negative ints), in any order, quoted with ' or ",
// with Python's freedom in spacing and trailing commas, and nothing after the
// dict but whitespace. Anything else is refused, never guessed at.
//
// Errors are InvalidArgument (NotFound etc. for a file that cannot be
// opened), one line naming the file and the problem; text quoted from the
// file is escaped with Printable (kreg/text.h) and cut at about 60 bytes.
// Nothing here aborts. The functions are thread-safe.
#ifndef KREG_REGISTRY_NPY_H_
#define KREG_REGISTRY_NPY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/tensor.h"

namespace kreg {

// The array in the whole .npy file `bytes` (format version 1.0, 2.0 or 3.0);
// `name` starts every error message. Bytes after the array's data are
// ignored, as numpy ignores them. Safe on any input (a fuzzer calls it).
absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes, absl::string_view name);

// The array in the .npy file at `path`, checked as ParseNpy checks it. A path
// that is not a regular file (a directory, a FIFO) is refused without
// blocking.
absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// Writes `tensor` as numpy does: version 1.0, descr '<f4', '<i4' or '<u2'
// (bfloat16 bits), data aligned to 64 bytes.
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace kreg

#endif  // KREG_REGISTRY_NPY_H_
