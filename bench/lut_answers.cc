// lut_answers: prints what loads and Lut queries answer, every field, for
// many questions over synthetic and shipped tables, so a change to the
// Lut's index, its search or the table reader can be checked to change no
// answer: run it with the build before and after and compare the outputs
// byte for byte.
//
//   build/release/bin/lut_answers > /tmp/after.txt
//   cmp /tmp/before.txt /tmp/after.txt
//
// Tables: lut_bench's grid (100 and 10k entries, one winner each); random
// tables of topk entries with several trials (thread counts, stale versions,
// configurations illegal for some shapes, data classes, two machines); each
// shipped table, and the shipped entries copied to many perturbed shapes (so
// every op's groups grow past a k-d tree leaf). Each is saved and loaded back
// (binary and text); cut and flipped copies of the binary are loaded too.
// Questions: every tuned shape, random shapes in and out of the tuned range,
// edge shapes (0, 1, huge, k > n), on the table's machines, this machine and
// an unknown one, with and without threads and data classes.
#include <unistd.h>

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/lut.h"
#include "kreg/op.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

FILE* out = stdout;

uint64_t Fnv(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string Temp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / absl::StrCat("kreg_lut_answers_", getpid(), "_", name))
      .string();
}

Registry& SharedRegistry() {
  static Registry* registry = [] {
    LoadOptions options;
    options.plugin_paths = {KREG_PLUGIN_DIR};
    options.use_env = false;
    options.use_default_dirs = false;
    absl::StatusOr<std::unique_ptr<Registry>> r = Registry::Load(options);
    if (!r.ok()) {
      std::fprintf(stderr, "lut_answers: %s\n", r.status().ToString().c_str());
      std::exit(1);
    }
    return r->release();
  }();
  return *registry;
}

// ---- Printing ------------------------------------------------------------------

void PrintAnswer(const absl::StatusOr<LutAnswer>& a) {
  if (!a.ok()) {
    std::fprintf(out, "  error %s\n", a.status().ToString().c_str());
    return;
  }
  std::fprintf(out, "  %s %s [%s] dist=%.9g threads=%d incomplete=%d table=%s\n",
               std::string(MatchName(a->match)).c_str(),
               a->kernel != nullptr ? a->kernel->name().c_str() : "-",
               a->kernel != nullptr && a->config != nullptr ? a->kernel->ConfigString(*a->config).c_str() : "-",
               a->distance, a->threads, a->incomplete ? 1 : 0, std::string(a->table).c_str());
  if (a->tuned_dims != nullptr) std::fprintf(out, "  tuned %s\n", DimsString(*a->tuned_dims).c_str());
  if (a->trial != nullptr) {
    std::fprintf(out, "  trial %s median=%.9g reps=%" PRId64 "\n", TrialId(*a->trial).c_str(),
                 a->trial->median_ns(), static_cast<int64_t>(a->trial->reps()));
  }
  if (a->machine != nullptr) std::fprintf(out, "  machine %s\n", a->machine->id().c_str());
  if (!a->why.empty()) std::fprintf(out, "  why %s\n", a->why.c_str());
  for (const std::string& w : a->warnings) std::fprintf(out, "  warning %s\n", w.c_str());
}

void Ask(const Lut& lut, const std::string& op, const std::string& dtype, const Dims& dims,
         const std::string& machine, const std::string& data_class = "", int threads = 0) {
  std::fprintf(out, "Q %s %s %s @%s [%s] t=%d\n", op.c_str(), dtype.c_str(), DimsString(dims).c_str(),
               machine.c_str(), data_class.c_str(), threads);
  PrintAnswer(lut.Query(op, dtype, dims, machine, data_class, threads));
}

void PrintDb(const std::string& name, const TuningDb& db) {
  std::fprintf(out, "DB %s entries=%zu text=%016" PRIx64 " binary=%016" PRIx64 " csv=%016" PRIx64
               " summary=%016" PRIx64 " unchecked=%s\n",
               name.c_str(), db.size(), Fnv(db.ToText()), Fnv(db.ToBinary()), Fnv(db.ToCsv()),
               Fnv(db.Summary()), db.unchecked().c_str());
}

