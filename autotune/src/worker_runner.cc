// The parent's side of a measuring worker: finding the kreg-worker
// program, and the IsolatedRunner that starts it, asks it and reads its
// answers under a timeout.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/registry.h"
#include "kreg/worker.h"
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

using Clock = std::chrono::steady_clock;
using internal::CandidateKey;
using internal::Frame;
using internal::TakeMessage;
using internal::ToPairs;
using internal::Unframe;
using internal::WriteAll;

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
  // The environment, with this process named as the worker's parent.
  const std::string name = absl::StrCat(kWorkerParentEnv, "="), parent = absl::StrCat(name, getpid());
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, name)) envp.push_back(*e);
  }
  envp.push_back(const_cast<char*>(parent.c_str()));
  envp.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
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

}  // namespace kreg
