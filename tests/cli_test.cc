// The kreg binary, end to end: listing, checked runs, .npy round trips, help
// pages, --json records, and one clear line with exit code 2 for each kind of
// bad input.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/npy.h"
#include "kreg/problem.h"
#include "tests/run_kreg.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

Result Kreg(const std::string& args, const std::string& env = "") { return RunKreg(KREG_PLUGIN_DIR, args, env); }

std::string Dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/kreg_cli_" + name + "_" + std::to_string(getpid());
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
  const Json list = Json::parse(r.stdout_text);
  bool found = false;
  for (const Json& plugin : list["plugins"]) {
    for (const Json& kernel : plugin["kernels"]) {
      if (kernel["kernel"] != "topk/sort") continue;
      found = true;
      EXPECT_EQ(kernel["op"], "topk");
      EXPECT_TRUE(kernel["version"].is_number_integer());
      EXPECT_EQ(kernel["default_params"], Json::parse(R"({"method":"partial_sort"})"));
      ASSERT_EQ(kernel["space"].size(), 1u);
      EXPECT_EQ(kernel["space"][0]["type"], "choice");
    }
    for (const Json& kernel : plugin["kernels"]) {
      if (kernel["kernel"] == "topk/blockwise") {
        // Integers as numbers, lists as arrays.
        EXPECT_TRUE(kernel["default_params"]["num_blocks"].is_number_integer()) << kernel;
        EXPECT_TRUE(kernel["default_params"]["m_schedule"].is_array()) << kernel;
      }
    }
  }
  EXPECT_TRUE(found) << r.out;
}

TEST(CliTest, CheckedRunReportsOk) {
  Result r = Kreg("run topk/sort --dims batch=8,n=1000,k=10 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok"));
  r = Kreg("run topk/sort --dims batch=8,n=1000,k=10,largest=0 --with row_starts,row_ends --dtype bf16 --dist bits "
           "--param method=nth_element --check --json --reps 3");
  ASSERT_EQ(r.code, 0) << r.out;
  const Json m = Json::parse(r.stdout_text);
  EXPECT_EQ(m["check"], "ok");
  EXPECT_TRUE(m["median_ns"].is_number_integer()) << m;
  EXPECT_TRUE(m["min_ns"].is_number_integer()) << m;
  EXPECT_GT(m["median_ns"].get<int64_t>(), 0);
  EXPECT_EQ(m["params"], Json::parse(R"({"method":"nth_element"})"));
  EXPECT_EQ(m["key"]["dims"], Json::parse(R"({"batch":8,"n":1000,"k":10,"largest":0})"));
  EXPECT_EQ(m["key"]["dtype"], "bf16+row_starts+row_ends");
  EXPECT_EQ(m["key"]["data_class"], "dist=bits");
  EXPECT_TRUE(m["chosen_by"].is_null());
  EXPECT_EQ(m["kernel"], "topk/sort");
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
  int code = 2;  // bad input
};

void PrintTo(const BadInput& c, std::ostream* os) { *os << c.name; }

class CliErrorTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliErrorTest, OneClearLineAndItsExitCode) {
  const std::string dir = Dir(GetParam().name);
  std::ofstream(dir + "/garbage.npy") << "not numpy at all";
  Tensor wrong(DType::kI32, {2, 2});
  ASSERT_TRUE(WriteNpy(dir + "/int.npy", wrong).ok());
  // gmm's inputs: group sizes, one negative or summing to 10; lhs [8, 4];
  // rhs [2, 4, 6] in f32 and bf16.
  Tensor negative(DType::kI32, {3}), ten(DType::kI32, {2});
  const int32_t negative_sizes[] = {2, -1, 3}, ten_sizes[] = {5, 5};
  std::memcpy(negative.data(), negative_sizes, sizeof negative_sizes);
  std::memcpy(ten.data(), ten_sizes, sizeof ten_sizes);
  ASSERT_TRUE(WriteNpy(dir + "/negative_sizes.npy", negative).ok());
  ASSERT_TRUE(WriteNpy(dir + "/ten_sizes.npy", ten).ok());
  ASSERT_TRUE(WriteNpy(dir + "/lhs.npy", Tensor(DType::kF32, {8, 4})).ok());
  ASSERT_TRUE(WriteNpy(dir + "/rhs.npy", Tensor(DType::kF32, {2, 4, 6})).ok());
  ASSERT_TRUE(WriteNpy(dir + "/rhs_bf16.npy", Tensor(DType::kBF16, {2, 4, 6})).ok());
  std::string args = GetParam().args;
  for (size_t at; (at = args.find("DIR")) != std::string::npos;) args.replace(at, 3, dir);
  Result r = Kreg(args);
  EXPECT_EQ(r.code, GetParam().code) << r.out;
  EXPECT_EQ(Lines(r.out), 1) << r.out;
  EXPECT_EQ(r.stdout_text, "");
  EXPECT_THAT(r.stderr_text, ::testing::StartsWith("kreg"));
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
        BadInput{"flag_not_for_list", "list --reps 3", "kreg list: --reps does not apply to 'kreg list'"},
        BadInput{"flag_not_for_query", "query topk --dims batch=1,n=10,k=1 --db x.lut --max_list_len 3",
                 "--max-list-len does not apply to 'kreg query' (it is a flag of tune)"},
        BadInput{"unknown_command", "frobnicate", "kreg: unknown command 'frobnicate'"},
        BadInput{"misspelt_command", "lsit", "unknown command 'lsit'; did you mean list?"},
        BadInput{"unknown_db_command", "db shwo x.lut", "kreg db: unknown command 'shwo'; did you mean show?"},
        BadInput{"missing_plugin_path", "list --plugin_path=/nonexistent", "'/nonexistent' does not exist"},
        BadInput{"unknown_flag", "list --bogus", "kreg list: unknown flag '--bogus'"},
        BadInput{"misspelt_flag", "run topk/sort --dim batch=2,n=10,k=1", "kreg run: unknown flag '--dim'; did you mean --dims?"},
        BadInput{"misspelt_flag_with_value", "run topk/sort --dims batch=2,n=10,k=1 --chek",
                 "unknown flag '--chek'; did you mean --check?"},
        BadInput{"flag_without_value", "run topk/sort --dims", "kreg run: --dims needs a value"},
        BadInput{"bad_reps", "run topk/sort --dims batch=2,n=10,k=1 --reps 0", "--reps: expected 1 to 1000000, got 0"},
        BadInput{"reps_not_a_number", "run topk/sort --dims batch=2,n=10,k=1 --reps many", "--reps: 'many' is not an integer"},
        BadInput{"missing_kernel", "run --dims batch=2,n=10,k=1", "kreg run: KERNEL is required"},
        BadInput{"two_dims_for_run", "run topk/sort --dims batch=2,n=10,k=1 --dims batch=3,n=10,k=1", "run takes one --dims"},
        BadInput{"unexpected_argument", "run topk/sort extra --dims batch=2,n=10,k=1", "unexpected argument 'extra'"},
        BadInput{"missing_db", "run topk --db /nonexistent.lut --dims batch=2,n=10,k=1", "/nonexistent.lut"},
        BadInput{"db_with_variant", "run topk/sort --db x.lut --dims batch=2,n=10,k=1",
                 "--db applies to 'kreg run OP --db FILE' (a table's choice), not to OP/VARIANT"},
        BadInput{"missing_db_for_query", "query topk --db /nonexistent.lut --dims batch=2,n=10,k=1", "/nonexistent.lut"},
        BadInput{"missing_db_for_show", "db show /nonexistent.lut", "kreg db show: /nonexistent.lut"},
        BadInput{"db_without_command", "db", "kreg db: give one of: show FILE"},
        BadInput{"json_for_db", "db show x.lut --json", "--json does not apply to 'kreg db show'"},
        BadInput{"help_for_nothing", "help frobnicate", "kreg help: no command 'frobnicate'"},
        BadInput{"huge_dims", "run topk/sort --dims batch=1000000000,n=1000000000,k=1", "more than this machine's", 2},
        BadInput{"dim_over_limit", "run topk/sort --dims batch=1,n=2147483648,k=1", "n=2147483648 exceeds its limit"},
        BadInput{"attr_out_of_range", "run topk/sort --dims batch=1,n=10,k=1,largest=2", "largest=2 is outside [0, 1]"},
        BadInput{"with_not_optional", "run topk/sort --dims batch=1,n=10,k=1 --with input",
                 "'input' is not an optional input"},
        BadInput{"dtype_not_allowed", "run topk/sort --dims batch=1,n=10,k=1 --dtype i32", "no tensor whose dtype is a choice takes i32"},
        BadInput{"list_value_not_declared", "run topk/blockwise --dims batch=2,n=100,k=3 --param m_schedule=7",
                 "7 is not one of 2, 3, 4"},
        BadInput{"gmm_negative_group_size",
                 "run gmm/reference --dims m=8,k=4,n=6 --input group_sizes=DIR/negative_sizes.npy",
                 "gmm: group_sizes[1]=-1 is negative"},
        BadInput{"gmm_group_sizes_above_m",
                 "run gmm/reference --dims m=8,k=4,n=6 --input group_sizes=DIR/ten_sizes.npy",
                 "gmm: group_sizes[0..1] sum to 10, more than m=8 rows"},
        BadInput{"tgmm_group_sizes_above_m",
                 "run tgmm/reference --dims m=8,k=4,n=6 --input group_sizes=DIR/ten_sizes.npy",
                 "tgmm: group_sizes[0..1] sum to 10, more than m=8 rows"},
        BadInput{"gmm_group_offset_out_of_range",
                 "run gmm/reference --dims m=8,k=4,n=6,groups=4,local_groups=2,group_offset=3",
                 "gmm: group_offset=3 + local_groups=2 exceeds groups=4"},
        BadInput{"tgmm_local_groups_above_groups", "run tgmm/reference --dims m=8,k=4,n=6,groups=4,local_groups=5",
                 "tgmm: group_offset=0 + local_groups=5 exceeds groups=4"},
        BadInput{"gmm_negative_group_offset", "run gmm/reference --dims m=8,k=4,n=6,groups=4,group_offset=-1",
                 "gmm: attribute group_offset=-1 is outside [0, 2147483647]"},
        BadInput{"gmm_rhs_not_transposed",
                 "run gmm/reference --dims m=8,k=4,n=6,groups=2,transpose_rhs=1 --input rhs=DIR/rhs.npy",
                 "gmm: input 'rhs' has shape [2, 4, 6] but n=6 (rhs is [local_groups,n,k] with transpose_rhs=1)"},
        BadInput{"gmm_rhs_dtype_not_lhs",
                 "run gmm/reference --dims groups=2 --input lhs=DIR/lhs.npy --input rhs=DIR/rhs_bf16.npy",
                 "gmm: input 'rhs' holds bf16 but must have the dtype of 'lhs' (f32)"},
        BadInput{"collective_without_ranks", "run allreduce/ring --dims count=10",
                 "allreduce is a collective op: give --ranks N"},
        BadInput{"ranks_for_a_local_op", "run topk/sort --dims batch=1,n=10,k=1 --ranks 2",
                 "topk is not a collective op: it runs on one rank"},
        BadInput{"ranks_disagree", "run allgather/ring --dims count=10,ranks=3 --ranks 2",
                 "allgather: ranks=3 disagrees with the communicator's 2 ranks"},
        BadInput{"bad_backend", "run allgather/ring --dims count=10 --ranks 2 --backend nccl",
                 "--backend 'nccl': expected threads or mpi"},
        BadInput{"zero_ranks", "run allgather/ring --dims count=10 --ranks 0", "--ranks: expected 1 to 256 thread ranks (each is a thread of this process), got 0"},
        BadInput{"bad_comm_timeout", "run allgather/ring --dims count=10 --ranks 2 --comm-timeout 0",
                 "--comm-timeout: expected more than 0 and at most 604800 seconds (a week), got"},
        BadInput{"mesh_missing", "run sharded_matmul/plain --ranks 4 --dims m=8,k=8,n=8",
                 "sharded_matmul: dimension 'x' is missing (give --mesh, e.g. 2x2)"},
        BadInput{"mesh_does_not_divide", "run sharded_matmul/plain --mesh 2x2 --dims m=7,k=8,n=8",
                 "sharded_matmul: m=7 is not divisible by x=2"},
        BadInput{"mesh_malformed", "run sharded_matmul/plain --mesh 2xx2 --dims m=8,k=8,n=8",
                 "--mesh: mesh '2xx2': axis size '' is not in [1, 65536]"},
        BadInput{"mesh_lacks_axis", "run sharded_matmul/plain --mesh x=2,z=2 --dims m=8,k=8,n=8",
                 "sharded_matmul needs mesh axis 'y' (the mesh is x=2,z=2)"},
        BadInput{"mesh_and_ranks_disagree", "run sharded_matmul/plain --mesh 2x2 --ranks 3 --dims m=8,k=8,n=8",
                 "disagrees with the communicator's 4 ranks"}),
    [](const ::testing::TestParamInfo<BadInput>& p) { return std::string(p.param.name); });

