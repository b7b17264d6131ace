// topk's conformance cases, compiled into tests/' conformance_test (see
// tests/conformance.h): the harness on topk's descriptor, the reference
// pinned on hand-written rows, topk inputs chosen to break particular
// kernels (every bit pattern, ties, ragged and all-equal rows, strided
// input), and device arguments.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/conformance.h"

namespace kreg::conformance {
namespace {

// ---- The harness on topk's descriptor ----------------------------------------------

TEST(TopKConformanceTest, EdgeCasesAreBuiltFromItsDescriptor) {
  std::shared_ptr<const Op> topk = *TheRegistry().GetOp("topk");
  std::vector<std::vector<int64_t>> shapes = EdgeShapes(*topk);
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(shapes[1], (std::vector<int64_t>{1, 1, 1}));
  EXPECT_NE(std::find(shapes.begin(), shapes.end(), std::vector<int64_t>{7, 33, 3}), shapes.end());
  EXPECT_EQ(DtypeChoices(*topk).size(), 2u);      // input f32 or bf16 (values follow it)
  EXPECT_EQ(AttrChoices(*topk).size(), 2u);       // largest 0 and 1
  EXPECT_EQ(OptionalSubsets(*topk).size(), 4u);   // row_starts, row_ends
}

// The harness's oracle is the tuner's measurement: a kernel computing the
// wrong answer is reported as such, never as ok.
TEST(ConformanceSuiteTest, TheCheckCatchesAWrongKernel) {
  Registry registry;
  std::vector<absl::Status> refused = registry.LoadPlugins(
      {std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so", std::string(KREG_TEST_PLUGIN_DIR) + "/faulty/test_faulty.so"});
  ASSERT_TRUE(refused.empty()) << refused[0];
  std::shared_ptr<const Kernel> faulty = *registry.Get("topk/faulty");
  std::shared_ptr<const Op> op = *registry.GetOp("topk");
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(op, registry.Reference("topk"), *op->ParseValues(Dims{{"batch", 3}, {"n", 50}, {"k", 5}}), {});
  ASSERT_TRUE(problem.ok()) << problem.status();
  MeasureOptions options;
  options.warmup = 0;
  options.reps = 1;
  Measurement ok = MeasureKernel(*faulty, *faulty->ParseConfig({{"mode", "ok"}}), {problem->get()}, options);
  EXPECT_EQ(ok.status, TrialStatus::kOk) << ok.error;
  Measurement wrong = MeasureKernel(*faulty, *faulty->ParseConfig({{"mode", "wrong"}}), {problem->get()}, options);
  EXPECT_EQ(wrong.status, TrialStatus::kWrongResult);
  EXPECT_THAT(wrong.error, HasSubstr("values[0, 0]"));
}


// Device arguments (KREG_ARGS_ON_DEVICE): their tensors must be CUDA
// tensors, the op's validator sees their shapes only (topk's reads
// row_starts on the host: here it must not touch the fake device pointers),
// and a CPU kernel refuses them.
TEST(DeviceArgsTest, AreValidatedForShapesAndRefusedByCpuKernels) {
  std::shared_ptr<const Op> op = *TheRegistry().GetOp("topk");
  ProblemOptions ragged;
  ragged.with = {"row_starts", "row_ends"};
  absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(
      op, TheRegistry().Reference("topk"), *op->ParseValues(Dims{{"batch", 3}, {"n", 50}, {"k", 5}}), ragged);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const kreg_args& host = *(*problem)->args();
  std::vector<DLTensor> tensors(host.num_tensors);
  std::vector<DLTensor*> pointers(host.num_tensors, nullptr);
  for (size_t i = 0; i < host.num_tensors; ++i) {
    if (host.tensors[i] == nullptr) continue;
    tensors[i] = *host.tensors[i];
    tensors[i].device = {kDLCUDA, 0};
    tensors[i].data = reinterpret_cast<void*>(uintptr_t{0x10});  // never to be read
    pointers[i] = &tensors[i];
  }
  kreg_args device = host;
  device.tensors = pointers.data();
  device.flags = KREG_ARGS_ON_DEVICE;
  EXPECT_TRUE(op->Validate(device).ok()) << op->Validate(device);
  EXPECT_EQ(*op->DataClass(device), "");

  kreg_args cpu_flags = device;  // CUDA tensors, not flagged
  cpu_flags.flags = 0;
  EXPECT_THAT(std::string(op->Validate(cpu_flags).message()), HasSubstr("input is not a CPU tensor"));
  kreg_args host_flagged = host;  // CPU tensors, flagged
  host_flagged.flags = KREG_ARGS_ON_DEVICE;
  EXPECT_THAT(std::string(op->Validate(host_flagged).message()), HasSubstr("input is not a CUDA tensor"));

  std::shared_ptr<const Kernel> heap = *TheRegistry().Get("topk/sort");
  const absl::Status refused = heap->Check(heap->DefaultConfig(), device);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("topk/sort runs on the CPU, not on a device"));
}


// ---- topk: every kernel on chosen inputs ---------------------------------------------

int CheckAllTopK(Case c, size_t max_configs = 0) { return CheckAll("topk", std::move(c), max_configs); }

NamedValues TopKDims(int64_t batch, int64_t n, int64_t k) {
  return {{"batch", absl::StrCat(batch)}, {"n", absl::StrCat(n)}, {"k", absl::StrCat(k)}};
}

void CheckBothDtypesAndDirections(const NamedValues& dims, Dist dist, size_t max_configs = 0,
                                  std::set<std::string> with = {}) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const char* largest : {"1", "0"}) {
      Case c;
      c.values = dims;
      c.values.emplace_back("largest", largest);
      c.options.dtypes["input"] = dtype;
      c.options.dist = dist;
      c.options.with = with;
      EXPECT_GT(CheckAllTopK(c, max_configs), 0);
    }
  }
}

