// The worker protocol (autotune/worker.proto): framing, what both ends
// make of its messages, and the job a worker is given.
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "kreg/device.h"
#include "kreg/npy.h"
#include "kreg/worker.h"
#include "kreg/worker.pb.h"
#include "worker_protocol.h"

namespace kreg {

// ---- Framing: a varint length, then the message -----------------------------

namespace internal {

std::string Frame(const google::protobuf::MessageLite& message) {
  const std::string body = message.SerializeAsString();
  std::string out;
  uint64_t n = body.size();
  do {
    out.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
    n >>= 7;
  } while (n != 0);
  return out + body;
}

Unframe TakeMessage(std::string* buffer, google::protobuf::MessageLite* message) {
  uint64_t size = 0;
  size_t i = 0;
  for (;; ++i) {
    if (i == buffer->size()) return Unframe::kMore;
    if (i == 10) return Unframe::kBad;
    const auto byte = static_cast<unsigned char>((*buffer)[i]);
    size |= uint64_t{byte & 0x7fu} << (7 * i);
    if ((byte & 0x80) == 0) break;
  }
  if (size > kMaxMessageBytes) return Unframe::kBad;
  if (buffer->size() - (i + 1) < size) return Unframe::kMore;
  const bool ok = message->ParseFromArray(buffer->data() + i + 1, static_cast<int>(size));
  buffer->erase(0, i + 1 + size);
  return ok ? Unframe::kMessage : Unframe::kBad;
}

bool WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void ToPairs(const std::vector<std::pair<std::string, std::string>>& pairs,
             google::protobuf::RepeatedPtrField<worker::Pair>* out) {
  for (const auto& [name, value] : pairs) {
    worker::Pair* p = out->Add();
    p->set_name(name);
    p->set_value(value);
  }
}

std::vector<std::pair<std::string, std::string>> FromPairs(
    const google::protobuf::RepeatedPtrField<worker::Pair>& pairs) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(pairs.size());
  for (const worker::Pair& p : pairs) out.emplace_back(p.name(), p.value());
  return out;
}

worker::Reply::Done::Status ToProto(TrialStatus s) {
  switch (s) {
    case TrialStatus::kOk:
      return worker::Reply::Done::OK;
    case TrialStatus::kWrongResult:
      return worker::Reply::Done::WRONG_RESULT;
    case TrialStatus::kCrashed:
      return worker::Reply::Done::CRASHED;
    case TrialStatus::kTimedOut:
      return worker::Reply::Done::TIMED_OUT;
    case TrialStatus::kIllegal:
      return worker::Reply::Done::ILLEGAL;
    case TrialStatus::kError:
      break;
  }
  return worker::Reply::Done::ERROR;
}

TrialStatus FromProto(worker::Reply::Done::Status s) {
  switch (s) {
    case worker::Reply::Done::OK:
      return TrialStatus::kOk;
    case worker::Reply::Done::WRONG_RESULT:
      return TrialStatus::kWrongResult;
    case worker::Reply::Done::CRASHED:
      return TrialStatus::kCrashed;
    case worker::Reply::Done::TIMED_OUT:
      return TrialStatus::kTimedOut;
    case worker::Reply::Done::ILLEGAL:
      return TrialStatus::kIllegal;
    default:
      return TrialStatus::kError;
  }
}

// The key of a candidate in IsolatedRunner::verified_: every part framed by
// its length, so no byte in a name or value can make two keys collide.
std::string CandidateKey(const std::string& name, const Params& params) {
  std::string key = absl::StrCat(name.size(), ":", name);
  for (const auto& [k, v] : params) absl::StrAppend(&key, k.size(), ":", k, v.size(), ":", v);
  return key;
}

}  // namespace internal

using internal::FromPairs;
using internal::ToPairs;

// ---- Reading answers and checking candidates ----------------------------------

