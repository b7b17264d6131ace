// Loads kreg's plugins, runs every available top-k variant on the same rows
// through the C++ API and checks that they agree, then lets a tuning table
// pick the variant and its parameters (kreg::Dispatcher).
//
//   topk_example [--plugin-path DIR] [--db TABLE]
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>

#include "kreg/dispatch.h"
#include "kreg/lut.h"
#include "kreg/registry.h"
#include "kreg/topk.h"

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
  return 1;
}

int main(int argc, char** argv) {
  kreg::LoadOptions options;
  std::string table;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--plugin-path") == 0) options.plugin_paths.push_back(argv[i + 1]);
    if (std::strcmp(argv[i], "--db") == 0) table = argv[i + 1];
  }
  auto registry = kreg::Registry::Load(options);
  if (!registry.ok()) return Fail(registry.status());

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
    if (!result.ok()) return Fail(result.status());
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

  // The run-time path: the table answers for this shape on this machine
  // (exactly, from the nearest tuned shape, or with a default).
  kreg::TuningDb db;
  if (!table.empty()) {
    auto loaded = kreg::TuningDb::Load(table);
    if (!loaded.ok()) return Fail(loaded.status());
    db = *std::move(loaded);
  }
  auto dispatcher = kreg::Dispatcher::Create(**registry, db);
  if (!dispatcher.ok()) return Fail(dispatcher.status());
  kreg::DispatchResult how;
  auto result = dispatcher->TopK(logits, /*k=*/5, {}, &how);
  if (!result.ok()) return Fail(result.status());
  std::printf("dispatched: %s %s (%s)\n", how.kernel.c_str(), how.config.c_str(),
              std::string(kreg::MatchName(how.match)).c_str());
  if (std::memcmp(first->data(), result->indices.data(), first->nbytes()) != 0) {
    std::fprintf(stderr, "the dispatched run disagrees\n");
    return 1;
  }
  return 0;
}
