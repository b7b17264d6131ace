#include "kreg/ops.h"

#include <cstring>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kreg {

// Defined next to each op's front.
extern const OpInfo kTopKOp;

namespace {
const OpInfo* const kOps[] = {&kTopKOp};
}  // namespace

const OpInfo* FindOp(absl::string_view name) {
  for (const OpInfo* op : kOps) {
    if (op->name == name) return op;
  }
  return nullptr;
}

std::vector<const OpInfo*> AllOps() { return {std::begin(kOps), std::end(kOps)}; }

absl::StatusOr<Dims> ParseDims(absl::string_view text) {
  Dims dims;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    absl::string_view name = absl::StripAsciiWhitespace(kv.first);
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    int64_t v;
    if (name.empty() || !absl::SimpleAtoi(value, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad dimension '", item, "' (expected NAME=INTEGER, e.g. n=1000)"));
    }
    for (const auto& [seen, unused] : dims) {
      if (seen == name) return absl::InvalidArgumentError(absl::StrCat("dimension '", name, "' given twice"));
    }
    dims.emplace_back(std::string(name), v);
  }
  return dims;
}

std::string DimsString(const Dims& dims) {
  return absl::StrJoin(dims, ",", [](std::string* out, const auto& d) {
    absl::StrAppend(out, d.first, "=", d.second);
  });
}

absl::StatusOr<Dist> ParseDist(absl::string_view name) {
  if (name == "normal") return Dist::kNormal;
  if (name == "uniform") return Dist::kUniform;
  if (name == "bits") return Dist::kBits;
  if (name == "ties") return Dist::kTies;
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

}  // namespace kreg
