// Candidates measured in a worker process: crashes, hangs and wrong results
// are recorded as such and the next candidate still runs.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/worker.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;

WorkerJob Job() {
  WorkerJob job;
  job.op = "topk";
  job.dims = {{"batch", 4}, {"n", 1000}, {"k", 10}};
  job.plugins = {std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so",
                 std::string(KREG_TEST_PLUGIN_DIR) + "/faulty/test_faulty.so"};
  return job;
}

IsolatedRunner Runner(WorkerJob job = Job()) { return IsolatedRunner({KREG_BIN, "__worker"}, std::move(job), 3.0); }

TEST(WorkerJobTest, RoundTrips) {
  WorkerJob job = Job();
  job.dtype = DType::kBF16;
  job.dist = Dist::kBits;
  job.input_files = {{"input", "/tmp/x.npy"}};
  job.threads = 2;
  absl::StatusOr<WorkerJob> back = WorkerJob::Parse(job.Serialize().substr(0, job.Serialize().size() - 1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Serialize(), job.Serialize());
}

TEST(IsolatedRunnerTest, CrashesHangsAndWrongResultsAreRecordedAndTheSweepGoesOn) {
  IsolatedRunner runner = Runner();
  Measurement m = runner.Measure("topk/faulty", {{"mode", "ok"}}, 5);
  ASSERT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_EQ(m.reps, 5);
  EXPECT_GT(m.median_ns, 0);
  EXPECT_LE(m.min_ns, m.median_ns);

  // Re-measured (as halving does): no second check, the repetitions asked.
  m = runner.Measure("topk/faulty", {{"mode", "ok"}}, 3);
  ASSERT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_EQ(m.reps, 3);

  m = runner.Measure("topk/faulty", {{"mode", "wrong"}}, 5);
  EXPECT_EQ(m.status, TrialStatus::kWrongResult);
  EXPECT_THAT(m.error, HasSubstr("row 0, position 0"));

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
  m = runner.Measure("topk/nope", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kError);
  EXPECT_THAT(m.error, HasSubstr("no kernel 'topk/nope'"));
}

TEST(IsolatedRunnerTest, OneRepIsTheCheckedRun) {
  IsolatedRunner runner = Runner();
  Measurement m = runner.Measure("topk/faulty", {{"mode", "slow"}}, 1);
  ASSERT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_EQ(m.reps, 1);
  EXPECT_GE(m.median_ns, 20e6);
}

TEST(IsolatedRunnerTest, AProblemTheWorkerCannotBuildIsAnErrorForEveryCandidate) {
  WorkerJob job = Job();
  job.dims = {{"batch", 4}, {"n", 10}, {"k", 11}};
  IsolatedRunner runner = Runner(job);
  for (int i = 0; i < 2; ++i) {
    Measurement m = runner.Measure("topk/sort", {}, 3);
    EXPECT_EQ(m.status, TrialStatus::kError);
    EXPECT_THAT(m.error, HasSubstr("k=11 exceeds the row length n=10"));
  }
  EXPECT_EQ(runner.workers_started(), 1);
}

}  // namespace
}  // namespace kreg
