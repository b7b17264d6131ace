// The LUT library: schema round trips, refusal of corrupt, truncated and
// foreign files, atomic and merged saves (two processes, nothing lost),
// recording and winners, merge and diff, and queries: exact, nearest (log2
// distance, legality for the asked shape, stale entries) and default (the
// op's preferred variants). Generic over ops: the same for topk (the topk
// plugin and a fake whose legality depends on k) and for axpy, an op a test
// plugin declares, queried and run through the Dispatcher (an in-out tensor,
// the op's data class asked per call).
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

constexpr char kMachine[] = "00000000deadbeef";

std::string TempDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/kreg_lut_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

tuning::ProblemKey Key(int64_t batch, int64_t n, int64_t k, absl::string_view machine = kMachine) {
  return MakeProblemKey("topk", "f32", {{"batch", batch}, {"n", n}, {"k", k}}, machine);
}

tuning::Config Choice(const std::string& name, const std::string& value) {
  tuning::Config c;
  tuning::ParamValue* p = c.add_params();
  p->set_name(name);
  p->set_choice(value);
  return c;
}

tuning::Trial MakeTrial(const std::string& variant, tuning::Config config, double median_ns,
                        int64_t measured_at = 100, uint32_t version = 1) {
  tuning::Trial t;
  t.set_variant(variant);
  t.set_variant_version(version);
  *t.mutable_config() = std::move(config);
  t.set_median_ns(median_ns);
  t.set_min_ns(median_ns * 0.9);
  t.set_max_ns(median_ns * 1.2);
  t.set_relative_iqr(0.03);
  t.set_reps(20);
  t.set_status(tuning::Trial::OK);
  t.set_measured_at(measured_at);
  return t;
}

tuning::Trial Sort(const std::string& method, double median_ns, int64_t measured_at = 100,
                   uint32_t version = 1) {
  return MakeTrial("sort", Choice("method", method), median_ns, measured_at, version);
}

tuning::Config Ints(std::vector<std::pair<std::string, int64_t>> values) {
  tuning::Config c;
  for (const auto& [name, value] : values) {
    tuning::ParamValue* p = c.add_params();
    p->set_name(name);
    p->set_int_value(value);
  }
  return c;
}

tuning::Trial Radix(int64_t first_bits, double median_ns, int64_t measured_at = 100) {
  return MakeTrial("radix",
                   Ints({{"first_bits", first_bits}, {"round_bits", 8}, {"capacity", 4096}}),
                   median_ns, measured_at);
}

tuning::Trial Tiled(int64_t tile, double median_ns) {
  return MakeTrial("tiled", Ints({{"tile", tile}}), median_ns);
}

// A small database with a bit of everything.
TuningDb SampleDb() {
  TuningDb db;
  db.AddMachine(ThisMachine());
  tuning::Machine other;
  other.set_cpu_model("Test CPU");
  other.add_isa("avx2");
  other.set_cores(4);
  db.AddMachine(other);
  db.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 5000));
  db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 4000));
  db.AddTrial(Key(8, 1000, 10), Radix(11, 4500));
  tuning::Trial crashed = Radix(12, 0);
  crashed.set_status(tuning::Trial::CRASHED);
  crashed.set_error("signal 11");
  db.AddTrial(Key(8, 1000, 10), crashed);
  db.SetTuningInfo(Key(8, 1000, 10), "kreg 0.1.0", "exhaustive", 1700000000);
  tuning::Config blockwise;
  auto* nb = blockwise.add_params();
  nb->set_name("num_blocks");
  nb->set_int_value(128);
  auto* ms = blockwise.add_params();
  ms->set_name("m_schedule");
  ms->mutable_list_value()->add_values(5);
  ms->mutable_list_value()->add_values(8);
  auto* s2 = blockwise.add_params();
  s2->set_name("stage2");
  s2->set_choice("nth_element");
  db.AddTrial(Key(64, 32768, 2048), MakeTrial("blockwise", blockwise, 1.5e6));
  tuning::ProblemKey ties = MakeProblemKey(
      "topk", "bf16", {{"batch", 1}, {"n", 4096}, {"k", 8}}, kMachine, "dist=ties");
  db.AddTrial(ties, Sort("nth_element", 900));
  return db;
}

void ExpectSame(const TuningDb& a, const TuningDb& b) {
  std::string diff;
  MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(a.proto(), b.proto())) << diff;
}

// ---- Machines, keys, configurations ---------------------------------------------

TEST(Machine, FingerprintIsStableAndDerivedFromTheFields) {
  const tuning::Machine& m = ThisMachine();
  EXPECT_THAT(m.id(), SizeIs(16));
  EXPECT_EQ(m.id(), FingerprintId(m));
  EXPECT_FALSE(m.cpu_model().empty());
  EXPECT_GE(m.cores(), 1u);
  tuning::Machine other = m;
  other.set_cores(m.cores() + 1);
  EXPECT_NE(FingerprintId(other), m.id());
  other = m;
  other.add_isa("avx512f_pretend");
  EXPECT_NE(FingerprintId(other), m.id());
  // The hash is FNV-1a, fixed: the same id on every build and process.
  tuning::Machine fixed;
  fixed.set_cpu_model("x");
  fixed.set_cores(1);
  EXPECT_EQ(FingerprintId(fixed), FingerprintId(fixed));
  EXPECT_EQ(FingerprintId(fixed).find_first_not_of("0123456789abcdef"), std::string::npos);
}

class WithRegistry : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LoadOptions options;
    // The topk plugin, the tiled fake, and the axpy test op (its plugin file
    // only: the folder also holds kernels of other ABI layouts).
    options.plugin_paths = {KREG_PLUGIN_DIR, std::string(KREG_TEST_PLUGIN_DIR) + "/lut",
                            std::string(KREG_AXPY_PLUGIN_DIR) + "/test_axpy.so"};
    options.use_env = false;
    options.use_default_dirs = false;
    auto registry = Registry::Load(options);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = std::move(*registry).release();
    ASSERT_TRUE(registry_->Get("topk/tiled").ok());
    ASSERT_TRUE(registry_->Get("axpy/blocked").ok());
    ASSERT_THAT(registry_->refusals(), IsEmpty());
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  std::shared_ptr<const Kernel> Get(absl::string_view name) { return *registry_->Get(name); }
  const Op& OpNamed(absl::string_view name) { return **registry_->GetOp(name); }
  static Registry* registry_;
};
Registry* WithRegistry::registry_ = nullptr;

using Keys = WithRegistry;