// Saves `db` (binary and text), loads both back and prints them, loads cut
// and flipped copies of the binary, and returns the binary one loaded.
TuningDb RoundTrip(const std::string& name, const TuningDb& db) {
  const std::string bin = Temp(name + ".kdb"), text = Temp(name + ".txtpb");
  if (absl::Status s = db.Save(bin); !s.ok()) std::fprintf(out, "save %s\n", s.ToString().c_str());
  if (absl::Status s = db.Save(text); !s.ok()) std::fprintf(out, "save %s\n", s.ToString().c_str());
  absl::StatusOr<TuningDb> loaded = TuningDb::Load(bin);
  absl::StatusOr<TuningDb> loaded_text = TuningDb::Load(text);
  if (!loaded.ok() || !loaded_text.ok()) {
    std::fprintf(stderr, "lut_answers: %s: cannot load back\n", name.c_str());
    std::exit(1);
  }
  PrintDb(name + " binary", *loaded);
  PrintDb(name + " text", *loaded_text);
  std::ifstream in(bin, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::mt19937 rng(7);
  for (int i = 0; i < 6; ++i) {
    std::string bad = bytes;
    if (i % 2 == 0) {
      bad.resize(rng() % bad.size());
    } else {
      bad[rng() % bad.size()] ^= static_cast<char>(1 << (rng() % 8));
    }
    absl::StatusOr<TuningDb> b = TuningDb::Parse(bad, "bad");
    std::fprintf(out, "bad %d: %s\n", i, b.ok() ? "loaded" : b.status().ToString().c_str());
    if (b.ok()) PrintDb("bad", *b);
  }
  std::filesystem::remove(bin);
  std::filesystem::remove(text);
  std::filesystem::remove(bin + ".lock");
  std::filesystem::remove(text + ".lock");
  return *std::move(loaded);
}

std::unique_ptr<Lut> Build(const std::string& name, const TuningDb& db, MachinePolicy policy) {
  LutOptions options;
  options.machines = policy;
  absl::StatusOr<Lut> lut = Lut::Build(db, SharedRegistry(), options);
  std::fprintf(out, "LUT %s policy=%d: %s\n", name.c_str(), static_cast<int>(policy),
               lut.ok() ? absl::StrCat("size ", lut->size()).c_str() : lut.status().ToString().c_str());
  if (!lut.ok()) return nullptr;
  for (const std::string& w : lut->warnings()) std::fprintf(out, "  warning %s\n", w.c_str());
  return std::make_unique<Lut>(*std::move(lut));
}

// ---- Tables --------------------------------------------------------------------

constexpr char kMachine[] = "00000000deadbeef";

tuning::Trial MakeTrial(int variant, int config, double median, int threads, uint32_t version) {
  tuning::Trial t;
  t.set_variant_version(version);
  switch (variant % 3) {
    case 0: {
      t.set_variant("sort");
      tuning::ParamValue* p = t.mutable_config()->add_params();
      p->set_name("method");
      p->set_choice(config % 2 == 0 ? "nth_element" : "partial_sort");
      break;
    }
    case 1: {
      static const int64_t kConfigs[][3] = {{11, 8, 4096}, {12, 4, 1024}, {11, 4, 16384}, {12, 8, 16384}};
      static const char* const kNames[] = {"first_bits", "round_bits", "capacity"};
      for (int i = 0; i < 3; ++i) {
        tuning::ParamValue* p = t.mutable_config()->add_params();
        p->set_name(kNames[i]);
        p->set_int_value(kConfigs[config % 4][i]);
      }
      t.set_variant("radix");
      break;
    }
    default:
      t.set_variant("heap");
      break;
  }
  t.set_median_ns(median);
  t.set_min_ns(median * 0.9);
  t.set_max_ns(median * 1.2);
  t.set_reps(10);
  t.set_threads(threads);
  t.set_status(tuning::Trial::OK);
  t.set_measured_at(1700000000);
  return t;
}

// lut_bench's grid: one winner per entry.
TuningDb GridTable(int size, std::vector<Dims>* tuned) {
  int nb = 10, nn = 40, nk = 25;
  if (size == 100) nb = 4, nn = nk = 5;
  TuningDb db;
  db.AddMachine(ThisMachine());
  for (int b = 0; b < nb; ++b) {
    for (int n = 0; n < nn; ++n) {
      for (int k = 0; k < nk; ++k) {
        const int64_t m = n * 40 / nn;
        Dims dims = {{"batch", int64_t{1} << (b * 10 / nb)}, {"n", 1000 + 997 * m * m}, {"k", 1 + 3 * (k * 25 / nk)}};
        const int i = static_cast<int>(tuned->size());
        db.AddTrial(MakeProblemKey("topk", "f32", dims, kMachine), MakeTrial(i, 0, 1000 + i, 0, 1));
        tuned->push_back(std::move(dims));
      }
    }
  }
  return db;
}

tuning::Machine OtherMachine() {
  tuning::Machine m = ThisMachine();
  m.clear_id();
  m.set_cores(m.cores() * 2);
  return m;
}

// Random entries with several trials each, on this machine and another.
TuningDb RandomTable(int size, uint32_t seed, std::vector<Dims>* tuned) {
  std::mt19937 rng(seed);
  TuningDb db;
  db.AddMachine(ThisMachine());
  tuning::Machine other = OtherMachine();
  db.AddMachine(other);
  const std::string other_id = FingerprintId(other);
  for (int i = 0; i < size; ++i) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 2000000);
    Dims dims = {{"batch", 1 + static_cast<int64_t>(rng() % 512)}, {"n", n},
                 {"k", 1 + static_cast<int64_t>(rng() % std::min<int64_t>(n, 4096))}};
    if (rng() % 4 == 0) dims[0].second = int64_t{1} << (rng() % 10);  // planes, as a grid has
    const std::string machine = rng() % 5 == 0 ? other_id : ThisMachine().id();
    const std::string data_class = rng() % 7 == 0 ? "dist=ties" : "";
    const tuning::ProblemKey key = MakeProblemKey("topk", "f32", dims, machine, data_class);
    const int trials = 1 + static_cast<int>(rng() % 6);
    for (int t = 0; t < trials; ++t) {
      const int threads = rng() % 3 == 0 ? static_cast<int>(rng() % 3) : 0;
      const uint32_t version = rng() % 23 == 0 ? 99 : 1;
      db.AddTrial(key, MakeTrial(static_cast<int>(rng()), static_cast<int>(rng()),
                                 500 + static_cast<double>(rng() % 100000), threads, version));
    }
    if (rng() % 11 == 0) db.SetTuningInfo(key, "x", "halving", 1700000000, false);
    tuned->push_back(std::move(dims));
  }
  return db;
}

