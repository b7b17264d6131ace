// The conformance harness. For every op the build's plugins (and the axpy
// and rowsum test plugins) declare, every available kernel other than the
// op's reference is run at every configuration the tuner would search, on
// edge cases built from the op's descriptor alone (dims 0, 1, small odd
// sizes that divide no tile, a mid size, a dim with a default left out or
// given; each float distribution, each dtype, each optional input present
// and absent, each value of a small integer attribute, so each of a
// tensor's shapes), and checked against the reference through the tuner's
// own measurement (outputs poisoned, in-out tensors restored, compared with
// the op's tolerance or bit for bit).
//
// Then what only one op knows: the topk reference pinned on hand-written
// rows, and topk inputs chosen to break particular kernels; the gmm and
// tgmm references pinned on hand-written groups, every gmm and tgmm kernel
// on chosen partitions (empty groups, all empty, m=0, sum below m, one huge
// group among tiny ones, sizes no tile divides, group offsets, a transposed
// rhs, existing_out; normal values and every bit pattern), and their
// validation errors.
//
// Run again under KREG_ISA_MASK=fma (tests/CMakeLists.txt): kernels needing
// AVX2 are skipped, saying so; the portable ones are still checked.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/autotune.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/dispatch.h"
#include "kreg/measure.h"
#include "kreg/op.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "kreg/tensor.h"

