// Loads kreg's plugins, runs every available top-k kernel on the same rows
// through the C++ API (kreg/topk.h, the typed front of op "topk") and checks
// that they agree, then lets a tuning table pick the variant and its
// parameters (kreg::Dispatcher), for whole rows and for ragged ones.
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
#include "kreg/tensor.h"
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

  // Every kernel of op "topk" (the reference, its oracle, included), each
  // with its default parameters.
  const auto kernels = (*registry)->Kernels("topk");
  if (kernels.empty()) {
    std::fprintf(stderr, "no topk kernels found; pass --plugin-path\n");
    return 1;
  }
  std::optional<kreg::Tensor> first;
  std::string first_name;
  for (const auto& kernel : kernels) {
    if (!kernel->available()) continue;
    auto result = kreg::TopK(*kernel, kernel->DefaultConfig(), logits, /*k=*/5);
    if (!result.ok()) return Fail(result.status());
    const int32_t* idx = result->indices.data_as<int32_t>();
    std::printf("%-16s row 0: indices %d %d %d %d %d, best %.4f\n", kernel->name().c_str(), idx[0], idx[1],
                idx[2], idx[3], idx[4], result->values.data_as<float>()[0]);
    if (!first) {
      first = result->indices;
      first_name = kernel->name();
    } else if (std::memcmp(first->data(), result->indices.data(), first->nbytes()) != 0) {
      std::fprintf(stderr, "%s disagrees with %s\n", kernel->name().c_str(), first_name.c_str());
      return 1;
    }
  }
  if (!first) {
    std::fprintf(stderr, "no topk kernel is available on this CPU\n");
    return 1;
  }

  // The run-time path: the table answers for this shape on this machine
  // (exactly, from the nearest tuned shape, or with the op's default).
  kreg::TuningDb db;
  if (!table.empty()) {
    auto loaded = kreg::TuningDb::Load(table);
    if (!loaded.ok()) return Fail(loaded.status());
    db = *std::move(loaded);
  }
  auto dispatcher = kreg::Dispatcher::Create(**registry, db);
  if (!dispatcher.ok()) return Fail(dispatcher.status());
  for (const std::string& warning : dispatcher->lut().warnings()) {
    std::fprintf(stderr, "table: %s\n", warning.c_str());
  }
  kreg::DispatchResult how;
  auto result = kreg::TopK(*dispatcher, logits, /*k=*/5, {}, &how);
  if (!result.ok()) return Fail(result.status());
  std::printf("dispatched: %s %s (%s)\n", how.kernel.c_str(), how.config.c_str(),
              std::string(kreg::MatchName(how.match)).c_str());
  if (std::memcmp(first->data(), result->indices.data(), first->nbytes()) != 0) {
    std::fprintf(stderr, "the dispatched run disagrees\n");
    return 1;
  }

  // Ragged rows: row r looks only at its first row_ends[r] columns. An
  // optional input is part of the problem's key ("f32+row_ends"), so the
  // table answers for it separately.
  kreg::Tensor row_ends(kreg::DType::kI32, {4});
  const int32_t ends[4] = {10000, 5000, 100, 3};  // the last row has fewer than k
  for (int r = 0; r < 4; ++r) row_ends.data_as<int32_t>()[r] = ends[r];
  kreg::TopKOptions ragged;
  ragged.row_ends = &row_ends;
  auto ragged_result = kreg::TopK(*dispatcher, logits, /*k=*/5, ragged, &how);
  if (!ragged_result.ok()) return Fail(ragged_result.status());
  const int32_t* idx = ragged_result->indices.data_as<int32_t>();
  std::printf("ragged:     %s %s (%s); row 3 (3 columns): indices %d %d %d %d %d\n", how.kernel.c_str(),
              how.config.c_str(), std::string(kreg::MatchName(how.match)).c_str(), idx[15], idx[16], idx[17],
              idx[18], idx[19]);
  // Row 0 spans the whole row: the same answer as before.
  if (std::memcmp(first->data(), ragged_result->indices.data(), 5 * sizeof(int32_t)) != 0) {
    std::fprintf(stderr, "the ragged run disagrees on a whole row\n");
    return 1;
  }
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 5; ++j) {
      const int32_t i = idx[r * 5 + j];
      if (i >= ends[r] || (i < 0 && j < ends[r])) {
        std::fprintf(stderr, "row %d: index %d is outside its range [0, %d)\n", r, i, ends[r]);
        return 1;
      }
    }
  }
  return 0;
}
