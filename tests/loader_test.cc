// The loader refuses every broken plugin with a reason naming the file, never
// half-registers, keeps plugins loaded while their kernels live, serves
// lookups from many threads, lists the ops plugins declare, and reads
// structs of older (smaller) and newer (larger) layouts by their struct_size.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/log.h"
#include "kreg/op.h"
#include "kreg/params.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "kreg/tensor.h"

namespace kreg {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string TestPlugin(const std::string& name) {
  return std::string(KREG_TEST_PLUGIN_DIR) + "/test_" + name + ".so";
}
std::string AxpyPlugin(const std::string& name) {
  return std::string(KREG_AXPY_PLUGIN_DIR) + "/test_" + name + ".so";
}
std::string TopKPlugin() { return std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so"; }
// Every plugin the build made (optional ones, such as oneDNN's, included), in
// load order.
std::vector<std::string> BuildPlugins() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(KREG_PLUGIN_DIR)) {
    if (e.path().extension() == ".so") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> Names(const std::vector<std::shared_ptr<const Kernel>>& kernels) {
  std::vector<std::string> names;
  for (const auto& k : kernels) names.push_back(k->name());
  return names;
}

// The topk plugin's own kernels.
const std::vector<std::string> kTopKKernels = {"topk/blockmax", "topk/blockwise", "topk/heap", "topk/radix",
                                               "topk/reference", "topk/sort"};

// ---- Refusals -------------------------------------------------------------------

struct BrokenCase {
  const char* plugin;
  std::vector<const char*> reasons;  // substrings of the refusal
};

void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.plugin; }

class RefusedPluginTest : public ::testing::TestWithParam<BrokenCase> {};

// Loaded with the topk plugin (which declares op "topk", the fakes' op), the
// broken file first: it is refused with its reason, the status names the
// file, and nothing of it is registered; the topk plugin loads unharmed.
TEST_P(RefusedPluginTest, IsRefusedWithItsReasonAndRegistersNothing) {
  Registry registry;
  const std::string path = TestPlugin(GetParam().plugin);
  std::vector<absl::Status> refused = registry.LoadPlugins({path, TopKPlugin()});
  ASSERT_EQ(refused.size(), 1u);
  absl::Status status = refused[0];
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("plugin " + path + " refused: "));
  for (const char* reason : GetParam().reasons) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(reason));
  }
  EXPECT_EQ(registry.refusals().size(), 1u);
  EXPECT_EQ(Names(registry.Kernels()), kTopKKernels);
  ASSERT_EQ(registry.Plugins().size(), 1u);
  EXPECT_EQ(registry.Plugins()[0].path, TopKPlugin());
  EXPECT_EQ(registry.Files(), std::vector<std::string>{TopKPlugin()});
  ASSERT_EQ(registry.Ops().size(), 1u);
  EXPECT_EQ(registry.Ops()[0]->name(), "topk");

  // Alone, it is refused just the same (with its own reason or, for a
  // kernel of op topk, because no plugin loaded declares topk).
  Registry alone;
  status = alone.LoadPlugin(path);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_TRUE(alone.Kernels().empty());
  EXPECT_TRUE(alone.Plugins().empty());
  EXPECT_TRUE(alone.Ops().empty());
}

INSTANTIATE_TEST_SUITE_P(
    Flaws, RefusedPluginTest,
    ::testing::Values(
        BrokenCase{"no_symbol", {"no symbol kreg_plugin_v2", "not a kreg plugin"}},
        BrokenCase{"wrong_abi", {"ABI version 99; this kreg speaks version 2"}},
        BrokenCase{"newer_abi", {"exports kreg_plugin_v3, ABI v3; this kreg speaks v2", "upgrade kreg"}},
        BrokenCase{"old_abi", {"exports kreg_plugin_v1, ABI v1; this kreg speaks v2",
                               "rebuild the plugin against this kreg"}},
        BrokenCase{"null_run", {"kernel 0: topk/fake: run is NULL"}},
        BrokenCase{"bad_default", {"topk/fake: parameter 0: 'tile': default 12 is not among its legal values"}},
        BrokenCase{"unknown_op", {"frobnicate/fake: op 'frobnicate' is declared by no plugin loaded",
                                  "known ops: topk"}},
        BrokenCase{"bad_name", {"kernel 0: variant 'Bad-Name' is not [a-z0-9_]+"}},
        BrokenCase{"small_struct", {"kernel 0: struct_size 8 is smaller than the minimum"}},
        BrokenCase{"dup_param", {"topk/fake: parameter 'tile' is declared twice"}},
        BrokenCase{"second_kernel_bad", {"kernel 1: topk/fake_two: run is NULL"}},
        BrokenCase{"null_table", {"kreg_plugin_v2() returned NULL"}},
        BrokenCase{"bad_op", {"op fake_op", "tensor 'x'", "'q'", "not a dim of the op"}},
        BrokenCase{"init_fails", {"init failed", "no license"}},
        BrokenCase{"null_kernel_ptr", {"kernel 1 is NULL"}}),
    [](const ::testing::TestParamInfo<BrokenCase>& p) { return std::string(p.param.plugin); });

TEST(LoaderTest, AKernelOfAnOpNoPluginDeclaresIsRefused) {
  Registry registry;
  absl::Status status = registry.LoadPlugin(TestPlugin("none"));
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(TestPlugin("none")));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("topk/fake: op 'topk' is declared by no plugin loaded (known ops: none)"));
  EXPECT_TRUE(registry.Kernels().empty());
  // Once the topk plugin is loaded, the same file loads.
  ASSERT_TRUE(registry.LoadPlugin(TopKPlugin()).ok());
  EXPECT_TRUE(registry.LoadPlugin(TestPlugin("none")).ok());
  EXPECT_TRUE(registry.Get("topk/fake").ok());
}

TEST(LoaderTest, LoadPluginsLoadsOpsFirstWhateverTheOrder) {
  Registry registry;
  std::vector<absl::Status> refused = registry.LoadPlugins({TestPlugin("none"), TopKPlugin()});
  ASSERT_TRUE(refused.empty()) << refused[0];
  EXPECT_TRUE(registry.Get("topk/fake").ok());
  EXPECT_TRUE(registry.Get("topk/fake_two").ok());
  EXPECT_EQ(registry.Kernels("topk").size(), kTopKKernels.size() + 2);
  EXPECT_EQ(registry.Files(), (std::vector<std::string>{TestPlugin("none"), TopKPlugin()}));
}

