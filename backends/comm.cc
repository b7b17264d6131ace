#include "kreg/comm.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kreg/limits.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

// The host's own messages use negative tags (kernels use the others).
constexpr int32_t kAllMaxTag = -1;
constexpr int32_t kBroadcastTag = -2;
constexpr int32_t kGatherTag = -3;
constexpr int32_t kPostTag = -4;

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

Comm* Comm::axis(absl::string_view name) const {
  for (const auto& [axis_name, comm] : axes_) {
    if (axis_name == name) return comm.get();
  }
  return nullptr;
}

void Comm::EnableAxes() {
  abi_.axis = [](void* ctx, const char* name) -> const kreg_comm* {
    const Comm* sub = name != nullptr ? static_cast<Comm*>(ctx)->axis(name) : nullptr;
    return sub != nullptr ? sub->abi() : nullptr;
  };
}

std::vector<int> AxisGroup(const Mesh& mesh, size_t a, int r) {
  int stride = 1;
  for (size_t b = a + 1; b < mesh.size(); ++b) stride *= mesh[b].second;
  const int base = r - (r / stride) % mesh[a].second * stride;
  std::vector<int> group;
  for (int j = 0; j < mesh[a].second; ++j) group.push_back(base + j * stride);
  return group;
}

double WaitSeconds(const CommOptions& options, bool host) {
  const double t = std::max(0.0, options.timeout_seconds);
  return host ? 2 * t + 1 : t;
}

std::chrono::steady_clock::time_point WaitDeadline(const CommOptions& options, bool host) {
  return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                std::chrono::duration<double>(WaitSeconds(options, host)));
}

kreg_status StopWaiting(const CommOptions& options, bool host, int rank,
                        std::chrono::steady_clock::time_point deadline, absl::string_view awaiting, std::string* why) {
  if (options.cancel_flag != nullptr && options.cancel_flag->load(std::memory_order_relaxed) != 0) {
    *why = absl::StrCat("rank ", rank, ": cancelled ", awaiting);
    return KREG_CANCELLED;
  }
  if (std::chrono::steady_clock::now() >= deadline) {
    *why = absl::StrFormat("rank %d: nothing came within the %gs communication timeout, %s", rank,
                           WaitSeconds(options, host), awaiting);
    return KREG_UNAVAILABLE;
  }
  return KREG_OK;
}

bool MeshFits(const Mesh& mesh, int n) {
  int64_t product = 1;
  for (const auto& [name, size] : mesh) product *= size;
  return !mesh.empty() && product == n;
}

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

std::string CollectiveDataClass(absl::string_view backend, int nodes) {
  return backend == "mpi" ? absl::StrCat("backend=mpi,nodes=", nodes) : absl::StrCat("backend=", backend);
}

std::string CollectiveDataClass(const Comm& comm) { return CollectiveDataClass(comm.backend(), comm.nodes()); }

absl::StatusOr<std::unique_ptr<Comm>> LoadMpiComm(const CommOptions& options) {
  const std::vector<std::string> candidates = BackendModulePaths("kreg_mpi.so", "KREG_MPI_BACKEND");
  std::string tried;
  for (const std::string& path : candidates) {
    if (!std::filesystem::exists(path)) {
      absl::StrAppend(&tried, tried.empty() ? "" : ", ", path);
      continue;
    }
    // RTLD_GLOBAL: Open MPI's own components look up libmpi's symbols.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) return absl::UnavailableError(absl::StrCat("mpi backend: ", dlerror()));
    using Entry = Comm* (*)(const CommOptions*, char*, size_t);
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "kreg_mpi_comm_v1"));
    if (entry == nullptr) return absl::UnavailableError(absl::StrCat("mpi backend: ", path, " lacks kreg_mpi_comm_v1"));
    char msg[512] = "";
    Comm* comm = entry(&options, msg, sizeof msg);  // the module stays loaded for the process's life
    if (comm == nullptr) return absl::UnavailableError(absl::StrCat("mpi backend: ", msg));
    return std::unique_ptr<Comm>(comm);
  }
  return absl::UnavailableError(absl::StrCat("the mpi backend is not installed (kreg was built without MPI; "
                                             "install libopenmpi-dev and rebuild): looked for ", tried));
}