namespace kreg {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

const Registry& TheRegistry() {
  static const Registry* registry = [] {
    LoadOptions options;
    options.plugin_paths = {KREG_PLUGIN_DIR, KREG_AXPY_PLUGIN_DIR, KREG_ROWSUM_PLUGIN_DIR};
    // A build carried to another machine (scripts/gpu_check.sh) names its own.
    if (const char* env = std::getenv("KREG_CONFORMANCE_PLUGINS"); env != nullptr && *env != '\0') {
      options.plugin_paths = {env};
    }
    options.use_env = false;
    options.use_default_dirs = false;
    absl::StatusOr<std::unique_ptr<Registry>> r = Registry::Load(options);
    if (!r.ok()) {
      std::cerr << "conformance_test: " << r.status() << "\n";
      std::abort();
    }
    return r->release();
  }();
  return *registry;
}

// Runs composite ops' sub-ops (sharded_matmul's local multiplies): each
// op's untuned default.
const Dispatcher& TheDispatcher() {
  static const Dispatcher* dispatcher = new Dispatcher(*Dispatcher::Create(TheRegistry(), TuningDb()));
  return *dispatcher;
}

// Why this machine cannot run `kernel` (CanRun: the ISA, or a CUDA device).
std::string Why(const Kernel& kernel) {
  const char* mask = std::getenv("KREG_ISA_MASK");
  return absl::StrCat(CanRun(kernel).message(),
                      mask && kernel.device() == 0 ? absl::StrCat(" (KREG_ISA_MASK=", mask, ")") : "");
}

// Whether this machine runs `kernel` here (CPU) or on its GPU (CUDA).
bool Runs(const Kernel& kernel) { return CanRun(kernel).ok(); }

// The GPU device kernels run on, opened once; nullptr without one.
Device* TheDevice() {
  static Device* const device = [] {
    absl::StatusOr<std::unique_ptr<Device>> opened = OpenCuda();
    return opened.ok() ? opened->release() : nullptr;
  }();
  return device;
}

// The parameter choices this CPU cannot run (their configurations are not
// enumerated here), e.g. "micro=avx512 (needs avx512f,...)"; empty if none.
std::string ChoicesNotRun(const Kernel& kernel) {
  std::vector<std::string> out;
  for (const ParamInfo& p : kernel.params().params()) {
    for (size_t i = 0; i < p.choices.size(); ++i) {
      if (p.ChoiceAvailable(static_cast<int64_t>(i), CpuIsa())) continue;
      const uint32_t need = p.choice_isa.empty() ? 0 : p.choice_isa[i];
      out.push_back(absl::StrCat(p.name, "=", p.choices[i], " (needs ", IsaString(need & ~CpuIsa()), ")"));
    }
  }
  return absl::StrJoin(out, ", ");
}

// ---- One problem, every configuration -----------------------------------------

// A problem: named dims and attributes, and how its inputs are made.
struct Case {
  NamedValues values;
  ProblemOptions options;
  // When given: only these configurations (each a kernel's overrides of its
  // default, kept where the kernel accepts it), not the tuner's.
  std::vector<NamedValues> configs;
  std::string Describe() const {
    std::vector<std::string> parts = {absl::StrJoin(values, ",", absl::PairFormatter("="))};
    for (const auto& [name, dtype] : options.dtypes) parts.push_back(absl::StrCat(name, ":", DTypeName(dtype)));
    parts.push_back(absl::StrCat("dist=", DistName(options.dist)));
    if (!options.with.empty()) parts.push_back(absl::StrCat("with=", absl::StrJoin(options.with, "+")));
    if (!options.inputs.empty()) {
      std::vector<std::string> given;
      for (const auto& [name, t] : options.inputs) given.push_back(absl::StrCat(name, t.ShapeString()));
      parts.push_back(absl::StrCat("given=", absl::StrJoin(given, "+")));
    }
    parts.push_back(absl::StrCat("seed=", options.seed));
    return absl::StrJoin(parts, " ");
  }
};

// Problems up to this many elements (inputs and outputs) run every
// configuration; larger ones an evenly spaced sample.
constexpr int64_t kSmallProblem = 4096;
constexpr size_t kLargeProblemConfigs = 200;

int64_t Elements(const Problem& p) {
  int64_t n = 0;
  for (const auto& [name, t] : p.inputs()) n += t->numel();
  for (const auto& [name, t] : p.outputs()) n += t->numel();
  return n;
}

// A parameter of at most this many values among the legal configurations
// is paired with every choice parameter when sampling (see TunerConfigs).
constexpr size_t kFewValues = 8;

// "micro=avx512 mr=12" for each choice parameter of `kernel` (a
// micro-kernel, a SIMD width) and each other parameter in `few`, as
// `config` sets them.
std::vector<std::string> ChoicePairs(const Kernel& kernel, const Config& config, const std::vector<bool>& few) {
  const std::vector<ParamInfo>& params = kernel.params().params();
  const std::vector<std::pair<std::string, std::string>> named = kernel.ConfigPairs(config);
  std::vector<std::string> out;
  for (size_t i = 0; i < named.size(); ++i) {
    if (params[i].kind != KREG_PARAM_CHOICE) continue;
    for (size_t j = 0; j < named.size(); ++j) {
      if (j != i && few[j]) {
        out.push_back(absl::StrCat(named[i].first, "=", named[i].second, " ", named[j].first, "=", named[j].second));
      }
    }
  }
  return out;
}

// The configurations the tuner would search on `problem`: the space
// enumerated on this CPU (lists of up to two values), those the kernel's
// check accepts, the default first when legal. Beyond `max_configs`, an
// evenly spaced sample, the first (the default, when legal) always in it,
// then legal configurations added until each choice of a choice parameter
// has run with each value of every other parameter of few values that a
// legal configuration pairs it with: a sample still runs every
// micro-kernel at every register block and tile.
std::vector<Config> TunerConfigs(const Kernel& kernel, const Problem& problem, size_t max_configs) {
  std::vector<Config> legal;
  // A device kernel's check sees the shapes (its data goes to the device),
  // as the tuner's worker asks it.
  kreg_args shapes = *problem.args();
  if (kernel.device() != 0) shapes.flags |= KREG_ARGS_SHAPE_ONLY;
  for (Config& c : kernel.params().Enumerate(CpuIsa(), problem.values().dims.data(), /*max_list_len=*/2)) {
    if (kernel.Check(c, shapes).ok()) legal.push_back(std::move(c));
  }
  if (legal.size() <= max_configs) return legal;
  std::vector<Config> sample;
  for (size_t i = 0; i < max_configs; ++i) sample.push_back(legal[i * legal.size() / max_configs]);
  std::vector<std::set<std::string>> values(kernel.params().size());
  for (const Config& c : legal) {
    const std::vector<std::pair<std::string, std::string>> named = kernel.ConfigPairs(c);
    for (size_t i = 0; i < named.size(); ++i) values[i].insert(named[i].second);
  }
  std::vector<bool> few(values.size());
  for (size_t i = 0; i < values.size(); ++i) few[i] = values[i].size() <= kFewValues;
  std::set<std::string> covered;
  for (const Config& c : sample) {
    for (std::string& pair : ChoicePairs(kernel, c, few)) covered.insert(std::move(pair));
  }
  for (const Config& c : legal) {
    bool adds = false;
    for (std::string& pair : ChoicePairs(kernel, c, few)) adds |= covered.insert(std::move(pair)).second;
    if (adds) sample.push_back(c);
  }
  return sample;
}

struct Tally {
  int cases = 0;    // problems built and run
  int refused = 0;  // illegal combinations Problem::Make refused
  int runs = 0;     // (problem, configuration) pairs checked
  std::map<std::string, int> choice_runs;  // "micro=avx512": runs with that choice
};

// After each configuration's run: the rank (0 outside collectives), the
// configuration's index and the problem holding its outputs.
using Inspect = std::function<void(int rank, size_t config, const Problem& problem)>;

// Checks one kernel on one problem at every configuration the tuner would
// search (at most `max_configs`; 0: by the problem's size), each run once and
// checked against the reference as MeasureKernel does for the tuner. A
// collective runs on as many thread ranks as its ranks dim says.
void CheckKernel(const Kernel& kernel, const Case& c, Tally& tally, size_t max_configs = 0,
                 const Inspect& inspect = nullptr) {
  SCOPED_TRACE(absl::StrCat(kernel.name(), " on ", c.Describe()));
  const Registry& registry = TheRegistry();
  const Op& op = kernel.op_info();
  absl::StatusOr<Values> values = op.ParseValues(c.values);
  if (!values.ok()) {
    EXPECT_EQ(values.status().code(), absl::StatusCode::kInvalidArgument) << values.status();
    ++tally.refused;
    return;
  }
  // One rank's part (every rank of a collective runs it at once; rank 0
  // keeps the tally).
  auto check = [&](Comm* comm) -> absl::Status {
    const bool first = comm == nullptr || comm->rank() == 0;
    ProblemOptions options = c.options;
    if (comm != nullptr) options.comm = comm->abi();
    absl::StatusOr<std::unique_ptr<Problem>> problem =
        Problem::Make(kernel.op_ptr(), registry.Reference(kernel.op()), *values, options);
    if (!problem.ok()) {
      // An illegal combination (topk: k > n) is refused, and only that.
      EXPECT_EQ(problem.status().code(), absl::StatusCode::kInvalidArgument) << problem.status();
      if (first) ++tally.refused;
      return problem.status();
    }
    if (first) ++tally.cases;
    // The reference's answer first, from pristine inputs (MeasureKernel would
    // compute it only after the candidate ran).
    absl::Status reference = (*problem)->ComputeReference();
    EXPECT_TRUE(reference.ok()) << reference;
    if (!reference.ok()) return reference;
    std::vector<Tensor> inputs;
    for (const auto& [name, t] : (*problem)->inputs()) inputs.push_back(*t);
    const size_t most = max_configs != 0                           ? max_configs
                        : Elements(**problem) <= kSmallProblem ? SIZE_MAX
                                                               : kLargeProblemConfigs;
    std::vector<Config> configs;
    if (c.configs.empty()) {
      configs = TunerConfigs(kernel, **problem, most);
    } else {
      for (const NamedValues& overrides : c.configs) {
        absl::StatusOr<Config> config = kernel.ParseConfig(overrides);
        EXPECT_TRUE(config.ok()) << config.status();
        if (config.ok() && kernel.Check(*config, *(*problem)->args()).ok()) configs.push_back(*std::move(config));
      }
    }
    size_t index = 0;
    for (const Config& config : configs) {
      MeasureOptions measure;
      measure.warmup = 0;
      measure.reps = 1;
      measure.check = true;
      measure.comm = comm;
      measure.device = kernel.device() != 0 ? TheDevice() : nullptr;
      measure.run.dispatch = [](absl::string_view sub_op, const kreg_args& args) {
        return TheDispatcher().Run(sub_op, args).status();
      };
      Measurement m = MeasureKernel(kernel, config, {problem->get()}, measure);
      EXPECT_EQ(m.status, TrialStatus::kOk)
          << "[" << kernel.ConfigString(config) << "] " << TrialStatusName(m.status) << ": " << m.error;
      if (first) {
        ++tally.runs;
        const std::vector<std::pair<std::string, std::string>> named = kernel.ConfigPairs(config);
        for (size_t i = 0; i < named.size(); ++i) {
          if (kernel.params().params()[i].kind == KREG_PARAM_CHOICE) {
            ++tally.choice_runs[absl::StrCat(named[i].first, "=", named[i].second)];
          }
        }
      }
      if (inspect) inspect(comm != nullptr ? comm->rank() : 0, index, **problem);
      ++index;
    }
    // Read-only inputs are left as they were (in-out tensors are restored
    // from their initial contents, which inputs() shows).
    size_t i = 0;
    for (const auto& [name, t] : (*problem)->inputs()) {
      EXPECT_EQ(std::memcmp(t->data(), inputs[i].data(), t->nbytes()), 0) << "input " << name << " was written";
      ++i;
    }
    return absl::OkStatus();
  };
  if (!op.collective()) {
    (void)check(nullptr);
    return;
  }
  CommOptions comm_options;
  comm_options.timeout_seconds = 60;
  if (op.uses_mesh()) {  // the mesh from the axes' values: x=2,y=1
    for (size_t i = 0; i < op.dims().size(); ++i) {
      if (op.dims()[i].mesh_axis) comm_options.mesh.emplace_back(op.dims()[i].name, values->dims[i]);
    }
    if (absl::Status s = op.SetMesh(&*values, comm_options.mesh); !s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      ++tally.refused;
      return;
    }
  }
  (void)RunRanks(ThreadComms(static_cast<int>(values->dims[op.ranks_dim()]), comm_options),
                 [&](Comm& comm) { return check(&comm); });
}

// ---- Edge cases from an op's descriptor -----------------------------------------

// In an edge shape: a dim left out, to take its default_dim's value (or the
// one the host derives).
constexpr int64_t kLeftOut = -1;

// Collective ops run on 1 to 8 thread ranks: an edge value v of the ranks
// dim stands for 1 + v % 8 ranks (0 -> 1, 1 -> 2, 3 -> 4, 7 -> 8, 33 -> 2);
// on a mesh, each axis has 1 + v % 2 ranks, the ranks dim and derived
// dims are left out (the host sets them), and a dim that a derived dim
// divides is made even, so the axes divide it.
int64_t EdgeValue(const Op& op, size_t dim, int64_t v) {
  const DimInfo& d = op.dims()[dim];
  if (v < 0 || d.numerator >= 0) return d.numerator >= 0 ? kLeftOut : v;
  if (d.mesh_axis) return 1 + v % 2;
  for (const DimInfo& other : op.dims()) {
    if (other.numerator == static_cast<int>(dim)) return v + (v & 1);
  }
  if (static_cast<int>(dim) == op.ranks_dim()) return op.uses_mesh() ? kLeftOut : 1 + v % 8;
  return v;
}

// The largest rank of the op's tensors, in any of their shapes.
size_t MaxRank(const Op& op) {
  size_t rank = 1;
  for (const TensorInfo& t : op.tensors()) rank = std::max({rank, t.shape.size(), t.alt_shape.size()});
  return rank;
}

// Dim assignments: all 0, all 1, all 3 / 7 / 33 (odd: they divide no tile),
// those three rotated over the dims, each dim 0 alone (the rest 7), and a mid
// size rotated likewise (its largest tensor about 20000 elements). A dim
// with a default is left out (kLeftOut) but where it is the dim set to 0 and
// in the rotations. Clamped to each dim's limit, without repeats.
std::vector<std::vector<int64_t>> EdgeShapes(const Op& op) {
  const size_t nd = op.dims().size();
  std::vector<std::vector<int64_t>> shapes;
  auto add = [&](std::vector<int64_t> s) {
    for (size_t i = 0; i < nd; ++i) s[i] = EdgeValue(op, i, s[i] < 0 ? s[i] : std::min(s[i], op.dims()[i].max));
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(std::move(s));
  };
  // Every dim `v`, those with a default left out.
  auto all = [&](int64_t v) {
    std::vector<int64_t> s(nd, v);
    for (size_t i = 0; i < nd; ++i) {
      if (op.dims()[i].default_dim >= 0) s[i] = kLeftOut;
    }
    return s;
  };
  auto rotations = [&](const std::vector<int64_t>& sizes) {
    for (size_t r = 0; r < sizes.size(); ++r) {
      std::vector<int64_t> s(nd);
      for (size_t i = 0; i < nd; ++i) s[i] = sizes[(i + r) % sizes.size()];
      add(s);
    }
  };
  add(all(0));
  add(all(1));
  for (int64_t v : {3, 7, 33}) add(all(v));
  rotations({3, 7, 33});
  for (size_t z = 0; z < nd; ++z) {
    std::vector<int64_t> s = all(7);
    s[z] = 0;
    add(s);
  }
  const int64_t mid = static_cast<int64_t>(std::pow(20000.0, 1.0 / static_cast<double>(MaxRank(op)))) | 1;
  rotations({mid, (mid / 3) | 1, (mid / 17) | 1});
  return shapes;
}

// Every assignment of dtypes to the tensors whose dtype is a free choice.
std::vector<std::map<std::string, DType>> DtypeChoices(const Op& op) {
  std::vector<std::map<std::string, DType>> out = {{}};
  for (const TensorInfo& t : op.tensors()) {
    if (!t.free_dtype()) continue;
    std::vector<std::map<std::string, DType>> next;
    for (const auto& m : out) {
      for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) {
        if (!(t.dtypes & DTypeBit(dt))) continue;
        auto copy = m;
        copy[t.name] = dt;
        next.push_back(std::move(copy));
      }
    }
    out = std::move(next);
  }
  return out;
}

