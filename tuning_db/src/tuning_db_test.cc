// Recording trials and winners, merging, diffs and summaries, stale trials.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "kreg/dispatch.h"
#include "kreg/problem.h"
#include "kreg/topk.h"
#include "lut_test_util.h"

namespace kreg {
namespace lut_test {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

// ---- Recording, merging ---------------------------------------------------------------

TEST(Recording, WinnersFollowTheTrials) {
  TuningDb db;
  const tuning::ProblemKey key = Key(8, 1000, 10);
  EXPECT_EQ(db.FindEntry(key), nullptr);
  db.AddTrial(key, Sort("partial_sort", 300));
  const tuning::Entry* e = db.FindEntry(key);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->best().median_ns(), 300);
  EXPECT_FALSE(e->has_runner_up());
  db.AddTrial(key, Radix(11, 200));
  db.AddTrial(key, Radix(10, 250));
  tuning::Trial wrong = Radix(8, 10);
  wrong.set_status(tuning::Trial::WRONG_RESULT);
  db.AddTrial(key, wrong);  // fastest, but wrong: never a winner
  e = db.FindEntry(key);
  EXPECT_EQ(e->trials_size(), 4);
  EXPECT_EQ(ConfigText(e->best().config()), "first_bits=11 round_bits=8 capacity=4096");
  EXPECT_EQ(ConfigText(e->runner_up().config()), "first_bits=10 round_bits=8 capacity=4096");
  // Re-measuring the best slower moves it down.
  db.AddTrial(key, Radix(11, 280));
  e = db.FindEntry(key);
  EXPECT_EQ(e->trials_size(), 4);
  EXPECT_EQ(e->best().median_ns(), 250);
  EXPECT_EQ(e->runner_up().median_ns(), 280);
  // The same config given with its params in another order is the same trial.
  tuning::Config shuffled = Ints({{"capacity", 4096}, {"first_bits", 10}, {"round_bits", 8}});
  const tuning::Trial* found = db.FindTrial(key, "radix", 1, shuffled);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->median_ns(), 250);
  EXPECT_EQ(db.FindTrial(key, "radix", 2, shuffled), nullptr);  // another version
  EXPECT_EQ(db.FindTrial(Key(8, 1000, 11), "radix", 1, shuffled), nullptr);
  // The same configuration on a chosen thread count is a trial of its own.
  EXPECT_EQ(db.FindTrial(key, "radix", 1, shuffled, /*threads=*/1), nullptr);
  tuning::Trial on_one = Radix(10, 240);
  on_one.set_threads(1);
  db.AddTrial(key, on_one);
  EXPECT_EQ(db.FindEntry(key)->trials_size(), 5);
  EXPECT_EQ(db.FindTrial(key, "radix", 1, shuffled)->median_ns(), 250);
  EXPECT_EQ(db.FindTrial(key, "radix", 1, shuffled, 1)->median_ns(), 240);
  EXPECT_EQ(db.FindEntry(key)->best().threads(), 1);
  on_one.set_median_ns(1000);  // slower on 1 thread after all
  db.AddTrial(key, on_one);
  e = db.FindEntry(key);
  EXPECT_EQ(e->best().median_ns(), 250);
  // Keys given with dims in another order match; with a default attribute
  // spelled out they are another key (a TuningDb knows no ops).
  tuning::ProblemKey reordered =
      MakeProblemKey("topk", "f32", {{"k", 10}, {"batch", 8}, {"n", 1000}}, kMachine);
  EXPECT_EQ(db.FindEntry(reordered), db.FindEntry(key));
  tuning::ProblemKey with_default = MakeProblemKey(
      "topk", "f32", {{"k", 10}, {"largest", 1}, {"batch", 8}, {"n", 1000}}, kMachine);
  EXPECT_EQ(db.FindEntry(with_default), nullptr);
  EXPECT_EQ(db.FindTrial(with_default, "radix", 1, shuffled), nullptr);
  // A failed re-measurement of the best demotes it.
  tuning::Trial crashed = Radix(10, 0);
  crashed.set_status(tuning::Trial::CRASHED);
  db.AddTrial(key, crashed);
  e = db.FindEntry(key);
  EXPECT_EQ(e->best().median_ns(), 280);
  EXPECT_EQ(e->runner_up().median_ns(), 300);
}

