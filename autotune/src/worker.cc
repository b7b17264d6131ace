// The worker's side: kreg-worker's loop (WorkerMain) reads a job, builds
// its problems once, then answers check and run requests until its input
// ends.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/dispatch.h"
#include "kreg/measure.h"
#include "kreg/registry.h"
#include "kreg/worker.h"
#include "kreg/worker.pb.h"
#include "worker_protocol.h"

namespace kreg {

using internal::CandidateKey;
using internal::Frame;
using internal::FromPairs;
using internal::TakeMessage;
using internal::ToProto;
using internal::Unframe;
using internal::WriteAll;

namespace {

// Blocking reads of framed messages.
class MessageReader {
 public:
  explicit MessageReader(int fd) : fd_(fd) {}
  enum Result { kMessage, kEnd, kBad };
  Result Next(google::protobuf::MessageLite* message) {
    for (;;) {
      switch (TakeMessage(&buffer_, message)) {
        case Unframe::kMessage:
          return kMessage;
        case Unframe::kBad:
          return kBad;
        case Unframe::kMore:
          break;
      }
      char buf[65536];
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return kEnd;
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buffer_;
};

// Inputs smaller than this are rotated among several buffers.
constexpr size_t kRotateBelowBytes = size_t{64} << 20;

// What a worker holds for its job: the plugins, the op and its values, the
// problems each rank measures on (rotated through), the device, and the
// candidates that passed their check.
struct Worker {
  WorkerJob job;
  Registry registry;
  std::shared_ptr<const Op> op;
  Values values;
  ProblemOptions options;
  std::shared_ptr<const Kernel> reference;
  // A composite op's sub-ops (sharded_matmul's local multiplies) run at
  // their op's default during a sweep: the same for every candidate.
  std::optional<Dispatcher> sub_ops;
  RunOptions sub_options;
  bool collective = false;
  CommOptions comm_options;
  // Per rank (one outside collectives): its problems, rotated through.
  std::vector<std::vector<std::unique_ptr<Problem>>> problems;
  std::vector<std::vector<Problem*>> rotation;
  std::unique_ptr<Device> device;
  absl::flat_hash_set<std::string> verified;  // candidates that passed, by CandidateKey
};

// Reads the job into `w`: its plugins, op, values and options. An error's
// message is the worker's fatal reply.
absl::Status ReadJob(const worker::Job& proto, Worker* w) {
  absl::StatusOr<WorkerJob> job = WorkerJob::FromProto(proto);
  if (!job.ok()) return job.status();
  w->job = *std::move(job);
  for (const absl::Status& s : w->registry.LoadPlugins(w->job.plugins)) return s;
  absl::StatusOr<std::shared_ptr<const Op>> op = w->registry.GetOp(w->job.op);
  if (!op.ok()) return op.status();
  w->op = *std::move(op);
  absl::StatusOr<Values> values = w->op->ParseValues(w->job.values);
  if (!values.ok()) return values.status();
  w->values = *std::move(values);
  absl::StatusOr<ProblemOptions> options = w->job.Options();
  if (!options.ok()) return options.status();
  w->options = *std::move(options);
  w->reference = w->registry.Reference(w->job.op);
  absl::StatusOr<Dispatcher> sub_ops = Dispatcher::Create(w->registry, TuningDb());
  if (!sub_ops.ok()) return sub_ops.status();
  w->sub_ops.emplace(*std::move(sub_ops));
  w->sub_options.num_threads = w->job.threads;
  w->collective = w->job.ranks > 0;
  if (w->collective) {
    if (absl::Status s = w->op->SetRanks(&w->values, w->job.ranks); !s.ok()) return s;
  }
  w->comm_options.timeout_seconds = w->job.comm_timeout > 0 ? w->job.comm_timeout : 30;
  if (!w->job.mesh.empty()) {
    absl::StatusOr<Mesh> mesh = ParseMesh(w->job.mesh);
    if (!mesh.ok()) return mesh.status();
    w->comm_options.mesh = *std::move(mesh);
  }
  return absl::OkStatus();
}

// Rank `comm`'s problems (nullptr: the one outside collectives): the first,
// then fresh random inputs to rotate through (the user's own data is used
// as is), the reference computed now, before any candidate's clock starts.
absl::Status BuildProblems(Worker* w, Comm* comm) {
  const int r = comm != nullptr ? comm->rank() : 0;
  ProblemOptions o = w->options;
  if (comm != nullptr) o.comm = comm->abi();
  absl::StatusOr<std::unique_ptr<Problem>> first = Problem::Make(w->op, w->reference, w->values, o);
  if (!first.ok()) return first.status();
  size_t bytes = 0;
  for (const auto& [name, t] : (*first)->inputs()) bytes += t->nbytes();
  w->problems[r].push_back(*std::move(first));
  const size_t buffers = o.inputs.empty() && bytes > 0 ? std::clamp<size_t>(kRotateBelowBytes / bytes, 1, 8) : 1;
  for (size_t i = 1; i < buffers; ++i) {
    o.seed = w->job.seed + i;
    absl::StatusOr<std::unique_ptr<Problem>> p = Problem::Make(w->op, w->reference, w->values, o);
    if (!p.ok()) return p.status();
    w->problems[r].push_back(*std::move(p));
  }
  for (auto& p : w->problems[r]) w->rotation[r].push_back(p.get());
  return w->problems[r][0]->ComputeReference();
}

// Opens the job's device (device kernels: once for the job), then builds
// every rank's problems.
absl::Status SetUp(Worker* w) {
  if (w->job.device == KREG_DEVICE_CUDA) {
    if (w->collective) {
      return absl::FailedPreconditionError("worker: collective ops run on the CPU's ranks, not on a device");
    }
    absl::StatusOr<std::unique_ptr<Device>> opened = OpenCuda(w->job.device_ordinal);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(), absl::StrCat("--device cuda: ", opened.status().message()));
    }
    w->device = *std::move(opened);
  } else if (w->job.device != 0) {
    return absl::InvalidArgumentError(absl::StrCat("worker: unknown device kind ", w->job.device));
  }
  w->problems.resize(w->collective ? w->job.ranks : 1);
  w->rotation.resize(w->problems.size());
  return w->collective ? RunRanks(ThreadComms(w->job.ranks, w->comm_options),
                                  [&](Comm& c) { return BuildProblems(w, &c); })
                       : BuildProblems(w, nullptr);
}

// The measurement of one run request.
Measurement RunCandidate(Worker* w, const worker::Request::Run& run) {
  Measurement m;
  const Params params = FromPairs(run.params());
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = w->registry.Get(run.kernel());
  if (!kernel.ok()) {
    m.error = std::string(kernel.status().message());
    return m;
  }
  absl::StatusOr<Config> config = (*kernel)->ParseConfig(params);
  if (!config.ok()) {
    m.status = TrialStatus::kIllegal;
    m.error = std::string(config.status().message());
    return m;
  }
  const std::string id = CandidateKey(run.kernel(), (*kernel)->ConfigPairs(*config));
  MeasureOptions measure;
  measure.warmup = w->job.warmup;
  measure.reps = run.reps();
  measure.max_seconds = w->job.max_seconds_per_run;
  measure.verified = run.verified() || w->verified.contains(id);
  measure.run.num_threads = run.threads() > 0 ? run.threads() : w->job.threads;
  measure.device = w->device.get();
  measure.cold = !w->job.warm;
  measure.run.dispatch = [w](absl::string_view sub_op, const kreg_args& sub_args) {
    return w->sub_ops->Run(sub_op, sub_args, w->sub_options).status();
  };
  if (!w->collective) {
    m = MeasureKernel(**kernel, *config, w->rotation[0], measure);
  } else {
    // A fresh communicator: a failed candidate leaves its world failed.
    std::vector<Measurement> per_rank(w->job.ranks);
    (void)RunRanks(ThreadComms(w->job.ranks, w->comm_options), [&](Comm& c) {
      MeasureOptions o = measure;
      o.comm = &c;
      per_rank[c.rank()] = MeasureKernel(**kernel, *config, w->rotation[c.rank()], o);
      return absl::OkStatus();
    });
    m = per_rank[0];
  }
  if (m.ok()) w->verified.insert(id);
  return m;
}

worker::Reply DoneReply(int64_t id, const Measurement& m) {
  worker::Reply reply;
  worker::Reply::Done* done = reply.mutable_done();
  done->set_id(id);
  done->set_status(ToProto(m.status));
  done->set_median_ns(m.median_ns);
  done->set_min_ns(m.min_ns);
  done->set_max_ns(m.max_ns);
  done->set_reps(m.reps);
  done->set_error(m.error);
  return reply;
}

}  // namespace

int WorkerMain(int in_fd, int protocol_fd) {
  // Die with the tuner, even if it is killed outright; and not start where
  // it already has (kWorkerParentEnv; without it, as run by hand, the
  // parent is whoever it is now).
  const char* named = std::getenv(kWorkerParentEnv);
  const pid_t parent = named != nullptr ? static_cast<pid_t>(std::atol(named)) : getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) {
    const std::string why = absl::StrCat("kreg-worker: the tuner (pid ", named != nullptr ? named : "?",
                                         ") is gone; not starting\n");
    WriteAll(2, why);
    return 1;
  }
  // The protocol gets its own descriptor; whatever a kernel prints to
  // stdout goes to stderr instead of into the protocol.
  const int out_fd = protocol_fd == 1 ? fcntl(1, F_DUPFD_CLOEXEC, 3) : protocol_fd;
  if (out_fd < 0) return 1;
  if (protocol_fd == 1) dup2(2, 1);
  MessageReader in(in_fd);
  auto send = [&](const worker::Reply& reply) { WriteAll(out_fd, Frame(reply)); };
  auto fatal = [&](absl::string_view why) {
    worker::Reply reply;
    reply.mutable_fatal()->set_message(std::string(why));
    send(reply);
    return 1;
  };
  worker::Job job_proto;
  switch (in.Next(&job_proto)) {
    case MessageReader::kMessage:
      break;
    case MessageReader::kEnd:
      return 1;
    case MessageReader::kBad:
      return fatal("worker: the job does not parse");
  }
  auto w = std::make_unique<Worker>();
  if (absl::Status s = ReadJob(job_proto, w.get()); !s.ok()) return fatal(s.message());
  if (absl::Status s = SetUp(w.get()); !s.ok()) return fatal(s.message());

  worker::Request request;
  for (;;) {
    switch (in.Next(&request)) {
      case MessageReader::kMessage:
        break;
      case MessageReader::kEnd:
        return 0;
      case MessageReader::kBad:
        return fatal("worker: a request does not parse");
    }
    worker::Reply reply;
    if (request.has_check()) {
      const worker::Request::Check& check = request.check();
      reply.mutable_started()->set_id(check.id());
      send(reply);
      reply.Clear();
      worker::Reply::Checked* checked = reply.mutable_checked();
      checked->set_id(check.id());
      internal::AnswerCheck(w->registry, check, *w->problems[0][0]->args(), checked);
      send(reply);
      continue;
    }
    if (!request.has_run()) return fatal("worker: a request that is neither run nor check");
    const worker::Request::Run& run = request.run();
    reply.mutable_started()->set_id(run.id());
    send(reply);
    send(DoneReply(run.id(), RunCandidate(w.get(), run)));
  }
}

}  // namespace kreg
