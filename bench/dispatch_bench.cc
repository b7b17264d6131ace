// dispatch_bench: what Dispatcher::Run costs on top of the kernel it runs,
// on a small problem where that cost shows (a 1x1024 f32 top-k, k=8):
//   BM_KernelRun          Kernel::Run of topk/heap at its default
//                         configuration (the kernel's own time, with the
//                         registry's per-call checks);
//   BM_DispatcherRun/1    Dispatcher::Run of op topk over a table holding
//                         that shape (an exact answer, the same kernel and
//                         configuration);
//   BM_DispatcherRun/0    over an empty table (the op's default).
// The dispatcher's overhead is BM_DispatcherRun minus BM_KernelRun.
//
//   build/release/bin/dispatch_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <cstdio>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "kreg/dispatch.h"
#include "kreg/lut.h"
#include "kreg/problem.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

struct Setup {
  std::unique_ptr<Registry> registry;
  std::shared_ptr<const Kernel> kernel;
  std::unique_ptr<Problem> problem;
  absl::Status status;
};

Setup& TheSetup() {
  static Setup* setup = [] {
    auto* s = new Setup;
    LoadOptions options;
    options.plugin_paths = {KREG_PLUGIN_DIR};
    options.use_env = false;
    options.use_default_dirs = false;
    absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
    if (!registry.ok()) {
      s->status = registry.status();
      return s;
    }
    s->registry = *std::move(registry);
    std::shared_ptr<const Op> op = *s->registry->GetOp("topk");
    s->kernel = *s->registry->Get("topk/heap");
    absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(
        op, s->registry->Reference("topk"), *op->ParseValues(Dims{{"batch", 1}, {"n", 1024}, {"k", 8}}), {});
    if (!problem.ok()) {
      s->status = problem.status();
      return s;
    }
    s->problem = *std::move(problem);
    return s;
  }();
  return *setup;
}

void BM_KernelRun(benchmark::State& state) {
  Setup& s = TheSetup();
  if (!s.status.ok()) return state.SkipWithError(s.status.ToString().c_str());
  const Config config = s.kernel->DefaultConfig();
  for (auto _ : state) {
    absl::Status ran = s.kernel->Run(config, *s.problem->args());
    benchmark::DoNotOptimize(ran);
  }
}

// A table with one entry: this shape on this machine, won by topk/heap at
// its default configuration.
TuningDb OneEntry(const Setup& s) {
  TuningDb db;
  const OpKey key = s.problem->op().KeyOf(*s.problem->args());
  tuning::Trial trial;
  trial.set_variant("heap");
  trial.set_variant_version(s.kernel->version());
  *trial.mutable_config() = ToProtoConfig(*s.kernel, s.kernel->DefaultConfig());
  trial.set_median_ns(1000);
  trial.set_reps(10);
  trial.set_status(tuning::Trial::OK);
  db.AddMachine(ThisMachine());
  db.AddTrial(MakeProblemKey("topk", key, ThisMachine().id(), ""), trial);
  return db;
}

void BM_DispatcherRun(benchmark::State& state) {
  Setup& s = TheSetup();
  if (!s.status.ok()) return state.SkipWithError(s.status.ToString().c_str());
  const TuningDb db = state.range(0) != 0 ? OneEntry(s) : TuningDb();
  absl::StatusOr<Dispatcher> dispatcher = Dispatcher::Create(*s.registry, db);
  if (!dispatcher.ok()) return state.SkipWithError(dispatcher.status().ToString().c_str());
  absl::StatusOr<DispatchResult> first = dispatcher->Run("topk", *s.problem->args());
  if (!first.ok()) return state.SkipWithError(first.status().ToString().c_str());
  state.SetLabel(absl::StrCat(first->kernel, " ", first->config, " (", MatchName(first->match), ")"));
  for (auto _ : state) {
    absl::StatusOr<DispatchResult> ran = dispatcher->Run("topk", *s.problem->args());
    benchmark::DoNotOptimize(ran);
  }
}

BENCHMARK(BM_KernelRun)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_DispatcherRun)->Arg(1)->Arg(0)->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace kreg

BENCHMARK_MAIN();
