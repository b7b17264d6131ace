// Every registered topk kernel, at every legal point of its parameter grid,
// matches the reference exactly (values bit for bit, indices too) on random
// and adversarial inputs, in both dtypes and both directions. The reference
// itself is pinned on hand-written rows first.
#include <cmath>
#include <cstring>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/ops.h"
#include "kreg/registry.h"
#include "kreg/topk.h"

namespace kreg {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

const Registry& TheRegistry() {
  static const Registry* registry = [] {
    LoadOptions options;
    options.plugin_paths = {KREG_PLUGIN_DIR};
    options.use_env = false;
    options.use_default_dirs = false;
    absl::StatusOr<std::unique_ptr<Registry>> r = Registry::Load(options);
    if (!r.ok() || !(*r)->refusals().empty()) std::abort();
    return r->release();
  }();
  return *registry;
}

// Every configuration of a kernel's grid: the product of its int and choice
// values; list parameters take their default, and a few increasing lists
// drawn from their candidates (the kernel's check rejects what is illegal).
std::vector<Config> Grid(const Kernel& kernel) {
  std::vector<Config> grid = {kernel.DefaultConfig()};
  for (size_t i = 0; i < kernel.num_params(); ++i) {
    const kreg_param_desc& p = kernel.param(i);
    std::vector<ParamValue> options;
    if (p.kind == KREG_PARAM_INT) {
      for (size_t j = 0; j < p.num_values; ++j) options.push_back({p.values[j], {}});
    } else if (p.kind == KREG_PARAM_CHOICE) {
      for (size_t j = 0; j < p.num_choices; ++j) options.push_back({static_cast<int64_t>(j), {}});
    } else {
      options.push_back({0, std::vector<int64_t>(p.default_list, p.default_list + p.default_list_len)});
      for (size_t j = 0; j < p.num_values; j += 2) {
        options.push_back({0, {p.values[j]}});
        if (j + 2 < p.num_values) options.push_back({0, {p.values[j], p.values[j + 2]}});
      }
    }
    std::vector<Config> next;
    for (const Config& c : grid) {
      for (const ParamValue& v : options) {
        std::vector<ParamValue> values = c.values();
        values[i] = v;
        next.emplace_back(std::move(values));
      }
    }
    grid = std::move(next);
  }
  return grid;
}

struct Case {
  Dims dims;
  DType dtype = DType::kF32;
  Dist dist = Dist::kNormal;
  std::map<std::string, Tensor> inputs;
};

// Runs every available topk kernel over its grid on `c` (on big problems an
// evenly spaced sample of at most `max_configs` points, the default always
// among them); returns how many (kernel, config) runs were checked.
int CheckAllKernels(const Case& c, size_t max_configs = 1000) {
  ProblemOptions options;
  options.dtype = c.dtype;
  options.dist = c.dist;
  options.inputs = c.inputs;
  int checked = 0;
  for (uint64_t seed : {1, 2}) {
    options.seed = seed;
    absl::StatusOr<std::unique_ptr<Problem>> problem = FindOp("topk")->make_problem(c.dims, options);
    EXPECT_TRUE(problem.ok()) << problem.status();
    if (!problem.ok()) return 0;
    for (const auto& kernel : TheRegistry().Kernels("topk")) {
      if (!kernel->available()) continue;
      std::vector<Config> grid = Grid(*kernel), configs = {kernel->DefaultConfig()};
      for (size_t g = 0; g < grid.size(); g += std::max<size_t>(1, grid.size() / max_configs)) {
        configs.push_back(grid[g]);
      }
      for (const Config& config : configs) {
        if (!kernel->Check(config, (*problem)->args()).ok()) continue;
        SCOPED_TRACE(absl::StrCat(kernel->name(), " [", kernel->ConfigString(config), "] ",
                                  DimsString(c.dims), " ", DTypeName(c.dtype), " ", DistName(c.dist),
                                  " seed ", seed));
        (*problem)->PoisonOutputs();
        absl::Status run = kernel->Run(config, (*problem)->args());
        EXPECT_TRUE(run.ok()) << run;
        absl::Status check = (*problem)->CheckOutputs();
        EXPECT_TRUE(check.ok()) << check;
        ++checked;
      }
    }
  }
  return checked;
}

void CheckBothDtypesAndDirections(Dims dims, Dist dist, size_t max_configs = 1000) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t largest : {1, 0}) {
      Dims d = dims;
      d.emplace_back("largest", largest);
      EXPECT_GT(CheckAllKernels({d, dtype, dist, {}}, max_configs), 0);
    }
  }
}

