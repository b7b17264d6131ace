#include "tools/record.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/answer.h"
#include "kreg/comm.h"
#include "kreg/limits.h"

namespace kreg::cli {
namespace {

// The flags a record gives per shape, refused beside --from-record.
absl::Status CheckNoProblemFlags(const Flags& flags) {
  std::vector<std::string> given;
  if (!flags.target.empty()) given.push_back(absl::StrCat("OP (", flags.target, ")"));
  if (!flags.dims.empty()) given.push_back("--dims");
  if (!flags.inputs.empty()) given.push_back("--input");
  if (!flags.dtype.empty()) given.push_back("--dtype");
  if (!flags.with.empty()) given.push_back("--with");
  if (!flags.data_class.empty()) given.push_back("--data-class");
  if (flags.device != "cpu") given.push_back("--device");
  if (flags.ranks != 0) given.push_back("--ranks");
  if (!flags.mesh.empty()) given.push_back("--mesh");
  if (given.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--from-record: the record gives each shape's op, dims, dtypes, data ",
                                                 "class and device; drop ", absl::StrJoin(given, ", ")));
}

// `base` with the dtypes and optional inputs of `types`, and the inputs the
// data class describes (dist=NAME; a classifier's class that names a
// partition, as gmm's balanced and skewed do).
ProblemOptions OptionsOf(const Op& op, const TensorTypes& types, const std::string& data_class, ProblemOptions base) {
  base.dtypes.clear();
  base.with.clear();
  for (size_t i = 0; i < types.size(); ++i) {
    const TensorInfo& t = op.tensors()[i];
    if (!types[i].has_value()) continue;
    if (t.free_dtype()) base.dtypes[t.name] = *types[i];
    if (t.optional && t.is_input()) base.with.insert(t.name);
  }
  if (absl::StartsWith(data_class, "dist=")) {
    absl::StatusOr<Dist> dist = ParseDist(data_class.substr(5));
    if (dist.ok()) base.dist = *dist;
  }
  if (op.has_data_class()) {
    absl::StatusOr<Partition> partition = ParsePartition(data_class);
    if (partition.ok()) base.partition = *partition;
  }
  return base;
}

// A collective's thread ranks and mesh (from its dims), or why it is not
// swept here.
std::string CollectiveFlags(const Op& op, const Values& values, const std::string& data_class, Flags* flags) {
  if (!op.collective()) return "";
  if (absl::StartsWith(data_class, "backend=") && data_class != CollectiveDataClass("threads", 1)) {
    return absl::StrCat("recorded with ", data_class, ": tune it under mpirun (kreg tune ", op.name(),
                        " --dims ... --backend mpi)");
  }
  flags->ranks = static_cast<int>(values.dims[op.ranks_dim()]);  // within the op's max; BaseRequest bounds it
  std::vector<std::string> axes;
  for (size_t d = 0; d < op.dims().size(); ++d) {
    if (op.dims()[d].mesh_axis) axes.push_back(absl::StrCat(op.dims()[d].name, "=", values.dims[d]));
  }
  flags->mesh = absl::StrJoin(axes, ",");
  return "";
}

// One line's shape as a problem.
absl::StatusOr<RecordedProblem> ProblemOf(const Flags& flags, const Registry& registry, RecordedShape shape,
                                          const ProblemOptions& base) {
  absl::StatusOr<std::shared_ptr<const Op>> op = registry.GetOp(shape.op);
  if (!op.ok()) return op.status();
  absl::StatusOr<TensorTypes> types = (*op)->TypesFromKey(shape.dtype);
  if (!types.ok()) return types.status();
  absl::StatusOr<Values> values = (*op)->ParseValues(shape.dims);  // the op's bounds, as for --dims
  if (!values.ok()) return values.status();
  RecordedProblem p;
  p.op = *op;
  p.parsed = *values;
  p.flags = flags;
  p.flags.target = shape.op;
  p.flags.data_class = shape.data_class;
  p.flags.device = std::string(DeviceName(shape.device));
  for (const auto& [name, value] : shape.dims) p.values.emplace_back(name, absl::StrCat(value));
  p.options = OptionsOf(**op, *types, shape.data_class, base);
  p.skip = CollectiveFlags(**op, *values, shape.data_class, &p.flags);
  // The line must be a key kreg makes: the call it describes keys the same.
  ShapeArgs args;
  if (absl::Status s = MakeShapeArgs(**op, *values, p.options, &args); !s.ok()) return s;
  const OpKey key = (*op)->KeyOf(*args.args());
  if (key.dtype != shape.dtype || key.dims != shape.dims) {
    return absl::InvalidArgumentError(absl::StrCat("not a key kreg records: that call's key is '",
                                                   key.dtype.empty() ? "-" : key.dtype, " ",
                                                   key.dims.empty() ? "-" : DimsString(key.dims), "'"));
  }
  p.shape = std::move(shape);
  return p;
}

}  // namespace

std::string RecordedName(const Flags& flags, const RecordedShape& shape) {
  return absl::StrCat(flags.from_record, ":", shape.line, " ", shape.op, " ", shape.dtype.empty() ? "-" : shape.dtype,
                      " ", shape.dims.empty() ? "-" : DimsString(shape.dims),
                      shape.data_class.empty() ? "" : absl::StrCat(" [", shape.data_class, "]"),
                      shape.device == DeviceKind::kCpu ? "" : absl::StrCat(" on ", DeviceName(shape.device)));
}

absl::StatusOr<std::vector<RecordedProblem>> ReadRecordedProblems(const Flags& flags, const Registry& registry,
                                                                  const ProblemOptions& options) {
  if (absl::Status s = CheckNoProblemFlags(flags); !s.ok()) return s;
  absl::StatusOr<std::vector<RecordedShape>> shapes = ReadShapeRecord(flags.from_record);
  if (!shapes.ok()) {  // missing, unreadable, or a bad line: all bad input
    return absl::InvalidArgumentError(absl::StrCat("--from-record: ", shapes.status().message()));
  }
  std::vector<RecordedProblem> problems;
  for (RecordedShape& shape : *shapes) {
    const int line = shape.line;
    absl::StatusOr<RecordedProblem> p = ProblemOf(flags, registry, std::move(shape), options);
    if (!p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--from-record: ", flags.from_record, ":", line, ": ", p.status().message()));
    }
    problems.push_back(*std::move(p));
  }
  return problems;
}

absl::Status SkipAnswered(const Flags& flags, const Registry& registry, const TuningDb& db,
                          std::vector<RecordedProblem>* problems) {
  absl::StatusOr<Lut> lut = Lut::Build(db, registry, LutOptions{MachinePolicy::kStrict});
  if (!lut.ok()) return lut.status();
  for (RecordedProblem& p : *problems) {
    ShapeArgs args;
    if (!p.skip.empty() || !MakeShapeArgs(*p.op, p.parsed, p.options, &args).ok()) continue;
    std::vector<std::string> warnings;
    absl::StatusOr<QueryRecord> asked =
        AskTable(*lut, *p.op, *args.args(), p.shape.data_class, p.shape.device, flags.threads, &warnings);
    if (asked.ok() && asked->answer.match == Match::kExact && !asked->answer.incomplete) {
      p.skip = absl::StrCat("answered exactly by ", flags.db, " already");
    }
  }
  return absl::OkStatus();
}

}  // namespace kreg::cli
