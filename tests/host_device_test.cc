// kreg's device path end to end where there is no GPU: the kreg binary with
// a stand-in CUDA backend whose "GPU" is host memory
// (plugins/host_device_backend.cc, KREG_CUDA_BACKEND) and a CUDA kernel of
// it (topk/host_device, plugins/host_device_plugin.cc). What a real GPU
// adds — the CUDA kernels' own results — scripts/gpu_check.sh tests there.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/run_kreg.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

const std::string kEnv = std::string("KREG_CUDA_BACKEND=") + KREG_HOST_DEVICE_BACKEND;
const std::string kPlugins = std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so:" + KREG_HOST_DEVICE_PLUGIN;
const std::string kDims = "--dims batch=6,n=3000,k=20";

Result Kreg(const std::string& args) { return RunKreg(kPlugins, args, kEnv); }

std::string Table(const std::string& name) {
  const std::string path = ::testing::TempDir() + "kreg_host_device_" + name + ".txtpb";
  std::filesystem::remove(path);
  return path;
}

TEST(HostDeviceTest, TheGpuIsListedAndItsKernelRunsOnlyThere) {
  Result r = Kreg("machine");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("kreg host-memory test device, sm_90, 1 GiB, driver CUDA 13.0"));
  r = Kreg("list --json");
  ASSERT_EQ(r.code, 0) << r.out;
  bool found = false;
  const Json listed = Json::parse(r.stdout_text);
  for (const Json& p : listed["plugins"]) {
    for (const Json& k : p["kernels"]) {
      if (k["kernel"] != "topk/host_device") continue;
      found = true;
      EXPECT_EQ(k["device"], "cuda");
      EXPECT_EQ(k["available"], true);
    }
  }
  EXPECT_TRUE(found) << r.stdout_text;

  r = Kreg("run topk/host_device --check " + kDims + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("check ok"));
  EXPECT_THAT(r.stdout_text, HasSubstr("on kreg host-memory test device (cuda events, cold L2)"));
  r = Kreg("run topk/host_device --check " + kDims + " --device cuda --warm --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const Json run = Json::parse(r.stdout_text);
  EXPECT_EQ(run["timing"], "cuda events, warm L2");
  EXPECT_EQ(run["key"]["machine"].get<std::string>().rfind("cuda-", 0), 0u) << run["key"];
  EXPECT_EQ(run["check"], "ok");
  EXPECT_THAT(run["device"].get<std::string>(), HasSubstr("kreg host-memory test device"));

  r = Kreg("run topk/host_device " + kDims);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.stderr_text, HasSubstr("topk/host_device runs on a CUDA device (run it with --device cuda)"));
  r = Kreg("run topk/heap " + kDims + " --device cuda");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.stderr_text, HasSubstr("topk/heap runs on the CPU, not on a device"));
}

TEST(HostDeviceTest, TuningKeysTheGpuBesideTheCpuAndTheTableAnswersEach) {
  const std::string db = Table("tune");
  // Every CUDA kernel, no CPU one (the real CUDA plugin's, where built,
  // fail on this stand-in, each with its reason, and the sweep goes on).
  Result r = Kreg("tune topk " + kDims + " --device cuda --strategy exhaustive --reps 3 --db " + db + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  Json tuned = Json::parse(r.stdout_text);
  const std::string gpu_id = tuned["key"]["machine"].get<std::string>();
  EXPECT_EQ(gpu_id.rfind("cuda-", 0), 0u) << gpu_id;
  EXPECT_EQ(tuned["best"]["kernel"], "topk/host_device");
  EXPECT_EQ(tuned["best"]["params"]["passes"], 1);
  EXPECT_EQ(tuned["timing"], "cuda events, cold L2");
  EXPECT_EQ(tuned["runner_up"]["kernel"], "topk/host_device");
  EXPECT_EQ(tuned["counts"]["candidates"].get<int>() - tuned["counts"]["failed"].get<int>(), 2) << r.stdout_text;
  // The same problem on the CPU, into the same table.
  r = Kreg("tune topk " + kDims + " --variants heap --strategy exhaustive --reps 3 --db " + db + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  tuned = Json::parse(r.stdout_text);
  EXPECT_EQ(tuned["key"]["machine"].get<std::string>().rfind("cuda-", 0), std::string::npos);
  EXPECT_EQ(tuned["best"]["kernel"], "topk/heap");
  EXPECT_EQ(tuned["timing"], "host clock");

  r = Kreg("db export --json " + db);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("\"name\": \"kreg host-memory test device\""));
  EXPECT_THAT(r.stdout_text, HasSubstr("\"sm\": 90"));

  // Each asked for its own: the GPU's entry holds only the GPU's kernel.
  r = Kreg("query topk " + kDims + " --no-shipped --db " + db + " --device cuda --json");
  ASSERT_EQ(r.code, 0) << r.out;
  Json answer = Json::parse(r.stdout_text);
  EXPECT_EQ(answer["match"], "exact");
  EXPECT_EQ(answer["kernel"], "topk/host_device");
  EXPECT_EQ(answer["params"]["passes"], 1);
  r = Kreg("query topk " + kDims + " --no-shipped --db " + db + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  answer = Json::parse(r.stdout_text);
  EXPECT_EQ(answer["match"], "exact");
  EXPECT_EQ(answer["kernel"], "topk/heap");
  // Another shape: the GPU's nearest, never a CPU kernel.
  r = Kreg("query topk --dims batch=8,n=5000,k=20 --no-shipped --db " + db + " --device cuda --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Json::parse(r.stdout_text)["kernel"], "topk/host_device");
  // Another GPU of the same SM version (more memory), untuned: the tuned
  // one's answer, named.
  r = RunKreg(kPlugins, "query topk " + kDims + " --no-shipped --db " + db + " --device cuda --json",
              kEnv + " KREG_HOST_DEVICE_GIB=2");
  ASSERT_EQ(r.code, 0) << r.out;
  answer = Json::parse(r.stdout_text);
  EXPECT_EQ(answer["match"], "similar machine") << answer;
  EXPECT_EQ(answer["kernel"], "topk/host_device");
  EXPECT_EQ(answer["params"]["passes"], 1);

  // The dispatcher's path: the table's choice for the GPU, run there (the
  // GPU's key from the opened device equals the tuner's).
  r = Kreg("run topk --check " + kDims + " --no-shipped --db " + db + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("topk/host_device"));
  EXPECT_THAT(r.stdout_text, HasSubstr("chosen by the table: exact"));
  EXPECT_THAT(r.stdout_text, HasSubstr("check ok"));

  // Kernels of the other side are refused by name.
  r = Kreg("tune topk " + kDims + " --device cuda --variants heap --db " + db);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("topk/heap runs on the CPU, not on a device"));
  r = Kreg("tune topk " + kDims + " --variants host_device --db " + db);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("topk/host_device runs on a CUDA device: tune it with --device cuda"));
}

}  // namespace
}  // namespace kreg