// The shipped entries, and copies of them at perturbed shapes.
TuningDb Blown(const TuningDb& shipped, int copies, std::mt19937* rng) {
  TuningDb db = shipped;
  for (const tuning::Entry& e : shipped.proto().entries()) {
    for (int c = 0; c < copies; ++c) {
      tuning::ProblemKey key = e.key();
      for (tuning::Dim& d : *key.mutable_dims()) {
        if ((*rng)() % 3 == 0) continue;
        const double f = std::exp2(static_cast<double>((*rng)() % 2001) / 250.0 - 4.0);
        d.set_value(std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(d.value()) * f)));
      }
      for (const tuning::Trial& t : e.trials()) db.AddTrial(key, t);
    }
  }
  return db;
}

// ---- Crafted files -------------------------------------------------------------

// `db` as a binary file holds it: serialized, then the checksum trailer.
std::string WithChecksum(const tuning::Database& db) {
  std::string bytes = db.SerializeAsString();
  const uint64_t sum = Fnv(bytes);
  bytes.append("\x81\x01", 2);
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((sum >> (8 * i)) & 0xff));
  return bytes;
}

// Files a TuningDb does not write: entries of one key twice (dims in another
// order), a trial twice, winners missing from the trials, schema 1, and
// each number of a trial or machine out of bounds in turn.
void Crafted() {
  tuning::Database db;
  db.set_schema_version(2);
  *db.add_machines() = ThisMachine();
  std::mt19937 rng(3);
  for (int i = 0; i < 40; ++i) {
    const Dims dims = {{"batch", 1 + i % 5}, {"n", 1000 + 10 * (i % 9)}, {"k", 1 + i % 3}};
    tuning::Entry* e = db.add_entries();
    *e->mutable_key() = MakeProblemKey("topk", "f32", i % 2 == 0 ? dims : Dims{dims[2], dims[0], dims[1]},
                                       ThisMachine().id(), i % 6 == 0 ? "dist=ties" : "");
    for (int t = 0; t < 3; ++t) {
      tuning::Trial trial = MakeTrial(static_cast<int>(rng()), static_cast<int>(rng() % 2),
                                      500 + static_cast<double>(rng() % 1000), 0, 1);
      trial.set_measured_at(1700000000 + static_cast<int64_t>(rng() % 3));
      *e->add_trials() = trial;
    }
    if (i % 4 == 0) *e->mutable_best() = MakeTrial(1, 1, 400, 0, 1);
    if (i % 5 == 0) *e->mutable_runner_up() = MakeTrial(0, 0, 450, 2, 1);
    if (i % 7 == 0) e->clear_trials();
    e->set_tuned_at(1700000000 + i % 4);
    e->set_incomplete(i % 3 == 0);
  }
  db.set_entry_count(static_cast<uint64_t>(db.entries_size()));
  auto load = [&](const std::string& name, const tuning::Database& d) {
    absl::StatusOr<TuningDb> loaded = TuningDb::Parse(WithChecksum(d), name);
    std::fprintf(out, "crafted %s: %s\n", name.c_str(), loaded.ok() ? "loaded" : loaded.status().ToString().c_str());
    if (!loaded.ok()) return;
    PrintDb(name, *loaded);
    std::fprintf(out, "%s", loaded->ToText().c_str());
    absl::StatusOr<TuningDb> text = TuningDb::Parse(loaded->ToText(), name + ".txtpb");
    if (text.ok()) PrintDb(name + " text", *text);
  };
  load("crafted", db);
  tuning::Database old = db;
  old.set_schema_version(1);
  load("schema1", old);
  const std::vector<std::pair<std::string, std::function<void(tuning::Database*)>>> hostile = {
      {"threads", [](tuning::Database* d) { d->mutable_entries(3)->mutable_trials(1)->set_threads(-1); }},
      {"threads big", [](tuning::Database* d) { d->mutable_entries(3)->mutable_trials(1)->set_threads(1 << 30); }},
      {"median", [](tuning::Database* d) { d->mutable_entries(5)->mutable_trials(0)->set_median_ns(-1); }},
      {"median nan", [](tuning::Database* d) { d->mutable_entries(5)->mutable_trials(0)->set_median_ns(NAN); }},
      {"min", [](tuning::Database* d) { d->mutable_entries(6)->mutable_trials(2)->set_min_ns(INFINITY); }},
      {"max", [](tuning::Database* d) { d->mutable_entries(6)->mutable_trials(2)->set_max_ns(1e300); }},
      {"iqr", [](tuning::Database* d) { d->mutable_entries(8)->mutable_trials(0)->set_relative_iqr(NAN); }},
      {"reps", [](tuning::Database* d) { d->mutable_entries(9)->mutable_trials(0)->set_reps(-5); }},
      {"best", [](tuning::Database* d) { d->mutable_entries(0)->mutable_best()->set_median_ns(-3); }},
      {"runner_up", [](tuning::Database* d) { d->mutable_entries(0)->mutable_runner_up()->set_reps(-3); }},
      {"partial", [](tuning::Database* d) { d->mutable_entries(1)->add_partial()->set_threads(-2); }},
      {"cores", [](tuning::Database* d) { d->mutable_machines(0)->set_cores(0); }},
      {"no op", [](tuning::Database* d) { d->mutable_entries(2)->mutable_key()->clear_op(); }},
      {"count", [](tuning::Database* d) { d->set_entry_count(3); }},
      {"schema", [](tuning::Database* d) { d->set_schema_version(3); }},
  };
  for (const auto& [name, spoil] : hostile) {
    tuning::Database bad = db;
    spoil(&bad);
    load(name, bad);
  }
}