// Every combination of values of the integer attributes whose range is small
// (at most 4 values); the others keep their defaults.
std::vector<NamedValues> AttrChoices(const Op& op) {
  std::vector<NamedValues> out = {{}};
  for (const AttrInfo& a : op.attrs()) {
    if (a.is_float || a.max.i - a.min.i > 3) continue;
    std::vector<NamedValues> next;
    for (const NamedValues& m : out) {
      for (int64_t v = a.min.i; v <= a.max.i; ++v) {
        NamedValues copy = m;
        copy.emplace_back(a.name, absl::StrCat(v));
        next.push_back(std::move(copy));
      }
    }
    out = std::move(next);
  }
  return out;
}

// Every subset of the optional inputs (just none and all beyond three).
std::vector<std::set<std::string>> OptionalSubsets(const Op& op) {
  std::vector<std::string> optional;
  for (const TensorInfo& t : op.tensors()) {
    if (t.optional && t.is_input()) optional.push_back(t.name);
  }
  std::vector<std::set<std::string>> out;
  if (optional.size() > 3) {
    out.push_back({});
    out.emplace_back(optional.begin(), optional.end());
    return out;
  }
  for (size_t bits = 0; bits < (size_t{1} << optional.size()); ++bits) {
    std::set<std::string> s;
    for (size_t i = 0; i < optional.size(); ++i) {
      if (bits & (size_t{1} << i)) s.insert(optional[i]);
    }
    out.push_back(std::move(s));
  }
  return out;
}

bool HasRandomFloatInput(const Op& op) {
  for (const TensorInfo& t : op.tensors()) {
    if (t.is_input() && t.gen == KREG_GEN_VALUES && (t.dtypes & (KREG_DTYPE_F32 | KREG_DTYPE_BF16))) return true;
  }
  return false;
}

// The named edge cases of `op`: for each edge shape, each dtype choice and
// each small-attribute choice, every distribution (without optional inputs),
// every non-empty set of optional inputs (normal values), and all optional
// inputs with every bit pattern.
std::vector<Case> EdgeCases(const Op& op) {
  std::vector<Dist> dists = {Dist::kNormal};
  if (HasRandomFloatInput(op)) dists = {Dist::kNormal, Dist::kUniform, Dist::kBits, Dist::kTies};
  const std::vector<std::set<std::string>> subsets = OptionalSubsets(op);
  std::vector<Case> cases;
  uint64_t seed = 1;
  for (const std::vector<int64_t>& shape : EdgeShapes(op)) {
    for (const auto& dtypes : DtypeChoices(op)) {
      for (const NamedValues& attrs : AttrChoices(op)) {
        auto add = [&](Dist dist, const std::set<std::string>& with) {
          Case c;
          for (size_t i = 0; i < shape.size(); ++i) {
            if (shape[i] != kLeftOut) c.values.emplace_back(op.dims()[i].name, absl::StrCat(shape[i]));
          }
          c.values.insert(c.values.end(), attrs.begin(), attrs.end());
          c.options.dtypes = dtypes;
          c.options.dist = dist;
          c.options.with = with;
          c.options.seed = seed++;
          cases.push_back(std::move(c));
        };
        for (Dist d : dists) add(d, {});
        for (const auto& with : subsets) {
          if (!with.empty()) add(Dist::kNormal, with);
        }
        if (subsets.size() > 1) add(dists.back() == Dist::kNormal ? Dist::kNormal : Dist::kBits, subsets.back());
      }
    }
  }
  return cases;
}

// ---- Every kernel of every op ---------------------------------------------------------

std::vector<std::string> NonReferenceKernels() {
  std::vector<std::string> names;
  for (const auto& k : TheRegistry().Kernels()) {
    if (!k->is_reference()) names.push_back(k->name());
  }
  return names;
}

std::string TestName(const ::testing::TestParamInfo<std::string>& p) {
  std::string name = p.param;
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

TEST(ConformanceSuiteTest, EveryOpHasAReferenceAndKernelsToCheck) {
  EXPECT_TRUE(TheRegistry().refusals().empty()) << TheRegistry().refusals()[0];
  std::vector<std::string> ops;
  for (const auto& op : TheRegistry().Ops()) {
    ops.push_back(op->name());
    SCOPED_TRACE(op->name());
    std::shared_ptr<const Kernel> reference = TheRegistry().Reference(op->name());
    ASSERT_NE(reference, nullptr);
    EXPECT_TRUE(reference->available()) << Why(*reference);
    size_t others = 0;
    for (const auto& k : TheRegistry().Kernels(op->name())) others += !k->is_reference();
    EXPECT_GT(others, 0u);
    EXPECT_GE(EdgeCases(*op).size(), 20u);
  }
  EXPECT_THAT(ops, ::testing::IsSupersetOf({"axpy", "gmm", "rowsum", "tgmm", "topk"}));
  EXPECT_GE(NonReferenceKernels().size(), 10u);  // 4 topk, axpy/blocked and the two layouts, rowsum, gmm and tgmm
}

TEST(ConformanceSuiteTest, EdgeCasesAreBuiltFromTheDescriptor) {
  std::shared_ptr<const Op> topk = *TheRegistry().GetOp("topk");
  std::vector<std::vector<int64_t>> shapes = EdgeShapes(*topk);
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(shapes[1], (std::vector<int64_t>{1, 1, 1}));
  EXPECT_NE(std::find(shapes.begin(), shapes.end(), std::vector<int64_t>{7, 33, 3}), shapes.end());
  EXPECT_EQ(DtypeChoices(*topk).size(), 2u);      // input f32 or bf16 (values follow it)
  EXPECT_EQ(AttrChoices(*topk).size(), 2u);       // largest 0 and 1
  EXPECT_EQ(OptionalSubsets(*topk).size(), 4u);   // row_starts, row_ends
  std::shared_ptr<const Op> axpy = *TheRegistry().GetOp("axpy");
  EXPECT_EQ(DtypeChoices(*axpy).size(), 2u);  // x f32 or bf16; out is f32 only
  EXPECT_EQ(AttrChoices(*axpy).size(), 1u);   // alpha is a float: its default
  EXPECT_EQ(OptionalSubsets(*axpy).size(), 1u);
  // rowsum: dims rows, cols, used (default rows); x's shape follows the
  // attribute transposed.
  std::shared_ptr<const Op> rowsum = *TheRegistry().GetOp("rowsum");
  shapes = EdgeShapes(*rowsum);
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{0, 0, kLeftOut}));
  EXPECT_NE(std::find(shapes.begin(), shapes.end(), std::vector<int64_t>{7, 7, 0}), shapes.end());
  EXPECT_NE(std::find(shapes.begin(), shapes.end(), std::vector<int64_t>{33, 3, 7}), shapes.end());
  EXPECT_EQ(AttrChoices(*rowsum).size(), 2u);  // transposed 0 and 1: both shapes of x
  // gmm: transpose_rhs and constant_weights are drawn (both values);
  // group_offset's range is large, so it keeps its default here and gets
  // chosen cases below (GroupedMatmulTest).
  std::shared_ptr<const Op> gmm = *TheRegistry().GetOp("gmm");
  EXPECT_EQ(AttrChoices(*gmm).size(), 4u);
  EXPECT_EQ(DtypeChoices(*gmm).size(), 4u);  // lhs f32 or bf16, out f32 or bf16
}