TEST_F(Keys, CanonicalDimsOrderAndDropDefaultAttributes) {
  const Op& topk = OpNamed("topk");
  using D = std::pair<std::string, int64_t>;
  EXPECT_THAT(CanonicalDims(topk, {{"largest", 1}, {"k", 10}, {"n", 100}, {"batch", 2}}),
              ElementsAre(D("batch", 2), D("n", 100), D("k", 10)));
  EXPECT_THAT(CanonicalDims(topk, {{"k", 10}, {"largest", 0}, {"n", 100}, {"batch", 2}}),
              ElementsAre(D("batch", 2), D("n", 100), D("k", 10), D("largest", 0)));
  // Names the op does not know come last, as given.
  Dims unknown = {{"z", 1}, {"a", 2}};
  EXPECT_EQ(CanonicalDims(topk, unknown), unknown);
  EXPECT_THAT(CanonicalDims(topk, {{"z", 1}, {"k", 3}, {"a", 2}}),
              ElementsAre(D("k", 3), D("z", 1), D("a", 2)));
  // A float attribute is not a key dim: axpy's key is its one dim.
  EXPECT_THAT(CanonicalDims(OpNamed("axpy"), {{"n", 5}}), ElementsAre(D("n", 5)));
  tuning::ProblemKey key = Key(8, 1000, 10);
  EXPECT_EQ(KeyString(key), absl::StrCat("topk f32 batch=8,n=1000,k=10 @", kMachine));
}

TEST_F(Keys, MakeProblemKeyStoresDimsAsGiven) {
  tuning::ProblemKey as_given = MakeProblemKey(
      "topk", "f32", {{"k", 10}, {"largest", 1}, {"n", 1000}, {"batch", 8}}, kMachine);
  EXPECT_EQ(KeyString(as_given), absl::StrCat("topk f32 k=10,largest=1,n=1000,batch=8 @", kMachine));
  // From an op's key of a call, data class included.
  OpKey op_key{"f32+row_ends", {{"batch", 8}, {"n", 1000}, {"k", 10}}};
  tuning::ProblemKey ragged = MakeProblemKey("topk", op_key, kMachine, "dist=ties");
  EXPECT_EQ(ragged.dtype(), "f32+row_ends");
  EXPECT_EQ(KeyString(ragged),
            absl::StrCat("topk f32+row_ends batch=8,n=1000,k=10 [dist=ties] @", kMachine));
}

TEST_F(Keys, TheOpKeysACallByItsArguments) {
  std::shared_ptr<const Op> topk = *registry_->GetOp("topk");
  absl::StatusOr<Values> values = topk->ParseValues(Dims{{"k", 4}, {"n", 100}, {"batch", 3}});
  ASSERT_TRUE(values.ok()) << values.status();
  // Canonical: the op's dims in its order; largest at its default left out.
  EXPECT_EQ(DimsString(topk->KeyDims(*values)), "batch=3,n=100,k=4");
  values = topk->ParseValues(Dims{{"k", 4}, {"n", 100}, {"batch", 3}, {"largest", 0}});
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(DimsString(topk->KeyDims(*values)), "batch=3,n=100,k=4,largest=0");
  // Optional inputs present are part of the dtype signature.
  ProblemOptions options;
  options.with = {"row_ends"};
  absl::StatusOr<std::unique_ptr<Problem>> p =
      Problem::Make(topk, registry_->Reference("topk"), *values, options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->key().dtype, "f32+row_ends");
  EXPECT_EQ(DimsString((*p)->key().dims), "batch=3,n=100,k=4,largest=0");
  options.with = {"row_starts", "row_ends"};
  options.dtypes = {{"", DType::kBF16}};
  p = Problem::Make(topk, registry_->Reference("topk"), *values, options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->key().dtype, "bf16+row_starts+row_ends");
}

using Configs = WithRegistry;

TEST_F(Configs, EveryKernelsDefaultRoundTrips) {
  for (const auto& kernel : registry_->Kernels()) {
    Config config = kernel->DefaultConfig();
    tuning::Config proto = ToProtoConfig(*kernel, config);
    EXPECT_EQ(proto.params_size(), static_cast<int>(kernel->params().size())) << kernel->name();
    absl::StatusOr<Config> back = FromProtoConfig(*kernel, proto);
    ASSERT_TRUE(back.ok()) << kernel->name() << ": " << back.status();
    EXPECT_EQ(*back, config) << kernel->name();
  }
}

TEST_F(Configs, StoredConfigsTheKernelDoesNotDeclareAreRefused) {
  auto sort = Get("topk/sort");
  auto radix = Get("topk/radix");
  auto blockwise = Get("topk/blockwise");
  EXPECT_TRUE(FromProtoConfig(*sort, Choice("method", "nth_element")).ok());
  auto expect_bad = [](const absl::StatusOr<Config>& c, absl::string_view what) {
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(c.status().message(), HasSubstr(what));
  };
  expect_bad(FromProtoConfig(*sort, Choice("method", "bogo_sort")), "bogo_sort");
  expect_bad(FromProtoConfig(*sort, Choice("speed", "fast")), "speed");
  // A parameter missing (stored before its variant gained it, at the same
  // version) keeps its default.
  absl::StatusOr<Config> missing = FromProtoConfig(*sort, tuning::Config());
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(*missing, sort->DefaultConfig());
  missing = FromProtoConfig(*radix, Ints({{"first_bits", 8}, {"round_bits", 4}}));
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(radix->ConfigString(*missing), "first_bits=8 round_bits=4 capacity=4096");
  expect_bad(
      FromProtoConfig(*radix, Ints({{"first_bits", 13}, {"round_bits", 8}, {"capacity", 4096}})),
      "first_bits");
  tuning::Config decreasing = ToProtoConfig(*blockwise, blockwise->DefaultConfig());
  auto* list = decreasing.mutable_params(1)->mutable_list_value();
  list->Clear();
  list->add_values(8);
  list->add_values(5);
  expect_bad(FromProtoConfig(*blockwise, decreasing), "increasing");
  EXPECT_EQ(ConfigText(ToProtoConfig(*blockwise, blockwise->DefaultConfig())),
            "num_blocks=128 m_schedule=5,8,12 stage2=partial_sort");
}

// ---- Files -----------------------------------------------------------------------

TEST(Files, BinaryRoundTrip) {
  std::string dir = TempDir("binary");
  TuningDb db = SampleDb();
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/t.kdb");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(db, *back);
  EXPECT_EQ(back->size(), 3u);
  EXPECT_EQ(back->proto().machines_size(), 2);
  EXPECT_EQ(back->proto().schema_version(), kSchemaVersion);
  EXPECT_EQ(ReadBytes(dir + "/t.kdb").find("schema_version"), std::string::npos);  // binary
}

