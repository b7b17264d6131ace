// Problems: one concrete call of an op, with owned tensors, built from named
// values and an op's descriptor (random inputs by the tensors' generator
// hints, or the user's own arrays), and checked against the op's reference
// kernel. The command line, the tests, the tuner's worker and the
// conformance harness all build their calls here.
//
// Thread-safety: a Problem is not thread-safe; distinct Problems are
// independent.
#ifndef KREG_REGISTRY_PROBLEM_H_
#define KREG_REGISTRY_PROBLEM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/op.h"
#include "kreg/tensor.h"

namespace kreg {

class Kernel;

// How random float inputs are drawn: normal(0, 1); uniform [-1, 1); bits:
// every bit pattern equally likely (NaNs, infinities, zeros of both signs,
// subnormals); ties: a few distinct values, many repeats.
enum class Dist { kNormal, kUniform, kBits, kTies };
absl::StatusOr<Dist> ParseDist(absl::string_view name);
absl::string_view DistName(Dist dist);

// How KREG_GEN_PARTITION tensors are drawn: random cut points (empty parts
// included), equal parts, or a few hot parts and many small or empty ones.
enum class Partition { kRandom, kBalanced, kSkewed };
absl::StatusOr<Partition> ParsePartition(absl::string_view name);
absl::string_view PartitionName(Partition partition);

// Fills `tensor` with values drawn from `dist` (ints: uniform bits).
void FillRandom(Tensor& tensor, Dist dist, uint64_t seed);

struct ProblemOptions {
  // Dtypes by tensor name; "" applies to every tensor that allows it.
  std::map<std::string, DType> dtypes;
  // Optional inputs to generate.
  std::set<std::string> with;
  Dist dist = Dist::kNormal;
  Partition partition = Partition::kRandom;
  uint64_t seed = 1;
  // Inputs given by the user (name -> array) replace random ones; their
  // shapes supply dims left out.
  std::map<std::string, Tensor> inputs;
  // Collective ops: this rank's communicator (its size must be the values'
  // ranks dim). Random inputs are then drawn from seed and the rank, so each
  // rank's differ and any rank can be reproduced.
  const kreg_comm* comm = nullptr;
};

// Requested dtypes as the command line's --dtype and Python's dtype= give
// them: "bf16" (every tensor that allows it) or "NAME=TYPE,...", TYPE f32,
// bf16 or i32 (ProblemOptions::dtypes; "" for every tensor). InvalidArgument
// naming the item otherwise.
absl::StatusOr<std::map<std::string, DType>> ParseDTypes(absl::string_view text);

// Shape-only arguments for `values` and `options` (dtypes, optional inputs,
// the given inputs, whose shapes fill dims left unknown).
absl::Status MakeShapeArgs(const Op& op, const Values& values, const ProblemOptions& options, ShapeArgs* out);

// Whether the problem's tensors can be made on this machine (what
// Problem::Make checks before allocating): ResourceExhausted naming their
// size when they exceed the address space or this machine's memory.
absl::Status FitsInMemory(const Op& op, const Values& values, const ProblemOptions& options);

// The data class of a call, for its key: `given` if non-empty; else the
// op's classifier on `args` when they hold data; else "dist=NAME" when
// `options` draw random inputs from a distribution other than normal; else
// "".
absl::StatusOr<std::string> DataClassOf(const Op& op, const kreg_args& args, const ProblemOptions& options,
                                        absl::string_view given = {});

class Problem {
 public:
  // Builds the call of `op` for `named` dims and attributes. Sizes are
  // checked before anything is allocated. `reference` (the op's reference
  // kernel, may be null) is what CheckOutputs compares against.
  static absl::StatusOr<std::unique_ptr<Problem>> Make(std::shared_ptr<const Op> op,
                                                       std::shared_ptr<const Kernel> reference,
                                                       const Values& values,
                                                       const ProblemOptions& options);

  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  const Op& op() const { return *op_; }
  const kreg_args* args() const { return &args_; }
  const Values& values() const { return values_; }
  // The key dims (dims and non-default integer attributes).
  Dims dims() const { return op_->KeyDims(values_); }
  OpKey key() const { return op_->KeyOf(args_); }

  // Fills pure outputs with a poison pattern, so a kernel that leaves
  // memory unwritten is caught by CheckOutputs(). In-out tensors are left
  // alone (restore them instead).
  void PoisonOutputs();
  // Puts every in-out tensor back to its initial contents.
  void RestoreInOut();
  bool has_inout() const;
  // Compares the outputs (and in-out tensors) with the reference run on the
  // initial inputs (computed once): bit for bit, or within the op's
  // tolerance for the dtype. InvalidArgument naming the tensor and the first
  // element that differs, or a read-only input that was written, or a
  // write past a tensor's end (CheckGuards); FailedPrecondition without a
  // reference.
  absl::Status CheckOutputs() const;
  // InvalidArgument naming the tensor a kernel wrote past the end of (its
  // guard, Tensor::GuardDamage), else OK. Cheap: runs that are not checked
  // against the reference still end with it.
  absl::Status CheckGuards() const;
  // Sets the reference's outputs now (outside any clock); idempotent. For a
  // collective op every rank must call it together.
  absl::Status ComputeReference() const;

  // Present tensors by name, in the op's order.
  std::vector<std::pair<std::string, const Tensor*>> inputs() const;
  std::vector<std::pair<std::string, const Tensor*>> outputs() const;

 private:
  Problem() = default;
  std::shared_ptr<const Op> op_;
  std::shared_ptr<const Kernel> reference_;
  const kreg_comm* comm_ = nullptr;
  Values values_;
  std::vector<std::optional<Tensor>> tensors_;  // per op tensor
  std::vector<std::optional<Tensor>> initial_;  // in-out tensors' initial contents
  mutable std::vector<std::optional<Tensor>> expected_;  // the reference's outputs
  // The reference's outputs on the inputs' absolute values, where a
  // tolerance asks for them (KREG_TOLERANCE_MAGNITUDE).
  mutable std::vector<std::optional<Tensor>> magnitudes_;
  // The reference's outputs on the inputs with their bf16 subnormals zero,
  // made when an output that allows it (KREG_TOLERANCE_BF16_DAZ) differs.
  mutable std::optional<std::vector<std::optional<Tensor>>> flushed_;
  std::vector<DLTensor*> pointers_;
  uint64_t inputs_hash_ = 0;  // of the read-only inputs: a kernel must not write them
  kreg_args args_{};

  uint64_t HashInputs() const;
  // What the reference is run on: the initial inputs, their absolute
  // values, or the inputs with every bf16 subnormal set to zero.
  enum class ReferenceInputs { kAsGiven, kMagnitudes, kBf16SubnormalsZero };
  // Runs the reference on `inputs` into fresh copies of the outputs, *out.
  absl::Status RunReference(ReferenceInputs inputs, std::vector<std::optional<Tensor>>* out) const;
};

}  // namespace kreg

#endif  // KREG_REGISTRY_PROBLEM_H_
