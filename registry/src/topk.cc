#include "kreg/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

#include <oneapi/tbb/parallel_for.h>

#include "absl/strings/str_cat.h"
#include "kreg/ops.h"

namespace kreg {
namespace {

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("topk: ", what)); }

std::string Shape(const DLTensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) absl::StrAppend(&s, i ? ", " : "", t.shape[i]);
  return s + "]";
}

// Checks that `t` is a CPU tensor of `dtype` and `shape` whose last
// dimension is contiguous and whose rows do not overlap.
absl::Status CheckTensor(const char* name, const DLTensor* t, DType dtype,
                         const std::vector<int64_t>& shape) {
  if (t == nullptr) return Bad(absl::StrCat(name, " is missing"));
  if (t->device.device_type != kDLCPU) return Bad(absl::StrCat(name, " is not a CPU tensor"));
  absl::StatusOr<DType> got = FromDLDataType(t->dtype);
  if (!got.ok() || *got != dtype) {
    return Bad(absl::StrCat(name, " must be ", DTypeName(dtype),
                            got.ok() ? absl::StrCat(", not ", DTypeName(*got)) : std::string()));
  }
  bool same = t->ndim == static_cast<int>(shape.size()) && t->shape != nullptr;
  for (int i = 0; same && i < t->ndim; ++i) same = t->shape[i] == shape[i];
  if (!same) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&want, i ? ", " : "", shape[i]);
    return Bad(absl::StrCat(name, " has shape ", t->shape ? Shape(*t) : "NULL", ", expected ", want, "]"));
  }
  if (t->strides != nullptr) {
    int last = t->ndim - 1;
    if (last >= 0 && shape[last] > 1 && t->strides[last] != 1) {
      return Bad(absl::StrCat(name, " must be contiguous in its last dimension"));
    }
    if (t->ndim == 2 && shape[0] > 1 && t->strides[0] < shape[1]) {
      return Bad(absl::StrCat(name, " has row stride ", t->strides[0], " < ", shape[1]));
    }
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (numel > 0 && t->data == nullptr) return Bad(absl::StrCat(name, " has no data"));
  return absl::OkStatus();
}

template <typename T>
T* Row(const DLTensor* t, int64_t r) {
  int64_t stride = t->strides ? t->strides[0] : (t->ndim == 2 ? t->shape[1] : 1);
  return reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset) + r * stride;
}

float Load(const DLTensor* t, int64_t r, int64_t c) {
  if (t->dtype.code == kDLBfloat) return Bf16ToFloat(Row<const uint16_t>(t, r)[c]);
  return Row<const float>(t, r)[c];
}

// kreg's total order: NaN (either sign) above everything, -0 == +0.
int Compare(float a, float b) {
  bool an = std::isnan(a), bn = std::isnan(b);
  if (an || bn) return static_cast<int>(an) - static_cast<int>(bn);
  return a < b ? -1 : (a > b ? 1 : 0);
}

void RangeOf(const kreg_topk_args& a, int64_t r, int64_t* start, int64_t* end) {
  *start = a.row_starts ? Row<const int32_t>(a.row_starts, 0)[r] : 0;
  *end = a.row_ends ? Row<const int32_t>(a.row_ends, 0)[r] : a.input->shape[1];
}

}  // namespace

