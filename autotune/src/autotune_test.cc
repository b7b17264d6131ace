#include "kreg/autotune.h"

#include <cmath>
#include <random>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/op.h"
#include "kreg/params.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A synthetic space with a known answer: candidate i costs
// 100 + (i - 37)^2 microseconds, with 2% multiplicative noise per sample,
// and every 10th candidate computes a wrong result.
struct Synthetic {
  size_t n = 120;
  std::mt19937_64 rng{5};
  double runs = 0;  // total timed runs asked for: the search's cost
  Measurement operator()(size_t i, int reps) {
    runs += reps;
    Measurement m;
    if (i % 10 == 9) {
      m.status = TrialStatus::kWrongResult;
      return m;
    }
    std::normal_distribution<double> noise(1.0, 0.02);
    std::vector<double> t(reps);
    const double cost = 100e3 + 1e3 * std::pow(static_cast<double>(i) - 37, 2);
    for (double& x : t) x = cost * noise(rng);
    std::sort(t.begin(), t.end());
    m.status = TrialStatus::kOk;
    m.median_ns = t[t.size() / 2];
    m.min_ns = t.front();
    m.max_ns = t.back();
    m.reps = reps;
    return m;
  }
};

TEST(SearchTest, ExhaustiveFindsTheKnownOptimum) {
  Synthetic s;
  SearchOptions o;
  o.strategy = Strategy::kExhaustive;
  SearchResult r = Search(s.n, [&](size_t i, int reps, bool) { return s(i, reps); }, o);
  EXPECT_EQ(r.best, 37);
  EXPECT_EQ(r.fully_measured.size(), s.n);
  EXPECT_EQ(s.runs, s.n * o.reps);
}

TEST(SearchTest, HalvingFindsItForAFractionOfTheRuns) {
  Synthetic exhaustive, halving;
  exhaustive.n = halving.n = 400;
  SearchOptions o;
  o.strategy = Strategy::kExhaustive;
  Search(exhaustive.n, [&](size_t i, int reps, bool) { return exhaustive(i, reps); }, o);
  o.strategy = Strategy::kHalving;
  SearchResult r = Search(halving.n, [&](size_t i, int reps, bool) { return halving(i, reps); }, o);
  ASSERT_GE(r.best, 0);
  // Within 3% of the optimum's cost (here: the optimum or a neighbour).
  EXPECT_LE(std::abs(r.best - 37), 5);
  EXPECT_LE(halving.runs, 0.25 * exhaustive.runs);
  // Wrong results are measured once and never survive the first round.
  std::map<size_t, int> times_measured;
  for (const auto& [i, m] : r.measured) ++times_measured[i];
  for (const auto& [i, count] : times_measured) {
    if (i % 10 == 9) {
      EXPECT_EQ(count, 1) << i;
    }
  }
  EXPECT_EQ(times_measured.size(), halving.n);  // everyone was checked
}

// Round 0 probes every family (a variant's configurations with one
// micro-kernel) and leaves out the rest of one three times slower than the
// best so far: a portable micro-kernel beside an AVX-512 one. A family
// nearer the best is measured whole, and holds the winner.
TEST(SearchTest, HalvingLeavesOutTheRestOfAFamilyFarBehind) {
  const size_t n = 90;  // family 0: 0-29, 1 ms up; family 1: 30-59, 6 ms up; family 2: 60-89, 1.2 ms up, best at 75
  auto cost = [](size_t i) {
    if (i < 30) return 1.0e6 + 1e4 * static_cast<double>(i);
    if (i < 60) return 6.0e6 + 1e4 * static_cast<double>(i);
    return i == 75 ? 0.9e6 : 1.2e6 + 1e4 * static_cast<double>(i);
  };
  std::map<size_t, int> measured;
  auto measure = [&](size_t i, int reps, bool) {
    ++measured[i];
    Measurement m;
    m.status = TrialStatus::kOk;
    m.reps = reps;
    m.median_ns = m.min_ns = m.max_ns = cost(i);
    return m;
  };
  SearchOptions o;
  o.strategy = Strategy::kHalving;
  for (size_t i = 0; i < n; ++i) o.families.push_back(static_cast<int>(i / 30));
  o.groups.assign(n, 0);
  const SearchResult r = Search(n, measure, o);
  EXPECT_EQ(r.best, 75);
  size_t slow = 0, others = 0;
  for (const auto& [i, count] : measured) (i >= 30 && i < 60 ? slow : others) += 1;
  EXPECT_EQ(slow, static_cast<size_t>(o.family_probe));  // probed, then left out
  EXPECT_EQ(others, 60u);                                // measured whole
  EXPECT_EQ(r.skipped, 30u - o.family_probe);
}

