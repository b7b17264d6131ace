// Generated inputs: the distributions and partitions a problem's random
// tensors are drawn from.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kreg/problem.h"
#include "problem_internal.h"

namespace kreg {

absl::StatusOr<Dist> ParseDist(absl::string_view name) {
  for (Dist d : {Dist::kNormal, Dist::kUniform, Dist::kBits, Dist::kTies}) {
    if (DistName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown distribution '", name, "' (expected normal, uniform, bits or ties)"));
}

absl::string_view DistName(Dist dist) {
  switch (dist) {
    case Dist::kNormal:
      return "normal";
    case Dist::kUniform:
      return "uniform";
    case Dist::kBits:
      return "bits";
    case Dist::kTies:
      return "ties";
  }
  return "?";
}

absl::StatusOr<Partition> ParsePartition(absl::string_view name) {
  for (Partition p : {Partition::kRandom, Partition::kBalanced, Partition::kSkewed}) {
    if (PartitionName(p) == name) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown partition '", name, "' (expected random, balanced or skewed)"));
}

absl::string_view PartitionName(Partition partition) {
  switch (partition) {
    case Partition::kRandom:
      return "random";
    case Partition::kBalanced:
      return "balanced";
    case Partition::kSkewed:
      return "skewed";
  }
  return "?";
}

void FillRandom(Tensor& t, Dist dist, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<int> few(-4, 4);
  const int64_t n = t.numel();
  auto draw = [&]() -> float {
    switch (dist) {
      case Dist::kNormal:
        return normal(rng);
      case Dist::kUniform:
        return uniform(rng);
      case Dist::kTies:
        return static_cast<float>(few(rng)) * 0.5f;
      case Dist::kBits:
        break;
    }
    return 0.0f;
  };
  if (t.dtype() == DType::kI32) {
    int32_t* p = t.data_as<int32_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(rng());
  } else if (t.dtype() == DType::kF32) {
    float* p = t.data_as<float>();
    for (int64_t i = 0; i < n; ++i) {
      if (dist == Dist::kBits) {
        uint32_t u = static_cast<uint32_t>(rng());
        std::memcpy(&p[i], &u, 4);
      } else {
        p[i] = draw();
      }
    }
  } else {
    uint16_t* p = t.data_as<uint16_t>();
    for (int64_t i = 0; i < n; ++i) {
      p[i] = dist == Dist::kBits ? static_cast<uint16_t>(rng()) : FloatToBf16(draw());
    }
  }
}

namespace problem_internal {

// Sizes of `parts` groups summing to `total`.
void FillPartition(Tensor& t, int64_t total, Partition how, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t parts = t.numel();
  int32_t* p = t.data_as<int32_t>();
  if (parts == 0) return;
  std::vector<int64_t> sizes(parts, 0);
  if (how == Partition::kBalanced) {
    for (int64_t i = 0; i < parts; ++i) sizes[i] = total / parts + (i < total % parts ? 1 : 0);
  } else if (how == Partition::kSkewed) {
    // A few hot groups take most rows; the rest share what is left, some empty.
    std::vector<double> w(parts);
    for (int64_t i = 0; i < parts; ++i) w[i] = rng() % 4 == 0 ? 0.0 : 1.0 / static_cast<double>(1 + rng() % 64);
    for (int64_t h = 0; h < std::max<int64_t>(1, parts / 8); ++h) w[rng() % parts] = 8.0;
    double sum = 0;
    for (double x : w) sum += x;
    int64_t left = total;
    for (int64_t i = 0; i < parts; ++i) {
      sizes[i] = std::min<int64_t>(left, static_cast<int64_t>(std::floor(total * w[i] / sum)));
      left -= sizes[i];
    }
    sizes[rng() % parts] += left;
  } else {
    // Random cut points: empty groups happen.
    std::vector<int64_t> cuts(parts - 1);
    for (int64_t& c : cuts) c = total > 0 ? static_cast<int64_t>(rng() % static_cast<uint64_t>(total + 1)) : 0;
    std::sort(cuts.begin(), cuts.end());
    int64_t prev = 0;
    for (int64_t i = 0; i < parts - 1; ++i) {
      sizes[i] = cuts[i] - prev;
      prev = cuts[i];
    }
    sizes[parts - 1] = total - prev;
  }
  for (int64_t i = 0; i < parts; ++i) p[i] = static_cast<int32_t>(sizes[i]);
}

// Ranges within [0, n): every kind, empty, short, exact and full. `starts`
// or `ends` may be null (then 0 or n).
void FillRanges(Tensor* starts, Tensor* ends, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const int64_t rows = starts ? starts->numel() : ends->numel();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t start, end;
    if (starts && ends) {
      const int64_t len = r % 4 == 0 ? std::min<int64_t>(r / 4, n)
                                     : static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
      start = static_cast<int64_t>(rng() % static_cast<uint64_t>(n - len + 1));
      end = start + len;
    } else {
      start = static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
      end = start;
      if (!starts) start = 0;
      if (!ends) end = n;
    }
    if (starts) starts->data_as<int32_t>()[r] = static_cast<int32_t>(start);
    if (ends) ends->data_as<int32_t>()[r] = static_cast<int32_t>(end);
  }
}

}  // namespace problem_internal
}  // namespace kreg