absl::Status ValidateTopK(const kreg_topk_args& a) {
  if (a.struct_size < sizeof(kreg_topk_args)) {
    return Bad(absl::StrCat("args struct_size ", a.struct_size, " < ", sizeof(kreg_topk_args)));
  }
  if (a.input == nullptr) return Bad("input is missing");
  if (a.input->ndim != 2 || a.input->shape == nullptr) {
    return Bad(absl::StrCat("input must be 2-D [batch, n], got ", a.input->ndim, "-D"));
  }
  const int64_t batch = a.input->shape[0], n = a.input->shape[1];
  if (batch < 0 || n < 0) return Bad("input has a negative dimension");
  if (n > std::numeric_limits<int32_t>::max()) {
    return Bad(absl::StrCat("n=", n, " exceeds the int32 range of the indices"));
  }
  absl::StatusOr<DType> dtype = FromDLDataType(a.input->dtype);
  if (!dtype.ok() || *dtype == DType::kI32) return Bad("input must be f32 or bf16");
  if (absl::Status s = CheckTensor("input", a.input, *dtype, {batch, n}); !s.ok()) return s;
  if (a.k < 0) return Bad(absl::StrCat("k=", a.k, " is negative"));
  if (a.k > n) return Bad(absl::StrCat("k=", a.k, " exceeds the row length n=", n));
  if (absl::Status s = CheckTensor("values", a.values, *dtype, {batch, a.k}); !s.ok()) return s;
  if (absl::Status s = CheckTensor("indices", a.indices, DType::kI32, {batch, a.k}); !s.ok()) return s;
  if (a.stats != nullptr) {
    if (absl::Status s = CheckTensor("stats", a.stats, DType::kI32, {batch}); !s.ok()) return s;
  }
  for (const char* name : {"row_starts", "row_ends"}) {
    const DLTensor* t = name[4] == 's' ? a.row_starts : a.row_ends;
    if (t == nullptr) continue;
    if (absl::Status s = CheckTensor(name, t, DType::kI32, {batch}); !s.ok()) return s;
  }
  for (int64_t r = 0; r < batch && (a.row_starts || a.row_ends); ++r) {
    int64_t start, end;
    RangeOf(a, r, &start, &end);
    if (start < 0 || end > n || start > end) {
      return Bad(absl::StrCat("row ", r, " has range [", start, ", ", end,
                              ") outside [0, n=", n, ") or reversed"));
    }
  }
  return absl::OkStatus();
}

void ReferenceTopK(const kreg_topk_args& a) {
  const int64_t batch = a.input->shape[0];
  const bool bf16 = a.input->dtype.code == kDLBfloat;
  const float worst = a.largest ? -std::numeric_limits<float>::infinity()
                                : std::numeric_limits<float>::infinity();
  // Rows are independent: the reference runs them in parallel.
  tbb::parallel_for(int64_t{0}, batch, [&](int64_t r) {
    std::vector<int64_t> order;
    int64_t start, end;
    RangeOf(a, r, &start, &end);
    order.resize(end - start);
    std::iota(order.begin(), order.end(), start);
    std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
      int c = Compare(Load(a.input, r, i), Load(a.input, r, j));
      return a.largest ? c > 0 : c < 0;
    });
    int32_t* idx = Row<int32_t>(a.indices, r);
    for (int64_t j = 0; j < a.k; ++j) {
      bool real = j < static_cast<int64_t>(order.size());
      idx[j] = real ? static_cast<int32_t>(order[j]) : -1;
      if (bf16) {
        Row<uint16_t>(a.values, r)[j] =
            real ? Row<const uint16_t>(a.input, r)[order[j]] : FloatToBf16(worst);
      } else {
        Row<float>(a.values, r)[j] = real ? Row<const float>(a.input, r)[order[j]] : worst;
      }
    }
  });
}

absl::StatusOr<kreg_topk_args> PrepareTopK(const Tensor& input, int64_t k, const TopKOptions& options,
                                           TopKResult* result) {
  if (input.shape().size() != 2) {
    return Bad(absl::StrCat("input must be 2-D [batch, n], got shape ", input.ShapeString()));
  }
  if (k < 0) return Bad(absl::StrCat("k=", k, " is negative"));
  if (k > input.dim(1)) return Bad(absl::StrCat("k=", k, " exceeds the row length n=", input.dim(1)));
  *result = {Tensor(input.dtype(), {input.dim(0), k}), Tensor(DType::kI32, {input.dim(0), k})};
  kreg_topk_args args{};
  args.struct_size = sizeof args;
  args.input = input.dl();
  args.k = k;
  args.largest = options.largest;
  args.row_starts = options.row_starts ? options.row_starts->dl() : nullptr;
  args.row_ends = options.row_ends ? options.row_ends->dl() : nullptr;
  args.values = result->values.dl();
  args.indices = result->indices.dl();
  return args;
}

absl::StatusOr<TopKResult> TopK(const Kernel& kernel, const Config& config,
                                const Tensor& input, int64_t k, const TopKOptions& options) {
  if (kernel.op() != "topk") {
    return absl::InvalidArgumentError(absl::StrCat(kernel.name(), " is not a topk kernel"));
  }
  TopKResult result;
  absl::StatusOr<kreg_topk_args> args = PrepareTopK(input, k, options, &result);
  if (!args.ok()) return args.status();
  if (absl::Status s = kernel.Run(config, &*args, options.run); !s.ok()) return s;
  return result;
}

// ---- The op table entry and its Problem ------------------------------------

