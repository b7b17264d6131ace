#include "kreg/problem.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kreg/registry.h"
#include "problem_internal.h"

namespace kreg {

using problem_internal::FillPartition;
using problem_internal::FillRanges;

namespace {
// Whether two elements of `size` bytes have the same bits; inlined for 2
// and 4, where a memcmp call per element was most of a check's time.
bool SameBits(const void* a, const void* b, size_t size) {
  if (size == 4) {
    uint32_t x, y;
    std::memcpy(&x, a, 4);
    std::memcpy(&y, b, 4);
    return x == y;
  }
  if (size == 2) {
    uint16_t x, y;
    std::memcpy(&x, a, 2);
    std::memcpy(&y, b, 2);
    return x == y;
  }
  return std::memcmp(a, b, size) == 0;
}

// The check's fast path: whether elements [lo, hi) of `got` are all within
// tolerance of `want` by the plain formula, a loop without branches that
// the compiler vectorizes. Where it says no (a value out of tolerance, or
// not finite), the caller decides element by element; where it says yes,
// the element-wise rule would too (every non-finite case fails the formula:
// where a term's size M overflows, the bound is infinite, so a - b must be
// finite as well).
constexpr int64_t kCheckBlock = 512;

template <typename Load>
bool FormulaHolds(Load load, const Tensor* sizes, double atol, double rtol, int64_t lo, int64_t hi) {
  bool ok = true;
  for (int64_t e = lo; e < hi; ++e) {
    const double a = load(0, e), b = load(1, e);
    const double m = sizes != nullptr ? sizes->GetAsDouble(e) : 1;
    const double d = a - b;
    ok &= d * 0 == 0 && std::fabs(d) <= atol * std::max(1.0, m) + rtol * std::fabs(b);
  }
  return ok;
}

bool BlockWithin(const Tensor& got, const Tensor& want, const Tensor* sizes, const Tolerance* tol, double scale,
                 int64_t lo, int64_t hi) {
  const size_t esize = DTypeSize(got.dtype());
  const char* g = static_cast<const char*>(got.data());
  const char* w = static_cast<const char*>(want.data());
  if (std::memcmp(g + lo * esize, w + lo * esize, (hi - lo) * esize) == 0) return true;
  if (tol == nullptr) return false;
  const double atol = tol->atol * scale;
  switch (got.dtype()) {
    case DType::kF32: {
      const float* p[2] = {got.data_as<float>(), want.data_as<float>()};
      return FormulaHolds([&](int t, int64_t e) { return double{p[t][e]}; }, sizes, atol, tol->rtol, lo, hi);
    }
    case DType::kBF16: {
      const uint16_t* p[2] = {got.data_as<uint16_t>(), want.data_as<uint16_t>()};
      return FormulaHolds([&](int t, int64_t e) { return double{Bf16ToFloat(p[t][e])}; }, sizes, atol, tol->rtol,
                          lo, hi);
    }
    case DType::kI32:
      return false;
  }
  return false;
}

// The bytes of the tensors of a completed problem, each once, and what its
// kernels keep per unit of a dim (DimInfo::bytes_per_unit); InvalidArgument
// if they overflow (with the copies a check keeps) or exceed this machine's
// memory, where allocating would only fail later, or swap.
absl::StatusOr<size_t> TensorBytes(const Op& op, const Values& values, const TensorTypes& types) {
  const auto& infos = op.tensors();
  size_t total = 0, least = 0;  // with the copies a check keeps; each tensor once
  for (size_t i = 0; i < infos.size(); ++i) {
    if (!types[i]) continue;
    absl::StatusOr<size_t> bytes = CheckedBytes(*types[i], op.ShapeOf(static_cast<int>(i), values));
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(), absl::StrCat(op.name(), ": ", infos[i].name, ": ",
                                                              bytes.status().message()));
    }
    // In-out tensors are kept twice (initial contents), outputs three times
    // at most (the reference's copy).
    const size_t copies = infos[i].role == KREG_ROLE_IN ? 1 : 3;
    if (*bytes > (SIZE_MAX - total) / copies) {
      return absl::InvalidArgumentError(absl::StrCat(op.name(), ": the problem's tensors exceed the address space"));
    }
    total += *bytes * copies;
    least += *bytes;
  }
  // What the kernels keep per unit of a dim (per group, say), as the op
  // declares it.
  for (size_t i = 0; i < op.dims().size(); ++i) {
    const size_t per = static_cast<size_t>(op.dims()[i].bytes_per_unit);
    const size_t units = static_cast<size_t>(std::max<int64_t>(values.dims[i], 0));
    if (per != 0 && units > (SIZE_MAX - least) / per) {
      return absl::InvalidArgumentError(absl::StrCat(op.name(), ": the problem's memory exceeds the address space"));
    }
    least += per * units;
  }
  const size_t memory = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGE_SIZE));
  if (least > memory) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: the problem takes %.1f GiB (its tensors, and what its "
                                                      "kernels keep per group or row), more than this machine's "
                                                      "%.1f GiB of memory",
                                                      op.name(), least / 1073741824.0, memory / 1073741824.0));
  }
  return least;
}

