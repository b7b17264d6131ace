// kreg calibrate: a communicator backend's α-β-γ costs on this machine, into
// a table, where they answer for collectives nothing was tuned for (Lut
// query "model").
//
//   alpha  half a round trip of an 8-byte message between ranks 0 and 1
//          (the fastest of 200);
//   beta   half a round trip of 4 MiB, less alpha, per byte (the median of 9);
//   gamma  rank 0 summing two 4 MiB float vectors, per byte of one (the
//          median of 9), the reduction the collectives do.
// Over threads: ranks 0 and 1 of --ranks (2) thread ranks; under mpirun
// (--backend mpi): ranks 0 and 1 of the job, the others waiting (on several
// nodes, map ranks 0 and 1 to two of them: the model is the key's, nodes
// counted, so it should hold the slower link). Rank 0
// saves the table.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kreg/comm.h"
#include "kreg/lut.h"
#include "kreg/registry.h"
#include "tools/binders.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace kreg::cli {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status Exchange(const kreg_comm& c, bool send, int peer, void* buf, size_t bytes) {
  char msg[512] = "";
  void* request = nullptr;
  kreg_status s = send ? c.isend(c.ctx, peer, 0, buf, bytes, &request, msg, sizeof msg)
                       : c.irecv(c.ctx, peer, 0, buf, bytes, &request, msg, sizeof msg);
  if (s == KREG_OK) s = c.wait(c.ctx, request, msg, sizeof msg);
  return s == KREG_OK ? absl::OkStatus() : FromAbi(s, msg);
}

// Half round trips of `bytes` between ranks 0 and 1, in seconds, `reps`
// times (rank 0's clock; others take no part).
absl::StatusOr<std::vector<double>> PingPong(Comm& comm, size_t bytes, int reps) {
  std::vector<char> buf(std::max<size_t>(bytes, 1));
  std::vector<double> times;
  if (comm.rank() > 1) return times;
  const kreg_comm& c = *comm.abi();
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    if (comm.rank() == 0) {
      if (absl::Status s = Exchange(c, true, 1, buf.data(), bytes); !s.ok()) return s;
      if (absl::Status s = Exchange(c, false, 1, buf.data(), bytes); !s.ok()) return s;
    } else {
      if (absl::Status s = Exchange(c, false, 0, buf.data(), bytes); !s.ok()) return s;
      if (absl::Status s = Exchange(c, true, 0, buf.data(), bytes); !s.ok()) return s;
    }
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 2);
  }
  return times;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per byte of a float vector summed into another.
double ReduceSecondsPerByte() {
  constexpr size_t kFloats = size_t{1} << 20;
  std::vector<float> acc(kFloats, 1.0f), x(kFloats, 2.0f);
  std::vector<double> times;
  for (int i = 0; i < 9; ++i) {
    const auto t0 = Clock::now();
    for (size_t j = 0; j < kFloats; ++j) acc[j] += x[j];
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  volatile float sink = acc[kFloats / 2];
  (void)sink;
  return Median(times) / (kFloats * sizeof(float));
}

// Measures on `comm` (every rank calls it); rank 0 gets the model.
absl::StatusOr<tuning::CommModel> Measure(Comm& comm) {
  if (comm.size() < 2) return absl::InvalidArgumentError("calibrate needs at least 2 ranks");
  constexpr size_t kLarge = size_t{4} << 20;
  if (absl::Status s = comm.Barrier(); !s.ok()) return s;
  absl::StatusOr<std::vector<double>> small = PingPong(comm, 8, 200);
  if (!small.ok()) return small.status();
  absl::StatusOr<std::vector<double>> large = PingPong(comm, kLarge, 9);
  if (!large.ok()) return large.status();
  tuning::CommModel model;
  if (comm.rank() == 0) {
    const double alpha = *std::min_element(small->begin(), small->end());
    model.set_alpha_s(alpha);
    model.set_beta_s_per_byte(std::max(0.0, Median(*large) - alpha) / kLarge);
    model.set_gamma_s_per_byte(ReduceSecondsPerByte());
  }
  if (absl::Status s = comm.Barrier(); !s.ok()) return s;
  return model;
}

}  // namespace