Tensor Row(std::vector<float> values) {
  Tensor t(DType::kF32, {1, static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}


// Rows of floats as a [rows, len] tensor of dtype (bf16: each truncated).
Tensor Rows(DType dtype, const std::vector<std::vector<float>>& rows, bool negate = false) {
  const int64_t len = rows.empty() ? 0 : static_cast<int64_t>(rows[0].size());
  Tensor t(dtype, {static_cast<int64_t>(rows.size()), len});
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t i = 0; i < len; ++i) {
      const float x = negate ? -rows[r][i] : rows[r][i];
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      if (dtype == DType::kF32) {
        t.data_as<uint32_t>()[r * len + i] = bits;
      } else {
        t.data_as<uint16_t>()[r * len + i] = static_cast<uint16_t>(bits >> 16);
      }
    }
  }
  return t;
}

std::shared_ptr<const Op> TopK() { return *TheRegistry().GetOp("topk"); }

// A topk problem on the given inputs (dims from their shapes).
std::unique_ptr<Problem> TopKProblem(std::map<std::string, Tensor> inputs, int64_t k, bool largest) {
  ProblemOptions options;
  options.inputs = std::move(inputs);
  absl::StatusOr<Values> values =
      TopK()->ParseValues(NamedValues{{"k", absl::StrCat(k)}, {"largest", largest ? "1" : "0"}});
  EXPECT_TRUE(values.ok()) << values.status();
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(TopK(), TheRegistry().Reference("topk"), *values, options);
  EXPECT_TRUE(problem.ok()) << problem.status();
  return problem.ok() ? *std::move(problem) : nullptr;
}

// ---- The topk reference, pinned -----------------------------------------------------

// Runs topk/reference (through the registry) and returns the indices.
std::vector<int32_t> ReferenceIndices(const Tensor& input, int64_t k, bool largest) {
  std::unique_ptr<Problem> problem = TopKProblem({{"input", input}}, k, largest);
  if (problem == nullptr) return {};
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference("topk");
  EXPECT_TRUE(reference->Run(reference->DefaultConfig(), *problem->args()).ok());
  return Elements<int32_t>(*Output(*problem, "indices"));
}

TEST(TopKReferenceTest, NanAboveInfBothSignsTiesByIndexZerosEqual) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor row = Row({1.0f, -nan, kInf, -0.0f, nan, 0.0f, -kInf, 1.0f});
  EXPECT_THAT(ReferenceIndices(row, 8, true), ElementsAre(1, 4, 2, 0, 7, 3, 5, 6));
  EXPECT_THAT(ReferenceIndices(row, 8, false), ElementsAre(6, 3, 5, 0, 7, 2, 1, 4));
}

