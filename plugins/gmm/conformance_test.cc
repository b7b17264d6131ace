// gmm's and tgmm's conformance cases, compiled into tests/' conformance_test
// (see tests/conformance.h): the references pinned on hand-written groups,
// every kernel on chosen partitions (empty groups, all empty, m=0, sum below
// m, one huge group among tiny ones, sizes no tile divides, group offsets, a
// transposed rhs, existing_out; normal values and every bit pattern; outputs
// larger than the cache), and their validation errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/conformance.h"

namespace kreg::conformance {
namespace {

// ---- The harness on gmm's descriptor -----------------------------------------------

// transpose_rhs and constant_weights are drawn (both values); group_offset's
// range is large, so it keeps its default there and gets chosen cases below
// (GroupedMatmulTest).
TEST(GmmConformanceTest, EdgeCasesAreBuiltFromItsDescriptor) {
  std::shared_ptr<const Op> gmm = *TheRegistry().GetOp("gmm");
  EXPECT_EQ(AttrChoices(*gmm).size(), 4u);
  EXPECT_EQ(DtypeChoices(*gmm).size(), 4u);  // lhs f32 or bf16, out f32 or bf16
}

// ---- gmm and tgmm: the references pinned -----------------------------------------


// What the reference of `op` writes into "out" for `values` (dims and
// attributes by name) and the given inputs (the other dims come from their
// shapes); empty on failure.
std::vector<float> ReferenceOut(const std::string& op_name, const NamedValues& values,
                                std::map<std::string, Tensor> inputs) {
  std::shared_ptr<const Op> op = *TheRegistry().GetOp(op_name);
  absl::StatusOr<Values> parsed = op->ParseValues(values);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok()) return {};
  ProblemOptions options;
  options.inputs = std::move(inputs);
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(op, TheRegistry().Reference(op_name), *parsed, options);
  EXPECT_TRUE(problem.ok()) << problem.status();
  if (!problem.ok()) return {};
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference(op_name);
  const absl::Status run = reference->Run(reference->DefaultConfig(), *(*problem)->args());
  EXPECT_TRUE(run.ok()) << run;
  return run.ok() ? Elements<float>(*Output(**problem, "out")) : std::vector<float>{};
}

TEST(GmmReferenceTest, GroupsOffsetsTransposedRhsAndExistingOut) {
  // m=4, k=2, n=2; groups of 1, 2 and 0 rows: row 3 is past them all.
  const Tensor lhs = F32({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor sizes = I32({1, 2, 0});
  // rhs[0] the identity, rhs[1] [[1, 2], [3, 4]], rhs[2] all 2; then each
  // matrix transposed ([n, k]) for transpose_rhs=1.
  const Tensor rhs = F32({3, 2, 2}, {1, 0, 0, 1, 1, 2, 3, 4, 2, 2, 2, 2});
  const Tensor rhs_t = F32({3, 2, 2}, {1, 0, 0, 1, 1, 3, 2, 4, 2, 2, 2, 2});
  const std::vector<float> all = {1, 2, 15, 22, 23, 34, 0, 0};
  EXPECT_EQ(ReferenceOut("gmm", {}, {{"lhs", lhs}, {"rhs", rhs}, {"group_sizes", sizes}}), all);
  EXPECT_EQ(ReferenceOut("gmm", {{"transpose_rhs", "1"}}, {{"lhs", lhs}, {"rhs", rhs_t}, {"group_sizes", sizes}}),
            all);
  // Group 1 alone (rhs holds one matrix: local_groups=1 from its shape):
  // the other rows are 0, or existing_out's.
  const Tensor rhs1 = F32({1, 2, 2}, {1, 2, 3, 4});
  const Tensor rhs1_t = F32({1, 2, 2}, {1, 3, 2, 4});
  const Tensor existing = F32({4, 2}, {10, 10, 10, 10, 10, 10, 10, 10});
  EXPECT_EQ(ReferenceOut("gmm", {{"group_offset", "1"}}, {{"lhs", lhs}, {"rhs", rhs1}, {"group_sizes", sizes}}),
            (std::vector<float>{0, 0, 15, 22, 23, 34, 0, 0}));
  EXPECT_EQ(ReferenceOut("gmm", {{"group_offset", "1"}, {"transpose_rhs", "1"}},
                         {{"lhs", lhs}, {"rhs", rhs1_t}, {"group_sizes", sizes}, {"existing_out", existing}}),
            (std::vector<float>{10, 10, 25, 32, 33, 44, 10, 10}));
  // The last group alone is empty: every row is existing_out's.
  EXPECT_EQ(ReferenceOut("gmm", {{"group_offset", "2"}},
                         {{"lhs", lhs}, {"rhs", rhs1}, {"group_sizes", sizes}, {"existing_out", existing}}),
            (std::vector<float>(8, 10)));
}

TEST(TgmmReferenceTest, GroupsOffsetsAndEmptyGroups) {
  // k=2, m=4, n=2; groups of 1, 2 and 0 rows: row 3 is ignored.
  const Tensor lhs = F32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor rhs = F32({4, 2}, {1, 0, 0, 1, 1, 1, 2, 2});
  const Tensor sizes = I32({1, 2, 0});
  EXPECT_EQ(ReferenceOut("tgmm", {}, {{"lhs", lhs}, {"rhs", rhs}, {"group_sizes", sizes}}),
            (std::vector<float>{1, 0, 5, 0, 3, 5, 7, 13, 0, 0, 0, 0}));
  EXPECT_EQ(ReferenceOut("tgmm", {{"group_offset", "1"}, {"local_groups", "2"}},
                         {{"lhs", lhs}, {"rhs", rhs}, {"group_sizes", sizes}}),
            (std::vector<float>{3, 5, 7, 13, 0, 0, 0, 0}));
}

// The declared tolerance (op.cc): a sum is held to d roundings of its terms'
// size M, not of its result, and NaN and infinities to the reference's even
// where M overflows. One group, k = 3, the rows' exact sums 1, 2e-3 and 3e38.
TEST(GmmToleranceTest, ASumIsHeldToItsTermsSizeAndItsOverflowsExactly) {
  std::shared_ptr<const Op> op = *TheRegistry().GetOp("gmm");
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference("gmm");
  ProblemOptions options;
  options.inputs = {{"lhs", F32({3, 3}, {1e8f, 1, -1e8f, 1e-3f, 2e-3f, -1e-3f, 3e38f, 3e38f, -3e38f})},
                    {"rhs", F32({1, 3, 1}, {1, 1, 1})},
                    {"group_sizes", I32({3})}};
  absl::StatusOr<std::unique_ptr<Problem>> made =
      Problem::Make(op, reference, *op->ParseValues(NamedValues{}), options);
  ASSERT_TRUE(made.ok()) << made.status();
  Problem& p = **made;
  float* out = const_cast<float*>(Output(p, "out")->data_as<float>());
  const float inf = std::numeric_limits<float>::infinity();
  struct Change {
    int row;
    float to;
    bool caught;
  };
  const std::vector<Change> changes = {
      {0, 0.0f, false},      // the float sum from the left: 1e8 + 1 rounds to 1e8
      {0, 100.0f, false},    // within 2e-7 x 3 x 2e8
      {0, 1000.0f, true},
      {1, 2.001e-3f, true},  // 1e-6 off a result of 2e-3: the terms are small
      {1, 2.0000001e-3f, false},
      {2, inf, true},        // the float sum from the left overflows; the result does not
      {2, 1.0f, false},      // M overflows: any finite value is within d roundings of it
  };
  for (const Change& c : changes) {
    SCOPED_TRACE(::testing::Message() << "row " << c.row << " = " << c.to);
    ASSERT_TRUE(reference->Run(reference->DefaultConfig(), *p.args()).ok());
    ASSERT_TRUE(p.CheckOutputs().ok());
    out[c.row] = c.to;
    const absl::Status check = p.CheckOutputs();
    EXPECT_EQ(!check.ok(), c.caught) << check;
  }
}

// ---- gmm and tgmm: every kernel on chosen partitions ------------------------------

// A grouped-matmul problem: its dims (m the grouped one), group sizes
// (empty: drawn by `partition` over `groups` groups) and local groups.
struct GroupedShape {
  const char* name;
  int64_t m, k, n;
  std::vector<int32_t> sizes;
  int64_t groups = 0;  // with `sizes` empty
  Partition partition = Partition::kRandom;
  int64_t group_offset = 0;
  int64_t local_groups = -1;  // -1: left out (all groups)
};

std::vector<GroupedShape> GroupedShapes() {
  std::vector<int32_t> huge_and_tiny = {300};
  for (int i = 0; i < 31; ++i) huge_and_tiny.push_back(i % 3);  // 0, 1, 2, 0, ...
  const std::vector<int32_t> eight = {5, 0, 7, 6, 9, 3, 0, 10};  // 40 rows
  return {
      {"empty_groups", 12, 5, 3, {0, 5, 0, 0, 7, 0}},
      {"all_groups_empty", 9, 4, 6, {0, 0, 0, 0}},
      {"m_zero", 0, 4, 5, {0, 0, 0}},
      {"no_groups", 6, 3, 4, {}, 0},
      {"sum_below_m", 20, 7, 9, {3, 4, 2}},
      {"one_huge_many_tiny", 300 + 31 + 4, 33, 17, huge_and_tiny},
      {"tiles_do_not_divide", 130, 67, 45, {30, 0, 61, 1, 38}},
      // Every strip whole (n = 32), so the micro-kernels store the sums
      // straight to out; the reduction in two slices of tk = 128 (gmm's k,
      // tgmm's first group). (OutputsLargerThanTheCache has n = 512: two
      // column blocks, streamed.) Its random bit patterns draw a sum whose
      // terms cancel (tgmm out[3, 129, 11]), which only the tolerance's
      // magnitude term admits.
      {"whole_strips", 150, 130, 32, {130, 0, 1, 19}},
      {"skewed", 200, 16, 24, {}, 16, Partition::kSkewed},
      {"offset_middle", 40, 9, 11, eight, 0, Partition::kRandom, 2, 3},
      {"offset_last", 40, 9, 11, eight, 0, Partition::kRandom, 5, 3},
      {"offset_end_none_local", 40, 9, 11, eight, 0, Partition::kRandom, 8, 0},
      {"offset_first_sum_below_m", 50, 9, 11, eight, 0, Partition::kRandom, 0, 4},
  };
}

// The cases of one shape for op "gmm" or "tgmm": each pairing of input and
// output dtypes, normal values and every bit pattern (NaN, infinities);
// for gmm also rhs plain and transposed, without and with existing_out.
std::vector<Case> GroupedCases(const std::string& op, const GroupedShape& shape) {
  std::vector<Case> out;
  const bool gmm = op == "gmm";
  for (const char* transpose : {"0", "1"}) {
    if (!gmm && transpose[0] == '1') continue;
    for (bool existing : {false, true}) {
      if (!gmm && existing) continue;
      for (DType in : {DType::kF32, DType::kBF16}) {
        for (DType result : {DType::kF32, DType::kBF16}) {
          for (Dist dist : {Dist::kNormal, Dist::kBits}) {
            Case c;
            c.values = {{"m", absl::StrCat(shape.m)}, {"k", absl::StrCat(shape.k)}, {"n", absl::StrCat(shape.n)}};
            if (shape.sizes.empty()) {
              c.values.emplace_back("groups", absl::StrCat(shape.groups));
            } else {
              c.options.inputs["group_sizes"] = I32(shape.sizes);
            }
            if (shape.local_groups >= 0) c.values.emplace_back("local_groups", absl::StrCat(shape.local_groups));
            if (shape.group_offset > 0) c.values.emplace_back("group_offset", absl::StrCat(shape.group_offset));
            if (gmm) c.values.emplace_back("transpose_rhs", transpose);
            if (existing) c.options.with.insert("existing_out");
            c.options.dtypes["lhs"] = in;
            c.options.dtypes["out"] = result;
            c.options.dist = dist;
            c.options.partition = shape.partition;
            c.options.seed = out.size() + 1;
            out.push_back(std::move(c));
          }
        }
      }
    }
  }
  return out;
}

std::vector<std::string> GroupedKernels() {
  std::vector<std::string> names;
  for (const char* op : {"gmm", "tgmm"}) {
    for (const auto& k : TheRegistry().Kernels(op)) {
      if (!k->is_reference()) names.push_back(k->name());
    }
  }
  return names;
}

class GroupedMatmulTest : public KernelConformanceTest {};

// A configuration per micro-kernel this CPU runs (the others at their
// defaults); the default alone for a kernel without the parameter.
std::vector<NamedValues> MicroConfigs(const Kernel& kernel) {
  std::vector<NamedValues> configs;
  for (const ParamInfo& p : kernel.params().params()) {
    if (p.name != "micro") continue;
    for (size_t i = 0; i < p.choices.size(); ++i) {
      if (p.ChoiceAvailable(static_cast<int64_t>(i), CpuIsa())) configs.push_back({{p.name, p.choices[i]}});
    }
  }
  if (configs.empty()) configs.push_back({});
  return configs;
}

TEST_P(GroupedMatmulTest, ChosenPartitionsOffsetsAndLayouts) {
  for (const GroupedShape& shape : GroupedShapes()) {
    Tally tally;
    for (const Case& c : GroupedCases(kernel_->op(), shape)) {
      CheckKernel(*kernel_, c, tally, /*max_configs=*/32);
      if (HasFailure()) break;  // one failing case per shape tells enough
    }
    EXPECT_EQ(tally.refused, 0) << shape.name;
    EXPECT_GT(tally.runs, 0) << shape.name;
    // Every choice this CPU runs (each micro-kernel) ran on every shape.
    std::vector<std::string> choices;
    for (const ParamInfo& p : kernel_->params().params()) {
      for (size_t i = 0; i < p.choices.size(); ++i) {
        if (!p.ChoiceAvailable(static_cast<int64_t>(i), CpuIsa())) continue;
        const std::string choice = absl::StrCat(p.name, "=", p.choices[i]);
        EXPECT_GT(tally.choice_runs[choice], 0) << shape.name << ": no run with " << choice;
        choices.push_back(absl::StrCat(choice, " ", tally.choice_runs[choice]));
      }
    }
    std::cout << kernel_->name() << " " << shape.name << ": " << tally.cases << " cases, " << tally.runs
              << " checked runs" << (choices.empty() ? "" : absl::StrCat(" (", absl::StrJoin(choices, ", "), ")"))
              << (HasFailure() ? " (FAILED)" : "") << "\n";
    if (HasFailure()) break;
  }
}

// An f32 output of just over 64 MiB (gmm/tiled and tgmm/tiled write one
// past that around the cache, with non-temporal stores): f32 and bf16
// inputs, the default configuration with each micro-kernel this CPU runs;
// existing_out (which is read, so not streamed) too.
TEST_P(GroupedMatmulTest, OutputsLargerThanTheCache) {
  const int64_t out_bytes = (int64_t{64} << 20) + 1;
  const bool gmm = kernel_->op() == "gmm";
  const std::vector<NamedValues> configs = MicroConfigs(*kernel_);
  constexpr int64_t k = 16, n = 512;
  // gmm: out [m, n]; tgmm: out [groups, k, n] with 2 rows a group.
  const int64_t groups = gmm ? 7 : out_bytes / (k * n * 4) + 1;
  const int64_t m = gmm ? out_bytes / (n * 4) + 1 : 2 * groups;
  Tally tally;
  for (DType in : {DType::kF32, DType::kBF16}) {
    for (bool existing : {false, true}) {
      if (existing && !gmm) continue;
      Case c;
      c.values = {{"m", absl::StrCat(m)}, {"k", absl::StrCat(k)}, {"n", absl::StrCat(n)},
                  {"groups", absl::StrCat(groups)}};
      c.options.dtypes["lhs"] = in;
      if (existing) c.options.with.insert("existing_out");
      c.options.partition = Partition::kRandom;
      c.options.seed = 7;
      c.configs = configs;
      CheckKernel(*kernel_, c, tally);
      if (HasFailure()) return;
    }
  }
  EXPECT_EQ(tally.refused, 0);
  EXPECT_GT(tally.runs, 0);  // a configuration its check accepts ran
  std::cout << kernel_->name() << ": outputs of " << out_bytes / (1 << 20) << " MiB, " << tally.runs
            << " checked runs\n";
}

// Every input finite, but products near FLT_MAX whose float sums overflow
// (to infinities, and to NaN where opposite infinities meet): a kernel that
// knows from its inputs that no output can be non-finite (tgmm/onednn skips
// its output scan so) must see that here it can, and come out as the
// reference's double sums rounded once (infinities where they overflow).
// Every product is 0 or +-2.25e38, so every float partial sum is exact
// until it overflows, in any order (a GPU's or cuBLAS's as well as the
// reference's): a finite result cannot depend on the order. f32 in and
// out, then bf16 in and out (the values are exact in both).
TEST_P(GroupedMatmulTest, FiniteInputsWhoseSumsOverflow) {
  const bool gmm = kernel_->op() == "gmm";
  constexpr int64_t m = 12, k = 5, n = 7;
  const std::vector<int32_t> sizes = {4, 0, 7};  // row 11 past the groups
  // 1.5e19 rounds to 0x5f50 in bf16's top bits: the same in both dtypes.
  auto big = [](int64_t i) {
    uint32_t bits = 0x5f500000u | (i % 3 == 0 ? 0x80000000u : 0u);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return i % 4 == 1 ? 0.0f : f;
  };
  std::vector<float> lhs(m * k), rhs((gmm ? 3 * k : m) * n);
  for (size_t i = 0; i < lhs.size(); ++i) lhs[i] = big(static_cast<int64_t>(i));
  for (size_t i = 0; i < rhs.size(); ++i) rhs[i] = big(static_cast<int64_t>(i * 7 + 2));
  // The values as bf16: their top halves.
  auto bf16 = [](std::vector<int64_t> shape, const std::vector<float>& values) {
    Tensor t(DType::kBF16, std::move(shape));
    for (size_t i = 0; i < values.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &values[i], sizeof bits);
      t.data_as<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
    }
    return t;
  };
  const std::vector<int64_t> lhs_shape = gmm ? std::vector<int64_t>{m, k} : std::vector<int64_t>{k, m};
  const std::vector<int64_t> rhs_shape = gmm ? std::vector<int64_t>{3, k, n} : std::vector<int64_t>{m, n};
  Tally tally;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Case c;
    c.values = {{"m", absl::StrCat(m)}, {"k", absl::StrCat(k)}, {"n", absl::StrCat(n)}};
    c.options.inputs["group_sizes"] = I32(sizes);
    c.options.inputs["lhs"] = dtype == DType::kF32 ? F32(lhs_shape, lhs) : bf16(lhs_shape, lhs);
    c.options.inputs["rhs"] = dtype == DType::kF32 ? F32(rhs_shape, rhs) : bf16(rhs_shape, rhs);
    c.options.dtypes["out"] = dtype;
    CheckKernel(*kernel_, c, tally, /*max_configs=*/32);
  }
  EXPECT_EQ(tally.refused, 0);
  EXPECT_GT(tally.runs, 0);
}

// A bf16 out is each float accumulator rounded once, as FloatToBf16 rounds
// (to nearest, ties to even), to the bit. With one product per output
// (gmm's k = 1; tgmm's groups of one row) every accumulator is the float
// product lhs x rhs, so every bit of out is known: values at, below and
// above rounding ties with odd and even last bits, the largest finite
// (which rounds to infinity; times 2 and more it overflows, and out is the
// infinity of the exact product), subnormals, both signs; rhs powers of
// two from 1 to 2^7 (no product underflows: a micro-kernel that multiplies
// and then adds makes +0 of an underflow, one that fuses them -0). Rows of 37 columns (no vector width divides them), then
// an out past 64 MiB (written around the cache), with each micro-kernel.
TEST_P(GroupedMatmulTest, Bf16OutIsEachAccumulatorRoundedOnce) {
  const bool gmm = kernel_->op() == "gmm";
  const uint32_t kBits[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x3f800000u, 0x7f7fffffu,
                            0x7f7f8000u, 0x7f7e8000u, 0x00000001u, 0x00408000u, 0x00418000u, 0x007fffffu,
                            0x40490fdbu, 0x3eaaaaabu, 0x4b7fffffu, 0x01018000u};
  auto value = [&](int64_t i) {
    uint32_t bits = kBits[i % 16] | (i % 3 == 1 ? 0x80000000u : 0u);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  auto scale = [](int64_t j) { return std::ldexp(1.0f, static_cast<int>(j % 8)) * (j % 5 == 2 ? -1.0f : 1.0f); };
  const std::vector<NamedValues> configs = MicroConfigs(*kernel_);
  Tally tally;
  int64_t wrong = 0, checked = 0;
  // gmm: m rows of one column, one group; out[i][j] = lhs[i] * rhs[j].
  // tgmm: groups of one row; out[g][i][j] = lhs[i][g] * rhs[g][j].
  for (const bool large : {false, true}) {
    const int64_t rows = large ? (gmm ? 65537 : 1024) : 41, n = large ? 512 : 37;
    const int64_t groups = gmm ? 1 : large ? (int64_t{64} << 20) / (2 * rows * n) + 1 : 16;
    const int64_t m = gmm ? rows : groups;
    std::vector<float> lhs(m * (gmm ? 1 : rows)), rhs((gmm ? 1 : m) * n);
    for (size_t i = 0; i < lhs.size(); ++i) lhs[i] = value(static_cast<int64_t>(i));
    for (size_t j = 0; j < rhs.size(); ++j) rhs[j] = scale(static_cast<int64_t>(j));
    Case c;
    c.values = {{"m", absl::StrCat(m)}, {"k", absl::StrCat(gmm ? 1 : rows)}, {"n", absl::StrCat(n)}};
    c.options.inputs["group_sizes"] = I32(std::vector<int32_t>(groups, gmm ? static_cast<int32_t>(m) : 1));
    c.options.inputs["lhs"] = gmm ? F32({m, 1}, lhs) : F32({rows, m}, lhs);
    c.options.inputs["rhs"] = gmm ? F32({1, 1, n}, rhs) : F32({m, n}, rhs);
    c.options.dtypes["out"] = DType::kBF16;
    c.configs = configs;
    CheckKernel(*kernel_, c, tally, 0, [&](int, size_t, const Problem& problem) {
      const Tensor* out = Output(problem, "out");
      ASSERT_NE(out, nullptr);
      const uint16_t* got = out->data_as<uint16_t>();
      for (int64_t e = 0; e < out->numel(); ++e) {
        // gmm: (i, j) = (e / n, e % n); tgmm: (g, i, j) = (e / (rows n), e / n % rows, e % n).
        const int64_t j = e % n;
        const float product = (gmm ? lhs[e / n] * rhs[j] : lhs[(e / n % rows) * m + e / (rows * n)] * rhs[e / (rows * n) * n + j]);
        ++checked;
        if (got[e] != FloatToBf16(product) && wrong++ < 5) {
          ADD_FAILURE() << kernel_->name() << " out element " << e << " (of " << out->numel() << "): 0x" << std::hex
                        << got[e] << ", FloatToBf16(" << product << ") is 0x" << FloatToBf16(product) << std::dec;
        }
      }
    });
    if (HasFailure()) break;
  }
  EXPECT_EQ(wrong, 0) << "of " << checked;
  EXPECT_EQ(tally.refused, 0);
  EXPECT_GT(tally.runs, 0);
}

INSTANTIATE_TEST_SUITE_P(GroupedOps, GroupedMatmulTest, ::testing::ValuesIn(GroupedKernels()), TestName);

// What cuBLAS got wrong or refused on an H100 (bf16 in with f32 out in one
// grouped call: "not supported"; bf16 out with existing_out per group: two
// bf16 steps off) is refused by gmm/cuda_cublas's check, which needs no
// GPU; the other mode takes each.
TEST(GmmCublasTest, RefusesWhatCublasGotWrongOnAGpu) {
  std::shared_ptr<const Kernel> kernel;
  for (const auto& k : TheRegistry().Kernels("gmm")) {
    if (k->name() == "gmm/cuda_cublas") kernel = k;
  }
  if (kernel == nullptr) GTEST_SKIP() << "gmm/cuda_cublas is not built here (its plugin needs nvcc)";
  absl::StatusOr<Values> values = kernel->op_info().ParseValues({{"m", "64"}, {"k", "8"}, {"n", "16"}, {"groups", "4"}});
  ASSERT_TRUE(values.ok()) << values.status();
  auto check = [&](DType out, bool existing, const char* mode) {
    ProblemOptions options;
    options.dtypes = {{"lhs", DType::kBF16}, {"out", out}};
    if (existing) options.with.insert("existing_out");
    ShapeArgs shape;
    absl::Status s = MakeShapeArgs(kernel->op_info(), *values, options, &shape);
    if (!s.ok()) return s;
    absl::StatusOr<Config> config = kernel->ParseConfig({{"mode", mode}});
    return config.ok() ? kernel->Check(*config, *shape.args()) : config.status();
  };
  EXPECT_THAT(std::string(check(DType::kF32, false, "grouped").message()),
              HasSubstr("mode=grouped (cublasGemmGroupedBatchedEx) takes bf16 inputs with a bf16 out only"));
  EXPECT_TRUE(check(DType::kF32, false, "per_group").ok());
  EXPECT_THAT(std::string(check(DType::kBF16, true, "per_group").message()),
              HasSubstr("mode=per_group rounds a bf16 out twice with existing_out"));
  EXPECT_TRUE(check(DType::kBF16, true, "grouped").ok());
  // Rows off 16 bytes (k=7): neither mode takes a bf16 out with existing_out.
  values = kernel->op_info().ParseValues({{"m", "64"}, {"k", "7"}, {"n", "16"}, {"groups", "4"}});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(std::string(check(DType::kBF16, true, "grouped").message()),
              HasSubstr("needs rows on 16 bytes (k and n multiples of 8)"));
  EXPECT_TRUE(check(DType::kBF16, false, "grouped").ok());
}

// ---- gmm and tgmm: validation -----------------------------------------------------

// Problem::Make's refusal of `values` and `inputs` for `op`: InvalidArgument,
// one line.
std::string Refusal(const std::string& op_name, const NamedValues& values, std::map<std::string, Tensor> inputs) {
  std::shared_ptr<const Op> op = *TheRegistry().GetOp(op_name);
  absl::StatusOr<Values> parsed = op->ParseValues(values);
  if (!parsed.ok()) return std::string(parsed.status().message());
  ProblemOptions options;
  options.inputs = std::move(inputs);
  absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(op, nullptr, *parsed, options);
  EXPECT_EQ(problem.status().code(), absl::StatusCode::kInvalidArgument) << problem.status();
  const std::string message(problem.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  return message;
}

TEST(GmmValidationTest, EachRefusalIsOneClearLine) {
  const NamedValues dims = {{"m", "8"}, {"k", "4"}, {"n", "6"}};
  EXPECT_THAT(Refusal("gmm", dims, {{"group_sizes", I32({2, -1, 3})}}), HasSubstr("group_sizes[1]=-1 is negative"));
  EXPECT_THAT(Refusal("gmm", dims, {{"group_sizes", I32({5, 5})}}),
              HasSubstr("group_sizes[0..1] sum to 10, more than m=8 rows"));
  EXPECT_THAT(Refusal("tgmm", dims, {{"group_sizes", I32({9})}}),
              HasSubstr("group_sizes[0..0] sum to 9, more than m=8 rows"));
  for (const char* op : {"gmm", "tgmm"}) {
    NamedValues offset = dims;
    offset.insert(offset.end(), {{"groups", "4"}, {"local_groups", "2"}, {"group_offset", "3"}});
    EXPECT_THAT(Refusal(op, offset, {}),
                HasSubstr(absl::StrCat(op, ": group_offset=3 + local_groups=2 exceeds groups=4")));
    offset = dims;
    offset.insert(offset.end(), {{"groups", "4"}, {"local_groups", "5"}});
    EXPECT_THAT(Refusal(op, offset, {}), HasSubstr("group_offset=0 + local_groups=5 exceeds groups=4"));
  }
  // rhs [G, k, n] given where transpose_rhs=1 makes it [G, n, k], n != k.
  NamedValues transposed = dims;
  transposed.emplace_back("transpose_rhs", "1");
  Tensor rhs(DType::kF32, {2, 4, 6});
  EXPECT_THAT(Refusal("gmm", transposed, {{"rhs", rhs}}),
              HasSubstr("input 'rhs' has shape [2, 4, 6] but n=6 (rhs is [local_groups,n,k] with transpose_rhs=1)"));
  // ... and the converse.
  Tensor rhs_t(DType::kF32, {2, 6, 4});
  EXPECT_THAT(Refusal("gmm", dims, {{"rhs", rhs_t}}),
              HasSubstr("input 'rhs' has shape [2, 6, 4] but k=4 (rhs is [local_groups,k,n] with transpose_rhs=0)"));
  // Inputs whose dtypes must agree.
  Tensor lhs(DType::kF32, {8, 4});
  Tensor rhs_bf16(DType::kBF16, {2, 4, 6});
  EXPECT_THAT(Refusal("gmm", {}, {{"lhs", lhs}, {"rhs", rhs_bf16}, {"group_sizes", I32({3, 5})}}),
              HasSubstr("input 'rhs' holds bf16 but must have the dtype of 'lhs' (f32)"));
  // Validate on arguments built by hand (no Problem): the transposed shape
  // is checked there too.
  std::shared_ptr<const Op> op = *TheRegistry().GetOp("gmm");
  Tensor sizes = I32({3, 5}), out(DType::kF32, {8, 6});
  DLTensor* tensors[] = {lhs.dl(), rhs.dl(), sizes.dl(), out.dl(), nullptr};
  int64_t values[] = {8, 4, 6, 2, 2};  // m, k, n, groups, local_groups
  kreg_scalar attrs[3] = {};            // transpose_rhs, group_offset, constant_weights
  kreg_args args{};
  args.struct_size = sizeof args;
  args.tensors = tensors;
  args.num_tensors = 5;
  args.dims = values;
  args.num_dims = 5;
  args.attrs = attrs;
  args.num_attrs = 3;
  EXPECT_TRUE(op->Validate(args).ok()) << op->Validate(args);
  attrs[0].i = 1;
  EXPECT_THAT(std::string(op->Validate(args).message()),
              HasSubstr("rhs has shape [2, 4, 6], expected [2, 6, 4] "
                        "(rhs is [local_groups,n,k] with transpose_rhs=1)"));
  tensors[1] = rhs_t.dl();
  EXPECT_TRUE(op->Validate(args).ok()) << op->Validate(args);
  attrs[1].i = 1;
  EXPECT_THAT(std::string(op->Validate(args).message()), HasSubstr("group_offset=1 + local_groups=2 exceeds groups=2"));
}

}  // namespace
}  // namespace kreg::conformance
