#include "kreg/dispatch.h"

#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kreg/log.h"

namespace kreg {

absl::StatusOr<Dispatcher> Dispatcher::Create(const Registry& registry, const TuningDb& db,
                                              std::string machine_id, std::string data_class) {
  absl::StatusOr<Lut> lut = Lut::Build(db, registry);
  if (!lut.ok()) return lut.status();
  return Create(registry, *std::move(lut), std::move(machine_id), std::move(data_class));
}

absl::StatusOr<Dispatcher> Dispatcher::Create(const Registry& registry, Lut lut, std::string machine_id,
                                              std::string data_class) {
  if (machine_id.empty()) machine_id = HostMachine().id;
  OpMap ops;
  for (std::shared_ptr<const Op>& op : registry.Ops()) {
    std::string name = op->name();
    ops.emplace(std::move(name), std::move(op));
  }
  return Dispatcher(std::move(lut), std::move(ops), std::move(machine_id), std::move(data_class));
}

namespace {

// A call's shape as raw words: the op, the device, the threads asked, its
// dims, its attributes' bits, each tensor's presence and dtype, then the
// data class's bytes. Equal words, equal key and data class: the table's
// answer is the same.
using MemoKey = absl::InlinedVector<uint64_t, 32>;

MemoKey KeyWords(const Op& op, const kreg_args& args, const std::string& data_class, const RunOptions& options) {
  MemoKey key;
  key.push_back(reinterpret_cast<uintptr_t>(&op));
  // The device by kind and ordinal, not address: one over a caller's
  // stream is made per call (kreg/device.h: OpenCudaOnStream).
  const kreg_device* device = options.device;
  key.push_back(device == nullptr ? 0 : (uint64_t{1} << 63) | (uint64_t(uint32_t(device->kind)) << 32) |
                                            uint32_t(device->ordinal));
  key.push_back(static_cast<uint64_t>(options.num_threads));
  key.push_back(args.num_dims);
  for (size_t i = 0; i < args.num_dims; ++i) key.push_back(static_cast<uint64_t>(args.dims[i]));
  for (size_t i = 0; i < args.num_attrs; ++i) {
    uint64_t bits;
    std::memcpy(&bits, &args.attrs[i], sizeof bits);
    key.push_back(bits);
  }
  for (size_t i = 0; i < args.num_tensors; ++i) {
    const DLTensor* t = args.tensors[i];
    key.push_back(t == nullptr ? 0 : (uint64_t{1} << 32) | (uint64_t{t->dtype.code} << 16) | t->dtype.bits);
  }
  for (size_t i = 0; i < data_class.size(); i += sizeof(uint64_t)) {
    uint64_t word = 0;
    std::memcpy(&word, data_class.data() + i, std::min(sizeof word, data_class.size() - i));
    key.push_back(word);
  }
  key.push_back(data_class.size());
  return key;
}

// What the table answered for one call shape.
struct Remembered {
  const Kernel* kernel;
  const Config* config;
  Match match;
  int threads;
  std::string kernel_name, config_text;
};

}  // namespace

// A std lock, not Abseil's: TSan sees through it (Debian's Abseil is not
// instrumented).
struct Dispatcher::Memo {
  std::shared_mutex mu;
  absl::flat_hash_map<MemoKey, Remembered> answers;  // guarded by mu
};

Dispatcher::Dispatcher(Lut lut, OpMap ops, std::string machine_id, std::string data_class)
    : lut_(std::move(lut)),
      ops_(std::move(ops)),
      machine_id_(std::move(machine_id)),
      data_class_(std::move(data_class)),
      memo_(std::make_unique<Memo>()),
      recorder_(ShapeRecorder::FromEnvironment()) {}

Dispatcher::Dispatcher(Dispatcher&& other) noexcept
    : lut_(std::move(other.lut_)),
      ops_(std::move(other.ops_)),
      machine_id_(std::move(other.machine_id_)),
      data_class_(std::move(other.data_class_)),
      memo_(std::make_unique<Memo>()),
      recorder_(std::move(other.recorder_)) {}

Dispatcher& Dispatcher::operator=(Dispatcher&& other) noexcept {
  lut_ = std::move(other.lut_);
  ops_ = std::move(other.ops_);
  machine_id_ = std::move(other.machine_id_);
  data_class_ = std::move(other.data_class_);
  memo_ = std::make_unique<Memo>();
  recorder_ = std::move(other.recorder_);
  return *this;
}

Dispatcher::~Dispatcher() = default;

const Op* Dispatcher::FindOp(absl::string_view name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

absl::StatusOr<DispatchResult> Dispatcher::Run(absl::string_view op_name, const kreg_args& args,
                                               const RunOptions& options) const {
  const Op* op = FindOp(op_name);
  if (op == nullptr) {
    std::vector<absl::string_view> known;
    for (const auto& entry : ops_) known.push_back(entry.first);
    return absl::NotFoundError(absl::StrCat("unknown op '", op_name, "' (known: ",
                                            known.empty() ? "none" : absl::StrJoin(known, ", "),
                                            ")"));
  }
  // The kernel validates the call as it runs; a classifier reads the data,
  // so it sees the call validated first.
  std::string data_class = data_class_;
  if (data_class.empty() && op->has_data_class()) {
    if (absl::Status s = op->Validate(args); !s.ok()) return s;
    absl::StatusOr<std::string> asked = op->DataClass(args);
    if (!asked.ok()) return asked.status();
    data_class = *std::move(asked);
  }
  absl::StatusOr<DispatchResult> answer = Answer(*op, args, std::move(data_class), options);
  if (!answer.ok()) return answer.status();

  // The thread count the answer was fastest with, if fewer than asked.
  const int answer_threads = answer->threads;
  RunOptions with_threads;
  const RunOptions* given = &options;
  if (answer_threads > 0 && (options.num_threads == 0 || answer_threads < options.num_threads)) {
    with_threads = options;
    with_threads.num_threads = answer_threads;
    given = &with_threads;
  }
  const RunOptions& opts = *given;
  const RunOptions* run_options = &opts;
  RunOptions with_dispatch;
  if (!opts.dispatch) {
    // Sub-ops of a composite op go through this Dispatcher, each with a
    // workspace of its own (the caller's is in use by the kernel that
    // dispatches).
    with_dispatch = opts;
    with_dispatch.dispatch = [this, &opts](absl::string_view sub_op, const kreg_args& sub_args) {
      // `opts` outlives the kernel's run, and so this call.
      RunOptions sub = opts;
      sub.workspace = nullptr;
      return Run(sub_op, sub_args, sub).status();
    };
    run_options = &with_dispatch;
  }
  if (LogEnabled(LogLevel::kDebug)) {
    const OpKey key = op->KeyOf(args);
    Log(LogLevel::kDebug, absl::StrCat("dispatch ", op->name(), " ", key.dtype, " ", DimsString(key.dims), ": ",
                                       answer->kernel, " ", answer->config, " (", MatchName(answer->match), ")"));
  }
  if (absl::Status s = answer->ran->Run(*answer->ran_config, args, *run_options); !s.ok()) return s;
  return answer;
}

absl::StatusOr<DispatchResult> Dispatcher::Answer(const Op& op, const kreg_args& args, std::string data_class,
                                                  const RunOptions& options) const {
  MemoKey words = KeyWords(op, args, data_class, options);
  {
    std::shared_lock<std::shared_mutex> lock(memo_->mu);
    if (auto it = memo_->answers.find(words); it != memo_->answers.end()) {
      const Remembered& r = it->second;
      return DispatchResult{r.kernel_name, r.config_text, r.match, std::move(data_class), r.kernel, r.config,
                            r.threads};
    }
  }
  if (absl::Status s = op.Validate(args); !s.ok()) return s;  // before KeyOf reads the call
  const OpKey key = op.KeyOf(args);
  // On a device (its tensors there): the GPU's entries, answered with its kernels.
  const std::string gpu = options.device != nullptr ? GpuMachine(*options.device).id() : std::string();
  absl::StatusOr<LutAnswer> answer = lut_.Query(op.name(), key.dtype, key.dims, gpu.empty() ? machine_id_ : gpu,
                                                data_class, ThreadsAvailable(options.num_threads));
  if (!answer.ok()) return answer.status();
  if (recorder_ != nullptr && answer->match != Match::kExact) {
    recorder_->Add({op.name(), key.dtype, key.dims, data_class,
                    options.device != nullptr ? DeviceKind::kCuda : DeviceKind::kCpu});
  }
  Remembered r{answer->kernel, answer->config, answer->match, answer->threads, answer->kernel->name(),
               answer->kernel->ConfigString(*answer->config)};
  DispatchResult result{r.kernel_name, r.config_text, r.match, std::move(data_class), r.kernel, r.config, r.threads};
  std::unique_lock<std::shared_mutex> lock(memo_->mu);
  if (memo_->answers.size() >= kMemoEntries) memo_->answers.clear();
  memo_->answers.emplace(std::move(words), std::move(r));
  return result;
}

}  // namespace kreg
