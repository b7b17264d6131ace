// TuneAcross (kreg/tuner.h): one sweep's problems shared between the ranks
// of an MPI job. Every rank tunes its shares with Tune, each in its own copy
// of rank 0's table, and posts every result to rank 0 (Comm::Post) as it is
// recorded; rank 0's collector thread takes them as they come, merges them
// into the table and checkpoints it, while rank 0's own shares run on the
// calling thread. When every rank has said it is done, rank 0 tells them all
// to finish, so no rank waits in MPI_Finalize while others still measure.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kreg/tuner.h"
#include "kreg/worker.pb.h"

namespace kreg {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr auto kSaveInterval = std::chrono::milliseconds(500);

// One share of the work: problem `problem`'s candidates, share `slice` of
// `slices`.
struct Share {
  int problem = 0, slice = 0, slices = 1;
};

// Rank `me`'s shares: the ranks with its machine's id form its group; with
// s ranks and P problems, each problem is cut into ceil(s / P) shares and
// the P * ceil(s / P) shares are dealt round-robin.
std::vector<Share> SharesOf(const std::vector<std::string>& machines, int me, int problems) {
  std::vector<int> group;
  for (int r = 0; r < static_cast<int>(machines.size()); ++r) {
    if (machines[r] == machines[me]) group.push_back(r);
  }
  const int s = static_cast<int>(group.size());
  const int j = static_cast<int>(std::find(group.begin(), group.end(), me) - group.begin());
  const int slices = (s + problems - 1) / problems;
  std::vector<Share> shares;
  for (int u = j; u < problems * slices; u += s) shares.push_back({u / slices, u % slices, slices});
  return shares;
}

// Rank 0's side: merges every rank's results into the table, and sums the
// shares of each problem on each machine. Save checkpoints a copy of the
// table when something came since the last, at most every kSaveInterval
// unless forced: a save takes milliseconds, a small problem's results come
// faster, and rank 0's own sweep must not wait for the file. Thread-safe.
class Collector {
 public:
  Collector(TuningDb* db, std::string path, std::vector<std::string> machines)
      : db_(db), path_(std::move(path)), machines_(std::move(machines)) {}

  void Take(int rank, const worker::RankMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!m.results().empty()) {
      absl::StatusOr<TuningDb> results = TuningDb::Parse(m.results(), absl::StrCat("rank ", rank, "'s results"));
      if (results.ok()) {
        db_->MergeFrom(*results);
      } else if (error_.ok()) {
        error_ = results.status();
      }
    }
    if (m.problem() > 0) End(rank, m);
    dirty_ = true;
  }

  void Save(bool force) {
    TuningDb copy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      if (!dirty_ || path_.empty() || (!force && now - saved_ < kSaveInterval)) return;
      dirty_ = false;
      saved_ = now;
      copy = *db_;
    }
    absl::Status s = copy.SaveMerged(path_);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && error_.ok()) error_ = s;
  }

  absl::Status error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  std::vector<SharedResult> Results() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SharedResult> out;
    for (auto& [where, c] : combined_) {
      if (const tuning::Entry* e = db_->FindEntry(c.result.result.key); e != nullptr) c.result.result.entry = *e;
      std::sort(c.result.ranks.begin(), c.result.ranks.end());
      out.push_back(c.result);
    }
    return out;
  }

 private:
  struct Combined {
    SharedResult result;
    int ended = 0;  // shares
  };

  // A share ended: its counts join its problem's on its machine. A problem
  // split into shares is complete once every share of it is.
  void End(int rank, const worker::RankMessage& m) {
    const std::string& machine = machines_[rank];
    Combined& c = combined_[{m.problem() - 1, machine}];
    SharedResult& r = c.result;
    r.problem = m.problem() - 1;
    r.machine = machine;
    if (std::find(r.ranks.begin(), r.ranks.end(), rank) == r.ranks.end()) r.ranks.push_back(rank);
    ++c.ended;
    if (!m.error().empty()) {
      if (r.status.ok()) r.status = absl::InternalError(m.error());
      return;
    }
    tuning::ProblemKey key;
    if (!m.key().empty() && key.ParseFromString(m.key())) r.result.key = key;
    r.result.candidates += m.candidates();
    r.result.measured += m.measured();
    r.result.reused += m.reused();
    r.result.failed += m.failed();
    r.result.seconds = std::max(r.result.seconds, m.seconds());
    r.result.complete = r.result.complete && m.complete();
    r.result.stopped = r.result.stopped || m.stopped();
    const tuning::Entry* e = db_->FindEntry(r.result.key);
    if (m.slices() > 1 && e != nullptr) {
      db_->SetTuningInfo(r.result.key, e->tool_version(), e->strategy(), e->tuned_at(),
                         c.ended >= m.slices() && r.result.complete);
    }
  }

  std::mutex mu_;
  TuningDb* db_;
  const std::string path_;
  const std::vector<std::string> machines_;
  std::map<std::pair<int, std::string>, Combined> combined_;  // (problem, machine)
  absl::Status error_;
  bool dirty_ = false;  // merged results not saved yet
  std::chrono::steady_clock::time_point saved_{};
};

