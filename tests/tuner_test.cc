// Candidates measured in a worker process (the kreg-worker program): crashes,
// hangs and wrong results are recorded as such and the next candidate still
// runs; a problem the worker cannot build is an error for every candidate,
// with the worker's own reason; an op with an in-out tensor (axpy) is
// measured like any other; legality checks run in the worker too, and one
// that crashes or hangs is recorded as such. The protocol carries any bytes.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/npy.h"
#include "kreg/registry.h"
#include "kreg/worker.h"
#include "kreg/worker.pb.h"

namespace kreg {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

WorkerJob Job() {
  WorkerJob job;
  job.op = "topk";
  job.values = {{"batch", "4"}, {"n", "1000"}, {"k", "10"}};
  job.plugins = {std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so",
                 std::string(KREG_TEST_PLUGIN_DIR) + "/faulty/test_faulty.so"};
  return job;
}

IsolatedRunner Runner(WorkerJob job = Job(), double timeout = 3.0) {
  return IsolatedRunner({KREG_WORKER_BIN}, std::move(job), timeout);
}

std::string Dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/kreg_tuner_" + std::to_string(getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name); old != nullptr) old_ = old;
    had_ = getenv(name) != nullptr;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(WorkerJobTest, RoundTripsThroughItsMessageWithAnyBytes) {
  WorkerJob job = Job();
  job.values.emplace_back("largest", "0");
  job.dtypes = {{"", "bf16"}, {"input", "f32"}};
  job.with = {"row_starts", "row_ends"};
  job.dist = Dist::kBits;
  job.partition = Partition::kSkewed;
  job.seed = 42;
  // What a tab- or ';'-split line could not carry: separators, newlines, a
  // NUL, bytes that are not UTF-8.
  static constexpr char kOdd[] = "a;b\tc\nd:e=f,g\0h\xff\xfe.npy";
  const std::string odd(kOdd, sizeof kOdd - 1);
  ASSERT_EQ(odd.size(), 21u);
  job.input_files = {{"input", "/tmp/" + odd}, {"na\tme;", "/x;y/z.npy"}};
  job.plugins.push_back("/plugins/" + odd + ".so");
  job.warmup = 3;
  job.threads = 2;
  job.max_seconds_per_run = 1.5;
  worker::Job proto;
  job.ToProto(&proto);
  worker::Job wire;
  ASSERT_TRUE(wire.ParseFromString(proto.SerializeAsString()));
  absl::StatusOr<WorkerJob> back = WorkerJob::FromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
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
  worker::Job again;
  back->ToProto(&again);
  EXPECT_EQ(again.SerializeAsString(), proto.SerializeAsString());

  // Defaults for what an empty message leaves out; unknown names refused.
  absl::StatusOr<WorkerJob> empty = WorkerJob::FromProto(worker::Job());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->dist, Dist::kNormal);
  EXPECT_EQ(empty->partition, Partition::kRandom);
  worker::Job bad = proto;
  bad.set_dist("sideways");
  EXPECT_FALSE(WorkerJob::FromProto(bad).ok());
  bad = proto;
  bad.set_partition("sideways");
  EXPECT_FALSE(WorkerJob::FromProto(bad).ok());
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


// The user's own inputs, at paths the old line protocol could not carry.
TEST(IsolatedRunnerTest, AnInputPathWithASemicolonAndATabWorks) {
  const std::string dir = Dir("odd") + "/a;b\tc";
  std::filesystem::create_directories(dir);
  Tensor input(DType::kF32, {4, 1000});
  FillRandom(input, Dist::kNormal, 3);
  ASSERT_TRUE(WriteNpy(dir + "/x;1\t.npy", input).ok());
  WorkerJob job = Job();
  job.values = {{"k", "10"}};
  job.input_files = {{"input", dir + "/x;1\t.npy"}};
  IsolatedRunner runner = Runner(job);
  Measurement m = runner.Measure("topk/sort", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  EXPECT_GT(m.median_ns, 0);
  m = runner.Measure("topk/faulty", {{"mode", "wrong"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kWrongResult) << m.error;
  std::vector<Legality> legal = runner.CheckLegal("topk/sort", {{{"method", "nth_element"}}});
  ASSERT_EQ(legal.size(), 1u);
  EXPECT_EQ(legal[0].status, TrialStatus::kOk) << legal[0].why;
  EXPECT_EQ(runner.workers_started(), 1);
}

TEST(IsolatedRunnerTest, AMissingInputFileIsNamedInEveryCandidatesError) {
  const std::string missing = Dir("missing") + "/no;such\tfile.npy";
  WorkerJob job = Job();
  job.values = {{"k", "10"}};
  job.input_files = {{"input", missing}};
  IsolatedRunner runner = Runner(job);
  for (int i = 0; i < 2; ++i) {
    Measurement m = runner.Measure("topk/sort", {}, 3);
    EXPECT_EQ(m.status, TrialStatus::kError);
    EXPECT_THAT(m.error, HasSubstr(missing));
  }
  std::vector<Legality> legal = runner.CheckLegal("topk/sort", {{}, {{"method", "nth_element"}}});
  ASSERT_EQ(legal.size(), 2u);
  for (const Legality& l : legal) {
    EXPECT_EQ(l.status, TrialStatus::kError);
    EXPECT_THAT(l.why, HasSubstr(missing));
  }
  EXPECT_EQ(runner.workers_started(), 1);
}

WorkerJob BadCheckJob() {
  WorkerJob job = Job();
  job.plugins = {std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so",
                 std::string(KREG_TEST_PLUGIN_DIR) + "/bad_check/test_bad_check.so"};
  return job;
}

TEST(IsolatedRunnerTest, LegalityIsCheckedInTheWorkerAndACheckThatCrashesOrHangsIsRecorded) {
  IsolatedRunner runner = Runner(BadCheckJob());
  // Legal, refused by the kernel's check, refused by the host's value check.
  std::vector<Legality> legal =
      runner.CheckLegal("topk/bad_check", {{{"check", "ok"}}, {{"check", "refuse"}}, {{"check", "sideways"}}, {}});
  ASSERT_EQ(legal.size(), 4u);
  EXPECT_EQ(legal[0].status, TrialStatus::kOk) << legal[0].why;
  EXPECT_TRUE(legal[0].legal());
  EXPECT_EQ(legal[0].why, "");
  EXPECT_EQ(legal[1].status, TrialStatus::kIllegal);
  EXPECT_THAT(legal[1].why, HasSubstr("refused; as asked"));
  EXPECT_EQ(legal[2].status, TrialStatus::kIllegal);
  EXPECT_THAT(legal[2].why, HasSubstr("'sideways' is not one of ok, crash, hang, refuse"));
  EXPECT_EQ(legal[3].status, TrialStatus::kOk) << legal[3].why;
  EXPECT_EQ(runner.workers_started(), 1);

  // A check that crashes: the whole batch is recorded as crashed.
  legal = runner.CheckLegal("topk/bad_check", {{{"check", "ok"}}, {{"check", "crash"}}});
  ASSERT_EQ(legal.size(), 2u);
  for (const Legality& l : legal) {
    EXPECT_EQ(l.status, TrialStatus::kCrashed);
    EXPECT_EQ(l.why, "the kernel's check crashed: worker killed by signal 11 (Segmentation fault)");
  }
  // A check that hangs: killed after the timeout.
  const auto start = std::chrono::steady_clock::now();
  legal = runner.CheckLegal("topk/bad_check", {{{"check", "hang"}}, {{"check", "ok"}}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(legal.size(), 2u);
  for (const Legality& l : legal) {
    EXPECT_EQ(l.status, TrialStatus::kTimedOut);
    EXPECT_THAT(l.why, AllOf(HasSubstr("the kernel's check hung"), HasSubstr("no result within 3 s")));
  }
  EXPECT_GE(seconds, 3.0);
  EXPECT_LT(seconds, 30.0);
  EXPECT_EQ(runner.workers_started(), 2);  // the first crashed, the second hung

  // The runner is still usable: checks and measurements in a fresh worker.
  legal = runner.CheckLegal("topk/bad_check", {{{"check", "ok"}}});
  ASSERT_EQ(legal.size(), 1u);
  EXPECT_EQ(legal[0].status, TrialStatus::kOk) << legal[0].why;
  Measurement m = runner.Measure("topk/bad_check", {{"check", "ok"}}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  m = runner.Measure("topk/sort", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
  legal = runner.CheckLegal("topk/sort", {{{"method", "nth_element"}}, {{"method", "sideways"}}});
  ASSERT_EQ(legal.size(), 2u);
  EXPECT_EQ(legal[0].status, TrialStatus::kOk) << legal[0].why;
  EXPECT_EQ(legal[1].status, TrialStatus::kIllegal);
  EXPECT_EQ(runner.workers_started(), 3);

  // An unknown kernel is an error, not a refusal; an empty batch asks nothing.
  legal = runner.CheckLegal("topk/nope", {{}, {}});
  ASSERT_EQ(legal.size(), 2u);
  EXPECT_EQ(legal[0].status, TrialStatus::kError);
  EXPECT_THAT(legal[1].why, HasSubstr("no kernel 'topk/nope'"));
  EXPECT_TRUE(runner.CheckLegal("topk/sort", {}).empty());
  EXPECT_EQ(runner.workers_started(), 3);
}

// One request per kernel, however many candidates: larger than a pipe's
// buffer, written while the fresh worker is still setting up.
TEST(IsolatedRunnerTest, ALargeBatchIsCheckedInOneRequest) {
  IsolatedRunner runner = Runner(BadCheckJob());
  std::vector<Params> configs;
  for (int i = 0; i < 20000; ++i) configs.push_back({{"check", i % 2 == 0 ? "ok" : "refuse"}});
  std::vector<Legality> legal = runner.CheckLegal("topk/bad_check", configs);
  ASSERT_EQ(legal.size(), configs.size());
  for (size_t i = 0; i < legal.size(); ++i) {
    ASSERT_EQ(legal[i].status, i % 2 == 0 ? TrialStatus::kOk : TrialStatus::kIllegal) << i << ": " << legal[i].why;
  }
  EXPECT_EQ(runner.workers_started(), 1);
}

TEST(IsolatedRunnerTest, TheStopFlagInterruptsAHangingCheck) {
  IsolatedRunner runner = Runner(BadCheckJob(), /*timeout=*/60);
  std::atomic<bool> stop{false};
  runner.set_stop(&stop);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    stop = true;
  });
  const auto start = std::chrono::steady_clock::now();
  std::vector<Legality> legal = runner.CheckLegal("topk/bad_check", {{{"check", "hang"}}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stopper.join();
  ASSERT_EQ(legal.size(), 1u);
  EXPECT_EQ(legal[0].status, TrialStatus::kError);
  EXPECT_EQ(legal[0].why, "interrupted");
  EXPECT_LT(seconds, 10.0);
  stop = false;
  legal = runner.CheckLegal("topk/bad_check", {{{"check", "ok"}}});
  ASSERT_EQ(legal.size(), 1u);
  EXPECT_EQ(legal[0].status, TrialStatus::kOk) << legal[0].why;
  EXPECT_EQ(runner.workers_started(), 2);
}

TEST(IsolatedRunnerTest, AProblemTheWorkerCannotBuildFailsEveryCheck) {
  WorkerJob job = BadCheckJob();
  job.values = {{"batch", "4"}, {"n", "10"}, {"k", "11"}};
  IsolatedRunner runner = Runner(job);
  std::vector<Legality> legal = runner.CheckLegal("topk/bad_check", {{{"check", "ok"}}, {{"check", "crash"}}});
  ASSERT_EQ(legal.size(), 2u);
  for (const Legality& l : legal) {
    EXPECT_EQ(l.status, TrialStatus::kError);
    EXPECT_THAT(l.why, HasSubstr("k=11 exceeds the row length n=10"));
  }
  EXPECT_EQ(runner.workers_started(), 1);
}

// A program that does not speak the protocol: its failure is the worker's
// set-up failing, reported for every candidate, not a crash of each.
TEST(IsolatedRunnerTest, AWorkerThatIsNotOneIsAnErrorForEveryCandidate) {
  IsolatedRunner runner({"/bin/echo", "hello"}, Job(), 3.0);
  for (int i = 0; i < 2; ++i) {
    Measurement m = runner.Measure("topk/sort", {}, 3);
    EXPECT_EQ(m.status, TrialStatus::kError);
    EXPECT_THAT(m.error, HasSubstr("the worker failed while setting the problem up"));
  }
  std::vector<Legality> legal = runner.CheckLegal("topk/sort", {{}});
  ASSERT_EQ(legal.size(), 1u);
  EXPECT_EQ(legal[0].status, TrialStatus::kError);
  EXPECT_EQ(runner.workers_started(), 1);

  IsolatedRunner missing({"/nonexistent/kreg-worker"}, Job(), 3.0);
  Measurement m = missing.Measure("topk/sort", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kError);
  EXPECT_THAT(m.error, HasSubstr("/nonexistent/kreg-worker"));
}

// The tuner killed between spawning its worker and the worker's first
// instruction: the worker, reparented, finds a parent other than the one
// IsolatedRunner named (kWorkerParentEnv) and exits, rather than run on as
// an orphan (its parent-death signal is set too late to stop it; a job whose
// kernel hangs would then never end). Its stdin stays open here, so a worker
// that did not check would wait on it for ever.
TEST(IsolatedRunnerTest, AWorkerWhoseTunerIsAlreadyGoneDoesNotStart) {
  // Made before the fork: the child of a threaded process may only exec.
  std::string named = absl::StrCat(kWorkerParentEnv, "=1");  // not the child's parent, the test
  char* envp[] = {named.data(), nullptr};
  int in[2], err[2];
  ASSERT_EQ(pipe(in), 0);
  ASSERT_EQ(pipe(err), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(err[1], 2);
    execle(KREG_WORKER_BIN, KREG_WORKER_BIN, static_cast<char*>(nullptr), envp);
    _exit(127);
  }
  close(in[0]);
  close(err[1]);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  std::string said(512, '\0');
  said.resize(std::max<ssize_t>(0, read(err[0], said.data(), said.size())));
  close(in[1]);
  close(err[0]);
  ASSERT_EQ(done, pid) << "the worker ran on for 10 s";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(said, HasSubstr("kreg-worker: the tuner (pid 1) is gone; not starting"));
}

std::string RealPath(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::canonical(path, ec);
  return ec ? "" : p.string();
}

TEST(FindWorkerTest, FindsTheWorkerNextToThisBinary) {
  // bin/tuner_test and libexec/kreg/kreg-worker, in the build tree as in an
  // install (wherever it was moved).
  const std::string self = RealPath("/proc/self/exe");
  const std::string expected =
      RealPath(std::filesystem::path(self).parent_path().string() + "/../libexec/kreg/kreg-worker");
  ASSERT_FALSE(expected.empty());
  ScopedEnv unset("KREG_WORKER", nullptr);
  absl::StatusOr<std::vector<std::string>> found = FindWorker();
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0], expected);
  IsolatedRunner runner(*found, Job(), 3.0);
  Measurement m = runner.Measure("topk/sort", {}, 3);
  EXPECT_EQ(m.status, TrialStatus::kOk) << m.error;
}

TEST(FindWorkerTest, KregWorkerOverridesAndMustBeExecutable) {
  {
    ScopedEnv set("KREG_WORKER", KREG_WORKER_BIN);
    absl::StatusOr<std::vector<std::string>> found = FindWorker();
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(*found, std::vector<std::string>{KREG_WORKER_BIN});
  }
  ScopedEnv set("KREG_WORKER", "/nonexistent/kreg-worker");
  absl::StatusOr<std::vector<std::string>> found = FindWorker();
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(), HasSubstr("KREG_WORKER=/nonexistent/kreg-worker"));
}

}  // namespace
}  // namespace kreg
