// kreg tune, query, run --db and db, end to end through the binary: isolation
// of crashing and hanging candidates, checkpoints and resume, Ctrl-C and
// budgets; keys of optional inputs (ragged topk rows) and of the op's data
// class (any bytes); --json records; db diff's exit code and db slim; and a
// new op (axpy, declared by a test plugin) tuned, queried and run with no
// host change.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/lut.h"
#include "kreg/npy.h"
#include "kreg/problem.h"
#include "kreg/tensor.h"
#include "tests/run_kreg.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

const std::string kPlugins = std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty";

Result Kreg(const std::string& args) { return RunKreg(kPlugins, args); }

// `kreg --plugin-path DIR args` (the dashed spelling).
Result KregWith(const std::string& plugin_dir, const std::string& args) {
  return RunCommand("KREG_TABLE_PATH=", KREG_BIN, "--plugin-path " + plugin_dir + " " + args);
}

// A scratch folder for input files.
std::string Dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/kreg_tune_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A table of this test process's own (two builds' tests may run at once).
std::string Db(const std::string& name) {
  std::string path = ::testing::TempDir() + "/kreg_tune_" + name + "_" + std::to_string(getpid()) + ".lut";
  std::filesystem::remove(path);
  return path;
}

const tuning::Trial* Trial(const TuningDb& db, const std::string& mode) {
  for (const tuning::Entry& e : db.proto().entries()) {
    for (const tuning::Trial& t : e.trials()) {
      if (t.variant() == "faulty" && t.config().params(0).choice() == mode) return &t;
    }
  }
  return nullptr;
}

TEST(TuneTest, CrashesHangsAndWrongResultsAreRecordedAndTheBestStillWins) {
  const std::string db = Db("faulty");
  Result r = Kreg("tune topk --dims batch=4,n=2000,k=10 --variants faulty --strategy exhaustive --no-thread-round --reps 3 "
                  "--timeout 2 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("7 candidates, 7 measured, 0 reused, 5 failed"));
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 1u);
  EXPECT_EQ(Trial(*table, "ok")->status(), tuning::Trial::OK);
  EXPECT_EQ(Trial(*table, "slow")->status(), tuning::Trial::OK);
  EXPECT_EQ(Trial(*table, "wrong")->status(), tuning::Trial::WRONG_RESULT);
  EXPECT_EQ(Trial(*table, "crash")->status(), tuning::Trial::CRASHED);
  EXPECT_THAT(Trial(*table, "crash")->error(), HasSubstr("signal 11"));
  EXPECT_EQ(Trial(*table, "hang")->status(), tuning::Trial::TIMED_OUT);
  EXPECT_EQ(Trial(*table, "killed")->status(), tuning::Trial::CRASHED);
  EXPECT_EQ(Trial(*table, "killed")->signal(), SIGKILL);
  EXPECT_EQ(Trial(*table, "greedy"), nullptr);  // an error (no workspace) is not kept
  EXPECT_THAT(r.out, HasSubstr("cannot allocate 18446744073709551605 bytes of workspace"));
  const tuning::Entry& entry = table->proto().entries(0);
  EXPECT_EQ(entry.best().config().params(0).choice(), "ok");
  EXPECT_EQ(entry.runner_up().config().params(0).choice(), "slow");
  EXPECT_EQ(entry.strategy(), "exhaustive");
}

// A gmm kernel that writes past its output: just past it, the tensor's
// guard catches the write (a wrong result naming the tensor); far past it,
// the heap is corrupted and the worker dies (or, if it survives, the guard
// still says so). Either way the sweep goes on and the correct mode wins.
TEST(TuneTest, WritesPastAnOutputAreCaughtAndTheSweepGoesOn) {
  const std::string db = Db("overrun");
  Result r = KregWith(std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty_gmm",
                      "tune gmm --dims m=64,k=32,n=16,groups=2 --variants faulty --strategy exhaustive --no-thread-round --reps 3 "
                      "--timeout 5 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("3 candidates, 3 measured, 0 reused, 2 failed"));
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  const tuning::Trial* overrun = Trial(*table, "overrun");
  ASSERT_NE(overrun, nullptr);
  EXPECT_EQ(overrun->status(), tuning::Trial::WRONG_RESULT);
  EXPECT_THAT(overrun->error(), HasSubstr("the kernel wrote past the end of 'out' (16 of the 256 guard bytes"));
  const tuning::Trial* scribble = Trial(*table, "scribble");
  ASSERT_NE(scribble, nullptr);
  EXPECT_THAT(scribble->status(), ::testing::AnyOf(tuning::Trial::WRONG_RESULT, tuning::Trial::CRASHED));
  EXPECT_EQ(table->proto().entries(0).best().config().params(0).choice(), "ok");
  // kreg run, unchecked: the write past the end still fails it.
  r = KregWith(std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty_gmm",
               "run gmm/faulty --dims m=64,k=32,n=16,groups=2 --param mode=overrun");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("kreg run: the kernel wrote past the end of 'out'"));
}

// bf16 subnormal inputs may be read as zero (gmm's tolerance allows it, as
// bf16 dot-product instructions do it); f32 subnormals may not. lhs is
// subnormal (1e-39) and rhs large (1e36): each product is 1e-3, so reading
// lhs as zero is far outside the f32 tolerance.
TEST(TuneTest, Bf16SubnormalsMayBeReadAsZeroF32OnesMayNot) {
  const std::string dir = Dir("subnormal");
  const std::string path = std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty_gmm";
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const std::string name(DTypeName(dtype));
    Tensor lhs(dtype, {64, 32}), rhs(dtype, {2, 32, 16});
    auto fill = [](Tensor& t, float x, float y) {  // x and y alternate; bf16: their top halves
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, i % 2 ? &x : &y, 4);
        if (t.dtype() == DType::kBF16) {
          t.data_as<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
        } else {
          t.data_as<uint32_t>()[i] = bits;
        }
      }
    };
    fill(lhs, 1e-39f, 2e-39f);
    fill(rhs, 1e36f, 1e36f);
    ASSERT_TRUE(WriteNpy(dir + "/lhs_" + name + ".npy", lhs).ok());
    ASSERT_TRUE(WriteNpy(dir + "/rhs_" + name + ".npy", rhs).ok());
    const std::string run = "run gmm/flush --dims groups=2 --reps 1 --warmup 0 --check --input lhs=" + dir + "/lhs_" +
                            name + ".npy --input rhs=" + dir + "/rhs_" + name + ".npy --param dtype=" + name;
    Result r = KregWith(path, run);
    if (dtype == DType::kBF16) {
      EXPECT_EQ(r.code, 0) << r.out << r.stderr_text;
      EXPECT_THAT(r.out, HasSubstr("check ok"));
    } else {
      EXPECT_EQ(r.code, 1) << r.out << r.stderr_text;
      EXPECT_THAT(r.stderr_text, HasSubstr("check failed"));
    }
  }
}

