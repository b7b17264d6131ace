// A second op, declared by a test plugin: axpy (out += alpha * x), queried
// and run through the Dispatcher (an in-out tensor, the op's data class
// asked per call); and topk through the typed front (kreg/topk.h).
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
#include <iterator>
#include <new>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "kreg/dispatch.h"
#include "kreg/limits.h"
#include "kreg/log.h"
#include "kreg/problem.h"
#include "kreg/record.h"
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

using Query = WithRegistry;

// ---- A second op, declared by a test plugin: axpy (out += alpha * x) -------------

tuning::ProblemKey AxpyKey(int64_t n, absl::string_view data_class = {}, absl::string_view dtype = "f32") {
  return MakeProblemKey("axpy", dtype, {{"n", n}}, kMachine, data_class);
}

tuning::Trial Blocked(int64_t block, double median_ns, const std::string& unroll = "scalar") {
  tuning::Config c = Ints({{"block", block}});
  tuning::ParamValue* u = c.add_params();
  u->set_name("unroll");
  u->set_choice(unroll);
  tuning::ParamValue* p = c.add_params();
  p->set_name("prefetch");
  p->set_int_value(0);
  return MakeTrial("blocked", std::move(c), median_ns);
}

class Axpy : public WithRegistry {
 protected:
  // The call out += alpha * x for n elements: x and out random (normal),
  // unless `x` is given.
  std::unique_ptr<Problem> Make(int64_t n, double alpha, const Tensor* x = nullptr) {
    std::shared_ptr<const Op> op = *registry_->GetOp("axpy");
    absl::StatusOr<Values> values =
        op->ParseValues(NamedValues{{"n", absl::StrCat(n)}, {"alpha", absl::StrCat(alpha)}});
    EXPECT_TRUE(values.ok()) << values.status();
    if (!values.ok()) return nullptr;
    ProblemOptions options;
    options.seed = static_cast<uint64_t>(n);
    if (x != nullptr) options.inputs["x"] = *x;
    absl::StatusOr<std::unique_ptr<Problem>> p =
        Problem::Make(op, registry_->Reference("axpy"), *values, options);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  // Checks out == out0 + alpha * x, by the op's reference (CheckOutputs) and
  // by hand.
  static void ExpectAxpy(const Problem& p, double alpha) {
    EXPECT_TRUE(p.CheckOutputs().ok()) << p.CheckOutputs();
    const Tensor* x = nullptr;
    const Tensor* out0 = nullptr;
    for (const auto& [name, t] : p.inputs()) (name == "x" ? x : out0) = t;
    const Tensor* out = p.outputs().at(0).second;
    ASSERT_EQ(p.outputs().at(0).first, "out");
    ASSERT_NE(x, nullptr);
    ASSERT_NE(out0, nullptr);
    ASSERT_EQ(out->numel(), x->numel());
    int wrong = 0;
    for (int64_t i = 0; i < out->numel(); ++i) {
      const double want = out0->data_as<float>()[i] + alpha * x->data_as<float>()[i];
      const double got = out->data_as<float>()[i];
      if (std::fabs(got - want) > 1e-6 + 1e-5 * std::fabs(want) && ++wrong <= 3) {
        ADD_FAILURE() << "out[" << i << "] = " << got << ", want " << want;
      }
    }
    EXPECT_EQ(wrong, 0);
  }
};

TEST_F(Axpy, QueryAnswersExactNearestAndDefault) {
  TuningDb db;
  db.AddTrial(AxpyKey(1000), Blocked(64, 100));
  db.AddTrial(AxpyKey(1000), Blocked(128, 150));
  db.AddTrial(AxpyKey(100000), Blocked(4096, 9000));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  EXPECT_EQ(lut->size(), 2u);
  EXPECT_THAT(lut->warnings(), IsEmpty());
  absl::StatusOr<LutAnswer> a = lut->Query("axpy", "f32", {{"n", 1000}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kExact);
  EXPECT_EQ(a->kernel->name(), "axpy/blocked");
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "block=64 unroll=scalar prefetch=0");
  EXPECT_EQ(a->trial->median_ns(), 100);
  EXPECT_EQ(DimsString(*a->tuned_dims), "n=1000");
  // Nearest in log2.
  a = lut->Query("axpy", "f32", {{"n", 5000}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "block=64 unroll=scalar prefetch=0");
  EXPECT_NEAR(a->distance, std::log2(5001.0) - std::log2(1001.0), 1e-4);
  a = lut->Query("axpy", "f32", {{"n", 50000}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(DimsString(*a->tuned_dims), "n=100000");
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "block=4096 unroll=scalar prefetch=0");
  a = lut->Query("axpy", "f32", {{"n", 4000}}, kMachine);  // nearer 1000 than 100000
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(DimsString(*a->tuned_dims), "n=1000");
  // Another dtype signature: the op's default variant, its default config.
  a = lut->Query("axpy", "bf16", {{"n", 1000}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kDefault);
  EXPECT_EQ(a->kernel->name(), "axpy/blocked");
  EXPECT_EQ(*a->config, a->kernel->DefaultConfig());
  // Keys axpy does not take.
  EXPECT_EQ(lut->Query("axpy", "i32", {{"n", 1000}}, kMachine).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lut->Query("axpy", "f32", {{"m", 1000}}, kMachine).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(Axpy, NearestPassesOverABlockLargerThanTheAskedN) {
  TuningDb db;
  db.AddTrial(AxpyKey(600), Blocked(512, 100));
  db.AddTrial(AxpyKey(100), Blocked(16, 100));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  ASSERT_EQ(lut->size(), 2u);
  // n=400 is nearest 600, whose block 512 exceeds 400: the n=100 entry answers.
  absl::StatusOr<LutAnswer> a = lut->Query("axpy", "f32", {{"n", 400}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kNearest);
  EXPECT_EQ(DimsString(*a->tuned_dims), "n=100");
  EXPECT_EQ(a->kernel->ConfigString(*a->config), "block=16 unroll=scalar prefetch=0");
  EXPECT_THAT(a->warnings, ElementsAre(AllOf(HasSubstr("axpy f32 n=600"), HasSubstr("block=512"))));
}

TEST_F(Axpy, DispatcherRunsATableEntryAndTheDefault) {
  TuningDb db;
  db.AddTrial(AxpyKey(1000), Blocked(64, 100));
  absl::StatusOr<Dispatcher> dispatcher = Dispatcher::Create(*registry_, db, kMachine);
  ASSERT_TRUE(dispatcher.ok()) << dispatcher.status();
  EXPECT_EQ(dispatcher->machine_id(), kMachine);
  ASSERT_NE(dispatcher->FindOp("axpy"), nullptr);
  for (auto [n, match, config] :
       {std::tuple{int64_t{1000}, Match::kExact, "block=64 unroll=scalar prefetch=0"},
        std::tuple{int64_t{1500}, Match::kNearest, "block=64 unroll=scalar prefetch=0"},
        std::tuple{int64_t{40}, Match::kDefault, ""}}) {
    SCOPED_TRACE(n);
    std::unique_ptr<Problem> p = Make(n, 0.5);
    ASSERT_NE(p, nullptr);
    absl::StatusOr<DispatchResult> ran = dispatcher->Run("axpy", *p->args());
    ASSERT_TRUE(ran.ok()) << ran.status();
    EXPECT_EQ(ran->match, match);
    EXPECT_EQ(ran->data_class, "");  // dense x
    if (match == Match::kDefault) {
      // The entry's block=64 and blocked's default block=256 exceed n=40:
      // the reference answers.
      EXPECT_EQ(ran->kernel, "axpy/reference");
      EXPECT_EQ(ran->config, "");
    } else {
      EXPECT_EQ(ran->kernel, "axpy/blocked");
      EXPECT_EQ(ran->config, config);
    }
    ExpectAxpy(*p, 0.5);
  }
  // With nothing tuned: the op's default variant, run, the same result.
  absl::StatusOr<Dispatcher> untuned = Dispatcher::Create(*registry_, TuningDb());
  ASSERT_TRUE(untuned.ok()) << untuned.status();
  EXPECT_EQ(untuned->machine_id(), ThisMachine().id());
  std::unique_ptr<Problem> p = Make(3000, -2);
  ASSERT_NE(p, nullptr);
  absl::StatusOr<DispatchResult> ran = untuned->Run("axpy", *p->args());
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->match, Match::kDefault);
  EXPECT_EQ(ran->kernel, "axpy/blocked");
  EXPECT_EQ(ran->config, "block=256 unroll=scalar prefetch=0");
  ExpectAxpy(*p, -2);
  // Running again accumulates again (out is in-out).
  ASSERT_TRUE(untuned->Run("axpy", *p->args()).ok());
  EXPECT_FALSE(p->CheckOutputs().ok());
  p->RestoreInOut();
  ASSERT_TRUE(untuned->Run("axpy", *p->args()).ok());
  ExpectAxpy(*p, -2);
}

TEST_F(Axpy, DispatcherRefusesUnknownOpsAndBadArguments) {
  absl::StatusOr<Dispatcher> dispatcher = Dispatcher::Create(*registry_, TuningDb(), kMachine);
  ASSERT_TRUE(dispatcher.ok());
  std::unique_ptr<Problem> p = Make(100, 1);
  ASSERT_NE(p, nullptr);
  absl::StatusOr<DispatchResult> ran = dispatcher->Run("nosuchop", *p->args());
  EXPECT_EQ(ran.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ran.status().message(), AllOf(HasSubstr("nosuchop"), HasSubstr("axpy"), HasSubstr("topk")));
  EXPECT_EQ(dispatcher->FindOp("nosuchop"), nullptr);
  // axpy's arguments are not topk's.
  ran = dispatcher->Run("topk", *p->args());
  EXPECT_EQ(ran.status().code(), absl::StatusCode::kInvalidArgument);
  // Nor is an n the tensors do not have.
  kreg_args args = *p->args();
  const int64_t wrong_n = 99;
  args.dims = &wrong_n;
  ran = dispatcher->Run("axpy", args);
  EXPECT_EQ(ran.status().code(), absl::StatusCode::kInvalidArgument);
}

// x of n elements, the first `zeros` of every 10 exactly 0, the rest 1..9.
Tensor SparseX(int64_t n, int zeros) {
  Tensor x(DType::kF32, {n});
  for (int64_t i = 0; i < n; ++i) x.data_as<float>()[i] = i % 10 < zeros ? 0.0f : static_cast<float>(i % 10);
  return x;
}

TEST_F(Axpy, DispatcherAsksTheOpsDataClassPerCall) {
  // Tuned for sparse x only (axpy's classifier: more than half of x exactly 0).
  TuningDb db;
  db.AddTrial(AxpyKey(1000, "sparse"), Blocked(32, 100));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok());
  absl::StatusOr<LutAnswer> a = lut->Query("axpy", "f32", {{"n", 1000}}, kMachine, "sparse");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kExact);
  a = lut->Query("axpy", "f32", {{"n", 1000}}, kMachine);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kDefault);

  absl::StatusOr<Dispatcher> dispatcher = Dispatcher::Create(*registry_, db, kMachine);
  ASSERT_TRUE(dispatcher.ok()) << dispatcher.status();
  const Tensor sparse_x = SparseX(1000, 6), half_x = SparseX(1000, 5);
  std::unique_ptr<Problem> sparse = Make(1000, 3, &sparse_x);
  std::unique_ptr<Problem> half = Make(1000, 3, &half_x);  // exactly half: not sparse
  std::unique_ptr<Problem> dense = Make(1000, 3);
  ASSERT_TRUE(sparse && half && dense);
  // The same shape, one Dispatcher, the class asked per call: sparse,
  // dense, sparse again.
  for (Problem* p : {sparse.get(), half.get(), dense.get(), sparse.get()}) {
    p->RestoreInOut();
    absl::StatusOr<DispatchResult> ran = dispatcher->Run("axpy", *p->args());
    ASSERT_TRUE(ran.ok()) << ran.status();
    if (p == sparse.get()) {
      EXPECT_EQ(ran->data_class, "sparse");
      EXPECT_EQ(ran->match, Match::kExact);
      EXPECT_EQ(ran->config, "block=32 unroll=scalar prefetch=0");
    } else {
      EXPECT_EQ(ran->data_class, "");
      EXPECT_EQ(ran->match, Match::kDefault);
      EXPECT_EQ(ran->config, "block=256 unroll=scalar prefetch=0");
    }
    EXPECT_EQ(ran->kernel, "axpy/blocked");
    ExpectAxpy(*p, 3);
  }
  // A data class given to Create is used for every call instead.
  absl::StatusOr<Dispatcher> forced = Dispatcher::Create(*registry_, db, kMachine, "sparse");
  ASSERT_TRUE(forced.ok());
  dense->RestoreInOut();
  absl::StatusOr<DispatchResult> ran = forced->Run("axpy", *dense->args());
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->data_class, "sparse");
  EXPECT_EQ(ran->match, Match::kExact);
  ExpectAxpy(*dense, 3);
}

// ---- topk through the typed front (kreg/topk.h) -------------------------------------

TEST_F(Query, TypedTopKDispatchKeysRowEndsIntoTheSignature) {
  // Tuned with row_ends; dispatched with and without them.
  TuningDb db;
  db.AddTrial(MakeProblemKey("topk", "f32+row_ends", {{"batch", 4}, {"n", 500}, {"k", 8}}, kMachine),
              Sort("nth_element", 100));
  absl::StatusOr<Dispatcher> dispatcher = Dispatcher::Create(*registry_, db, kMachine);
  ASSERT_TRUE(dispatcher.ok()) << dispatcher.status();
  Tensor input(DType::kF32, {4, 500});
  FillRandom(input, Dist::kNormal, 3);
  Tensor ends(DType::kI32, {4});
  for (int r = 0; r < 4; ++r) ends.data_as<int32_t>()[r] = 100 * (r + 1);
  TopKOptions options;
  options.row_ends = &ends;
  DispatchResult how;
  absl::StatusOr<TopKResult> got = TopK(*dispatcher, input, 8, options, &how);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(how.match, Match::kExact);
  EXPECT_EQ(how.kernel, "topk/sort");
  EXPECT_EQ(how.config, "method=nth_element");
  // The same as the reference kernel, and within each row's range.
  std::shared_ptr<const Kernel> reference = registry_->Reference("topk");
  ASSERT_NE(reference, nullptr);
  absl::StatusOr<TopKResult> want = TopK(*reference, reference->DefaultConfig(), input, 8, options);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->indices.nbytes(), want->indices.nbytes());
  EXPECT_EQ(std::memcmp(got->indices.data(), want->indices.data(), want->indices.nbytes()), 0);
  EXPECT_EQ(std::memcmp(got->values.data(), want->values.data(), want->values.nbytes()), 0);
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 8; ++j) EXPECT_LT(got->indices.data_as<int32_t>()[r * 8 + j], 100 * (r + 1));
  }
  // Without row_ends: another key, the default.
  got = TopK(*dispatcher, input, 8, {}, &how);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(how.match, Match::kDefault);
  EXPECT_EQ(how.kernel, "topk/radix");
  // Bad arguments come back as errors.
  EXPECT_EQ(TopK(*dispatcher, input, 501).status().code(), absl::StatusCode::kInvalidArgument);
  for (int r = 0; r < 4; ++r) ends.data_as<int32_t>()[r] = 501;
  EXPECT_EQ(TopK(*dispatcher, input, 8, options).status().code(), absl::StatusCode::kInvalidArgument);
}