// The harness's oracle is the tuner's measurement: a kernel computing the
// wrong answer is reported as such, never as ok.
TEST(ConformanceSuiteTest, TheCheckCatchesAWrongKernel) {
  Registry registry;
  std::vector<absl::Status> refused = registry.LoadPlugins(
      {std::string(KREG_PLUGIN_DIR) + "/kreg_topk.so", std::string(KREG_TEST_PLUGIN_DIR) + "/faulty/test_faulty.so"});
  ASSERT_TRUE(refused.empty()) << refused[0];
  std::shared_ptr<const Kernel> faulty = *registry.Get("topk/faulty");
  std::shared_ptr<const Op> op = *registry.GetOp("topk");
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(op, registry.Reference("topk"), *op->ParseValues(Dims{{"batch", 3}, {"n", 50}, {"k", 5}}), {});
  ASSERT_TRUE(problem.ok()) << problem.status();
  MeasureOptions options;
  options.warmup = 0;
  options.reps = 1;
  Measurement ok = MeasureKernel(*faulty, *faulty->ParseConfig({{"mode", "ok"}}), {problem->get()}, options);
  EXPECT_EQ(ok.status, TrialStatus::kOk) << ok.error;
  Measurement wrong = MeasureKernel(*faulty, *faulty->ParseConfig({{"mode", "wrong"}}), {problem->get()}, options);
  EXPECT_EQ(wrong.status, TrialStatus::kWrongResult);
  EXPECT_THAT(wrong.error, HasSubstr("values[0, 0]"));
}

// Device arguments (KREG_ARGS_ON_DEVICE): their tensors must be CUDA
// tensors, the op's validator sees their shapes only (topk's reads
// row_starts on the host: here it must not touch the fake device pointers),
// and a CPU kernel refuses them.
TEST(DeviceArgsTest, AreValidatedForShapesAndRefusedByCpuKernels) {
  std::shared_ptr<const Op> op = *TheRegistry().GetOp("topk");
  ProblemOptions ragged;
  ragged.with = {"row_starts", "row_ends"};
  absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(
      op, TheRegistry().Reference("topk"), *op->ParseValues(Dims{{"batch", 3}, {"n", 50}, {"k", 5}}), ragged);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const kreg_args& host = *(*problem)->args();
  std::vector<DLTensor> tensors(host.num_tensors);
  std::vector<DLTensor*> pointers(host.num_tensors, nullptr);
  for (size_t i = 0; i < host.num_tensors; ++i) {
    if (host.tensors[i] == nullptr) continue;
    tensors[i] = *host.tensors[i];
    tensors[i].device = {kDLCUDA, 0};
    tensors[i].data = reinterpret_cast<void*>(uintptr_t{0x10});  // never to be read
    pointers[i] = &tensors[i];
  }
  kreg_args device = host;
  device.tensors = pointers.data();
  device.flags = KREG_ARGS_ON_DEVICE;
  EXPECT_TRUE(op->Validate(device).ok()) << op->Validate(device);
  EXPECT_EQ(*op->DataClass(device), "");

  kreg_args cpu_flags = device;  // CUDA tensors, not flagged
  cpu_flags.flags = 0;
  EXPECT_THAT(std::string(op->Validate(cpu_flags).message()), HasSubstr("input is not a CPU tensor"));
  kreg_args host_flagged = host;  // CPU tensors, flagged
  host_flagged.flags = KREG_ARGS_ON_DEVICE;
  EXPECT_THAT(std::string(op->Validate(host_flagged).message()), HasSubstr("input is not a CUDA tensor"));

  std::shared_ptr<const Kernel> heap = *TheRegistry().Get("topk/sort");
  const absl::Status refused = heap->Check(heap->DefaultConfig(), device);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("topk/sort runs on the CPU, not on a device"));
}

class KernelConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::shared_ptr<const Kernel>> kernel = TheRegistry().Get(GetParam());
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    kernel_ = *kernel;
    if (!Runs(*kernel_)) GTEST_SKIP() << Why(*kernel_);
  }
  std::shared_ptr<const Kernel> kernel_;
};

TEST_P(KernelConformanceTest, EdgeCasesOfItsOpAtEveryConfiguration) {
  Tally tally;
  for (const Case& c : EdgeCases(kernel_->op_info())) {
    CheckKernel(*kernel_, c, tally);
    if (HasFatalFailure() || testing::Test::HasFailure()) break;  // one failing case tells enough
  }
  std::cout << kernel_->name() << ": " << tally.cases << " edge cases, " << tally.runs << " checked runs, "
            << tally.refused << " illegal combinations refused\n";
  if (const std::string skipped = ChoicesNotRun(*kernel_); !skipped.empty()) {
    std::cout << kernel_->name() << ": skipped, this CPU lacks their ISA: " << skipped << "\n";
  }
  EXPECT_GE(tally.cases, 20);
  EXPECT_GT(tally.runs, 0);
}

TEST_P(KernelConformanceTest, LargerRandomProblemsSampledConfigurations) {
  // Each dim large in turn (the largest tensor about 200000 elements).
  const Op& op = kernel_->op_info();
  const int64_t big = static_cast<int64_t>(std::pow(200000.0, 1.0 / static_cast<double>(MaxRank(op)))) | 1;
  const std::vector<int64_t> sizes = {big, (big / 5) | 1, (big / 50) | 1};
  Tally tally;
  for (size_t r = 0; r < sizes.size(); ++r) {
    for (const auto& dtypes : DtypeChoices(op)) {
      for (const NamedValues& attrs : AttrChoices(op)) {
        Case c;
        for (size_t i = 0; i < op.dims().size(); ++i) {
          const int64_t v = EdgeValue(op, i, std::min(sizes[(i + r) % 3], op.dims()[i].max));
          if (v != kLeftOut) c.values.emplace_back(op.dims()[i].name, absl::StrCat(v));
        }
        c.values.insert(c.values.end(), attrs.begin(), attrs.end());
        c.options.dtypes = dtypes;
        c.options.seed = 100 + r;
        CheckKernel(*kernel_, c, tally, /*max_configs=*/16);
      }
    }
  }
  EXPECT_GT(tally.cases, 0);
  EXPECT_GT(tally.runs, 0);
}

INSTANTIATE_TEST_SUITE_P(AllOps, KernelConformanceTest, ::testing::ValuesIn(NonReferenceKernels()), TestName);

// ---- topk: every kernel on chosen inputs ---------------------------------------------

// Runs every available non-reference kernel of `op` on `c` (seeds 1 and 2);
// returns how many (problem, configuration) runs were checked.
int CheckAll(const std::string& op, Case c, size_t max_configs = 0) {
  Tally tally;
  for (uint64_t seed : {1, 2}) {
    c.options.seed = seed;
    for (const auto& kernel : TheRegistry().Kernels(op)) {
      if (kernel->is_reference() || !Runs(*kernel)) continue;
      CheckKernel(*kernel, c, tally, max_configs);
    }
  }
  EXPECT_EQ(tally.refused, 0);
  return tally.runs;
}

int CheckAllTopK(Case c, size_t max_configs = 0) { return CheckAll("topk", std::move(c), max_configs); }

NamedValues TopKDims(int64_t batch, int64_t n, int64_t k) {
  return {{"batch", absl::StrCat(batch)}, {"n", absl::StrCat(n)}, {"k", absl::StrCat(k)}};
}

void CheckBothDtypesAndDirections(const NamedValues& dims, Dist dist, size_t max_configs = 0,
                                  std::set<std::string> with = {}) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const char* largest : {"1", "0"}) {
      Case c;
      c.values = dims;
      c.values.emplace_back("largest", largest);
      c.options.dtypes["input"] = dtype;
      c.options.dist = dist;
      c.options.with = with;
      EXPECT_GT(CheckAllTopK(c, max_configs), 0);
    }
  }
}