// Round 0 times one run, a kernel's first: a variant that compiles itself
// then (oneDNN) is 16x slower in it than after. Its best goes on to the
// next round anyway, and wins there.
TEST(SearchTest, HalvingKeepsAVariantWhoseFirstRunIsSlow) {
  const size_t n = 100;  // 0-98: one variant, 2-3 ms; 99: another, 1.8 ms warm, 29 ms first
  auto measure = [&](size_t i, int reps, bool) {
    Measurement m;
    m.status = TrialStatus::kOk;
    m.reps = reps;
    const double warm = i == n - 1 ? 1.8e6 : 2e6 + 1e4 * static_cast<double>(i);
    m.median_ns = m.min_ns = m.max_ns = reps == 1 && i == n - 1 ? 16 * warm : warm;
    return m;
  };
  SearchOptions o;
  o.strategy = Strategy::kHalving;
  o.groups.assign(n, 0);
  o.groups.back() = 1;
  const SearchResult r = Search(n, measure, o);
  EXPECT_EQ(r.best, static_cast<int64_t>(n - 1));
}

// A space shaped like a real sweep: groups (variants) of candidates whose
// costs differ by group more than within it, timed on a noisy machine: each
// timed run is 1.3-2.5x slower with probability 15% (preemption, another
// tenant), and the machine drifts 10% slower over the sweep.
struct Noisy {
  std::mt19937_64 rng;
  double runs = 0, drift = 0;
  explicit Noisy(uint64_t seed) : rng(seed) {}
  static constexpr size_t kN = 300;
  static int Group(size_t i) { return i < 200 ? 0 : i < 260 ? 1 : 2; }
  static double Cost(size_t i) {
    // Group 0 (0-199): 130-230 us; group 1 (200-259): 100 us at 243, else
    // more; group 2 (260-299): 105-145 us.
    if (i < 200) return 130e3 + 0.5e3 * static_cast<double>(i);
    if (i < 260) return 100e3 + 2e3 * std::abs(static_cast<double>(i) - 243);
    return 105e3 + 1e3 * static_cast<double>(i - 260);
  }
  Measurement operator()(size_t i, int reps) {
    runs += reps;
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<double> t(reps);
    for (double& x : t) {
      drift = std::min(0.10, drift + 0.10 / 3000);
      x = Cost(i) * (1 + drift) * (u(rng) < 0.15 ? 1.3 + 1.2 * u(rng) : 1.0) * (1 + 0.01 * u(rng));
    }
    std::sort(t.begin(), t.end());
    Measurement m;
    m.status = TrialStatus::kOk;
    m.median_ns = t[t.size() / 2];
    m.min_ns = t.front();
    m.max_ns = t.back();
    m.reps = reps;
    return m;
  }
};

TEST(SearchTest, HalvingRacesTheLeadersAndStaysWithinThreePercentOnANoisyMachine) {
  std::vector<int> groups;
  for (size_t i = 0; i < Noisy::kN; ++i) groups.push_back(Noisy::Group(i));
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Noisy exhaustive(seed), halving(seed + 1000);
    SearchOptions o;
    o.strategy = Strategy::kExhaustive;
    Search(Noisy::kN, [&](size_t i, int reps, bool) { return exhaustive(i, reps); }, o);
    o.strategy = Strategy::kHalving;
    o.groups = groups;
    std::vector<size_t> again;
    SearchResult r = Search(Noisy::kN, [&](size_t i, int reps, bool a) {
      if (a) again.push_back(i);
      return halving(i, reps);
    }, o);
    ASSERT_GE(r.best, 0);
    EXPECT_LE(Noisy::Cost(r.best), 1.03 * Noisy::Cost(243)) << "seed " << seed << ": picked " << r.best;
    EXPECT_LE(halving.runs, 0.25 * exhaustive.runs) << "seed " << seed;
    // The leaders raced (the best two, and the other groups' best within
    // 1.5x), each measured once or twice more (once: clearly behind after
    // the first pass); the winner is the raced one with the least median.
    ASSERT_GE(r.raced.size(), 3u);
    std::set<int> raced_groups;
    for (const auto& [i, m] : r.raced) {
      raced_groups.insert(groups[i]);
      const auto passes = std::count(again.begin(), again.end(), i);
      EXPECT_GE(passes, 1) << i;
      EXPECT_LE(passes, 2) << i;
      EXPECT_EQ(m.reps, (1 + passes) * o.reps);
    }
    EXPECT_GE(raced_groups.size(), 2u) << "seed " << seed;
    EXPECT_EQ(raced_groups.count(1), 1u) << "seed " << seed;  // the optimum's
    const auto fastest = std::min_element(r.raced.begin(), r.raced.end(), [](const auto& a, const auto& b) {
      return a.second.median_ns < b.second.median_ns;
    });
    EXPECT_EQ(static_cast<size_t>(r.best), fastest->first);
  }
}

