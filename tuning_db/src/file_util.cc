#include "file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kreg/limits.h"
#include "kreg/log.h"
#include "kreg/lut.h"

namespace kreg::internal {
namespace {

absl::Status Errno(int error, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path));
}

// (folder, file name) of `path`; folder "." for a bare name.
std::pair<std::string, std::string> Split(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

std::string TempPrefix(const std::string& path) {
  auto [dir, name] = Split(path);
  return absl::StrCat(dir, "/.", name, ".tmp-");
}

absl::Status NotRegular(const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
}

// SetLockWait's.
std::atomic<double> lock_seconds{limits::kDefaultLockTimeoutSeconds};
std::atomic<const std::atomic<bool>*> lock_cancel{nullptr};

}  // namespace

absl::StatusOr<std::string> ResolvePath(const std::string& path) {
  std::string p = path;
  for (int links = 0; links < 40; ++links) {
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) return p;  // a new file (or a dangling link's target)
      return Errno(errno, "cannot stat", p);
    }
    if (S_ISREG(st.st_mode)) return p;
    if (!S_ISLNK(st.st_mode)) return NotRegular(p);
    // Linux's protected_symlinks rule, applied whatever fs.protected_symlinks
    // says: in a sticky world-writable folder (/tmp), a link is followed only
    // if it is this user's or the folder owner's; anyone could have planted
    // it to make kreg create or replace a file where it points.
    struct stat dir;
    const std::string folder = Split(p).first;
    if (stat(folder.c_str(), &dir) == 0 && (dir.st_mode & S_ISVTX) != 0 && (dir.st_mode & S_IWOTH) != 0 &&
        st.st_uid != geteuid() && st.st_uid != dir.st_uid) {
      return absl::PermissionDeniedError(absl::StrCat(
          p, ": a symbolic link of user ", st.st_uid, " in the shared folder ", folder,
          " (sticky, world-writable), neither yours nor the folder owner's: not followed"));
    }
    std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = readlink(p.c_str(), target.data(), target.size());
    if (n < 0) return Errno(errno, "cannot read the link", p);
    target.resize(static_cast<size_t>(n));
    // A relative target is relative to the link's folder.
    p = target.empty() || target[0] == '/' ? target : absl::StrCat(Split(p).first, "/", target);
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": too many levels of symbolic links"));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return Errno(error, "cannot open", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return NotRegular(path);
  }
  std::string contents;
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int error = errno;
      close(fd);
      return Errno(error, "cannot read", path);
    }
    if (n == 0) break;
    contents.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return contents;
}

absl::Status AtomicWrite(const std::string& path, absl::string_view contents) {
  if (access(path.c_str(), F_OK) == 0 && access(path.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": this user may not write it; not replaced"));
  }
  auto [dir, name] = Split(path);
  std::string temp = TempPrefix(path) + "XXXXXX";
  int fd = mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) return Errno(errno, "cannot create a temporary file for", path);
  auto fail = [&](absl::string_view what) {
    absl::Status status = Errno(errno, what, path);
    if (fd >= 0) close(fd);
    unlink(temp.c_str());
    return status;
  };
  struct stat st;
  const bool exists = stat(path.c_str(), &st) == 0;
  // The replacement keeps the owner and group (only root, or the owner for a
  // group it belongs to, can give them; anyone else is refused above or here).
  if (exists && fchown(fd, st.st_uid, st.st_gid) != 0) {
    return fail("cannot keep the owner and group of");
  }
  if (fchmod(fd, exists ? (st.st_mode & 07777) : 0644) != 0) {
    return fail("cannot set the mode of the temporary file for");
  }
  for (size_t done = 0; done < contents.size();) {
    ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write");
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail("cannot fsync");
  int closed = close(fd);
  fd = -1;
  if (closed != 0) return fail("cannot close");
  if (rename(temp.c_str(), path.c_str()) != 0) return fail("cannot rename a temporary file onto");
  // The rename is durable once the folder is; some file systems cannot fsync
  // a folder (EINVAL), which is no error of ours.
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Errno(errno, "cannot open the folder of", path);
  int synced = fsync(dir_fd);
  int error = errno;
  close(dir_fd);
  if (synced != 0 && error != EINVAL) return Errno(error, "cannot fsync the folder of", path);
  return absl::OkStatus();
}

void RemoveStaleTemporaries(const std::string& path) {
  auto [dir, name] = Split(path);
  std::string prefix = absl::StrCat(".", name, ".tmp-");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    if (absl::StartsWith(e->d_name, prefix)) unlink(absl::StrCat(dir, "/", e->d_name).c_str());
  }
  closedir(d);
}

absl::StatusOr<FileLock> FileLock::Acquire(const std::string& path) {
  std::string lock_path = path + ".lock";
  // Read-only suffices for flock, so users who may not write a lock file
  // another made can still take it. Never through a link: one planted there
  // would make kreg create a file where it points.
  int fd = open(lock_path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  struct stat st;
  if (fd < 0 && lstat(lock_path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(lock_path, ": the lock file is a symbolic link: not followed"));
  }
  if (fd < 0) return Errno(errno, "cannot open the lock file", lock_path);
  const double timeout = lock_seconds.load();
  const std::atomic<bool>* cancel = lock_cancel.load();
  const auto start = std::chrono::steady_clock::now();
  bool said = false;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    if (error != EWOULDBLOCK) {
      close(fd);
      return Errno(error, "cannot lock", lock_path);
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (cancel != nullptr && cancel->load()) {
      close(fd);
      return absl::CancelledError(absl::StrCat("stopped waiting for the lock ", lock_path));
    }
    if (waited >= timeout) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat(lock_path, ": still held by another process after ", timeout,
                                                      " s; not written (--lock-timeout waits longer)"));
    }
    if (!said && waited >= 1) {
      Log(LogLevel::kWarn, absl::StrCat("waiting for the lock ", lock_path, " (another process is writing the table; at most ",
                                        timeout, " s)"));
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return FileLock(fd);
}

FileLock::~FileLock() {
  if (fd_ >= 0) close(fd_);  // releases the lock
}

}  // namespace kreg::internal

namespace kreg {

void SetLockWait(double seconds, const std::atomic<bool>* cancel) {
  internal::lock_seconds = seconds;
  internal::lock_cancel = cancel;
}

}  // namespace kreg