// ---- Questions -----------------------------------------------------------------

std::vector<Dims> Perturbed(const Dims& dims, int count, std::mt19937* rng) {
  std::vector<Dims> shapes;
  for (int i = 0; i < count; ++i) {
    Dims d = dims;
    for (auto& [name, value] : d) {
      switch ((*rng)() % 8) {
        case 0:
          value = 0;
          break;
        case 1:
          value = 1;
          break;
        case 2:
          value = int64_t{1} << (20 + (*rng)() % 20);
          break;
        default:
          value = std::max<int64_t>(
              1, static_cast<int64_t>(static_cast<double>(value) *
                                      std::exp2(static_cast<double>((*rng)() % 1001) / 125.0 - 4.0)));
      }
    }
    shapes.push_back(std::move(d));
  }
  return shapes;
}

void AskTopk(const Lut& lut, const std::vector<Dims>& tuned, const std::vector<std::string>& machines,
             int random, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < tuned.size(); ++i) {
    Ask(lut, "topk", "f32", tuned[i], machines[i % machines.size()], i % 7 == 0 ? "dist=ties" : "",
        static_cast<int>(i % 3));
  }
  for (int i = 0; i < random; ++i) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 3000000);
    Dims dims = {{"batch", 1 + static_cast<int64_t>(rng() % 700)}, {"n", n},
                 {"k", 1 + static_cast<int64_t>(rng() % std::min<int64_t>(n, 5000))}};
    if (i % 5 == 0) dims = {dims[2], dims[0], dims[1]};  // another order
    if (i % 13 == 0) dims[0].second = int64_t{1} << (rng() % 12);
    const std::string& machine = machines[rng() % machines.size()];
    Ask(lut, "topk", "f32", dims, machine, rng() % 6 == 0 ? "dist=ties" : "", static_cast<int>(rng() % 4));
  }
  const std::vector<Dims> edges = {
      {{"batch", 0}, {"n", 0}, {"k", 0}},
      {{"batch", 1}, {"n", 1}, {"k", 1}},
      {{"batch", 1}, {"n", 10}, {"k", 11}},
      {{"batch", 1 << 30}, {"n", int64_t{1} << 40}, {"k", 1}},
      {{"batch", 4}, {"n", 1000}},
      {{"batch", 4}, {"n", 1000}, {"k", 10}, {"x", 3}},
      {{"batch", -1}, {"n", 1000}, {"k", 10}},
      {{"batch", 4}, {"n", 1000000}, {"k", 1000000}},
  };
  for (const Dims& d : edges) {
    for (const std::string& machine : machines) Ask(lut, "topk", "f32", d, machine);
  }
  Ask(lut, "topk", "bf16", {{"batch", 4}, {"n", 1000}, {"k", 10}}, machines[0]);
  Ask(lut, "nope", "f32", {{"batch", 4}, {"n", 1000}, {"k", 10}}, machines[0]);
}

