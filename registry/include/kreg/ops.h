// The ops kreg knows: their argument validation, their plain reference
// implementations, and Problems (owned inputs + outputs + an ABI args struct)
// that the command line, the tests and the tuner build from named dims.
//
// Thread-safety: OpInfo is immutable. A Problem is not thread-safe.
#ifndef KREG_REGISTRY_OPS_H_
#define KREG_REGISTRY_OPS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kreg/tensor.h"

namespace kreg {

// Named problem dimensions, in the op's order ("batch=8,n=1000,k=10").
using Dims = std::vector<std::pair<std::string, int64_t>>;
absl::StatusOr<Dims> ParseDims(absl::string_view text);
std::string DimsString(const Dims& dims);

// How random inputs are drawn: normal(0, 1); uniform [-1, 1); bits: every
// bit pattern equally likely (NaNs, infinities, zeros of both signs,
// subnormals); ties: a few distinct values, many repeats.
enum class Dist { kNormal, kUniform, kBits, kTies };
absl::StatusOr<Dist> ParseDist(absl::string_view name);
absl::string_view DistName(Dist dist);

struct ProblemOptions {
  DType dtype = DType::kF32;
  Dist dist = Dist::kNormal;
  uint64_t seed = 1;
  // Inputs given by the user (name -> tensor) replace the random ones.
  std::map<std::string, Tensor> inputs;
  // False: leave random inputs zero, for a Problem that only carries shapes
  // (legality checks, enumerating a search space).
  bool fill = true;
};

// One concrete instance of an op: inputs, outputs, and the args struct the
// kernels take, pointing into them.
class Problem {
 public:
  virtual ~Problem() = default;
  virtual const void* args() const = 0;
  // The resolved dims (those read from input files too), and attributes
  // that differ from their defaults.
  virtual Dims dims() const = 0;
  // Compares the outputs against the op's reference (computed once per
  // input); InvalidArgument naming the first difference.
  virtual absl::Status CheckOutputs() const = 0;
  // Fills the outputs with a poison pattern, so a kernel that leaves memory
  // unwritten is caught by CheckOutputs().
  virtual void PoisonOutputs() = 0;
  virtual std::vector<std::pair<std::string, const Tensor*>> inputs() const = 0;
  virtual std::vector<std::pair<std::string, const Tensor*>> outputs() const = 0;
};

struct OpInfo {
  absl::string_view name;
  absl::string_view doc;
  // Dims a user gives, and optional attributes (with their defaults) that
  // may be given among them.
  std::vector<absl::string_view> dim_names;
  Dims attributes;
  // Checks shapes, dtypes, strides and values of an args struct.
  absl::Status (*validate)(const void* args);
  absl::StatusOr<std::unique_ptr<Problem>> (*make_problem)(
      const Dims& dims, const ProblemOptions& options);
  // The dtype and dims (attributes differing from their defaults included)
  // of a valid args struct: what a tuning table is keyed by.
  void (*describe)(const void* args, DType* dtype, Dims* dims);
};

// nullptr if kreg knows no such op.
const OpInfo* FindOp(absl::string_view name);
std::vector<const OpInfo*> AllOps();

// Fills `tensor` with values drawn from `dist`.
void FillRandom(Tensor& tensor, Dist dist, uint64_t seed);

}  // namespace kreg

#endif  // KREG_REGISTRY_OPS_H_