// A table as Save writes it is kept as it is on load (its entries move
// over whole; adopt.cc); one that repeats a key is merged record by record.
// Both give the same table, and the same index for what is recorded next.
TEST(Recording, ATableAsSavedLoadsAsTheSameTableAsOneMergedRecordByRecord) {
  TuningDb db = SampleDb();
  tuning::Trial partial = Radix(13, 6000);
  partial.set_reps(3);
  db.AddPartial(Key(8, 1000, 10), partial);
  for (int t = 0; t < 20; ++t) {  // more trials than the ids' scan
    tuning::Trial on = Sort("nth_element", 3000 + t);
    on.set_threads(t + 1);
    db.AddTrial(Key(16, 4096, 32), on);
  }
  tuning::Database repeated = db.proto();
  *repeated.add_entries() = db.proto().entries(0);
  repeated.set_entry_count(repeated.entries_size());
  absl::StatusOr<TuningDb> kept = TuningDb::FromProto(db.proto());
  absl::StatusOr<TuningDb> merged = TuningDb::FromProto(repeated);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(merged.ok()) << merged.status();
  ExpectSame(db, *kept);
  ExpectSame(db, *merged);
  for (TuningDb* t : {&db, &*kept, &*merged}) {
    t->AddTrial(Key(8, 1000, 10), Sort("nth_element", 100));  // an id it holds: replaced
    t->AddTrial(Key(16, 4096, 32), Sort("partial_sort", 50));
    t->AddPartial(Key(8, 1000, 10), partial);
  }
  ExpectSame(db, *kept);
  ExpectSame(db, *merged);
  EXPECT_EQ(kept->FindEntry(Key(16, 4096, 32))->best().variant(), "sort");
}

TEST(Recording, MergeKeepsTheNewestMeasurementAndUnionsTheRest) {
  TuningDb a, b;
  a.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 100, /*measured_at=*/10));
  b.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 300, /*measured_at=*/20));  // newer
  a.AddTrial(Key(8, 1000, 10), Sort("nth_element", 200, /*measured_at=*/30));   // newer
  b.AddTrial(Key(8, 1000, 10), Sort("nth_element", 50, /*measured_at=*/5));
  a.AddTrial(Key(1, 10, 1), Sort("nth_element", 1));
  b.AddTrial(Key(2, 10, 1), Sort("nth_element", 1));
  b.SetTuningInfo(Key(8, 1000, 10), "kreg 9", "halving", 99);
  for (const TuningDb& m : {TuningDb::Merge(a, b), TuningDb::Merge(b, a)}) {
    EXPECT_EQ(m.size(), 3u);
    const tuning::Entry* e = m.FindEntry(Key(8, 1000, 10));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->trials_size(), 2);
    EXPECT_EQ(ConfigText(e->best().config()), "method=nth_element");
    EXPECT_EQ(e->best().median_ns(), 200);
    EXPECT_EQ(e->runner_up().median_ns(), 300);
    EXPECT_EQ(e->strategy(), "halving");
  }
  // Merging is idempotent.
  TuningDb m = TuningDb::Merge(a, b);
  ExpectSame(TuningDb::Merge(m, m), m);
}

// A halving round's measurements (below full repetitions) are kept apart:
// found again by a resumed sweep, the one of most repetitions per id, never
// a winner, carried by merges and files, and left out of slim tables.
TEST(Recording, PartialMeasurementsAreKeptApartAndNeverAnswer) {
  auto partial = [](double median_ns, int reps, int64_t measured_at) {
    tuning::Trial t = Sort("nth_element", median_ns, measured_at);
    t.set_reps(reps);
    return t;
  };
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 500));
  db.AddPartial(Key(8, 1000, 10), partial(100, 2, 10));
  db.AddPartial(Key(8, 1000, 10), partial(90, 1, 20));   // fewer runs: not kept
  db.AddPartial(Key(8, 1000, 10), partial(110, 4, 5));   // more runs, though older: kept
  const tuning::Config nth = Choice("method", "nth_element");
  const tuning::Trial* found = db.FindPartial(Key(8, 1000, 10), "sort", 1, nth);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->reps(), 4);
  EXPECT_EQ(found->median_ns(), 110);
  EXPECT_EQ(db.FindPartial(Key(8, 1000, 10), "sort", 2, nth), nullptr);  // another version
  EXPECT_EQ(db.FindPartial(Key(8, 1000, 10), "sort", 1, nth, /*threads=*/1), nullptr);
  EXPECT_EQ(db.FindTrial(Key(8, 1000, 10), "sort", 1, nth), nullptr);  // not a trial
  const tuning::Entry* e = db.FindEntry(Key(8, 1000, 10));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(ConfigText(e->best().config()), "method=partial_sort");  // though slower
  EXPECT_FALSE(e->has_runner_up());

  TuningDb other;
  other.AddPartial(Key(8, 1000, 10), partial(105, 8, 1));
  const TuningDb merged = TuningDb::Merge(db, other);
  EXPECT_EQ(merged.FindPartial(Key(8, 1000, 10), "sort", 1, nth)->reps(), 8);

  const std::string dir = TempDir("partial");
  ASSERT_TRUE(merged.Save(dir + "/all.kdb").ok());
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/all.kdb");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(*back, merged);
  ASSERT_TRUE(merged.Save(dir + "/slim.txtpb", {.best_per_variant = true}).ok());
  back = TuningDb::Load(dir + "/slim.txtpb");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->FindEntry(Key(8, 1000, 10))->partial_size(), 0);
}

