// lut_bench: what the tuning table costs at run time. Lut::Query (exact hit
// and nearest tuned shape) at 100, 1k and 10k entries; loading the topk
// plugin (Registry::LoadPlugin, Registry::Load of the plugin folder); and
// TuningDb::Load and Lut::Build of a 10k-entry table.
//
//   build/release/bin/lut_bench
//   build/release/bin/lut_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
//
// The tables are synthetic: a grid of batch/n/k (the one lut_test uses)
// whose winners cycle through topk/sort, topk/radix and topk/heap with legal
// configurations, so every entry resolves against the build's real plugin.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kreg/lut.h"
#include "kreg/op.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

// Keys and queries use one made-up machine, so the tables do not depend on
// the machine the benchmark runs on.
constexpr char kMachine[] = "00000000deadbeef";
// topk's dtype signature for an f32 input without row ranges (OpKey::dtype).
constexpr char kDType[] = "f32";

// ---- Synthetic tables ---------------------------------------------------------

tuning::Config Param(tuning::Config config, const std::string& name, int64_t value) {
  tuning::ParamValue* p = config.add_params();
  p->set_name(name);
  p->set_int_value(value);
  return config;
}

tuning::Trial Winner(int i) {
  tuning::Trial t;
  t.set_variant_version(1);
  switch (i % 3) {
    case 0: {
      t.set_variant("sort");
      tuning::ParamValue* p = t.mutable_config()->add_params();
      p->set_name("method");
      p->set_choice("nth_element");
      break;
    }
    case 1:
      t.set_variant("radix");
      *t.mutable_config() =
          Param(Param(Param({}, "first_bits", 11), "round_bits", 8), "capacity", 4096);
      break;
    default:
      t.set_variant("heap");  // no parameters
      break;
  }
  t.set_median_ns(1000 + i);
  t.set_min_ns(900 + i);
  t.set_max_ns(1200 + i);
  t.set_reps(10);
  t.set_status(tuning::Trial::OK);
  t.set_measured_at(1700000000);
  return t;
}

// A table of `size` entries (100, 1000 or 10000; anything else gets 10000) on a grid
// spanning the same range whatever its size: batch 1..512 in powers of two,
// n 1000..1.5M, k 1..73. Also returns the tuned shapes, for exact queries.
struct Table {
  TuningDb db;
  std::vector<Dims> tuned;
};

Table MakeTable(int size) {
  int nb = 10, nn = 40, nk = 25;  // 10k, as in lut_test
  if (size == 1000) nb = nn = nk = 10;
  if (size == 100) nb = 4, nn = nk = 5;
  Table t;
  t.db.AddMachine(ThisMachine());
  for (int b = 0; b < nb; ++b) {
    for (int n = 0; n < nn; ++n) {
      for (int k = 0; k < nk; ++k) {
        const int64_t batch = int64_t{1} << (b * 10 / nb);
        const int64_t m = n * 40 / nn;
        const int64_t len = 1000 + 997 * m * m;
        const int64_t kk = 1 + 3 * (k * 25 / nk);
        Dims dims = {{"batch", batch}, {"n", len}, {"k", kk}};
        t.db.AddTrial(MakeProblemKey("topk", kDType, dims, kMachine),
                      Winner(static_cast<int>(t.tuned.size())));
        t.tuned.push_back(std::move(dims));
      }
    }
  }
  return t;
}

// Random shapes in the same range; the whole shape rarely lands on the grid
// (RunQueries fails the benchmark if one does).
std::vector<Dims> Untuned(int count) {
  std::vector<Dims> out;
  std::mt19937 rng(1);
  for (int i = 0; i < count; ++i) {
    out.push_back({{"batch", 1 + static_cast<int64_t>(rng() % 600)},
                   {"n", 1000 + static_cast<int64_t>(rng() % 1500000)},
                   {"k", 1 + static_cast<int64_t>(rng() % 75)}});
  }
  return out;
}

std::string PluginDir() { return KREG_PLUGIN_DIR; }

