#include "kreg/worker.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/comm.h"
#include "kreg/device.h"
#include "kreg/dispatch.h"
#include "kreg/measure.h"
#include "kreg/npy.h"
#include "kreg/registry.h"
#include "kreg/worker.pb.h"
#include "worker_protocol.h"

#ifndef KREG_WORKER_INSTALL_PATH
#define KREG_WORKER_INSTALL_PATH "/usr/local/libexec/kreg/kreg-worker"
#endif
#ifndef KREG_WORKER_RELATIVE_PATH
#define KREG_WORKER_RELATIVE_PATH "../libexec/kreg/kreg-worker"
#endif

extern char** environ;

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

}  // namespace internal

namespace {

using Clock = std::chrono::steady_clock;
using internal::Frame;
using internal::TakeMessage;
using internal::Unframe;

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

}  // namespace

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

// ---- Finding the worker -------------------------------------------------------

namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string RealPath(const std::string& path) {
  char* real = realpath(path.c_str(), nullptr);
  if (real == nullptr) return "";
  std::string out(real);
  std::free(real);
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> FindWorker() {
  if (const char* env = std::getenv("KREG_WORKER"); env != nullptr && *env != '\0') {
    if (IsExecutableFile(env)) return std::vector<std::string>{env};
    return absl::NotFoundError(absl::StrCat("KREG_WORKER=", env, " is not an executable file"));
  }
  std::vector<std::string> looked;  // in order, without repeats
  auto look = [&](const std::string& path) {
    if (path.empty() || std::find(looked.begin(), looked.end(), path) != looked.end()) return false;
    looked.push_back(path);
    return IsExecutableFile(path);
  };
  auto next_to = [&](const std::string& file, std::string* found) {
    if (file.empty()) return false;
    for (const char* relative : {"../libexec/kreg/kreg-worker", KREG_WORKER_RELATIVE_PATH}) {
      std::string candidate = absl::StrCat(DirOf(file), "/", relative);
      if (look(candidate)) {
        // Absolute, so that it still holds if the caller changes directory.
        std::string real = RealPath(candidate);
        *found = real.empty() ? candidate : real;
        return true;
      }
    }
    return false;
  };
  std::string found;
  // Beside kreg's library, wherever the prefix was moved.
  if (!InstallPrefix().empty()) {
    const std::string beside = absl::StrCat(InstallPrefix(), "/", KREG_WORKER_SUBDIR, "/kreg-worker");
    if (look(beside)) return std::vector{beside};
  }
  // The binary or shared object holding this code: a Python extension, the
  // kreg binary (whose dli_fname is then argv[0], resolved against the
  // working directory as long as it holds a '/'). Its real path first, so a
  // symlink into PATH still finds the install it points into.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&FindWorker), &info) != 0 && info.dli_fname != nullptr &&
      std::strchr(info.dli_fname, '/') != nullptr) {
    if (next_to(RealPath(info.dli_fname), &found) || next_to(info.dli_fname, &found)) return std::vector{found};
  }
  if (next_to(RealPath("/proc/self/exe"), &found)) return std::vector{found};
  if (look(KREG_WORKER_INSTALL_PATH)) return std::vector<std::string>{KREG_WORKER_INSTALL_PATH};
  return absl::NotFoundError(absl::StrCat("kreg-worker, the tuner's measuring program, not found (set KREG_WORKER); "
                                          "looked for ", absl::StrJoin(looked, ", ")));
}

// ---- The parent's side ------------------------------------------------------

IsolatedRunner::IsolatedRunner(std::vector<std::string> command, WorkerJob job, double timeout_seconds)
    : command_(std::move(command)), job_(std::move(job)), timeout_(timeout_seconds) {}

IsolatedRunner::~IsolatedRunner() { Kill(); }