// A stored failure the environment may have caused is measured again by the
// next sweep: a crash by SIGKILL (the OOM killer's signal). The kernel's own
// crash (SIGSEGV) and wrong result are kept. Another thread count is
// another trial: measured afresh.
TEST(TuneTest, FailuresTheEnvironmentMayHaveCausedAreTriedAgain) {
  const std::string db = Db("environment");
  const std::string args = "tune topk --dims batch=4,n=2000,k=10 --variants faulty --strategy exhaustive --reps 3 "
                           "--timeout 1 --no-thread-round --db " + db;
  Result r = Kreg(args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("7 candidates, 7 measured, 0 reused"));
  r = Kreg(args);  // killed and greedy (not kept) again
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("7 candidates, 2 measured, 5 reused"));
  r = Kreg(args + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("7 candidates, 7 measured, 0 reused"));
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  int crashes = 0;
  for (const tuning::Trial& t : table->proto().entries(0).trials()) {
    if (t.config().params(0).choice() != "crash") continue;
    ++crashes;
    EXPECT_EQ(t.signal(), SIGSEGV);
  }
  EXPECT_EQ(crashes, 2);  // on all cores and on 1 thread
}

// Without --threads, the leaders are measured again on fewer threads than
// cores (on 1, 2, 4, ...), each a trial of its own; query and run answer
// with the thread count that was fastest.
TEST(TuneTest, TheLeadersAreTriedOnFewerThreads) {
  if (ThisMachine().cores() < 2) GTEST_SKIP() << "one core: no fewer threads to try";
  const std::string db = Db("thread_round");
  Result r = Kreg("tune topk --dims batch=4,n=3000,k=32 --variants sort,radix --strategy exhaustive --reps 3 --db " +
                  db);
  ASSERT_EQ(r.code, 0) << r.out;
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  const tuning::Entry& e = table->proto().entries(0);
  std::set<std::string> on_one;  // variants measured on 1 thread
  for (const tuning::Trial& t : e.trials()) {
    if (t.threads() == 1) on_one.insert(t.variant());
  }
  EXPECT_FALSE(on_one.empty());
  EXPECT_TRUE(on_one.contains(e.best().variant()) || e.best().threads() == 1) << e.DebugString();
  // Asked for one thread: the fastest measurement on one.
  r = Kreg("query topk --dims batch=4,n=3000,k=32 --threads 1 --no-shipped --db " + db);
  EXPECT_THAT(r.out, HasSubstr("on 1 thread]")) << r.out;
  // A table whose best ran on 1 thread: query says so, run runs it so.
  tuning::Database forced = table->proto();
  for (tuning::Trial& t : *forced.mutable_entries(0)->mutable_trials()) {
    if (t.threads() == 1 && t.status() == tuning::Trial::OK) t.set_median_ns(1);
  }
  absl::StatusOr<TuningDb> one = TuningDb::FromProto(forced);
  ASSERT_TRUE(one.ok()) << one.status();
  const std::string one_db = Db("thread_round_one");
  ASSERT_TRUE(one->Save(one_db).ok());
  r = Kreg("query topk --dims batch=4,n=3000,k=32 --no-shipped --db " + one_db);
  EXPECT_THAT(r.out, HasSubstr("on 1 thread]")) << r.out;
  r = Kreg("--json query topk --dims batch=4,n=3000,k=32 --no-shipped --db " + one_db);
  EXPECT_THAT(r.out, HasSubstr("\"threads\":1")) << r.out;
  r = Kreg("run topk --dims batch=4,n=3000,k=32 --check --no-shipped --db " + one_db);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("on 1 thread")) << r.out;
  r = Kreg("tune topk --dims batch=4,n=3000,k=32 --variants sort,radix --strategy exhaustive --reps 3 "
           "--no-thread-round --db " + Db("no_thread_round"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("thread"))) << r.out;
}