// A collective on thread ranks: checked, one line from rank 0, its outputs
// per rank; the ranks dim is the communicator's.
TEST(CliTest, CollectivesRunOnThreadRanks) {
  const std::string dir = Dir("collective");
  Result r = Kreg("run allgather/ring --ranks 3 --dims count=5 --dtype i32 --check --save-outputs " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Lines(r.stdout_text), 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("allgather/ring i32 count=5,ranks=3  chunks=1"));
  EXPECT_THAT(r.out, HasSubstr("check ok"));
  absl::StatusOr<Tensor> rank0 = ReadNpy(dir + "/out.rank0.npy");
  absl::StatusOr<Tensor> rank2 = ReadNpy(dir + "/out.rank2.npy");
  ASSERT_TRUE(rank0.ok() && rank2.ok());
  EXPECT_EQ(rank0->shape(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(std::memcmp(rank0->data(), rank2->data(), rank0->nbytes()), 0);
  r = Kreg("run allreduce/doubling --ranks 5 --dims count=1000,reduction=1 --dtype bf16 --param split=halving --check "
           "--json");
  ASSERT_EQ(r.code, 0) << r.out;
  const Json record = Json::parse(r.stdout_text);
  EXPECT_EQ(record["check"], "ok");
  EXPECT_EQ(record["key"]["dims"], Json::parse(R"({"count":1000,"ranks":5,"reduction":1})"));
}

// A collective kernel that misbehaves on rank 1 of 4 thread ranks: the
// others fail with one clear line, within --comm-timeout plus a second,
// never hanging.
Result Faulty(const std::string& mode) {
  return RunKreg(std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty_collective",
                 "run allreduce/faulty --ranks 4 --dims count=10 --check --comm-timeout 1 --param mode=" + mode);
}

TEST(CliTest, CollectiveFaultsFailClearlyAndInTime) {
  Result r = Faulty("ok");
  ASSERT_EQ(r.code, 0) << r.out;
  struct Fault {
    const char* mode;
    const char* message;
  };
  for (const Fault& f : {
           Fault{"silent", "rank 0: nothing came within the 1s communication timeout, waiting for a send of 40 bytes "
                           "to rank 1 (tag 0)"},
           Fault{"fail", "rank 1 failed (allreduce/faulty: rank 1 gives up on purpose); rank 0 gave up waiting for "
                         "a send of 40 bytes to rank 1 (tag 0)"},
           Fault{"mismatch", "rank 1 sent 44 bytes (tag 0) to rank 0, which expected 40: the ranks disagree on sizes "
                             "or dtypes"},
       }) {
    const auto start = std::chrono::steady_clock::now();
    r = Faulty(f.mode);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.code, 1) << f.mode << ": " << r.out;
    EXPECT_EQ(Lines(r.out), 1) << f.mode << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(f.message)) << f.mode;
    EXPECT_LT(seconds, 1 + 1 + 0.5) << f.mode;  // the timeout, a second, and kreg's start
  }
}