TEST(TopKReferenceTest, RaggedRowsPadWithMinusOneAndTheWorstValue) {
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference("topk");
  ASSERT_NE(reference, nullptr);
  for (bool largest : {true, false}) {
    std::unique_ptr<Problem> problem =
        TopKProblem({{"input", Row({5, 4, 3, 2, 1})}, {"row_starts", I32({3})}, {"row_ends", I32({5})}}, 3, largest);
    ASSERT_NE(problem, nullptr);
    ASSERT_TRUE(reference->Run(reference->DefaultConfig(), *problem->args()).ok());
    std::vector<int32_t> indices = Elements<int32_t>(*Output(*problem, "indices"));
    std::vector<float> values = Elements<float>(*Output(*problem, "values"));
    EXPECT_THAT(indices, ElementsAre(largest ? 3 : 4, largest ? 4 : 3, -1));
    EXPECT_THAT(values, ElementsAre(largest ? 2 : 1, largest ? 1 : 2, largest ? -kInf : kInf));
  }
}

TEST(TopKReferenceTest, ValidationNamesTheProblem) {
  // topk's order: input, row_starts, row_ends, values, indices, stats;
  // dims batch, n, k; attribute largest.
  const Op& op = *TopK();
  Tensor input = Row({1, 2, 3});
  Tensor values(DType::kF32, {1, 2}), indices(DType::kI32, {1, 2}), wrong(DType::kF32, {1, 2});
  DLTensor* tensors[] = {input.dl(), nullptr, nullptr, values.dl(), indices.dl(), nullptr};
  int64_t dims[] = {1, 3, 2};
  kreg_scalar attrs[1];
  attrs[0].i = 1;
  kreg_args args{};
  args.struct_size = sizeof args;
  args.tensors = tensors;
  args.num_tensors = 6;
  args.dims = dims;
  args.num_dims = 3;
  args.attrs = attrs;
  args.num_attrs = 1;
  EXPECT_TRUE(op.Validate(args).ok()) << op.Validate(args);
  tensors[4] = wrong.dl();
  EXPECT_THAT(std::string(op.Validate(args).message()), HasSubstr("indices must be i32"));
  tensors[4] = indices.dl();
  dims[2] = -1;
  EXPECT_THAT(std::string(op.Validate(args).message()), HasSubstr("k=-1 is negative"));
  dims[2] = 2;
  Tensor ends = I32({4});
  tensors[2] = ends.dl();
  EXPECT_THAT(std::string(op.Validate(args).message()), HasSubstr("row 0 has range [0, 4)"));
  // Problem::Make refuses what Validate refuses, before any kernel runs.
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(TopK(), nullptr, *op.ParseValues(TopKDims(4, 10, 11)), {});
  EXPECT_EQ(problem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(problem.status().message()), HasSubstr("k=11 exceeds the row length n=10"));
}

// ---- topk: every kernel against the reference ---------------------------------------

TEST(TopKConformanceTest, RandomShapesWholeGrid) {
  for (const NamedValues& dims : {TopKDims(3, 100, 7), TopKDims(5, 1000, 64), TopKDims(2, 4099, 100)}) {
    CheckBothDtypesAndDirections(dims, Dist::kNormal, /*max_configs=*/SIZE_MAX);
  }
}

TEST(TopKConformanceTest, LargerShapesSampledGrid) {
  for (const NamedValues& dims : {TopKDims(2, 3000, 1000), TopKDims(1, 70000, 33)}) {
    CheckBothDtypesAndDirections(dims, Dist::kNormal, 8);
  }
  // One row of two 2^18-column chunks or more is cut across threads (on 2
  // or more): chunk results merge exactly, NaN of both signs, infinities and
  // ties (every bf16 pattern recurs) included.
  CheckBothDtypesAndDirections(TopKDims(1, 600000, 40), Dist::kBits, 3);
  // Rows long enough that topk/heap seeds its heap from a prefix: ties (the
  // prefix's threshold is shared by many), ranges that start anywhere.
  CheckBothDtypesAndDirections(TopKDims(8, 70000, 33), Dist::kTies, 4, {"row_starts", "row_ends"});
}

