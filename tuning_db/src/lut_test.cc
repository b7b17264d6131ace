// Lut queries: exact (allocating nothing), nearest (log2 distance,
// legality for the asked shape, stale entries), thread counts, and
// defaults (the op's preferred variants). Generic over ops: topk (the topk
// plugin and a fake whose legality depends on k).
#include "kreg/lut.h"

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
#include <limits>
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

// Counts heap allocations, to prove the exact lookup makes none.
namespace {
std::atomic<long> g_allocations{0};
}  // namespace

// Every unaligned form is replaced, so no pair mixes ours with the
// runtime's (or a sanitizer's). Not inlined, so GCC does not pair malloc and
// free across them and warn.
#define KREG_NOINLINE __attribute__((noinline))
KREG_NOINLINE void* operator new(size_t size, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
KREG_NOINLINE void* operator new(size_t size) {
  if (void* p = operator new(size, std::nothrow)) return p;
  throw std::bad_alloc();
}
KREG_NOINLINE void* operator new[](size_t size) { return operator new(size); }
KREG_NOINLINE void* operator new[](size_t size, const std::nothrow_t&) noexcept {
  return operator new(size, std::nothrow);
}
KREG_NOINLINE void operator delete(void* p) noexcept { std::free(p); }
KREG_NOINLINE void operator delete(void* p, size_t) noexcept { std::free(p); }
KREG_NOINLINE void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
KREG_NOINLINE void operator delete[](void* p) noexcept { std::free(p); }
KREG_NOINLINE void operator delete[](void* p, size_t) noexcept { std::free(p); }
KREG_NOINLINE void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

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

// ---- Queries -------------------------------------------------------------------------

using Query = WithRegistry;

TEST_F(Query, ExactHit) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 300));
  db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 200));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  EXPECT_EQ(lut->size(), 1u);
  EXPECT_THAT(lut->warnings(), IsEmpty());
  for (const Dims& dims : {Dims{{"batch", 8}, {"n", 1000}, {"k", 10}},
                           Dims{{"k", 10}, {"largest", 1}, {"n", 1000}, {"batch", 8}}}) {
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", dims, kMachine);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->match, Match::kExact);
    EXPECT_EQ(a->kernel->name(), "topk/sort");
    EXPECT_EQ(a->kernel->ConfigString(*a->config), "method=nth_element");
    EXPECT_EQ(a->distance, 0);
    EXPECT_EQ(a->trial->median_ns(), 200);
    EXPECT_EQ(DimsString(*a->tuned_dims), "batch=8,n=1000,k=10");
    EXPECT_THAT(a->warnings, IsEmpty());
  }
  EXPECT_EQ(MatchName(Match::kExact), "exact");
}

TEST_F(Query, AnswersSayWhenTheirSweepWasCutShort) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 5));
  db.SetTuningInfo(Key(8, 1000, 10), "kreg test", "exhaustive", 1, /*complete=*/false);
  db.AddTrial(Key(8, 1000, 100), Sort("nth_element", 5));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kExact);
  EXPECT_TRUE(a->incomplete);
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 100}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->incomplete);
}

// An entry measured on several thread counts answers a caller with fewer
// threads than its machine's cores with its fastest on no more than those.
TEST_F(Query, FewerThreadsGetTheFastestMeasurementOnNoMore) {
  TuningDb db;
  tuning::Machine machine;
  machine.set_id(kMachine);
  machine.set_cores(8);
  db.AddMachine(machine);
  db.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 100));  // all 8 cores
  tuning::Trial on_four = Sort("nth_element", 150);
  on_four.set_threads(4);
  db.AddTrial(Key(8, 1000, 10), on_four);
  tuning::Trial on_one = Sort("partial_sort", 400);
  on_one.set_threads(1);
  db.AddTrial(Key(8, 1000, 10), on_one);
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  const Dims dims = {{"batch", 8}, {"n", 1000}, {"k", 10}};
  for (const auto& [threads, config, on, median] :
       std::vector<std::tuple<int, std::string, int, double>>{{0, "method=partial_sort", 0, 100},
                                                              {8, "method=partial_sort", 0, 100},
                                                              {6, "method=nth_element", 4, 150},
                                                              {4, "method=nth_element", 4, 150},
                                                              {2, "method=partial_sort", 1, 400},
                                                              {1, "method=partial_sort", 1, 400}}) {
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", dims, kMachine, "", threads);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->match, Match::kExact);
    EXPECT_EQ(a->kernel->ConfigString(*a->config), config) << threads << " threads";
    EXPECT_EQ(a->threads, on) << threads << " threads";
    EXPECT_EQ(a->trial->median_ns(), median) << threads << " threads";
  }
}

