// The loader refuses every broken plugin with a reason naming the file, never
// half-registers, keeps plugins loaded while their kernels live, and serves
// lookups from many threads.
#include <atomic>
#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/ops.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;

std::string TestPlugin(const std::string& name) {
  return std::string(KREG_TEST_PLUGIN_DIR) + "/test_" + name + ".so";
}

struct BrokenCase {
  const char* plugin;
  const char* reason;
};

void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.plugin; }

class RefusedPluginTest : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(RefusedPluginTest, IsRefusedWithItsReasonAndRegistersNothing) {
  Registry registry;
  const std::string path = TestPlugin(GetParam().plugin);
  absl::Status status = registry.LoadPlugin(path);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_THAT(std::string(status.message()), HasSubstr(GetParam().reason));
  EXPECT_TRUE(registry.Kernels().empty());
  EXPECT_TRUE(registry.Plugins().empty());
}

INSTANTIATE_TEST_SUITE_P(
    Flaws, RefusedPluginTest,
    ::testing::Values(BrokenCase{"no_symbol", "no symbol kreg_plugin_v1"},
                      BrokenCase{"wrong_abi", "ABI version 99; this kreg speaks version 1"},
                      BrokenCase{"newer_abi", "exports kreg_plugin_v2, a newer ABI"},
                      BrokenCase{"null_run", "topk/fake: run is NULL"},
                      BrokenCase{"bad_default", "default 12 is not among its legal values"},
                      BrokenCase{"unknown_op", "op 'frobnicate' is not known"},
                      BrokenCase{"bad_name", "variant 'Bad-Name' is not [a-z0-9_]+"},
                      BrokenCase{"small_struct", "struct_size 8 is smaller"},
                      BrokenCase{"dup_param", "parameter 'tile' is declared twice"},
                      BrokenCase{"second_kernel_bad", "kernel 1: topk/fake_two: run is NULL"},
                      BrokenCase{"null_table", "returned NULL"}),
    [](const ::testing::TestParamInfo<BrokenCase>& p) { return std::string(p.param.plugin); });

TEST(LoaderTest, RefusesAFileThatIsNotASharedObject) {
  const std::string path = ::testing::TempDir() + "/junk.so";
  std::ofstream(path) << "this is not an ELF file\n";
  Registry registry;
  absl::Status status = registry.LoadPlugin(path);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot be loaded"));
}

TEST(LoaderTest, RefusesADuplicateNamingBothFiles) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugin(TestPlugin("none")).ok());
  absl::Status status = registry.LoadPlugin(TestPlugin("duplicate"));
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(TestPlugin("duplicate")));
  EXPECT_THAT(std::string(status.message()), HasSubstr("duplicate kernel topk/fake"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("already registered by " + TestPlugin("none")));
  EXPECT_EQ(registry.Kernels().size(), 2u);  // only test_none's two
  EXPECT_EQ(registry.Plugins().size(), 1u);
}

TEST(LoaderTest, AFolderOfBrokenPluginsLoadsTheGoodOnesAndRecordsTheRest) {
  LoadOptions options;
  options.plugin_paths = {KREG_TEST_PLUGIN_DIR};
  options.use_env = false;
  options.use_default_dirs = false;
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
  ASSERT_TRUE(registry.ok()) << registry.status();
  // test_duplicate sorts first and wins topk/fake; the rest are refused.
  EXPECT_EQ((*registry)->Plugins().size(), 1u);
  EXPECT_EQ((*registry)->refusals().size(), 13u);
}

TEST(LoaderTest, MissingExplicitPathIsAnError) {
  LoadOptions options;
  options.plugin_paths = {"/nonexistent/kreg/plugins"};
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
  ASSERT_FALSE(registry.ok());
  EXPECT_THAT(std::string(registry.status().message()), HasSubstr("/nonexistent/kreg/plugins"));
}

TEST(LoaderTest, EarlierLocationShadowsSameFileName) {
  LoadOptions options;
  options.plugin_paths = {KREG_PLUGIN_DIR, KREG_PLUGIN_DIR};
  options.use_env = false;
  options.use_default_dirs = false;
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
  ASSERT_TRUE(registry.ok());
  EXPECT_TRUE((*registry)->refusals().empty());
  EXPECT_TRUE((*registry)->Get("topk/sort").ok());
}