TEST(Files, TextRoundTripAndFormatByContent) {
  std::string dir = TempDir("text");
  TuningDb db = SampleDb();
  for (std::string name : {"t.txtpb", "t.textproto", "t.pbtxt"}) {
    ASSERT_TRUE(db.Save(dir + "/" + name).ok()) << name;
    std::string text = ReadBytes(dir + "/" + name);
    EXPECT_THAT(text, HasSubstr("schema_version: 2")) << name;
    EXPECT_THAT(text, Not(HasSubstr("checksum"))) << name;  // text files carry none
    EXPECT_THAT(text, HasSubstr("choice: \"nth_element\"")) << name;
    absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/" + name);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(db, *back);
  }
  EXPECT_EQ(FormatForPath("a.txtpb"), FileFormat::kText);
  EXPECT_EQ(FormatForPath("a.kdb"), FileFormat::kBinary);
  // Either format loads under any name.
  WriteBytes(dir + "/text_named.kdb", db.ToText());
  ASSERT_TRUE(db.Save(dir + "/binary.kdb").ok());
  std::filesystem::rename(dir + "/binary.kdb", dir + "/binary_named.txtpb");
  for (std::string name : {"text_named.kdb", "binary_named.txtpb"}) {
    absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/" + name);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status();
    ExpectSame(db, *back);
  }
}

// A table written by hand: dims in another order, and the default attribute
// largest=1 spelled out.
constexpr char kHandWritten[] = R"pb(
  schema_version: 1
  entries {
    key {
      op: "topk"
      dtype: "f32"
      dims { name: "k" value: 10 }
      dims { name: "n" value: 1000 }
      dims { name: "batch" value: 8 }
      dims { name: "largest" value: 1 }
      machine_id: "00000000deadbeef"
    }
    best {
      variant: "sort"
      variant_version: 1
      status: OK
      median_ns: 7
      config { params { name: "method" choice: "partial_sort" } }
    }
  }
)pb";

TEST(Files, HandWrittenTextWithoutTrailerLoads) {
  std::string dir = TempDir("hand");
  WriteBytes(dir + "/t.txtpb", kHandWritten);
  absl::StatusOr<TuningDb> db = TuningDb::Load(dir + "/t.txtpb");
  ASSERT_TRUE(db.ok()) << db.status();
  // The key is kept as written (a TuningDb knows no ops); the slim entry's
  // winner becomes its one known trial.
  const tuning::Entry* e = db->FindEntry(MakeProblemKey(
      "topk", "f32", {{"k", 10}, {"n", 1000}, {"batch", 8}, {"largest", 1}}, kMachine));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(KeyString(e->key()),
            absl::StrCat("topk f32 k=10,n=1000,batch=8,largest=1 @", kMachine));
  EXPECT_EQ(e->trials_size(), 1);
  EXPECT_EQ(e->best().median_ns(), 7);
  // Dims in another order are the same key; without largest it is another
  // (the Lut, which knows the op, treats them as one: Query.HandWritten...).
  EXPECT_EQ(db->FindEntry(MakeProblemKey(
                "topk", "f32", {{"batch", 8}, {"largest", 1}, {"n", 1000}, {"k", 10}}, kMachine)),
            e);
  EXPECT_EQ(db->FindEntry(Key(8, 1000, 10)), nullptr);
}

TEST(Files, MissingFileIsNotFound) {
  absl::StatusOr<TuningDb> db = TuningDb::Load(TempDir("missing") + "/nope.kdb");
  EXPECT_EQ(db.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(db.status().message(), HasSubstr("nope.kdb"));
}

void ExpectDataLoss(const std::string& path, absl::string_view why = "") {
  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << path << ": " << db.status();
  EXPECT_THAT(db.status().message(), HasSubstr(path));
  EXPECT_THAT(db.status().message(), HasSubstr(why));
}

TEST(Files, CorruptAndForeignFilesAreDataLossNamingTheFile) {
  std::string dir = TempDir("corrupt");
  WriteBytes(dir + "/empty.kdb", "");
  ExpectDataLoss(dir + "/empty.kdb", "empty");
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::string junk(1 + rng() % 4096, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    WriteBytes(dir + "/random.kdb", junk);
    ExpectDataLoss(dir + "/random.kdb");
  }
  WriteBytes(dir + "/t.json", R"({"schema_version": 1, "entries": []})");
  ExpectDataLoss(dir + "/t.json");
  // A .npy file: magic, version, header length, header, data.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  header.resize(118, ' ');
  header += '\n';
  std::string npy = std::string("\x93NUMPY\x01\x00", 8) +
                    std::string(1, static_cast<char>(header.size())) + std::string(1, '\0') +
                    header + std::string(8, '\x3f');
  WriteBytes(dir + "/t.npy", npy);
  ExpectDataLoss(dir + "/t.npy");
  WriteBytes(dir + "/typo.txtpb", "schema_version: 1\nentries { varient: \"sort\" }\n");
  ExpectDataLoss(dir + "/typo.txtpb", "varient");
  WriteBytes(dir + "/newer.txtpb", "schema_version: 3\n");
  ExpectDataLoss(dir + "/newer.txtpb", "newer");
  WriteBytes(dir + "/none.txtpb", "entries { key { op: \"topk\" } }\n");
  ExpectDataLoss(dir + "/none.txtpb", "schema_version");
  WriteBytes(dir + "/count.txtpb", "schema_version: 1\nentry_count: 3\n");
  ExpectDataLoss(dir + "/count.txtpb", "entry_count");
}

TEST(Files, EveryTruncationOfABinaryFileIsRefused) {
  std::string dir = TempDir("truncated");
  ASSERT_TRUE(SampleDb().Save(dir + "/t.kdb").ok());
  const std::string whole = ReadBytes(dir + "/t.kdb");
  ASSERT_GT(whole.size(), 100u);
  for (size_t size = 0; size < whole.size(); ++size) {
    absl::StatusOr<TuningDb> db =
        TuningDb::Parse(absl::string_view(whole).substr(0, size), "cut.kdb");
    ASSERT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << "cut at " << size;
    ASSERT_THAT(db.status().message(), HasSubstr("cut.kdb"));
  }
  EXPECT_TRUE(TuningDb::Parse(whole, "whole.kdb").ok());
}

// Every single-bit flip anywhere in a binary table is an error (the
// checksum), never a table that loads with other content.
TEST(Files, EveryBitFlipOfABinaryFileIsRefused) {
  const std::string whole = SampleDb().ToBinary();
  for (size_t bit = 0; bit < whole.size() * 8; ++bit) {
    std::string flipped = whole;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    absl::StatusOr<TuningDb> db = TuningDb::Parse(flipped, "flipped.kdb");
    ASSERT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << "bit " << bit;
    ASSERT_THAT(db.status().message(), HasSubstr("flipped.kdb"));
  }
  absl::StatusOr<TuningDb> db = TuningDb::Parse(whole, "whole.kdb");
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(db->unchecked(), "");
}

// Binary files of schema 1 (before checksums) still load, saying so; saved
// again they get one.
TEST(Files, OlderBinaryFilesWithoutAChecksumLoadWithANote) {
  std::string dir = TempDir("old");
  tuning::Database old = SampleDb().proto();
  old.set_schema_version(1);
  WriteBytes(dir + "/old.kdb", old.SerializeAsString());
  absl::StatusOr<TuningDb> db = TuningDb::Load(dir + "/old.kdb");
  ASSERT_TRUE(db.ok()) << db.status();
  ExpectSame(SampleDb(), *db);
  EXPECT_THAT(db->unchecked(), HasSubstr("without a checksum"));
  ASSERT_TRUE(db->SaveMerged(dir + "/old.kdb").ok());
  absl::StatusOr<TuningDb> again = TuningDb::Load(dir + "/old.kdb");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->unchecked(), "");
  EXPECT_EQ(again->proto().schema_version(), kSchemaVersion);
  // A schema 2 file without its checksum is damaged, not old.
  tuning::Database stripped = SampleDb().proto();
  WriteBytes(dir + "/stripped.kdb", stripped.SerializeAsString());
  ExpectDataLoss(dir + "/stripped.kdb", "no checksum");
}