// A racer whose fastest run is slower than the leader's median leaves the
// race; close ones race on. Candidates 0, 1 and 2 in groups of their own:
// every run within 3% of 100, 101 and 130.
TEST(SearchTest, TheRaceEndsForLeadersClearlyBehind) {
  const double cost[] = {100, 101, 130};
  SearchOptions o;
  o.groups = {0, 1, 2};
  std::map<size_t, int> again;
  SearchResult r = Search(3, [&](size_t i, int reps, bool a) {
    again[i] += a;
    Measurement m;
    m.status = TrialStatus::kOk;
    m.median_ns = cost[i];
    m.min_ns = 0.97 * cost[i];
    m.max_ns = 1.03 * cost[i];
    m.reps = reps;
    return m;
  }, o);
  EXPECT_EQ(r.best, 0);
  ASSERT_EQ(r.raced.size(), 3u);
  // 1's fastest run (98) beats 0's median: both race twice. 2's (126) does
  // not: it leaves after the first pass.
  EXPECT_EQ(again[0], 2);
  EXPECT_EQ(again[1], 2);
  EXPECT_EQ(again[2], 1);
  // Round 0 cut nothing (each is its group's best), so each went straight
  // from one run to full repetitions: 3 + 3 measurements before the race.
  EXPECT_EQ(r.measured.size(), 6u + 5u);

  std::vector<std::vector<Measurement>> passes(3);
  for (size_t l = 0; l < 3; ++l) passes[l].push_back(r.raced[0].second);
  passes[1][0].min_ns = 2 * passes[0][0].median_ns;  // behind
  passes[2][0].status = TrialStatus::kError;        // failed: out
  EXPECT_THAT(StillRacing(passes), ElementsAre(true, false, false));
}

TEST(SearchTest, RandomMeasuresTheDefaultAndASample) {
  Synthetic s;
  SearchOptions o;
  o.strategy = Strategy::kRandom;
  o.random_samples = 20;
  SearchResult r = Search(s.n, [&](size_t i, int reps, bool) { return s(i, reps); }, o);
  EXPECT_EQ(r.measured.size(), 20u);
  EXPECT_EQ(r.measured.front().first, 0u);
  std::set<size_t> distinct;
  for (const auto& [i, m] : r.measured) distinct.insert(i);
  EXPECT_EQ(distinct.size(), 20u);
  EXPECT_GE(r.best, 0);
}

TEST(SearchTest, BudgetStopsTheSearch) {
  SearchOptions o;
  o.strategy = Strategy::kExhaustive;
  o.budget_seconds = 0.05;
  size_t calls = 0;
  SearchResult r = Search(1000, [&](size_t, int, bool) {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    Measurement m;
    m.status = TrialStatus::kOk;
    m.median_ns = 1;
    return m;
  }, o);
  EXPECT_LT(calls, 20u);
  EXPECT_GE(r.best, 0);
}

// Shape-only arguments of `op` for `dims` (default dtypes, no optional
// inputs), as the tuner and the table use them.
class ShapeProblem {
 public:
  ShapeProblem(const Op& op, const NamedValues& named) {
    absl::StatusOr<Values> values = op.ParseValues(named);
    EXPECT_TRUE(values.ok()) << values.status();
    absl::StatusOr<TensorTypes> types = op.ResolveTypes({}, {}, {});
    EXPECT_TRUE(types.ok()) << types.status();
    if (values.ok() && types.ok()) {
      absl::Status s = op.MakeShapeArgs(*values, *types, &args_);
      EXPECT_TRUE(s.ok()) << s;
    }
  }
  const kreg_args& args() const { return *args_.args(); }

 private:
  ShapeArgs args_;
};

class SpaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<absl::Status> refused = registry_.LoadPlugins(
        {std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so", std::string(KREG_AXPY_PLUGIN_DIR) + "/test_axpy.so"});
    ASSERT_TRUE(refused.empty()) << refused[0];
  }
  std::shared_ptr<const Kernel> Get(const std::string& name) {
    absl::StatusOr<std::shared_ptr<const Kernel>> k = registry_.Get(name);
    EXPECT_TRUE(k.ok()) << k.status();
    return k.ok() ? *k : nullptr;
  }
  const Op& GetOp(const std::string& name) { return **registry_.GetOp(name); }
  Registry registry_;
};

