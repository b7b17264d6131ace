#include "kreg/worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kreg/measure.h"
#include "kreg/npy.h"
#include "kreg/registry.h"

extern char** environ;

namespace kreg {
namespace {

using Clock = std::chrono::steady_clock;

// Fields are tab-separated; values may not contain tabs or newlines.
bool Clean(absl::string_view s) { return s.find_first_of("\t\n") == absl::string_view::npos; }

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

std::string WorkerJob::Serialize() const {
  std::vector<std::string> inputs, plugin_list, types;
  for (const auto& [name, path] : input_files) inputs.push_back(absl::StrCat(name, ":", path));
  for (const auto& [name, dtype] : dtypes) types.push_back(absl::StrCat(name, ":", dtype));
  return absl::StrCat("job\top=", op, "\tvalues=",
                      absl::StrJoin(values, ",", absl::PairFormatter("=")), "\tdtypes=", absl::StrJoin(types, ";"),
                      "\twith=", absl::StrJoin(with, ","), "\tdist=", DistName(dist),
                      "\tpartition=", PartitionName(partition), "\tseed=", seed,
                      "\tinputs=", absl::StrJoin(inputs, ";"), "\tplugins=", absl::StrJoin(plugins, ";"),
                      "\twarmup=", warmup, "\tthreads=", threads, "\tmax_seconds=", max_seconds_per_run, "\n");
}

absl::StatusOr<WorkerJob> WorkerJob::Parse(absl::string_view line) {
  std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
  if (fields.empty() || fields[0] != "job") return absl::InvalidArgumentError("worker: expected a job line");
  WorkerJob job;
  for (size_t i = 1; i < fields.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(fields[i], absl::MaxSplits('=', 1));
    const absl::string_view key = kv.first, value = kv.second;
    bool ok = true;
    if (key == "op") {
      job.op = std::string(value);
    } else if (key == "values") {
      absl::StatusOr<NamedValues> v = ParseNamedValues(value);
      ok = v.ok();
      if (ok) job.values = *v;
    } else if (key == "dtypes") {
      for (absl::string_view item : absl::StrSplit(value, ';', absl::SkipEmpty())) {
        std::pair<std::string, std::string> t = absl::StrSplit(item, absl::MaxSplits(':', 1));
        job.dtypes.push_back(std::move(t));
      }
    } else if (key == "with") {
      for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) job.with.emplace_back(item);
    } else if (key == "dist") {
      absl::StatusOr<Dist> d = ParseDist(value);
      ok = d.ok();
      if (ok) job.dist = *d;
    } else if (key == "partition") {
      absl::StatusOr<Partition> p = ParsePartition(value);
      ok = p.ok();
      if (ok) job.partition = *p;
    } else if (key == "seed") {
      ok = absl::SimpleAtoi(value, &job.seed);
    } else if (key == "inputs") {
      for (absl::string_view item : absl::StrSplit(value, ';', absl::SkipEmpty())) {
        std::pair<std::string, std::string> in = absl::StrSplit(item, absl::MaxSplits(':', 1));
        job.input_files.push_back(std::move(in));
      }
    } else if (key == "plugins") {
      for (absl::string_view item : absl::StrSplit(value, ';', absl::SkipEmpty())) job.plugins.emplace_back(item);
    } else if (key == "warmup") {
      ok = absl::SimpleAtoi(value, &job.warmup);
    } else if (key == "threads") {
      ok = absl::SimpleAtoi(value, &job.threads);
    } else if (key == "max_seconds") {
      ok = absl::SimpleAtod(value, &job.max_seconds_per_run);
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("worker: bad job field '", fields[i], "'"));
  }
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

// ---- The parent's side ------------------------------------------------------

IsolatedRunner::IsolatedRunner(std::vector<std::string> command, WorkerJob job, double timeout_seconds)
    : command_(std::move(command)), job_(std::move(job)), timeout_(timeout_seconds) {}

IsolatedRunner::~IsolatedRunner() { Kill(); }

absl::Status IsolatedRunner::Spawn() {
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
  buffer_.clear();
  fresh_ = true;
  ++started_;
  WriteAll(to_, job_.Serialize());
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
    return absl::StrCat("worker killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("worker exited with status ", WEXITSTATUS(status));
}

bool IsolatedRunner::ReadLine(double seconds, std::string* line, bool* timed_out) {
  *timed_out = false;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      *line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return true;
    }
    if (stop_ != nullptr && stop_->load()) return false;
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) {
      *timed_out = true;
      return false;
    }
    pollfd p{from_, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min(left * 1000 + 1, 100.0)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) continue;
    char buf[4096];
    ssize_t n = read(from_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

Measurement IsolatedRunner::Measure(const std::string& name, const Params& params, int reps) {
  Measurement m;
  if (!Clean(name) || !std::all_of(params.begin(), params.end(), [](const auto& p) {
        return Clean(p.first) && Clean(p.second);
      })) {
    m.error = "a kernel name or parameter holds a tab or newline";
    return m;
  }
  if (!fatal_.empty()) {
    m.error = fatal_;
    return m;
  }
  if (pid_ <= 0) {
    if (absl::Status s = Spawn(); !s.ok()) {
      m.error = fatal_ = std::string(s.message());
      return m;
    }
  }
  const int id = next_id_++;
  std::string line = absl::StrCat("run\t", id, "\t", name, "\t", reps);
  for (const auto& [k, v] : params) absl::StrAppend(&line, "\t", k, "=", v);
  WriteAll(to_, line + "\n");
  // A fresh worker builds its inputs before it answers `start`.
  double wait = fresh_ ? kSetupSeconds : timeout_;
  fresh_ = false;
  bool timed_out = false;
  std::string reply;
  for (;;) {
    if (!ReadLine(wait, &reply, &timed_out)) break;
    std::vector<std::string> f = absl::StrSplit(reply, '\t');
    if (f[0] == "fatal") {
      m.error = fatal_ = f.size() > 1 ? f[1] : "worker failed";
      Kill();
      return m;
    }
    if (f[0] == "start" && f.size() > 1 && f[1] == absl::StrCat(id)) wait = timeout_;
    if (f[0] == "done" && f.size() >= 8 && f[1] == absl::StrCat(id)) {
      absl::StatusOr<TrialStatus> status = ParseTrialStatus(f[2]);
      m.status = status.ok() ? *status : TrialStatus::kError;
      bool ok = absl::SimpleAtod(f[3], &m.median_ns) && absl::SimpleAtod(f[4], &m.min_ns) &&
                absl::SimpleAtod(f[5], &m.max_ns) && absl::SimpleAtoi(f[6], &m.reps);
      if (!ok) m.status = TrialStatus::kError;
      m.error = f[7];
      return m;
    }
  }
  if (stop_ != nullptr && stop_->load()) {
    Kill();
    m.error = "interrupted";
  } else if (timed_out) {
    Kill();
    m.status = TrialStatus::kTimedOut;
    m.error = absl::StrCat("no result within ", timeout_, " s; worker killed");
  } else {
    m.status = TrialStatus::kCrashed;
    m.error = ExitReason();
  }
  return m;
}

// ---- The worker's side ------------------------------------------------------

namespace {

class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  bool Next(std::string* line) {
    for (;;) {
      size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        *line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return true;
      }
      char buf[4096];
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buffer_;
};

std::string OneLine(absl::string_view s) {
  std::string out(s);
  std::replace(out.begin(), out.end(), '\t', ' ');
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

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
  const int out_fd = protocol_fd == 1 ? dup(1) : protocol_fd;
  if (out_fd < 0) return 1;
  if (protocol_fd == 1) dup2(2, 1);
  LineReader in(in_fd);
  std::string line;
  auto fatal = [&](absl::string_view why) {
    WriteAll(out_fd, absl::StrCat("fatal\t", OneLine(why), "\n"));
    return 1;
  };
  if (!in.Next(&line)) return 1;
  absl::StatusOr<WorkerJob> job = WorkerJob::Parse(line);
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
  std::vector<std::unique_ptr<Problem>> problems;
  absl::StatusOr<std::unique_ptr<Problem>> first = Problem::Make(*op, reference, *values, *options);
  if (!first.ok()) return fatal(first.status().message());
  size_t bytes = 0;
  for (const auto& [name, t] : (*first)->inputs()) bytes += t->nbytes();
  problems.push_back(*std::move(first));
  // Fresh random inputs to rotate through; the user's own data is used as is.
  const size_t buffers = options->inputs.empty() && bytes > 0
                             ? std::clamp<size_t>(kRotateBelowBytes / bytes, 1, 8) : 1;
  for (size_t i = 1; i < buffers; ++i) {
    options->seed = job->seed + i;
    absl::StatusOr<std::unique_ptr<Problem>> p = Problem::Make(*op, reference, *values, *options);
    if (!p.ok()) return fatal(p.status().message());
    problems.push_back(*std::move(p));
  }
  std::vector<Problem*> rotation;
  for (auto& p : problems) rotation.push_back(p.get());
  // The reference is computed now, before any candidate's clock starts.
  if (absl::Status s = problems[0]->ComputeReference(); !s.ok()) return fatal(s.message());
  absl::flat_hash_set<std::string> verified;  // "kernel\tparams" that passed

  while (in.Next(&line)) {
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    int reps = 0;
    if (f.size() < 4 || f[0] != "run" || !absl::SimpleAtoi(f[3], &reps)) return fatal("bad run line");
    WriteAll(out_fd, absl::StrCat("start\t", f[1], "\n"));
    Measurement m;
    absl::StatusOr<std::shared_ptr<const Kernel>> kernel = registry.Get(f[2]);
    Params params;
    for (size_t i = 4; i < f.size(); ++i) {
      std::pair<std::string, std::string> kv = absl::StrSplit(f[i], absl::MaxSplits('=', 1));
      params.push_back(std::move(kv));
    }
    if (!kernel.ok()) {
      m.error = std::string(kernel.status().message());
    } else if (absl::StatusOr<Config> config = (*kernel)->ParseConfig(params); !config.ok()) {
      m.status = TrialStatus::kIllegal;
      m.error = std::string(config.status().message());
    } else {
      const std::string id = absl::StrCat(f[2], "\t", (*kernel)->ConfigString(*config));
      MeasureOptions measure;
      measure.warmup = job->warmup;
      measure.reps = reps;
      measure.max_seconds = job->max_seconds_per_run;
      measure.verified = verified.contains(id);
      measure.run.num_threads = job->threads;
      m = MeasureKernel(**kernel, *config, rotation, measure);
      if (m.ok()) verified.insert(id);
    }
    WriteAll(out_fd, absl::StrCat("done\t", f[1], "\t", TrialStatusName(m.status), "\t", m.median_ns, "\t",
                                  m.min_ns, "\t", m.max_ns, "\t", m.reps, "\t", OneLine(m.error), "\n"));
  }
  return 0;
}

}  // namespace kreg