// A table reached through a symbolic link is locked and replaced where it
// lives: the link stays a link.
TEST(Files, SavesThroughALinkReplaceItsTarget) {
  std::string dir = TempDir("link");
  std::filesystem::create_directory(dir + "/real");
  ASSERT_TRUE(SampleDb().Save(dir + "/real/t.kdb").ok());
  std::filesystem::create_symlink("real/t.kdb", dir + "/link.kdb");
  std::filesystem::create_symlink(dir + "/link.kdb", dir + "/link2.kdb");  // a link to a link
  TuningDb more;
  more.AddTrial(Key(1, 10, 1), Sort("partial_sort", 5));
  ASSERT_TRUE(more.SaveMerged(dir + "/link2.kdb").ok());
  ASSERT_TRUE(more.Save(dir + "/link.kdb").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.kdb"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link2.kdb"));
  EXPECT_THAT(Listing(dir + "/real"), ElementsAre("t.kdb", "t.kdb.lock"));
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/real/t.kdb");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->FindEntry(Key(1, 10, 1)), nullptr);
  // A dangling link: the table is made where it points.
  std::filesystem::create_symlink("real/new.kdb", dir + "/dangling.kdb");
  ASSERT_TRUE(more.Save(dir + "/dangling.kdb").ok());
  EXPECT_TRUE(std::filesystem::is_regular_file(dir + "/real/new.kdb"));
  // A loop of links is an error.
  std::filesystem::create_symlink("loop_b", dir + "/loop_a");
  std::filesystem::create_symlink("loop_a", dir + "/loop_b");
  EXPECT_THAT(more.Save(dir + "/loop_a").message(), HasSubstr("symbolic links"));
}

// What is not a regular file is refused at once: reading a FIFO would wait
// for a writer forever.
TEST(Files, AFifoOrAFolderIsNotATable) {
  std::string dir = TempDir("fifo");
  ASSERT_EQ(mkfifo((dir + "/fifo.kdb").c_str(), 0600), 0);
  absl::StatusOr<TuningDb> db = TuningDb::Load(dir + "/fifo.kdb");
  EXPECT_THAT(db.status().message(), HasSubstr("fifo.kdb: not a regular file"));
  EXPECT_THAT(SampleDb().Save(dir + "/fifo.kdb").message(), HasSubstr("not a regular file"));
  EXPECT_THAT(SampleDb().SaveMerged(dir).message(), HasSubstr("not a regular file"));
}

// A table this user may not write is not replaced through a writable
// folder (here a world-writable one); one it may write keeps its owner,
// group and mode.
TEST(Files, ReadOnlyTablesAreNotReplaced) {
  std::string dir = TempDir("readonly");
  std::filesystem::permissions(dir, std::filesystem::perms(0777));
  ASSERT_TRUE(SampleDb().Save(dir + "/t.kdb").ok());
  std::filesystem::permissions(dir + "/t.kdb", std::filesystem::perms(0444));
  const std::string before = ReadBytes(dir + "/t.kdb");
  auto refused = [&] {
    absl::Status s = SampleDb().SaveMerged(dir + "/t.kdb");
    return s.code() == absl::StatusCode::kPermissionDenied && absl::StrContains(s.message(), "may not write");
  };
  if (geteuid() != 0) {
    EXPECT_TRUE(refused());
    EXPECT_EQ(ReadBytes(dir + "/t.kdb"), before);
  } else {
    // Root may write any file: the refusal is tried as user nobody (in a
    // child), on root's read-only table.
    const pid_t child = fork();
    if (child == 0) {
      _exit(setgid(65534) == 0 && setuid(65534) == 0 && refused() ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(ReadBytes(dir + "/t.kdb"), before);
    // What root replaces keeps its owner, group and mode.
    ASSERT_EQ(chown((dir + "/t.kdb").c_str(), 65534, 65534), 0);
    ASSERT_TRUE(SampleDb().Save(dir + "/t.kdb").ok());
    struct stat st;
    ASSERT_EQ(stat((dir + "/t.kdb").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 65534u);
    EXPECT_EQ(st.st_gid, 65534u);
    EXPECT_EQ(st.st_mode & 07777, 0444u);
  }
}

TEST(Files, SaveIsAtomicAndLeavesNoTemporaries) {
  std::string dir = TempDir("atomic");
  TuningDb db = SampleDb();
  // A temporary left by a writer killed mid-write is cleaned up.
  WriteBytes(dir + "/.t.kdb.tmp-ABCDEF", "half a file");
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  ASSERT_TRUE(db.SaveMerged(dir + "/t.kdb").ok());
  ASSERT_TRUE(db.Save(dir + "/t.kdb", {.winners_only = true}).ok());
  EXPECT_THAT(Listing(dir), ElementsAre("t.kdb", "t.kdb.lock"));
  // Keeps the mode of the file it replaces.
  std::filesystem::permissions(dir + "/t.kdb", std::filesystem::perms(0600));
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  EXPECT_EQ(std::filesystem::status(dir + "/t.kdb").permissions(), std::filesystem::perms(0600));
  // A folder that does not exist: an error, nothing written.
  absl::Status s = db.Save(dir + "/no/such/dir/t.kdb");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no/such/dir/t.kdb"));
}

TEST(Files, WinnersOnlySaveKeepsBestAndRunnerUp) {
  std::string dir = TempDir("slim");
  ASSERT_TRUE(SampleDb().Save(dir + "/t.kdb", {.winners_only = true}).ok());
  absl::StatusOr<TuningDb> db = TuningDb::Load(dir + "/t.kdb");
  ASSERT_TRUE(db.ok()) << db.status();
  const tuning::Entry* e = db->FindEntry(Key(8, 1000, 10));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->trials_size(), 2);  // best and runner-up
  EXPECT_EQ(ConfigText(e->best().config()), "method=nth_element");
  EXPECT_EQ(e->runner_up().variant(), "radix");
}

// Per variant and combination of named choices (a choice may need an ISA
// another machine lacks): sort's two methods both stay, radix's integer
// parameters keep only the fastest.
TEST(Files, BestPerVariantKeepsEachVariantsFastestTrialPerChoice) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 500));
  db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 400));
  db.AddTrial(Key(8, 1000, 10), Radix(8, 300));
  db.AddTrial(Key(8, 1000, 10), Radix(11, 250));
  db.AddTrial(Key(8, 1000, 10), Radix(12, 260));
  std::string dir = TempDir("per_variant");
  ASSERT_TRUE(db.Save(dir + "/t.txtpb", {.best_per_variant = true}).ok());
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/t.txtpb");
  ASSERT_TRUE(back.ok()) << back.status();
  const tuning::Entry* e = back->FindEntry(Key(8, 1000, 10));
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->trials_size(), 3);  // fastest first
  EXPECT_EQ(e->trials(0).variant(), "radix");
  EXPECT_EQ(ConfigText(e->trials(0).config()), "first_bits=11 round_bits=8 capacity=4096");
  EXPECT_EQ(e->trials(1).variant(), "sort");
  EXPECT_EQ(ConfigText(e->trials(1).config()), "method=nth_element");
  EXPECT_EQ(ConfigText(e->trials(2).config()), "method=partial_sort");
  EXPECT_EQ(e->best().median_ns(), 250);
  EXPECT_EQ(e->runner_up().variant(), "sort");
}

