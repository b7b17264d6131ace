// The collectives' conformance cases, compiled into tests/' conformance_test
// (see tests/conformance.h): every collective on every rank count from 1
// to 8, awkward counts, ranks agreeing; sharded_matmul on every mesh of up
// to 8 ranks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/conformance.h"

namespace kreg::conformance {
namespace {

// ---- Collectives: every rank count, awkward counts, ranks agreeing --------------------

// The kernels of the collectives over a vector of `count` per rank.
std::vector<std::string> CollectiveKernels() {
  std::vector<std::string> names;
  for (const auto& k : TheRegistry().Kernels()) {
    if (k->op_info().collective() && k->op_info().FindDim("count") >= 0 && !k->is_reference()) {
      names.push_back(k->name());
    }
  }
  return names;
}

class CollectiveTest : public KernelConformanceTest {};

// 1 to 8 ranks (every non-power of two), counts of 0, 1, fewer than the
// ranks, one more, and sizes that divide nothing; every dtype, reduction and
// configuration; every bit pattern in half the cases. Where out is the same
// on every rank (allgather, allreduce) the ranks' outputs must agree bit for
// bit.
TEST_P(CollectiveTest, EveryRankCountAwkwardCountsAndRanksAgree) {
  const Op& op = kernel_->op_info();
  const bool same_everywhere = op.name() != "reduce_scatter";
  Tally tally;
  for (int p = 1; p <= 8; ++p) {
    std::set<int64_t> counts = {0, 1, p - 1, p + 1, 1000, 4097};
    for (int64_t count : counts) {
      for (const auto& dtypes : DtypeChoices(op)) {
        for (const NamedValues& attrs : AttrChoices(op)) {
          Case c;
          c.values = {{"count", absl::StrCat(count)}, {"ranks", absl::StrCat(p)}};
          c.values.insert(c.values.end(), attrs.begin(), attrs.end());
          c.options.dtypes = dtypes;
          c.options.dist = count % 2 ? Dist::kBits : Dist::kNormal;
          c.options.seed = static_cast<uint64_t>(p * 100 + count);
          std::mutex mu;  // (a std::mutex: TSan sees through it; Debian's Abseil is not instrumented)
          std::map<size_t, std::vector<std::string>> outputs;  // per configuration, per rank
          CheckKernel(*kernel_, c, tally, 0, [&](int rank, size_t config, const Problem& problem) {
            const Tensor& out = *problem.outputs()[0].second;
            std::lock_guard<std::mutex> lock(mu);
            auto& per_rank = outputs[config];
            per_rank.resize(p);
            per_rank[rank].assign(static_cast<const char*>(out.data()), out.nbytes());
          });
          if (same_everywhere) {
            for (const auto& [config, per_rank] : outputs) {
              for (int r = 1; r < p; ++r) {
                EXPECT_EQ(per_rank[r], per_rank[0]) << "configuration " << config << ": rank " << r
                                                    << "'s output differs from rank 0's on " << c.Describe();
              }
            }
          }
          if (HasFailure()) return;
        }
      }
    }
  }
  EXPECT_EQ(tally.refused, 0);
  std::cout << kernel_->name() << ": " << tally.cases << " cases, " << tally.runs << " checked runs on 1-8 ranks\n";
}

INSTANTIATE_TEST_SUITE_P(Collectives, CollectiveTest, ::testing::ValuesIn(CollectiveKernels()), TestName);

// ---- sharded_matmul: meshes and shapes ----------------------------------------------

std::vector<std::string> ShardedMatmulKernels() {
  std::vector<std::string> names;
  for (const auto& k : TheRegistry().Kernels("sharded_matmul")) {
    if (!k->is_reference()) names.push_back(k->name());
  }
  return names;
}

class ShardedMatmulTest : public KernelConformanceTest {};

// Every mesh of up to 8 ranks from 1x1 to 4x2 (1xN and Nx1 too), shapes the
// mesh divides (k split differently over x and y, empty shards), within f32
// tolerance of one matmul of the whole arrays (the reference's).
TEST_P(ShardedMatmulTest, EveryMeshAndShape) {
  struct Shape {
    int64_t m, k, n;
  };
  Tally tally;
  for (const auto& [x, y] : std::vector<std::pair<int, int>>{{1, 1}, {1, 3}, {2, 1}, {2, 2}, {2, 4}, {4, 2}, {3, 2}}) {
    for (const Shape& shape : {Shape{0, 24, 5}, Shape{12, 0, 3}, Shape{24, 24, 0}, Shape{24, 24, 17}, Shape{12, 48, 5},
                               Shape{48, 12, 33}, Shape{96, 96, 64}}) {
      if (shape.m % x != 0 || shape.k % x != 0 || shape.k % y != 0) continue;
      for (Dist dist : {Dist::kNormal, Dist::kBits}) {
        Case c;
        c.values = {{"m", absl::StrCat(shape.m)}, {"k", absl::StrCat(shape.k)}, {"n", absl::StrCat(shape.n)},
                    {"x", absl::StrCat(x)},       {"y", absl::StrCat(y)}};
        c.options.dist = dist;
        c.options.seed = static_cast<uint64_t>(tally.cases + 1);
        CheckKernel(*kernel_, c, tally);
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_EQ(tally.refused, 0);
  EXPECT_GT(tally.runs, 40);
  std::cout << kernel_->name() << ": " << tally.cases << " cases on meshes 1x1 to 4x2\n";
}

INSTANTIATE_TEST_SUITE_P(Sharded, ShardedMatmulTest, ::testing::ValuesIn(ShardedMatmulKernels()), TestName);

}  // namespace
}  // namespace kreg::conformance