bool HasAvx2AndFma() {
  return (CpuIsa() & (KREG_ISA_AVX2 | KREG_ISA_FMA)) == (KREG_ISA_AVX2 | KREG_ISA_FMA);
}

TEST_F(SpaceTest, ProductOfTheParametersFilteredByLegality) {
  ShapeProblem problem(GetOp("topk"), {{"batch", "2"}, {"n", "1000"}, {"k", "64"}});
  EXPECT_TRUE(problem.args().flags & KREG_ARGS_SHAPE_ONLY);
  std::shared_ptr<const Kernel> radix = Get("topk/radix");
  std::vector<Config> space = EnumerateSpace(*radix, problem.args());
  EXPECT_EQ(space.size(), 3u * 2u * 4u);
  EXPECT_EQ(space.front(), radix->DefaultConfig());
  std::set<std::string> distinct;
  for (const Config& c : space) distinct.insert(radix->ConfigString(c));
  EXPECT_EQ(distinct.size(), space.size());

  std::shared_ptr<const Kernel> blockwise = Get("topk/blockwise");
  SpaceOptions lists;
  lists.max_list_len = 2;
  space = EnumerateSpace(*blockwise, problem.args(), lists);
  // 5 block counts x 2 stage-two methods x (default + 11 singles + 55 pairs).
  EXPECT_EQ(space.size(), 5u * 2u * (1u + 11u + 55u));
  EXPECT_EQ(space.front(), blockwise->DefaultConfig());
  for (const Config& c : space) {
    const std::vector<int64_t>& schedule = c.values()[1].list;
    EXPECT_TRUE(std::is_sorted(schedule.begin(), schedule.end()));
    EXPECT_TRUE(std::adjacent_find(schedule.begin(), schedule.end()) == schedule.end());
  }
  // Lists of one value: default + 11 singles.
  lists.max_list_len = 1;
  EXPECT_EQ(EnumerateSpace(*blockwise, problem.args(), lists).size(), 5u * 2u * (1u + 11u));
  // What EnumerateSpace returns is ParamSpace::Enumerate filtered by Check.
  std::vector<Config> all = blockwise->params().Enumerate(CpuIsa(), problem.args().dims, 2);
  EXPECT_EQ(all.size(), 5u * 2u * (1u + 11u + 55u));
}

TEST_F(SpaceTest, AChoiceTheCpuLacksIsNeverEnumerated) {
  std::shared_ptr<const Kernel> blocked = Get("axpy/blocked");
  const ParamSpace& space = blocked->params();
  const int unroll = space.Find("unroll");
  ASSERT_EQ(unroll, 1);
  ASSERT_EQ(space[unroll].kind, KREG_PARAM_CHOICE);
  ASSERT_EQ(space[unroll].choices, (std::vector<std::string>{"scalar", "avx2"}));
  const int64_t dims[] = {1000};
  // As KREG_ISA_MASK=fma would make the CPU look: no avx2 choice, and
  // nothing for the inactive prefetch to vary.
  for (uint32_t isa : {0u, static_cast<uint32_t>(KREG_ISA_FMA), static_cast<uint32_t>(KREG_ISA_AVX2)}) {
    SCOPED_TRACE(IsaString(isa));
    EXPECT_FALSE(space[unroll].ChoiceAvailable(1, isa));
    std::vector<Config> configs = space.Enumerate(isa, dims, 2);
    EXPECT_EQ(configs.size(), 6u);  // block 16..512
    for (const Config& c : configs) EXPECT_EQ(space.Format(c).find("unroll=avx2"), std::string::npos);
    EXPECT_TRUE(space.Parse({{"unroll", "scalar"}}, "axpy/blocked", isa).ok());
    // The default moves off a choice the CPU lacks (here it is scalar).
    EXPECT_EQ(space.Format(space.Default(isa)), "block=256 unroll=scalar prefetch=0");
    EXPECT_THAT(std::string(space.Parse({{"unroll", "avx2"}}, "axpy/blocked", isa).status().message()),
                HasSubstr("'avx2' needs an ISA this CPU lacks"));
  }
  // With both bits the avx2 choice is searched.
  const uint32_t both = KREG_ISA_AVX2 | KREG_ISA_FMA;
  EXPECT_TRUE(space[unroll].ChoiceAvailable(1, both));
  std::vector<Config> configs = space.Enumerate(both, dims, 2);
  EXPECT_EQ(configs.size(), 6u * (1u + 2u));
  size_t avx2 = 0;
  for (const Config& c : configs) avx2 += c.values()[unroll].value == 1;
  EXPECT_EQ(avx2, 6u * 2u);

  // On this CPU, through the tuner's EnumerateSpace.
  ShapeProblem problem(GetOp("axpy"), {{"n", "1000"}});
  std::vector<Config> here = EnumerateSpace(*blocked, problem.args());
  EXPECT_EQ(here.size(), HasAvx2AndFma() ? 18u : 6u);
  for (const Config& c : here) {
    EXPECT_TRUE(space[unroll].ChoiceAvailable(c.values()[unroll].value, CpuIsa())) << space.Format(c);
  }
  EXPECT_EQ(blocked->ConfigString(blocked->DefaultConfig()), "block=256 unroll=scalar prefetch=0");
}

