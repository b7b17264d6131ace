// kreg tune, query, run --db and db, end to end through the binary: isolation
// of crashing and hanging candidates, checkpoints and resume, Ctrl-C.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/lut.h"
#include "tests/run_kreg.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;

const std::string kPlugins = std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty";

Result Kreg(const std::string& args) { return RunKreg(kPlugins, args); }

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
  EXPECT_THAT(r.out, HasSubstr("\"tuned_dims\":\"batch=8,n=4000,k=16\""));
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
