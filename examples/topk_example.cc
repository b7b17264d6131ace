// Loads kreg's plugins and runs every available top-k variant on the same
// rows through the C++ API, checking that they agree.
//
//   topk_example [--plugin-path DIR]
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

#include "kreg/registry.h"
#include "kreg/topk.h"

int main(int argc, char** argv) {
  kreg::LoadOptions options;
  if (argc == 3 && std::strcmp(argv[1], "--plugin-path") == 0) options.plugin_paths.push_back(argv[2]);
  auto registry = kreg::Registry::Load(options);
  if (!registry.ok()) {
    std::fprintf(stderr, "%s\n", std::string(registry.status().message()).c_str());
    return 1;
  }
  // 4 rows of 10000 logits; the 5 largest of each.
  kreg::Tensor logits(kreg::DType::kF32, {4, 10000});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < logits.numel(); ++i) logits.data_as<float>()[i] = normal(rng);

  const auto kernels = (*registry)->Kernels("topk");
  if (kernels.empty()) {
    std::fprintf(stderr, "no topk kernels found; pass --plugin-path\n");
    return 1;
  }
  std::optional<kreg::Tensor> first;
  for (const auto& kernel : kernels) {
    if (!kernel->available()) continue;
    auto result = kreg::TopK(*kernel, kernel->DefaultConfig(), logits, /*k=*/5);
    if (!result.ok()) {
      std::fprintf(stderr, "%s\n", std::string(result.status().message()).c_str());
      return 1;
    }
    const int32_t* idx = result->indices.data_as<int32_t>();
    std::printf("%-16s row 0: indices %d %d %d %d %d, best %.4f\n", kernel->name().c_str(), idx[0], idx[1],
                idx[2], idx[3], idx[4], result->values.data_as<float>()[0]);
    if (!first) {
      first = result->indices;
    } else if (std::memcmp(first->data(), result->indices.data(), first->nbytes()) != 0) {
      std::fprintf(stderr, "%s disagrees with %s\n", kernel->name().c_str(), kernels[0]->name().c_str());
      return 1;
    }
  }
  return 0;
}
