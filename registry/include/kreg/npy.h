// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// Element types: '<f4' (float32), '<i4' (int32) and '<u2', which kreg reads
// and writes as bfloat16 bit patterns (NumPy has no bfloat16; view a
// ml_dtypes.bfloat16 array as np.uint16 before saving). Only C-order arrays.
// Errors name the file and the problem; nothing here aborts.
#ifndef KREG_REGISTRY_NPY_H_
#define KREG_REGISTRY_NPY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kreg/tensor.h"

namespace kreg {

absl::StatusOr<Tensor> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace kreg

#endif  // KREG_REGISTRY_NPY_H_