// Plugins stay mapped once loaded (the registry opens them RTLD_NODELETE),
// so a load that is a real dlopen() needs a file this process has not
// opened: a copy under a fresh name, made untimed.
class FreshCopies {
 public:
  FreshCopies() : dir_(std::filesystem::temp_directory_path() / absl::StrCat("kreg_lut_bench_plugins_", getpid())) {}
  ~FreshCopies() { std::filesystem::remove_all(dir_); }
  // A new folder holding copies of `files`.
  std::string Next(const std::vector<std::filesystem::path>& files) {
    static int next = 0;  // never a name this process opened
    const std::filesystem::path dir = dir_ / std::to_string(next++);
    std::filesystem::create_directories(dir);
    for (const auto& f : files) std::filesystem::copy_file(f, dir / f.filename());
    return dir.string();
  }

 private:
  std::filesystem::path dir_;
};

Registry& SharedRegistry() {
  static Registry* registry = [] {
    LoadOptions options;
    options.plugin_paths = {PluginDir()};
    options.use_env = false;
    options.use_default_dirs = false;
    absl::StatusOr<std::unique_ptr<Registry>> r = Registry::Load(options);
    if (!r.ok()) {
      std::fprintf(stderr, "lut_bench: %s\n", r.status().ToString().c_str());
      std::exit(1);
    }
    return r->release();
  }();
  return *registry;
}

struct Built {
  Table table;
  std::unique_ptr<Lut> lut;
  absl::Status status;
};

// The Lut of a table of `size` entries, built once per size.
Built& GetBuilt(int size) {
  static auto* built = new std::map<int, Built>;
  auto [it, inserted] = built->try_emplace(size);
  Built& b = it->second;
  if (!inserted) return b;
  b.table = MakeTable(size);
  absl::StatusOr<Lut> lut = Lut::Build(b.table.db, SharedRegistry());
  if (!lut.ok()) {
    b.status = lut.status();
  } else if (lut->size() != b.table.tuned.size()) {
    // An entry that does not resolve (e.g. topk/heap on a CPU without AVX2)
    // would make this a smaller table than it says.
    b.status = absl::FailedPreconditionError(
        absl::StrCat("only ", lut->size(), " of ", b.table.tuned.size(), " entries resolve"));
  } else {
    b.lut = std::make_unique<Lut>(*std::move(lut));
  }
  return b;
}

