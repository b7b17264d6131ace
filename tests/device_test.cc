// The CUDA device backend (kreg/device.h). Everywhere: it is found (where
// kreg was built with the CUDA toolkit) and says in one line why there is
// no GPU; a missing module is named. On a machine with a GPU: memory,
// copies both ways, the L2 flush and event timing.
#include "kreg/device.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(DeviceTest, SaysWhyThereIsNoGpuInOneLine) {
  absl::StatusOr<std::vector<GpuInfo>> gpus = CudaDevices();
  if (gpus.ok()) {
    ASSERT_FALSE(gpus->empty());
    for (const GpuInfo& g : *gpus) {
      EXPECT_FALSE(g.name.empty());
      EXPECT_GE(g.sm, 50);
      EXPECT_GT(g.memory_bytes, 0u);
      EXPECT_FALSE(g.driver.empty());
    }
    return;
  }
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kUnavailable);
  const std::string why(gpus.status().message());
  EXPECT_THAT(why, Not(HasSubstr("\n")));
#ifdef KREG_HAVE_CUDA
  EXPECT_THAT(why, Not(HasSubstr("not installed"))) << "the module was built: it should load and say why";
#else
  EXPECT_THAT(why, HasSubstr("kreg was built without the CUDA toolkit"));
#endif
  absl::StatusOr<std::unique_ptr<Device>> device = OpenCuda();
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().message(), why);
}

TEST(DeviceTest, OnAGpuMemoryCopiesFlushAndTiming) {
  absl::StatusOr<std::unique_ptr<Device>> opened = OpenCuda();
  if (!opened.ok()) GTEST_SKIP() << "no GPU here: " << opened.status().message();
  Device& d = **opened;
  EXPECT_EQ(d.abi()->kind, KREG_DEVICE_CUDA);
  EXPECT_NE(d.stream(), nullptr);
  std::vector<int> host(1 << 20), back(1 << 20, -1);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int>(i * 2654435761u);
  absl::StatusOr<void*> buf = d.Alloc(host.size() * sizeof(int));
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_TRUE(d.ToDevice(*buf, host.data(), host.size() * sizeof(int)).ok());
  ASSERT_TRUE(d.ToHost(back.data(), *buf, back.size() * sizeof(int)).ok());
  EXPECT_EQ(host, back);
  absl::StatusOr<double> ns = d.Time([&] { return d.FlushL2(); });
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GT(*ns, 0);
  d.Free(*buf);
  EXPECT_TRUE(d.Synchronize().ok());
  absl::StatusOr<void*> huge = d.Alloc(size_t{1} << 60);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(OpenCuda(1 << 20).ok());
}

TEST(DeviceTest, AMissingModuleIsNamed) {
  // A process of its own: the module is loaded once per process. (The
  // binary is KREG_TEST_BIN's where a bundle was carried elsewhere.)
  const char* bin = std::getenv("KREG_TEST_BIN") != nullptr ? std::getenv("KREG_TEST_BIN") : KREG_BIN;
  const std::string cmd = std::string("KREG_CUDA_BACKEND=/no/such/kreg_cuda_backend.so ") + bin + " machine";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0);
  EXPECT_THAT(out, HasSubstr("gpus    none: the CUDA backend is not installed"));
  EXPECT_THAT(out, HasSubstr("/no/such/kreg_cuda_backend.so"));
}

}  // namespace
}  // namespace kreg