namespace internal {

Measurement MeasurementFromReply(const worker::Reply& reply) {
  Measurement m;
  if (!reply.has_done()) {
    m.error = "the worker answered a measurement with a legality check";
    return m;
  }
  const worker::Reply::Done& done = reply.done();
  m.status = FromProto(done.status());
  m.median_ns = done.median_ns();
  m.min_ns = done.min_ns();
  m.max_ns = done.max_ns();
  m.reps = done.reps();
  m.error = done.error();
  return m;
}

std::vector<Legality> LegalityFromReply(const worker::Reply& reply, size_t expected) {
  std::vector<Legality> out(expected);
  if (!reply.has_checked() || static_cast<size_t>(reply.checked().legality_size()) != expected) {
    for (Legality& l : out) {
      l = {TrialStatus::kError, "the worker's answer to a legality check does not match the request"};
    }
    return out;
  }
  for (size_t i = 0; i < expected; ++i) {
    const worker::Reply::Legality& l = reply.checked().legality(static_cast<int>(i));
    out[i].status = l.legal() ? TrialStatus::kOk : l.error() ? TrialStatus::kError : TrialStatus::kIllegal;
    out[i].why = l.legal() ? "" : l.why();
  }
  return out;
}

void AnswerCheck(const Registry& registry, const worker::Request::Check& check, const kreg_args& args,
                 worker::Reply::Checked* checked) {
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry.Get(check.kernel());
  for (const worker::Candidate& candidate : check.candidates()) {
    worker::Reply::Legality* legality = checked->add_legality();
    if (!kernel.ok()) {
      legality->set_error(true);
      legality->set_why(std::string(kernel.status().message()));
      continue;
    }
    if (absl::Status can = CanRun(**kernel); !can.ok()) {
      legality->set_why(std::string(can.message()));
      continue;
    }
    absl::StatusOr<Config> config = (*kernel)->ParseConfig(FromPairs(candidate.params()));
    // A device kernel's check sees the shapes (its data would be on the device).
    kreg_args shapes = args;
    if ((*kernel)->device() != 0) shapes.flags |= KREG_ARGS_SHAPE_ONLY;
    absl::Status s = config.ok() ? (*kernel)->Check(*config, shapes) : config.status();
    legality->set_legal(s.ok());
    if (!s.ok()) legality->set_why(std::string(s.message()));
  }
}

}  // namespace internal

void WorkerJob::ToProto(worker::Job* out) const {
  out->Clear();
  out->set_op(op);
  ToPairs(values, out->mutable_values());
  ToPairs(dtypes, out->mutable_dtypes());
  for (const std::string& w : with) out->add_with(w);
  out->set_dist(std::string(DistName(dist)));
  out->set_partition(std::string(PartitionName(partition)));
  out->set_seed(seed);
  ToPairs(input_files, out->mutable_input_files());
  for (const std::string& p : plugins) out->add_plugins(p);
  out->set_warmup(warmup);
  out->set_threads(threads);
  out->set_max_seconds_per_run(max_seconds_per_run);
  out->set_ranks(ranks);
  out->set_comm_timeout(comm_timeout);
  out->set_mesh(mesh);
  out->set_device(device);
  out->set_device_ordinal(device_ordinal);
  out->set_warm(warm);
}

absl::StatusOr<WorkerJob> WorkerJob::FromProto(const worker::Job& proto) {
  WorkerJob job;
  job.op = proto.op();
  job.values = FromPairs(proto.values());
  job.dtypes = FromPairs(proto.dtypes());
  job.with.assign(proto.with().begin(), proto.with().end());
  if (!proto.dist().empty()) {
    absl::StatusOr<Dist> d = ParseDist(proto.dist());
    if (!d.ok()) return d.status();
    job.dist = *d;
  }
  if (!proto.partition().empty()) {
    absl::StatusOr<Partition> p = ParsePartition(proto.partition());
    if (!p.ok()) return p.status();
    job.partition = *p;
  }
  job.seed = proto.seed();
  job.input_files = FromPairs(proto.input_files());
  job.plugins.assign(proto.plugins().begin(), proto.plugins().end());
  job.warmup = proto.warmup();
  job.threads = proto.threads();
  job.max_seconds_per_run = proto.max_seconds_per_run();
  job.ranks = proto.ranks();
  job.comm_timeout = proto.comm_timeout();
  job.mesh = proto.mesh();
  job.device = proto.device();
  job.device_ordinal = proto.device_ordinal();
  job.warm = proto.warm();
  return job;
}

absl::StatusOr<ProblemOptions> WorkerJob::Options() const {
  ProblemOptions options;
  for (const auto& [name, dtype] : dtypes) {
    absl::StatusOr<DType> d = ParseDType(dtype);
    if (!d.ok()) return d.status();
    options.dtypes[name] = *d;
  }
  options.with.insert(with.begin(), with.end());
  options.dist = dist;
  options.partition = partition;
  options.seed = seed;
  for (const auto& [name, path] : input_files) {
    absl::StatusOr<Tensor> t = ReadNpy(path);
    if (!t.ok()) return t.status();
    options.inputs[name] = *std::move(t);
  }
  return options;
}

}  // namespace kreg