TEST(TopKConformanceTest, KEqualsOneAndKEqualsN) {
  CheckBothDtypesAndDirections(TopKDims(4, 257, 1), Dist::kUniform);
  CheckBothDtypesAndDirections(TopKDims(4, 257, 257), Dist::kUniform);
}

TEST(TopKConformanceTest, TinyAndEmptyShapes) {
  CheckBothDtypesAndDirections(TopKDims(0, 10, 3), Dist::kNormal);
  CheckBothDtypesAndDirections(TopKDims(3, 0, 0), Dist::kNormal);
  CheckBothDtypesAndDirections(TopKDims(3, 10, 0), Dist::kNormal);
  CheckBothDtypesAndDirections(TopKDims(1, 1, 1), Dist::kNormal);
}

TEST(TopKConformanceTest, EveryBitPatternNanInfZerosSubnormals) {
  CheckBothDtypesAndDirections(TopKDims(6, 2000, 50), Dist::kBits, 64);
  CheckBothDtypesAndDirections(TopKDims(3, 300, 300), Dist::kBits);
  // Rows of many blocks for a small k: topk/blockmax bounds the k-th best by
  // its blocks' bests (a NaN best when largest, decided exactly when not).
  CheckBothDtypesAndDirections(TopKDims(6, 4000, 5), Dist::kBits, 64);
}

TEST(TopKConformanceTest, TiesEverywhere) {
  CheckBothDtypesAndDirections(TopKDims(4, 5000, 300), Dist::kTies, 64);
  CheckBothDtypesAndDirections(TopKDims(4, 100, 100), Dist::kTies);
  CheckBothDtypesAndDirections(TopKDims(4, 20000, 16), Dist::kTies, 64);  // many blocks, ties across them
}

TEST(TopKConformanceTest, RaggedRows) {
  CheckBothDtypesAndDirections(TopKDims(40, 500, 20), Dist::kNormal, 64, {"row_starts", "row_ends"});
  CheckBothDtypesAndDirections(TopKDims(40, 64, 64), Dist::kBits, 64, {"row_starts", "row_ends"});
  CheckBothDtypesAndDirections(TopKDims(9, 100, 30), Dist::kTies, 64, {"row_starts"});
  CheckBothDtypesAndDirections(TopKDims(9, 100, 30), Dist::kTies, 64, {"row_ends"});
}