TEST_F(Query, ExactLookupAllocatesNothing) {
  TuningDb db;
  for (int i = 0; i < 100; ++i) db.AddTrial(Key(8, 1000 + i, 10), Sort("nth_element", 200));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok());
  const Dims dims = {{"batch", 8}, {"n", 1050}, {"k", 10}};
  const long before = g_allocations.load();
  absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", dims, kMachine);
  const long after = g_allocations.load();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->match, Match::kExact);
  EXPECT_EQ(after - before, 0);
}

TEST_F(Query, NearestIsTheCloserTunedShapeInLog2) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 200));
  db.AddTrial(Key(8, 100000, 10), Radix(11, 9000));
  db.AddTrial(Key(8, 1000, 10, "another_machine"), Radix(10, 1));  // other machine: ignored
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok());
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32", {{"batch", 8}, {"n", 20000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(a->kernel->name(), "topk/radix");  // log2: 20000 is nearer 100000 than 1000
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "first_bits=11 round_bits=8 capacity=4096");
  EXPECT_EQ(DimsString(*a->tuned_dims), "batch=8,n=100000,k=10");
  EXPECT_NEAR(a->distance, std::log2(100001.0) - std::log2(20001.0), 1e-4);
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 5000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kernel->name(), "topk/sort");
  EXPECT_NEAR(a->distance, std::log2(5001.0) - std::log2(1001.0), 1e-4);
  // Distance sums over dims.
  a = lut->Query("topk", "f32", {{"batch", 64}, {"n", 1000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kernel->name(), "topk/sort");
  EXPECT_NEAR(a->distance, std::log2(65.0) - std::log2(9.0), 1e-4);
  // Another dtype signature (another dtype, or optional inputs present), data
  // class or dim set has nothing near: the default.
  for (auto [dtype, dims, data_class] :
       {std::tuple{"bf16", Dims{{"batch", 8}, {"n", 1000}, {"k", 10}}, ""},
        std::tuple{"f32+row_ends", Dims{{"batch", 8}, {"n", 1000}, {"k", 10}}, ""},
        std::tuple{"f32+row_starts+row_ends", Dims{{"batch", 8}, {"n", 1000}, {"k", 10}}, ""},
        std::tuple{"f32", Dims{{"batch", 8}, {"n", 1000}, {"k", 10}}, "dist=ties"},
        std::tuple{"f32", Dims{{"batch", 8}, {"n", 1000}, {"k", 10}, {"largest", 0}}, ""}}) {
    a = lut->Query("topk", dtype, dims, kMachine, data_class);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->match, Match::kDefault) << dtype << " " << DimsString(dims);
  }
}

TEST_F(Query, DefaultWhenNothingIsTuned) {
  absl::StatusOr<Lut> lut = Lut::Build(TuningDb(), *registry_);
  ASSERT_TRUE(lut.ok());
  EXPECT_EQ(lut->size(), 0u);
  EXPECT_THAT(lut->warnings(), IsEmpty());
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, ThisMachine().id());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kDefault);
  EXPECT_EQ(a->kernel->name(), "topk/radix");
  EXPECT_EQ(*a->config, a->kernel->DefaultConfig());
  EXPECT_EQ(a->tuned_dims, nullptr);
  EXPECT_EQ(a->trial, nullptr);
  EXPECT_EQ(a->distance, 0);
  EXPECT_THAT(a->warnings, IsEmpty());
  // Any dtype signature and attribute the op takes has a default too.
  for (auto [dtype, dims] : {std::pair{"bf16", Dims{{"batch", 8}, {"n", 1000}, {"k", 10}}},
                             std::pair{"f32+row_starts+row_ends", Dims{{"batch", 8}, {"n", 1000}, {"k", 10}}},
                             std::pair{"f32", Dims{{"batch", 8}, {"n", 1000}, {"k", 10}, {"largest", 0}}},
                             std::pair{"f32", Dims{{"batch", 8}, {"n", 1000}, {"k", 0}}}}) {
    a = lut->Query("topk", dtype, dims, kMachine);
    ASSERT_TRUE(a.ok()) << dtype << " " << DimsString(dims) << ": " << a.status();
    EXPECT_EQ(a->kernel->name(), "topk/radix") << dtype << " " << DimsString(dims);
  }
  // Shapes no kernel takes, keys the op does not take, and ops nobody declares.
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 10}, {"k", 11}}, kMachine);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("k=11"));
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 10}, {"q", 1}}, kMachine);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("q"));
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 10}}, kMachine);  // k missing
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 10}, {"k", 1}, {"largest", 2}}, kMachine);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* dtype : {"f64", "i32", "", "f32+bogus", "f32+values", "f32,f32"}) {
    a = lut->Query("topk", dtype, {{"batch", 8}, {"n", 10}, {"k", 1}}, kMachine);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << "'" << dtype << "'";
  }
  a = lut->Query("nosuchop", "f32", {{"m", 8}}, kMachine);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(a.status().message(), HasSubstr("nosuchop"));
}