TEST(LoaderTest, KernelCarriesParametersChecksAndMessages) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugin(TestPlugin("none")).ok());
  std::shared_ptr<const Kernel> kernel = *registry.Get("topk/fake");
  EXPECT_EQ(kernel->plugin_name(), "fake");
  ASSERT_EQ(kernel->num_params(), 2u);
  EXPECT_EQ(kernel->ConfigString(kernel->DefaultConfig()), "tile=16 rounds=8");
  absl::StatusOr<Config> config = kernel->ParseConfig({{"tile", "8"}});
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->values()[0].value, 8);
  EXPECT_THAT(std::string(kernel->ParseConfig({{"tile", "9"}}).status().message()),
              HasSubstr("9 is not one of 8, 16, 32"));
  EXPECT_THAT(std::string(kernel->ParseConfig({{"tiles", "8"}}).status().message()),
              HasSubstr("has no parameter 'tiles'"));
  EXPECT_THAT(std::string(registry.Get("topk/nope").status().message()),
              HasSubstr("known topk kernels: topk/fake, topk/fake_two"));
}

TEST(LoaderTest, KernelOutlivesItsRegistry) {
  std::shared_ptr<const Kernel> kernel;
  {
    Registry registry;
    ASSERT_TRUE(registry.LoadPlugin(TestPlugin("none")).ok());
    kernel = *registry.Get("topk/fake");
  }
  // The plugin is still mapped: the descriptor and its run function work.
  std::unique_ptr<Problem> problem = *FindOp("topk")->make_problem({{"batch", 1}, {"n", 4}, {"k", 2}}, {});
  absl::Status status = kernel->Run(*kernel->ParseConfig({{"tile", "8"}}), problem->args());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(status.message()), HasSubstr("fake kernel ran with tile=8"));
  // The kernel's own legality check reaches the caller with its reason.
  status = kernel->Run(*kernel->ParseConfig({{"tile", "32"}}), problem->args());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tile=32 is too big"));
}

TEST(LoaderTest, KernelNeedingAnUnknownIsaIsListedButNotRun) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugin(TestPlugin("foreign_isa")).ok());
  std::shared_ptr<const Kernel> kernel = *registry.Get("topk/fake");
  EXPECT_FALSE(kernel->available());
  std::unique_ptr<Problem> problem = *FindOp("topk")->make_problem({{"batch", 1}, {"n", 4}, {"k", 2}}, {});
  absl::Status status = kernel->Run(kernel->DefaultConfig(), problem->args());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("which this CPU lacks"));
}

TEST(LoaderTest, InvalidArgumentsNeverReachThePlugin) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugin(TestPlugin("none")).ok());
  std::shared_ptr<const Kernel> kernel = *registry.Get("topk/fake");
  std::unique_ptr<Problem> problem = *FindOp("topk")->make_problem({{"batch", 2}, {"n", 4}, {"k", 2}}, {});
  kreg_topk_args args = *static_cast<const kreg_topk_args*>(problem->args());
  args.k = 5;
  absl::Status status = kernel->Run(kernel->DefaultConfig(), &args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("k=5 exceeds the row length n=4"));
}

TEST(LoaderTest, ConcurrentLookupsWhileLoading) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugin(std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so").ok());
  const size_t before = registry.Kernels("topk").size();
  std::atomic<int> found{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) found += registry.Get("topk/sort").ok();
    });
  }
  EXPECT_TRUE(registry.LoadPlugin(TestPlugin("none")).ok());
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(found.load(), 8000);
  EXPECT_EQ(registry.Kernels("topk").size(), before + 2);  // topk/fake and topk/fake_two
}

TEST(IsaTest, NamesBits) {
  EXPECT_EQ(IsaString(0), "none");
  EXPECT_EQ(IsaString(KREG_ISA_AVX2 | KREG_ISA_AVX512BF16), "avx2,avx512bf16");
}

}  // namespace
}  // namespace kreg
