// Record, then tune offline, through the kreg binary: `kreg run OP --db`
// with KREG_RECORD set writes the shapes its table does not answer exactly,
// `kreg tune --from-record` tunes them, and `kreg query` then answers them
// exactly; a bad record is one line naming the file and line, exit 2.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/run_kreg.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Result Kreg(const std::string& args, const std::string& env = "") { return RunKreg(KREG_PLUGIN_DIR, args, env); }

std::string Dir(const std::string& name) { return ScratchDir("record", name); }

// Quick sweeps: one variant, few repetitions, no thread round.
constexpr char kQuick[] = "--variants sort --reps 3 --warmup 0 --no-thread-round --budget 5";

TEST(RecordTest, RecordedShapesAreTunedOfflineAndThenAnsweredExactly) {
  const std::string dir = Dir("tune");
  const std::string table = dir + "/t.lut", record = dir + "/shapes.txt";
  const std::string env = "KREG_RECORD=" + record;
  Result r = Kreg("tune topk --dims batch=1,n=64,k=2 --db " + table + " " + kQuick);
  ASSERT_EQ(r.code, 0) << r.out;
  // Exact: not recorded. Nearest (twice), and another signature with a
  // non-default attribute: recorded once each.
  for (const std::string dims : {"batch=1,n=64,k=2", "batch=2,n=1000,k=4", "batch=2,n=1000,k=4",
                                 "batch=2,n=1000,k=4,largest=0 --with row_ends"}) {
    r = Kreg("run topk --db " + table + " --dims " + dims, env);
    ASSERT_EQ(r.code, 0) << r.out;
  }
  const std::string text = FileBytes(record);
  EXPECT_THAT(text, ::testing::StartsWith("# kreg shape record 1:"));
  EXPECT_THAT(text, HasSubstr("\ntopk f32 batch=2,n=1000,k=4 - cpu\n"
                              "topk f32+row_ends batch=2,n=1000,k=4,largest=0 - cpu\n"));
  EXPECT_THAT(text, Not(HasSubstr("n=64")));

  r = Kreg("tune --from-record " + record + " --db " + table + " " + kQuick);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr(record + ":2 topk f32 batch=2,n=1000,k=4: tuning"));
  EXPECT_THAT(r.stdout_text, HasSubstr(record + ":3 topk f32+row_ends batch=2,n=1000,k=4,largest=0: tuning"));
  for (const std::string dims : {"batch=2,n=1000,k=4", "batch=2,n=1000,k=4,largest=0 --with row_ends"}) {
    r = Kreg("query topk --json --no-shipped --db " + table + " --dims " + dims);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.stdout_text)["match"], "exact") << dims << "\n" << r.out;
  }
  // Run again: every shape is answered exactly now, and nothing is recorded.
  r = Kreg("tune --from-record " + record + " --db " + table + " " + kQuick);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr(record + ":2 topk f32 batch=2,n=1000,k=4: skipped, answered exactly by "));
  EXPECT_THAT(r.stdout_text, Not(HasSubstr("tuning")));
  r = Kreg("run topk --db " + table + " --dims batch=2,n=1000,k=4", env);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(FileBytes(record), text);
  std::filesystem::remove_all(dir);
}

TEST(RecordTest, AnUnwritableRecordDoesNotFailTheRun) {
  const std::string dir = Dir("unwritable");
  const std::string table = dir + "/t.lut";
  Result r = Kreg("tune topk --dims batch=1,n=64,k=2 --db " + table + " " + kQuick);
  ASSERT_EQ(r.code, 0) << r.out;
  r = Kreg("run topk --db " + table + " --dims batch=2,n=1000,k=4", "KREG_RECORD=" + dir + "/no/such/shapes.txt");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("KREG_RECORD=" + dir + "/no/such/shapes.txt: cannot open it"));
  std::filesystem::remove_all(dir);
}

struct BadRecord {
  const char* name;
  const char* text;
  const char* error;  // after "FILE:"
};

class RecordErrorTest : public ::testing::TestWithParam<BadRecord> {};

TEST_P(RecordErrorTest, ExitsTwoNamingTheLine) {
  const BadRecord& bad = GetParam();
  const std::string dir = Dir(bad.name);
  const std::string record = dir + "/shapes.txt", table = dir + "/t.lut";
  std::ofstream(record) << bad.text;
  Result r = Kreg("tune --from-record " + record + " --db " + table);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("kreg tune: --from-record: " + record + ":" + bad.error)) << r.out;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  EXPECT_TRUE(r.stdout_text.empty()) << r.stdout_text;  // nothing tuned before the whole record is read
  EXPECT_FALSE(std::filesystem::exists(table));
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Lines, RecordErrorTest,
    ::testing::Values(
        BadRecord{"garbage", "# shapes\ntopk f32 batch=1,n=8,k=2 - cpu\nnot a record line\n", "3: 'not a record line'"},
        BadRecord{"overflow", "topk f32 batch=1,n=99999999999999999999,k=2 - cpu\n", "1: dims item"},
        BadRecord{"past_the_op", "\ntopk f32 batch=1,n=9000000000000,k=2 - cpu\n", "2: "},
        BadRecord{"unknown_op", "nosuchop f32 n=8 - cpu\n", "1: "},
        BadRecord{"bad_dtype", "topk i32 batch=1,n=8,k=2 - cpu\n", "1: "},
        BadRecord{"not_a_key", "topk f32 batch=1,n=8,k=2,largest=1 - cpu\n", "1: not a key kreg records"}),
    [](const ::testing::TestParamInfo<BadRecord>& p) { return std::string(p.param.name); });

TEST(RecordTest, MissingEmptyAndContradictedRecords) {
  const std::string dir = Dir("edges");
  const std::string record = dir + "/shapes.txt", table = dir + "/t.lut";
  Result r = Kreg("tune --from-record " + record + " --db " + table);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr(record + ": no such file"));
  std::ofstream(record) << "# kreg shape record 1: nothing yet\n";
  r = Kreg("tune --from-record " + record + " --db " + table);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr(record + ": no shapes recorded; nothing to tune"));
  r = Kreg("tune topk --from-record " + record + " --db " + table + " --dims n=8");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("drop OP (topk), --dims"));
  r = Kreg("tune --db " + table);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("OP is required (or give --from-record FILE)"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kreg
