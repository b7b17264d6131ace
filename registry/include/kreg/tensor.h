// Tensor: a small owning, 64-byte aligned, row-major host tensor that can
// hand out a DLPack view of itself, plus the element types kreg speaks.
//
// A Tensor owns its memory; the DLTensor returned by dl() points into it and
// is valid until the Tensor is moved, resized or destroyed. Not thread-safe
// for concurrent mutation; concurrent reads are fine.
#ifndef KREG_REGISTRY_TENSOR_H_
#define KREG_REGISTRY_TENSOR_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/plugin_sdk.h"

namespace kreg {

enum class DType { kF32, kBF16, kI32 };

size_t DTypeSize(DType dtype);
absl::string_view DTypeName(DType dtype);  // "f32", "bf16", "i32"
absl::StatusOr<DType> ParseDType(absl::string_view name);
DLDataType ToDLDataType(DType dtype);
// InvalidArgument for a DLPack type kreg does not speak.
absl::StatusOr<DType> FromDLDataType(DLDataType type);

// bfloat16 <-> float32, as plugins convert (kreg/plugin_sdk.h): rounds to
// nearest even; NaN stays NaN (sign kept).
using sdk::Bf16ToFloat;
using sdk::FloatToBf16;

// The bytes of a tensor of `shape`; InvalidArgument for a negative
// dimension, ResourceExhausted when the size overflows.
absl::StatusOr<size_t> CheckedBytes(DType dtype, const std::vector<int64_t>& shape);

class Tensor {
 public:
  Tensor() = default;
  // A zero-filled tensor: InvalidArgument for a negative dimension,
  // ResourceExhausted when the size overflows or memory runs out. What the
  // library itself uses; nothing of it throws.
  static absl::StatusOr<Tensor> Make(DType dtype, std::vector<int64_t> shape);
  // The same as a constructor, for sizes known to be sound: throws
  // std::bad_alloc where Make returns an error, as a standard container
  // does (and so does copying).
  Tensor(DType dtype, std::vector<int64_t> shape);

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }

  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <typename T> T* data_as() { return static_cast<T*>(data()); }
  template <typename T> const T* data_as() const { return static_cast<const T*>(data()); }

  // Element i as float (f32, bf16) or int (i32) widened to double.
  double GetAsDouble(int64_t i) const {
    switch (dtype_) {
      case DType::kF32:
        return data_as<float>()[i];
      case DType::kBF16:
        return Bf16ToFloat(data_as<uint16_t>()[i]);
      case DType::kI32:
        return data_as<int32_t>()[i];
    }
    return 0;
  }

  // The guard: from nbytes() to the end of the 64-byte rounding and
  // kGuardBytes beyond, a known pattern, so a kernel writing past its
  // tensor's end is caught (a write beyond the guard corrupts the heap:
  // the worker's isolation, or a sanitizer, catches that). The number of
  // guard bytes changed, 0 while intact.
  static constexpr size_t kGuardBytes = 256;
  size_t GuardDamage() const;

  // A DLPack view (compact strides), set up once at construction: it stays
  // valid across moves, and reading it from many threads is safe.
  DLTensor* dl() { return &dl_; }
  const DLTensor* dl() const { return &dl_; }

  std::string ShapeString() const;  // "[8, 1000]"

 private:
  struct Free {
    void operator()(void* p) const;
  };
  // Allocates and zero-fills the data for dtype_ and shape_, and points dl_
  // at it.
  absl::Status Allocate();
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::unique_ptr<unsigned char[], Free> data_;
  size_t allocated_ = 0;  // the tensor's bytes, rounded up, and the guard
  DLTensor dl_{};
};

}  // namespace kreg

#endif  // KREG_REGISTRY_TENSOR_H_