Tensor Row(std::vector<float> values) {
  Tensor t(DType::kF32, {1, static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

// ---- The reference, pinned ---------------------------------------------

std::vector<int32_t> ReferenceIndices(const Tensor& input, int64_t k, bool largest) {
  Tensor values(input.dtype(), {input.dim(0), k});
  Tensor indices(DType::kI32, {input.dim(0), k});
  kreg_topk_args args{sizeof args, input.dl(), k, largest, nullptr, nullptr, values.dl(), indices.dl(), nullptr};
  EXPECT_TRUE(ValidateTopK(args).ok());
  ReferenceTopK(args);
  return {indices.data_as<int32_t>(), indices.data_as<int32_t>() + indices.numel()};
}

TEST(TopKReferenceTest, NanAboveInfBothSignsTiesByIndexZerosEqual) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor row = Row({1.0f, -nan, kInf, -0.0f, nan, 0.0f, -kInf, 1.0f});
  EXPECT_THAT(ReferenceIndices(row, 8, true), ::testing::ElementsAre(1, 4, 2, 0, 7, 3, 5, 6));
  EXPECT_THAT(ReferenceIndices(row, 8, false), ::testing::ElementsAre(6, 3, 5, 0, 7, 2, 1, 4));
}

TEST(TopKReferenceTest, RaggedRowsPadWithMinusOneAndTheWorstValue) {
  Tensor input = Row({5, 4, 3, 2, 1});
  Tensor starts(DType::kI32, {1}), ends(DType::kI32, {1});
  starts.data_as<int32_t>()[0] = 3;
  ends.data_as<int32_t>()[0] = 5;
  for (bool largest : {true, false}) {
    Tensor values(DType::kF32, {1, 3}), indices(DType::kI32, {1, 3});
    kreg_topk_args args{sizeof args, input.dl(), 3, largest, starts.dl(), ends.dl(), values.dl(), indices.dl(), nullptr};
    ASSERT_TRUE(ValidateTopK(args).ok());
    ReferenceTopK(args);
    EXPECT_EQ(indices.data_as<int32_t>()[0], largest ? 3 : 4);
    EXPECT_EQ(indices.data_as<int32_t>()[2], -1);
    EXPECT_EQ(values.data_as<float>()[2], largest ? -kInf : kInf);
  }
}

TEST(TopKReferenceTest, ValidationNamesTheProblem) {
  Tensor input = Row({1, 2, 3});
  Tensor values(DType::kF32, {1, 2}), indices(DType::kI32, {1, 2}), wrong(DType::kF32, {1, 2});
  kreg_topk_args args{sizeof args, input.dl(), 2, 1, nullptr, nullptr, values.dl(), indices.dl(), nullptr};
  EXPECT_TRUE(ValidateTopK(args).ok());
  args.indices = wrong.dl();
  EXPECT_THAT(std::string(ValidateTopK(args).message()), ::testing::HasSubstr("indices must be i32"));
  args.indices = indices.dl();
  args.k = -1;
  EXPECT_THAT(std::string(ValidateTopK(args).message()), ::testing::HasSubstr("k=-1 is negative"));
  Tensor ends(DType::kI32, {1});
  ends.data_as<int32_t>()[0] = 4;
  args.k = 2;
  args.row_ends = ends.dl();
  EXPECT_THAT(std::string(ValidateTopK(args).message()), ::testing::HasSubstr("row 0 has range [0, 4)"));
}

// ---- Every kernel against the reference ---------------------------------

TEST(TopKConformanceTest, RandomShapesWholeGrid) {
  for (Dims dims : std::vector<Dims>{{{"batch", 3}, {"n", 100}, {"k", 7}},
                                     {{"batch", 5}, {"n", 1000}, {"k", 64}},
                                     {{"batch", 2}, {"n", 4099}, {"k", 100}}}) {
    CheckBothDtypesAndDirections(dims, Dist::kNormal);
  }
}

TEST(TopKConformanceTest, LargerShapesSampledGrid) {
  // n=70000 with batch 1 also takes the path that cuts one row across threads.
  for (Dims dims : std::vector<Dims>{{{"batch", 2}, {"n", 3000}, {"k", 1000}},
                                     {{"batch", 1}, {"n", 70000}, {"k", 33}}}) {
    CheckBothDtypesAndDirections(dims, Dist::kNormal, 8);
  }
}

TEST(TopKConformanceTest, KEqualsOneAndKEqualsN) {
  CheckBothDtypesAndDirections({{"batch", 4}, {"n", 257}, {"k", 1}}, Dist::kUniform);
  CheckBothDtypesAndDirections({{"batch", 4}, {"n", 257}, {"k", 257}}, Dist::kUniform);
}

TEST(TopKConformanceTest, TinyAndEmptyShapes) {
  CheckBothDtypesAndDirections({{"batch", 0}, {"n", 10}, {"k", 3}}, Dist::kNormal);
  CheckBothDtypesAndDirections({{"batch", 3}, {"n", 0}, {"k", 0}}, Dist::kNormal);
  CheckBothDtypesAndDirections({{"batch", 3}, {"n", 10}, {"k", 0}}, Dist::kNormal);
  CheckBothDtypesAndDirections({{"batch", 1}, {"n", 1}, {"k", 1}}, Dist::kNormal);
}

TEST(TopKConformanceTest, EveryBitPatternNanInfZerosSubnormals) {
  CheckBothDtypesAndDirections({{"batch", 6}, {"n", 2000}, {"k", 50}}, Dist::kBits);
  CheckBothDtypesAndDirections({{"batch", 3}, {"n", 300}, {"k", 300}}, Dist::kBits);
}

TEST(TopKConformanceTest, TiesEverywhere) {
  CheckBothDtypesAndDirections({{"batch", 4}, {"n", 5000}, {"k", 300}}, Dist::kTies);
  CheckBothDtypesAndDirections({{"batch", 4}, {"n", 100}, {"k", 100}}, Dist::kTies);
}

TEST(TopKConformanceTest, AllEqualRows) {
  for (float v : {0.0f, -0.0f, 1.5f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    Case c{{{"k", 40}}, DType::kF32, Dist::kNormal, {}};
    Tensor input(DType::kF32, {3, 1000});
    for (int64_t i = 0; i < input.numel(); ++i) input.data_as<float>()[i] = v;
    c.inputs["input"] = input;
    EXPECT_GT(CheckAllKernels(c), 0);
    c.dims.emplace_back("largest", 0);
    EXPECT_GT(CheckAllKernels(c), 0);
  }
}

TEST(TopKConformanceTest, NarrowRangeRowsShareTheirHighBits) {
  // Thousands of distinct values within a few ulps of 1: one radix bucket.
  Tensor input(DType::kF32, {2, 50000});
  for (int64_t i = 0; i < input.numel(); ++i) {
    uint32_t bits = 0x3f800000u + static_cast<uint32_t>((i * 7919) % 20000);
    std::memcpy(&input.data_as<float>()[i], &bits, 4);
  }
  Case c{{{"k", 5000}}, DType::kF32, Dist::kNormal, {{"input", input}}};
  EXPECT_GT(CheckAllKernels(c, 8), 0);
  c.dims.emplace_back("largest", 0);
  EXPECT_GT(CheckAllKernels(c, 8), 0);
}

// Runs one kernel with `params` on `input`; checks it against the reference
// and returns the per-row stats.
std::vector<int32_t> RunChecked(const std::string& name, const std::vector<std::pair<std::string, std::string>>& params,
                                const Tensor& input, int64_t k, bool largest = true) {
  std::shared_ptr<const Kernel> kernel = *TheRegistry().Get(name);
  if (!kernel->available()) return {};
  absl::StatusOr<Config> config = kernel->ParseConfig(params);
  EXPECT_TRUE(config.ok()) << config.status();
  ProblemOptions options;
  options.inputs["input"] = input;
  std::unique_ptr<Problem> problem =
      *FindOp("topk")->make_problem({{"k", k}, {"largest", largest ? 1 : 0}}, options);
  problem->PoisonOutputs();
  EXPECT_TRUE(kernel->Run(*config, problem->args()).ok());
  EXPECT_TRUE(problem->CheckOutputs().ok()) << problem->CheckOutputs();
  const Tensor* stats = problem->outputs()[2].second;
  return {stats->data_as<int32_t>(), stats->data_as<int32_t>() + stats->numel()};
}

TEST(TopKRadixTest, StaysExactWhenTheThresholdBucketOverflowsTheBuffer) {
  // 50000 distinct values a few ulps apart share every first-pass bucket bit;
  // the buffer holds 256. The seed kernel drops the overflow; radix refines.
  Tensor input(DType::kF32, {1, 50000});
  for (int64_t i = 0; i < input.numel(); ++i) {
    uint32_t bits = 0x3f800000u + static_cast<uint32_t>((i * 7919) % 50000);
    std::memcpy(&input.data_as<float>()[i], &bits, 4);
  }
  for (const char* first_bits : {"8", "12"}) {
    for (const char* round_bits : {"4", "8"}) {
      for (int64_t k : {1, 300, 20000}) {
        SCOPED_TRACE(absl::StrCat(first_bits, " ", round_bits, " ", k));
        RunChecked("topk/radix", {{"first_bits", first_bits}, {"round_bits", round_bits}, {"capacity", "256"}},
                   input, k);
        RunChecked("topk/radix", {{"first_bits", first_bits}, {"round_bits", round_bits}, {"capacity", "256"}},
                   input, k, false);
      }
    }
  }
}

TEST(TopKBlockwiseTest, ReportsTheDepthEachRowStoppedAt) {
  Tensor normal(DType::kF32, {4, 201088});
  FillRandom(normal, Dist::kNormal, 9);
  for (int32_t depth : RunChecked("topk/blockwise", {{"num_blocks", "128"}, {"m_schedule", "5,8,12"}}, normal, 64)) {
    EXPECT_EQ(depth, 4);  // top-4 of 128 blocks nearly always holds the top 64
  }
  // The seed's adversary: all winners in column stride 128, so in one block;
  // no depth below k suffices and the row falls back to the whole range.
  Tensor worst(DType::kF32, {2, 128 * 300});
  for (int64_t i = 0; i < worst.numel(); ++i) worst.data_as<float>()[i] = (i % 128 == 0) ? 1.0f : 0.0f;
  for (int32_t depth : RunChecked("topk/blockwise", {{"num_blocks", "128"}}, worst, 64)) {
    EXPECT_EQ(depth, 64);
  }
}

TEST(TopKBlockwiseTest, TiesPushedDownKeepTheirColumnOrder) {
  // 16 blocks; block 0 holds columns 0, 16 and 32. Inserting 9 at column 32
  // pushes (5, col 0) down onto the tied (5, col 16): the earlier column
  // must stay ahead, or the row stops early with column 0 lost.
  Tensor input(DType::kF32, {1, 48});
  for (int c : {0, 1, 2, 16}) input.data_as<float>()[c] = 5.0f;
  input.data_as<float>()[32] = 9.0f;
  RunChecked("topk/blockwise", {{"num_blocks", "16"}, {"m_schedule", "2"}}, input, 3);
  // The same on many small rows full of ties, at every block count.
  Tensor ties(DType::kF32, {64, 300});
  FillRandom(ties, Dist::kTies, 4);
  for (const char* blocks : {"16", "32", "64"}) {
    for (const char* schedule : {"2", "3", "2,4", "5,8,12"}) {
      SCOPED_TRACE(absl::StrCat(blocks, " ", schedule));
      for (int64_t k : {2, 5, 20}) {
        RunChecked("topk/blockwise", {{"num_blocks", blocks}, {"m_schedule", schedule}}, ties, k);
        RunChecked("topk/blockwise", {{"num_blocks", blocks}, {"m_schedule", schedule}}, ties, k, false);
      }
    }
  }
}

TEST(TopKConformanceTest, AllWinnersInOneColumnStride) {
  // The blockwise seed's adversary: every 128th column holds the winners.
  Tensor input(DType::kF32, {2, 128 * 200});
  for (int64_t i = 0; i < input.numel(); ++i) input.data_as<float>()[i] = (i % 128 == 0) ? 1.0f : 0.0f;
  EXPECT_GT(CheckAllKernels({{{"k", 64}}, DType::kF32, Dist::kNormal, {{"input", input}}}), 0);
}

TEST(TopKConformanceTest, RaggedRows) {
  CheckBothDtypesAndDirections({{"batch", 40}, {"n", 500}, {"k", 20}, {"ragged", 1}}, Dist::kNormal);
  CheckBothDtypesAndDirections({{"batch", 40}, {"n", 64}, {"k", 64}, {"ragged", 1}}, Dist::kBits);
}

TEST(TopKConformanceTest, StridedInputRows) {
  // Rows 1000 elements apart, only the first 700 of each are the row.
  Tensor storage(DType::kF32, {4, 1000});
  FillRandom(storage, Dist::kNormal, 3);
  int64_t shape[2] = {4, 700}, strides[2] = {1000, 1};
  DLTensor input = *storage.dl();
  input.shape = shape;
  input.strides = strides;
  Tensor compact(DType::kF32, {4, 700});
  for (int r = 0; r < 4; ++r) {
    std::memcpy(compact.data_as<float>() + r * 700, storage.data_as<float>() + r * 1000, 700 * 4);
  }
  for (const auto& kernel : TheRegistry().Kernels("topk")) {
    if (!kernel->available()) continue;
    SCOPED_TRACE(kernel->name());
    Tensor values(DType::kF32, {4, 30}), indices(DType::kI32, {4, 30});
    kreg_topk_args args{sizeof args, &input, 30, 1, nullptr, nullptr, values.dl(), indices.dl(), nullptr};
    ASSERT_TRUE(kernel->Run(kernel->DefaultConfig(), &args).ok());
    Tensor ref_values(DType::kF32, {4, 30}), ref_indices(DType::kI32, {4, 30});
    kreg_topk_args ref{sizeof ref, compact.dl(), 30, 1, nullptr, nullptr, ref_values.dl(), ref_indices.dl(), nullptr};
    ReferenceTopK(ref);
    EXPECT_EQ(std::memcmp(indices.data(), ref_indices.data(), indices.nbytes()), 0);
    EXPECT_EQ(std::memcmp(values.data(), ref_values.data(), values.nbytes()), 0);
  }
}

TEST(TopKConformanceTest, EveryKernelIsCoveredOnThisMachineOrDeclaresWhyNot) {
  const auto kernels = TheRegistry().Kernels("topk");
  ASSERT_FALSE(kernels.empty());
  for (const auto& kernel : kernels) {
    if (!kernel->available()) {
      std::cout << kernel->name() << " skipped: needs " << IsaString(kernel->required_isa() & ~CpuIsa())
                << "\n";
    }
  }
  EXPECT_TRUE((*TheRegistry().Get("topk/sort"))->available());
}

}  // namespace
}  // namespace kreg
