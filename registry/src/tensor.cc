#include "kreg/tensor.h"

#include <cstdlib>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kreg {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (expected f32, bf16 or i32)"));
}

DLDataType ToDLDataType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {kDLFloat, 32, 1};
    case DType::kBF16:
      return {kDLBfloat, 16, 1};
    case DType::kI32:
      return {kDLInt, 32, 1};
  }
  return {};
}

absl::StatusOr<DType> FromDLDataType(DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
    if (t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
    if (t.code == kDLInt && t.bits == 32) return DType::kI32;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported DLPack dtype (code ", t.code, ", bits ", t.bits, ", lanes ",
      t.lanes, ")"));
}

namespace {
// The guard's pattern: not 0, not a float or int a kernel writes often.
constexpr unsigned char kGuardByte = 0xa5;
}  // namespace

void Tensor::Free::operator()(void* p) const { std::free(p); }

absl::StatusOr<size_t> CheckedBytes(DType dtype, const std::vector<int64_t>& shape) {
  size_t total = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError("negative dimension");
    if (d != 0 && total > std::numeric_limits<size_t>::max() / 2 / static_cast<size_t>(d)) {
      return absl::InvalidArgumentError("tensor size overflows");
    }
    total *= static_cast<size_t>(d);
  }
  return total;
}

absl::StatusOr<Tensor> Tensor::Make(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  if (absl::Status s = t.Allocate(); !s.ok()) return s;
  return t;
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  if (!Allocate().ok()) throw std::bad_alloc();
}

absl::Status Tensor::Allocate() {
  absl::StatusOr<size_t> bytes = CheckedBytes(dtype_, shape_);
  if (!bytes.ok()) return absl::Status(bytes.status().code(), absl::StrCat("tensor ", ShapeString(), ": ",
                                                                             bytes.status().message()));
  const size_t rounded = (*bytes + 63) / 64 * 64 + (*bytes == 0 ? 64 : 0);
  void* p = rounded > std::numeric_limits<size_t>::max() - kGuardBytes
                ? nullptr
                : std::aligned_alloc(64, rounded + kGuardBytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor ", ShapeString(), ": cannot allocate ", *bytes,
                                                     " bytes"));
  }
  std::memset(p, 0, *bytes);
  std::memset(static_cast<unsigned char*>(p) + *bytes, kGuardByte, rounded + kGuardBytes - *bytes);
  data_.reset(static_cast<unsigned char*>(p));
  allocated_ = rounded + kGuardBytes;
  dl_.data = data_.get();
  dl_.device = {kDLCPU, 0};
  dl_.ndim = static_cast<int>(shape_.size());
  dl_.dtype = ToDLDataType(dtype_);
  dl_.shape = shape_.data();
  dl_.strides = nullptr;
  dl_.byte_offset = 0;
  return absl::OkStatus();
}

Tensor::Tensor(const Tensor& other) : Tensor(other.dtype_, other.shape_) {
  if (other.data_) std::memcpy(data(), other.data(), nbytes());
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

size_t Tensor::GuardDamage() const {
  size_t damaged = 0;
  for (size_t i = nbytes(); i < allocated_; ++i) damaged += data_[i] != kGuardByte;
  return damaged;
}

std::string Tensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape_, ", "), "]");
}

}  // namespace kreg
