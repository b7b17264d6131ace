#include "load_guard.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kreg/limits.h"
#include "kreg/log.h"

namespace kreg {

char LoadingGuard::path_[4096] = {};
struct sigaction LoadingGuard::saved_[kSignals.size()] = {};

LoadingGuard::LoadingGuard(const std::string& path) : state_(ThisProcess()), lock_(state_.load_mu) {
  const size_t n = std::min(path.size(), sizeof path_ - 1);
  std::memcpy(path_, path.data(), n);
  path_[n] = '\0';
  struct sigaction ours {};
  ours.sa_handler = OnFatal;
  sigemptyset(&ours.sa_mask);
  for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &ours, &saved_[i]);
  std::lock_guard<std::mutex> watch_lock(state_.mu);
  state_.loading = path_;
  state_.since = std::chrono::steady_clock::now();
  ++state_.generation;
  if (state_.idle) state_.cv.notify_one();  // else it wakes at its deadline and sees this load
}

LoadingGuard::~LoadingGuard() {
  {
    std::lock_guard<std::mutex> watch_lock(state_.mu);
    state_.loading = nullptr;
    ++state_.generation;
  }
  for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &saved_[i], nullptr);
}

LoadingGuard::State& LoadingGuard::ThisProcess() {
  static std::atomic<State*> current{nullptr};
  const pid_t me = getpid();
  State* s = current.load();
  if (s != nullptr && s->pid == me) return *s;
  auto* fresh = new State;
  fresh->pid = me;
  if (!current.compare_exchange_strong(s, fresh)) {  // another thread of this process was first
    delete fresh;
    return *s;
  }
  std::thread(WatchLoads, fresh).detach();
  return *fresh;
}

void LoadingGuard::WatchLoads(State* w) {
  const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(limits::kPluginLoadSeconds));
  std::unique_lock<std::mutex> lock(w->mu);
  uint64_t warned = 0;
  while (true) {
    w->idle = true;
    w->cv.wait(lock, [&] { return w->loading != nullptr; });
    w->idle = false;
    while (w->loading != nullptr) {
      const uint64_t generation = w->generation;
      const auto deadline = w->since + limit;
      if (std::chrono::steady_clock::now() < deadline) {
        w->cv.wait_until(lock, deadline);
      } else if (warned != generation) {
        warned = generation;
        Log(LogLevel::kWarn, absl::StrCat("plugin ", w->loading, " has been loading for ",
                                          limits::kPluginLoadSeconds, " s (its constructor or init may hang; kreg "
                                          "list --check-plugins tests each plugin apart)"));
      } else {
        w->cv.wait_for(lock, std::chrono::seconds(1));  // until the hung load ends, if it does
      }
    }
  }
}

void LoadingGuard::OnFatal(int sig) {
  auto say = [](const char* text) { (void)!write(STDERR_FILENO, text, std::strlen(text)); };
  say("kreg: plugin ");
  say(path_);
  say(" crashed while loading (its constructor, entry point or init); kreg list --check-plugins tests each "
      "plugin apart\n");
  for (size_t i = 0; i < kSignals.size(); ++i) {
    if (kSignals[i] == sig) sigaction(sig, &saved_[i], nullptr);
  }
  raise(sig);
}

}  // namespace kreg
