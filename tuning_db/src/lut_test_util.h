// What the tuning database's tests share: scratch files, keys, trials and
// configurations to record, a sample table, fake machines, and a fixture
// holding a registry of the topk plugin, the tiled fake and the axpy test
// op.
#ifndef KREG_TUNING_DB_LUT_TEST_UTIL_H_
#define KREG_TUNING_DB_LUT_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/lut.h"
#include "kreg/registry.h"

namespace kreg {
namespace lut_test {

inline constexpr char kMachine[] = "00000000deadbeef";

// A fresh folder under the test's temporary folder.
std::string TempDir(const std::string& name);
void WriteBytes(const std::string& path, const std::string& bytes);
std::string ReadBytes(const std::string& path);
// The names in `dir`, sorted.
std::vector<std::string> Listing(const std::string& dir);

// A topk key on kMachine (or `machine`).
tuning::ProblemKey Key(int64_t batch, int64_t n, int64_t k, absl::string_view machine = kMachine);
tuning::Config Choice(const std::string& name, const std::string& value);
tuning::Config Ints(std::vector<std::pair<std::string, int64_t>> values);
// An OK trial of `variant` with a spread around `median_ns`.
tuning::Trial MakeTrial(const std::string& variant, tuning::Config config, double median_ns,
                        int64_t measured_at = 100, uint32_t version = 1);
tuning::Trial Sort(const std::string& method, double median_ns, int64_t measured_at = 100,
                   uint32_t version = 1);
tuning::Trial Radix(int64_t first_bits, double median_ns, int64_t measured_at = 100);
tuning::Trial Tiled(int64_t tile, double median_ns);

// A small database with a bit of everything.
TuningDb SampleDb();
void ExpectSame(const TuningDb& a, const TuningDb& b);

// A CPU of `vendor` ("GenuineIntel" or an AMD one), its id filled in.
tuning::Machine FakeMachine(const std::string& vendor, std::vector<std::string> isa, uint32_t cores,
                            uint32_t family = 25, uint32_t model = 1);

// A table written by hand: text format without the entry_count trailer.
inline constexpr char kHandWritten[] = R"pb(
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
    ASSERT_THAT(registry_->refusals(), ::testing::IsEmpty());
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  std::shared_ptr<const Kernel> Get(absl::string_view name) { return *registry_->Get(name); }
  const Op& OpNamed(absl::string_view name) { return **registry_->GetOp(name); }
  static Registry* registry_;
};

}  // namespace lut_test
}  // namespace kreg

#endif  // KREG_TUNING_DB_LUT_TEST_UTIL_H_