TEST(LoaderTest, RefusesAFileThatIsNotASharedObject) {
  const std::string path = ::testing::TempDir() + "/junk.so";
  std::ofstream(path) << "this is not an ELF file\n";
  Registry registry;
  absl::Status status = registry.LoadPlugin(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot be loaded"));
}

// A kernel name registered already is skipped, naming both files; a plugin
// left with nothing to register is not kept.
TEST(LoaderTest, SkipsADuplicateKernelNamingBothFiles) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), TestPlugin("none")}).empty());
  absl::Status status = registry.LoadPlugin(TestPlugin("duplicate"));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr(TestPlugin("duplicate")));
  EXPECT_THAT(std::string(status.message()), HasSubstr("kernel topk/fake skipped"));
  EXPECT_THAT(std::string(status.message()), HasSubstr(TestPlugin("none") + ", earlier on the plugin path"));
  EXPECT_EQ(registry.Kernels().size(), kTopKKernels.size() + 2);  // the topk plugin's and test_none's two
  EXPECT_EQ(registry.Plugins().size(), 2u);
  // The kernel registered is still test_none's.
  EXPECT_EQ((*registry.Get("topk/fake"))->plugin_path(), TestPlugin("none"));
}

TEST(LoaderTest, AFolderOfBrokenPluginsLoadsTheGoodOnesAndRecordsTheRest) {
  LoadOptions options;
  options.plugin_paths = {KREG_PLUGIN_DIR, KREG_TEST_PLUGIN_DIR};
  options.use_env = false;
  options.use_default_dirs = false;
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
  ASSERT_TRUE(registry.ok()) << registry.status();
  // The build's plugins load; test_duplicate sorts before test_foreign_isa and
  // test_none and wins topk/fake; every other file (15 flaw builds) is
  // refused, and NONE's and FOREIGN_ISA's kernels (5) are skipped as
  // registered already, which leaves those two plugins nothing.
  std::vector<std::string> loaded;
  for (const PluginInfo& p : (*registry)->Plugins()) loaded.push_back(p.path);
  std::vector<std::string> want = BuildPlugins();
  want.push_back(TestPlugin("duplicate"));
  EXPECT_THAT(loaded, ::testing::UnorderedElementsAreArray(want));
  EXPECT_EQ((*registry)->refusals().size(), 20u);
  for (const absl::Status& s : (*registry)->refusals()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::string(KREG_TEST_PLUGIN_DIR) + "/test_"));
  }
  EXPECT_EQ((*registry)->searched(), (std::vector<std::string>{KREG_PLUGIN_DIR, KREG_TEST_PLUGIN_DIR}));
}

TEST(LoaderTest, MissingExplicitPathIsAnError) {
  LoadOptions options;
  options.plugin_paths = {"/nonexistent/kreg/plugins"};
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
  ASSERT_FALSE(registry.ok());
  EXPECT_EQ(registry.status().code(), absl::StatusCode::kNotFound);
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
  EXPECT_EQ((*registry)->Files(), BuildPlugins());
}

// With no locations given, the plugins are found beside kreg's library
// (InstallPrefix()/lib/kreg/plugins: the build tree's, here), whatever the
// program's own folder.
TEST(LoaderTest, DefaultLocationIsBesideTheLibrary) {
  ASSERT_FALSE(InstallPrefix().empty());
  const std::string beside = InstallPrefix() + "/lib/kreg/plugins";
  EXPECT_EQ(Registry::DefaultDirs().front(), beside);
  EXPECT_TRUE(std::filesystem::equivalent(beside, KREG_PLUGIN_DIR));
}

TEST(LogTest, LevelsFilterAndTheSinkTakesWhatPasses) {
  const LogLevel before = GetLogLevel();
  std::vector<std::pair<LogLevel, std::string>> got;
  SetLogSink([&got](LogLevel level, absl::string_view message) { got.emplace_back(level, std::string(message)); });
  SetLogLevel(LogLevel::kInfo);
  Log(LogLevel::kDebug, "hidden");
  Log(LogLevel::kInfo, "shown");
  Log(LogLevel::kError, "always");
  SetLogLevel(LogLevel::kError);
  Log(LogLevel::kWarn, "hidden too");
  SetLogSink(nullptr);
  SetLogLevel(before);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], std::make_pair(LogLevel::kInfo, std::string("shown")));
  EXPECT_EQ(got[1], std::make_pair(LogLevel::kError, std::string("always")));

  EXPECT_EQ(*ParseLogLevel("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarn);
  EXPECT_THAT(std::string(ParseLogLevel("loud").status().message()),
              HasSubstr("'loud' is not one of error, warn, info, debug"));
}

// ---- Kernels --------------------------------------------------------------------

TEST(LoaderTest, KernelCarriesParametersChecksAndMessages) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), TestPlugin("none")}).empty());
  std::shared_ptr<const Kernel> kernel = *registry.Get("topk/fake");
  EXPECT_EQ(kernel->plugin_name(), "fake");
  EXPECT_EQ(kernel->plugin_path(), TestPlugin("none"));
  EXPECT_EQ(kernel->op(), "topk");
  EXPECT_EQ(kernel->variant(), "fake");
  EXPECT_EQ(kernel->version(), 1u);
  EXPECT_FALSE(kernel->is_reference());
  EXPECT_TRUE(kernel->available());
  ASSERT_EQ(kernel->params().size(), 2u);
  const ParamInfo& tile = kernel->params()[0];
  EXPECT_EQ(tile.name, "tile");
  EXPECT_EQ(tile.kind, KREG_PARAM_INT);
  EXPECT_THAT(tile.Values(), ElementsAre(8, 16, 32));
  EXPECT_EQ(kernel->params().Find("rounds"), 1);
  EXPECT_EQ(kernel->ConfigString(kernel->DefaultConfig()), "tile=16 rounds=8");
  absl::StatusOr<Config> config = kernel->ParseConfig({{"tile", "8"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->values()[0].value, 8);
  EXPECT_EQ(config->values()[1].value, 8);  // rounds keeps its default
  EXPECT_THAT(std::string(kernel->ParseConfig({{"tile", "9"}}).status().message()),
              HasSubstr("9 is not one of 8, 16, 32"));
  EXPECT_THAT(std::string(kernel->ParseConfig({{"tiles", "8"}}).status().message()),
              HasSubstr("has no parameter 'tiles'"));
  EXPECT_THAT(std::string(registry.Get("topk/nope").status().message()),
              HasSubstr("known topk kernels: topk/blockmax, topk/blockwise, topk/fake, topk/fake_two, topk/heap"));
  EXPECT_EQ(registry.Get("topk/nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(registry.Get("nope/x").status().message()),
              HasSubstr("no plugin loaded provides op 'nope'"));
}

TEST(LoaderTest, KernelOutlivesItsRegistry) {
  std::shared_ptr<const Kernel> kernel;
  {
    Registry registry;
    ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), TestPlugin("none")}).empty());
    kernel = *registry.Get("topk/fake");
  }
  // The fake plugin is still mapped (the kernel holds it), and so is the
  // topk plugin (its op): the descriptors and the run function work.
  EXPECT_EQ(kernel->op_info().name(), "topk");
  absl::StatusOr<Values> values = kernel->op_info().ParseValues(Dims{{"batch", 1}, {"n", 4}, {"k", 2}});
  ASSERT_TRUE(values.ok()) << values.status();
  absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(kernel->op_ptr(), nullptr, *values, {});
  ASSERT_TRUE(problem.ok()) << problem.status();
  absl::Status status = kernel->Run(*kernel->ParseConfig({{"tile", "8"}}), *(*problem)->args());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(status.message()), HasSubstr("fake kernel ran with tile=8"));
  // The kernel's own legality check reaches the caller with its reason.
  status = kernel->Run(*kernel->ParseConfig({{"tile", "32"}}), *(*problem)->args());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tile=32 is too big"));
}

