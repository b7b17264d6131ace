// File primitives of the tuning database (internal): whole-file reads,
// atomic replacement, and an exclusive advisory lock.
//
// Thread-safety: the functions are thread-safe; a FileLock is owned by one
// thread.
#ifndef KREG_TUNING_DB_SRC_FILE_UTIL_H_
#define KREG_TUNING_DB_SRC_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kreg::internal {

// The file `path` names: symbolic links followed to their end (which need
// not exist yet), so a table reached through a link is locked and replaced
// where it lives. InvalidArgument for something that exists but is not a
// regular file (a folder, a FIFO, a device) or a loop of links;
// PermissionDenied for a link that Linux's protected_symlinks rule would
// not follow (in a sticky world-writable folder, owned by neither this user
// nor the folder's owner), whether or not that sysctl is on.
absl::StatusOr<std::string> ResolvePath(const std::string& path);

// The contents of `path`. NotFound if it does not exist; InvalidArgument if
// it is not a regular file (a FIFO would block the read forever); the
// errno's code naming the file otherwise.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Replaces `path` (resolved already) with `contents` atomically: a temporary
// file in the same folder (".NAME.tmp-XXXXXX"), fsync, rename over `path`,
// fsync the folder. The file keeps the owner, group and mode of the one it
// replaces (0644 when new); a file this process could not have written
// (access(2)), or whose owner it cannot keep, is refused (PermissionDenied)
// rather than replaced through a writable folder. On error the temporary
// file is removed and `path` is untouched.
absl::Status AtomicWrite(const std::string& path, absl::string_view contents);

// Removes temporary files AtomicWrite left beside `path` when its process was
// killed mid-write. REQUIRES: the caller holds `path`'s FileLock.
void RemoveStaleTemporaries(const std::string& path);

// An exclusive flock(2) on `path + ".lock"` (created if needed, never
// through a symbolic link), held until destruction. Waits for a lock
// another holds as SetLockWait (kreg/lut.h) says: a warning after a
// second, DeadlineExceeded after its time, Cancelled when its flag turns.
class FileLock {
 public:
  static absl::StatusOr<FileLock> Acquire(const std::string& path);
  FileLock(FileLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  FileLock(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace kreg::internal

#endif  // KREG_TUNING_DB_SRC_FILE_UTIL_H_
