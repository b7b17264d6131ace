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
// What only one op family knows (its references pinned on hand-written
// inputs, inputs chosen to break particular kernels, its validation
// errors) sits in the family's folder, plugins/<family>/conformance_test.cc,
// compiled into this binary on the helpers of conformance.h.
//
// Run again under KREG_ISA_MASK=fma (tests/CMakeLists.txt): kernels needing
// AVX2 are skipped, saying so; the portable ones are still checked.
#include "tests/conformance.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>

#include "absl/synchronization/mutex.h"

namespace kreg::conformance {

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

// Whether `kernel`'s check accepts `config` for `problem`. A device
// kernel's check sees the shapes (its data goes to the device), as the
// tuner's worker asks it.
bool Accepts(const Kernel& kernel, const Config& config, const Problem& problem) {
  kreg_args shapes = *problem.args();
  if (kernel.device() != 0) shapes.flags |= KREG_ARGS_SHAPE_ONLY;
  return kernel.Check(config, shapes).ok();
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
  for (Config& c : kernel.params().Enumerate(CpuIsa(), problem.values().dims.data(), /*max_list_len=*/2)) {
    if (Accepts(kernel, c, problem)) legal.push_back(std::move(c));
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


// Checks one kernel on one problem at every configuration the tuner would
// search (at most `max_configs`; 0: by the problem's size), each run once and
// checked against the reference as MeasureKernel does for the tuner. A
// collective runs on as many thread ranks as its ranks dim says.
void CheckKernel(const Kernel& kernel, const Case& c, Tally& tally, size_t max_configs, const Inspect& inspect) {
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
        if (config.ok() && Accepts(kernel, *config, **problem)) configs.push_back(*std::move(config));
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

// In an edge shape, kLeftOut (conformance.h): a dim left out, to take its
// default_dim's value (or the one the host derives).

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
  EXPECT_THAT(ops, ::testing::IsSupersetOf({"axpy", "rowsum"}));
  EXPECT_GT(ops.size(), 2u);  // and the families' (each family's cases check its own)
}

TEST(ConformanceSuiteTest, EdgeCasesAreBuiltFromTheDescriptor) {
  std::shared_ptr<const Op> axpy = *TheRegistry().GetOp("axpy");
  EXPECT_EQ(DtypeChoices(*axpy).size(), 2u);  // x f32 or bf16; out is f32 only
  EXPECT_EQ(AttrChoices(*axpy).size(), 1u);   // alpha is a float: its default
  EXPECT_EQ(OptionalSubsets(*axpy).size(), 1u);
  // rowsum: dims rows, cols, used (default rows); x's shape follows the
  // attribute transposed.
  std::shared_ptr<const Op> rowsum = *TheRegistry().GetOp("rowsum");
  std::vector<std::vector<int64_t>> shapes = EdgeShapes(*rowsum);
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{0, 0, kLeftOut}));
  EXPECT_NE(std::find(shapes.begin(), shapes.end(), std::vector<int64_t>{7, 7, 0}), shapes.end());
  EXPECT_NE(std::find(shapes.begin(), shapes.end(), std::vector<int64_t>{33, 3, 7}), shapes.end());
  EXPECT_EQ(AttrChoices(*rowsum).size(), 2u);  // transposed 0 and 1: both shapes of x
}


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

// ---- Helpers of the families' cases ------------------------------------------------

// Runs every available non-reference kernel of `op` on `c` (seeds 1 and 2);
// returns how many (problem, configuration) runs were checked.
int CheckAll(const std::string& op, Case c, size_t max_configs) {
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

Tensor I32(std::vector<int32_t> values) {
  Tensor t(DType::kI32, {static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

Tensor F32(std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t(DType::kF32, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

const Tensor* Output(const Problem& p, absl::string_view name) {
  for (const auto& [n, t] : p.outputs()) {
    if (n == name) return t;
  }
  return nullptr;
}

}  // namespace kreg::conformance