TEST(LoaderTest, KernelNeedingAnUnknownIsaIsListedButNotRun) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), TestPlugin("foreign_isa")}).empty());
  std::shared_ptr<const Kernel> kernel = *registry.Get("topk/fake");
  EXPECT_FALSE(kernel->available());
  EXPECT_TRUE((*registry.Get("topk/fake_two"))->available());
  absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(
      kernel->op_ptr(), registry.Reference("topk"), *kernel->op_info().ParseValues(Dims{{"batch", 1}, {"n", 4}, {"k", 2}}),
      {});
  ASSERT_TRUE(problem.ok()) << problem.status();
  absl::Status status = kernel->Run(kernel->DefaultConfig(), *(*problem)->args());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("which this CPU lacks"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("unknown(0x40000000)"));
}

// A thread still in a plugin's code when the last of its kernels goes (as a
// oneTBB worker runs a task's last lines after waking the run that waited
// for it) keeps that code: the plugin is never unmapped. Unmapping it took
// this process down.
TEST(LoaderTest, APluginsCodeOutlivesItsLastKernelForThreadsStillInIt) {
  {
    Registry registry;
    const std::string lingers = std::string(KREG_TEST_PLUGIN_DIR) + "/run_lingers/test_run_lingers.so";
    ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), lingers}).empty());
    std::shared_ptr<const Kernel> kernel = *registry.Get("topk/fake");
    absl::StatusOr<std::unique_ptr<Problem>> problem =
        Problem::Make(kernel->op_ptr(), nullptr, *kernel->op_info().ParseValues(Dims{{"batch", 1}, {"n", 4}, {"k", 2}}),
                      {});
    ASSERT_TRUE(problem.ok()) << problem.status();
    EXPECT_EQ(kernel->Run(kernel->DefaultConfig(), *(*problem)->args()).code(), absl::StatusCode::kUnimplemented);
  }  // the last kernel of the plugin goes: fini, dlclose
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the run's thread ends in the plugin's code
}

// dlopen() of a path loaded before answers the copy mapped then; a file
// replaced since is not reloaded in this process, and the load says so.
TEST(LoaderTest, APluginFileReplacedAfterItsLoadKeepsTheOldCopyAndSaysSo) {
  const std::string dir = ::testing::TempDir() + "/kreg_loader_replaced_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/test_fake.so";
  std::filesystem::copy_file(TestPlugin("none"), path);
  std::vector<std::string> warnings;
  SetLogSink([&](LogLevel level, absl::string_view message) {
    if (level == LogLevel::kWarn) warnings.emplace_back(message);
  });
  {
    Registry registry;
    ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), path}).empty());
    EXPECT_TRUE((*registry.Get("topk/fake"))->available());
  }
  EXPECT_THAT(warnings, ElementsAre());
  // Replaced as a build does (a new file renamed over the old one, never
  // rewritten in place), by the build whose topk/fake needs an unknown ISA.
  std::filesystem::copy_file(TestPlugin("foreign_isa"), path + ".new");
  std::filesystem::rename(path + ".new", path);
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), path}).empty());
  SetLogSink(nullptr);
  EXPECT_TRUE((*registry.Get("topk/fake"))->available());  // the copy loaded first
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "plugin " + path + " has changed on disk since this process loaded it; the copy loaded "
                         "then stays in use (a plugin's code is never unloaded): restart the process to load the "
                         "new one");
  std::filesystem::remove_all(dir);
}

// The thread bound is the library's, not only the front ends'.
TEST(LoaderTest, AThreadCountPastTheBoundIsRefusedBeforeTheRun) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({TopKPlugin()}).empty());
  std::shared_ptr<const Kernel> kernel = *registry.Get("topk/sort");
  absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(
      kernel->op_ptr(), registry.Reference("topk"), *kernel->op_info().ParseValues(Dims{{"batch", 2}, {"n", 9}, {"k", 3}}),
      {});
  ASSERT_TRUE(problem.ok()) << problem.status();
  for (int threads : {-1, 1025, 1 << 30}) {
    RunOptions options;
    options.num_threads = threads;
    const absl::Status status = kernel->Run(kernel->DefaultConfig(), *(*problem)->args(), options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << threads;
    EXPECT_THAT(std::string(status.message()), HasSubstr("threads: expected 0 (all cores) to 1024")) << threads;
  }
  RunOptions two;
  two.num_threads = 2;
  EXPECT_TRUE(kernel->Run(kernel->DefaultConfig(), *(*problem)->args(), two).ok());
}

