#include "kreg/autotune.h"

#include <cmath>
#include <random>
#include <map>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/ops.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

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
  SearchResult r = Search(s.n, [&](size_t i, int reps) { return s(i, reps); }, o);
  EXPECT_EQ(r.best, 37);
  EXPECT_EQ(r.fully_measured.size(), s.n);
  EXPECT_EQ(s.runs, s.n * o.reps);
}

TEST(SearchTest, HalvingFindsItForAFractionOfTheRuns) {
  Synthetic exhaustive, halving;
  SearchOptions o;
  o.strategy = Strategy::kExhaustive;
  Search(exhaustive.n, [&](size_t i, int reps) { return exhaustive(i, reps); }, o);
  o.strategy = Strategy::kHalving;
  SearchResult r = Search(halving.n, [&](size_t i, int reps) { return halving(i, reps); }, o);
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

TEST(SearchTest, RandomMeasuresTheDefaultAndASample) {
  Synthetic s;
  SearchOptions o;
  o.strategy = Strategy::kRandom;
  o.random_samples = 20;
  SearchResult r = Search(s.n, [&](size_t i, int reps) { return s(i, reps); }, o);
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
  SearchResult r = Search(1000, [&](size_t, int) {
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

TEST(SpaceTest, ProductOfTheParametersFilteredByLegality) {
  Registry registry;
  ASSERT_TRUE(registry.LoadPlugin(std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so").ok());
  ProblemOptions shapes_only;
  shapes_only.fill = false;
  auto problem = *FindOp("topk")->make_problem({{"batch", 2}, {"n", 1000}, {"k", 64}}, shapes_only);
  std::shared_ptr<const Kernel> radix = *registry.Get("topk/radix");
  std::vector<Config> space = EnumerateSpace(*radix, problem->args());
  EXPECT_EQ(space.size(), 3u * 2u * 4u);
  EXPECT_EQ(space.front(), radix->DefaultConfig());

  std::shared_ptr<const Kernel> blockwise = *registry.Get("topk/blockwise");
  SpaceOptions lists;
  lists.max_list_len = 2;
  space = EnumerateSpace(*blockwise, problem->args(), lists);
  // 5 block counts x 2 stage-two methods x (default + 11 singles + 55 pairs).
  EXPECT_EQ(space.size(), 5u * 2u * (1u + 11u + 55u));
  EXPECT_EQ(space.front(), blockwise->DefaultConfig());
  for (const Config& c : space) {
    const std::vector<int64_t>& schedule = c.values()[1].list;
    EXPECT_TRUE(std::is_sorted(schedule.begin(), schedule.end()));
    EXPECT_TRUE(std::adjacent_find(schedule.begin(), schedule.end()) == schedule.end());
  }
}

}  // namespace
}  // namespace kreg
