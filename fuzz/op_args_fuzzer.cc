// Fuzzes every op's argument validation as `kreg run OP/VARIANT` reaches it
// before it allocates anything: --dims, --dtype, --with, --mesh and --param
// through the command line's own helpers (tools/cli.h: SpecFromFlags,
// ShapeArgsOf, Pairs), then the kernel's parameters (Kernel::ParseConfig),
// their legality for the shape (ParamInfo::Legal, Kernel::Check: the op's
// validation, the values, the kernel's own check), the problem's key, and a
// table query for it (Lut::Query on an empty table: the default variant's
// path). Shape-only throughout: no input is ever allocated.
//
// Input: byte 0 picks the op (of the registry's, by name), byte 1 the
// kernel (of that op's), byte 2 the ranks of a collective op (0-8; 0: none
// given); the rest is text, one flag per line:
//   line 1  --dims   batch=4,n=100,k=3
//   line 2  --dtype  bf16  or  input=bf16
//   line 3  --with   row_starts,row_ends
//   line 4  --mesh   2x2
//   then    --param  NAME=VALUE, one per line
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_registry.h"
#include "kreg/lut.h"
#include "kreg/op.h"
#include "kreg/params.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "tools/cli.h"

namespace kreg::fuzz {
namespace {

struct Catalog {
  std::vector<std::shared_ptr<const Op>> ops;                  // by name
  std::vector<std::vector<std::shared_ptr<const Kernel>>> kernels;  // per op, by name
  std::unique_ptr<Lut> lut;                                    // of an empty table
};

const Catalog& TheCatalog() {
  static const Catalog* const catalog = [] {
    auto* c = new Catalog;
    const Registry& registry = FuzzRegistry();
    c->ops = registry.Ops();
    for (const auto& op : c->ops) c->kernels.push_back(registry.Kernels(op->name()));
    absl::StatusOr<Lut> lut = Lut::Build(TuningDb(), registry);
    KREG_FUZZ_CHECK(lut.ok());
    c->lut = std::make_unique<Lut>(*std::move(lut));
    return c;
  }();
  return *catalog;
}

}  // namespace
}  // namespace kreg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  using namespace kreg::fuzz;
  if (size < 3) return 0;
  const Catalog& catalog = TheCatalog();
  const size_t op_index = data[0] % catalog.ops.size();
  const Op& op = *catalog.ops[op_index];
  const auto& kernels = catalog.kernels[op_index];
  const std::shared_ptr<const Kernel> kernel = kernels.empty() ? nullptr : kernels[data[1] % kernels.size()];

  std::vector<std::string> lines =
      absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data) + 3, size - 3), '\n');
  lines.resize(std::max<size_t>(lines.size(), 4));
  cli::Flags flags;
  flags.command = "run";
  flags.target = kernel != nullptr ? kernel->name() : op.name();
  flags.dims = {lines[0]};
  flags.dtype = lines[1];
  flags.with = lines[2];
  flags.mesh = lines[3];
  for (size_t i = 4; i < lines.size(); ++i) {
    if (!lines[i].empty()) flags.params.push_back(lines[i]);
  }
  flags.ranks = op.collective() ? data[2] % 9 : 0;

  const Registry& registry = FuzzRegistry();
  absl::StatusOr<cli::ProblemSpec> spec = cli::SpecFromFlags(flags, registry, op.name(), flags.dims[0]);
  if (!spec.ok()) return 0;
  ShapeArgs shape;
  const bool shaped = cli::ShapeArgsOf(*spec, &shape).ok();
  if (shaped) {
    const OpKey key = op.KeyOf(*shape.args());
    (void)catalog.lut->Query(op.name(), key.dtype, key.dims, ThisMachine().id(), "");
  }
  if (kernel == nullptr) return 0;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> params = cli::Pairs(flags.params, "param");
  if (!params.ok()) return 0;
  absl::StatusOr<Config> config = kernel->ParseConfig(*params);
  if (!config.ok()) return 0;
  // What a configuration reads as parses back to it.
  absl::StatusOr<Config> again = kernel->ParseConfig(kernel->ConfigPairs(*config));
  KREG_FUZZ_CHECK(again.ok() && *again == *config);
  if (!shaped) return 0;
  const kreg_args& args = *shape.args();
  for (size_t i = 0; i < kernel->params().size(); ++i) {
    const ParamInfo& p = kernel->params()[i];
    if (p.kind == KREG_PARAM_INT) (void)p.Legal(config->values()[i].value, args.dims);
  }
  (void)kernel->Check(*config, args);
  (void)kernel->Check(kernel->DefaultConfig(), args);
  return 0;
}