TEST(LoaderTest, InvalidArgumentsNeverReachThePlugin) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), TestPlugin("none")}).empty());
  std::shared_ptr<const Kernel> kernel = *registry.Get("topk/fake");
  // topk's order: tensors input, row_starts, row_ends, values, indices,
  // stats; dims batch, n, k; attribute largest. The fake would answer
  // UNIMPLEMENTED if it were reached.
  Tensor input(DType::kF32, {2, 4}), values(DType::kF32, {2, 5}), indices(DType::kI32, {2, 5});
  DLTensor* tensors[] = {input.dl(), nullptr, nullptr, values.dl(), indices.dl(), nullptr};
  int64_t dims[] = {2, 4, 5};
  kreg_scalar attrs[1];
  attrs[0].i = 1;
  kreg_args args{};
  args.struct_size = sizeof args;
  args.tensors = tensors;
  args.num_tensors = 6;
  args.dims = dims;
  args.num_dims = 3;
  args.attrs = attrs;
  args.num_attrs = 1;
  // The op's own validator: k > n.
  absl::Status status = kernel->Run(kernel->DefaultConfig(), args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("k=5 exceeds the row length n=4"));
  // The host's checks from the descriptor: a shape, a range, a count.
  dims[2] = 2;
  status = kernel->Run(kernel->DefaultConfig(), args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("values has shape [2, 5], expected [2, 2]"));
  dims[2] = 5;
  dims[1] = 5;
  attrs[0].i = 2;
  status = kernel->Run(kernel->DefaultConfig(), args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("attribute largest=2 is out of range"));
  args.num_attrs = 0;
  status = kernel->Run(kernel->DefaultConfig(), args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("the op has 6, 3 and 1"));
}

TEST(LoaderTest, ConcurrentLookupsWhileLoading) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugin(TopKPlugin()).ok());
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

// ---- Ops ----------------------------------------------------------------------------

TEST(RegistryTest, ListsTheOpsPluginsDeclareAndTheirReferences) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugin(TopKPlugin()).ok());
  std::vector<std::shared_ptr<const Op>> ops = registry.Ops();
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0]->name(), "topk");
  EXPECT_EQ(ops[0]->plugin_path(), TopKPlugin());

  absl::StatusOr<std::shared_ptr<const Op>> op = registry.GetOp("topk");
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->get(), ops[0].get());
  const Op& topk = **op;
  std::vector<std::string> dims;
  for (const DimInfo& d : topk.dims()) dims.push_back(d.name);
  EXPECT_THAT(dims, ElementsAre("batch", "n", "k"));
  EXPECT_EQ(topk.dims()[topk.FindDim("n")].max, INT32_MAX);
  std::vector<std::string> tensors;
  for (const TensorInfo& t : topk.tensors()) tensors.push_back(t.name);
  EXPECT_THAT(tensors, ElementsAre("input", "row_starts", "row_ends", "values", "indices", "stats"));
  const TensorInfo& input = topk.tensors()[topk.FindTensor("input")];
  EXPECT_EQ(input.role, KREG_ROLE_IN);
  EXPECT_FALSE(input.optional);
  EXPECT_EQ(input.dtypes, KREG_DTYPE_F32 | KREG_DTYPE_BF16);
  EXPECT_TRUE(input.free_dtype());
  const TensorInfo& starts = topk.tensors()[topk.FindTensor("row_starts")];
  EXPECT_TRUE(starts.optional);
  EXPECT_TRUE(starts.is_input());
  EXPECT_EQ(starts.gen, KREG_GEN_RANGE_START);
  const TensorInfo& values = topk.tensors()[topk.FindTensor("values")];
  EXPECT_EQ(values.role, KREG_ROLE_OUT);
  EXPECT_EQ(values.same_dtype_as, topk.FindTensor("input"));
  EXPECT_FALSE(values.free_dtype());
  const TensorInfo& stats = topk.tensors()[topk.FindTensor("stats")];
  EXPECT_TRUE(stats.optional);
  EXPECT_TRUE(stats.unchecked);
  EXPECT_TRUE(stats.is_output());
  ASSERT_EQ(topk.attrs().size(), 1u);
  EXPECT_EQ(topk.attrs()[0].name, "largest");
  EXPECT_FALSE(topk.attrs()[0].is_float);
  EXPECT_EQ(topk.attrs()[0].default_value.i, 1);
  EXPECT_EQ(topk.attrs()[0].min.i, 0);
  EXPECT_EQ(topk.attrs()[0].max.i, 1);
  EXPECT_THAT(topk.default_variants(), ElementsAre("radix", "sort"));

  absl::StatusOr<std::shared_ptr<const Op>> nope = registry.GetOp("nope");
  EXPECT_EQ(nope.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(nope.status().message()), HasSubstr("unknown op 'nope'"));
  EXPECT_THAT(std::string(nope.status().message()), HasSubstr("topk"));

  std::shared_ptr<const Kernel> reference = registry.Reference("topk");
  ASSERT_NE(reference, nullptr);
  EXPECT_EQ(reference->name(), "topk/reference");
  EXPECT_TRUE(reference->is_reference());
  EXPECT_EQ(registry.Reference("nope"), nullptr);
  for (const auto& k : registry.Kernels("topk")) EXPECT_EQ(k->is_reference(), k->name() == "topk/reference");

  ASSERT_EQ(registry.Plugins().size(), 1u);
  const PluginInfo info = registry.Plugins()[0];
  EXPECT_EQ(info.name, "topk");
  EXPECT_THAT(info.ops, ElementsAre("topk"));
  EXPECT_THAT(info.kernels, UnorderedElementsAre("topk/reference", "topk/sort", "topk/heap", "topk/radix",
                                                 "topk/blockwise", "topk/blockmax"));
}