// Asks each of `queries` in turn. Like a caller that builds its shape just
// before asking, the query is one Dims object filled in place from a flat,
// sequentially read array, so what is timed is the table's side: cycling
// through the keys keeps the table cold, not the question.
void RunQueries(benchmark::State& state, const std::vector<Dims>& queries, const Lut& lut,
                Match want) {
  std::vector<int64_t> flat;
  for (const Dims& d : queries) {
    for (const auto& dim : d) flat.push_back(dim.second);
  }
  Dims q = queries[0];
  const size_t width = q.size();
  size_t i = 0;
  for (auto _ : state) {
    for (size_t j = 0; j < width; ++j) q[j].second = flat[i * width + j];
    absl::StatusOr<LutAnswer> a = lut.Query("topk", kDType, q, kMachine);
    if (!a.ok() || a->match != want) {
      state.SkipWithError(absl::StrCat("unexpected answer for ", DimsString(q)).c_str());
      break;
    }
    benchmark::DoNotOptimize(a->kernel);
    if (++i == queries.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}

// ---- Queries ----------------------------------------------------------------------

// A tuned shape, cycling through every entry so the hash table is not all in
// L1.
void BM_QueryExact(benchmark::State& state) {
  Built& b = GetBuilt(static_cast<int>(state.range(0)));
  if (!b.status.ok()) return state.SkipWithError(b.status.ToString().c_str());
  RunQueries(state, b.table.tuned, *b.lut, Match::kExact);
}

// One tuned shape asked again and again: the lookup alone, its key and the
// query's strings hot in cache. The gap to BM_QueryExact is what cycling
// through every key costs (cache and branch-predictor misses).
void BM_QueryExactSameShape(benchmark::State& state) {
  Built& b = GetBuilt(static_cast<int>(state.range(0)));
  if (!b.status.ok()) return state.SkipWithError(b.status.ToString().c_str());
  const std::vector<Dims> one = {b.table.tuned[b.table.tuned.size() / 2]};
  RunQueries(state, one, *b.lut, Match::kExact);
}

// An untuned shape: answered by the nearest tuned one.
void BM_QueryNearest(benchmark::State& state) {
  Built& b = GetBuilt(static_cast<int>(state.range(0)));
  if (!b.status.ok()) return state.SkipWithError(b.status.ToString().c_str());
  static const std::vector<Dims>* untuned = new std::vector<Dims>(Untuned(1000));
  RunQueries(state, *untuned, *b.lut, Match::kNearest);
}

// ---- Loading ----------------------------------------------------------------------

// A 10k-entry table saved to a temporary file, removed at exit.
const std::string& TablePath() {
  static const std::string* path = [] {
    auto* p = new std::string(
        (std::filesystem::temp_directory_path() / absl::StrCat("kreg_lut_bench_", getpid(), ".kdb"))
            .string());
    if (absl::Status s = MakeTable(10000).db.Save(*p); !s.ok()) {
      std::fprintf(stderr, "lut_bench: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove(*path, ec);
      std::filesystem::remove(*path + ".lock", ec);
    });
    return p;
  }();
  return *path;
}

void BM_TuningDbLoad(benchmark::State& state) {
  const std::string& path = TablePath();
  for (auto _ : state) {
    absl::StatusOr<TuningDb> db = TuningDb::Load(path);
    if (!db.ok()) return state.SkipWithError(db.status().ToString().c_str());
    benchmark::DoNotOptimize(db->size());
  }
  state.counters["file_bytes"] = static_cast<double>(std::filesystem::file_size(path));
}

void BM_LutBuild(benchmark::State& state) {
  absl::StatusOr<TuningDb> db = TuningDb::Load(TablePath());
  if (!db.ok()) return state.SkipWithError(db.status().ToString().c_str());
  for (auto _ : state) {
    absl::StatusOr<Lut> lut = Lut::Build(*db, SharedRegistry());
    if (!lut.ok()) return state.SkipWithError(lut.status().ToString().c_str());
    benchmark::DoNotOptimize(lut->size());
  }
}

// One plugin, never loaded before, into a fresh registry.
void BM_RegistryLoadPlugin(benchmark::State& state) {
  FreshCopies copies;
  for (auto _ : state) {
    state.PauseTiming();
    const std::string path = copies.Next({PluginDir() + "/kreg_topk.so"}) + "/kreg_topk.so";
    auto registry = std::make_unique<Registry>();
    state.ResumeTiming();
    if (absl::Status s = registry->LoadPlugin(path); !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
  }
}

// What a program's first call does: list the folder, load every plugin in it.
void BM_RegistryLoadFolder(benchmark::State& state) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(PluginDir())) {
    if (e.path().extension() == ".so") files.push_back(e.path());
  }
  FreshCopies copies;
  LoadOptions options;
  options.use_env = false;
  options.use_default_dirs = false;
  for (auto _ : state) {
    state.PauseTiming();
    options.plugin_paths = {copies.Next(files)};
    state.ResumeTiming();
    absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Load(options);
    if (!registry.ok()) return state.SkipWithError(registry.status().ToString().c_str());
  }
}

// Each load maps a new copy for the rest of the process: few iterations.
BENCHMARK(BM_RegistryLoadPlugin)->Iterations(100)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RegistryLoadFolder)->Iterations(20)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TuningDbLoad)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LutBuild)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_QueryExact)->Arg(100)->Arg(1000)->Arg(10000)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_QueryExactSameShape)->Arg(10000)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_QueryNearest)->Arg(100)->Arg(1000)->Arg(10000)->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace kreg

BENCHMARK_MAIN();
