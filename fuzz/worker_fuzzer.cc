// Fuzzes the tuner's worker protocol (autotune/worker.proto) on both ends,
// without processes or pipes: the framing (TakeMessage, Frame), the worker's
// decoding of its Job (WorkerJob::FromProto) and of its requests, and the
// tuner's decoding of replies. No kernel runs and nothing forks: a job that
// decodes is set up as the worker sets it up — op lookup, ParseValues, the
// problem's options — but with shape-only arguments (MakeShapeArgs) in place
// of the problem's inputs, from the build's plugins rather than the job's
// plugin list, and without its input files; Check requests are then
// answered as the worker answers them (AnswerCheck: the kernel's check on
// those arguments).
//
// Input: byte 0's low bit picks the end. 0, the worker: the rest is the
// worker's stdin, a framed Job and then framed Requests. 1, the tuner: the
// rest is the worker's stdout, framed Replies, each decoded as the answer to
// a Run and to a Check.
//
// Properties, beyond "no crash, no sanitizer report": a message framed and
// taken back is the same message and leaves nothing behind; a job that
// decodes reads back the same after ToProto (every field round-trips); a
// Run's parameters that parse read back the same (ConfigPairs).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "autotune/src/worker_protocol.h"
#include "fuzz/fuzz_registry.h"
#include "kreg/problem.h"
#include "kreg/registry.h"
#include "kreg/worker.h"
#include "kreg/worker.pb.h"

namespace kreg::fuzz {
namespace {

using internal::Frame;
using internal::TakeMessage;
using internal::Unframe;

// Messages read per input, at most.
constexpr int kMaxMessages = 32;

// Frame(m) taken back is m, with nothing left over.
template <typename Message>
void CheckReframes(const Message& message) {
  std::string framed = Frame(message);
  Message back;
  KREG_FUZZ_CHECK(TakeMessage(&framed, &back) == Unframe::kMessage);
  KREG_FUZZ_CHECK(framed.empty());
  KREG_FUZZ_CHECK(back.SerializeAsString() == message.SerializeAsString());
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool SameJob(const WorkerJob& a, const WorkerJob& b) {
  return a.op == b.op && a.values == b.values && a.dtypes == b.dtypes && a.with == b.with && a.dist == b.dist &&
         a.partition == b.partition && a.seed == b.seed && a.input_files == b.input_files && a.plugins == b.plugins &&
         a.warmup == b.warmup && a.threads == b.threads && SameBits(a.max_seconds_per_run, b.max_seconds_per_run) &&
         a.ranks == b.ranks && SameBits(a.comm_timeout, b.comm_timeout);
}

void Worker(std::string stream) {
  worker::Job proto;
  if (TakeMessage(&stream, &proto) != Unframe::kMessage) return;
  CheckReframes(proto);
  absl::StatusOr<WorkerJob> job = WorkerJob::FromProto(proto);
  if (!job.ok()) return;
  worker::Job again;
  job->ToProto(&again);
  absl::StatusOr<WorkerJob> back = WorkerJob::FromProto(again);
  KREG_FUZZ_CHECK(back.ok() && SameJob(*job, *back));

  // The worker's set-up (WorkerMain), shape-only.
  const Registry& registry = FuzzRegistry();
  absl::StatusOr<std::shared_ptr<const Op>> op = registry.GetOp(job->op);
  if (!op.ok()) return;
  absl::StatusOr<Values> values = (*op)->ParseValues(job->values);
  if (!values.ok()) return;
  WorkerJob local = *job;
  local.input_files.clear();
  absl::StatusOr<ProblemOptions> options = local.Options();
  if (!options.ok()) return;
  if (job->ranks > 0 && !(*op)->SetRanks(&*values, job->ranks).ok()) return;
  ShapeArgs shape;
  if (!MakeShapeArgs(**op, *values, *options, &shape).ok()) return;

  worker::Request request;
  for (int i = 0; i < kMaxMessages && TakeMessage(&stream, &request) == Unframe::kMessage; ++i) {
    CheckReframes(request);
    if (request.has_check()) {
      worker::Reply reply;
      worker::Reply::Checked* checked = reply.mutable_checked();
      checked->set_id(request.check().id());
      internal::AnswerCheck(registry, request.check(), *shape.args(), checked);
      CheckReframes(reply);
      const std::vector<Legality> legality =
          internal::LegalityFromReply(reply, static_cast<size_t>(request.check().candidates_size()));
      KREG_FUZZ_CHECK(legality.size() == static_cast<size_t>(request.check().candidates_size()));
    } else if (request.has_run()) {
      absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry.Get(request.run().kernel());
      if (!kernel.ok()) continue;
      Params params;
      for (const worker::Pair& p : request.run().params()) params.emplace_back(p.name(), p.value());
      absl::StatusOr<Config> config = (*kernel)->ParseConfig(params);
      if (!config.ok()) continue;
      absl::StatusOr<Config> reread = (*kernel)->ParseConfig((*kernel)->ConfigPairs(*config));
      KREG_FUZZ_CHECK(reread.ok() && *reread == *config);
    }
  }
}

void Tuner(std::string stream) {
  worker::Reply reply;
  for (int i = 0; i < kMaxMessages && TakeMessage(&stream, &reply) == Unframe::kMessage; ++i) {
    CheckReframes(reply);
    const Measurement m = internal::MeasurementFromReply(reply);
    KREG_FUZZ_CHECK(reply.has_done() || m.status == TrialStatus::kError);
    (void)TrialStatusName(m.status);
    const size_t n = reply.has_checked() ? static_cast<size_t>(reply.checked().legality_size()) : 1;
    KREG_FUZZ_CHECK(internal::LegalityFromReply(reply, n).size() == n);
    KREG_FUZZ_CHECK(internal::LegalityFromReply(reply, n + 1).size() == n + 1);
  }
}

}  // namespace
}  // namespace kreg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    kreg::fuzz::Worker(std::move(stream));
  } else {
    kreg::fuzz::Tuner(std::move(stream));
  }
  return 0;
}