namespace {

class TopKProblem : public Problem {
 public:
  TopKProblem(int64_t batch, int64_t n, int64_t k, bool largest, bool ragged,
              const ProblemOptions& options)
      : k_(k), largest_(largest), ragged_(ragged), options_(options) {
    auto given = options_.inputs.find("input");
    user_input_ = given != options_.inputs.end();
    input_ = user_input_ ? given->second : Tensor(options.dtype, {batch, n});
    if (auto it = options_.inputs.find("row_starts"); it != options_.inputs.end()) starts_ = it->second;
    if (auto it = options_.inputs.find("row_ends"); it != options_.inputs.end()) ends_ = it->second;
    user_ranges_ = starts_.has_value() || ends_.has_value();
    if (ragged_ && !user_ranges_) {
      starts_ = Tensor(DType::kI32, {batch});
      ends_ = Tensor(DType::kI32, {batch});
    }
    values_ = Tensor(input_.dtype(), {input_.dim(0), k});
    indices_ = Tensor(DType::kI32, {input_.dim(0), k});
    stats_ = Tensor(DType::kI32, {input_.dim(0)});
    Regenerate(options.seed);
    args_.struct_size = sizeof args_;
    args_.input = input_.dl();
    args_.k = k_;
    args_.largest = largest_;
    args_.row_starts = starts_ ? starts_->dl() : nullptr;
    args_.row_ends = ends_ ? ends_->dl() : nullptr;
    args_.values = values_.dl();
    args_.indices = indices_.dl();
    args_.stats = stats_.dl();
  }

  const void* args() const override { return &args_; }

  Dims dims() const override {
    Dims dims = {{"batch", input_.dim(0)}, {"n", input_.dim(1)}, {"k", k_}};
    if (!largest_) dims.emplace_back("largest", 0);
    if (ragged_) dims.emplace_back("ragged", 1);
    return dims;
  }

  // Draws the random inputs (not those given by the user).
  void Regenerate(uint64_t seed) {
    want_values_.reset();
    want_indices_.reset();
    if (!user_input_ && options_.fill) FillRandom(input_, options_.dist, seed);
    if (ragged_ && !user_ranges_) {
      // Every kind of range: empty, shorter than k, exactly k, full.
      std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
      const int64_t n = input_.dim(1);
      for (int64_t r = 0; r < input_.dim(0); ++r) {
        int64_t len = r % 4 == 0 ? std::min<int64_t>(r / 4, n)
                                 : static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
        int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(n - len + 1));
        starts_->data_as<int32_t>()[r] = static_cast<int32_t>(start);
        ends_->data_as<int32_t>()[r] = static_cast<int32_t>(start + len);
      }
    }
  }

  void PoisonOutputs() override {
    std::memset(values_.data(), 0x5a, values_.nbytes());
    std::memset(indices_.data(), 0x5a, indices_.nbytes());
    std::memset(stats_.data(), 0, stats_.nbytes());
  }

  absl::Status CheckOutputs() const override {
    if (!want_values_) {
      want_values_.emplace(values_.dtype(), values_.shape());
      want_indices_.emplace(DType::kI32, indices_.shape());
      kreg_topk_args ref = args_;
      ref.values = want_values_->dl();
      ref.indices = want_indices_->dl();
      ReferenceTopK(ref);
    }
    const Tensor& want_values = *want_values_;
    const Tensor& want_indices = *want_indices_;
    const size_t esize = DTypeSize(values_.dtype());
    for (int64_t i = 0; i < indices_.numel(); ++i) {
      const char* got_v = static_cast<const char*>(values_.data()) + i * esize;
      const char* want_v = static_cast<const char*>(want_values.data()) + i * esize;
      int32_t got_i = indices_.data_as<int32_t>()[i], want_i = want_indices.data_as<int32_t>()[i];
      if (got_i != want_i || std::memcmp(got_v, want_v, esize) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "row ", i / k_, ", position ", i % k_, ": got index ", got_i, " value ",
            values_.GetAsDouble(i), ", expected index ", want_i, " value ",
            want_values.GetAsDouble(i)));
      }
    }
    return absl::OkStatus();
  }

  std::vector<std::pair<std::string, const Tensor*>> inputs() const override {
    std::vector<std::pair<std::string, const Tensor*>> out = {{"input", &input_}};
    if (starts_) out.emplace_back("row_starts", &*starts_);
    if (ends_) out.emplace_back("row_ends", &*ends_);
    return out;
  }
  std::vector<std::pair<std::string, const Tensor*>> outputs() const override {
    return {{"values", &values_}, {"indices", &indices_}, {"stats", &stats_}};
  }

 private:
  int64_t k_;
  bool largest_, ragged_, user_input_ = false, user_ranges_ = false;
  ProblemOptions options_;
  Tensor input_, values_, indices_, stats_;
  std::optional<Tensor> starts_, ends_;
  mutable std::optional<Tensor> want_values_, want_indices_;  // the reference, once per input
  kreg_topk_args args_{};
};