TEST_F(Query, DefaultsFollowTheOpsPreferredVariantsInOrder) {
  // topk declares radix, then sort. Without that order the other kernels by
  // name (topk/blockwise, topk/heap) would come first.
  EXPECT_THAT(OpNamed("topk").default_variants(), ElementsAre("radix", "sort"));
  absl::StatusOr<Lut> lut = Lut::Build(TuningDb(), *registry_);
  ASSERT_TRUE(lut.ok());
  for (int64_t n : {1, 100, 100000}) {
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", {{"batch", 2}, {"n", n}, {"k", 1}}, kMachine);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->kernel->name(), "topk/radix") << n;
  }
  // A variant whose default configuration is illegal for the shape is passed
  // over: axpy prefers blocked, whose default block=256 may not exceed n;
  // below that the next kernel (here the reference) answers.
  EXPECT_THAT(OpNamed("axpy").default_variants(), ElementsAre("blocked"));
  absl::StatusOr<LutAnswer> a = lut->Query("axpy", "f32", {{"n", 256}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kernel->name(), "axpy/blocked");
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "block=256 unroll=scalar prefetch=0");
  a = lut->Query("axpy", "f32", {{"n", 255}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kDefault);
  EXPECT_EQ(a->kernel->name(), "axpy/reference");
}

TEST_F(Query, HandWrittenKeyWithADefaultAttributeAnswersExactly) {
  absl::StatusOr<TuningDb> db = TuningDb::Parse(kHandWritten, "hand.txtpb");
  ASSERT_TRUE(db.ok()) << db.status();
  absl::StatusOr<Lut> lut = Lut::Build(*db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  EXPECT_EQ(lut->size(), 1u);
  EXPECT_THAT(lut->warnings(), IsEmpty());
  for (const Dims& dims : {Dims{{"batch", 8}, {"n", 1000}, {"k", 10}},
                           Dims{{"k", 10}, {"n", 1000}, {"batch", 8}, {"largest", 1}}}) {
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", dims, kMachine);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->match, Match::kExact) << DimsString(dims);
    EXPECT_EQ(a->kernel->ConfigString(*a->config), "method=partial_sort");
    EXPECT_EQ(DimsString(*a->tuned_dims), "batch=8,n=1000,k=10");  // canonical
  }
  // largest=0 is another problem.
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}, {"largest", 0}}, kMachine);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->match, Match::kDefault);
}

