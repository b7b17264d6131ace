// The kreg binary, end to end: listing, checked runs, .npy round trips, and
// one clear line with a non-zero exit for each kind of bad input.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/npy.h"
#include "kreg/problem.h"
#include "tests/run_kreg.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;

Result Kreg(const std::string& args, const std::string& env = "") { return RunKreg(KREG_PLUGIN_DIR, args, env); }

std::string Dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/kreg_cli_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

int Lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(CliTest, ListShowsTheSortKernelAndItsParameterSpace) {
  Result r = Kreg("list");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("topk/sort"));
  EXPECT_THAT(r.out, HasSubstr("method"));
  EXPECT_THAT(r.out, HasSubstr("choice {partial_sort,nth_element}"));
  r = Kreg("list --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"name\":\"topk/sort\""));
  EXPECT_THAT(r.out, HasSubstr("\"default\":\"partial_sort\""));
}

TEST(CliTest, CheckedRunReportsOk) {
  Result r = Kreg("run topk/sort --dims batch=8,n=1000,k=10 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok"));
  r = Kreg("run topk/sort --dims batch=8,n=1000,k=10,largest=0 --with row_starts,row_ends --dtype bf16 --dist bits "
           "--param method=nth_element --check --json --reps 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"check\":\"ok\""));
  EXPECT_THAT(r.out, HasSubstr("\"median_ns\":"));
  EXPECT_THAT(r.out, HasSubstr("\"params\":{\"method\":\"nth_element\"}"));
}

TEST(CliTest, NpyRoundTripMatchesTheReference) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string dir = Dir(std::string(DTypeName(dtype)));
    Tensor input(dtype, {6, 300});
    FillRandom(input, Dist::kBits, 11);
    Tensor ends(DType::kI32, {6});
    for (int r = 0; r < 6; ++r) ends.data_as<int32_t>()[r] = r * 10;  // rows 0-1 shorter than k
    ASSERT_TRUE(WriteNpy(dir + "/input.npy", input).ok());
    ASSERT_TRUE(WriteNpy(dir + "/ends.npy", ends).ok());
    Result r = Kreg("run topk/sort --dims k=15 --input input=" + dir + "/input.npy --input row_ends=" + dir +
                    "/ends.npy --save-outputs " + dir + "/out --check");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr(std::string(DTypeName(dtype)) + "+row_ends batch=6,n=300,k=15"));

    // The reference kernel, run the same way, writes what is expected.
    r = Kreg("run topk/reference --dims k=15 --input input=" + dir + "/input.npy --input row_ends=" + dir +
             "/ends.npy --save-outputs " + dir + "/ref --reps 1 --warmup 0");
    ASSERT_EQ(r.code, 0) << r.out;
    absl::StatusOr<Tensor> values = ReadNpy(dir + "/out/values.npy");
    absl::StatusOr<Tensor> indices = ReadNpy(dir + "/out/indices.npy");
    absl::StatusOr<Tensor> want_values = ReadNpy(dir + "/ref/values.npy");
    absl::StatusOr<Tensor> want_indices = ReadNpy(dir + "/ref/indices.npy");
    ASSERT_TRUE(values.ok() && indices.ok() && want_values.ok() && want_indices.ok());
    ASSERT_EQ(indices->shape(), (std::vector<int64_t>{6, 15}));
    ASSERT_EQ(indices->shape(), want_indices->shape());
    EXPECT_EQ(std::memcmp(indices->data(), want_indices->data(), want_indices->nbytes()), 0);
    EXPECT_EQ(values->dtype(), dtype);
    EXPECT_EQ(std::memcmp(values->data(), want_values->data(), want_values->nbytes()), 0);
    EXPECT_EQ(indices->data_as<int32_t>()[0], -1);  // row 0's range is empty
  }
}

struct BadInput {
  const char* name;
  const char* args;
  const char* message;
};

void PrintTo(const BadInput& c, std::ostream* os) { *os << c.name; }

class CliErrorTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliErrorTest, OneClearLineAndNonZeroExit) {
  const std::string dir = Dir(GetParam().name);
  std::ofstream(dir + "/garbage.npy") << "not numpy at all";
  Tensor wrong(DType::kI32, {2, 2});
  ASSERT_TRUE(WriteNpy(dir + "/int.npy", wrong).ok());
  std::string args = GetParam().args;
  for (size_t at; (at = args.find("DIR")) != std::string::npos;) args.replace(at, 3, dir);
  Result r = Kreg(args);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(Lines(r.out), 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    BadInputs, CliErrorTest,
    ::testing::Values(
        BadInput{"k_gt_n", "run topk/sort --dims batch=2,n=10,k=11", "k=11 exceeds the row length n=10"},
        BadInput{"unknown_variant", "run topk/nope --dims batch=2,n=10,k=1", "no kernel 'topk/nope'"},
        BadInput{"unknown_op", "run gemm/x --dims m=1", "unknown op 'gemm'"},
        BadInput{"not_op_variant", "run sort --dims batch=1", "'sort' is not OP/VARIANT"},
        BadInput{"bad_dims", "run topk/sort --dims batch=2,n=ten,k=1", "dimension 'n=ten' is not an integer"},
        BadInput{"unknown_dim", "run topk/sort --dims batch=2,n=10,k=1,m=3",
                 "unknown dimension or attribute 'm' (dims: batch, n, k; attributes: largest)"},
        BadInput{"missing_dim", "run topk/sort --dims batch=2,n=10", "dimension 'k' is missing"},
        BadInput{"bad_dtype", "run topk/sort --dims batch=2,n=10,k=1 --dtype f64", "--dtype 'f64'"},
        BadInput{"bad_param", "run topk/sort --dims batch=2,n=10,k=1 --param method=quick",
                 "'quick' is not one of partial_sort, nth_element"},
        BadInput{"unknown_param", "run topk/sort --dims batch=2,n=10,k=1 --param tile=8",
                 "has no parameter 'tile'"},
        BadInput{"garbage_npy", "run topk/sort --dims k=1 --input input=DIR/garbage.npy",
                 "not a .npy file"},
        BadInput{"missing_npy", "run topk/sort --dims k=1 --input input=DIR/missing.npy", "cannot open file"},
        BadInput{"int_input", "run topk/sort --dims k=1 --input input=DIR/int.npy",
                 "input 'input' takes f32|bf16, the file holds i32"},
        BadInput{"shape_mismatch", "run topk/sort --dims batch=3,k=1 --input input=DIR/garbage.npy",
                 "not a .npy file"},
        BadInput{"unknown_input", "run topk/sort --dims batch=2,n=2,k=1 --input weights=DIR/int.npy",
                 "unknown input 'weights'"},
        BadInput{"bad_dist", "run topk/sort --dims batch=2,n=10,k=1 --dist cauchy", "unknown distribution"},
        BadInput{"flag_not_for_list", "list --reps 3", "--reps does not apply to 'kreg list'"},
        BadInput{"unknown_command", "frobnicate", "unknown command 'frobnicate'"},
        BadInput{"missing_plugin_path", "list --plugin_path=/nonexistent", "'/nonexistent' does not exist"},
        BadInput{"unknown_flag", "list --bogus", "Unknown command line flag 'bogus'"},
        BadInput{"huge_dims", "run topk/sort --dims batch=1000000000,n=1000000000,k=1", "out of memory"},
        BadInput{"dim_over_limit", "run topk/sort --dims batch=1,n=2147483648,k=1", "n=2147483648 exceeds its limit"},
        BadInput{"attr_out_of_range", "run topk/sort --dims batch=1,n=10,k=1,largest=2", "largest=2 is outside [0, 1]"},
        BadInput{"with_not_optional", "run topk/sort --dims batch=1,n=10,k=1 --with input",
                 "'input' is not an optional input"},
        BadInput{"dtype_not_allowed", "run topk/sort --dims batch=1,n=10,k=1 --dtype i32", "no tensor whose dtype is a choice takes i32"},
        BadInput{"list_value_not_declared", "run topk/blockwise --dims batch=2,n=100,k=3 --param m_schedule=7",
                 "7 is not one of 2, 3, 4"}),
    [](const ::testing::TestParamInfo<BadInput>& p) { return std::string(p.param.name); });

TEST(CliTest, ExitsCleanlyAfterCuttingOneRowAcrossThreads) {
  // One long row is split over the thread pool; unloading the plugin at exit
  // must not pull the runtime from under its workers.
  for (int i = 0; i < 5; ++i) {
    Result r = Kreg("run topk/sort --dims batch=1,n=200000,k=10 --reps 2 --json --check");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("\"check\":\"ok\""));
  }
}

TEST(CliTest, VariantsNeedingAnIsaThisCpuLacksAreListedButRefusedToRun) {
  // KREG_ISA_MASK hides every extension but FMA: a CPU without AVX2.
  Result r = Kreg("list", "KREG_ISA_MASK=fma");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("topk/heap +v1 +isa: avx2 +UNAVAILABLE"));
  r = Kreg("run topk/heap --dims batch=2,n=100,k=3", "KREG_ISA_MASK=fma");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("topk/heap needs avx2, which this CPU lacks"));
  r = Kreg("run topk/radix --dims batch=2,n=100,k=3 --check", "KREG_ISA_MASK=fma");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(CliTest, BrokenPluginsAreWarnedAboutAndDoNotStopTheRest) {
  std::string cmd = std::string("list --plugin_path=") + KREG_TEST_PLUGIN_DIR;
  Result r = Kreg(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("topk/sort"));
  EXPECT_THAT(r.out, HasSubstr("warning: plugin " + std::string(KREG_TEST_PLUGIN_DIR) + "/test_wrong_abi.so refused"));
}

}  // namespace
}  // namespace kreg