TEST(TopKConformanceTest, AllEqualRows) {
  for (float v : {0.0f, -0.0f, 1.5f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(v);
    Tensor input(DType::kF32, {3, 1000});
    for (int64_t i = 0; i < input.numel(); ++i) input.data_as<float>()[i] = v;
    for (const char* largest : {"1", "0"}) {
      for (const char* k : {"40", "3"}) {  // 3: every block ties at the bound
        Case c;
        c.values = {{"k", k}, {"largest", largest}};
        c.options.inputs["input"] = input;
        EXPECT_GT(CheckAllTopK(c), 0);
      }
    }
  }
}

TEST(TopKConformanceTest, NarrowRangeRowsShareTheirHighBits) {
  // Thousands of distinct values within a few ulps of 1: one radix bucket.
  Tensor input(DType::kF32, {2, 50000});
  for (int64_t i = 0; i < input.numel(); ++i) {
    uint32_t bits = 0x3f800000u + static_cast<uint32_t>((i * 7919) % 20000);
    std::memcpy(&input.data_as<float>()[i], &bits, 4);
  }
  for (const char* largest : {"1", "0"}) {
    Case c;
    c.values = {{"k", "5000"}, {"largest", largest}};
    c.options.inputs["input"] = input;
    EXPECT_GT(CheckAllTopK(c, 8), 0);
  }
}

TEST(TopKConformanceTest, AllWinnersInOneColumnStride) {
  // The blockwise seed's adversary: every 128th column holds the winners.
  Tensor input(DType::kF32, {2, 128 * 200});
  for (int64_t i = 0; i < input.numel(); ++i) input.data_as<float>()[i] = (i % 128 == 0) ? 1.0f : 0.0f;
  Case c;
  c.values = {{"k", "64"}};
  c.options.inputs["input"] = input;
  EXPECT_GT(CheckAllTopK(c, 64), 0);
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
  // The reference's answer on the compact copy.
  std::unique_ptr<Problem> problem = TopKProblem({{"input", compact}}, 30, true);
  ASSERT_NE(problem, nullptr);
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference("topk");
  ASSERT_TRUE(reference->Run(reference->DefaultConfig(), *problem->args()).ok());
  const Tensor& want_values = *Output(*problem, "values");
  const Tensor& want_indices = *Output(*problem, "indices");
  int checked = 0;
  for (const auto& kernel : TheRegistry().Kernels("topk")) {
    // CPU kernels on the caller's strided rows (a device kernel's rows are
    // its DeviceCall's copies).
    if (!kernel->available() || kernel->device() != 0) continue;
    SCOPED_TRACE(kernel->name());
    Tensor values(DType::kF32, {4, 30}), indices(DType::kI32, {4, 30});
    DLTensor* tensors[] = {&input, nullptr, nullptr, values.dl(), indices.dl(), nullptr};
    const int64_t dims[] = {4, 700, 30};
    kreg_scalar attrs[1];
    attrs[0].i = 1;
    kreg_args args{};
    args.struct_size = sizeof args;
    args.tensors = tensors;
    args.num_tensors = 6;
    args.dims = dims;
    args.num_dims = 3;
    args.attrs = attrs;
    args.num_attrs = 1;
    absl::Status run = kernel->Run(kernel->DefaultConfig(), args);
    ASSERT_TRUE(run.ok()) << run;
    EXPECT_EQ(std::memcmp(indices.data(), want_indices.data(), indices.nbytes()), 0);
    EXPECT_EQ(std::memcmp(values.data(), want_values.data(), values.nbytes()), 0);
    ++checked;
  }
  EXPECT_GE(checked, 3);  // the reference, sort and radix at least
}

TEST(TopKConformanceTest, EveryKernelIsCoveredOnThisMachineOrDeclaresWhyNot) {
  const auto kernels = TheRegistry().Kernels("topk");
  const auto on_cpu = std::count_if(kernels.begin(), kernels.end(), [](const auto& k) { return k->device() == 0; });
  EXPECT_EQ(on_cpu, 6);
  for (const auto& kernel : kernels) {
    if (!Runs(*kernel)) std::cout << "skipped: " << Why(*kernel) << "\n";
  }
  EXPECT_TRUE((*TheRegistry().Get("topk/sort"))->available());
  EXPECT_TRUE((*TheRegistry().Get("topk/radix"))->available());
  EXPECT_TRUE((*TheRegistry().Get("topk/reference"))->available());
}

// ---- topk: kernel-specific inputs ---------------------------------------------------

// Runs one topk kernel with `params` on `input`, checks it against the
// reference and returns the per-row stats.
std::vector<int32_t> RunChecked(const std::string& name, const std::vector<std::pair<std::string, std::string>>& params,
                                const Tensor& input, int64_t k, bool largest = true) {
  std::shared_ptr<const Kernel> kernel = *TheRegistry().Get(name);
  absl::StatusOr<Config> config = kernel->ParseConfig(params);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return {};
  std::unique_ptr<Problem> problem = TopKProblem({{"input", input}}, k, largest);
  if (problem == nullptr) return {};
  EXPECT_TRUE(problem->ComputeReference().ok());
  problem->PoisonOutputs();
  absl::Status run = kernel->Run(*config, *problem->args());
  EXPECT_TRUE(run.ok()) << run;
  absl::Status check = problem->CheckOutputs();
  EXPECT_TRUE(check.ok()) << check;
  return Elements<int32_t>(*Output(*problem, "stats"));
}

TEST(TopKRadixTest, StaysExactWhenTheThresholdBucketOverflowsTheBuffer) {
  std::shared_ptr<const Kernel> radix = *TheRegistry().Get("topk/radix");
  if (!radix->available()) GTEST_SKIP() << Why(*radix);
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

TEST(TopKRadixTest, SampledThresholdStaysExactOnAdversarialLongRows) {
  std::shared_ptr<const Kernel> radix = *TheRegistry().Get("topk/radix");
  if (!radix->available()) GTEST_SKIP() << Why(*radix);
  // Rows long enough for radix's 1024-element sample (8 times it), each a
  // way the sample can misjudge the row: ties at the threshold, one value,
  // the special values, sorted rows, and winners exactly at the sampled
  // columns (the sample sees only them, so too few pass and the row falls
  // back to the whole-row histogram, as too many do). The last two put the
  // threshold where the pass's float comparison has its ends: among NaNs
  // (only NaN passes) and between -0 and the negative subnormals (the
  // smallest: -0's score is +0's).
  constexpr int64_t kRows = 9, kLen = 20000;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> rows(kRows * kLen);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const float specials[] = {nan, -nan, kInf, -kInf, 0.0f, -0.0f, 1.0f};
  for (int64_t i = 0; i < kLen; ++i) {
    rows[0 * kLen + i] = normal(rng);
    rows[1 * kLen + i] = 2.5f;
    rows[2 * kLen + i] = static_cast<float>(rng() % 3);
    rows[3 * kLen + i] = (rng() % 4 == 0) ? specials[rng() % 7] : normal(rng);
    rows[4 * kLen + i] = static_cast<float>(i);
    rows[5 * kLen + i] = -static_cast<float>(i);
    rows[6 * kLen + i] = normal(rng) - 10.0f;
    rows[7 * kLen + i] = (rng() % 5 == 0) ? (rng() % 2 ? nan : -nan) : normal(rng);
    const float tiny[] = {0.0f, -0.0f, -std::numeric_limits<float>::denorm_min(), -1e-39f, 1e-39f};
    rows[8 * kLen + i] = tiny[rng() % 5];
  }
  // radix.cc's SampledThreshold samples 64 runs of 16, run r from
  // r * step + (step - 16) / 2, step = len / 64.
  for (int64_t r = 0; r < 64; ++r) {
    for (int64_t j = 0; j < 16; ++j) rows[6 * kLen + r * (kLen / 64) + (kLen / 64 - 16) / 2 + j] = 10.0f + normal(rng);
  }
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Tensor input(dtype, {kRows, kLen});
    for (int64_t i = 0; i < input.numel(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &rows[i], 4);
      if (dtype == DType::kF32) {
        input.data_as<uint32_t>()[i] = bits;
      } else {
        input.data_as<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
    const Tensor starts = I32({0, 5, 0, 13, 0, 1, 0, 0, 3}),
                 ends = I32({20000, 19990, 20000, 20000, 17000, 20000, 20000, 20000, 19999});
    for (int64_t k : {1, 100, 2048, 5000}) {
      for (bool largest : {true, false}) {
        for (bool ranges : {false, true}) {
          for (const char* capacity : {"1024", "256"}) {
            SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " k=", k, " largest=", largest, " ranges=", ranges,
                                      " capacity=", capacity));
            std::map<std::string, Tensor> inputs = {{"input", input}};
            if (ranges) {
              inputs["row_starts"] = starts;
              inputs["row_ends"] = ends;
            }
            std::unique_ptr<Problem> problem = TopKProblem(inputs, k, largest);
            ASSERT_NE(problem, nullptr);
            ASSERT_TRUE(problem->ComputeReference().ok());
            problem->PoisonOutputs();
            absl::StatusOr<Config> config = radix->ParseConfig({{"capacity", capacity}});
            ASSERT_TRUE(config.ok()) << config.status();
            absl::Status run = radix->Run(*config, *problem->args());
            ASSERT_TRUE(run.ok()) << run;
            absl::Status check = problem->CheckOutputs();
            EXPECT_TRUE(check.ok()) << check;
          }
        }
      }
    }
  }
}

// Runs `kernel` with its defaults on one thread (the rows in order, so
// that each row carries what it leaves to the next) and checks it against
// the reference.
void CheckOnOneThread(const Kernel& kernel, std::map<std::string, Tensor> inputs, int64_t k, bool largest) {
  std::unique_ptr<Problem> problem = TopKProblem(std::move(inputs), k, largest);
  ASSERT_NE(problem, nullptr);
  ASSERT_TRUE(problem->ComputeReference().ok());
  problem->PoisonOutputs();
  RunOptions one_thread;
  one_thread.num_threads = 1;
  absl::Status run = kernel.Run(kernel.DefaultConfig(), *problem->args(), one_thread);
  ASSERT_TRUE(run.ok()) << run;
  absl::Status check = problem->CheckOutputs();
  EXPECT_TRUE(check.ok()) << check;
}

TEST(TopKRadixTest, CarriedThresholdStaysExactWhereTheNextRowDiffers) {
  std::shared_ptr<const Kernel> radix = *TheRegistry().Get("topk/radix");
  if (!radix->available()) GTEST_SKIP() << Why(*radix);
  // A long row leaves the next row of its length and start a threshold that
  // about k + a margin of a like row reach (radix.cc's Select). On one
  // thread the rows go in order, so each row here tries the one before's:
  // a normal row A, then A with its j best moved to the bottom, for j from
  // 0 to past the margin (the count passing steps down through k and the
  // margin's edge), then rows that are not like the one before: shifted
  // down (fewer than k pass), shifted up (more than the pass has room
  // for), one value, and A again. Negated for the smallest.
  constexpr int64_t kLen = 20000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> a(kLen);
  for (float& x : a) x = normal(rng);
  std::vector<int64_t> order(kLen);
  for (int64_t i = 0; i < kLen; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return a[x] > a[y]; });
  std::vector<std::vector<float>> rows;
  for (int64_t j = 0; j <= 480; j += 16) {
    rows.push_back(a);
    std::vector<float> moved = a;
    for (int64_t i = 0; i < j; ++i) moved[order[i]] = -100.0f;
    rows.push_back(moved);
  }
  for (float shift : {-3.0f, 3.0f, 0.0f}) {
    rows.push_back(a);
    for (float& x : rows.emplace_back(a)) x += shift;
  }
  rows.emplace_back(kLen, 2.5f);
  rows.push_back(a);
  const int64_t n_rows = static_cast<int64_t>(rows.size());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool largest : {true, false}) {
      Tensor input = Rows(dtype, rows, !largest);
      for (int64_t k : {100, 2048}) {
        for (bool ranges : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " k=", k, " largest=", largest, " ranges=", ranges));
          std::map<std::string, Tensor> inputs = {{"input", input}};
          if (ranges) {  // every row [7, kLen - 3): the carry's columns start past 0
            inputs["row_starts"] = I32(std::vector<int32_t>(n_rows, 7));
            inputs["row_ends"] = I32(std::vector<int32_t>(n_rows, kLen - 3));
          }
          CheckOnOneThread(*radix, inputs, k, largest);
        }
      }
    }
  }
}