TEST_F(SpaceTest, AnInactiveParameterIsNotVaried) {
  std::shared_ptr<const Kernel> blocked = Get("axpy/blocked");
  const ParamSpace& space = blocked->params();
  const int unroll = space.Find("unroll"), prefetch = space.Find("prefetch");
  ASSERT_EQ(prefetch, 2);
  EXPECT_EQ(space[prefetch].when_param, unroll);
  EXPECT_THAT(space[prefetch].when_values, ElementsAre(1));
  const int64_t dims[] = {4096};
  const uint32_t both = KREG_ISA_AVX2 | KREG_ISA_FMA;
  std::vector<Config> configs = space.Enumerate(both, dims, 2);
  // block 16..4096 (9 values) x (scalar + avx2 x prefetch 0, 1): prefetch
  // does not multiply the scalar configurations.
  EXPECT_EQ(configs.size(), 9u * 3u);
  std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> prefetch_by;  // (block, unroll) -> prefetch
  for (const Config& c : configs) {
    const bool active = space.Active(c, prefetch);
    EXPECT_EQ(active, c.values()[unroll].value == 1) << space.Format(c);
    if (!active) {
      EXPECT_EQ(c.values()[prefetch].value, 0) << space.Format(c);  // its default
    }
    prefetch_by[{c.values()[0].value, c.values()[unroll].value}].insert(c.values()[prefetch].value);
  }
  for (const auto& [key, values] : prefetch_by) {
    EXPECT_EQ(values, (key.second == 1 ? std::set<int64_t>{0, 1} : std::set<int64_t>{0}));
  }
  // Setting an inactive parameter is refused, naming what it depends on.
  EXPECT_THAT(std::string(space.Parse({{"prefetch", "1"}}, "axpy/blocked", both).status().message()),
              HasSubstr("inactive here (it applies when 'unroll' is 1)"));
  EXPECT_TRUE(space.Parse({{"unroll", "avx2"}, {"prefetch", "1"}}, "axpy/blocked", both).ok());
}

TEST_F(SpaceTest, PowersOfTwoAreCappedAtTheDim) {
  std::shared_ptr<const Kernel> blocked = Get("axpy/blocked");
  const ParamInfo& block = blocked->params()[0];
  ASSERT_EQ(block.name, "block");
  EXPECT_EQ(block.values_kind, KREG_VALUES_POW2);
  EXPECT_THAT(block.Values(), ElementsAre(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536));
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> expected = {
      {1000, {16, 32, 64, 128, 256, 512}},
      {1024, {16, 32, 64, 128, 256, 512, 1024}},
      {16, {16}},
      {15, {}},
      {0, {}},
      {int64_t{1} << 30, {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536}}};
  for (const auto& [n, values] : expected) {
    SCOPED_TRACE(n);
    EXPECT_EQ(block.Values(&n), values);
    ShapeProblem problem(GetOp("axpy"), {{"n", absl::StrCat(n)}});
    std::vector<Config> space = EnumerateSpace(*blocked, problem.args());
    std::set<int64_t> blocks;
    for (const Config& c : space) blocks.insert(c.values()[0].value);
    EXPECT_EQ(blocks, std::set<int64_t>(values.begin(), values.end()));
    EXPECT_EQ(space.size(), values.size() * (HasAvx2AndFma() ? 3u : 1u));
    // The default (block=256) first when the cap allows it, absent when not.
    const bool default_legal = n >= 256;
    ASSERT_EQ(!space.empty() && space.front() == blocked->DefaultConfig(), default_legal);
    EXPECT_EQ(blocked->Check(blocked->DefaultConfig(), problem.args()).ok(), default_legal);
  }
  // A value above the cap is refused for that problem, naming the legal ones.
  ShapeProblem small(GetOp("axpy"), {{"n", "100"}});
  absl::Status s = blocked->Check(*blocked->ParseConfig({{"block", "128"}}), small.args());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("128 is not one of 16, 32, 64"));
}

}  // namespace
}  // namespace kreg