TEST(Files, TextThatIsNotUtf8IsEscapedSoTheTableStaysReadable) {
  TuningDb db;
  const tuning::ProblemKey key =
      MakeProblemKey("topk", "f32", {{"batch", 1}, {"n", 10}, {"k", 1}}, kMachine, "class\xff\xfe");
  tuning::Trial failed = Sort("partial_sort", 0);
  failed.set_status(tuning::Trial::ERROR);
  failed.set_error(std::string("plugin said \xff\x80 and \xc3\xa9"));
  db.AddTrial(key, failed);
  db.AddTrial(key, Sort("nth_element", 5));
  std::string dir = TempDir("utf8");
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/t.kdb");
  ASSERT_TRUE(back.ok()) << back.status();
  // The raw key still finds its (escaped) entry.
  const tuning::Entry* e = back->FindEntry(key);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->key().data_class(), "class\\xff\\xfe");
  bool seen = false;
  for (const tuning::Trial& t : e->trials()) {
    if (t.status() == tuning::Trial::ERROR) {
      EXPECT_EQ(t.error(), "plugin said \\xff\\x80 and \xc3\xa9");  // valid UTF-8 kept
      seen = true;
    }
  }
  EXPECT_TRUE(seen);
}

TEST(Recording, IncompleteSweepsAreMarkedAndMergedWithTheirTime) {
  TuningDb a, b;
  a.AddTrial(Key(8, 1000, 10), Sort("nth_element", 5));
  a.SetTuningInfo(Key(8, 1000, 10), "kreg test", "halving", /*tuned_at=*/10, /*complete=*/false);
  EXPECT_TRUE(a.FindEntry(Key(8, 1000, 10))->incomplete());
  b.SetTuningInfo(Key(8, 1000, 10), "kreg test", "exhaustive", /*tuned_at=*/20, /*complete=*/true);
  a.MergeFrom(b);  // the later, complete sweep wins
  EXPECT_FALSE(a.FindEntry(Key(8, 1000, 10))->incomplete());
  b.SetTuningInfo(Key(8, 1000, 10), "kreg test", "halving", /*tuned_at=*/30, /*complete=*/false);
  a.MergeFrom(b);
  EXPECT_TRUE(a.FindEntry(Key(8, 1000, 10))->incomplete());
}

TEST(Files, SaveMergedOverACorruptFileFailsAndLeavesItIntact) {
  std::string dir = TempDir("merge_corrupt");
  const std::string path = dir + "/t.kdb";
  ASSERT_TRUE(SampleDb().Save(path).ok());
  std::string whole = ReadBytes(path);
  std::string cut = whole.substr(0, whole.size() / 2);
  WriteBytes(path, cut);
  TuningDb db;
  db.AddTrial(Key(1, 2, 1), Sort("nth_element", 1));
  absl::Status s = db.SaveMerged(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_EQ(ReadBytes(path), cut);
  EXPECT_EQ(db.size(), 1u);  // unchanged too
  EXPECT_THAT(Listing(dir), ElementsAre("t.kdb", "t.kdb.lock"));
}

TEST(Files, SaveMergedCreatesAndExtendsAFile) {
  std::string dir = TempDir("merge");
  const std::string path = dir + "/t.txtpb";
  TuningDb a;
  a.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 10));
  ASSERT_TRUE(a.SaveMerged(path).ok());
  TuningDb b;
  b.AddTrial(Key(8, 1000, 10), Sort("nth_element", 5));
  b.AddTrial(Key(16, 1000, 10), Sort("nth_element", 5));
  ASSERT_TRUE(b.SaveMerged(path).ok());
  EXPECT_EQ(b.size(), 2u);  // b became the merged database
  absl::StatusOr<TuningDb> both = TuningDb::Load(path);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->size(), 2u);
  EXPECT_EQ(both->FindEntry(Key(8, 1000, 10))->trials_size(), 2);
  EXPECT_EQ(ConfigText(both->FindEntry(Key(8, 1000, 10))->best().config()), "method=nth_element");
}