Tensor Row(std::vector<float> values) {
  Tensor t(DType::kF32, {1, static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor I32(std::vector<int32_t> values) {
  Tensor t(DType::kI32, {static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

std::shared_ptr<const Op> TopK() { return *TheRegistry().GetOp("topk"); }

// A topk problem on the given inputs (dims from their shapes).
std::unique_ptr<Problem> TopKProblem(std::map<std::string, Tensor> inputs, int64_t k, bool largest) {
  ProblemOptions options;
  options.inputs = std::move(inputs);
  absl::StatusOr<Values> values =
      TopK()->ParseValues(NamedValues{{"k", absl::StrCat(k)}, {"largest", largest ? "1" : "0"}});
  EXPECT_TRUE(values.ok()) << values.status();
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(TopK(), TheRegistry().Reference("topk"), *values, options);
  EXPECT_TRUE(problem.ok()) << problem.status();
  return problem.ok() ? *std::move(problem) : nullptr;
}

const Tensor* Output(const Problem& p, absl::string_view name) {
  for (const auto& [n, t] : p.outputs()) {
    if (n == name) return t;
  }
  return nullptr;
}

template <typename T>
std::vector<T> Elements(const Tensor& t) {
  return {t.data_as<T>(), t.data_as<T>() + t.numel()};
}

// ---- The topk reference, pinned -----------------------------------------------------

// Runs topk/reference (through the registry) and returns the indices.
std::vector<int32_t> ReferenceIndices(const Tensor& input, int64_t k, bool largest) {
  std::unique_ptr<Problem> problem = TopKProblem({{"input", input}}, k, largest);
  if (problem == nullptr) return {};
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference("topk");
  EXPECT_TRUE(reference->Run(reference->DefaultConfig(), *problem->args()).ok());
  return Elements<int32_t>(*Output(*problem, "indices"));
}

TEST(TopKReferenceTest, NanAboveInfBothSignsTiesByIndexZerosEqual) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor row = Row({1.0f, -nan, kInf, -0.0f, nan, 0.0f, -kInf, 1.0f});
  EXPECT_THAT(ReferenceIndices(row, 8, true), ElementsAre(1, 4, 2, 0, 7, 3, 5, 6));
  EXPECT_THAT(ReferenceIndices(row, 8, false), ElementsAre(6, 3, 5, 0, 7, 2, 1, 4));
}

TEST(TopKReferenceTest, RaggedRowsPadWithMinusOneAndTheWorstValue) {
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference("topk");
  ASSERT_NE(reference, nullptr);
  for (bool largest : {true, false}) {
    std::unique_ptr<Problem> problem =
        TopKProblem({{"input", Row({5, 4, 3, 2, 1})}, {"row_starts", I32({3})}, {"row_ends", I32({5})}}, 3, largest);
    ASSERT_NE(problem, nullptr);
    ASSERT_TRUE(reference->Run(reference->DefaultConfig(), *problem->args()).ok());
    std::vector<int32_t> indices = Elements<int32_t>(*Output(*problem, "indices"));
    std::vector<float> values = Elements<float>(*Output(*problem, "values"));
    EXPECT_THAT(indices, ElementsAre(largest ? 3 : 4, largest ? 4 : 3, -1));
    EXPECT_THAT(values, ElementsAre(largest ? 2 : 1, largest ? 1 : 2, largest ? -kInf : kInf));
  }
}

TEST(TopKReferenceTest, ValidationNamesTheProblem) {
  // topk's order: input, row_starts, row_ends, values, indices, stats;
  // dims batch, n, k; attribute largest.
  const Op& op = *TopK();
  Tensor input = Row({1, 2, 3});
  Tensor values(DType::kF32, {1, 2}), indices(DType::kI32, {1, 2}), wrong(DType::kF32, {1, 2});
  DLTensor* tensors[] = {input.dl(), nullptr, nullptr, values.dl(), indices.dl(), nullptr};
  int64_t dims[] = {1, 3, 2};
  kreg_scalar attrs[1];
  attrs[0].i = 1;
  kreg_args args{};
  args.struct_size = sizeof args;
  args.tensors = tensors;
  args.num_tensors = 6;
  args.dims = dims;
  args.num_dims = 3;
  args.attrs = attrs;
  args.num_attrs = 1;
  EXPECT_TRUE(op.Validate(args).ok()) << op.Validate(args);
  tensors[4] = wrong.dl();
  EXPECT_THAT(std::string(op.Validate(args).message()), HasSubstr("indices must be i32"));
  tensors[4] = indices.dl();
  dims[2] = -1;
  EXPECT_THAT(std::string(op.Validate(args).message()), HasSubstr("k=-1 is negative"));
  dims[2] = 2;
  Tensor ends = I32({4});
  tensors[2] = ends.dl();
  EXPECT_THAT(std::string(op.Validate(args).message()), HasSubstr("row 0 has range [0, 4)"));
  // Problem::Make refuses what Validate refuses, before any kernel runs.
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(TopK(), nullptr, *op.ParseValues(TopKDims(4, 10, 11)), {});
  EXPECT_EQ(problem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(problem.status().message()), HasSubstr("k=11 exceeds the row length n=10"));
}

// ---- topk: every kernel against the reference ---------------------------------------

TEST(TopKConformanceTest, RandomShapesWholeGrid) {
  for (const NamedValues& dims : {TopKDims(3, 100, 7), TopKDims(5, 1000, 64), TopKDims(2, 4099, 100)}) {
    CheckBothDtypesAndDirections(dims, Dist::kNormal, /*max_configs=*/SIZE_MAX);
  }
}

TEST(TopKConformanceTest, LargerShapesSampledGrid) {
  for (const NamedValues& dims : {TopKDims(2, 3000, 1000), TopKDims(1, 70000, 33)}) {
    CheckBothDtypesAndDirections(dims, Dist::kNormal, 8);
  }
  // One row of two 2^18-column chunks or more is cut across threads (on 2
  // or more): chunk results merge exactly, NaN of both signs, infinities and
  // ties (every bf16 pattern recurs) included.
  CheckBothDtypesAndDirections(TopKDims(1, 600000, 40), Dist::kBits, 3);
  // Rows long enough that topk/heap seeds its heap from a prefix: ties (the
  // prefix's threshold is shared by many), ranges that start anywhere.
  CheckBothDtypesAndDirections(TopKDims(8, 70000, 33), Dist::kTies, 4, {"row_starts", "row_ends"});
}

TEST(TopKConformanceTest, KEqualsOneAndKEqualsN) {
  CheckBothDtypesAndDirections(TopKDims(4, 257, 1), Dist::kUniform);
  CheckBothDtypesAndDirections(TopKDims(4, 257, 257), Dist::kUniform);
}

TEST(TopKConformanceTest, TinyAndEmptyShapes) {
  CheckBothDtypesAndDirections(TopKDims(0, 10, 3), Dist::kNormal);
  CheckBothDtypesAndDirections(TopKDims(3, 0, 0), Dist::kNormal);
  CheckBothDtypesAndDirections(TopKDims(3, 10, 0), Dist::kNormal);
  CheckBothDtypesAndDirections(TopKDims(1, 1, 1), Dist::kNormal);
}

TEST(TopKConformanceTest, EveryBitPatternNanInfZerosSubnormals) {
  CheckBothDtypesAndDirections(TopKDims(6, 2000, 50), Dist::kBits, 64);
  CheckBothDtypesAndDirections(TopKDims(3, 300, 300), Dist::kBits);
  // Rows of many blocks for a small k: topk/blockmax bounds the k-th best by
  // its blocks' bests (a NaN best when largest, decided exactly when not).
  CheckBothDtypesAndDirections(TopKDims(6, 4000, 5), Dist::kBits, 64);
}

TEST(TopKConformanceTest, TiesEverywhere) {
  CheckBothDtypesAndDirections(TopKDims(4, 5000, 300), Dist::kTies, 64);
  CheckBothDtypesAndDirections(TopKDims(4, 100, 100), Dist::kTies);
  CheckBothDtypesAndDirections(TopKDims(4, 20000, 16), Dist::kTies, 64);  // many blocks, ties across them
}

TEST(TopKConformanceTest, RaggedRows) {
  CheckBothDtypesAndDirections(TopKDims(40, 500, 20), Dist::kNormal, 64, {"row_starts", "row_ends"});
  CheckBothDtypesAndDirections(TopKDims(40, 64, 64), Dist::kBits, 64, {"row_starts", "row_ends"});
  CheckBothDtypesAndDirections(TopKDims(9, 100, 30), Dist::kTies, 64, {"row_starts"});
  CheckBothDtypesAndDirections(TopKDims(9, 100, 30), Dist::kTies, 64, {"row_ends"});
}

TEST(TopKConformanceTest, AllEqualRows) {
  for (float v : {0.0f, -0.0f, 1.5f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(v);
    Tensor input(DType::kF32, {3, 1000});
    for (int64_t i = 0; i < input.numel(); ++i) input.data_as<float>()[i] = v;
    for (const char* largest : {"1", "0"}) {
      for (const char* k : {"40", "3"}) {  // 3: every block ties at the bound
        Case c;
        c.values = {{"k", k}, {"largest", largest}};
        c.options.inputs["input"] = input;
        EXPECT_GT(CheckAllTopK(c), 0);
      }
    }
  }
}

TEST(TopKConformanceTest, NarrowRangeRowsShareTheirHighBits) {
  // Thousands of distinct values within a few ulps of 1: one radix bucket.
  Tensor input(DType::kF32, {2, 50000});
  for (int64_t i = 0; i < input.numel(); ++i) {
    uint32_t bits = 0x3f800000u + static_cast<uint32_t>((i * 7919) % 20000);
    std::memcpy(&input.data_as<float>()[i], &bits, 4);
  }
  for (const char* largest : {"1", "0"}) {
    Case c;
    c.values = {{"k", "5000"}, {"largest", largest}};
    c.options.inputs["input"] = input;
    EXPECT_GT(CheckAllTopK(c, 8), 0);
  }
}

TEST(TopKConformanceTest, AllWinnersInOneColumnStride) {
  // The blockwise seed's adversary: every 128th column holds the winners.
  Tensor input(DType::kF32, {2, 128 * 200});
  for (int64_t i = 0; i < input.numel(); ++i) input.data_as<float>()[i] = (i % 128 == 0) ? 1.0f : 0.0f;
  Case c;
  c.values = {{"k", "64"}};
  c.options.inputs["input"] = input;
  EXPECT_GT(CheckAllTopK(c, 64), 0);
}

TEST(TopKConformanceTest, StridedInputRows) {
  // Rows 1000 elements apart, only the first 700 of each are the row.
  Tensor storage(DType::kF32, {4, 1000});
  FillRandom(storage, Dist::kNormal, 3);
  int64_t shape[2] = {4, 700}, strides[2] = {1000, 1};
  DLTensor input = *storage.dl();
  input.shape = shape;
  input.strides = strides;
  Tensor compact(DType::kF32, {4, 700});
  for (int r = 0; r < 4; ++r) {
    std::memcpy(compact.data_as<float>() + r * 700, storage.data_as<float>() + r * 1000, 700 * 4);
  }
  // The reference's answer on the compact copy.
  std::unique_ptr<Problem> problem = TopKProblem({{"input", compact}}, 30, true);
  ASSERT_NE(problem, nullptr);
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference("topk");
  ASSERT_TRUE(reference->Run(reference->DefaultConfig(), *problem->args()).ok());
  const Tensor& want_values = *Output(*problem, "values");
  const Tensor& want_indices = *Output(*problem, "indices");
  int checked = 0;
  for (const auto& kernel : TheRegistry().Kernels("topk")) {
    // CPU kernels on the caller's strided rows (a device kernel's rows are
    // its DeviceCall's copies).
    if (!kernel->available() || kernel->device() != 0) continue;
    SCOPED_TRACE(kernel->name());
    Tensor values(DType::kF32, {4, 30}), indices(DType::kI32, {4, 30});
    DLTensor* tensors[] = {&input, nullptr, nullptr, values.dl(), indices.dl(), nullptr};
    const int64_t dims[] = {4, 700, 30};
    kreg_scalar attrs[1];
    attrs[0].i = 1;
    kreg_args args{};
    args.struct_size = sizeof args;
    args.tensors = tensors;
    args.num_tensors = 6;
    args.dims = dims;
    args.num_dims = 3;
    args.attrs = attrs;
    args.num_attrs = 1;
    absl::Status run = kernel->Run(kernel->DefaultConfig(), args);
    ASSERT_TRUE(run.ok()) << run;
    EXPECT_EQ(std::memcmp(indices.data(), want_indices.data(), indices.nbytes()), 0);
    EXPECT_EQ(std::memcmp(values.data(), want_values.data(), values.nbytes()), 0);
    ++checked;
  }
  EXPECT_GE(checked, 3);  // the reference, sort and radix at least
}

TEST(TopKConformanceTest, EveryKernelIsCoveredOnThisMachineOrDeclaresWhyNot) {
  const auto kernels = TheRegistry().Kernels("topk");
  const auto on_cpu = std::count_if(kernels.begin(), kernels.end(), [](const auto& k) { return k->device() == 0; });
  EXPECT_EQ(on_cpu, 6);
  for (const auto& kernel : kernels) {
    if (!Runs(*kernel)) std::cout << "skipped: " << Why(*kernel) << "\n";
  }
  EXPECT_TRUE((*TheRegistry().Get("topk/sort"))->available());
  EXPECT_TRUE((*TheRegistry().Get("topk/radix"))->available());
  EXPECT_TRUE((*TheRegistry().Get("topk/reference"))->available());
}

// ---- topk: kernel-specific inputs ---------------------------------------------------

// Runs one topk kernel with `params` on `input`, checks it against the
// reference and returns the per-row stats.
std::vector<int32_t> RunChecked(const std::string& name, const std::vector<std::pair<std::string, std::string>>& params,
                                const Tensor& input, int64_t k, bool largest = true) {
  std::shared_ptr<const Kernel> kernel = *TheRegistry().Get(name);
  absl::StatusOr<Config> config = kernel->ParseConfig(params);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return {};
  std::unique_ptr<Problem> problem = TopKProblem({{"input", input}}, k, largest);
  if (problem == nullptr) return {};
  EXPECT_TRUE(problem->ComputeReference().ok());
  problem->PoisonOutputs();
  absl::Status run = kernel->Run(*config, *problem->args());
  EXPECT_TRUE(run.ok()) << run;
  absl::Status check = problem->CheckOutputs();
  EXPECT_TRUE(check.ok()) << check;
  return Elements<int32_t>(*Output(*problem, "stats"));
}

TEST(TopKRadixTest, StaysExactWhenTheThresholdBucketOverflowsTheBuffer) {
  std::shared_ptr<const Kernel> radix = *TheRegistry().Get("topk/radix");
  if (!radix->available()) GTEST_SKIP() << Why(*radix);
  // 50000 distinct values a few ulps apart share every first-pass bucket bit;
  // the buffer holds 256. The seed kernel drops the overflow; radix refines.
  Tensor input(DType::kF32, {1, 50000});
  for (int64_t i = 0; i < input.numel(); ++i) {
    uint32_t bits = 0x3f800000u + static_cast<uint32_t>((i * 7919) % 50000);
    std::memcpy(&input.data_as<float>()[i], &bits, 4);
  }
  for (const char* first_bits : {"8", "12"}) {
    for (const char* round_bits : {"4", "8"}) {
      for (int64_t k : {1, 300, 20000}) {
        SCOPED_TRACE(absl::StrCat(first_bits, " ", round_bits, " ", k));
        RunChecked("topk/radix", {{"first_bits", first_bits}, {"round_bits", round_bits}, {"capacity", "256"}},
                   input, k);
        RunChecked("topk/radix", {{"first_bits", first_bits}, {"round_bits", round_bits}, {"capacity", "256"}},
                   input, k, false);
      }
    }
  }
}

TEST(TopKBlockwiseTest, ReportsTheDepthEachRowStoppedAt) {
  std::shared_ptr<const Kernel> blockwise = *TheRegistry().Get("topk/blockwise");
  if (!blockwise->available()) GTEST_SKIP() << Why(*blockwise);
  Tensor normal(DType::kF32, {4, 201088});
  FillRandom(normal, Dist::kNormal, 9);
  std::vector<int32_t> depths =
      RunChecked("topk/blockwise", {{"num_blocks", "128"}, {"m_schedule", "5,8,12"}}, normal, 64);
  ASSERT_EQ(depths.size(), 4u);
  for (int32_t depth : depths) {
    EXPECT_EQ(depth, 4);  // top-4 of 128 blocks nearly always holds the top 64
  }
  // The seed's adversary: all winners in column stride 128, so in one block;
  // no depth below k suffices and the row falls back to the whole range.
  Tensor worst(DType::kF32, {2, 128 * 300});
  for (int64_t i = 0; i < worst.numel(); ++i) worst.data_as<float>()[i] = (i % 128 == 0) ? 1.0f : 0.0f;
  depths = RunChecked("topk/blockwise", {{"num_blocks", "128"}}, worst, 64);
  ASSERT_EQ(depths.size(), 2u);
  for (int32_t depth : depths) {
    EXPECT_EQ(depth, 64);
  }
}

TEST(TopKBlockwiseTest, TiesPushedDownKeepTheirColumnOrder) {
  std::shared_ptr<const Kernel> blockwise = *TheRegistry().Get("topk/blockwise");
  if (!blockwise->available()) GTEST_SKIP() << Why(*blockwise);
  // 16 blocks; block 0 holds columns 0, 16 and 32. Inserting 9 at column 32
  // pushes (5, col 0) down onto the tied (5, col 16): the earlier column
  // must stay ahead, or the row stops early with column 0 lost.
  Tensor input(DType::kF32, {1, 48});
  for (int c : {0, 1, 2, 16}) input.data_as<float>()[c] = 5.0f;
  input.data_as<float>()[32] = 9.0f;
  RunChecked("topk/blockwise", {{"num_blocks", "16"}, {"m_schedule", "2"}}, input, 3);
  // The same on many small rows full of ties, at every block count.
  Tensor ties(DType::kF32, {64, 300});
  FillRandom(ties, Dist::kTies, 4);
  for (const char* blocks : {"16", "32", "64"}) {
    for (const char* schedule : {"2", "3", "2,4", "5,8,12"}) {
      SCOPED_TRACE(absl::StrCat(blocks, " ", schedule));
      for (int64_t k : {2, 5, 20}) {
        RunChecked("topk/blockwise", {{"num_blocks", blocks}, {"m_schedule", schedule}}, ties, k);
        RunChecked("topk/blockwise", {{"num_blocks", blocks}, {"m_schedule", schedule}}, ties, k, false);
      }
    }
  }
}

// ---- gmm and tgmm: the references pinned -----------------------------------------

Tensor F32(std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t(DType::kF32, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

// What the reference of `op` writes into "out" for `values` (dims and
// attributes by name) and the given inputs (the other dims come from their
// shapes); empty on failure.
std::vector<float> ReferenceOut(const std::string& op_name, const NamedValues& values,
                                std::map<std::string, Tensor> inputs) {
  std::shared_ptr<const Op> op = *TheRegistry().GetOp(op_name);
  absl::StatusOr<Values> parsed = op->ParseValues(values);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok()) return {};
  ProblemOptions options;
  options.inputs = std::move(inputs);
  absl::StatusOr<std::unique_ptr<Problem>> problem =
      Problem::Make(op, TheRegistry().Reference(op_name), *parsed, options);
  EXPECT_TRUE(problem.ok()) << problem.status();
  if (!problem.ok()) return {};
  std::shared_ptr<const Kernel> reference = TheRegistry().Reference(op_name);
  const absl::Status run = reference->Run(reference->DefaultConfig(), *(*problem)->args());
  EXPECT_TRUE(run.ok()) << run;
  return run.ok() ? Elements<float>(*Output(**problem, "out")) : std::vector<float>{};
}

TEST(GmmReferenceTest, GroupsOffsetsTransposedRhsAndExistingOut) {
  // m=4, k=2, n=2; groups of 1, 2 and 0 rows: row 3 is past them all.
  const Tensor lhs = F32({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor sizes = I32({1, 2, 0});
  // rhs[0] the identity, rhs[1] [[1, 2], [3, 4]], rhs[2] all 2; then each
  // matrix transposed ([n, k]) for transpose_rhs=1.
  const Tensor rhs = F32({3, 2, 2}, {1, 0, 0, 1, 1, 2, 3, 4, 2, 2, 2, 2});
  const Tensor rhs_t = F32({3, 2, 2}, {1, 0, 0, 1, 1, 3, 2, 4, 2, 2, 2, 2});
  const std::vector<float> all = {1, 2, 15, 22, 23, 34, 0, 0};
  EXPECT_EQ(ReferenceOut("gmm", {}, {{"lhs", lhs}, {"rhs", rhs}, {"group_sizes", sizes}}), all);
  EXPECT_EQ(ReferenceOut("gmm", {{"transpose_rhs", "1"}}, {{"lhs", lhs}, {"rhs", rhs_t}, {"group_sizes", sizes}}),
            all);
  // Group 1 alone (rhs holds one matrix: local_groups=1 from its shape):
  // the other rows are 0, or existing_out's.
  const Tensor rhs1 = F32({1, 2, 2}, {1, 2, 3, 4});
  const Tensor rhs1_t = F32({1, 2, 2}, {1, 3, 2, 4});
  const Tensor existing = F32({4, 2}, {10, 10, 10, 10, 10, 10, 10, 10});
  EXPECT_EQ(ReferenceOut("gmm", {{"group_offset", "1"}}, {{"lhs", lhs}, {"rhs", rhs1}, {"group_sizes", sizes}}),
            (std::vector<float>{0, 0, 15, 22, 23, 34, 0, 0}));
  EXPECT_EQ(ReferenceOut("gmm", {{"group_offset", "1"}, {"transpose_rhs", "1"}},
                         {{"lhs", lhs}, {"rhs", rhs1_t}, {"group_sizes", sizes}, {"existing_out", existing}}),
            (std::vector<float>{10, 10, 25, 32, 33, 44, 10, 10}));
  // The last group alone is empty: every row is existing_out's.
  EXPECT_EQ(ReferenceOut("gmm", {{"group_offset", "2"}},
                         {{"lhs", lhs}, {"rhs", rhs1}, {"group_sizes", sizes}, {"existing_out", existing}}),
            (std::vector<float>(8, 10)));
}

TEST(TgmmReferenceTest, GroupsOffsetsAndEmptyGroups) {
  // k=2, m=4, n=2; groups of 1, 2 and 0 rows: row 3 is ignored.
  const Tensor lhs = F32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor rhs = F32({4, 2}, {1, 0, 0, 1, 1, 1, 2, 2});
  const Tensor sizes = I32({1, 2, 0});
  EXPECT_EQ(ReferenceOut("tgmm", {}, {{"lhs", lhs}, {"rhs", rhs}, {"group_sizes", sizes}}),
            (std::vector<float>{1, 0, 5, 0, 3, 5, 7, 13, 0, 0, 0, 0}));
  EXPECT_EQ(ReferenceOut("tgmm", {{"group_offset", "1"}, {"local_groups", "2"}},
                         {{"lhs", lhs}, {"rhs", rhs}, {"group_sizes", sizes}}),
            (std::vector<float>{3, 5, 7, 13, 0, 0, 0, 0}));
}

// ---- gmm and tgmm: every kernel on chosen partitions ------------------------------

// A grouped-matmul problem: its dims (m the grouped one), group sizes
// (empty: drawn by `partition` over `groups` groups) and local groups.
struct GroupedShape {
  const char* name;
  int64_t m, k, n;
  std::vector<int32_t> sizes;
  int64_t groups = 0;  // with `sizes` empty
  Partition partition = Partition::kRandom;
  int64_t group_offset = 0;
  int64_t local_groups = -1;  // -1: left out (all groups)
};

std::vector<GroupedShape> GroupedShapes() {
  std::vector<int32_t> huge_and_tiny = {300};
  for (int i = 0; i < 31; ++i) huge_and_tiny.push_back(i % 3);  // 0, 1, 2, 0, ...
  const std::vector<int32_t> eight = {5, 0, 7, 6, 9, 3, 0, 10};  // 40 rows
  return {
      {"empty_groups", 12, 5, 3, {0, 5, 0, 0, 7, 0}},
      {"all_groups_empty", 9, 4, 6, {0, 0, 0, 0}},
      {"m_zero", 0, 4, 5, {0, 0, 0}},
      {"no_groups", 6, 3, 4, {}, 0},
      {"sum_below_m", 20, 7, 9, {3, 4, 2}},
      {"one_huge_many_tiny", 300 + 31 + 4, 33, 17, huge_and_tiny},
      {"tiles_do_not_divide", 130, 67, 45, {30, 0, 61, 1, 38}},
      {"skewed", 200, 16, 24, {}, 16, Partition::kSkewed},
      {"offset_middle", 40, 9, 11, eight, 0, Partition::kRandom, 2, 3},
      {"offset_last", 40, 9, 11, eight, 0, Partition::kRandom, 5, 3},
      {"offset_end_none_local", 40, 9, 11, eight, 0, Partition::kRandom, 8, 0},
      {"offset_first_sum_below_m", 50, 9, 11, eight, 0, Partition::kRandom, 0, 4},
  };
}

// The cases of one shape for op "gmm" or "tgmm": each pairing of input and
// output dtypes, normal values and every bit pattern (NaN, infinities);
// for gmm also rhs plain and transposed, without and with existing_out.
std::vector<Case> GroupedCases(const std::string& op, const GroupedShape& shape) {
  std::vector<Case> out;
  const bool gmm = op == "gmm";
  for (const char* transpose : {"0", "1"}) {
    if (!gmm && transpose[0] == '1') continue;
    for (bool existing : {false, true}) {
      if (!gmm && existing) continue;
      for (DType in : {DType::kF32, DType::kBF16}) {
        for (DType result : {DType::kF32, DType::kBF16}) {
          for (Dist dist : {Dist::kNormal, Dist::kBits}) {
            Case c;
            c.values = {{"m", absl::StrCat(shape.m)}, {"k", absl::StrCat(shape.k)}, {"n", absl::StrCat(shape.n)}};
            if (shape.sizes.empty()) {
              c.values.emplace_back("groups", absl::StrCat(shape.groups));
            } else {
              c.options.inputs["group_sizes"] = I32(shape.sizes);
            }
            if (shape.local_groups >= 0) c.values.emplace_back("local_groups", absl::StrCat(shape.local_groups));
            if (shape.group_offset > 0) c.values.emplace_back("group_offset", absl::StrCat(shape.group_offset));
            if (gmm) c.values.emplace_back("transpose_rhs", transpose);
            if (existing) c.options.with.insert("existing_out");
            c.options.dtypes["lhs"] = in;
            c.options.dtypes["out"] = result;
            c.options.dist = dist;
            c.options.partition = shape.partition;
            c.options.seed = out.size() + 1;
            out.push_back(std::move(c));
          }
        }
      }
    }
  }
  return out;
}

std::vector<std::string> GroupedKernels() {
  std::vector<std::string> names;
  for (const char* op : {"gmm", "tgmm"}) {
    for (const auto& k : TheRegistry().Kernels(op)) {
      if (!k->is_reference()) names.push_back(k->name());
    }
  }
  return names;
}

class GroupedMatmulTest : public KernelConformanceTest {};

TEST_P(GroupedMatmulTest, ChosenPartitionsOffsetsAndLayouts) {
  for (const GroupedShape& shape : GroupedShapes()) {
    Tally tally;
    for (const Case& c : GroupedCases(kernel_->op(), shape)) {
      CheckKernel(*kernel_, c, tally, /*max_configs=*/32);
      if (HasFailure()) break;  // one failing case per shape tells enough
    }
    EXPECT_EQ(tally.refused, 0) << shape.name;
    EXPECT_GT(tally.runs, 0) << shape.name;
    // Every choice this CPU runs (each micro-kernel) ran on every shape.
    std::vector<std::string> choices;
    for (const ParamInfo& p : kernel_->params().params()) {
      for (size_t i = 0; i < p.choices.size(); ++i) {
        if (!p.ChoiceAvailable(static_cast<int64_t>(i), CpuIsa())) continue;
        const std::string choice = absl::StrCat(p.name, "=", p.choices[i]);
        EXPECT_GT(tally.choice_runs[choice], 0) << shape.name << ": no run with " << choice;
        choices.push_back(absl::StrCat(choice, " ", tally.choice_runs[choice]));
      }
    }
    std::cout << kernel_->name() << " " << shape.name << ": " << tally.cases << " cases, " << tally.runs
              << " checked runs" << (choices.empty() ? "" : absl::StrCat(" (", absl::StrJoin(choices, ", "), ")"))
              << (HasFailure() ? " (FAILED)" : "") << "\n";
    if (HasFailure()) break;
  }
}

// An f32 output of just over 64 MiB (gmm/tiled and tgmm/tiled write one
// past that around the cache, with non-temporal stores): f32 and bf16
// inputs, the default configuration with each micro-kernel this CPU runs;
// existing_out (which is read, so not streamed) too.
TEST_P(GroupedMatmulTest, OutputsLargerThanTheCache) {
  const int64_t out_bytes = (int64_t{64} << 20) + 1;
  const bool gmm = kernel_->op() == "gmm";
  std::vector<NamedValues> configs;  // each micro-kernel, else the default
  for (const ParamInfo& p : kernel_->params().params()) {
    if (p.name != "micro") continue;
    for (size_t i = 0; i < p.choices.size(); ++i) {
      if (p.ChoiceAvailable(static_cast<int64_t>(i), CpuIsa())) configs.push_back({{p.name, p.choices[i]}});
    }
  }
  if (configs.empty()) configs.push_back({});
  constexpr int64_t k = 16, n = 512;
  // gmm: out [m, n]; tgmm: out [groups, k, n] with 2 rows a group.
  const int64_t groups = gmm ? 7 : out_bytes / (k * n * 4) + 1;
  const int64_t m = gmm ? out_bytes / (n * 4) + 1 : 2 * groups;
  Tally tally;
  for (DType in : {DType::kF32, DType::kBF16}) {
    for (bool existing : {false, true}) {
      if (existing && !gmm) continue;
      Case c;
      c.values = {{"m", absl::StrCat(m)}, {"k", absl::StrCat(k)}, {"n", absl::StrCat(n)},
                  {"groups", absl::StrCat(groups)}};
      c.options.dtypes["lhs"] = in;
      if (existing) c.options.with.insert("existing_out");
      c.options.partition = Partition::kRandom;
      c.options.seed = 7;
      c.configs = configs;
      CheckKernel(*kernel_, c, tally);
      if (HasFailure()) return;
    }
  }
  EXPECT_EQ(tally.refused, 0);
  std::cout << kernel_->name() << ": outputs of " << out_bytes / (1 << 20) << " MiB, " << tally.runs
            << " checked runs\n";
}

INSTANTIATE_TEST_SUITE_P(GroupedOps, GroupedMatmulTest, ::testing::ValuesIn(GroupedKernels()), TestName);

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

// ---- gmm and tgmm: validation -----------------------------------------------------

// Problem::Make's refusal of `values` and `inputs` for `op`: InvalidArgument,
// one line.
std::string Refusal(const std::string& op_name, const NamedValues& values, std::map<std::string, Tensor> inputs) {
  std::shared_ptr<const Op> op = *TheRegistry().GetOp(op_name);
  absl::StatusOr<Values> parsed = op->ParseValues(values);
  if (!parsed.ok()) return std::string(parsed.status().message());
  ProblemOptions options;
  options.inputs = std::move(inputs);
  absl::StatusOr<std::unique_ptr<Problem>> problem = Problem::Make(op, nullptr, *parsed, options);
  EXPECT_EQ(problem.status().code(), absl::StatusCode::kInvalidArgument) << problem.status();
  const std::string message(problem.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  return message;
}

TEST(GmmValidationTest, EachRefusalIsOneClearLine) {
  const NamedValues dims = {{"m", "8"}, {"k", "4"}, {"n", "6"}};
  EXPECT_THAT(Refusal("gmm", dims, {{"group_sizes", I32({2, -1, 3})}}), HasSubstr("group_sizes[1]=-1 is negative"));
  EXPECT_THAT(Refusal("gmm", dims, {{"group_sizes", I32({5, 5})}}),
              HasSubstr("group_sizes[0..1] sum to 10, more than m=8 rows"));
  EXPECT_THAT(Refusal("tgmm", dims, {{"group_sizes", I32({9})}}),
              HasSubstr("group_sizes[0..0] sum to 9, more than m=8 rows"));
  for (const char* op : {"gmm", "tgmm"}) {
    NamedValues offset = dims;
    offset.insert(offset.end(), {{"groups", "4"}, {"local_groups", "2"}, {"group_offset", "3"}});
    EXPECT_THAT(Refusal(op, offset, {}),
                HasSubstr(absl::StrCat(op, ": group_offset=3 + local_groups=2 exceeds groups=4")));
    offset = dims;
    offset.insert(offset.end(), {{"groups", "4"}, {"local_groups", "5"}});
    EXPECT_THAT(Refusal(op, offset, {}), HasSubstr("group_offset=0 + local_groups=5 exceeds groups=4"));
  }
  // rhs [G, k, n] given where transpose_rhs=1 makes it [G, n, k], n != k.
  NamedValues transposed = dims;
  transposed.emplace_back("transpose_rhs", "1");
  Tensor rhs(DType::kF32, {2, 4, 6});
  EXPECT_THAT(Refusal("gmm", transposed, {{"rhs", rhs}}),
              HasSubstr("input 'rhs' has shape [2, 4, 6] but n=6 (rhs is [local_groups,n,k] with transpose_rhs=1)"));
  // ... and the converse.
  Tensor rhs_t(DType::kF32, {2, 6, 4});
  EXPECT_THAT(Refusal("gmm", dims, {{"rhs", rhs_t}}),
              HasSubstr("input 'rhs' has shape [2, 6, 4] but k=4 (rhs is [local_groups,k,n] with transpose_rhs=0)"));
  // Inputs whose dtypes must agree.
  Tensor lhs(DType::kF32, {8, 4});
  Tensor rhs_bf16(DType::kBF16, {2, 4, 6});
  EXPECT_THAT(Refusal("gmm", {}, {{"lhs", lhs}, {"rhs", rhs_bf16}, {"group_sizes", I32({3, 5})}}),
              HasSubstr("input 'rhs' holds bf16 but must have the dtype of 'lhs' (f32)"));
  // Validate on arguments built by hand (no Problem): the transposed shape
  // is checked there too.
  std::shared_ptr<const Op> op = *TheRegistry().GetOp("gmm");
  Tensor sizes = I32({3, 5}), out(DType::kF32, {8, 6});
  DLTensor* tensors[] = {lhs.dl(), rhs.dl(), sizes.dl(), out.dl(), nullptr};
  int64_t values[] = {8, 4, 6, 2, 2};  // m, k, n, groups, local_groups
  kreg_scalar attrs[3] = {};            // transpose_rhs, group_offset, constant_weights
  kreg_args args{};
  args.struct_size = sizeof args;
  args.tensors = tensors;
  args.num_tensors = 5;
  args.dims = values;
  args.num_dims = 5;
  args.attrs = attrs;
  args.num_attrs = 3;
  EXPECT_TRUE(op->Validate(args).ok()) << op->Validate(args);
  attrs[0].i = 1;
  EXPECT_THAT(std::string(op->Validate(args).message()),
              HasSubstr("rhs has shape [2, 4, 6], expected [2, 6, 4] "
                        "(rhs is [local_groups,n,k] with transpose_rhs=1)"));
  tensors[1] = rhs_t.dl();
  EXPECT_TRUE(op->Validate(args).ok()) << op->Validate(args);
  attrs[1].i = 1;
  EXPECT_THAT(std::string(op->Validate(args).message()), HasSubstr("group_offset=1 + local_groups=2 exceeds groups=2"));
}

}  // namespace
}  // namespace kreg
