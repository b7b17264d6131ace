// transpose_bench: each transpose kernel at its default configuration on f32
// matrices, against memcpy of the same bytes (one read and one write of the
// matrix: no transpose can beat it). Each kernel's output is checked
// against the reference before it is timed.
//
//   build/release/bin/transpose_bench --benchmark_repetitions=5
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kreg/problem.h"
#include "kreg/registry.h"

namespace {

struct Shape {
  int64_t rows, cols;
};
const Shape kShapes[] = {{4096, 4096}, {8192, 1024}, {1024, 8192}, {1000, 999}};

void Report(benchmark::State& state, int64_t bytes) {
  state.SetBytesProcessed(state.iterations() * bytes * 2);  // read and written
}

void Memcpy(benchmark::State& state, Shape shape) {
  const size_t bytes = static_cast<size_t>(shape.rows * shape.cols) * sizeof(float);
  std::vector<char> from(bytes, 1), to(bytes + 64);  // +64: no 4 KiB aliasing of the two
  for (auto _ : state) {
    std::memcpy(to.data() + 64, from.data(), bytes);
    benchmark::ClobberMemory();
  }
  Report(state, static_cast<int64_t>(bytes));
}

void Kernel(benchmark::State& state, std::shared_ptr<const kreg::Kernel> kernel, std::shared_ptr<kreg::Problem> p) {
  const kreg::Config config = kernel->DefaultConfig();
  p->PoisonOutputs();
  if (absl::Status s = kernel->Run(config, *p->args()); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  if (absl::Status s = p->CheckOutputs(); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  for (auto _ : state) {
    absl::Status s = kernel->Run(config, *p->args());
    benchmark::DoNotOptimize(s);
  }
  Report(state, p->values().dims[0] * p->values().dims[1] * static_cast<int64_t>(sizeof(float)));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  kreg::LoadOptions options;
  options.plugin_paths = {KREG_PLUGIN_DIR};
  absl::StatusOr<std::unique_ptr<kreg::Registry>> registry = kreg::Registry::Load(options);
  absl::StatusOr<std::shared_ptr<const kreg::Op>> op =
      registry.ok() ? (*registry)->GetOp("transpose") : absl::StatusOr<std::shared_ptr<const kreg::Op>>(registry.status());
  if (!op.ok()) {
    std::fprintf(stderr, "transpose_bench: %s\n", op.status().ToString().c_str());
    return 2;
  }
  for (const Shape& shape : kShapes) {
    const std::string label = absl::StrCat(shape.rows, "x", shape.cols);
    absl::StatusOr<kreg::Values> values =
        (*op)->ParseValues(kreg::NamedValues{{"rows", absl::StrCat(shape.rows)}, {"cols", absl::StrCat(shape.cols)}});
    absl::StatusOr<std::unique_ptr<kreg::Problem>> problem =
        values.ok() ? kreg::Problem::Make(*op, (*registry)->Reference("transpose"), *values, {})
                    : absl::StatusOr<std::unique_ptr<kreg::Problem>>(values.status());
    if (!problem.ok()) {
      std::fprintf(stderr, "transpose_bench: %s: %s\n", label.c_str(), problem.status().ToString().c_str());
      return 2;
    }
    std::shared_ptr<kreg::Problem> shared = *std::move(problem);
    benchmark::RegisterBenchmark(absl::StrCat("floor/memcpy/", label).c_str(), Memcpy, shape)->UseRealTime();
    for (const auto& kernel : (*registry)->Kernels("transpose")) {
      benchmark::RegisterBenchmark(absl::StrCat(kernel->name(), "/", label).c_str(), Kernel, kernel, shared)
          ->UseRealTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