TEST(RegistryTest, TheAxpyOpIsListedWithItsRolesAndItsInOutTensor) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({TopKPlugin(), AxpyPlugin("axpy")}).empty());
  std::vector<std::string> ops;
  for (const auto& op : registry.Ops()) ops.push_back(op->name());
  EXPECT_THAT(ops, ElementsAre("axpy", "topk"));
  std::shared_ptr<const Op> axpy = *registry.GetOp("axpy");
  EXPECT_EQ(axpy->plugin_path(), AxpyPlugin("axpy"));
  ASSERT_EQ(axpy->dims().size(), 1u);
  EXPECT_EQ(axpy->dims()[0].name, "n");
  ASSERT_EQ(axpy->tensors().size(), 2u);
  const TensorInfo& x = axpy->tensors()[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.role, KREG_ROLE_IN);
  EXPECT_TRUE(x.is_input());
  EXPECT_FALSE(x.is_output());
  EXPECT_EQ(x.dtypes, KREG_DTYPE_F32 | KREG_DTYPE_BF16);
  const TensorInfo& out = axpy->tensors()[1];
  EXPECT_EQ(out.name, "out");
  EXPECT_EQ(out.role, KREG_ROLE_INOUT);
  EXPECT_TRUE(out.is_input());
  EXPECT_TRUE(out.is_output());
  EXPECT_EQ(out.dtypes, KREG_DTYPE_F32);
  ASSERT_NE(out.ToleranceFor(DType::kF32), nullptr);
  EXPECT_DOUBLE_EQ(out.ToleranceFor(DType::kF32)->rtol, 1e-6);
  EXPECT_EQ(out.ToleranceFor(DType::kBF16), nullptr);
  ASSERT_EQ(axpy->attrs().size(), 1u);
  EXPECT_EQ(axpy->attrs()[0].name, "alpha");
  EXPECT_TRUE(axpy->attrs()[0].is_float);
  EXPECT_DOUBLE_EQ(axpy->attrs()[0].default_value.f, 1.0);
  EXPECT_TRUE(axpy->has_data_class());
  EXPECT_THAT(axpy->Describe(), HasSubstr("x [n] f32|bf16 in"));
  EXPECT_THAT(axpy->Describe(), HasSubstr("out [n] f32 in-out"));
  EXPECT_THAT(axpy->Describe(), HasSubstr("alpha=1"));
  ASSERT_NE(registry.Reference("axpy"), nullptr);
  EXPECT_EQ(registry.Reference("axpy")->name(), "axpy/reference");
  EXPECT_EQ(Names(registry.Kernels("axpy")), (std::vector<std::string>{"axpy/blocked", "axpy/reference"}));
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(axpy, registry.Reference("axpy"), *axpy->ParseValues(Dims{{"n", 10}}), {});
  ASSERT_TRUE(problem.ok()) << problem.status();
  EXPECT_TRUE((*problem)->has_inout());
}

// The check compares blocks of elements at once and decides element by
// element only where a block fails: every change that breaks the tolerance
// is still caught, wherever it falls (first, middle or ragged last block),
// and a change within it is not.
TEST(RegistryTest, TheCheckCatchesEveryElementOutsideTheTolerance) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({AxpyPlugin("axpy")}).empty());
  std::shared_ptr<const Op> axpy = *registry.GetOp("axpy");
  std::shared_ptr<const Kernel> reference = registry.Reference("axpy");
  absl::StatusOr<std::unique_ptr<Problem>> made =
      Problem::Make(axpy, reference, *axpy->ParseValues(Dims{{"n", 1500}}), {});
  ASSERT_TRUE(made.ok()) << made.status();
  Problem& p = **made;
  float* out = static_cast<float*>(p.args()->tensors[1]->data);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Change {
    int64_t at;
    std::function<float(float)> to;
    bool caught;
  };
  const std::vector<Change> changes = {
      {0, [](float v) { return v; }, false},
      {700, [](float v) { return v * (1 + 4e-7f); }, false},  // rtol 1e-6
      {700, [](float v) { return v * (1 + 1e-4f) + 1e-3f; }, true},
      {0, [](float v) { return -v - 1; }, true},
      {1499, [](float v) { return v + 1; }, true},  // the last, partial block
      {1024, [nan](float) { return nan; }, true},
      {511, [inf](float) { return inf; }, true},
      {512, [inf](float) { return -inf; }, true},
  };
  for (const Change& c : changes) {
    SCOPED_TRACE(c.at);
    p.RestoreInOut();
    ASSERT_TRUE(reference->Run(reference->DefaultConfig(), *p.args()).ok());
    out[c.at] = c.to(out[c.at]);
    const absl::Status check = p.CheckOutputs();
    EXPECT_EQ(!check.ok(), c.caught) << check;
    if (c.caught) {
      EXPECT_THAT(std::string(check.message()), HasSubstr(absl::StrCat("out[", c.at, "]")));
    }
  }
}

// A kernel that writes a read-only input is caught wherever it writes: in
// any of the hash's lanes, in the ragged tail, or by swapping two words.
TEST(RegistryTest, TheCheckCatchesAWrittenInput) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugins({AxpyPlugin("axpy")}).empty());
  std::shared_ptr<const Op> axpy = *registry.GetOp("axpy");
  std::shared_ptr<const Kernel> reference = registry.Reference("axpy");
  absl::StatusOr<std::unique_ptr<Problem>> made =
      Problem::Make(axpy, reference, *axpy->ParseValues(Dims{{"n", 1501}}), {});
  ASSERT_TRUE(made.ok()) << made.status();
  Problem& p = **made;
  unsigned char* x = static_cast<unsigned char*>(p.args()->tensors[0]->data);  // x: read only
  const size_t bytes = 1501 * sizeof(float);
  auto run_and_check = [&] {
    p.RestoreInOut();
    EXPECT_TRUE(reference->Run(reference->DefaultConfig(), *p.args()).ok());
    return p.CheckOutputs();
  };
  ASSERT_TRUE(run_and_check().ok());
  for (size_t at : {size_t{0}, size_t{8}, size_t{16}, size_t{24}, size_t{2801}, bytes - 4, bytes - 1}) {
    SCOPED_TRACE(at);
    x[at] ^= 0x10;
    EXPECT_THAT(std::string(run_and_check().message()), HasSubstr("a read-only input was written"));
    x[at] ^= 0x10;
    EXPECT_TRUE(run_and_check().ok());
  }
  uint64_t a, b;  // two words of different lanes swapped
  std::memcpy(&a, x + 64, 8);
  std::memcpy(&b, x + 72, 8);
  ASSERT_NE(a, b);
  std::memcpy(x + 64, &b, 8);
  std::memcpy(x + 72, &a, 8);
  EXPECT_THAT(std::string(run_and_check().message()), HasSubstr("a read-only input was written"));
}