// The tensors' dtypes for `options`, and the dims the given inputs' shapes
// fill into *values.
absl::StatusOr<TensorTypes> ResolveInputs(const Op& op, const ProblemOptions& options, Values* values) {
  std::map<std::string, const Tensor*> given;
  std::map<std::string, DType> given_types;
  for (const auto& [name, t] : options.inputs) {
    given[name] = &t;
    given_types[name] = t.dtype();
  }
  absl::StatusOr<TensorTypes> types = op.ResolveTypes(options.dtypes, options.with, given_types);
  if (!types.ok()) return types.status();
  if (absl::Status s = op.DimsFromInputs(given, values); !s.ok()) return s;
  return types;
}

}  // namespace

absl::Status MakeShapeArgs(const Op& op, const Values& given_values, const ProblemOptions& options,
                           ShapeArgs* out) {
  Values values = given_values;
  absl::StatusOr<TensorTypes> types = ResolveInputs(op, options, &values);
  if (!types.ok()) return types.status();
  return op.MakeShapeArgs(values, *types, out);
}

absl::Status FitsInMemory(const Op& op, const Values& given_values, const ProblemOptions& options) {
  Values values = given_values;
  absl::StatusOr<TensorTypes> types = ResolveInputs(op, options, &values);
  if (!types.ok()) return types.status();
  if (absl::Status s = op.Complete(&values); !s.ok()) return s;
  return TensorBytes(op, values, *types).status();
}

absl::StatusOr<std::string> DataClassOf(const Op& op, const kreg_args& args, const ProblemOptions& options,
                                        absl::string_view given) {
  if (!given.empty()) return std::string(given);
  if (op.has_data_class() && !(args.flags & KREG_ARGS_SHAPE_ONLY)) return op.DataClass(args);
  if (options.dist == Dist::kNormal || !options.inputs.empty()) return std::string();
  return absl::StrCat("dist=", DistName(options.dist));
}