TEST_F(Query, RaggedKeysAreTheirOwnProblems) {
  // Tuned with row_ends given: "f32+row_ends". The same dims without
  // row_ends, or with row_starts too, are other problems.
  TuningDb db;
  db.AddTrial(MakeProblemKey("topk", "f32+row_ends", {{"batch", 8}, {"n", 1000}, {"k", 8}}, kMachine),
              Sort("nth_element", 100));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  EXPECT_EQ(lut->size(), 1u);
  EXPECT_THAT(lut->warnings(), IsEmpty());
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32+row_ends", {{"batch", 8}, {"n", 1000}, {"k", 8}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kExact);
  EXPECT_EQ(a->kernel->name(), "topk/sort");
  a = lut->Query("topk", "f32+row_ends", {{"batch", 8}, {"n", 2000}, {"k", 8}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  for (const char* other : {"f32", "f32+row_starts", "f32+row_starts+row_ends", "bf16+row_ends"}) {
    a = lut->Query("topk", other, {{"batch", 8}, {"n", 1000}, {"k", 8}}, kMachine);
    ASSERT_TRUE(a.ok()) << other << ": " << a.status();
    EXPECT_EQ(a->match, Match::kDefault) << other;
  }
}

TEST_F(Query, EntriesTheRegistryCannotTakeAreReportedAndSkipped) {
  TuningDb db;
  db.AddTrial(MakeProblemKey("nosuchop", "f32", {{"m", 8}}, kMachine), MakeTrial("tiled", tuning::Config(), 1));
  db.AddTrial(MakeProblemKey("nosuchop", "f32", {{"m", 9}}, kMachine), MakeTrial("tiled", tuning::Config(), 1));
  db.AddTrial(MakeProblemKey("topk", "f64", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine),
              Sort("nth_element", 1));
  db.AddTrial(MakeProblemKey("topk", "f32+bogus", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine),
              Sort("nth_element", 1));
  db.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 100));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  EXPECT_EQ(lut->size(), 1u);
  EXPECT_THAT(lut->warnings(),
              UnorderedElementsAre(AllOf(HasSubstr("topk f64 batch=8,n=1000,k=10"), HasSubstr("skipped")),
                                   AllOf(HasSubstr("topk f32+bogus batch=8,n=1000,k=10"), HasSubstr("skipped")),
                                   AllOf(HasSubstr("op 'nosuchop' is not registered"), HasSubstr("2 entries"))));
  absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kExact);
  EXPECT_EQ(lut->Query("nosuchop", "f32", {{"m", 8}}, kMachine).status().code(), absl::StatusCode::kNotFound);
}

// A hand-written key without dims still builds (its k-d tree has zero
// axes); it answers no shape the op takes. Found by text_table_fuzzer.
TEST_F(Query, AnEntryWithoutDimsBuildsAndAnswersNothing) {
  TuningDb db;
  db.AddTrial(MakeProblemKey("topk", "f32", {}, kMachine), Sort("nth_element", 1));
  db.AddTrial(MakeProblemKey("topk", "f32", {}, kMachine), Sort("partial_sort", 2));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE(a->match, Match::kExact);
}

TEST_F(Query, AnEntryWithADimTheOpDoesNotTakeCannotAnswer) {
  TuningDb db;
  db.AddTrial(MakeProblemKey("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}, {"q", 1}}, kMachine),
              Sort("nth_element", 1));
  db.AddTrial(Key(8, 1000, 11), Sort("partial_sort", 100));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  // It cannot answer, and the table says so.
  EXPECT_EQ(lut->size(), 1u);
  EXPECT_THAT(lut->warnings(), ::testing::Contains(::testing::HasSubstr("'q'")));
  absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(DimsString(*a->tuned_dims), "batch=8,n=1000,k=11");
}

TEST_F(Query, NearestSkipsAConfigIllegalForTheAskedShape) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 16), Tiled(16, 100));  // nearest to k=12, but tile 16 > 12
  db.AddTrial(Key(8, 1000, 4), Sort("nth_element", 100));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok());
  EXPECT_EQ(lut->size(), 2u);
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 12}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(a->kernel->name(), "topk/sort");
  EXPECT_EQ(DimsString(*a->tuned_dims), "batch=8,n=1000,k=4");
  EXPECT_THAT(a->warnings,
              ElementsAre(AllOf(HasSubstr("batch=8,n=1000,k=16"), HasSubstr("topk/tiled tile=16"),
                                HasSubstr("tile=16 exceeds k=12"))));
  // Where it is legal, the nearer entry answers.
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 20}}, kMachine);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kernel->name(), "topk/tiled");
  EXPECT_THAT(a->warnings, IsEmpty());
}

TEST_F(Query, NearestSearchesPastManyIllegalEntries) {
  // Twenty entries nearer than the only legal one: more than one search pass.
  TuningDb db;
  for (int i = 0; i < 20; ++i) db.AddTrial(Key(8, 1000 + i, 64), Tiled(64, 100));
  db.AddTrial(Key(8, 1000, 2), Sort("nth_element", 100));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok());
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32", {{"batch", 8}, {"n", 1010}, {"k", 32}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kernel->name(), "topk/sort");
  EXPECT_THAT(a->warnings, SizeIs(20));
}