// A collective tuned on thread ranks: every rank runs each candidate at
// once in the worker; a candidate that dies on one rank is recorded as
// crashed, one that leaves a rank silent, fails on it or sends the wrong
// size as failed (within the comm timeout), and the sweep goes on.
TEST(TuneTest, CollectivesAreTunedOnThreadRanksAndTheirFaultsRecorded) {
  const std::string db = Db("collective");
  const auto start = std::chrono::steady_clock::now();
  Result r = RunKreg(std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty_collective",
                     "tune allreduce --ranks 2 --dims count=1000 --variants faulty,ring --strategy exhaustive --reps 3 "
                     "--comm-timeout 1 --timeout 20 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60);
  EXPECT_THAT(r.out, HasSubstr("allreduce f32 count=1000,ranks=2 [backend=threads]"));
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 1u);
  std::map<std::string, int> seen;  // "mode culprit status"
  for (const tuning::Trial& t : table->proto().entries(0).trials()) {
    if (t.variant() != "faulty") continue;
    const bool misbehaves = t.config().params(1).int_value() < 2;  // culprits 2 and 3 are not ranks here
    const std::string mode = t.config().params(0).choice();
    const tuning::Trial::Status want = !misbehaves || mode == "ok" ? tuning::Trial::OK
                                       : mode == "die"             ? tuning::Trial::CRASHED
                                                                   : tuning::Trial::ERROR;
    EXPECT_EQ(t.status(), want) << mode << " on rank " << t.config().params(1).int_value() << ": " << t.error();
    ++seen[mode];
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_NE(table->proto().entries(0).best().status(), tuning::Trial::CRASHED);
}

// The collective matmul is tuned on its mesh (--mesh gives the axes and the
// ranks), its local multiplies dispatched at gmm's default, and answered.
TEST(TuneTest, TheCollectiveMatmulIsTunedOnItsMesh) {
  const std::string db = Db("mesh");
  Result r = Kreg("tune sharded_matmul --mesh 2x1 --dims m=64,k=32,n=48 --strategy exhaustive --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("2 candidates, 2 measured, 0 reused, 0 failed"));
  r = Kreg("query sharded_matmul --mesh 2x1 --dims m=64,k=32,n=48 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[exact from m=64,k=32,n=48,ranks=2,x=2,y=1"));
  r = Kreg("run sharded_matmul --mesh 2x1 --dims m=64,k=32,n=48 --check --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact"));
  r = Kreg("tune sharded_matmul --mesh 2x2 --ranks 3 --dims m=64,k=32,n=48 --db " + db);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("--ranks 3 but the mesh x=2,y=2 has 4 ranks"));
}

// kreg calibrate records the threads backend's α-β-γ costs; queries for
// collectives nothing was tuned for then answer by the model (never the ring
// for fewer elements than ranks; the ring for large vectors), a measured
// entry still comes first, and another backend without a model gets the
// default.
TEST(TuneTest, ACalibratedCostModelAnswersUntunedCollectives) {
  const std::string db = Db("calibrated");
  Result r = Kreg("calibrate --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("threads on 2 ranks: alpha"));
  r = Kreg("query allreduce --ranks 4 --db " + db + " --dims count=3 --dims count=10000000 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<Json> answers;
  for (absl::string_view line : absl::StrSplit(r.stdout_text, '\n', absl::SkipEmpty())) {
    answers.push_back(Json::parse(line));
  }
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0]["match"], "model");
  EXPECT_NE(answers[0]["kernel"], "allreduce/ring");
  EXPECT_EQ(answers[1]["match"], "model");
  EXPECT_EQ(answers[1]["kernel"], "allreduce/ring");
  r = Kreg("tune allreduce --ranks 4 --dims count=3 --variants direct --strategy exhaustive --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  r = Kreg("query allreduce --ranks 4 --db " + db + " --dims count=3");
  EXPECT_THAT(r.out, HasSubstr("-> allreduce/direct outstanding="));
  EXPECT_THAT(r.out, HasSubstr("[exact from count=3,ranks=4"));
  r = Kreg("query allreduce --ranks 4 --backend mpi --db " + db + " --dims count=3");
  EXPECT_THAT(r.out, HasSubstr("[default: "));
}

TEST(TuneTest, AKernelCheckThatCrashesOrHangsCostsOnlyItsOwnConfigurations) {
  // Legality checks run in the worker: a check that crashes (or hangs) is
  // reported, the sweep goes on, and the kernel's other configurations are
  // still measured.
  const std::string db = Db("bad_check");
  Result r = KregWith(std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/bad_check",
                      "tune topk --dims batch=4,n=2000,k=10 --variants bad_check,sort --strategy exhaustive --no-thread-round "
                      "--reps 3 --timeout 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check crashed"));
  EXPECT_THAT(r.out, HasSubstr("check hung"));
  EXPECT_THAT(r.out, HasSubstr("3 candidates, 3 measured"));
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 1u);
  bool ok_measured = false;
  for (const tuning::Trial& t : table->proto().entries(0).trials()) {
    if (t.variant() == "bad_check") {
      EXPECT_EQ(t.config().params(0).choice(), "ok");
      ok_measured = t.status() == tuning::Trial::OK;
    }
  }
  EXPECT_TRUE(ok_measured);
}

TEST(TuneTest, AddingAVariantMeasuresOnlyWhatIsNew) {
  const std::string db = Db("resume");
  Result r = Kreg("tune topk --dims batch=4,n=3000,k=32 --variants sort --strategy exhaustive --no-thread-round --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("2 candidates, 2 measured, 0 reused"));
  r = Kreg("tune topk --dims batch=4,n=3000,k=32 --variants sort,radix --strategy exhaustive --no-thread-round --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("26 candidates, 24 measured, 2 reused"));
}

TEST(TuneTest, QueryAndDispatchedRunAnswerFromTheTable) {
  const std::string db = Db("query");
  ASSERT_EQ(Kreg("tune topk --dims batch=8,n=4000,k=16 --variants sort,heap --reps 3 --db " + db).code, 0);
  Result r = Kreg("query topk --dims batch=8,n=4000,k=16 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[exact from batch=8,n=4000,k=16"));
  r = Kreg("query topk --dims batch=16,n=5000,k=20 --db " + db + " --json");
  EXPECT_THAT(r.out, HasSubstr("\"match\":\"nearest\""));
  EXPECT_THAT(r.out, HasSubstr("\"tuned_dims\":{\"batch\":8,\"n\":4000,\"k\":16}"));
  r = Kreg("query topk --dims batch=16,n=5000,k=20 --dtype bf16 --db " + db);
  EXPECT_THAT(r.out, HasSubstr("[default: "));
  r = Kreg("run topk --db " + db + " --dims batch=8,n=4000,k=16 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact"));
  r = Kreg("db show " + db);
  EXPECT_THAT(r.out, HasSubstr("topk f32 batch=8,n=4000,k=16"));
  r = Kreg("db diff " + db + " " + db);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("the winners agree everywhere"));
}