absl::StatusOr<std::unique_ptr<Problem>> Problem::Make(std::shared_ptr<const Op> op_ptr,
                                                       std::shared_ptr<const Kernel> reference,
                                                       const Values& given_values,
                                                       const ProblemOptions& options) {
  const Op& op = *op_ptr;
  Values values = given_values;
  absl::StatusOr<TensorTypes> types = ResolveInputs(op, options, &values);
  if (!types.ok()) return types.status();
  if (absl::Status s = op.Complete(&values); !s.ok()) return s;

  // Every size is checked before anything is allocated.
  absl::StatusOr<size_t> least = TensorBytes(op, values, *types);
  if (!least.ok()) return least.status();
  const auto& infos = op.tensors();

  if (op.collective()) {
    if (options.comm == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(op.name(), " is a collective op: run it on several ranks (--ranks N, or under mpirun)"));
    }
    if (values.dims[op.ranks_dim()] != options.comm->size) {
      return absl::InvalidArgumentError(absl::StrCat(op.name(), ": ", op.dims()[op.ranks_dim()].name, "=",
                                                     values.dims[op.ranks_dim()], " but the communicator has ",
                                                     options.comm->size, " ranks"));
    }
  }
  auto p = std::unique_ptr<Problem>(new Problem());
  p->op_ = std::move(op_ptr);
  p->comm_ = options.comm;
  p->reference_ = std::move(reference);
  p->values_ = values;
  p->tensors_.resize(infos.size());
  p->initial_.resize(infos.size());
  p->expected_.resize(infos.size());
  p->pointers_.assign(infos.size(), nullptr);
  try {
    for (size_t i = 0; i < infos.size(); ++i) {
      if (!(*types)[i]) continue;
      if (auto g = options.inputs.find(infos[i].name); g != options.inputs.end()) {
        p->tensors_[i] = g->second;
      } else {
        p->tensors_[i].emplace(*(*types)[i], op.ShapeOf(static_cast<int>(i), values));
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: out of memory for the problem's tensors (%.1f GiB)", op.name(), *least / 1073741824.0));
  }
  // Random inputs by each tensor's generator hint.
  Tensor* range_start = nullptr;
  Tensor* range_end = nullptr;
  int range_dim = -1;
  for (size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& info = infos[i];
    if (!p->tensors_[i] || !info.is_input() || options.inputs.contains(info.name)) continue;
    Tensor& t = *p->tensors_[i];
    const uint64_t rank = options.comm != nullptr ? static_cast<uint64_t>(options.comm->rank) : 0;
    const uint64_t seed = options.seed * 0x9e3779b97f4a7c15ull + i + rank * 0x632be59bd9b4e019ull;
    switch (info.gen) {
      case KREG_GEN_VALUES:
        FillRandom(t, options.dist, seed);
        break;
      case KREG_GEN_PARTITION:
        FillPartition(t, values.dims[info.gen_dim], options.partition, seed);
        break;
      case KREG_GEN_RANGE_START:
        range_start = &t;
        range_dim = info.gen_dim;
        break;
      case KREG_GEN_RANGE_END:
        range_end = &t;
        range_dim = info.gen_dim;
        break;
    }
  }
  if (range_start || range_end) FillRanges(range_start, range_end, values.dims[range_dim], options.seed);
  for (size_t i = 0; i < infos.size(); ++i) {
    if (p->tensors_[i] && infos[i].role == KREG_ROLE_INOUT) p->initial_[i] = *p->tensors_[i];
    if (p->tensors_[i]) p->pointers_[i] = p->tensors_[i]->dl();
  }
  p->args_.struct_size = sizeof(kreg_args);
  p->args_.tensors = p->pointers_.data();
  p->args_.num_tensors = p->pointers_.size();
  p->args_.dims = p->values_.dims.data();
  p->args_.num_dims = p->values_.dims.size();
  p->args_.attrs = p->values_.attrs.data();
  p->args_.num_attrs = p->values_.attrs.size();
  if (absl::Status s = op.Validate(p->args_); !s.ok()) return s;
  p->inputs_hash_ = p->HashInputs();
  return p;
}

uint64_t Problem::HashInputs() const {
  // A Fletcher sum of 64-bit words in eight lanes (a plain sum, and the sum
  // of the running sums, so a word moved is seen too): additions only, which
  // vectorise and keep up with memory. A chain of multiplies (FNV) ran far
  // below it, and a gmm's weights (hundreds of MB) are summed once per
  // candidate checked.
  constexpr int kLanes = 8;
  uint64_t sum[kLanes] = {}, sum2[kLanes] = {};
  uint64_t tail = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensors_[i] || op_->tensors()[i].role != KREG_ROLE_IN) continue;
    const unsigned char* p = static_cast<const unsigned char*>(tensors_[i]->data());
    const size_t n = tensors_[i]->nbytes();
    size_t j = 0;
    for (; j + 8 * kLanes <= n; j += 8 * kLanes) {
      uint64_t w[kLanes];
      std::memcpy(w, p + j, sizeof w);
      for (int l = 0; l < kLanes; ++l) {
        sum[l] += w[l];
        sum2[l] += sum[l];
      }
    }
    for (; j < n; ++j) tail = (tail ^ p[j]) * 0x100000001b3ull;
    tail = (tail ^ n) * 0x100000001b3ull;  // where one tensor ends and the next begins
  }
  uint64_t h = tail;
  for (int l = 0; l < kLanes; ++l) h = ((h ^ sum[l]) * 0x100000001b3ull ^ sum2[l]) * 0x100000001b3ull;
  return h;
}

void Problem::PoisonOutputs() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensors_[i] || op_->tensors()[i].role != KREG_ROLE_OUT) continue;
    std::memset(tensors_[i]->data(), op_->tensors()[i].unchecked ? 0 : 0x5a, tensors_[i]->nbytes());
  }
}

void Problem::RestoreInOut() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (initial_[i]) std::memcpy(tensors_[i]->data(), initial_[i]->data(), initial_[i]->nbytes());
  }
}

bool Problem::has_inout() const {
  return std::any_of(initial_.begin(), initial_.end(), [](const auto& t) { return t.has_value(); });
}