// ---- ABI growth ------------------------------------------------------------------------

// Kernels built against an older (smaller) and a newer (larger) struct
// layout register, their parameters read correctly, and they run correctly:
// fields past an old struct_size are never read (they hold garbage that
// crashes), and a new one's known fields (prepare, init) are found.
class AbiGrowthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The kernel plugins first: the axpy plugin's op is loaded before any
    // kernel all the same.
    std::vector<absl::Status> refused =
        registry_.LoadPlugins({AxpyPlugin("growth_old"), AxpyPlugin("growth_new"), AxpyPlugin("axpy")});
    ASSERT_TRUE(refused.empty()) << refused[0];
  }
  Registry registry_;
};

TEST_F(AbiGrowthTest, BothLayoutsRegister) {
  EXPECT_EQ(Names(registry_.Kernels("axpy")),
            (std::vector<std::string>{"axpy/blocked", "axpy/new_layout", "axpy/old_layout", "axpy/reference"}));
  std::map<std::string, PluginInfo> plugins;
  for (const PluginInfo& p : registry_.Plugins()) plugins[p.name] = p;
  ASSERT_TRUE(plugins.contains("growth_old"));
  ASSERT_TRUE(plugins.contains("growth_new"));
  EXPECT_EQ(plugins["growth_old"].path, AxpyPlugin("growth_old"));
  EXPECT_EQ(plugins["growth_old"].version, "0.1");
  EXPECT_TRUE(plugins["growth_old"].ops.empty());
  EXPECT_THAT(plugins["growth_old"].kernels, ElementsAre("axpy/old_layout"));
  EXPECT_THAT(plugins["growth_new"].kernels, ElementsAre("axpy/new_layout"));
  EXPECT_THAT(plugins["axpy_test"].ops, ElementsAre("axpy"));
}

TEST_F(AbiGrowthTest, TheirParameterReadsCorrectly) {
  for (const char* name : {"axpy/old_layout", "axpy/new_layout"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry_.Get(name);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_EQ((*kernel)->op(), "axpy");
    EXPECT_EQ((*kernel)->version(), 1u);
    EXPECT_EQ((*kernel)->required_isa(), 0u);
    EXPECT_TRUE((*kernel)->available());
    EXPECT_FALSE((*kernel)->is_reference());
    const ParamSpace& space = (*kernel)->params();
    ASSERT_EQ(space.size(), 1u);
    const ParamInfo& tile = space[0];
    EXPECT_EQ(tile.name, "tile");
    EXPECT_EQ(tile.doc, "elements per inner step");
    EXPECT_EQ(tile.kind, KREG_PARAM_INT);
    // The old layout's garbage past its struct_size reads as "none".
    EXPECT_EQ(tile.values_kind, KREG_VALUES_LISTED);
    EXPECT_EQ(tile.cap_dim, -1);
    EXPECT_EQ(tile.when_param, -1);
    EXPECT_TRUE(tile.when_values.empty());
    EXPECT_TRUE(tile.choice_isa.empty());
    EXPECT_THAT(tile.Values(), ElementsAre(1, 2, 4));
    EXPECT_EQ(tile.default_value.value, 2);
    EXPECT_EQ((*kernel)->ConfigString((*kernel)->DefaultConfig()), "tile=2");
    const int64_t dims[] = {1000};
    std::vector<Config> all = space.Enumerate(CpuIsa(), dims, 2);
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ((*kernel)->ConfigString(all[0]), "tile=2");
    EXPECT_THAT(std::string((*kernel)->ParseConfig({{"tile", "3"}}).status().message()),
                HasSubstr("3 is not one of 1, 2, 4"));
  }
}

TEST_F(AbiGrowthTest, TheyRunCorrectly) {
  std::shared_ptr<const Op> axpy = *registry_.GetOp("axpy");
  std::shared_ptr<const Kernel> reference = registry_.Reference("axpy");
  ASSERT_NE(reference, nullptr);
  for (DType x_dtype : {DType::kF32, DType::kBF16}) {
    for (const char* alpha : {"1", "-0.5"}) {
      ProblemOptions options;
      options.dtypes["x"] = x_dtype;
      options.seed = 3;
      absl::StatusOr<Values> values = axpy->ParseValues(NamedValues{{"n", "1000"}, {"alpha", alpha}});
      ASSERT_TRUE(values.ok()) << values.status();
      absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(axpy, reference, *values, options);
      ASSERT_TRUE(problem.ok()) << problem.status();
      Problem& p = **problem;
      for (const char* name : {"axpy/old_layout", "axpy/new_layout"}) {
        std::shared_ptr<const Kernel> kernel = *registry_.Get(name);
        for (const char* tile : {"1", "2", "4"}) {
          SCOPED_TRACE(absl::StrCat(name, " tile=", tile, " x ", DTypeName(x_dtype), " alpha=", alpha));
          absl::StatusOr<Config> config = kernel->ParseConfig({{"tile", tile}});
          ASSERT_TRUE(config.ok()) << config.status();
          p.RestoreInOut();
          absl::Status run = kernel->Run(*config, *p.args());
          ASSERT_TRUE(run.ok()) << run;
          absl::Status check = p.CheckOutputs();
          EXPECT_TRUE(check.ok()) << check;
        }
        // The check is real: a second run without restoring adds alpha * x
        // twice, and is caught.
        p.RestoreInOut();
        ASSERT_TRUE(kernel->Run(kernel->DefaultConfig(), *p.args()).ok());
        ASSERT_TRUE(kernel->Run(kernel->DefaultConfig(), *p.args()).ok());
        absl::Status twice = p.CheckOutputs();
        EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument) << name;
        EXPECT_THAT(std::string(twice.message()), HasSubstr("out["));
      }
    }
  }
}