// What a share's end tells rank 0.
worker::RankMessage EndOf(const Share& share, const absl::StatusOr<TuneResult>& result) {
  worker::RankMessage m;
  m.set_problem(share.problem + 1);
  m.set_slice(share.slice);
  m.set_slices(share.slices);
  if (!result.ok()) {
    m.set_error(std::string(result.status().message()));
    return m;
  }
  m.set_key(result->key.SerializeAsString());
  m.set_candidates(result->candidates);
  m.set_measured(result->measured);
  m.set_reused(result->reused);
  m.set_failed(result->failed);
  m.set_seconds(result->seconds);
  m.set_complete(result->complete);
  m.set_stopped(result->stopped);
  return m;
}

}  // namespace

absl::StatusOr<std::vector<SharedResult>> TuneAcross(const Registry& registry, const std::vector<TuneRequest>& requests,
                                                     Comm& comm, TuningDb* db, TuneObserver* observer,
                                                     const std::atomic<bool>* stop) {
  if (requests.empty()) return absl::InvalidArgumentError("no problem to tune");
  // Every rank's machine, and rank 0's table, on every rank.
  absl::StatusOr<std::vector<std::string>> records = comm.AllGather(ThisMachine().SerializeAsString());
  if (!records.ok()) return records.status();
  std::vector<std::string> machines;
  for (const std::string& bytes : *records) {
    tuning::Machine m;
    if (!m.ParseFromString(bytes)) return absl::InternalError("a rank sent an unreadable machine record");
    machines.push_back(m.id());
    if (comm.rank() == 0) db->AddMachine(std::move(m));
  }
  std::string table = comm.rank() == 0 ? db->ToBinary() : std::string();
  if (absl::Status s = comm.Broadcast(&table); !s.ok()) return s;
  absl::StatusOr<TuningDb> local = TuningDb::Parse(table, "rank 0's table");
  if (!local.ok()) return local.status();

  Collector collector(db, requests[0].db_path, machines);
  absl::Status posting;  // the first failure to reach rank 0
  auto send = [&](const worker::RankMessage& m) {
    if (comm.rank() == 0) {
      collector.Take(0, m);
    } else if (posting.ok()) {
      posting = comm.Post(0, m.SerializeAsString());
    }
  };

  // Rank 0 collects on a thread of its own while its shares run on this
  // one. When stopped (a signal; mpirun ends every rank when one dies), it
  // saves what came and waits no more.
  auto stopped = [&] { return stop != nullptr && stop->load(); };
  absl::Status receiving;
  std::thread collecting;
  if (comm.rank() == 0) {
    collecting = std::thread([&] {
      std::vector<bool> done(comm.size(), false);
      for (int remaining = comm.size() - 1; remaining > 0 && receiving.ok() && !stopped();) {
        bool any = false;
        for (int q = 1; q < comm.size() && receiving.ok(); ++q) {
          if (done[q]) continue;
          absl::StatusOr<std::optional<std::string>> got = comm.Receive(q);
          if (!got.ok()) receiving = got.status();
          if (!got.ok() || !got->has_value()) continue;
          any = true;
          worker::RankMessage m;
          if (!m.ParseFromString(**got)) {
            receiving = absl::InternalError(absl::StrCat("rank ", q, " sent an unreadable message"));
            continue;
          }
          collector.Take(q, m);
          if (m.last()) {
            done[q] = true;
            --remaining;
          }
        }
        collector.Save(/*force=*/false);
        if (!any) std::this_thread::sleep_for(kPollInterval);
      }
    });
  }

  for (const Share& share : SharesOf(machines, comm.rank(), static_cast<int>(requests.size()))) {
    if (stopped()) break;
    TuneRequest request = requests[share.problem];
    request.slice = share.slice;
    request.slices = share.slices;
    request.db_path.clear();  // rank 0's collector saves
    request.comm = nullptr;
    request.on_record = [&](const TuningDb& result) {
      worker::RankMessage m;
      m.set_results(result.ToBinary());
      send(m);
    };
    send(EndOf(share, Tune(registry, request, &*local, observer, stop)));
  }
  worker::RankMessage last;
  last.set_last(true);
  send(last);

  // Rank 0 waits for everyone's results, then lets them go; the others
  // wait for that without a timeout (rank 0 may have long to go).
  if (comm.rank() == 0) {
    collecting.join();
    collector.Save(/*force=*/true);
    for (int q = 1; q < comm.size() && !stopped(); ++q) {
      if (absl::Status s = comm.Post(q, ""); !s.ok() && receiving.ok()) receiving = s;
    }
    if (absl::Status s = comm.Flush(); !s.ok() && receiving.ok()) receiving = s;
    if (!receiving.ok()) return receiving;
    if (absl::Status s = collector.error(); !s.ok()) return s;
    return collector.Results();
  }
  if (posting.ok()) posting = comm.Flush();
  while (!stopped()) {
    absl::StatusOr<std::optional<std::string>> got = comm.Receive(0);
    if (!got.ok()) return got.status();
    if (got->has_value()) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  if (!posting.ok()) return posting;
  return std::vector<SharedResult>();
}

}  // namespace kreg
