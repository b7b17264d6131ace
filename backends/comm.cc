#include "kreg/comm.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

// The host's own messages use negative tags (kernels use the others).
constexpr int32_t kAllMaxTag = -1;

absl::Status Check(kreg_status status, const char* msg) {
  return status == KREG_OK ? absl::OkStatus() : FromAbi(status, msg);
}

// Posts a message and waits for it.
absl::Status Exchange(const kreg_comm& c, bool send, int peer, int32_t tag, void* buf, size_t bytes) {
  char msg[512] = "";
  void* request = nullptr;
  const kreg_status posted = send ? c.isend(c.ctx, peer, tag, buf, bytes, &request, msg, sizeof msg)
                                  : c.irecv(c.ctx, peer, tag, buf, bytes, &request, msg, sizeof msg);
  if (posted != KREG_OK) return Check(posted, msg);
  return Check(c.wait(c.ctx, request, msg, sizeof msg), msg);
}

}  // namespace

absl::Status Comm::Barrier() {
  char msg[512] = "";
  return Check(abi_.barrier(abi_.ctx, msg, sizeof msg), msg);
}

// Rank 0 gathers and reduces, then sends the result back: ranks are few,
// and the values a handful.
absl::StatusOr<std::vector<double>> Comm::AllMax(std::vector<double> values) {
  const size_t bytes = values.size() * sizeof(double);
  if (rank() == 0) {
    std::vector<double> theirs(values.size());
    for (int q = 1; q < size(); ++q) {
      if (absl::Status s = Exchange(abi_, false, q, kAllMaxTag, theirs.data(), bytes); !s.ok()) return s;
      for (size_t i = 0; i < values.size(); ++i) values[i] = std::max(values[i], theirs[i]);
    }
    for (int q = 1; q < size(); ++q) {
      if (absl::Status s = Exchange(abi_, true, q, kAllMaxTag, values.data(), bytes); !s.ok()) return s;
    }
  } else {
    if (absl::Status s = Exchange(abi_, true, 0, kAllMaxTag, values.data(), bytes); !s.ok()) return s;
    if (absl::Status s = Exchange(abi_, false, 0, kAllMaxTag, values.data(), bytes); !s.ok()) return s;
  }
  return values;
}

absl::Status RunRanks(const std::vector<std::unique_ptr<Comm>>& comms,
                      const std::function<absl::Status(Comm&)>& body) {
  std::vector<absl::Status> results(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      results[r] = body(*comms[r]);
      if (!results[r].ok()) comms[r]->Abort(results[r].message());
    });
  }
  for (std::thread& t : threads) t.join();
  // The first failure by rank order that is not merely a consequence of
  // another rank's (Unavailable naming the failed rank).
  for (const absl::Status& s : results) {
    if (!s.ok() && !absl::IsUnavailable(s)) return s;
  }
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace kreg