TEST_F(AbiGrowthTest, TheNewLayoutIsPrepared) {
  // new_layout's run refuses to work without the state its prepare makes:
  // a run that succeeds proves the host found prepare past the old size.
  std::shared_ptr<const Op> axpy = *registry_.GetOp("axpy");
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(axpy, registry_.Reference("axpy"), *axpy->ParseValues(Dims{{"n", 33}}), {});
  ASSERT_TRUE(problem.ok()) << problem.status();
  std::shared_ptr<const Kernel> kernel = *registry_.Get("axpy/new_layout");
  absl::StatusOr<std::unique_ptr<PreparedRun>> run = kernel->Prepare(kernel->DefaultConfig(), *(*problem)->args());
  ASSERT_TRUE(run.ok()) << run.status();
  for (int i = 0; i < 3; ++i) {
    (*problem)->RestoreInOut();
    ASSERT_TRUE((*run)->Run().ok());
    EXPECT_TRUE((*problem)->CheckOutputs().ok()) << (*problem)->CheckOutputs();
  }
}

// ---- Shapes that follow an attribute, dims with defaults ---------------------------

// The rowsum test op: dims rows, cols, used (default_dim rows); attribute
// transposed; x [rows, cols], or [cols, rows] with transposed=1 (alt_shape);
// out [rows]. Its dim `cols` and tensor `out` come at the older, smaller
// sizes with garbage in the new fields.
class ShapeExtensionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<absl::Status> refused =
        registry_.LoadPlugins({std::string(KREG_ROWSUM_PLUGIN_DIR) + "/test_rowsum.so"});
    ASSERT_TRUE(refused.empty()) << refused[0];
    op_ = *registry_.GetOp("rowsum");
  }
  Values Parse(const NamedValues& named) {
    absl::StatusOr<Values> v = op_->ParseValues(named);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : Values{};
  }
  Registry registry_;
  std::shared_ptr<const Op> op_;
};

TEST_F(ShapeExtensionTest, TheDescriptorReadsAndOldSizedFieldsReadAsNone) {
  const Op& op = *op_;
  ASSERT_EQ(op.dims().size(), 3u);
  EXPECT_EQ(op.dims()[0].default_dim, -1);
  EXPECT_EQ(op.dims()[1].default_dim, -1);  // garbage past its struct_size: not read
  EXPECT_EQ(op.dims()[2].default_dim, op.FindDim("rows"));
  const TensorInfo& x = op.tensors()[op.FindTensor("x")];
  EXPECT_THAT(x.shape, ElementsAre(op.FindDim("rows"), op.FindDim("cols")));
  EXPECT_THAT(x.alt_shape, ElementsAre(op.FindDim("cols"), op.FindDim("rows")));
  EXPECT_EQ(x.alt_shape_attr, op.FindAttr("transposed"));
  const TensorInfo& out = op.tensors()[op.FindTensor("out")];
  EXPECT_EQ(out.alt_shape_attr, -1);  // garbage past its struct_size: not read
  EXPECT_TRUE(out.alt_shape.empty());
  EXPECT_THAT(op.Describe(), HasSubstr("dims rows, cols, used (default rows);"));
  EXPECT_THAT(op.Describe(), HasSubstr("x [rows,cols] (transposed!=0: [cols,rows]) f32|bf16 in"));
  EXPECT_THAT(op.Describe(), HasSubstr("out [rows] f32 out"));
}

TEST_F(ShapeExtensionTest, ADimLeftOutTakesItsDefaultOnlyWhenComplete) {
  Values v = Parse({{"rows", "5"}, {"cols", "3"}});
  EXPECT_THAT(v.dims, ElementsAre(5, 3, -1));  // not yet: an input may still give it
  ASSERT_TRUE(op_->Complete(&v).ok());
  EXPECT_THAT(v.dims, ElementsAre(5, 3, 5));
  v = Parse({{"rows", "5"}, {"cols", "3"}, {"used", "2"}});
  ASSERT_TRUE(op_->Complete(&v).ok());
  EXPECT_THAT(v.dims, ElementsAre(5, 3, 2));
  v = Parse({{"cols", "3"}});
  EXPECT_THAT(std::string(op_->Complete(&v).message()), HasSubstr("dimension 'rows' is missing"));
  // The key holds the completed dims (and the attribute when not default).
  v = Parse({{"rows", "5"}, {"cols", "3"}, {"transposed", "1"}});
  ShapeArgs shape;
  ASSERT_TRUE(MakeShapeArgs(*op_, v, {}, &shape).ok());
  EXPECT_EQ(DimsString(op_->KeyOf(*shape.args()).dims), "rows=5,cols=3,used=5,transposed=1");
}

TEST_F(ShapeExtensionTest, ShapesFollowTheAttributeEverywhere) {
  Values plain = Parse({{"rows", "5"}, {"cols", "3"}});
  Values transposed = Parse({{"rows", "5"}, {"cols", "3"}, {"transposed", "1"}});
  const int x = op_->FindTensor("x");
  EXPECT_THAT(op_->ShapeOf(x, plain), ElementsAre(5, 3));
  EXPECT_THAT(op_->ShapeOf(x, transposed), ElementsAre(3, 5));
  // Shape-only arguments (tuning-table lookups).
  ShapeArgs shape;
  ASSERT_TRUE(MakeShapeArgs(*op_, transposed, {}, &shape).ok());
  const DLTensor* t = shape.args()->tensors[x];
  ASSERT_EQ(t->ndim, 2);
  EXPECT_EQ(t->shape[0], 3);
  EXPECT_EQ(t->shape[1], 5);
  // A generated problem, and the user's array read by the shape in force.
  for (const char* flag : {"0", "1"}) {
    SCOPED_TRACE(flag);
    Tensor input(DType::kF32, {3, 5});
    FillRandom(input, Dist::kNormal, 5);
    ProblemOptions options;
    options.inputs["x"] = input;
    absl::StatusOr<std::unique_ptr<Problem>> p =
        Problem::Make(op_, registry_.Reference("rowsum"), Parse({{"transposed", flag}}), options);
    ASSERT_TRUE(p.ok()) << p.status();
    const bool t1 = flag[0] == '1';
    EXPECT_EQ(DimsString((*p)->dims()), t1 ? "rows=5,cols=3,used=5,transposed=1" : "rows=3,cols=5,used=3");
    std::shared_ptr<const Kernel> kernel = *registry_.Get("rowsum/by_memory");
    (*p)->PoisonOutputs();
    ASSERT_TRUE(kernel->Run(kernel->DefaultConfig(), *(*p)->args()).ok());
    EXPECT_TRUE((*p)->CheckOutputs().ok()) << (*p)->CheckOutputs();
  }
}