TEST(TuneTest, AnotherMachinesShippedTableAnswersAndSaysWhose) {
  // A machine kreg sees without AVX2 (KREG_ISA_MASK) is another machine of
  // the same vendor and architecture: its table, shipped, answers here.
  const std::string dir = Dir("shipped");
  const std::string shipped = dir + "/other-machine.txtpb";
  Result r = RunKreg(kPlugins, "tune topk --dims batch=8,n=4000,k=16 --variants sort,radix --reps 3 --db " + shipped,
                     "KREG_ISA_MASK=fma");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string tables = "KREG_TABLE_PATH=" + dir;
  r = RunKreg(kPlugins, "query topk --dims batch=8,n=4000,k=16", tables);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[similar machine ("));
  EXPECT_THAT(r.out, HasSubstr(") from batch=8,n=4000,k=16, "));
  r = RunKreg(kPlugins, "query topk --dims batch=8,n=4000,k=16 --json", tables);
  ASSERT_EQ(r.code, 0) << r.out;
  const Json answer = Json::parse(r.stdout_text);
  EXPECT_EQ(answer["match"], "similar machine");
  EXPECT_EQ(answer["machine"]["isa"], Json::array({"fma"}));
  EXPECT_TRUE(answer["why"].is_null());
  Result here = RunKreg(kPlugins, "machine --json");
  ASSERT_EQ(here.code, 0) << here.out;
  EXPECT_EQ(answer["key"]["machine"], Json::parse(here.stdout_text)["id"]);
  EXPECT_NE(answer["machine"]["id"], answer["key"]["machine"]);
  // Only this machine's measurements: a default, saying why.
  r = RunKreg(kPlugins, "query topk --dims batch=8,n=4000,k=16 --machine strict", tables);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[default: no table for this machine ("));
  EXPECT_THAT(r.out, HasSubstr("(strict: no other machine asked); measured default: topk/"));
  r = RunKreg(kPlugins, "query topk --dims batch=8,n=4000,k=16 --no-shipped", tables);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[default: no table for this machine ("));
  EXPECT_THAT(r.out, HasSubstr("the op's default"));
  // Run says whose answer it ran; a table of this machine's own comes first.
  r = Kreg("run topk --db " + shipped + " --dims batch=8,n=4000,k=16 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: similar machine ("));
  const std::string own = Db("shipped_own");
  ASSERT_EQ(Kreg("tune topk --dims batch=8,n=4000,k=16 --variants heap --reps 3 --db " + own).code, 0);
  r = RunKreg(kPlugins, "query topk --dims batch=8,n=4000,k=16 --db " + own, tables);
  EXPECT_THAT(r.out, HasSubstr("-> topk/heap "));  // simd=avx2 or avx512, as this CPU has it
  EXPECT_THAT(r.out, HasSubstr("  [exact from batch=8,n=4000,k=16"));
  r = RunKreg(kPlugins, "query topk --dims batch=8,n=4000,k=16 --machine nearby", tables);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("--machine"));
}

TEST(TuneTest, BadInputGetsOneClearLineAndExitCode2) {
  const std::string db = Db("never_written");
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"tune topk --dims batch=2,n=10,k=3", "kreg tune: --db is required"},
           {"tune --dims batch=2,n=10,k=3 --db DB", "kreg tune: OP is required"},
           {"tune topk --db DB", "tune needs --dims"},
           {"tune topk --dims batch=2,n=10,k=30 --db DB", "k=30 exceeds the row length n=10"},
           {"tune topk --dims batch=2,n=10,k=3 --strategy genetic --db DB", "unknown strategy 'genetic'"},
           {"tune topk --dims batch=2,n=10,k=3 --variants quick --db DB", "no kernel 'topk/quick'"},
           // Ragged rows are optional inputs now (--with row_ends), not a dim.
           {"tune topk --dims batch=2,n=10,k=3,ragged=1 --db DB", "unknown dimension or attribute 'ragged'"},
           // Every problem is read before the first sweep starts.
           {"tune topk --dims batch=2,n=100,k=3 --dims batch=2,n=100,kk=3 --db DB", "'kk'"},
           {"tune topk --dims batch=2,n=10,k=3 --with bogus --db DB", "'bogus' is not an optional input"},
           {"tune topk --dims batch=2,n=10,k=3 --dtype f64 --db DB", "--dtype 'f64'"},
           {"tune topk --dims k=3 --input input=/nonexistent.npy --db DB", "/nonexistent.npy"},
           {"tune topk --dims batch=2,n=10,k=3 --timeout 0 --db DB", "--timeout: expected more than 0 and at most 604800 seconds (a week), got 0"},
           {"tune topk --dims batch=2,n=10,k=3 --max-list-len 0 --db DB", "--max-list-len: expected 1 to 16, got 0"},
           {"tune topk --dims batch=2,n=10,k=3 --check --db DB", "--check does not apply to 'kreg tune'"},
           {"tune topk --dims batch=2,n=10,k=3 --db DB --budgte 3", "did you mean --budget?"},
           {"tune nosuchop --dims m=3 --db DB", "unknown op 'nosuchop'"},
           {"query topk --dims batch=2,n=10,k=3 --db /nonexistent.lut", "kreg query: /nonexistent.lut"},
           {"query topk --db DB", "kreg query: --dims is required"},
           {"query topk --dims batch=2,n=10,k=3 --variants sort --db DB", "--variants does not apply to 'kreg query'"},
       }) {
    std::string line = args;
    if (size_t at = line.find("DB"); at != std::string::npos) line.replace(at, 2, db);
    Result r = Kreg(line);
    EXPECT_EQ(r.code, 2) << args << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr(message));
  }
  EXPECT_FALSE(std::filesystem::exists(db));
  const std::string corrupt = Db("corrupt");
  std::ofstream(corrupt) << "definitely not a table";
  Result r = Kreg("tune topk --dims batch=2,n=100,k=3 --variants sort --db " + corrupt);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr(corrupt));
  std::ifstream in(corrupt);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "definitely not a table");
  // A table named on the command line that is not one is bad input too.
  for (const std::string command : {"query topk --dims batch=2,n=10,k=3 --db ", "db show ", "db export ",
                                    "run topk --dims batch=2,n=10,k=3 --db "}) {
    r = Kreg(command + corrupt);
    EXPECT_EQ(r.code, 2) << command << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(corrupt)) << command;
  }
}