absl::Status IsolatedRunner::Spawn() {
  if (command_.empty()) return absl::InvalidArgumentError("no worker command");
  // A worker that dies before reading its input must not take the tuner
  // with it: writes to its pipe then fail with EPIPE instead of raising
  // SIGPIPE. (Only a default disposition is changed.)
  struct sigaction pipe_action {};
  if (sigaction(SIGPIPE, nullptr, &pipe_action) == 0 && pipe_action.sa_handler == SIG_DFL) {
    pipe_action.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &pipe_action, nullptr);
  }
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  if (pipe2(out, O_CLOEXEC) != 0) {
    const int err = errno;
    close(in[0]);
    close(in[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(err)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  std::vector<char*> argv;
  for (std::string& a : command_) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Its own process group: a Ctrl-C at the terminal stops the tuner, which
  // then stops the worker, rather than killing a candidate mid-run.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    return absl::InternalError(absl::StrCat("cannot start worker ", command_[0], ": ", std::strerror(rc)));
  }
  pid_ = pid;
  to_ = in[1];
  from_ = out[0];
  // Writes wait in poll(), so that a worker that does not read (busy
  // setting up, hung) cannot block the tuner past its timeout or stop flag.
  fcntl(to_, F_SETFL, fcntl(to_, F_GETFL) | O_NONBLOCK);
  buffer_.clear();
  fresh_ = true;
  ++started_;
  worker::Job job;
  job_.ToProto(&job);
  pending_ = Frame(job);
  return absl::OkStatus();
}

void IsolatedRunner::Kill() {
  if (pid_ <= 0) return;
  kill(-pid_, SIGKILL);  // its process group: whatever a kernel started too
  int status;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  close(to_);
  close(from_);
  pid_ = -1;
}

std::string IsolatedRunner::ExitReason() {
  exit_signal_ = 0;
  // It closed its output; give it a moment to exit, then make sure.
  int status = 0;
  pid_t r = 0;
  for (int i = 0; i < 100 && r == 0; ++i) {
    r = waitpid(pid_, &status, WNOHANG);
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (r < 0 && errno == EINTR) r = 0;
  }
  if (r == 0) {
    kill(-pid_, SIGKILL);
    while ((r = waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
    }
  }
  close(to_);
  close(from_);
  pid_ = -1;
  if (r <= 0) return "worker vanished";
  if (WIFSIGNALED(status)) {
    exit_signal_ = WTERMSIG(status);
    return absl::StrCat("worker killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("worker exited with status ", WEXITSTATUS(status));
}

IsolatedRunner::Lost IsolatedRunner::ReadReply(double seconds, worker::Reply* reply) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    switch (TakeMessage(&buffer_, reply)) {
      case Unframe::kMessage:
        return Lost::kNone;
      case Unframe::kBad:
        return Lost::kGarbled;
      case Unframe::kMore:
        break;
    }
    if (stop_ != nullptr && stop_->load()) return Lost::kStopped;
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) return Lost::kTimedOut;
    pollfd p{from_, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min(left * 1000 + 1, 100.0)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) continue;
    char buf[4096];
    ssize_t n = read(from_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Lost::kDied;
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

IsolatedRunner::Lost IsolatedRunner::Write(const std::string& data, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(to_, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (stop_ != nullptr && stop_->load()) return Lost::kStopped;
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      if (left <= 0) return Lost::kTimedOut;
      pollfd p{to_, POLLOUT, 0};
      poll(&p, 1, static_cast<int>(std::min(left * 1000 + 1, 100.0)));
      continue;
    }
    return Lost::kDied;  // EPIPE: it exited; ExitReason says how
  }
  return Lost::kNone;
}

IsolatedRunner::Answer IsolatedRunner::Ask(const std::string& request, int64_t id, worker::Reply* reply) {
  Answer a;
  if (pid_ <= 0) {
    if (absl::Status s = Spawn(); !s.ok()) {
      a.why = fatal_ = std::string(s.message());
      return a;
    }
  }
  // A fresh worker builds its inputs and the reference before it reads its
  // first request and answers Started.
  const bool fresh = fresh_;
  fresh_ = false;
  const double setup = fresh ? kSetupSeconds : timeout_;
  a.lost = Write(pending_ + request, setup);
  pending_.clear();
  while (a.lost == Lost::kNone) {
    a.lost = ReadReply(a.started ? timeout_ : setup, reply);
    if (a.lost != Lost::kNone) break;
    switch (reply->kind_case()) {
      case worker::Reply::kFatal:
        a.why = fatal_ = reply->fatal().message();
        if (fatal_.empty()) a.why = fatal_ = "the worker failed without a reason";
        Kill();
        return a;
      case worker::Reply::kStarted:
        if (reply->started().id() == id) a.started = true;
        break;
      case worker::Reply::kDone:
        if (reply->done().id() == id) a.ok = true;
        break;
      case worker::Reply::kChecked:
        if (reply->checked().id() == id) a.ok = true;
        break;
      default:
        break;
    }
    if (a.ok) return a;
  }
  switch (a.lost) {
    case Lost::kStopped:
      Kill();
      a.why = "interrupted";
      return a;
    case Lost::kGarbled:
      Kill();
      a.why = "the worker broke the protocol (a message that does not parse); worker killed";
      return a;
    case Lost::kTimedOut:
      Kill();
      a.why = a.started || !fresh ? absl::StrCat("no result within ", timeout_, " s; worker killed")
                                  : absl::StrCat("the worker did not set the problem up within ", kSetupSeconds,
                                                 " s; worker killed");
      break;
    case Lost::kDied:
    case Lost::kNone:
      a.why = ExitReason();
      break;
  }
  // Setting up is the same for every request: a worker that crashes or
  // hangs there would do so again.
  if (fresh && !a.started) a.why = fatal_ = absl::StrCat("the worker failed while setting the problem up: ", a.why);
  return a;
}

Measurement IsolatedRunner::Measure(const std::string& name, const Params& params, int reps, int threads) {
  Measurement m;
  if (!fatal_.empty()) {
    m.error = fatal_;
    return m;
  }
  const int64_t id = next_id_++;
  const std::string key = CandidateKey(name, params);
  worker::Request request;
  worker::Request::Run* run = request.mutable_run();
  run->set_id(id);
  run->set_kernel(name);
  ToPairs(params, run->mutable_params());
  run->set_reps(reps);
  run->set_verified(verified_.contains(key));
  run->set_threads(threads);
  worker::Reply reply;
  const Answer a = Ask(Frame(request), id, &reply);
  if (!a.ok) {
    m.error = a.why;
    if (fatal_.empty() && a.lost == Lost::kTimedOut) m.status = TrialStatus::kTimedOut;
    if (fatal_.empty() && a.lost == Lost::kDied) {
      m.status = TrialStatus::kCrashed;
      m.signal = exit_signal_;
    }
    return m;
  }
  m = internal::MeasurementFromReply(reply);
  if (m.ok()) verified_.insert(key);
  return m;
}

std::vector<Legality> IsolatedRunner::CheckLegal(const std::string& name, const std::vector<Params>& configs) {
  std::vector<Legality> out(configs.size());
  auto all = [&](TrialStatus status, const std::string& why) {
    for (Legality& l : out) l = {status, why};
    return out;
  };
  if (configs.empty()) return out;
  if (!fatal_.empty()) return all(TrialStatus::kError, fatal_);
  const int64_t id = next_id_++;
  worker::Request request;
  worker::Request::Check* check = request.mutable_check();
  check->set_id(id);
  check->set_kernel(name);
  for (const Params& params : configs) ToPairs(params, check->add_candidates()->mutable_params());
  worker::Reply reply;
  const Answer a = Ask(Frame(request), id, &reply);
  if (!a.ok) {
    if (fatal_.empty() && a.lost == Lost::kTimedOut) {
      return all(TrialStatus::kTimedOut, absl::StrCat("the kernel's check hung: ", a.why));
    }
    if (fatal_.empty() && a.lost == Lost::kDied) {
      return all(TrialStatus::kCrashed, absl::StrCat("the kernel's check crashed: ", a.why));
    }
    return all(TrialStatus::kError, a.why);
  }
  return internal::LegalityFromReply(reply, configs.size());
}

// ---- The worker's side ------------------------------------------------------

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

}  // namespace

int WorkerMain(int in_fd, int protocol_fd) {
  // Die with the tuner, even if it is killed outright.
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return 1;
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
  absl::StatusOr<WorkerJob> job = WorkerJob::FromProto(job_proto);
  if (!job.ok()) return fatal(job.status().message());
  Registry registry;
  for (const absl::Status& s : registry.LoadPlugins(job->plugins)) return fatal(s.message());
  absl::StatusOr<std::shared_ptr<const Op>> op = registry.GetOp(job->op);
  if (!op.ok()) return fatal(op.status().message());
  absl::StatusOr<Values> values = (*op)->ParseValues(job->values);
  if (!values.ok()) return fatal(values.status().message());
  absl::StatusOr<ProblemOptions> options = job->Options();
  if (!options.ok()) return fatal(options.status().message());
  std::shared_ptr<const Kernel> reference = registry.Reference(job->op);
  // A composite op's sub-ops (sharded_matmul's local multiplies) run at
  // their op's default during a sweep: the same for every candidate.
  absl::StatusOr<Dispatcher> sub_ops = Dispatcher::Create(registry, TuningDb());
  if (!sub_ops.ok()) return fatal(sub_ops.status().message());
  RunOptions sub_options;
  sub_options.num_threads = job->threads;
  const bool collective = job->ranks > 0;
  if (collective) {
    if (absl::Status s = (*op)->SetRanks(&*values, job->ranks); !s.ok()) return fatal(s.message());
  }
  CommOptions comm_options;
  comm_options.timeout_seconds = job->comm_timeout > 0 ? job->comm_timeout : 30;
  if (!job->mesh.empty()) {
    absl::StatusOr<Mesh> mesh = ParseMesh(job->mesh);
    if (!mesh.ok()) return fatal(mesh.status().message());
    comm_options.mesh = *std::move(mesh);
  }
  // Per rank (one outside collectives): its problems, rotated through.
  std::vector<std::vector<std::unique_ptr<Problem>>> problems(collective ? job->ranks : 1);
  std::vector<std::vector<Problem*>> rotation(problems.size());
  auto build = [&](Comm* comm) -> absl::Status {
    const int r = comm != nullptr ? comm->rank() : 0;
    ProblemOptions o = *options;
    if (comm != nullptr) o.comm = comm->abi();
    absl::StatusOr<std::unique_ptr<Problem>> first = Problem::Make(*op, reference, *values, o);
    if (!first.ok()) return first.status();
    size_t bytes = 0;
    for (const auto& [name, t] : (*first)->inputs()) bytes += t->nbytes();
    problems[r].push_back(*std::move(first));
    // Fresh random inputs to rotate through; the user's own data is used as is.
    const size_t buffers = o.inputs.empty() && bytes > 0 ? std::clamp<size_t>(kRotateBelowBytes / bytes, 1, 8) : 1;
    for (size_t i = 1; i < buffers; ++i) {
      o.seed = job->seed + i;
      absl::StatusOr<std::unique_ptr<Problem>> p = Problem::Make(*op, reference, *values, o);
      if (!p.ok()) return p.status();
      problems[r].push_back(*std::move(p));
    }
    for (auto& p : problems[r]) rotation[r].push_back(p.get());
    // The reference is computed now, before any candidate's clock starts.
    return problems[r][0]->ComputeReference();
  };
  // Device kernels: the device, opened once for the job.
  std::unique_ptr<Device> device;
  if (job->device == KREG_DEVICE_CUDA) {
    if (collective) return fatal("worker: collective ops run on the CPU's ranks, not on a device");
    absl::StatusOr<std::unique_ptr<Device>> opened = OpenCuda(job->device_ordinal);
    if (!opened.ok()) return fatal(absl::StrCat("--device cuda: ", opened.status().message()));
    device = *std::move(opened);
  } else if (job->device != 0) {
    return fatal(absl::StrCat("worker: unknown device kind ", job->device));
  }
  absl::Status built = collective ? RunRanks(ThreadComms(job->ranks, comm_options), [&](Comm& c) { return build(&c); })
                                  : build(nullptr);
  if (!built.ok()) return fatal(built.message());
  absl::flat_hash_set<std::string> verified;  // candidates that passed, by CandidateKey

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
      internal::AnswerCheck(registry, check, *problems[0][0]->args(), checked);
      send(reply);
      continue;
    }
    if (!request.has_run()) return fatal("worker: a request that is neither run nor check");
    const worker::Request::Run& run = request.run();
    reply.mutable_started()->set_id(run.id());
    send(reply);
    Measurement m;
    const Params params = FromPairs(run.params());
    absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry.Get(run.kernel());
    if (!kernel.ok()) {
      m.error = std::string(kernel.status().message());
    } else if (absl::StatusOr<Config> config = (*kernel)->ParseConfig(params); !config.ok()) {
      m.status = TrialStatus::kIllegal;
      m.error = std::string(config.status().message());
    } else {
      const std::string id = CandidateKey(run.kernel(), (*kernel)->ConfigPairs(*config));
      MeasureOptions measure;
      measure.warmup = job->warmup;
      measure.reps = run.reps();
      measure.max_seconds = job->max_seconds_per_run;
      measure.verified = run.verified() || verified.contains(id);
      measure.run.num_threads = run.threads() > 0 ? run.threads() : job->threads;
      measure.device = device.get();
      measure.cold = !job->warm;
      measure.run.dispatch = [&](absl::string_view sub_op, const kreg_args& sub_args) {
        return sub_ops->Run(sub_op, sub_args, sub_options).status();
      };
      if (!collective) {
        m = MeasureKernel(**kernel, *config, rotation[0], measure);
      } else {
        // A fresh communicator: a failed candidate leaves its world failed.
        std::vector<Measurement> per_rank(job->ranks);
        (void)RunRanks(ThreadComms(job->ranks, comm_options), [&](Comm& c) {
          MeasureOptions o = measure;
          o.comm = &c;
          per_rank[c.rank()] = MeasureKernel(**kernel, *config, rotation[c.rank()], o);
          return absl::OkStatus();
        });
        m = per_rank[0];
      }
      if (m.ok()) verified.insert(id);
    }
    reply.Clear();
    worker::Reply::Done* done = reply.mutable_done();
    done->set_id(run.id());
    done->set_status(ToProto(m.status));
    done->set_median_ns(m.median_ns);
    done->set_min_ns(m.min_ns);
    done->set_max_ns(m.max_ns);
    done->set_reps(m.reps);
    done->set_error(m.error);
    send(reply);
  }
}

}  // namespace kreg
