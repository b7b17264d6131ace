// Candidates measured in a worker process: crashes, hangs and wrong results
// are recorded as such and the next candidate still runs; a problem the
// worker cannot build is an error for every candidate; an op with an in-out
// tensor (axpy) is measured like any other.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/registry.h"
#include "kreg/worker.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;

WorkerJob Job() {
  WorkerJob job;
  job.op = "topk";
  job.values = {{"batch", "4"}, {"n", "1000"}, {"k", "10"}};
  job.plugins = {std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so",
                 std::string(KREG_TEST_PLUGIN_DIR) + "/faulty/test_faulty.so"};
  return job;
}

IsolatedRunner Runner(WorkerJob job = Job()) { return IsolatedRunner({KREG_BIN, "__worker"}, std::move(job), 3.0); }

TEST(WorkerJobTest, RoundTrips) {
  WorkerJob job = Job();
  job.values.emplace_back("largest", "0");
  job.dtypes = {{"", "bf16"}, {"input", "f32"}};
  job.with = {"row_starts", "row_ends"};
  job.dist = Dist::kBits;
  job.partition = Partition::kSkewed;
  job.seed = 42;
  job.input_files = {{"input", "/tmp/x.npy"}};
  job.warmup = 3;
  job.threads = 2;
  job.max_seconds_per_run = 1.5;
  const std::string line = job.Serialize();
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  absl::StatusOr<WorkerJob> back = WorkerJob::Parse(line.substr(0, line.size() - 1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Serialize(), line);
  EXPECT_EQ(back->op, "topk");
  EXPECT_EQ(back->values, job.values);
  EXPECT_EQ(back->dtypes, job.dtypes);
  EXPECT_EQ(back->with, job.with);
  EXPECT_EQ(back->dist, Dist::kBits);
  EXPECT_EQ(back->partition, Partition::kSkewed);
  EXPECT_EQ(back->seed, 42u);
  EXPECT_EQ(back->input_files, job.input_files);
  EXPECT_EQ(back->plugins, job.plugins);
  EXPECT_EQ(back->warmup, 3);
  EXPECT_EQ(back->threads, 2);
  EXPECT_DOUBLE_EQ(back->max_seconds_per_run, 1.5);

  EXPECT_FALSE(WorkerJob::Parse("run\t0\ttopk/sort\t3").ok());
  EXPECT_FALSE(WorkerJob::Parse("job\tdist=sideways").ok());
}

TEST(WorkerJobTest, DescribesItsProblemOptions) {
  WorkerJob job = Job();
  job.dtypes = {{"input", "bf16"}};
  job.with = {"row_ends"};
  job.dist = Dist::kTies;
  job.seed = 9;
  absl::StatusOr<ProblemOptions> options = job.Options();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->dtypes.at("input"), DType::kBF16);
  EXPECT_EQ(options->with, std::set<std::string>{"row_ends"});
  EXPECT_EQ(options->dist, Dist::kTies);
  EXPECT_EQ(options->seed, 9u);
  EXPECT_TRUE(options->inputs.empty());
  job.dtypes = {{"input", "f64"}};
  EXPECT_FALSE(job.Options().ok());
}