TEST_F(ShapeExtensionTest, MismatchesNameTheShapeInForce) {
  Tensor input(DType::kF32, {3, 5});
  ProblemOptions options;
  options.inputs["x"] = input;
  absl::StatusOr<std::unique_ptr<Problem>> p =
      Problem::Make(op_, nullptr, Parse({{"rows", "3"}, {"transposed", "1"}}), options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("rowsum: input 'x' has shape [3, 5] but rows=3 (x is [cols,rows] with transposed=1)"));
  p = Problem::Make(op_, nullptr, Parse({{"rows", "5"}, {"cols", "3"}, {"used", "6"}}), {});
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("rowsum: used=6 exceeds rows=5"));
  // Arguments built by hand: the shape the attribute selects is checked.
  Tensor out(DType::kF32, {3});
  DLTensor* tensors[] = {input.dl(), out.dl()};
  int64_t dims[] = {3, 5, 3};
  kreg_scalar attrs[1] = {};
  kreg_args args{};
  args.struct_size = sizeof args;
  args.tensors = tensors;
  args.num_tensors = 2;
  args.dims = dims;
  args.num_dims = 3;
  args.attrs = attrs;
  args.num_attrs = 1;
  EXPECT_TRUE(op_->Validate(args).ok()) << op_->Validate(args);
  attrs[0].i = 1;
  EXPECT_THAT(std::string(op_->Validate(args).message()),
              HasSubstr("x has shape [3, 5], expected [5, 3] (x is [cols,rows] with transposed=1)"));
}

// Descriptors the host refuses, each with its reason.
kreg_dim_desc DimDesc(const char* name, const char* default_dim = nullptr) {
  kreg_dim_desc d{};
  d.struct_size = sizeof d;
  d.name = name;
  d.doc = "";
  d.default_dim = default_dim;
  return d;
}

kreg_attr_desc AttrDesc(const char* name, kreg_attr_kind kind) {
  kreg_attr_desc a{};
  a.struct_size = sizeof a;
  a.name = name;
  a.doc = "";
  a.kind = kind;
  if (kind == KREG_ATTR_FLOAT) a.max.f = 1;
  if (kind == KREG_ATTR_INT) a.max.i = 1;
  return a;
}

// Tensor x [rows], f32 (int32 [rows] of sizes with a partition generator).
kreg_tensor_desc XDesc(const char* alt_shape, const char* alt_shape_attr, bool partition = false) {
  kreg_tensor_desc t{};
  t.struct_size = sizeof t;
  t.name = "x";
  t.doc = "";
  t.role = KREG_ROLE_IN;
  t.dtypes = partition ? KREG_DTYPE_I32 : KREG_DTYPE_F32;
  t.shape = "rows";
  t.gen = partition ? KREG_GEN_PARTITION : KREG_GEN_VALUES;
  t.gen_dim = partition ? "rows" : nullptr;
  t.alt_shape = alt_shape;
  t.alt_shape_attr = alt_shape_attr;
  return t;
}

absl::Status ReadOp(const std::vector<const kreg_dim_desc*>& dims, const kreg_tensor_desc& x) {
  static const kreg_attr_desc flag = AttrDesc("flag", KREG_ATTR_INT);
  static const kreg_attr_desc scale = AttrDesc("scale", KREG_ATTR_FLOAT);
  const kreg_attr_desc* const attrs[] = {&flag, &scale};
  const kreg_tensor_desc* const tensors[] = {&x};
  kreg_op_desc op{};
  op.struct_size = sizeof op;
  op.name = "shapes";
  op.doc = "";
  op.dims = dims.data();
  op.num_dims = dims.size();
  op.tensors = tensors;
  op.num_tensors = 1;
  op.attrs = attrs;
  op.num_attrs = 2;
  return Op::Read(op, nullptr).status();
}

TEST(OpReadTest, RefusesBadDefaultDimsAndAltShapes) {
  const kreg_dim_desc rows = DimDesc("rows"), cols = DimDesc("cols"), later = DimDesc("later");
  const kreg_dim_desc ahead = DimDesc("ahead", "later"), self = DimDesc("self", "self");
  const struct {
    std::vector<const kreg_dim_desc*> dims;
    kreg_tensor_desc x;
    const char* reason;
  } bad[] = {
      {{&rows, &ahead, &later}, XDesc(nullptr, nullptr), "dim 'ahead': default_dim 'later' is not an earlier dim"},
      {{&rows, &self}, XDesc(nullptr, nullptr), "dim 'self': default_dim 'self' is not an earlier dim"},
      {{&rows, &cols}, XDesc("cols", nullptr), "tensor 'x': alt_shape and alt_shape_attr go together"},
      {{&rows, &cols}, XDesc(nullptr, "flag"), "tensor 'x': alt_shape and alt_shape_attr go together"},
      {{&rows, &cols}, XDesc("cols", "nope"), "alt_shape_attr 'nope' is not an integer attribute of the op"},
      {{&rows, &cols}, XDesc("cols", "scale"), "alt_shape_attr 'scale' is not an integer attribute of the op"},
      {{&rows, &cols}, XDesc("cols,q", "flag"), "shape names 'q', which is not a dim of the op"},
      {{&rows, &cols}, XDesc("rows,cols", "flag", /*partition=*/true), "partition and range generators make 1-D"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(b.reason);
    const absl::Status s = ReadOp(b.dims, b.x);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(b.reason));
  }
  // Well formed: a default from an earlier dim, an alt_shape under an INT attribute.
  const kreg_dim_desc back = DimDesc("back", "rows");
  const absl::Status good = ReadOp({&rows, &cols, &back}, XDesc("cols", "flag"));
  EXPECT_TRUE(good.ok()) << good;
}

TEST(IsaTest, NamesBits) {
  EXPECT_EQ(IsaString(0), "none");
  EXPECT_EQ(IsaString(KREG_ISA_AVX2 | KREG_ISA_AVX512BF16), "avx2,avx512bf16");
  EXPECT_EQ(IsaString(1u << 30), "unknown(0x40000000)");
}

}  // namespace
}  // namespace kreg
