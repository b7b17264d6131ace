#include "lut_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"

namespace kreg {
namespace lut_test {

using ::google::protobuf::util::MessageDifferencer;

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

tuning::ProblemKey Key(int64_t batch, int64_t n, int64_t k, absl::string_view machine) {
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
                        int64_t measured_at, uint32_t version) {
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

tuning::Trial Sort(const std::string& method, double median_ns, int64_t measured_at,
                   uint32_t version) {
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

tuning::Trial Radix(int64_t first_bits, double median_ns, int64_t measured_at) {
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

tuning::Machine FakeMachine(const std::string& vendor, std::vector<std::string> isa, uint32_t cores,
                            uint32_t family, uint32_t model) {
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

Registry* WithRegistry::registry_ = nullptr;

}  // namespace lut_test
}  // namespace kreg
