// Machines and their similarity: fingerprints of CPU generations, a GPU
// as a machine of its own, answers from the most similar tuned machine, and
// measured defaults across machines.
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

using Query = WithRegistry;

// ---- Machines and their similarity ---------------------------------------------


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

}  // namespace
}  // namespace lut_test
}  // namespace kreg