// ---- KREG_RECORD: shapes the table does not answer exactly, written once -------

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The shape lines of a record file (its comments left out).
std::vector<std::string> ShapeLines(const std::string& path) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(ReadText(path), '\n', absl::SkipEmpty())) {
    if (line[0] != '#') lines.emplace_back(line);
  }
  return lines;
}

class Record : public Axpy {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kreg_record_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    unsetenv(kRecordEnv);
    std::filesystem::remove_all(dir_);
  }
  // A Dispatcher over a table tuned for n=1000 only, recording into `path`.
  Dispatcher Recording(const std::string& path) {
    setenv(kRecordEnv, path.c_str(), 1);
    TuningDb db;
    db.AddTrial(AxpyKey(1000), Blocked(64, 100));
    absl::StatusOr<Dispatcher> d = Dispatcher::Create(*registry_, db, kMachine);
    unsetenv(kRecordEnv);  // read at Create
    EXPECT_TRUE(d.ok()) << d.status();
    return *std::move(d);
  }
  void RunAxpy(const Dispatcher& d, int64_t n) {
    std::unique_ptr<Problem> p = Make(n, 0.5);
    ASSERT_NE(p, nullptr);
    absl::StatusOr<DispatchResult> ran = d.Run("axpy", *p->args());
    ASSERT_TRUE(ran.ok()) << ran.status();
    ExpectAxpy(*p, 0.5);
  }
  std::string dir_;
};