// Two processes, each recording 200 trials one SaveMerged at a time into one
// file: the file ends up with all 400.
TEST(Files, ConcurrentWritersLoseNothing) {
  std::string dir = TempDir("concurrent");
  const std::string path = dir + "/t.kdb";
  constexpr int kTrials = 200;
  pid_t children[2];
  for (int c = 0; c < 2; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child c measures method c on problems n = 1000 + i.
      TuningDb db;
      const char* method = c == 0 ? "partial_sort" : "nth_element";
      for (int i = 0; i < kTrials; ++i) {
        db.AddTrial(Key(8, 1000 + i, 10), Sort(method, 100 + c + i));
        if (!db.SaveMerged(path).ok()) _exit(1);
      }
      _exit(0);
    }
    children[c] = pid;
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  ASSERT_TRUE(db.ok()) << db.status();
  int trials = 0;
  for (const tuning::Entry& e : db->proto().entries()) trials += e.trials_size();
  EXPECT_EQ(db->size(), static_cast<size_t>(kTrials));
  EXPECT_EQ(trials, 2 * kTrials);
  for (int i = 0; i < kTrials; ++i) {
    const tuning::Entry* e = db->FindEntry(Key(8, 1000 + i, 10));
    ASSERT_NE(e, nullptr) << i;
    EXPECT_EQ(ConfigText(e->best().config()), "method=partial_sort") << i;
    EXPECT_EQ(ConfigText(e->runner_up().config()), "method=nth_element") << i;
  }
  EXPECT_THAT(Listing(dir), ElementsAre("t.kdb", "t.kdb.lock"));
}

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

// ---- Machines and their similarity ---------------------------------------------

tuning::Machine FakeMachine(const std::string& vendor, std::vector<std::string> isa, uint32_t cores,
                            uint32_t family = 25, uint32_t model = 1) {
  tuning::Machine m;
  m.set_cpu_model(vendor == "GenuineIntel" ? "Intel(R) Xeon(R)" : "AMD EPYC");
  for (std::string& x : isa) m.add_isa(std::move(x));
  m.set_cores(cores);
  m.set_vendor(vendor);
  m.set_arch("x86_64");
  m.set_family(family);
  m.set_model(model);
  m.set_id(FingerprintId(m));
  return m;
}

TEST(Machines, FingerprintsTellGenerationsApartAndKeepOldIds) {
  tuning::Machine old;  // as recorded before vendors were
  old.set_cpu_model("AMD EPYC");
  old.add_isa("avx2");
  old.add_isa("fma");
  old.set_cores(2);
  EXPECT_EQ(FingerprintId(old), "45db467da4354901");  // the shipped amd-epyc-avx2-2c table's
  EXPECT_EQ(MachineVendor(old), "AuthenticAMD");
  EXPECT_EQ(MachineArch(old), "x86_64");
  EXPECT_EQ(MicroArch(old), "");
  EXPECT_EQ(MachineSummary(old), "AMD EPYC, avx2, 2 cores");
  EXPECT_EQ(MachineClass(old), "amd-epyc-avx2-2c");

  const tuning::Machine zen3 = FakeMachine("AuthenticAMD", {"avx2", "fma"}, 2, 25, 1);
  const tuning::Machine zen2 = FakeMachine("AuthenticAMD", {"avx2", "fma"}, 2, 23, 49);
  EXPECT_NE(zen3.id(), FingerprintId(old));
  EXPECT_NE(zen3.id(), zen2.id());
  EXPECT_EQ(MicroArch(zen3), "zen3");
  EXPECT_EQ(MicroArch(zen2), "zen2");
  EXPECT_EQ(MicroArch(FakeMachine("AuthenticAMD", {}, 2, 25, 0x11)), "zen4");
  EXPECT_EQ(MicroArch(FakeMachine("AuthenticAMD", {}, 2, 26, 2)), "zen5");
  EXPECT_EQ(MicroArch(FakeMachine("GenuineIntel", {}, 2, 6, 0x8f)), "sapphirerapids");
  EXPECT_EQ(MicroArch(FakeMachine("GenuineIntel", {}, 2, 6, 0x01)), "family 6 model 1");
  EXPECT_EQ(MachineSummary(zen3), "AMD EPYC, zen3, avx2, 2 cores");
  EXPECT_EQ(MachineClass(zen3), "amd-epyc-zen3-avx2-2c");
  EXPECT_EQ(MachineClass(FakeMachine("GenuineIntel", {"avx2", "avx512f", "amx_tile"}, 16, 6, 0x8f)),
            "intel-xeon-sapphirerapids-amx-16c");
  tuning::Machine core = FakeMachine("GenuineIntel", {"avx2"}, 4, 6, 0x55);
  core.set_cpu_model("Intel(R) Core(TM) i7-9750H CPU @ 2.60GHz");
  EXPECT_EQ(MachineClass(core), "intel-core-i7-9750h-skylake-x-avx2-4c");
  core.set_cpu_model("Intel(R) Xeon(R) Processor");
  EXPECT_EQ(MachineClass(core), "intel-xeon-skylake-x-avx2-4c");

  const tuning::Machine& here = ThisMachine();
  EXPECT_EQ(here.id(), FingerprintId(here));
  EXPECT_FALSE(here.vendor().empty());
  EXPECT_FALSE(here.arch().empty());
}

TEST(Machine, AGpuIsAMachineOfItsOwn) {
  const tuning::Machine h100 = GpuMachine("NVIDIA H100 80GB HBM3", 90, 132, 85520809984ull, "13.0");
  EXPECT_TRUE(IsGpuMachineId(h100.id()));
  EXPECT_FALSE(IsGpuMachineId(ThisMachine().id()));
  EXPECT_EQ(h100.id().size(), kGpuIdPrefix.size() + 16);
  EXPECT_EQ(h100.id(), FingerprintId(h100));
  EXPECT_EQ(MachineClass(h100), "nvidia-h100-80gb-hbm3-sm90");
  EXPECT_EQ(MachineSummary(h100), "NVIDIA H100 80GB HBM3, sm_90, 80 GiB, driver CUDA 13.0");
  // Name, SM version, memory and driver are its identity; the SM count is not.
  EXPECT_EQ(GpuMachine("NVIDIA H100 80GB HBM3", 90, 114, 85520809984ull, "13.0").id(), h100.id());
  EXPECT_NE(GpuMachine("NVIDIA H100 80GB HBM3", 90, 132, 85520809984ull, "12.8").id(), h100.id());
  EXPECT_NE(GpuMachine("NVIDIA H100 80GB HBM3", 90, 132, 94489280512ull, "13.0").id(), h100.id());
  EXPECT_NE(GpuMachine("NVIDIA H200", 90, 132, 85520809984ull, "13.0").id(), h100.id());
}