TEST(TopKRadixTest, SortOfTheSurvivorsStaysExactWhereTheyBunch) {
  std::shared_ptr<const Kernel> radix = *TheRegistry().Get("topk/radix");
  if (!radix->available()) GTEST_SKIP() << Why(*radix);
  // A long row's ~k survivors are placed by the top 12 bits of their
  // distance from the lowest and then put in order within each of those
  // buckets (radix.cc's SortTopK); a bucket of more than 32 sends them all
  // to the LSD sort. Rows: groups of ~28 scores 2048 ulps apart (one bucket
  // each), rising with the column inside a group (every key moves the
  // most), in pairs of equal scores; the same with ~34 a group; normal
  // values with a few huge ones, which bunch the rest in the lowest
  // buckets. Each followed by a normal row, which carries a threshold
  // that does not suit the next.
  constexpr int64_t kLen = 20000;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> rows;
  auto normal_row = [&] {
    for (float& x : rows.emplace_back(kLen)) x = normal(rng);
  };
  for (int64_t groups : {700, 580}) {
    normal_row();
    std::vector<float>& row = rows.emplace_back(kLen);
    for (int64_t c = 0; c < kLen; ++c) {
      const uint32_t bits = 0x3f800000u + static_cast<uint32_t>((c % groups) * 2048 + c / groups / 2);
      std::memcpy(&row[c], &bits, 4);
    }
  }
  normal_row();
  normal_row();
  for (int64_t c : {17, 5000, 9999, 12345}) rows.back()[c] = c == 5000 ? 3e38f : 1e30f;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool largest : {true, false}) {
      const Tensor input = Rows(dtype, rows, !largest);
      for (int64_t k : {100, 2048}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " k=", k, " largest=", largest));
        CheckOnOneThread(*radix, {{"input", input}}, k, largest);
      }
    }
  }
}