TEST(IsolatedRunnerTest, CrashesHangsAndWrongResultsAreRecordedAndTheSweepGoesOn) {
  IsolatedRunner runner = Runner();
  Measurement m = runner.Measure("topk/faulty", {{"mode", "ok"}}, 5);
  ASSERT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_EQ(m.reps, 5);
  EXPECT_GT(m.median_ns, 0);
  EXPECT_LE(m.min_ns, m.median_ns);
  EXPECT_LE(m.median_ns, m.max_ns);

  // Re-measured (as halving does): no second check, the repetitions asked.
  m = runner.Measure("topk/faulty", {{"mode", "ok"}}, 3);
  ASSERT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_EQ(m.reps, 3);

  m = runner.Measure("topk/faulty", {{"mode", "wrong"}}, 5);
  EXPECT_EQ(m.status, TrialStatus::kWrongResult);
  EXPECT_THAT(m.error, HasSubstr("values[0, 0]"));

  m = runner.Measure("topk/faulty", {{"mode", "crash"}}, 5);
  EXPECT_EQ(m.status, TrialStatus::kCrashed);
  EXPECT_THAT(m.error, HasSubstr("signal 11"));

  m = runner.Measure("topk/faulty", {{"mode", "hang"}}, 5);
  EXPECT_EQ(m.status, TrialStatus::kTimedOut);
  EXPECT_THAT(m.error, HasSubstr("no result within 3 s"));

  m = runner.Measure("topk/sort", {{"method", "nth_element"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_EQ(runner.workers_started(), 3);  // the first, then after the crash and the hang

  m = runner.Measure("topk/faulty", {{"mode", "sideways"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kIllegal);
  EXPECT_THAT(m.error, HasSubstr("'sideways' is not one of ok, slow, wrong, crash, hang"));
  m = runner.Measure("topk/nope", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kError);
  EXPECT_THAT(m.error, HasSubstr("no kernel 'topk/nope'"));
  EXPECT_EQ(runner.workers_started(), 3);
}

TEST(IsolatedRunnerTest, OneRepIsTheCheckedRun) {
  IsolatedRunner runner = Runner();
  Measurement m = runner.Measure("topk/faulty", {{"mode", "slow"}}, 1);
  ASSERT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_EQ(m.reps, 1);
  EXPECT_GE(m.median_ns, 20e6);
}

TEST(IsolatedRunnerTest, TheJobsOptionsReachTheWorker) {
  // bf16 rows with ragged ranges, every bit pattern, smallest first: the
  // faulty kernel's ok mode and topk/sort still match the reference there,
  // and its wrong mode is still caught.
  WorkerJob job = Job();
  job.values.emplace_back("largest", "0");
  job.dtypes = {{"input", "bf16"}};
  job.with = {"row_starts", "row_ends"};
  job.dist = Dist::kBits;
  job.seed = 5;
  job.warmup = 0;
  job.threads = 1;
  IsolatedRunner runner = Runner(job);
  Measurement m = runner.Measure("topk/sort", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  m = runner.Measure("topk/faulty", {{"mode", "ok"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  m = runner.Measure("topk/radix", {{"capacity", "256"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  m = runner.Measure("topk/faulty", {{"mode", "wrong"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kWrongResult);
  EXPECT_EQ(runner.workers_started(), 1);
}

TEST(IsolatedRunnerTest, AProblemTheWorkerCannotBuildIsAnErrorForEveryCandidate) {
  WorkerJob job = Job();
  job.values = {{"batch", "4"}, {"n", "10"}, {"k", "11"}};
  IsolatedRunner runner = Runner(job);
  for (int i = 0; i < 2; ++i) {
    Measurement m = runner.Measure("topk/sort", {}, 3);
    EXPECT_EQ(m.status, TrialStatus::kError);
    EXPECT_THAT(m.error, HasSubstr("k=11 exceeds the row length n=10"));
  }
  EXPECT_EQ(runner.workers_started(), 1);
}

TEST(IsolatedRunnerTest, AnUnknownOpOrPluginIsAnErrorForEveryCandidate) {
  WorkerJob job = Job();
  job.op = "frobnicate";
  IsolatedRunner unknown_op = Runner(job);
  Measurement m = unknown_op.Measure("frobnicate/x", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kError);
  EXPECT_THAT(m.error, HasSubstr("unknown op 'frobnicate'"));

  job = Job();
  job.plugins.push_back("/nonexistent/kreg_nope.so");
  IsolatedRunner missing_plugin = Runner(job);
  m = missing_plugin.Measure("topk/sort", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kError);
  EXPECT_THAT(m.error, HasSubstr("/nonexistent/kreg_nope.so"));
}

// axpy (out += alpha * x) has an in-out tensor: each timed run starts from
// the restored accumulator, and the checked run matches the reference.
WorkerJob AxpyJob() {
  WorkerJob job;
  job.op = "axpy";
  job.values = {{"n", "100000"}, {"alpha", "0.5"}};
  job.plugins = {std::string(KREG_AXPY_PLUGIN_DIR) + "/test_axpy.so"};
  return job;
}

TEST(IsolatedRunnerTest, MeasuresAKernelWithAnInOutTensor) {
  IsolatedRunner runner = Runner(AxpyJob());
  Measurement m = runner.Measure("axpy/blocked", {{"block", "1024"}}, 7);
  ASSERT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_GT(m.median_ns, 0);
  EXPECT_GE(m.reps, 1);
  EXPECT_LE(m.reps, 7);
  EXPECT_LE(m.min_ns, m.median_ns);
  EXPECT_LE(m.median_ns, m.max_ns);
  // Re-measured: already verified, still ok.
  m = runner.Measure("axpy/blocked", {{"block", "1024"}}, 5);
  ASSERT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_GT(m.median_ns, 0);
  const uint32_t avx2_fma = KREG_ISA_AVX2 | KREG_ISA_FMA;
  if ((CpuIsa() & avx2_fma) == avx2_fma) {
    m = runner.Measure("axpy/blocked", {{"block", "256"}, {"unroll", "avx2"}, {"prefetch", "1"}}, 5);
    EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
    EXPECT_GT(m.median_ns, 0);
  }
  m = runner.Measure("axpy/reference", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  // Illegal: above the parameter's range, and above the cap for this n.
  m = runner.Measure("axpy/blocked", {{"block", "131072"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kIllegal);
  EXPECT_THAT(m.error, HasSubstr("block"));
  EXPECT_EQ(runner.workers_started(), 1);

  WorkerJob small = AxpyJob();
  small.values = {{"n", "1000"}};
  small.dtypes = {{"x", "bf16"}};
  IsolatedRunner capped = Runner(small);
  m = capped.Measure("axpy/blocked", {{"block", "2048"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kIllegal);
  EXPECT_THAT(m.error, HasSubstr("2048 is not one of"));
  m = capped.Measure("axpy/blocked", {{"block", "512"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_GT(m.median_ns, 0);
}

}  // namespace
}  // namespace kreg