TEST_F(Query, StaleEntriesAreSkippedWithAWarning) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 100, 1, /*version=*/2));  // stale, nearest
  db.AddTrial(Key(8, 4000, 10), Radix(11, 900));
  // The fastest trial is stale, a current one remains: that one answers.
  db.AddTrial(Key(1, 50, 5), Sort("nth_element", 10, 1, /*version=*/2));
  db.AddTrial(Key(1, 50, 5), Sort("partial_sort", 20));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok());
  EXPECT_EQ(lut->size(), 2u);
  EXPECT_THAT(
      lut->warnings(),
      ElementsAre(AllOf(HasSubstr("stale entry topk f32 batch=8,n=1000,k=10"),
                        HasSubstr("topk/sort v2 was tuned, v1 is loaded"), HasSubstr("skipped")),
                  AllOf(HasSubstr("batch=1,n=50,k=5"), HasSubstr("answering from topk/sort v1"))));
  // Exactly the stale key: not exact; the nearest current entry answers.
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(a->kernel->name(), "topk/radix");
  EXPECT_THAT(a->warnings, ElementsAre(HasSubstr("stale entry topk f32 batch=8,n=1000,k=10")));
  // Near the stale key: the same.
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1100}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kernel->name(), "topk/radix");
  EXPECT_THAT(a->warnings, ElementsAre(HasSubstr("stale entry")));
  a = lut->Query("topk", "f32", {{"batch", 1}, {"n", 50}, {"k", 5}}, kMachine);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->match, Match::kExact);
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "method=partial_sort");
}

TEST_F(Query, UnregisteredVariantsAndBadConfigsAreSkipped) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), MakeTrial("warp_select", tuning::Config(), 1));
  db.AddTrial(Key(8, 1001, 10), Sort("bogo_sort", 1));
  db.AddTrial(Key(8, 5000, 10), Sort("partial_sort", 100));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok());
  EXPECT_EQ(lut->size(), 1u);
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(DimsString(*a->tuned_dims), "batch=8,n=5000,k=10");
  EXPECT_THAT(a->warnings,
              ElementsAre(HasSubstr("topk/warp_select is not registered"), HasSubstr("bogo_sort")));
}

// Neighbours that disagree: the nearest entry's winner is taken only when
// it fares well at the other near entries too (as they measured it).
TEST_F(Query, ANearestAnswerWeighsTheNeighboursMeasurements) {
  TuningDb db;
  // k=8: partial_sort wins, but nth_element was measured there 5% slower.
  // k=64 and k=128 (farther): nth_element wins; partial_sort 3x slower.
  db.AddTrial(Key(8, 1000, 8), Sort("partial_sort", 100));
  db.AddTrial(Key(8, 1000, 8), Sort("nth_element", 105));
  for (int k : {64, 128}) {
    db.AddTrial(Key(8, 1000, k), Sort("nth_element", 100));
    db.AddTrial(Key(8, 1000, k), Sort("partial_sort", 300));
  }
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  // k=20 is nearest k=8 (log2 distance 1.2 against 1.7 and 2.7), but
  // nth_element loses little there and wins at the others.
  absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 20}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "method=nth_element");
  EXPECT_EQ(DimsString(*a->tuned_dims), "batch=8,n=1000,k=64");
  // k=9 is so near k=8 that its winner stands.
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 9}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "method=partial_sort");
  // Where k=8 measured nth_element 4x slower, its own winner stands at k=20.
  db.AddTrial(Key(8, 1000, 8), Sort("nth_element", 400));
  lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 20}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "method=partial_sort");
}