absl::Status Problem::RunReference(ReferenceInputs inputs, std::vector<std::optional<Tensor>>* out) const {
  // The reference writes its own copies: outputs fresh, in-out tensors from
  // their initial contents; for magnitudes, float inputs with their signs
  // cleared; for kBf16SubnormalsZero, bf16 inputs with subnormals zeroed.
  out->assign(tensors_.size(), std::nullopt);
  std::vector<std::optional<Tensor>> changed_inputs(tensors_.size());
  std::vector<DLTensor*> pointers = pointers_;
  try {  // the copies are the problem's size again
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (!tensors_[i]) continue;
      const kreg_role role = op_->tensors()[i].role;
      if (role != KREG_ROLE_IN) {
        (*out)[i] = initial_[i] ? *initial_[i] : Tensor(tensors_[i]->dtype(), tensors_[i]->shape());
        pointers[i] = (*out)[i]->dl();
      }
      const DType dtype = tensors_[i]->dtype();
      if (role == KREG_ROLE_OUT) continue;
      if (inputs == ReferenceInputs::kMagnitudes && (dtype == DType::kF32 || dtype == DType::kBF16)) {
        Tensor& t = role == KREG_ROLE_IN ? changed_inputs[i].emplace(*tensors_[i]) : *(*out)[i];
        char* bytes = static_cast<char*>(t.data());
        const size_t esize = DTypeSize(dtype);
        for (int64_t e = 0; e < t.numel(); ++e) bytes[e * esize + esize - 1] &= 0x7f;  // little-endian sign bit
        pointers[i] = t.dl();
      } else if (inputs == ReferenceInputs::kBf16SubnormalsZero && role == KREG_ROLE_IN && dtype == DType::kBF16) {
        Tensor& t = changed_inputs[i].emplace(*tensors_[i]);
        uint16_t* bits = t.data_as<uint16_t>();
        for (int64_t e = 0; e < t.numel(); ++e) {
          if ((bits[e] & 0x7f80) == 0) bits[e] &= 0x8000;  // a subnormal (or zero) becomes zero of its sign
        }
        pointers[i] = t.dl();
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(op_->name(), ": out of memory for the reference's copies"));
  }
  kreg_args args = args_;
  args.tensors = pointers.data();
  RunOptions options;
  options.comm = comm_;
  if (absl::Status s = reference_->Run(reference_->DefaultConfig(), args, options); !s.ok()) {
    return absl::Status(absl::IsUnavailable(s) || absl::IsCancelled(s) ? s.code() : absl::StatusCode::kInternal,
                        absl::StrCat("the reference failed: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status Problem::ComputeReference() const {
  if (std::any_of(expected_.begin(), expected_.end(), [](const auto& t) { return t.has_value(); })) {
    return absl::OkStatus();
  }
  if (reference_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("op ", op_->name(), " has no reference kernel loaded"));
  }
  bool magnitudes = false;  // some output's tolerance scales with its terms'
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensors_[i] || !op_->tensors()[i].is_output()) continue;
    const Tolerance* tol = op_->tensors()[i].ToleranceFor(tensors_[i]->dtype());
    magnitudes = magnitudes || (tol != nullptr && tol->magnitude);
  }
  std::vector<std::optional<Tensor>> out, sizes;
  if (absl::Status s = RunReference(ReferenceInputs::kAsGiven, &out); !s.ok()) return s;
  if (magnitudes) {
    if (absl::Status s = RunReference(ReferenceInputs::kMagnitudes, &sizes); !s.ok()) return s;
  }
  expected_ = std::move(out);
  magnitudes_ = std::move(sizes);
  return absl::OkStatus();
}