// Regression: a table tuned on ragged rows (row_ends given) must answer the
// same call exactly; its key's dtype signature is "f32+row_ends".
TEST(TuneTest, RaggedRowsAreTunedUnderTheirOwnKeyAndAnsweredExactly) {
  const std::string dir = Dir("ragged");
  Tensor x(DType::kF32, {6, 3000});
  FillRandom(x, Dist::kNormal, 5);
  Tensor ends(DType::kI32, {6});
  const int32_t row_ends[6] = {100, 3000, 1500, 5, 2999, 700};  // row 3: fewer than k
  std::copy(std::begin(row_ends), std::end(row_ends), ends.data_as<int32_t>());
  ASSERT_TRUE(WriteNpy(dir + "/x.npy", x).ok());
  ASSERT_TRUE(WriteNpy(dir + "/e.npy", ends).ok());
  const std::string inputs = " --input input=" + dir + "/x.npy --input row_ends=" + dir + "/e.npy";
  const std::string db = Db("ragged");

  Result r = Kreg("tune topk" + inputs + " --dims k=8 --variants sort --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("topk f32+row_ends batch=6,n=3000,k=8 @"));
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 1u);
  EXPECT_EQ(table->proto().entries(0).key().dtype(), "f32+row_ends");
  EXPECT_EQ(DimsString(KeyDims(table->proto().entries(0).key())), "batch=6,n=3000,k=8");

  r = Kreg("run topk --db " + db + inputs + " --dims k=8 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("f32+row_ends batch=6,n=3000,k=8"));
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact"));
  r = Kreg("query topk --with row_ends --dims batch=6,n=3000,k=8 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("topk f32+row_ends batch=6,n=3000,k=8 -> topk/sort"));
  EXPECT_THAT(r.out, HasSubstr("[exact from batch=6,n=3000,k=8"));
  // Random row ends of the same shape: the same key.
  r = Kreg("run topk --db " + db + " --with row_ends --dims batch=6,n=3000,k=8 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(chosen by the table: exact"));
  // Whole rows (no row_ends), or row_starts too: other keys, the default.
  r = Kreg("query topk --dims batch=6,n=3000,k=8 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("topk f32 batch=6,n=3000,k=8 -> topk/radix"));
  EXPECT_THAT(r.out, HasSubstr("[default: "));
  r = Kreg("query topk --with row_starts,row_ends --dims batch=6,n=3000,k=8 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[default: "));
  r = Kreg("run topk --db " + db + " --input input=" + dir + "/x.npy --dims k=8 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: default)"));
}

// A new op needs no host change: axpy, declared by a test plugin, is tuned,
// queried, run and shown through the same commands.
TEST(TuneTest, ANewOpTunesQueriesAndRunsThroughTheCommandLine) {
  const std::string plugins = KREG_AXPY_PLUGIN_DIR;
  const std::string db = Db("axpy");
  // Without --variants: every available kernel but the reference (the oracle).
  Result r = KregWith(plugins, "tune axpy --dims n=64 --strategy exhaustive --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("axpy f32 n=64 @"));
  EXPECT_THAT(r.out, HasSubstr(" 0 failed"));
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 1u);
  std::set<std::string> variants;
  for (const tuning::Trial& t : table->proto().entries(0).trials()) variants.insert(t.variant());
  EXPECT_TRUE(variants.count("blocked")) << r.out;
  EXPECT_FALSE(variants.count("reference")) << r.out;

  r = KregWith(plugins, "tune axpy --dims n=5000 --variants blocked --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("axpy f32 n=5000 @"));
  EXPECT_THAT(r.out, HasSubstr("axpy/blocked block="));
  r = KregWith(plugins, "query axpy --dims n=5000 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("axpy f32 n=5000 -> axpy/blocked block="));
  EXPECT_THAT(r.out, HasSubstr("[exact from n=5000"));
  r = KregWith(plugins, "query axpy --dims n=6000 --db " + db + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"match\":\"nearest\""));
  EXPECT_THAT(r.out, HasSubstr("\"tuned_dims\":{\"n\":5000}"));
  r = KregWith(plugins, "query axpy --dims n=5000 --dtype bf16 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("axpy bf16 n=5000 -> axpy/blocked"));
  EXPECT_THAT(r.out, HasSubstr("[default: "));
  // The attribute alpha is not part of the key: any alpha answers exactly.
  r = KregWith(plugins, "run axpy --db " + db + " --dims n=5000,alpha=0.5 --reps 2 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact"));
  r = KregWith(plugins, "run axpy/blocked --dims n=5000 --param block=64 --reps 2 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("block=64"));
  EXPECT_THAT(r.out, HasSubstr("check ok"));
  r = KregWith(plugins, "db show " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("axpy f32 n=64 @"));
  EXPECT_THAT(r.out, HasSubstr("axpy f32 n=5000 @"));
  // Keys axpy does not take.
  r = KregWith(plugins, "query axpy --dims n=10,k=3 --db " + db);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("'k'"));
}

// The op's data class is part of the key: axpy calls x "sparse" when more
// than half of it is exactly 0. Tuned on a sparse x, the table answers a
// sparse x exactly and a dense one with the default.
TEST(TuneTest, TheOpsDataClassKeysTuningAndDispatch) {
  const std::string plugins = KREG_AXPY_PLUGIN_DIR;
  const std::string dir = Dir("sparse");
  Tensor sparse(DType::kF32, {2000});
  for (int64_t i = 0; i < 2000; ++i) sparse.data_as<float>()[i] = i % 10 < 6 ? 0.0f : 1.0f + static_cast<float>(i % 7);
  ASSERT_TRUE(WriteNpy(dir + "/sparse.npy", sparse).ok());
  const std::string db = Db("sparse");
  Result r = KregWith(plugins, "tune axpy --input x=" + dir + "/sparse.npy --dims n=2000 --variants blocked --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("axpy f32 n=2000 [sparse] @"));
  r = KregWith(plugins, "run axpy --db " + db + " --input x=" + dir + "/sparse.npy --reps 2 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact"));
  r = KregWith(plugins, "run axpy --db " + db + " --dims n=2000 --reps 2 --check");  // dense, random
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: default)"));
  r = KregWith(plugins, "query axpy --dims n=2000 --data_class sparse --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[exact from n=2000"));
  r = KregWith(plugins, "query axpy --dims n=2000 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[default: "));
}

