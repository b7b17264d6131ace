// transpose's conformance cases, compiled into tests/' conformance_test (see
// tests/conformance.h): the reference pinned on a hand-written matrix, bits
// kept as they are (NaN payloads of both signs, -0, subnormals), and every
// kernel on shapes no tile divides, in every dtype and bit pattern. The
// harness's edge cases from the descriptor run as for every op.
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/conformance.h"

namespace kreg::conformance {
namespace {

// What transpose/reference writes for `x`.
std::vector<uint32_t> ReferenceOf(const Tensor& x) {
  std::shared_ptr<const Op> op = *TheRegistry().GetOp("transpose");
  ProblemOptions options;
  options.inputs = {{"x", x}};
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(op, TheRegistry().Reference("transpose"), *op->ParseValues(NamedValues{}), options);
  EXPECT_TRUE(problem.ok()) << problem.status();
  if (!problem.ok()) return {};
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference("transpose");
  EXPECT_TRUE(reference->Run(reference->DefaultConfig(), *(*problem)->args()).ok());
  return Elements<uint32_t>(*Output(**problem, "out"));
}

TEST(TransposeReferenceTest, KeepsEveryBitPattern) {
  const uint32_t bits[] = {0x7fc00001u, 0xffc00002u, 0x80000000u, 0x00000001u, 0x7f800000u, 0x3f800000u};
  Tensor x(DType::kF32, {2, 3});
  std::memcpy(x.data(), bits, sizeof bits);
  EXPECT_THAT(ReferenceOf(x),
              ElementsAre(0x7fc00001u, 0x00000001u, 0xffc00002u, 0x7f800000u, 0x80000000u, 0x3f800000u));
}

TEST(TransposeConformanceTest, ShapesNoTileDividesEveryDtypeAndBitPattern) {
  for (const auto& [rows, cols] : std::vector<std::pair<int, int>>{{1, 1000}, {1000, 1}, {129, 65}, {33, 257}}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32}) {
      for (Dist dist : {Dist::kNormal, Dist::kBits}) {
        Case c;
        c.values = {{"rows", absl::StrCat(rows)}, {"cols", absl::StrCat(cols)}};
        c.options.dtypes["x"] = dtype;
        c.options.dist = dist;
        EXPECT_GT(CheckAll("transpose", c), 0);
      }
    }
  }
}

}  // namespace
}  // namespace kreg::conformance