TEST(Recording, DiffNamesKeysOnlyOnOneSideAndChangedWinners) {
  TuningDb a, b;
  a.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 100));
  b.AddTrial(Key(8, 1000, 10), Sort("nth_element", 100));
  a.AddTrial(Key(1, 10, 1), Sort("nth_element", 1));
  b.AddTrial(Key(2, 10, 1), Sort("nth_element", 1));
  a.AddTrial(Key(3, 10, 1), Sort("nth_element", 1));
  b.AddTrial(Key(3, 10, 1), Sort("nth_element", 2, /*measured_at=*/200));  // re-measured slower, same winner
  std::string diff = TuningDb::Diff(a, b);
  EXPECT_THAT(diff, HasSubstr("only in a: topk f32 batch=1,n=10,k=1"));
  EXPECT_THAT(diff, HasSubstr("only in b: topk f32 batch=2,n=10,k=1"));
  EXPECT_THAT(diff, HasSubstr("differs: topk f32 batch=8,n=1000,k=10 @00000000deadbeef: "
                              "a=sort v1 method=partial_sort b=sort v1 method=nth_element"));
  EXPECT_EQ(std::count(diff.begin(), diff.end(), '\n'), 3);
  EXPECT_EQ(TuningDb::Diff(a, a), "");
  // The same winner with other results measured at the same moment: one of
  // the two is not what happened.
  b.AddTrial(Key(3, 10, 1), Sort("nth_element", 2, /*measured_at=*/100));
  diff = TuningDb::Diff(a, b);
  EXPECT_THAT(diff, HasSubstr("differs: topk f32 batch=3,n=10,k=1 @00000000deadbeef: sort v1 method=nth_element "
                              "measured at the same time as 1 ns in a, 2 ns in b"));
}

TEST(Recording, SummaryAndTextName) {
  TuningDb db = SampleDb();
  std::string summary = db.Summary();
  EXPECT_THAT(summary, HasSubstr("topk f32 batch=8,n=1000,k=10 @00000000deadbeef -> sort v1 "
                                 "method=nth_element  4 us (runner-up radix 4.5 us, 4 trials)"));
  EXPECT_THAT(summary, HasSubstr("topk bf16 batch=1,n=4096,k=8 [dist=ties] @"));
  EXPECT_EQ(std::count(summary.begin(), summary.end(), '\n'), 3);
  EXPECT_THAT(db.ToText(), HasSubstr("strategy: \"exhaustive\""));
}

// Trials as fast as each other, recorded in either order: the table's best
// is the lower trial id, and the lookup, a slim copy and the lookup of that
// copy all answer with it.
using Ties = WithRegistry;

TEST_F(Ties, EveryReaderTakesTheTablesBest) {
  for (bool twelve_first : {true, false}) {
    TuningDb db;
    db.AddTrial(Key(8, 1000, 10), Radix(twelve_first ? 12 : 11, 250));
    db.AddTrial(Key(8, 1000, 10), Radix(twelve_first ? 11 : 12, 250));
    db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 300));
    const std::string best = TrialId(db.FindEntry(Key(8, 1000, 10))->best());
    EXPECT_EQ(best, TrialId(Radix(11, 250)));
    const std::string dir = TempDir("ties");
    ASSERT_TRUE(db.Save(dir + "/t.kdb", {.best_per_variant = true}).ok());
    absl::StatusOr<TuningDb> slim = TuningDb::Load(dir + "/t.kdb");
    ASSERT_TRUE(slim.ok()) << slim.status();
    EXPECT_EQ(TrialId(slim->FindEntry(Key(8, 1000, 10))->best()), best) << twelve_first;
    for (const TuningDb* table : {&db, &*slim}) {
      absl::StatusOr<Lut> lut = Lut::Build(*table, *registry_);
      ASSERT_TRUE(lut.ok()) << lut.status();
      absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(TrialId(*a->trial), best) << twelve_first;
    }
  }
}

using Stale = WithRegistry;

TEST_F(Stale, DropStaleRemovesOnlyChangedVariantsTrials) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 100, 1, /*version=*/7));
  db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 200));
  db.AddTrial(Key(8, 1000, 10), MakeTrial("unloaded", tuning::Config(), 50, 1, 3));
  db.AddPartial(Key(8, 1000, 10), Sort("partial_sort", 90, 1, /*version=*/7));  // stale too
  db.AddPartial(Key(8, 1000, 10), Sort("nth_element", 190));
  EXPECT_EQ(db.DropStale(*registry_), 1);  // trials
  const tuning::Entry* e = db.FindEntry(Key(8, 1000, 10));
  EXPECT_EQ(e->trials_size(), 2);
  EXPECT_EQ(e->partial_size(), 1);
  EXPECT_EQ(db.FindPartial(Key(8, 1000, 10), "sort", 7, Choice("method", "partial_sort")), nullptr);
  EXPECT_NE(db.FindPartial(Key(8, 1000, 10), "sort", 1, Choice("method", "nth_element")), nullptr);
  EXPECT_EQ(e->best().variant(), "unloaded");
  EXPECT_EQ(e->runner_up().median_ns(), 200);
  EXPECT_NE(db.FindTrial(Key(8, 1000, 10), "sort", 1, Choice("method", "nth_element")), nullptr);
}

}  // namespace
}  // namespace lut_test
}  // namespace kreg