TEST_F(Query, CpuAndGpuEntriesSitSideBySideAndEachAnswersWithItsOwnKernels) {
  const tuning::Machine h100 = GpuMachine("NVIDIA H100 80GB HBM3", 90, 132, 85520809984ull, "13.0");
  const tuning::Machine h100_96 = GpuMachine("NVIDIA H100 96GB HBM3", 90, 132, 101468602368ull, "13.0");
  const tuning::Machine a100 = GpuMachine("NVIDIA A100-SXM4-80GB", 80, 108, 85520809984ull, "13.0");
  const Dims dims = {{"batch", 8}, {"n", 1000}, {"k", 64}};
  TuningDb db;
  db.AddMachine(ThisMachine());
  db.AddMachine(h100);
  db.AddMachine(a100);
  db.AddTrial(Key(8, 1000, 64, ThisMachine().id()), Sort("nth_element", 300));
  db.AddTrial(Key(8, 1000, 64, h100.id()), MakeTrial("gpu_tiled", Ints({{"tile", 16}}), 20));
  db.AddTrial(Key(8, 1000, 64, a100.id()), MakeTrial("gpu_tiled", Ints({{"tile", 64}}), 30));
  // A CUDA kernel in a CPU's entry, and a CPU kernel in a GPU's, cannot answer.
  db.AddTrial(Key(8, 4000, 64, ThisMachine().id()), MakeTrial("gpu_tiled", Ints({{"tile", 4}}), 10));
  db.AddTrial(Key(8, 4000, 64, h100.id()), Sort("nth_element", 10));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();

  absl::StatusOr<LutAnswer> cpu = lut->Query("topk", "f32", dims, ThisMachine().id());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->match, Match::kExact);
  EXPECT_EQ(cpu->kernel->name(), "topk/sort");
  absl::StatusOr<LutAnswer> gpu = lut->Query("topk", "f32", dims, h100.id());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->match, Match::kExact);
  EXPECT_EQ(gpu->kernel->name(), "topk/gpu_tiled");
  EXPECT_EQ(gpu->kernel->ConfigString(*gpu->config), "tile=16");
  ASSERT_NE(gpu->machine, nullptr);
  EXPECT_EQ(gpu->machine->gpu().name(), "NVIDIA H100 80GB HBM3");

  // The mixed-up entries: each machine answers from its own other entry.
  cpu = lut->Query("topk", "f32", {{"batch", 8}, {"n", 4000}, {"k", 64}}, ThisMachine().id());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->match, Match::kNearest);
  EXPECT_EQ(cpu->kernel->name(), "topk/sort");
  gpu = lut->Query("topk", "f32", {{"batch", 8}, {"n", 4000}, {"k", 64}}, h100.id());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->match, Match::kNearest);
  EXPECT_EQ(gpu->kernel->name(), "topk/gpu_tiled");
  EXPECT_THAT(absl::StrJoin(gpu->warnings, "\n"), HasSubstr("topk/sort does not run on a GPU"));

  // A GPU the table does not hold, of the H100's SM version: the H100's
  // answer (never the A100's, nor the CPU's).
  db.AddMachine(h100_96);
  lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  gpu = lut->Query("topk", "f32", dims, h100_96.id());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->match, Match::kSimilar);
  EXPECT_EQ(gpu->machine->id(), h100.id());
  EXPECT_EQ(gpu->kernel->ConfigString(*gpu->config), "tile=16");
  // Strict, or a GPU like none tuned: the op's first CUDA kernel that takes
  // the shape, saying why.
  absl::StatusOr<Lut> strict = Lut::Build(db, *registry_, {MachinePolicy::kStrict});
  ASSERT_TRUE(strict.ok());
  for (const std::string& id :
       {GpuMachine("NVIDIA B200", 100, 148, 191514444800ull, "13.0").id(), h100_96.id()}) {
    const Lut& l = id == h100_96.id() ? *strict : *lut;
    gpu = l.Query("topk", "f32", dims, id);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ(gpu->match, Match::kDefault);
    EXPECT_EQ(gpu->kernel->device(), KREG_DEVICE_CUDA);
    EXPECT_THAT(gpu->why, HasSubstr("this GPU"));
    EXPECT_THAT(gpu->why, HasSubstr("CUDA kernel"));
  }
  // Measured defaults are the CPU's: a CPU query of an untuned machine
  // never gets a CUDA kernel, though the GPUs measured this shape fastest.
  absl::StatusOr<LutAnswer> other_cpu = lut->Query("topk", "f32", dims, "0123456789abcdef");
  ASSERT_TRUE(other_cpu.ok()) << other_cpu.status();
  EXPECT_EQ(other_cpu->kernel->device(), 0);
}

