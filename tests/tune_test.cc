// kreg tune, query, run --db and db, end to end through the binary: isolation
// of crashing and hanging candidates, checkpoints and resume, Ctrl-C; keys of
// optional inputs (ragged topk rows) and of the op's data class; and a new op
// (axpy, declared by a test plugin) tuned, queried and run with no host
// change.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

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

const std::string kPlugins = std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty";

Result Kreg(const std::string& args) { return RunKreg(kPlugins, args); }

// `kreg --plugin-path DIR args` (the dashed spelling), stdout and stderr.
Result KregWith(const std::string& plugin_dir, const std::string& args) {
  std::string cmd = std::string(KREG_BIN) + " --plugin-path " + plugin_dir + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

// A scratch folder for input files.
std::string Dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/kreg_tune_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Db(const std::string& name) {
  std::string path = ::testing::TempDir() + "/kreg_tune_" + name + ".lut";
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
  Result r = Kreg("tune topk --dims batch=4,n=2000,k=10 --variants faulty --strategy exhaustive --reps 3 "
                  "--timeout 2 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("5 candidates, 5 measured, 0 reused, 3 failed"));
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 1u);
  EXPECT_EQ(Trial(*table, "ok")->status(), tuning::Trial::OK);
  EXPECT_EQ(Trial(*table, "slow")->status(), tuning::Trial::OK);
  EXPECT_EQ(Trial(*table, "wrong")->status(), tuning::Trial::WRONG_RESULT);
  EXPECT_EQ(Trial(*table, "crash")->status(), tuning::Trial::CRASHED);
  EXPECT_THAT(Trial(*table, "crash")->error(), HasSubstr("signal 11"));
  EXPECT_EQ(Trial(*table, "hang")->status(), tuning::Trial::TIMED_OUT);
  const tuning::Entry& entry = table->proto().entries(0);
  EXPECT_EQ(entry.best().config().params(0).choice(), "ok");
  EXPECT_EQ(entry.runner_up().config().params(0).choice(), "slow");
  EXPECT_EQ(entry.strategy(), "exhaustive");
}

TEST(TuneTest, AddingAVariantMeasuresOnlyWhatIsNew) {
  const std::string db = Db("resume");
  Result r = Kreg("tune topk --dims batch=4,n=3000,k=32 --variants sort --strategy exhaustive --reps 3 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("2 candidates, 2 measured, 0 reused"));
  r = Kreg("tune topk --dims batch=4,n=3000,k=32 --variants sort,radix --strategy exhaustive --reps 3 --db " + db);
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
  EXPECT_THAT(r.out, HasSubstr("[default]"));
  r = Kreg("run topk --db " + db + " --dims batch=8,n=4000,k=16 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact)"));
  r = Kreg("db show " + db);
  EXPECT_THAT(r.out, HasSubstr("topk f32 batch=8,n=4000,k=16"));
  r = Kreg("db diff " + db + " " + db);
  EXPECT_THAT(r.out, HasSubstr("the winners agree everywhere"));
}

TEST(TuneTest, BadInputGetsOneClearLine) {
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"tune topk --dims batch=2,n=10,k=3", "tune needs --db FILE"},
           {"tune topk --db /tmp/x.lut", "tune needs at least one --dims"},
           {"tune topk --dims batch=2,n=10,k=30 --db /tmp/x.lut", "k=30 exceeds the row length n=10"},
           {"tune topk --dims batch=2,n=10,k=3 --strategy genetic --db /tmp/x.lut", "unknown strategy 'genetic'"},
           {"tune topk --dims batch=2,n=10,k=3 --variants quick --db /tmp/x.lut", "no kernel 'topk/quick'"},
           // Ragged rows are optional inputs now (--with row_ends), not a dim.
           {"tune topk --dims batch=2,n=10,k=3,ragged=1 --db /tmp/x.lut", "unknown dimension or attribute 'ragged'"},
           {"tune topk --dims batch=2,n=10,k=3 --with bogus --db /tmp/x.lut", "'bogus' is not an optional input"},
           {"tune topk --dims batch=2,n=10,k=3 --dtype f64 --db /tmp/x.lut", "--dtype 'f64'"},
           {"tune gmm --dims m=3 --db /tmp/x.lut", "gmm"},
           {"query topk --dims batch=2,n=10,k=3 --db /nonexistent.lut", "/nonexistent.lut"},
       }) {
    Result r = Kreg(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr(message));
  }
  const std::string corrupt = Db("corrupt");
  std::ofstream(corrupt) << "definitely not a table";
  Result r = Kreg("tune topk --dims batch=2,n=100,k=3 --variants sort --db " + corrupt);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr(corrupt));
  std::ifstream in(corrupt);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "definitely not a table");
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
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact)"));
  r = Kreg("query topk --with row_ends --dims batch=6,n=3000,k=8 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("topk f32+row_ends batch=6,n=3000,k=8 -> topk/sort"));
  EXPECT_THAT(r.out, HasSubstr("[exact from batch=6,n=3000,k=8"));
  // Random row ends of the same shape: the same key.
  r = Kreg("run topk --db " + db + " --with row_ends --dims batch=6,n=3000,k=8 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(chosen by the table: exact)"));
  // Whole rows (no row_ends), or row_starts too: other keys, the default.
  r = Kreg("query topk --dims batch=6,n=3000,k=8 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("topk f32 batch=6,n=3000,k=8 -> topk/radix"));
  EXPECT_THAT(r.out, HasSubstr("[default]"));
  r = Kreg("query topk --with row_starts,row_ends --dims batch=6,n=3000,k=8 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[default]"));
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
  EXPECT_THAT(r.out, HasSubstr("[default]"));
  // The attribute alpha is not part of the key: any alpha answers exactly.
  r = KregWith(plugins, "run axpy --db " + db + " --dims n=5000,alpha=0.5 --reps 2 --check");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact)"));
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
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: exact)"));
  r = KregWith(plugins, "run axpy --db " + db + " --dims n=2000 --reps 2 --check");  // dense, random
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check ok  (chosen by the table: default)"));
  r = KregWith(plugins, "query axpy --dims n=2000 --data_class sparse --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[exact from n=2000"));
  r = KregWith(plugins, "query axpy --dims n=2000 --db " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[default]"));
}

// Starts `kreg tune ...` in the background; returns its pid.
pid_t Spawn(const std::string& args) {
  pid_t pid = fork();
  if (pid == 0) {
    std::string cmd = std::string(KREG_BIN) + " --plugin_path=" + kPlugins + " " + args + " >/dev/null 2>&1";
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
  // Exhaustive order is the declared one: ok, slow, wrong, crash, hang. Kill
  // it while it waits on the hang.
  const std::string args = "tune topk --dims batch=4,n=2000,k=10 --variants faulty --strategy exhaustive --reps 3 --db " + db;
  pid_t pid = Spawn(args + " --timeout 60");
  ASSERT_TRUE(WaitForTrial(db, "crash"));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  absl::StatusOr<TuningDb> table = TuningDb::Load(db);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(Trial(*table, "hang"), nullptr);
  Result r = Kreg(args + " --timeout 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("5 candidates, 1 measured, 4 reused"));
}

TEST(TuneTest, CtrlCStopsCleanlyAndLeavesAValidTable) {
  const std::string db = Db("interrupted");
  pid_t pid = Spawn("tune topk --dims batch=4,n=2000,k=10 --variants faulty --strategy exhaustive --reps 3 "
                    "--timeout 60 --db " + db);
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
}

}  // namespace
}  // namespace kreg
