// kreg.tune from Python: the sweep without the GIL, its progress handed to
// a Python callback, Ctrl-C stopping it cleanly.
#include "tune.h"

#include <atomic>
#include <csignal>
#include <optional>

#include "call.h"
#include "errors.h"
#include "kreg/log.h"
#include "records.h"

namespace kreg::python {
namespace {

// Progress and warnings of a sweep, handed to Python (the sweep runs
// without the GIL); a callback that raises, or Ctrl-C, stops the sweep.
class PyObserver : public TuneObserver {
 public:
  PyObserver(py::object progress, std::atomic<bool>* stop) : progress_(std::move(progress)), stop_(stop) {}
  void OnProgress(const TuneProgress& p) override {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      Fail(py::error_already_set());  // KeyboardInterrupt, fetched
      return;
    }
    if (progress_.is_none() || error_) return;
    py::dict d;
    d["key"] = p.key;
    d["done"] = p.done;
    d["candidates"] = p.candidates;
    d["best"] = p.best;
    d["best_ns"] = p.best_ns;
    d["elapsed_seconds"] = p.elapsed_seconds;
    d["eta_seconds"] = p.eta_seconds;
    try {
      progress_(d);
    } catch (py::error_already_set& e) {
      Fail(std::move(e));
    }
  }
  void OnWarning(absl::string_view message) override { Log(LogLevel::kWarn, message); }
  // Raises the callback's exception (or KeyboardInterrupt) if there was one.
  void Rethrow() {
    if (error_) {
      error_->restore();
      throw py::error_already_set();
    }
  }

 private:
  void Fail(py::error_already_set error) {
    error_.emplace(std::move(error));
    stop_->store(true);
  }
  py::object progress_;
  std::atomic<bool>* stop_;
  std::optional<py::error_already_set> error_;
};

// Ctrl-C during a sweep, which runs without the GIL: Python's own handler
// would run only at the next progress report, after the candidate in
// flight, which may take seconds. While the sweep runs, a handler of ours
// sets its stop flag (the tuner then cuts the candidate short and keeps what
// was measured); afterwards Python's is put back and the interrupt handed to
// it (KeyboardInterrupt, or the program's own handler). A SIGINT the
// program ignores stays ignored.
class SigintStops {
 public:
  explicit SigintStops(std::atomic<bool>* stop) {
    struct sigaction ours {};
    ours.sa_handler = [](int) {
      fired_ = 1;
      if (stop_ != nullptr) stop_->store(true);
    };
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGINT, nullptr, &old_) != 0 || old_.sa_handler == SIG_IGN) return;
    stop_ = stop;
    fired_ = 0;
    installed_ = sigaction(SIGINT, &ours, nullptr) == 0;
  }
  ~SigintStops() {
    if (!installed_) return;
    sigaction(SIGINT, &old_, nullptr);
    stop_ = nullptr;
    if (fired_) PyErr_SetInterrupt();  // Python's handler runs at its next check
  }
  SigintStops(const SigintStops&) = delete;
  SigintStops& operator=(const SigintStops&) = delete;

 private:
  static inline std::atomic<bool>* stop_ = nullptr;
  static inline volatile sig_atomic_t fired_ = 0;
  struct sigaction old_ {};
  bool installed_ = false;
};

}  // namespace

py::object Tune(PyRegistry& reg, const std::string& op, const py::object& dims_list, const std::string& db_path,
                const std::string& strategy, double budget, const py::object& reps, const py::object& warmup,
                const std::vector<std::string>& variants, const std::string& dtype, const std::string& with,
                const std::string& dist, uint64_t seed, const py::object& threads,
                double timeout, bool thread_round, const std::string& data_class, const std::string& device,
                const py::object& progress) {

  const int64_t reps_n = Checked(reps, "reps", [](int64_t v) { return limits::CheckReps(v, "reps", 1); });
  const int64_t warmup_n = Checked(warmup, "warmup", [](int64_t v) { return limits::CheckReps(v, "warmup", 0); });
  const Strategy parsed = Value(ParseStrategy(strategy));
  TuneRequest base;
  base.op = op;
  base.options = OptionsOf(dtype, with, dist, seed);
  base.variants = variants;
  base.data_class = data_class;
  base.search.strategy = parsed;
  base.search.reps = static_cast<int>(reps_n);
  base.search.budget_seconds = budget;
  base.search.seed = seed;
  base.warmup = static_cast<int>(warmup_n);
  base.threads = Threads(threads);
  base.thread_round = thread_round;
  base.timeout_seconds = timeout;
  base.db_path = db_path;
  base.device = DeviceOf(device) == DeviceKind::kCuda ? KREG_DEVICE_CUDA : 0;
  Check(CheckTuneRequest(base));

  std::vector<py::object> problems;
  const bool one = !py::isinstance<py::list>(dims_list) && !py::isinstance<py::tuple>(dims_list);
  if (one) {
    problems.push_back(dims_list);
  } else {
    for (py::handle d : dims_list) problems.push_back(py::reinterpret_borrow<py::object>(d));
  }
  std::shared_ptr<const Op> the_op = Value(reg.registry->GetOp(op));
  std::vector<NamedValues> named;
  for (const py::object& d : problems) {
    NamedValues values = NamedFromPython(d);
    Check(the_op->ParseValues(values).status());
    named.push_back(std::move(values));
  }
  absl::StatusOr<TuningDb> db = TuningDb::Load(db_path);
  if (db.status().code() == absl::StatusCode::kNotFound) db = TuningDb();  // a new table
  if (!db.ok()) ThrowFile(db.status());
  // The table must be writable before anything is measured.
  if (absl::Status s = TuningDb::CheckWritable(db_path); !s.ok()) ThrowFile(s);
  db->AddMachine(ThisMachine());

  py::list results;
  for (NamedValues& values : named) {
    TuneRequest request = base;
    request.values = std::move(values);
    std::atomic<bool> stop{false};
    PyObserver observer(progress, &stop);
    absl::StatusOr<TuneResult> result;
    {
      SigintStops sigint(&stop);
      py::gil_scoped_release release;
      result = kreg::Tune(*reg.registry, request, &*db, &observer, &stop);
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C: KeyboardInterrupt
    observer.Rethrow();
    if (!result.ok()) {
      if (result.status().code() == absl::StatusCode::kPermissionDenied ||
          result.status().code() == absl::StatusCode::kDataLoss) {
        ThrowFile(result.status());
      }
      Throw(result.status());
    }
    results.append(TuneResultDict(*result, StrategyName(parsed)));
  }
  return one ? results[0] : py::object(results);
}

}  // namespace kreg::python