void AskShipped(const Lut& lut, const TuningDb& db, const std::vector<std::string>& machines, int per_entry,
                uint32_t seed) {
  std::mt19937 rng(seed);
  for (const tuning::Entry& e : db.proto().entries()) {
    const Dims dims = KeyDims(e.key());
    std::vector<Dims> asked = Perturbed(dims, per_entry, &rng);
    asked.insert(asked.begin(), dims);
    for (size_t i = 0; i < asked.size(); ++i) {
      const std::string& machine = i == 0 ? e.key().machine_id() : machines[rng() % machines.size()];
      Ask(lut, e.key().op(), e.key().dtype(), asked[i], machine, e.key().data_class(),
          static_cast<int>(rng() % 3));
    }
  }
}

int Main() {
  Crafted();
  const std::string unknown = "0123456789abcdef";
  const std::string other = FingerprintId(OtherMachine());
  {
    std::vector<Dims> tuned;
    TuningDb db = RoundTrip("grid10k", GridTable(10000, &tuned));
    std::unique_ptr<Lut> lut = Build("grid10k", db, MachinePolicy::kSimilar);
    std::vector<Dims> few(tuned.begin(), tuned.begin() + 2000);
    AskTopk(*lut, few, {kMachine}, 20000, 1);
    AskTopk(*lut, {}, {ThisMachine().id(), unknown}, 200, 2);
  }
  {
    std::vector<Dims> tuned;
    TuningDb db = RoundTrip("grid100", GridTable(100, &tuned));
    std::unique_ptr<Lut> lut = Build("grid100", db, MachinePolicy::kSimilar);
    AskTopk(*lut, tuned, {kMachine}, 2000, 3);
  }
  for (uint32_t seed : {11u, 12u}) {
    const int size = seed == 11 ? 3000 : 150;
    std::vector<Dims> tuned;
    TuningDb db = RoundTrip(absl::StrCat("random", seed), RandomTable(size, seed, &tuned));
    for (MachinePolicy policy : {MachinePolicy::kSimilar, MachinePolicy::kStrict}) {
      std::unique_ptr<Lut> lut = Build(absl::StrCat("random", seed), db, policy);
      AskTopk(*lut, tuned, {ThisMachine().id(), other, unknown}, 6000, seed * 3);
    }
  }
  std::vector<std::string> shipped_warnings;
  TuningDb shipped = ShippedTables(&shipped_warnings);
  for (const std::string& w : shipped_warnings) std::fprintf(out, "shipped warning %s\n", w.c_str());
  std::vector<std::string> machines = {ThisMachine().id(), unknown, other};
  for (const tuning::Machine& m : shipped.proto().machines()) machines.push_back(m.id());
  {
    TuningDb db = RoundTrip("shipped", shipped);
    std::unique_ptr<Lut> lut = Build("shipped", db, MachinePolicy::kSimilar);
    AskShipped(*lut, db, machines, 40, 5);
  }
  {
    std::mt19937 rng(9);
    TuningDb db = RoundTrip("blown", Blown(shipped, 60, &rng));
    std::unique_ptr<Lut> lut = Build("blown", db, MachinePolicy::kSimilar);
    AskShipped(*lut, shipped, machines, 60, 6);
  }
  return 0;
}

}  // namespace
}  // namespace kreg

int main() { return kreg::Main(); }