TEST(TopKRadixTest, SurvivorsAtTheEndsOfSixteenBitRows) {
  std::shared_ptr<const Kernel> radix = *TheRegistry().Get("topk/radix");
  if (!radix->available()) GTEST_SKIP() << Why(*radix);
  // Where the CPU has AVX512_VBMI2, a row of up to 2^16 elements collects
  // its survivors as 16-bit offsets (radix.cc's CollectOffsets512); longer
  // rows take 32-bit columns. Rows of 2^16 and 2^16 + 1 elements, whole
  // and cut by ranges (a start past 0, an end short of the row), with the
  // winners at the last columns, at the first, rising with the column, or
  // spread.
  for (int64_t len : {int64_t{1} << 16, (int64_t{1} << 16) + 1}) {
    std::mt19937 rng(static_cast<uint32_t>(len));
    std::normal_distribution<float> normal;
    std::vector<std::vector<float>> rows(4, std::vector<float>(len));
    for (int64_t i = 0; i < len; ++i) {
      rows[0][i] = normal(rng);
      rows[1][i] = normal(rng);
      rows[2][i] = static_cast<float>(i);
      rows[3][i] = normal(rng);
    }
    for (int64_t j = 0; j < 40; ++j) {
      rows[0][len - 40 + j] = 100.0f + static_cast<float>(j);
      rows[1][j] = 100.0f + static_cast<float>(j);
    }
    const int32_t end = static_cast<int32_t>(len);
    const Tensor starts = I32({0, 1, 31, 2}), ends = I32({end, end, end - 1, end - 3});
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (bool largest : {true, false}) {
        const Tensor input = Rows(dtype, rows, !largest);
        for (int64_t k : {100, 2048}) {
          for (bool ranges : {false, true}) {
            SCOPED_TRACE(absl::StrCat("len=", len, " ", DTypeName(dtype), " k=", k, " largest=", largest,
                                      " ranges=", ranges));
            std::map<std::string, Tensor> inputs = {{"input", input}};
            if (ranges) {
              inputs["row_starts"] = starts;
              inputs["row_ends"] = ends;
            }
            CheckOnOneThread(*radix, inputs, k, largest);
          }
        }
      }
    }
  }
}