absl::Status ValidateTopKArgs(const void* args) {
  if (args == nullptr) return Bad("args is NULL");
  return ValidateTopK(*static_cast<const kreg_topk_args*>(args));
}

absl::StatusOr<std::unique_ptr<Problem>> MakeTopKProblem(const Dims& dims,
                                                         const ProblemOptions& options) {
  int64_t batch = -1, n = -1, k = -1, largest = 1, ragged = 0;
  for (const auto& [name, v] : dims) {
    int64_t* slot = name == "batch" ? &batch : name == "n" ? &n : name == "k" ? &k
                  : name == "largest" ? &largest : name == "ragged" ? &ragged : nullptr;
    if (slot == nullptr) {
      return Bad(absl::StrCat("unknown dimension '", name,
                              "' (dims: batch, n, k; attributes: largest=1, ragged=0)"));
    }
    *slot = v;
  }
  if (auto it = options.inputs.find("input"); it != options.inputs.end()) {
    const Tensor& in = it->second;
    if (in.shape().size() != 2) return Bad(absl::StrCat("input file has shape ", in.ShapeString(), ", expected [batch, n]"));
    if (in.dtype() == DType::kI32) return Bad("input file must hold float32 (<f4) or bfloat16 bits (<u2)");
    if ((batch >= 0 && batch != in.dim(0)) || (n >= 0 && n != in.dim(1))) {
      return Bad(absl::StrCat("input file has shape ", in.ShapeString(), " but --dims say batch=",
                              batch, ", n=", n));
    }
    batch = in.dim(0);
    n = in.dim(1);
  }
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"batch", batch}, {"n", n}, {"k", k}}) {
    if (value < 0) return Bad(absl::StrCat("dimension '", name, "' is missing or negative"));
  }
  if (k > n) return Bad(absl::StrCat("k=", k, " exceeds the row length n=", n));
  if ((largest != 0 && largest != 1) || (ragged != 0 && ragged != 1)) {
    return Bad("attributes largest and ragged take 0 or 1");
  }
  for (const auto& [name, t] : options.inputs) {
    if (name != "input" && name != "row_starts" && name != "row_ends") {
      return Bad(absl::StrCat("unknown input '", name, "' (inputs: input, row_starts, row_ends)"));
    }
    if (name != "input" && (t.dtype() != DType::kI32 || t.shape() != std::vector<int64_t>{batch})) {
      return Bad(absl::StrCat(name, " must be int32 [", batch, "], got ", DTypeName(t.dtype()), " ",
                              t.ShapeString()));
    }
  }
  auto problem = std::make_unique<TopKProblem>(batch, n, k, largest != 0, ragged != 0, options);
  if (absl::Status s = ValidateTopK(*static_cast<const kreg_topk_args*>(problem->args())); !s.ok()) {
    return s;
  }
  return problem;
}

void DescribeTopK(const void* args, DType* dtype, Dims* dims) {
  const kreg_topk_args& a = *static_cast<const kreg_topk_args*>(args);
  *dtype = a.input->dtype.code == kDLBfloat ? DType::kBF16 : DType::kF32;
  *dims = {{"batch", a.input->shape[0]}, {"n", a.input->shape[1]}, {"k", a.k}};
  if (!a.largest) dims->emplace_back("largest", 0);
  if (a.row_starts != nullptr || a.row_ends != nullptr) dims->emplace_back("ragged", 1);
}

}  // namespace

extern const OpInfo kTopKOp;
const OpInfo kTopKOp = {
    "topk",
    "the k best elements of each row of [batch, n], sorted best first",
    {"batch", "n", "k"},
    {{"largest", 1}, {"ragged", 0}},
    ValidateTopKArgs,
    MakeTopKProblem,
    DescribeTopK,
};

}  // namespace kreg
