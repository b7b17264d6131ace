// The conformance harness's shared part (tests/conformance_test.cc), for
// the per-family cases each op family keeps in its folder
// (plugins/<family>/conformance_test.cc, compiled into the same
// conformance_test binary). A family's file opens
//
//   namespace kreg::conformance {
//   namespace {
//   ... its TESTs, on TheRegistry(), CheckKernel, CheckAll ...
#ifndef KREG_TESTS_CONFORMANCE_H_
#define KREG_TESTS_CONFORMANCE_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
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

namespace kreg::conformance {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

// The build's plugins and the test plugins (axpy, rowsum), loaded once;
// KREG_CONFORMANCE_PLUGINS names others (a build carried to a GPU machine).
const Registry& TheRegistry();
// Runs composite ops' sub-ops (sharded_matmul's local multiplies): each
// op's untuned default.
const Dispatcher& TheDispatcher();
// Why this machine cannot run `kernel` (the ISA, or a CUDA device).
std::string Why(const Kernel& kernel);
// Whether this machine runs `kernel` here (CPU) or on its GPU (CUDA).
bool Runs(const Kernel& kernel);
// The GPU device kernels run on, opened once; nullptr without one.
Device* TheDevice();
// The parameter choices this CPU cannot run, e.g. "micro=avx512 (needs
// avx512f,...)"; empty if none.
std::string ChoicesNotRun(const Kernel& kernel);

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
// search (at most `max_configs`; 0: by the problem's size), each run once
// and checked against the reference as MeasureKernel does for the tuner. A
// collective runs on as many thread ranks as its ranks dim says.
void CheckKernel(const Kernel& kernel, const Case& c, Tally& tally, size_t max_configs = 0,
                 const Inspect& inspect = nullptr);
// Runs every available non-reference kernel of `op` on `c` (seeds 1 and 2);
// returns how many (problem, configuration) runs were checked.
int CheckAll(const std::string& op, Case c, size_t max_configs = 0);

// Edge cases built from an op's descriptor alone (see conformance_test.cc).
constexpr int64_t kLeftOut = -1;  // in an edge shape: a dim left out
std::vector<std::vector<int64_t>> EdgeShapes(const Op& op);
std::vector<std::map<std::string, DType>> DtypeChoices(const Op& op);
std::vector<NamedValues> AttrChoices(const Op& op);
std::vector<std::set<std::string>> OptionalSubsets(const Op& op);
std::vector<Case> EdgeCases(const Op& op);

// A test's name from a kernel's ("topk/heap" -> "topk_heap").
std::string TestName(const ::testing::TestParamInfo<std::string>& p);

// A test of one kernel (its name the parameter), skipped where it cannot run.
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

// Small tensors by value.
Tensor I32(std::vector<int32_t> values);
Tensor F32(std::vector<int64_t> shape, const std::vector<float>& values);
// A problem's output `name`, or nullptr.
const Tensor* Output(const Problem& p, absl::string_view name);
template <typename T>
std::vector<T> Elements(const Tensor& t) {
  return {t.data_as<T>(), t.data_as<T>() + t.numel()};
}

}  // namespace kreg::conformance

#endif  // KREG_TESTS_CONFORMANCE_H_