absl::Status Comm::Broadcast(std::string* text) {
  uint64_t bytes = text->size();
  for (int q = 1; q < size(); ++q) {
    if (rank() != 0 && q != rank()) continue;
    const bool send = rank() == 0;
    const int peer = send ? q : 0;
    if (absl::Status s = Exchange(abi_, send, peer, kBroadcastTag, &bytes, sizeof bytes); !s.ok()) return s;
    if (!send) text->resize(bytes);
    if (absl::Status s = Exchange(abi_, send, peer, kBroadcastTag, text->data(), bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Comm::AllGather(const std::string& text) {
  std::vector<std::string> all(size());
  all[rank()] = text;
  // Rank 0 gathers, then broadcasts them, each after its size.
  std::string joined;
  if (rank() == 0) {
    for (int q = 1; q < size(); ++q) {
      uint64_t bytes = 0;
      if (absl::Status s = Exchange(abi_, false, q, kGatherTag, &bytes, sizeof bytes); !s.ok()) return s;
      all[q].resize(bytes);
      if (absl::Status s = Exchange(abi_, false, q, kGatherTag, all[q].data(), bytes); !s.ok()) return s;
    }
    for (const std::string& t : all) {
      const uint64_t bytes = t.size();
      joined.append(reinterpret_cast<const char*>(&bytes), sizeof bytes);
      joined.append(t);
    }
  } else {
    uint64_t bytes = text.size();
    if (absl::Status s = Exchange(abi_, true, 0, kGatherTag, &bytes, sizeof bytes); !s.ok()) return s;
    std::string copy = text;
    if (absl::Status s = Exchange(abi_, true, 0, kGatherTag, copy.data(), bytes); !s.ok()) return s;
  }
  if (absl::Status s = Broadcast(&joined); !s.ok()) return s;
  size_t at = 0;
  for (int q = 0; q < size(); ++q) {
    uint64_t bytes = 0;
    if (at + sizeof bytes > joined.size()) return absl::InternalError("all-gather: a short message from rank 0");
    std::memcpy(&bytes, joined.data() + at, sizeof bytes);
    at += sizeof bytes;
    if (bytes > joined.size() - at) return absl::InternalError("all-gather: a short message from rank 0");
    all[q] = joined.substr(at, bytes);
    at += bytes;
  }
  return all;
}

absl::Status Comm::Post(int peer, std::string text) {
  Outgoing& out = outgoing_.emplace_back();
  out.bytes = text.size();
  out.text = std::move(text);
  char msg[512] = "";
  for (int part = 0; part < 2; ++part) {
    void* buf = part == 0 ? static_cast<void*>(&out.bytes) : out.text.data();
    const size_t bytes = part == 0 ? sizeof out.bytes : out.text.size();
    if (const kreg_status s = abi_.isend(abi_.ctx, peer, kPostTag, buf, bytes, &out.requests[part], msg, sizeof msg);
        s != KREG_OK) {
      return Check(s, msg);
    }
  }
  return Reap(/*wait=*/false);
}

// Forgets the messages delivered (`wait`: waits for every one).
absl::Status Comm::Reap(bool wait) {
  char msg[512] = "";
  while (!outgoing_.empty()) {
    Outgoing& out = outgoing_.front();
    for (void*& request : out.requests) {
      if (request == nullptr) continue;
      int done = 1;
      const kreg_status s =
          wait ? abi_.wait(abi_.ctx, request, msg, sizeof msg) : abi_.test(abi_.ctx, request, &done, msg, sizeof msg);
      if (done) request = nullptr;
      if (s != KREG_OK) return Check(s, msg);
      if (!done) return absl::OkStatus();
    }
    outgoing_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status Comm::Flush() { return Reap(/*wait=*/true); }

absl::StatusOr<std::optional<std::string>> Comm::Receive(int peer) {
  char msg[512] = "";
  auto [it, fresh] = incoming_.try_emplace(peer, 0, nullptr);
  auto& [bytes, request] = it->second;
  if (fresh) {
    if (const kreg_status s = abi_.irecv(abi_.ctx, peer, kPostTag, &bytes, sizeof bytes, &request, msg, sizeof msg);
        s != KREG_OK) {
      incoming_.erase(it);
      return Check(s, msg);
    }
  }
  int done = 0;
  if (const kreg_status s = abi_.test(abi_.ctx, request, &done, msg, sizeof msg); s != KREG_OK || !done) {
    if (done) incoming_.erase(it);
    if (s != KREG_OK) return Check(s, msg);
    return std::nullopt;
  }
  // The size came; the text follows it at once.
  std::string text(bytes, '\0');
  incoming_.erase(it);
  if (absl::Status s = Exchange(abi_, false, peer, kPostTag, text.data(), text.size()); !s.ok()) return s;
  return text;
}

absl::Status RunRanks(const std::vector<std::unique_ptr<Comm>>& comms,
                      const std::function<absl::Status(Comm&)>& body) {
  if (comms.size() == 1) {  // one rank here (an MPI process): on this thread
    absl::Status s = body(*comms[0]);
    if (!s.ok()) comms[0]->Abort(s.message());
    return s;
  }
  std::vector<absl::Status> results(comms.size());
  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  for (size_t r = 0; r < comms.size(); ++r) {
    try {
      threads.emplace_back([&, r] {
        try {
          results[r] = body(*comms[r]);
        } catch (const std::exception& e) {  // out of memory, as near an address-space limit
          results[r] = absl::ResourceExhaustedError(absl::StrCat("thread rank ", r, ": ", e.what()));
        }
        if (!results[r].ok()) comms[r]->Abort(results[r].message());
      });
    } catch (const std::exception& e) {
      // The system refused a thread (or the memory for one): the ranks
      // started are told (they would wait for this one forever) and joined;
      // the refusal is the error.
      const std::string why = absl::StrCat("cannot start thread rank ", r, " of ", comms.size(), ": ", e.what());
      comms[0]->Abort(why);
      for (std::thread& t : threads) t.join();
      return absl::ResourceExhaustedError(why);
    }
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

absl::StatusOr<CommBackend> ParseCommBackend(absl::string_view name) {
  if (name == "threads") return CommBackend::kThreads;
  if (name == "mpi") return CommBackend::kMpi;
  return absl::InvalidArgumentError(absl::StrCat("backend '", name, "': expected threads or mpi"));
}

absl::string_view CommBackendName(CommBackend backend) { return backend == CommBackend::kMpi ? "mpi" : "threads"; }

absl::StatusOr<std::vector<std::unique_ptr<Comm>>> OpenComms(CommBackend backend, int ranks,
                                                             const CommOptions& options) {
  std::vector<std::unique_ptr<Comm>> comms;
  if (backend == CommBackend::kThreads) {
    if (ranks == 0) return comms;
    if (absl::Status s = limits::CheckThreadRanks(ranks, "ranks"); !s.ok()) return s;
    return ThreadComms(ranks, options);
  }
  absl::StatusOr<std::unique_ptr<Comm>> comm = LoadMpiComm(options);
  if (!comm.ok()) return comm.status();
  if (ranks > 0 && ranks != (*comm)->size()) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks ", ranks, " but the MPI job has ", (*comm)->size(),
                                                   " ranks (mpirun -n sets them)"));
  }
  comms.push_back(*std::move(comm));
  return comms;
}

}  // namespace kreg