void SetupCalibrate(CLI::App* calibrate, HelpFormatter& help, Flags& f) {
  help.Set(calibrate,
           {"kreg calibrate --db FILE [--backend threads|mpi] [--ranks N]",
            "Measures the backend's latency per message (alpha: half an 8-byte round trip), its time per byte "
            "(beta: half a 4 MiB round trip) and the time per byte of a float reduction (gamma) on this machine, "
            "and records them in the table. A query for a collective nothing was tuned for then answers by the "
            "cost model (match \"model\"); measured entries still come first. Under mpirun with --backend mpi, "
            "ranks 0 and 1 of the job measure.",
            "kreg calibrate --db c.lut\nmpirun -n 2 kreg calibrate --backend mpi --db c.lut"});
  calibrate->add_option("--db", f.db, "the table to record into (created if missing)")->option_text("FILE")->required();
  AddComm(calibrate, f);
  AddLockTimeout(calibrate, f);
}

absl::Status Calibrate(const Flags& flags) {
  if (flags.db.empty()) return absl::InvalidArgumentError("calibrate needs --db FILE");
  CommOptions options;
  options.timeout_seconds = flags.comm_timeout;
  absl::StatusOr<CommBackend> backend = BackendOf(flags);
  if (!backend.ok()) return backend.status();
  absl::StatusOr<std::vector<std::unique_ptr<Comm>>> opened =
      OpenComms(*backend, *backend == CommBackend::kThreads && flags.ranks == 0 ? 2 : flags.ranks, options);
  if (!opened.ok()) return opened.status();
  std::vector<std::unique_ptr<Comm>> comms = *std::move(opened);
  tuning::CommModel model;
  absl::Status ran = RunRanks(comms, [&](Comm& c) -> absl::Status {
    absl::StatusOr<tuning::CommModel> m = Measure(c);
    if (!m.ok()) return m.status();
    if (c.rank() == 0) model = *m;
    return absl::OkStatus();
  });
  if (!ran.ok()) return ran;
  if (comms[0]->rank() != 0) return absl::OkStatus();  // rank 0 saves and reports
  model.set_machine_id(ThisMachine().id());
  model.set_backend(CollectiveDataClass(*comms[0]).substr(8));  // "threads", "mpi,nodes=1"
  model.set_ranks(comms[0]->size());
  model.set_measured_at(static_cast<int64_t>(std::time(nullptr)));
  TuningDb db;
  db.AddMachine(ThisMachine());
  db.SetCommModel(model);
  if (absl::Status s = db.SaveMerged(flags.db); !s.ok()) return s;
  if (flags.json) {
    Json out = Json::object();
    out["backend"] = model.backend();
    out["machine"] = Str(model.machine_id());
    out["ranks"] = model.ranks();
    out["alpha_s"] = model.alpha_s();
    out["beta_s_per_byte"] = model.beta_s_per_byte();
    out["gamma_s_per_byte"] = model.gamma_s_per_byte();
    std::cout << Dump(out) << "\n";
  } else {
    std::cout << absl::StrFormat(
        "%s on %d ranks: alpha %.2f us, beta %.3f ns/B (%.2f GB/s), gamma %.3f ns/B (%.2f GB/s)  -> %s\n",
        model.backend(), model.ranks(), model.alpha_s() * 1e6, model.beta_s_per_byte() * 1e9,
        model.beta_s_per_byte() > 0 ? 1e-9 / model.beta_s_per_byte() : 0.0, model.gamma_s_per_byte() * 1e9,
        model.gamma_s_per_byte() > 0 ? 1e-9 / model.gamma_s_per_byte() : 0.0, flags.db);
  }
  return absl::OkStatus();
}

}  // namespace kreg::cli
