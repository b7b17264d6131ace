// Machines' fingerprints, problem keys and stored configurations.
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

}  // namespace
}  // namespace lut_test
}  // namespace kreg