absl::Status Problem::CheckGuards() const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensors_[i]) continue;
    if (const size_t damaged = tensors_[i]->GuardDamage(); damaged > 0) {
      return absl::InvalidArgumentError(absl::StrCat("the kernel wrote past the end of '", op_->tensors()[i].name,
                                                     "' (", damaged, " of the ", Tensor::kGuardBytes,
                                                     " guard bytes after its ", tensors_[i]->nbytes(),
                                                     " changed)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Problem::CheckOutputs() const {
  if (absl::Status s = CheckGuards(); !s.ok()) return s;
  if (absl::Status s = ComputeReference(); !s.ok()) return s;
  if (HashInputs() != inputs_hash_) {
    return absl::InvalidArgumentError("a read-only input was written (the kernel must not modify its inputs)");
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& info = op_->tensors()[i];
    if (!expected_[i] || info.unchecked) continue;
    const Tensor& got = *tensors_[i];
    const Tensor& want = *expected_[i];
    const Tolerance* tol = info.ToleranceFor(got.dtype());
    const size_t esize = DTypeSize(got.dtype());
    const double scale = tol && tol->scale_dim >= 0 ? std::max<double>(1, values_.dims[tol->scale_dim]) : 1;
    const Tensor* sizes = tol && tol->magnitude && i < magnitudes_.size() && magnitudes_[i] ? &*magnitudes_[i] : nullptr;
    const char* g = static_cast<const char*>(got.data());
    // Whether element e of got is within tolerance of element e of ref.
    auto within = [&](const Tensor& ref, int64_t e) {
      if (SameBits(g + e * esize, static_cast<const char*>(ref.data()) + e * esize, esize)) return true;
      if (tol == nullptr) return false;
      const double a = got.GetAsDouble(e), b = ref.GetAsDouble(e);
      const double m = sizes != nullptr ? sizes->GetAsDouble(e) : 1;  // NaN only where want is NaN
      // The terms overflow the dtype (and the op's kernels do not recompute).
      const bool overflow = sizes != nullptr && std::isinf(m) && !tol->exact_nonfinite;
      if (std::isnan(b)) return std::isnan(a);
      // Float partial sums may overflow, to either infinity or both (NaN).
      if (!std::isfinite(a) || std::isinf(b)) return a == b || (overflow && !std::isfinite(a));
      return std::fabs(a - b) <= tol->atol * scale * std::max(1.0, m) + tol->rtol * std::fabs(b);
    };
    const int64_t n = got.numel();
    for (int64_t lo = 0; lo < n; lo += kCheckBlock) {
      const int64_t hi = std::min(n, lo + kCheckBlock);
      if (BlockWithin(got, want, sizes, tol, scale, lo, hi)) continue;
      for (int64_t e = lo; e < hi; ++e) {
        if (within(want, e)) continue;
        if (tol != nullptr && tol->bf16_daz) {  // the reference on flushed inputs, made once
          if (!flushed_) {
            if (absl::Status s = RunReference(ReferenceInputs::kBf16SubnormalsZero, &flushed_.emplace()); !s.ok()) {
              flushed_.reset();
              return s;
            }
          }
          if (within(*(*flushed_)[i], e)) continue;
        }
        // Name the element by its coordinates.
        std::string where;
        int64_t rest = e;
        for (size_t d = got.shape().size(); d-- > 0;) {
          const int64_t extent = got.shape()[d];
          where = absl::StrCat(extent ? rest % extent : 0, where.empty() ? "" : ", ", where);
          rest = extent ? rest / extent : 0;
        }
        return absl::InvalidArgumentError(absl::StrCat(
            info.name, "[", where, "]: got ", got.GetAsDouble(e), ", expected ", want.GetAsDouble(e),
            tol ? absl::StrCat(" (tolerance atol ", tol->atol, " x ", scale,
                               sizes ? absl::StrCat(" x max(1, ", sizes->GetAsDouble(e), " the terms' size)") : "",
                               " + rtol ", tol->rtol, ")")
              : " (exact)"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, const Tensor*>> Problem::inputs() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i] && op_->tensors()[i].is_input()) {
      out.emplace_back(op_->tensors()[i].name, initial_[i] ? &*initial_[i] : &*tensors_[i]);
    }
  }
  return out;
}

std::vector<std::pair<std::string, const Tensor*>> Problem::outputs() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i] && op_->tensors()[i].is_output()) out.emplace_back(op_->tensors()[i].name, &*tensors_[i]);
  }
  return out;
}

absl::StatusOr<std::map<std::string, DType>> ParseDTypes(absl::string_view text) {
  absl::StatusOr<std::vector<std::string>> items = SplitList(text);
  if (!items.ok()) return items.status();
  std::map<std::string, DType> out;
  for (absl::string_view item : *items) {
    const size_t eq = item.find('=');
    const absl::string_view name = eq == absl::string_view::npos ? absl::string_view() : item.substr(0, eq);
    absl::StatusOr<DType> d = ParseDType(eq == absl::string_view::npos ? item : item.substr(eq + 1));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("'", item, "': expected f32, bf16 or i32, or NAME=TYPE,..."));
    out[std::string(name)] = *d;
  }
  return out;
}

}  // namespace kreg