// The sharded matmul on 2 x 2 and 2 x 4 meshes of thread ranks, plain and
// overlapped, checked against one matmul of the whole arrays; the mesh's
// axes and the derived shard dims are in the key.
TEST(CliTest, ShardedMatmulRunsOnAMesh) {
  for (const char* kernel : {"sharded_matmul/plain", "sharded_matmul/overlapped"}) {
    for (const char* mesh : {"2x2", "2x4"}) {
      Result r = Kreg(std::string("run ") + kernel + " --mesh " + mesh + " --dims m=32,k=64,n=24 --check");
      ASSERT_EQ(r.code, 0) << r.out;
      EXPECT_THAT(r.out, HasSubstr("check ok"));
      EXPECT_THAT(r.out, HasSubstr(std::string(mesh) == "2x2" ? "ranks=4,x=2,y=2,m_shard=16,kx=32,ky=32"
                                                              : "ranks=8,x=2,y=4,m_shard=16,kx=32,ky=16"));
    }
  }
}

// gmm's attributes and local_groups go in --dims; local_groups, left out,
// is groups; an rhs array is read by the layout transpose_rhs selects.
TEST(CliTest, GmmTakesAttributesAndLocalGroupsInDims) {
  Result r = Kreg("list --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("local_groups (default groups)"));
  EXPECT_THAT(r.out, HasSubstr("rhs [local_groups,k,n] (transpose_rhs!=0: [local_groups,n,k])"));
  r = Kreg("run gmm/reference --dims m=40,k=8,n=6,groups=8,local_groups=3,group_offset=2,transpose_rhs=1 "
           "--with existing_out --dtype bf16 --reps 1 --warmup 0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  Json m = Json::parse(r.stdout_text);
  EXPECT_EQ(m["key"]["dims"], Json::parse(R"({"m":40,"k":8,"n":6,"groups":8,"local_groups":3,"transpose_rhs":1,)"
                                          R"("group_offset":2})"));
  EXPECT_EQ(m["key"]["dtype"], "bf16,bf16+existing_out");
  r = Kreg("run tgmm/reference --dims m=40,k=8,n=6,groups=8 --reps 1 --warmup 0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  m = Json::parse(r.stdout_text);
  EXPECT_EQ(m["key"]["dims"], Json::parse(R"({"k":8,"m":40,"n":6,"groups":8,"local_groups":8})"));
  // rhs [2, 4, 6] read as [local_groups, n, k]: n=4, k=6.
  const std::string dir = Dir("gmm_rhs");
  Tensor rhs(DType::kF32, {2, 4, 6});
  FillRandom(rhs, Dist::kNormal, 1);
  ASSERT_TRUE(WriteNpy(dir + "/rhs.npy", rhs).ok());
  r = Kreg("run gmm/reference --dims m=10,groups=3,group_offset=1,transpose_rhs=1 --input rhs=" + dir +
           "/rhs.npy --save-outputs " + dir + "/out --reps 1 --warmup 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("m=10,k=6,n=4,groups=3,local_groups=2,transpose_rhs=1,group_offset=1"));
  absl::StatusOr<Tensor> out = ReadNpy(dir + "/out/out.npy");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->shape(), (std::vector<int64_t>{10, 4}));
}

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

// --device cuda without a GPU (or without the CUDA backend) is one line
// saying why; a CPU kernel on the GPU is refused; an unknown device is bad
// input.
TEST(CliTest, DeviceCudaSaysWhyItCannotRun) {
  Result r = Kreg("run topk/sort --dims batch=2,n=10,k=3 --device tpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.stderr_text, HasSubstr("--device: tpu not in {cpu,cuda}"));
  r = Kreg("machine --json");
  ASSERT_EQ(r.code, 0);
  const bool gpu = r.stdout_text.find("\"gpus\":[{") != std::string::npos;
  r = Kreg("run topk/sort --dims batch=2,n=10,k=3 --device cuda");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(Lines(r.stderr_text), 1) << r.stderr_text;
  EXPECT_THAT(r.stderr_text, HasSubstr(gpu ? "topk/sort runs on the CPU, not on a device" : "--device cuda: "));
}

// Messages have levels: warnings by default, -v adds what kreg does (and
// plugins' own notes through kreg_host.log), -vv each location searched;
// KREG_LOG sets the level without a flag, and KREG_LOG=error hides warnings.
TEST(CliTest, LogLevelsShowMoreOrLess) {
  const std::string broken = std::string("list --plugin_path=") + KREG_TEST_PLUGIN_DIR;
  Result r = Kreg(broken);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("warning: plugin"));
  EXPECT_THAT(r.stderr_text, Not(HasSubstr("loaded plugin")));
  r = Kreg(broken, "KREG_LOG=error");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.stderr_text, "");
  r = Kreg(broken + " -v");
  EXPECT_THAT(r.stderr_text, HasSubstr("kreg: loaded plugin topk"));
  EXPECT_THAT(r.stderr_text, Not(HasSubstr("plugin location")));
  r = Kreg(broken, "KREG_LOG=debug");
  EXPECT_THAT(r.stderr_text, HasSubstr("plugin location " + std::string(KREG_TEST_PLUGIN_DIR)));
  EXPECT_EQ(Kreg("-vv " + broken).stderr_text, r.stderr_text);
  r = Kreg("list", "KREG_LOG=loud");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.stderr_text, HasSubstr("KREG_LOG: log level 'loud' is not one of error, warn, info, debug"));
#ifdef KREG_HAVE_ONEDNN
  // A plugin's note (kreg_host.log, level 0 = info) shows with -v only.
  r = Kreg("-v run gmm/onednn --dims m=64,k=32,n=32,groups=2 --reps 1 --warmup 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("kreg: gmm/onednn: 2 matmul primitive(s), oneDNN implementation"));
  r = Kreg("run gmm/onednn --dims m=64,k=32,n=32,groups=2 --reps 1 --warmup 0");
  EXPECT_THAT(r.stderr_text, Not(HasSubstr("oneDNN implementation")));
#endif
}

// Every command's --help, and `kreg help COMMAND`, print that command's page:
// usage, its flags with defaults, an example; exit 0.
TEST(CliTest, EveryCommandHasItsOwnHelpPage) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> pages = {
      {"list", {"--json"}},
      {"run", {"--dims NAME=V,...", "--param NAME=V", "--input NAME=FILE", "--save-outputs DIR", "--check",
               "--db FILE", "--data-class TEXT", "--reps N", "(default: 10)", "--warmup N", "(default: 3)",
               "--dist NAME", "(default: normal)"}},
      {"tune", {"--dims NAME=V,...", "--db FILE", "--variants", "--strategy NAME", "(default: halving)", "--budget",
                "--timeout SECONDS", "(default: 30)", "--max-list-len N", "--list-growth-rounds N", "--data-class",
                "--input NAME=FILE", "--threads N", "the best quarter kept with twice the",
                "--budget SECONDS        seconds per problem (0: no limit)"}},
      {"query", {"--dims NAME=V,...", "--db FILE", "--dtype TYPE", "--data-class TEXT"}},
      {"db", {"show", "export", "merge", "diff", "slim"}},
      {"db show", {"FILE"}},
      {"db export", {"FILE", "--csv"}},
      {"db merge", {"OUT", "IN"}},
      {"db diff", {"A", "B", "Exits 0 when the winners agree"}},
      {"db slim", {"IN", "OUT"}},
  };
  for (const auto& [command, shows] : pages) {
    Result r = Kreg(command + " --help");
    ASSERT_EQ(r.code, 0) << command << ": " << r.out;
    EXPECT_EQ(r.stderr_text, "") << command;
    EXPECT_THAT(r.out, ::testing::StartsWith("Usage: kreg " + command)) << r.out;
    EXPECT_THAT(r.out, HasSubstr("Examples:\n  kreg " + command)) << r.out;
    for (const std::string& s : shows) EXPECT_THAT(r.out, HasSubstr(s)) << command << ": " << r.out;
    // One spelling per flag, no build noise.
    EXPECT_THAT(r.out, Not(HasSubstr("_outputs"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("data_class"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr(".cc"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("Debug"))) << r.out;
    // Flags of other commands stay on their own pages.
    if (command != "run") {
      EXPECT_THAT(r.out, Not(HasSubstr("--save-outputs"))) << command;
    }
    if (command != "tune") {
      EXPECT_THAT(r.out, Not(HasSubstr("--max-list-len"))) << command;
    }
    Result help = Kreg("help " + command);
    EXPECT_EQ(help.code, 0) << help.out;
    EXPECT_EQ(help.out, r.out) << command;
    Result short_flag = Kreg(command + " -h");
    EXPECT_EQ(short_flag.out, r.out) << command;
  }
}

TEST(CliTest, GlobalHelpListsTheCommands) {
  for (const std::string args : {"--help", "help", "-h"}) {
    Result r = Kreg(args);
    ASSERT_EQ(r.code, 0) << args << ": " << r.out;
    EXPECT_EQ(r.stderr_text, "");
    for (const char* command : {"list", "run", "tune", "query", "db"}) {
      EXPECT_THAT(r.out, ::testing::ContainsRegex(std::string("\n  ") + command + " +[a-z]")) << r.out;
    }
    EXPECT_THAT(r.out, HasSubstr("--plugin-path PATHS"));
    EXPECT_THAT(r.out, HasSubstr("--version"));
    EXPECT_THAT(r.out, HasSubstr("Exit status"));
  }
  // No command: the same page, on stderr, as a usage error.
  Result r = RunCommand("", KREG_BIN, "");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.stdout_text, "");
  EXPECT_THAT(r.stderr_text, ::testing::StartsWith("Usage: kreg"));
  r = Kreg("");  // a global flag, no command
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.stderr_text, ::testing::StartsWith("Usage: kreg"));
}

TEST(CliTest, VersionIsTheProjectVersion) {
  Result r = Kreg("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.stdout_text, ::testing::MatchesRegex("kreg [0-9]+\\.[0-9]+\\.[0-9]+\n"));
  EXPECT_EQ(r.stderr_text, "");
}

// One documented spelling with dashes; the old underscored one still works.
TEST(CliTest, DashedAndUnderscoredSpellingsBothWork) {
  const std::string dir = Dir("spellings");
  for (const std::string flag : {"--save-outputs", "--save_outputs", "--save-outputs=", "--save_outputs="}) {
    const std::string out = dir + "/" + std::to_string(flag.size()) + (flag.back() == '=' ? "eq" : "");
    std::filesystem::remove_all(out);
    Result r = Kreg("run topk/sort --dims batch=2,n=100,k=3 --reps 1 --warmup 0 " + flag +
                    (flag.back() == '=' ? "" : " ") + out);
    ASSERT_EQ(r.code, 0) << flag << ": " << r.out;
    EXPECT_TRUE(std::filesystem::exists(out + "/values.npy")) << flag;
  }
  for (const std::string flag : {"--plugin-path", "--plugin_path"}) {
    Result r = RunCommand("", KREG_BIN, flag + " " + KREG_PLUGIN_DIR + " list");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("topk/sort"));
    // Global flags go before or after the command.
    r = RunCommand("", KREG_BIN, "list --json " + flag + "=" + KREG_PLUGIN_DIR);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("\"topk/sort\""));
  }
  // Repeated flags, --flag=V and --flag V alike.
  const std::string x = dir + "/x.npy", e = dir + "/e.npy";
  Tensor input(DType::kF32, {2, 50});
  FillRandom(input, Dist::kNormal, 3);
  Tensor ends(DType::kI32, {2});
  ends.data_as<int32_t>()[0] = 10;
  ends.data_as<int32_t>()[1] = 50;
  ASSERT_TRUE(WriteNpy(x, input).ok());
  ASSERT_TRUE(WriteNpy(e, ends).ok());
  Result r = Kreg("run topk/radix --dims=k=4 --input input=" + x + " --input=row_ends=" + e +
                  " --param first_bits=8 --param=round_bits=4 --check --reps 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("f32+row_ends batch=2,n=50,k=4"));
  EXPECT_THAT(r.out, HasSubstr("first_bits=8 round_bits=4"));
  EXPECT_THAT(r.out, HasSubstr("check ok"));
}

}  // namespace
}  // namespace kreg