TEST(TopKBlockwiseTest, ReportsTheDepthEachRowStoppedAt) {
  std::shared_ptr<const Kernel> blockwise = *TheRegistry().Get("topk/blockwise");
  if (!blockwise->available()) GTEST_SKIP() << Why(*blockwise);
  Tensor normal(DType::kF32, {4, 201088});
  FillRandom(normal, Dist::kNormal, 9);
  std::vector<int32_t> depths =
      RunChecked("topk/blockwise", {{"num_blocks", "128"}, {"m_schedule", "5,8,12"}}, normal, 64);
  ASSERT_EQ(depths.size(), 4u);
  for (int32_t depth : depths) {
    EXPECT_EQ(depth, 4);  // top-4 of 128 blocks nearly always holds the top 64
  }
  // The seed's adversary: all winners in column stride 128, so in one block;
  // no depth below k suffices and the row falls back to the whole range.
  Tensor worst(DType::kF32, {2, 128 * 300});
  for (int64_t i = 0; i < worst.numel(); ++i) worst.data_as<float>()[i] = (i % 128 == 0) ? 1.0f : 0.0f;
  depths = RunChecked("topk/blockwise", {{"num_blocks", "128"}}, worst, 64);
  ASSERT_EQ(depths.size(), 2u);
  for (int32_t depth : depths) {
    EXPECT_EQ(depth, 64);
  }
}

TEST(TopKBlockwiseTest, TiesPushedDownKeepTheirColumnOrder) {
  std::shared_ptr<const Kernel> blockwise = *TheRegistry().Get("topk/blockwise");
  if (!blockwise->available()) GTEST_SKIP() << Why(*blockwise);
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

}  // namespace
}  // namespace kreg::conformance