// Starts `kreg tune ...` in the background, its output into `log`; returns
// its pid.
pid_t Spawn(const std::string& args, const std::string& log = "/dev/null") {
  pid_t pid = fork();
  if (pid == 0) {
    std::string cmd = std::string(KREG_BIN) + " --plugin_path=" + kPlugins + " " + args + " >" + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits until the table at `db` holds the trial of faulty mode `mode`.
bool WaitForTrial(const std::string& db, const std::string& mode) {
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<TuningDb> table = TuningDb::Load(db);
    if (table.ok() && Trial(*table, mode) != nullptr) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(TuneTest, ASweepKilledMidwayResumesFromItsCheckpoint) {
  const std::string db = Db("killed");
  // Exhaustive order is the declared one: ok, slow, wrong, crash, hang,
  // killed, greedy. Kill it while it waits on the hang.
  const std::string args = "tune topk --dims batch=4,n=2000,k=10 --variants faulty --strategy exhaustive --no-thread-round --reps 3 --db " + db;
  pid_t pid = Spawn(args + " --timeout 60");
  ASSERT_TRUE(WaitForTrial(db, "crash"));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(Trial(*table, "hang"), nullptr);
  Result r = Kreg(args + " --timeout 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("7 candidates, 3 measured, 4 reused"));
}

// Halving's early rounds are stored as partial measurements: the same sweep
// again measures nothing it has (its race re-runs only the leaders), and a
// slim copy of the table leaves them out.
TEST(TuneTest, AHalvingSweepRunAgainReusesItsEarlyRounds) {
  const std::string db = Db("halving_again");
  const std::string args = "tune topk --dims batch=4,n=2000,k=10 --variants heap,radix,sort --strategy halving "
                           "--no-thread-round --reps 4 --db " + db;
  Result first = Kreg(args);
  ASSERT_EQ(first.code, 0) << first.out;
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 1u);
  const tuning::Entry& entry = table->proto().entries(0);
  EXPECT_GT(entry.partial_size(), entry.trials_size());
  for (const tuning::Trial& t : entry.partial()) EXPECT_LT(t.reps(), 4);
  // Run again, nothing is measured: every candidate it races was measured
  // the first time and is reused. (How many it races depends on timing: the
  // early rounds' cuts read the stored measurements, which later rounds
  // replaced with longer ones, so it may cut a family sooner.)
  std::smatch counts;
  ASSERT_TRUE(std::regex_search(first.out, counts, std::regex("(\\d+) candidates, (\\d+) measured"))) << first.out;
  const std::string n = counts[1];
  Result again = Kreg(args);
  ASSERT_EQ(again.code, 0) << again.out;
  ASSERT_TRUE(std::regex_search(again.out, counts, std::regex("(\\d+) candidates, 0 measured, (\\d+) reused")))
      << again.out;
  EXPECT_EQ(counts[1].str(), n) << again.out;
  EXPECT_GT(std::stoi(counts[2].str()), 0) << again.out;
  const std::string slim = Db("halving_again_slim") + ".txtpb";
  ASSERT_EQ(Kreg("db slim " + db + " " + slim).code, 0);
  absl::StatusOr<TuningDb> slimmed = TuningDb::Load(slim);
  ASSERT_TRUE(slimmed.ok()) << slimmed.status();
  EXPECT_EQ(slimmed->proto().entries(0).partial_size(), 0);
}

TEST(TuneTest, CtrlCStopsCleanlyAndLeavesAValidTable) {
  const std::string db = Db("interrupted");
  const std::string log = ::testing::TempDir() + "/kreg_tune_interrupted_" + std::to_string(getpid()) + ".log";
  pid_t pid = Spawn("tune topk --dims batch=4,n=2000,k=10 --variants faulty --strategy exhaustive --no-thread-round --reps 3 "
                    "--timeout 60 --db " + db, log);
  ASSERT_TRUE(WaitForTrial(db, "crash"));
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NE(Trial(*table, "ok"), nullptr);
  EXPECT_EQ(Trial(*table, "hang"), nullptr);  // cut short: not a result
  std::ifstream in(log);
  const std::string out(std::istreambuf_iterator<char>(in), {});
  EXPECT_THAT(out, HasSubstr("kreg tune: interrupted; every finished measurement is in " + db +
                             "; run the same command again to resume\n"));
}

// A sweep its budget cuts short still prints (and records) its best so far,
// says so, and exits 0; the table's answers say "incomplete".
TEST(TuneTest, ABudgetCutsASweepShortAndSaysSo) {
  const std::string db = Db("budget");
  Result r = Kreg("tune topk --dims batch=16,n=20000,k=64 --variants blockwise,radix --budget 0.05 --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("(incomplete: the budget ran out)"));
  EXPECT_THAT(r.stdout_text, HasSubstr("topk f32 batch=16,n=20000,k=64 @"));
  r = Kreg("query topk --dims batch=16,n=20000,k=64 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(", incomplete]"));
  r = Kreg("query topk --dims batch=16,n=20000,k=64 --db " + db + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Json::parse(r.stdout_text)["incomplete"], true);
  r = Kreg("run topk --dims batch=16,n=20000,k=64 --reps 2 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(chosen by the table: exact, incomplete)"));
}

// One schema per kind of record: tune results, answers (query, and run's
// chosen_by) and measurements; dims and params as objects, times as
// integer nanoseconds.
TEST(TuneTest, JsonRecordsOfTuneQueryAndRunParse) {
  const std::string db = Db("json");
  Result r = Kreg("--json tune topk --dims batch=8,n=4000,k=16 --dims batch=4,n=1000,k=8 --variants sort,radix "
                  "--reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<Json> results;
  for (absl::string_view line : absl::StrSplit(r.stdout_text, '\n', absl::SkipEmpty())) {
    results.push_back(Json::parse(line));
  }
  ASSERT_EQ(results.size(), 2u) << r.stdout_text;
  const Json& t = results[0];
  EXPECT_EQ(t["key"]["op"], "topk");
  EXPECT_EQ(t["key"]["dtype"], "f32");
  EXPECT_EQ(t["key"]["dims"], Json::parse(R"({"batch":8,"n":4000,"k":16})"));
  EXPECT_EQ(t["key"]["data_class"], "");
  EXPECT_TRUE(t["key"]["machine"].is_string());
  ASSERT_TRUE(t["best"].is_object()) << t;
  EXPECT_THAT(t["best"]["kernel"].get<std::string>(), ::testing::StartsWith("topk/"));
  EXPECT_TRUE(t["best"]["params"].is_object()) << t;
  EXPECT_TRUE(t["best"]["median_ns"].is_number_integer()) << t;
  EXPECT_TRUE(t["best"]["version"].is_number_integer()) << t;
  EXPECT_TRUE(t["runner_up"].is_object() || t["runner_up"].is_null()) << t;
  EXPECT_TRUE(t["counts"]["candidates"].is_number_integer()) << t;
  EXPECT_TRUE(t["counts"]["failed"].is_number_integer()) << t;
  EXPECT_TRUE(t["seconds"].is_number()) << t;
  EXPECT_EQ(t["complete"], true);
  EXPECT_EQ(results[1]["key"]["dims"], Json::parse(R"({"batch":4,"n":1000,"k":8})"));

  r = Kreg("query topk --dims batch=8,n=4000,k=16 --dims batch=16,n=5000,k=20 --db " + db + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<Json> answers;
  for (absl::string_view line : absl::StrSplit(r.stdout_text, '\n', absl::SkipEmpty())) {
    answers.push_back(Json::parse(line));
  }
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0]["match"], "exact");
  EXPECT_EQ(answers[0]["kernel"], t["best"]["kernel"]);
  EXPECT_EQ(answers[0]["params"], t["best"]["params"]);
  EXPECT_EQ(answers[0]["median_ns"], t["best"]["median_ns"]);
  EXPECT_EQ(answers[0]["incomplete"], false);
  EXPECT_EQ(answers[0]["key"], t["key"]);
  EXPECT_EQ(answers[1]["match"], "nearest");
  // Whose winner a nearest answer takes is the neighbours' consensus over
  // the measured times: the farther entry's where the nearer one's two
  // variants came out within a few percent of each other.
  EXPECT_THAT(answers[1]["tuned_dims"],
              ::testing::AnyOf(Json::parse(R"({"batch":8,"n":4000,"k":16})"),
                               Json::parse(R"({"batch":4,"n":1000,"k":8})")));
  EXPECT_TRUE(answers[1]["distance"].is_number());

  r = Kreg("run topk --dims batch=8,n=4000,k=16 --reps 2 --check --json --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  const Json m = Json::parse(r.stdout_text);
  EXPECT_EQ(m["key"], t["key"]);
  EXPECT_EQ(m["kernel"], t["best"]["kernel"]);
  EXPECT_EQ(m["params"], t["best"]["params"]);
  EXPECT_TRUE(m["median_ns"].is_number_integer());
  EXPECT_EQ(m["check"], "ok");
  EXPECT_EQ(m["chosen_by"], answers[0]);
  r = Kreg("query topk --dims batch=2,n=100,k=3 --dtype bf16 --db " + db + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const Json d = Json::parse(r.stdout_text);
  EXPECT_EQ(d["match"], "default");
  EXPECT_TRUE(d["tuned_dims"].is_null());
  EXPECT_TRUE(d["median_ns"].is_null());
}

// Regression: a data class that is not valid UTF-8 used to make the binary
// table unreadable (proto3 strings must be UTF-8). It is stored escaped as
// \xHH and the table reads back; the same bytes ask for the same entry.
TEST(TuneTest, ADataClassOfAnyBytesLeavesAReadableTable) {
  const std::string db = Db("bytes");
  const std::string bytes = "'\xff\xfe'";
  Result r = Kreg("tune topk --dims batch=2,n=100,k=3 --variants sort --reps 3 --data-class " + bytes + " --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("[\\xff\\xfe]"));
  r = Kreg("db show " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("topk f32 batch=2,n=100,k=3 [\\xff\\xfe] @"));
  r = Kreg("query topk --dims batch=2,n=100,k=3 --data_class " + bytes + " --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[exact from batch=2,n=100,k=3"));
  r = Kreg("query topk --dims batch=2,n=100,k=3 --data-class " + bytes + " --json --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  const Json a = Json::parse(r.stdout_text);  // throws on invalid UTF-8
  EXPECT_EQ(a["key"]["data_class"], "\\xff\\xfe");
  EXPECT_EQ(a["match"], "exact");
  r = Kreg("--json tune topk --dims batch=2,n=100,k=3 --variants sort --reps 3 --data-class " + bytes + " --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Json::parse(r.stdout_text)["key"]["data_class"], "\\xff\\xfe");
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 1u);
}

// Two tables written through the library, compared and slimmed through the
// command line.
tuning::Trial MakeTrial(const std::string& variant, const std::string& method, double median_ns,
                        tuning::Trial::Status status = tuning::Trial::OK) {
  tuning::Trial t;
  t.set_variant(variant);
  t.set_variant_version(1);
  if (!method.empty()) {
    tuning::ParamValue* p = t.mutable_config()->add_params();
    p->set_name("method");
    p->set_choice(method);
  }
  t.set_median_ns(median_ns);
  t.set_min_ns(median_ns);
  t.set_max_ns(median_ns);
  t.set_reps(10);
  t.set_status(status);
  t.set_measured_at(1);
  return t;
}

TEST(TuneTest, DbDiffExitsLikeDiff) {
  const tuning::ProblemKey key = MakeProblemKey("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, "m1");
  TuningDb a, b;
  a.AddTrial(key, MakeTrial("sort", "partial_sort", 100));
  a.AddTrial(key, MakeTrial("heap", "", 200));
  b.AddTrial(key, MakeTrial("sort", "partial_sort", 300));
  b.AddTrial(key, MakeTrial("heap", "", 200));
  const std::string path_a = Db("diff_a"), path_b = Db("diff_b");
  ASSERT_TRUE(a.Save(path_a).ok());
  ASSERT_TRUE(b.Save(path_b).ok());
  Result r = Kreg("db diff " + path_a + " " + path_a);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "the winners agree everywhere\n");
  r = Kreg("db diff " + path_a + " " + path_b);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("differs: "));
  EXPECT_EQ(r.stderr_text, "");
  r = Kreg("db diff " + path_a + " /nonexistent.lut");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("kreg db diff: /nonexistent.lut"));
  r = Kreg("db diff " + path_a);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("kreg db diff: B is required"));
}

// Per variant and combination of named choices: sort's two methods both
// stay (a choice may need an ISA another machine lacks); the crashed trial
// goes.
TEST(TuneTest, DbSlimKeepsEachVariantsFastestTrialPerChoice) {
  const tuning::ProblemKey key = MakeProblemKey("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, "m1");
  TuningDb db;
  db.AddTrial(key, MakeTrial("sort", "partial_sort", 100));
  db.AddTrial(key, MakeTrial("sort", "nth_element", 150));
  db.AddTrial(key, MakeTrial("heap", "", 120));
  db.AddTrial(key, MakeTrial("radix", "", 0, tuning::Trial::CRASHED));
  const std::string in = Db("slim_in"), out = ::testing::TempDir() + "/kreg_tune_slim_out_" + std::to_string(getpid()) + ".txtpb";
  std::filesystem::remove(out);
  ASSERT_TRUE(db.Save(in).ok());
  Result r = Kreg("db slim " + in + " " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(out));
  absl::StatusOr<TuningDb> slim = TuningDb::Load(out);
  ASSERT_TRUE(slim.ok()) << slim.status();
  ASSERT_EQ(slim->size(), 1u);
  std::set<std::string> kept;
  for (const tuning::Trial& t : slim->proto().entries(0).trials()) kept.insert(t.variant() + " " + ConfigText(t.config()));
  EXPECT_EQ(kept, (std::set<std::string>{"sort method=partial_sort", "sort method=nth_element", "heap "}))
      << slim->ToText();
  // The winners are the same.
  r = Kreg("db diff " + in + " " + out);
  EXPECT_EQ(r.code, 0) << r.out;
  r = Kreg("db slim " + in);
  EXPECT_EQ(r.code, 2) << r.out;
}

// A CSV line's fields (RFC 4180 quoting).
std::vector<std::string> CsvFields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

// `db export --json` is protobuf's JSON mapping of the whole table; `--csv`
// one row per trial (partial measurements left out), quoted where a field
// holds a comma or a quote, so pandas or a spreadsheet reads it back.
TEST(TuneTest, DbExportWritesJsonAndCsv) {
  const tuning::ProblemKey key = MakeProblemKey("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, "m1");
  TuningDb db;
  db.AddTrial(key, MakeTrial("sort", "partial_sort", 100));
  tuning::Trial radix = MakeTrial("radix", "", 0, tuning::Trial::CRASHED);
  tuning::ParamValue* schedule = radix.mutable_config()->add_params();
  schedule->set_name("m_schedule");
  schedule->mutable_list_value()->add_values(5);
  schedule->mutable_list_value()->add_values(8);
  radix.set_error("killed by \"signal\" 9, twice");
  db.AddTrial(key, radix);
  db.AddPartial(key, MakeTrial("heap", "", 50));
  const std::string in = Db("export");
  ASSERT_TRUE(db.Save(in).ok());

  Result r = Kreg("db export " + in + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json json = nlohmann::json::parse(r.stdout_text);
  ASSERT_EQ(json["entries"].size(), 1u);
  EXPECT_EQ(json["entries"][0]["key"]["op"], "topk");
  EXPECT_EQ(json["entries"][0]["trials"].size(), 2u);
  EXPECT_EQ(json["entries"][0]["partial"].size(), 1u);
  EXPECT_EQ(json["entries"][0]["best"]["variant"], "sort");

  r = Kreg("db export " + in + " --csv");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> lines = absl::StrSplit(r.stdout_text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.stdout_text;  // the header and two trials
  const std::vector<std::string> header = CsvFields(lines[0]);
  EXPECT_EQ(header.front(), "op");
  EXPECT_EQ(header.size(), 17u);
  std::map<std::string, std::map<std::string, std::string>> rows;  // variant -> column -> value
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> fields = CsvFields(lines[i]);
    ASSERT_EQ(fields.size(), header.size()) << lines[i];
    for (size_t c = 0; c < fields.size(); ++c) rows[fields[5]][header[c]] = fields[c];
  }
  EXPECT_EQ(rows["sort"]["dims"], "batch=8,n=1000,k=10");
  EXPECT_EQ(rows["sort"]["params"], "method=partial_sort");
  EXPECT_EQ(rows["sort"]["status"], "OK");
  EXPECT_EQ(rows["sort"]["median_ns"], "100");
  EXPECT_EQ(rows["radix"]["params"], "m_schedule=5,8");
  EXPECT_EQ(rows["radix"]["status"], "CRASHED");
  EXPECT_EQ(rows["radix"]["error"], "killed by \"signal\" 9, twice");
  EXPECT_EQ(rows.count("heap"), 0u);

  r = Kreg("db export " + in + " --json --csv");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("give --json or --csv, not both"));
}

}  // namespace
}  // namespace kreg