TEST_F(Record, DispatcherRecordsEachShapeNotAnsweredExactlyOnce) {
  const std::string path = dir_ + "/shapes.txt";
  Dispatcher d = Recording(path);
  RunAxpy(d, 1000);  // exact: not recorded
  EXPECT_FALSE(std::filesystem::exists(path));
  RunAxpy(d, 1500);  // nearest
  RunAxpy(d, 1500);
  RunAxpy(d, 40);    // default
  EXPECT_THAT(ReadText(path), ::testing::StartsWith("# kreg shape record 1: op dtype dims data_class device"));
  EXPECT_THAT(ShapeLines(path), ElementsAre("axpy f32 n=1500 - cpu", "axpy f32 n=40 - cpu"));
  // Another Dispatcher of this process (its own memo) writes nothing twice.
  Dispatcher again = Recording(path);
  RunAxpy(again, 1500);
  RunAxpy(again, 1000);
  EXPECT_THAT(ShapeLines(path), SizeIs(2));
  // Each line reads back as the key it was written from.
  absl::StatusOr<std::vector<RecordedShape>> read = ReadShapeRecord(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_THAT(*read, SizeIs(2));
  EXPECT_EQ((*read)[0].op, "axpy");
  EXPECT_EQ((*read)[0].dtype, "f32");
  EXPECT_EQ(DimsString((*read)[0].dims), "n=1500");
  EXPECT_EQ((*read)[0].data_class, "");
  EXPECT_EQ((*read)[0].device, DeviceKind::kCpu);
  EXPECT_EQ((*read)[0].line, 2);
}

TEST_F(Record, DispatcherKeepsTheLinesAlreadyInTheFile) {
  // Lines of earlier runs, and one another process appends meanwhile.
  const std::string path = dir_ + "/shapes.txt";
  std::ofstream(path) << "# an earlier run\naxpy f32 n=1500 - cpu\n";
  Dispatcher d = Recording(path);
  RunAxpy(d, 1500);
  RunAxpy(d, 2000);
  std::ofstream(path, std::ios::app) << "axpy f32 n=3000 - cpu\n";
  RunAxpy(d, 3000);
  RunAxpy(d, 4000);
  EXPECT_THAT(ShapeLines(path), ElementsAre("axpy f32 n=1500 - cpu", "axpy f32 n=2000 - cpu",
                                            "axpy f32 n=3000 - cpu", "axpy f32 n=4000 - cpu"));
  EXPECT_THAT(ReadText(path), ::testing::StartsWith("# an earlier run\n"));  // no second header
}

TEST_F(Record, AnUnwritableRecordWarnsOnceAndCallsGoOn) {
  std::vector<std::string> warnings;
  SetLogSink([&](LogLevel level, absl::string_view message) {
    if (level == LogLevel::kWarn) warnings.emplace_back(message);
  });
  const std::string path = dir_ + "/no/such/folder/shapes.txt";
  Dispatcher d = Recording(path);
  RunAxpy(d, 1500);
  RunAxpy(d, 2000);
  RunAxpy(d, 40);
  SetLogSink(nullptr);
  EXPECT_THAT(warnings, ElementsAre(AllOf(HasSubstr("KREG_RECORD=" + path), HasSubstr("cannot open it"))));
  // A folder is no record either.
  warnings.clear();
  SetLogSink([&](LogLevel, absl::string_view message) { warnings.emplace_back(message); });
  Dispatcher folder = Recording(dir_);
  RunAxpy(folder, 1500);
  SetLogSink(nullptr);
  EXPECT_THAT(warnings, SizeIs(1));
}

TEST(RecordLines, ParseStrictlyAndRoundTrip) {
  absl::StatusOr<RecordedShape> shape = ParseRecordLine("gmm bf16 m=512,k=64,n=32,groups=8 skewed cuda");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->data_class, "skewed");
  EXPECT_EQ(shape->device, DeviceKind::kCuda);
  EXPECT_EQ(*RecordLine(*shape), "gmm bf16 m=512,k=64,n=32,groups=8 skewed cuda");
  EXPECT_EQ(*RecordLine({"topk", "f32+row_ends", {{"n", 8}, {"largest", 0}}, "", DeviceKind::kCpu}),
            "topk f32+row_ends n=8,largest=0 - cpu");
  for (const char* bad : {"", "topk f32 n=8 - cpu extra", "topk f32 n=8 -", "topk  f32 n=8 - cpu",
                          "topk f32 n=99999999999999999999 - cpu", "topk f32 n=8,n=9 - cpu", "topk f32 n=+8 - cpu",
                          "topk f32 n=8 - gpu", "top\x01k f32 n=8 - cpu", "topk f32 n - cpu", "- f32 n=8 - cpu",
                          "topk f32 n=8 a\"b cpu", "topk f32 n=8 - cpu\r"}) {
    EXPECT_FALSE(ParseRecordLine(bad).ok()) << bad;
  }
  EXPECT_FALSE(RecordLine({"topk", "f32", {}, "a b", DeviceKind::kCpu}).ok());
  EXPECT_FALSE(RecordLine({"topk", "f32", {}, "-", DeviceKind::kCpu}).ok());
  EXPECT_FALSE(ParseRecordLine(std::string(limits::kMaxRecordLineBytes + 1, 'a')).ok());
}

TEST(RecordLines, ABadLineIsNamedByFileAndLine) {
  const std::string path = ::testing::TempDir() + "/kreg_record_bad_" + std::to_string(getpid());
  std::ofstream(path) << "# header\n\ntopk f32 batch=1,n=8,k=2 - cpu\ntopk f32 batch=1,n=8,k=x - cpu\n";
  absl::StatusOr<std::vector<RecordedShape>> read = ReadShapeRecord(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr(path + ":4: dims item 'k=x'"));
  std::remove(path.c_str());
  EXPECT_EQ(ReadShapeRecord(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lut_test
}  // namespace kreg