TEST_F(Query, NearestIsTheBruteForceNearestOnRandomTables) {
  // Entries on grid planes (batch in powers of two), on a coarse grid of
  // repeated values and anywhere, all with one winner, so the nearest
  // entry answers: its distance and shape are the brute-force scan's, ties
  // to the earlier entry, whatever way the k-d tree splits them.
  auto log2 = [](int64_t v) { return std::log2(static_cast<float>(v) + 1.0f); };
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    TuningDb db;
    std::vector<Dims> tuned;
    for (int i = 0; i < 3000; ++i) {
      int64_t batch = 1 + static_cast<int64_t>(rng() % 600), n = 1000 + static_cast<int64_t>(rng() % 1500000),
              k = 1 + static_cast<int64_t>(rng() % 75);
      if (i % 3 == 0) batch = int64_t{1} << (rng() % 10);
      if (i % 3 == 1) n = 1000 * (1 + static_cast<int64_t>(rng() % 4)), k = 1 + static_cast<int64_t>(rng() % 3);
      const Dims dims = {{"batch", batch}, {"n", n}, {"k", k}};
      if (db.FindEntry(Key(batch, n, k)) != nullptr) continue;
      db.AddTrial(Key(batch, n, k), Sort("nth_element", 1));
      tuned.push_back(dims);
    }
    absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
    ASSERT_TRUE(lut.ok());
    for (int i = 0; i < 300; ++i) {
      Dims q = {{"batch", 1 + static_cast<int64_t>(rng() % 700)},
                {"n", 1000 + static_cast<int64_t>(rng() % 1600000)},
                {"k", 1 + static_cast<int64_t>(rng() % 80)}};
      if (i % 4 == 0) q[0].second = int64_t{1} << (rng() % 11);
      if (i % 5 == 0) q[1].second = 1000 * (1 + static_cast<int64_t>(rng() % 5));
      absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", q, kMachine);
      ASSERT_TRUE(a.ok()) << DimsString(q);
      float best = std::numeric_limits<float>::infinity();
      size_t at = 0;
      for (size_t t = 0; t < tuned.size(); ++t) {
        float d = 0;
        for (int j = 0; j < 3; ++j) d += std::fabs(log2(tuned[t][j].second) - log2(q[j].second));
        if (d < best) best = d, at = t;
      }
      if (best == 0) {
        EXPECT_EQ(a->match, Match::kExact) << DimsString(q);
        continue;
      }
      ASSERT_EQ(a->match, Match::kNearest) << DimsString(q);
      EXPECT_EQ(a->distance, static_cast<double>(best)) << DimsString(q);
      EXPECT_EQ(*a->tuned_dims, tuned[at]) << DimsString(q);
    }
  }
}

TEST_F(Query, TenThousandEntriesFromALoadedFile) {
  // 10,000 entries on a grid; exact and nearest lookups. (Their speed is
  // bench/lut_bench's business, not a test's.) Every entry has the same
  // winner, so the neighbours agree and the nearest entry answers.
  TuningDb db;
  std::vector<Dims> tuned;
  for (int b = 0; b < 10; ++b) {
    for (int n = 0; n < 40; ++n) {
      for (int k = 0; k < 25; ++k) {
        const int64_t batch = 1 << b, len = 1000 + 997 * n * n, kk = 1 + 3 * k;
        db.AddTrial(Key(batch, len, kk), Sort("nth_element", 1));
        tuned.push_back({{"batch", batch}, {"n", len}, {"k", kk}});
      }
    }
  }
  std::string dir = TempDir("ten_thousand");
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  absl::StatusOr<TuningDb> loaded = TuningDb::Load(dir + "/t.kdb");
  ASSERT_TRUE(loaded.ok());
  absl::StatusOr<Lut> lut = Lut::Build(*loaded, *registry_);
  ASSERT_TRUE(lut.ok());
  ASSERT_EQ(lut->size(), 10000u);
  std::vector<Dims> untuned;
  std::mt19937 rng(1);
  for (int i = 0; i < 1000; ++i) {
    untuned.push_back({{"batch", 1 + static_cast<int64_t>(rng() % 600)},
                       {"n", 1000 + static_cast<int64_t>(rng() % 1500000)},
                       {"k", 1 + static_cast<int64_t>(rng() % 75)}});
  }
  // Nearest agrees with a brute-force scan.
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", untuned[i], kMachine);
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(a->match, Match::kNearest);
    double best = 1e300;
    for (const Dims& t : tuned) {
      double d = 0;
      for (int j = 0; j < 3; ++j) {
        d += std::fabs(std::log2(t[j].second + 1.0) - std::log2(untuned[i][j].second + 1.0));
      }
      best = std::min(best, d);
    }
    EXPECT_NEAR(a->distance, best, 1e-3) << DimsString(untuned[i]);
  }
  // Every tuned shape answers exactly; untuned ones from the nearest.
  for (const Dims& q : tuned) {
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", q, kMachine);
    ASSERT_TRUE(a.ok()) << DimsString(q);
    ASSERT_EQ(a->match, Match::kExact) << DimsString(q);
  }
  for (const Dims& q : untuned) {
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", q, kMachine);
    ASSERT_TRUE(a.ok()) << DimsString(q);
    ASSERT_EQ(a->match, Match::kNearest) << DimsString(q);
  }
}

}  // namespace
}  // namespace lut_test
}  // namespace kreg