TEST_F(Query, TheMostSimilarTunedMachineAnswersWhenThisOneHasNoEntry) {
  const tuning::Machine asked = FakeMachine("AuthenticAMD", {"avx2", "fma"}, 2);
  const tuning::Machine more_cores = FakeMachine("AuthenticAMD", {"avx2", "fma"}, 4);
  const tuning::Machine many_cores = FakeMachine("AuthenticAMD", {"avx2", "fma"}, 64);
  const tuning::Machine other_isa = FakeMachine("AuthenticAMD", {"avx2", "fma", "avx512f"}, 2);
  const tuning::Machine other_generation = FakeMachine("AuthenticAMD", {"avx2", "fma"}, 4, 23, 49);
  const tuning::Machine intel = FakeMachine("GenuineIntel", {"avx2", "fma"}, 2);
  tuning::Machine old;  // no vendor recorded: the model name says AMD
  old.set_cpu_model("AMD EPYC 7B12");
  old.add_isa("avx2");
  old.set_cores(2);
  old.set_id(FingerprintId(old));
  // Each machine answers with another radix configuration, which tells who.
  const std::vector<const tuning::Machine*> tuned = {&more_cores, &other_generation, &many_cores,
                                                     &other_isa,  &old,              &intel};
  auto config_of = [](size_t i) {
    const int64_t first_bits[] = {8, 11, 12};
    return Ints({{"first_bits", first_bits[i % 3]}, {"round_bits", i < 3 ? 8 : 4}, {"capacity", 4096}});
  };
  auto make_db = [&](size_t from) {
    TuningDb db;
    db.AddMachine(asked);
    for (size_t i = from; i < tuned.size(); ++i) {
      db.AddMachine(*tuned[i]);
      db.AddTrial(Key(8, 1000, 10, tuned[i]->id()), MakeTrial("radix", config_of(i), 100));
    }
    return db;
  };
  const Dims dims = {{"batch", 8}, {"n", 1000}, {"k", 10}};
  // The same ISA set first, nearer core counts first, the same generation
  // first among equal counts; then one ISA extension apart (the same
  // generation before a record without one); never another vendor.
  for (size_t from = 0; from < 5; ++from) {
    absl::StatusOr<Lut> lut = Lut::Build(make_db(from), *registry_);
    ASSERT_TRUE(lut.ok()) << lut.status();
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", dims, asked.id());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->match, Match::kSimilar);
    EXPECT_EQ(a->distance, 0);
    ASSERT_NE(a->machine, nullptr);
    EXPECT_EQ(ConfigText(ToProtoConfig(*a->kernel, *a->config)), ConfigText(config_of(from)));
    EXPECT_EQ(a->machine->id(), tuned[from]->id());
    EXPECT_TRUE(a->why.empty());
    // Another shape: the similar machine's nearest.
    a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 3000}, {"k", 10}}, asked.id());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->match, Match::kSimilar);
    EXPECT_GT(a->distance, 0);
  }
  TuningDb db = make_db(0);
  // Without its own record, the machine has nothing to be similar to ...
  EXPECT_EQ(Lut::Build(db, *registry_)->Query("topk", "f32", dims, "0123456789abcdef")->match, Match::kDefault);
  // ... and its own entry comes before any other machine's.
  db.AddTrial(Key(8, 1000, 10, asked.id()), Radix(8, 500));
  absl::StatusOr<Lut> own = Lut::Build(db, *registry_);
  ASSERT_TRUE(own.ok());
  absl::StatusOr<LutAnswer> a = own->Query("topk", "f32", dims, asked.id());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kExact);
  EXPECT_EQ(a->machine->id(), asked.id());

  // Strict: only the asked machine's measurements; the rest is a default.
  LutOptions strict;
  strict.machines = MachinePolicy::kStrict;
  absl::StatusOr<Lut> lut = Lut::Build(make_db(0), *registry_, strict);
  ASSERT_TRUE(lut.ok());
  a = lut->Query("topk", "f32", dims, asked.id());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kDefault);
  EXPECT_EQ(a->machine, nullptr);
  EXPECT_THAT(a->why, HasSubstr("no table for this machine (AMD EPYC, zen3, avx2, 2 cores)"));
  EXPECT_THAT(a->why, HasSubstr("strict"));

  // Only another vendor tuned: a default, saying so.
  lut = Lut::Build(make_db(5), *registry_);
  a = lut->Query("topk", "f32", dims, asked.id());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kDefault);
  EXPECT_THAT(a->why, HasSubstr("none for a machine like it (same vendor and architecture)"));
}

TEST_F(Query, TheMeasuredDefaultIsTheBestAcrossMachinesOfTheNearestShape) {
  const tuning::Machine asked = FakeMachine("AuthenticAMD", {"avx2", "fma"}, 2);
  // Of a vendor no test host is, so that neither is similar to the machine
  // the test runs on (whose similar machines are preferred).
  const tuning::Machine x = FakeMachine("CentaurHauls", {"avx2", "fma"}, 8, 6, 0x55);
  const tuning::Machine y = FakeMachine("CentaurHauls", {"avx2", "fma"}, 16, 6, 0x8f);
  TuningDb db;
  db.AddMachine(asked);
  db.AddMachine(x);
  db.AddMachine(y);
  // Slowdowns against each machine's best: sort 1 and 2 (geomean 1.41),
  // radix 1.5 and 1 (1.22), heap 3 and 4 (3.46): radix.
  db.AddTrial(Key(8, 1000, 10, x.id()), Sort("nth_element", 100));
  db.AddTrial(Key(8, 1000, 10, x.id()), Radix(8, 150));
  db.AddTrial(Key(8, 1000, 10, x.id()), MakeTrial("heap", {}, 300));
  db.AddTrial(Key(8, 1000, 10, y.id()), Sort("nth_element", 200));
  db.AddTrial(Key(8, 1000, 10, y.id()), Radix(12, 100));
  db.AddTrial(Key(8, 1000, 10, y.id()), MakeTrial("heap", {}, 400));
  // Another shape, tuned on one machine only.
  db.AddTrial(Key(8, 1000000, 10, y.id()), MakeTrial("heap", {}, 100));
  db.AddTrial(Key(8, 1000000, 10, y.id()), Radix(12, 300));
  absl::StatusOr<Lut> lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok()) << lut.status();
  for (int64_t n : {1000, 2000}) {
    absl::StatusOr<LutAnswer> a = lut->Query("topk", "f32", {{"batch", 8}, {"n", n}, {"k", 10}}, asked.id());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->match, Match::kDefault);
    EXPECT_EQ(a->kernel->name(), "topk/radix");
    // The configuration of the machine tried first (neither is similar: by id).
    EXPECT_EQ(a->kernel->ConfigString(*a->config),
              absl::StrCat("first_bits=", x.id() < y.id() ? 8 : 12, " round_bits=8 capacity=4096"));
    EXPECT_EQ(DimsString(*a->tuned_dims), "batch=8,n=1000,k=10");
    EXPECT_EQ(a->trial, nullptr);
    EXPECT_THAT(a->why, HasSubstr("no table for this machine"));
    EXPECT_THAT(a->why, HasSubstr("measured default: topk/radix, 1.22x the best (geometric mean) on 2 of the 2 "
                                  "machines that tuned batch=8,n=1000,k=10"));
  }
  absl::StatusOr<LutAnswer> a =
      lut->Query("topk", "f32", {{"batch", 8}, {"n", 500000}, {"k", 10}}, asked.id());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kernel->name(), "topk/heap");
  EXPECT_THAT(a->why, HasSubstr("1.00x the best (geometric mean) on 1 of the 1 machines"));
  // Nothing measured of this dtype anywhere: the op's own default, saying so.
  a = lut->Query("topk", "bf16", {{"batch", 8}, {"n", 1000}, {"k", 10}}, asked.id());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->match, Match::kDefault);
  EXPECT_EQ(a->kernel->name(), "topk/radix");
  EXPECT_EQ(*a->config, a->kernel->DefaultConfig());
  EXPECT_THAT(a->why, HasSubstr("no table for this machine"));
  EXPECT_THAT(a->why, HasSubstr("no measurement on any machine answers it: the op's default"));
  // A machine with entries, but none of this op and dtype: said so.
  db.AddTrial(MakeProblemKey("topk", "bf16", {{"batch", 1}, {"n", 10}, {"k", 1}}, asked.id()),
              MakeTrial("heap", {}, 1));
  lut = Lut::Build(db, *registry_);
  ASSERT_TRUE(lut.ok());
  a = lut->Query("topk", "f32", {{"batch", 8}, {"n", 1000}, {"k", 10}}, asked.id());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->why, HasSubstr("no entry for topk f32 on this machine (AMD EPYC, zen3, avx2, 2 cores)"));
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

}  // namespace
}  // namespace kreg
