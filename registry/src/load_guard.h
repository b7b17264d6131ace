// Naming a plugin that crashes or hangs while it loads. Private to the
// registry.
//
// While a plugin's own code runs at load (its constructors, entry point and
// init), its file is named on a fatal signal, as the process's last line,
// and in a warning if it takes more than limits::kPluginLoadSeconds: with a
// broken plugin installed every command would otherwise die or hang with
// nothing saying why. (kreg list --check-plugins loads each in a child.)
// One plugin loads at a time (the registry's loads are serial per call;
// concurrent calls share the one guard under its mutex).
#ifndef KREG_REGISTRY_SRC_LOAD_GUARD_H_
#define KREG_REGISTRY_SRC_LOAD_GUARD_H_

#include <sys/types.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <string>

namespace kreg {

class LoadingGuard {
 public:
  // Guards the load of the plugin at `path` until destroyed.
  explicit LoadingGuard(const std::string& path);
  ~LoadingGuard();
  LoadingGuard(const LoadingGuard&) = delete;
  LoadingGuard& operator=(const LoadingGuard&) = delete;

 private:
  static constexpr std::array<int, 5> kSignals = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  // A process's: the lock one load holds at a time, and what its watcher
  // thread watches (the load under way, since when, a count of loads begun
  // and ended). Std mutexes, not Abseil's: TSan sees through them (Debian's
  // Abseil is not instrumented).
  struct State {
    pid_t pid = 0;
    std::mutex load_mu;
    std::mutex mu;
    std::condition_variable cv;
    const char* loading = nullptr;
    std::chrono::steady_clock::time_point since;
    uint64_t generation = 0;
    bool idle = false;  // the watcher waits for a load (not for a deadline)
  };
  // This process's State, and its watcher thread started, on first use. A
  // forked child gets fresh ones: a thread of the parent may have held the
  // old locks at the fork, and the parent's watcher is not in the child.
  // Never freed (the detached thread may outlive static destructors).
  static State& ThisProcess();
  // Warns once about a load past limits::kPluginLoadSeconds. One thread for
  // the process, not one per load (a thread costs about what a plugin's load
  // does), woken only to start following loads: it then sleeps to each
  // load's deadline, and finds there whether that load is still under way.
  static void WatchLoads(State* w);
  // Async-signal-safe: write(2), then the handler that was there, again.
  static void OnFatal(int sig);

  static char path_[4096];
  static struct sigaction saved_[kSignals.size()];
  State& state_;
  std::lock_guard<std::mutex> lock_;
};

}  // namespace kreg

#endif  // KREG_REGISTRY_SRC_LOAD_GUARD_H_
