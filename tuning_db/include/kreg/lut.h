// kreg's tuning database (the LUT): what the autotuner measured, kept per
// (problem, variant, configuration), and the run-time lookup that answers
// "which variant and which parameters for this op, dtype and shape on this
// machine?". The schema is kreg/kreg_tuning.pb.h (tuning_db/kreg_tuning.proto).
//
//   TuningDb  the data: load, save (atomic; merged under a file lock), record
//             trials, merge, diff, print. A value type: copyable and movable.
//   Lut       an immutable index of a TuningDb resolved against a Registry's
//             loaded kernels, built once and queried many times.
//
// Files. Binary protobuf, or text format when the path ends in .txtpb,
// .textproto or .pbtxt (Save chooses by extension). Load accepts either
// format under any name: it parses binary first (text first for a text
// extension) and then the other. A file must carry a schema_version in
// [1, kSchemaVersion]; a binary file must end with the entry_count trailer, so
// one cut short anywhere is refused (a text file, which people may write by
// hand, is checked against its trailer only when it has one). Errors: NotFound for a missing file;
// DataLoss naming the file for an empty, corrupt, truncated or foreign one (random bytes, JSON,
// .npy) or one written by a newer kreg; the errno's code for other I/O failures. Saving writes a
// temporary file beside the target, fsyncs it, renames it over the target and fsyncs the folder,
// under an exclusive flock(2) on `path + ".lock"` (left in place: removing a lock file races with
// its next user). A failed save leaves the previous file intact; a temporary file left by a writer
// killed mid-save is removed by the next.
//
// Ownership. TuningDb owns its protobuf. A Lut owns copies of what it needs
// and keeps the kernels it answers with loaded (std::shared_ptr), so it
// outlives both the TuningDb and the Registry it was built from. A LutAnswer
// points into its Lut and is valid while that Lut lives.
//
// Thread-safety. TuningDb: const methods may run concurrently; anything else
// needs external synchronisation. Separate processes may SaveMerged one file
// concurrently and lose nothing. Lut: immutable after Build; Query is
// thread-safe.
#ifndef KREG_TUNING_DB_LUT_H_
#define KREG_TUNING_DB_LUT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/arena.h"
#include "kreg/kreg_tuning.pb.h"
#include "kreg/machine.h"
#include "kreg/op.h"
#include "kreg/params.h"
#include "kreg/registry.h"

namespace kreg {

// The newest schema_version this kreg reads; the one it writes. 2: binary
// files end with a checksum (version 1 files still load, unchecked).
inline constexpr uint32_t kSchemaVersion = 2;

// ---- Machines ---------------------------------------------------------------

// A machine is the registry's MachineInfo (kreg/machine.h: HostMachine,
// FingerprintId, GpuMachineInfo, MachineClass, ...); a table keeps it as a
// tuning::Machine. These convert, and say the same of a record.
tuning::Machine ToProtoMachine(const MachineInfo& machine);
MachineInfo FromProtoMachine(const tuning::Machine& machine);

// This machine (HostMachine()) as a table records it. Computed once.
const tuning::Machine& ThisMachine();

// The stable id of a machine's fields (see Machine.id in the schema).
std::string FingerprintId(const tuning::Machine& machine);

// A GPU as a machine of its own (tuning::Machine.gpu), its id filled in:
// the machine of the keys of kernels that run on it.
tuning::Machine GpuMachine(absl::string_view name, int sm, int num_sms, uint64_t memory_bytes,
                           absl::string_view driver);
// The same of a device the host opened (kreg_device: its name, SM version
// and count, memory and driver version).
tuning::Machine GpuMachine(const kreg_device& device);
// The same of a device CudaDevices() lists.
tuning::Machine MachineOf(const GpuInfo& gpu);

// kreg/machine.h's names of a machine, of a record: MachineVendor,
// MachineArch (inferred from the model name for records that predate those
// fields), MicroArch ("zen3"), MachineSummary ("AMD EPYC, zen3, avx2, 2
// cores"; "NVIDIA H100 80GB HBM3, sm_90, 80 GiB, driver CUDA 13.0") and
// MachineClass ("amd-epyc-zen3-avx2-2c", "nvidia-h100-80gb-hbm3-sm90").
std::string MachineVendor(const tuning::Machine& machine);
std::string MachineArch(const tuning::Machine& machine);
std::string MicroArch(const tuning::Machine& machine);
std::string MachineSummary(const tuning::Machine& machine);
std::string MachineClass(const tuning::Machine& machine);

// ---- Keys and configurations -------------------------------------------------

// A key's dims are the op's key dims (Op::KeyOf, Op::KeyDims): its dims in
// the op's order, then the integer attributes that differ from their
// defaults. A key's dtype is the op's dtype signature (OpKey::dtype: "f32",
// "bf16,f32", "f32+row_starts+row_ends").

// `dims` in the canonical order of `op`: the op's dims in its order, then its
// integer attributes in its order, omitting those equal to their defaults,
// then names the op does not know, as given.
Dims CanonicalDims(const Op& op, const Dims& dims);

// A problem key. `dtype` is the op's dtype signature; `dims` are stored as
// given (pass Op::KeyOf(args).dims or Op::KeyDims(values), which are
// canonical). Two keys whose dims differ only in order are the same problem
// to a TuningDb.
tuning::ProblemKey MakeProblemKey(absl::string_view op, absl::string_view dtype, const Dims& dims,
                                  absl::string_view machine_id, absl::string_view data_class = {});
// The same from an op's key of a call.
tuning::ProblemKey MakeProblemKey(absl::string_view op, const OpKey& key,
                                  absl::string_view machine_id, absl::string_view data_class = {});

Dims KeyDims(const tuning::ProblemKey& key);

// A trial's identity within its entry (not for display): variant, version,
// configuration (params in any order) and chosen thread count.
std::string TrialId(const tuning::Trial& trial);

// "topk f32 batch=8,n=1000,k=10 @0123456789abcdef", with " [dist=ties]"
// before the "@" when the key has a data class.
std::string KeyString(const tuning::ProblemKey& key);

// A kernel configuration by parameter name, in the kernel's parameter order;
// choices by name.
tuning::Config ToProtoConfig(const Kernel& kernel, const Config& config);

// The kernel's Config for a stored one. InvalidArgument naming the parameter
// when a parameter is missing, unknown, given twice or of the wrong kind, or
// names a choice the kernel does not declare; then the values are checked by
// the kernel's ParamSpace::Validate on a CPU of `isa` (values it declares,
// lists increasing, choices that CPU has, inactive parameters at their
// defaults). Legality for a shape is the kernel's Check.
absl::StatusOr<Config> FromProtoConfig(const Kernel& kernel, const tuning::Config& config, uint32_t isa = CpuIsa());

// "num_blocks=128 m_schedule=5,8,12 stage2=partial_sort"; "" for none.
std::string ConfigText(const tuning::Config& config);

// ---- The database -------------------------------------------------------------

enum class FileFormat { kBinary, kText };

// kText for a path ending in .txtpb, .textproto or .pbtxt; else kBinary.
FileFormat FormatForPath(absl::string_view path);

struct SaveOptions {
  // Keep only each entry's best and runner_up, not every trial: a slim table
  // for lookup only (a later sweep then re-measures the rest).
  bool winners_only = false;
  // Keep, per entry, the fastest OK trial of each variant per combination
  // of its named choices (with its measurements) and nothing else: the
  // shipped tables' form. (A choice may need an ISA: a machine without it
  // still finds the variant's best it can run.)
  bool best_per_variant = false;
};

// How a save waits for a table's lock (TuningDb::Save, SaveMerged: another
// kreg may be writing the same table), for the whole process like the log
// level: after a second it says so (a warning naming the lock file), and it
// gives up with an error naming the file after `seconds`
// (limits::kDefaultLockTimeoutSeconds unless set; 0: at once when held) or
// as soon as *cancel turns true (a SIGINT or SIGTERM handler's flag; NULL:
// none). REQUIRES: seconds within limits::CheckSeconds (zero allowed).
void SetLockWait(double seconds, const std::atomic<bool>* cancel = nullptr);

class TuningDb {
 public:
  // An empty database of the current schema.
  TuningDb();
  TuningDb(const TuningDb& other);
  TuningDb& operator=(const TuningDb& other);
  // A moved-from TuningDb is empty (no schema_version).
  TuningDb(TuningDb&& other) noexcept;
  TuningDb& operator=(TuningDb&& other) noexcept;
  ~TuningDb();

  // Reads `path` (binary or text; see the file comment).
  static absl::StatusOr<TuningDb> Load(const std::string& path);
  // Parses file contents; `name` is the file named in errors.
  static absl::StatusOr<TuningDb> Parse(absl::string_view bytes, absl::string_view name);
  // Adopts a parsed Database. DataLoss for a missing or newer schema_version
  // or an entry without an op. Entries with the same key (dims compared as
  // a set) are merged (newest measurement of each trial wins), and
  // best/runner_up recomputed. Keys are kept as written: a TuningDb knows no
  // ops, so it does not reorder dims or drop attributes at their defaults
  // (the Lut does, against the registry's ops).
  static absl::StatusOr<TuningDb> FromProto(tuning::Database database);

  // Binary protobuf with the checksum trailer: what Save writes for a
  // binary path, and what Parse checks.
  std::string ToBinary() const;
  // Why the file it was loaded from could not be checked ("" if it could,
  // or for text files): a binary file of schema 1 carries no checksum.
  const std::string& unchecked() const { return unchecked_; }

  // Writes atomically (binary, or text for a text extension). Symbolic
  // links are followed: the file they end at is locked and replaced.
  absl::Status Save(const std::string& path, const SaveOptions& options = {}) const;

  // Under the file lock: re-reads `path` if it exists, merges this database
  // into it (MergeFrom), and saves the result atomically; on success this
  // database becomes the merged one. A file that exists but cannot be read is
  // an error (DataLoss if corrupt) and is left untouched.
  absl::Status SaveMerged(const std::string& path);

  // Whether a save to `path` could be made now (before a sweep measures
  // anything): its folder exists (else InvalidArgument), this user may
  // write the table or create it there (else PermissionDenied), and its
  // lock can be had (waited for as SetLockWait says, then released).
  static absl::Status CheckWritable(const std::string& path);

  // ---- Recording
  // Adds or replaces (by id) a machine; an empty id is filled in.
  void AddMachine(tuning::Machine machine);
  // Adds or replaces (by machine and backend) a communicator's cost model.
  void SetCommModel(const tuning::CommModel& model);
  // The model of `backend` on `machine_id`, or nullptr.
  const tuning::CommModel* FindCommModel(absl::string_view machine_id, absl::string_view backend) const;
  // Records a measurement under `key`, replacing the trial with the same
  // (variant, variant_version, config) if any, and updates best/runner_up.
  void AddTrial(const tuning::ProblemKey& key, const tuning::Trial& trial);
  // Stamps how `key` was tuned (creates the entry if needed).
  void SetTuningInfo(const tuning::ProblemKey& key, absl::string_view tool_version,
                     absl::string_view strategy, int64_t tuned_at, bool complete = true);
  // The recorded trial of (variant, version, config) for `key`, or nullptr:
  // what a resumed sweep skips. Valid until this database is next modified.
  // `threads`: the trial's chosen thread count (0: all cores).
  const tuning::Trial* FindTrial(const tuning::ProblemKey& key, absl::string_view variant,
                                 uint32_t variant_version, const tuning::Config& config, int threads = 0) const;
  // Records a measurement below full repetitions (the entry's `partial`:
  // never an answer), unless one of the same id with more repetitions is
  // there.
  void AddPartial(const tuning::ProblemKey& key, const tuning::Trial& trial);
  // The partial measurement of (variant, version, config, threads) for
  // `key`, or nullptr. Valid until this database is next modified.
  const tuning::Trial* FindPartial(const tuning::ProblemKey& key, absl::string_view variant,
                                   uint32_t variant_version, const tuning::Config& config, int threads = 0) const;
  // The entry for `key`, or nullptr. Valid until this database is modified.
  const tuning::Entry* FindEntry(const tuning::ProblemKey& key) const;
  // Removes trials (and partial measurements) whose variant is registered
  // in `registry` with another version (those of variants not registered
  // there are kept, their plugin may just not be loaded). Returns how many
  // trials were removed.
  int DropStale(const Registry& registry);

  // ---- Combining
  // How MergeFrom settles one candidate (or entry) at the same second in
  // both: kIncoming, `other`'s (a sweep saving its latest results over the
  // file's); kCanonical, the same one whichever table comes first (db merge
  // of separate tables: A then B gives what B then A gives).
  enum class Ties { kIncoming, kCanonical };
  // Union of machines and entries; per key the union of trials, keeping the
  // newer measurement (measured_at; ties as `ties` says) of the same
  // (variant, variant_version, config); best/runner_up recomputed; the
  // entry's tool_version/strategy/tuned_at from whichever was tuned later.
  void MergeFrom(const TuningDb& other, Ties ties = Ties::kIncoming);
  static TuningDb Merge(const TuningDb& a, const TuningDb& b);
  // One line per difference: "only in a: KEY", "only in b: KEY", and
  // "differs: KEY: a=WINNER b=WINNER" where the best variant, version or
  // configuration differ. "" when the winners agree everywhere.
  static std::string Diff(const TuningDb& a, const TuningDb& b);

  // ---- Reading
  // The database. Each entry's `trials` holds every known trial (a slim
  // file's best and runner_up are folded in on load); best and runner_up
  // are the two fastest OK trials (lowest median_ns; ties by variant, then
  // configuration).
  const tuning::Database& proto() const { return *db_; }
  size_t size() const { return static_cast<size_t>(db_->entries_size()); }
  // Protobuf text format.
  std::string ToText() const;
  // Protobuf's JSON mapping (field names as in the .proto), for programs.
  std::string ToJson() const;
  // One CSV row per trial, with a header (for pandas or a spreadsheet): the
  // key (op, dtype, dims, data_class, machine), variant, version, params
  // (as `kreg db show` prints them), threads, status, median_ns, min_ns,
  // max_ns, relative_iqr, reps, measured_at (Unix seconds), error.
  // Partial measurements are not trials and are left out.
  std::string ToCsv() const;
  // One line per entry, sorted: "KEY -> variant vN params  median (runner-up
  // variant median, T trials)".
  std::string Summary() const;

 private:
  // The trial ids of an entry's trials (or partial measurements) by index,
  // and the index of an id: found by a scan while there are few (most
  // entries hold a handful of trials, and a map per entry cost a tenth of a
  // table's load), by a hash map past kScanned.
  class Ids {
   public:
    const std::string& operator[](int i) const { return ids_[i]; }
    int Find(absl::string_view id) const;  // -1 if absent
    void Add(std::string id);              // REQUIRES: Find(id) < 0

   private:
    static constexpr int kScanned = 16;
    std::vector<std::string> ids_;
    absl::flat_hash_map<std::string, int> map_;  // empty until past kScanned
  };
  struct EntryIndex {
    Ids trials, partial;
    int best = -1, runner_up = -1;  // indices into trials
  };

  // FromProto without making strings valid UTF-8 (for parsed files, whose
  // strings protobuf has checked): copies what it keeps of `*database`,
  // which it leaves changed.
  // `arena`: the one `*database` lives on, if the TuningDb may keep it
  // (then what it keeps is moved, not copied); nullptr: copied to a new one.
  static absl::StatusOr<TuningDb> Adopt(tuning::Database* database,
                                        std::unique_ptr<google::protobuf::Arena> arena = nullptr);
  // An empty database of the current schema on `arena`.
  explicit TuningDb(std::unique_ptr<google::protobuf::Arena> arena);
  // Whether a key's strings are known to be valid UTF-8 already (a parsed
  // or sanitized table's), or are made so when stored.
  enum class KeyStrings { kUnchecked, kValidUtf8 };
  // Index of the entry for `key` (dims in any order), added if missing; or -1.
  // `take`: `key` itself, which may be moved from (when on this database's
  // arena) instead of copied; `id`: its KeyId where made already.
  int FindOrAddEntry(const tuning::ProblemKey& key, KeyStrings strings = KeyStrings::kUnchecked,
                     tuning::ProblemKey* take = nullptr, std::string id = "");
  int FindEntryIndex(const tuning::ProblemKey& key) const;
  // Upserts; `keep_newer` keeps an existing trial that was measured later
  // (at the same second: as `ties` says).
  void PutTrial(int entry, const tuning::Trial& trial, bool keep_newer, Ties ties = Ties::kIncoming);
  // The same with the trial's id (TrialIdOf) made already; `take`: the trial
  // itself, moved from when on this database's arena; `sync`: whether to
  // update the entry's best and runner_up fields now (else a
  // RecomputeWinners must follow). Returns the trial's index in the entry.
  int PutTrialWithId(int entry, const tuning::Trial& trial, std::string id, bool keep_newer, Ties ties,
                     tuning::Trial* take, bool sync);
  // Adds or replaces the entry's partial measurement of the same id: the
  // one of more repetitions; on a tie the newer; at the same second, an OK
  // one over a failure (the mark of one in flight under MPI).
  void PutPartial(int entry, const tuning::Trial& trial);
  void RecomputeWinners(int entry);
  void SyncWinners(int entry);
  void Reindex();

  // The database lives on its own arena: a table of ten thousand entries
  // is a hundred thousand small messages, cheaper to allocate and to free
  // there. A loaded table's is the one its file was parsed onto (what it
  // keeps was moved from the parsed messages, whose emptied shells stay
  // there until it goes). Never null.
  std::unique_ptr<google::protobuf::Arena> arena_;
  tuning::Database* db_;
  std::string unchecked_;
  absl::flat_hash_map<std::string, int> entries_;  // key id -> index in entries
  std::vector<EntryIndex> index_;                  // parallel to db_.entries()
};

// OK if every trial of `db` whose kernel `registry` holds at the trial's
// version stores a configuration inside that kernel's parameter space (on
// any CPU: a choice this one lacks is no fault of the table's); else
// InvalidArgument naming `name` (the file), the entry and the trial. Trials
// of other versions are stale, not hostile: Lut::Build skips them, warning.
absl::Status CheckConfigs(const TuningDb& db, const Registry& registry, absl::string_view name);

// ---- Shipped tables -----------------------------------------------------------

// The folders holding the tables kreg ships (one per machine class,
// *.txtpb): those of KREG_TABLE_PATH (colon-separated) when it is set, even
// to "" (none); else share/kreg/tables beside the running program's prefix
// (<prefix>/bin/kreg -> <prefix>/share/kreg/tables; the build tree has the
// same layout), then the configured install prefix's.
std::vector<std::string> ShippedTableDirs();

// The shipped tables of ShippedTableDirs(), merged (a file name found in two
// folders is read from the first). A file that cannot be read is skipped
// with a line in `warnings`.
TuningDb ShippedTables(std::vector<std::string>* warnings);

// ---- Lookup ------------------------------------------------------------------

// Where an answer came from.
enum class Match {
  kExact,    // a tuned entry for exactly this problem on the asked machine
  kNearest,  // the nearest tuned problem on the asked machine whose winner is legal for this one
  kDefault,  // nothing usable was tuned for this machine: a default (see LutAnswer::why)
  kModel,    // nothing tuned; a collective's choice by the backend's calibrated cost model
  kSimilar,  // nothing tuned on the asked machine; the most similar tuned machine's answer
};
// "exact", "nearest", "default", "model", "similar machine".
absl::string_view MatchName(Match match);

// Which machines' measurements may answer a query.
enum class MachinePolicy {
  // The asked machine's; then, when none can answer, the most similar tuned
  // machine's: same vendor and architecture, then the fewest ISA extensions
  // apart, then the nearest core count (in log2), then the same core
  // generation (family and model), then by id. Its entry for the same shape,
  // else its nearest, answering with the fastest of its measurements that
  // runs on this CPU.
  kSimilar,
  // Only the asked machine's: with none, a default.
  kStrict,
};

struct LutOptions {
  MachinePolicy machines = MachinePolicy::kSimilar;
};

// The machine id under which Lut keeps its measured defaults; not a real
// machine's (ids are 16 hex digits).
inline constexpr absl::string_view kMeasuredDefaultsId = "measured-defaults";

struct LutAnswer {
  // The kernel to run ("op/variant" is kernel->name()) and its configuration.
  // Both owned by the Lut.
  const Kernel* kernel = nullptr;
  // The entry answered from was tuned by a sweep cut short (exact, nearest).
  bool incomplete = false;
  const Config* config = nullptr;
  Match match = Match::kDefault;
  // The tuned problem answered from (exact, nearest); nullptr for default.
  const Dims* tuned_dims = nullptr;
  // Its log2 distance from the asked problem: 0 when exact.
  double distance = 0;
  // The winning measurement (median, spread); nullptr for default.
  const tuning::Trial* trial = nullptr;
  // The thread count the answer was measured fastest with (the tuner tries
  // fewer threads than cores for its leaders); 0: all cores. Run it with
  // no more than this many (Dispatcher::Run does).
  int threads = 0;
  // The machine whose measurement answered (exact, nearest, similar), when
  // the table records it; nullptr otherwise.
  const tuning::Machine* machine = nullptr;
  // For a default: why no measurement of the asked machine (or a similar
  // one) answered, and what the default is ("no table for this machine
  // (AMD EPYC, zen3, avx2, 2 cores), none for a similar one; measured
  // default: ..."). Empty for other matches.
  std::string why;
  // Entries skipped on the way (stale, illegal for this shape, variant
  // missing or unavailable), one line each. Empty on a clean exact hit.
  std::vector<std::string> warnings;
  // Which table answered, for a layered Lut (Lut::Layered); empty otherwise.
  absl::string_view table;
};

class Lut {
 public:
  // Resolves every entry of `db` against `registry`: each entry answers with
  // its fastest OK trial whose variant is registered at the trial's version,
  // available on this CPU, and whose config converts and is legal for the
  // entry's own shape. An entry whose fastest trial is stale (version changed)
  // is reported in warnings(); it answers from its fastest current trial if
  // one exists, else it is skipped. Entries of an op the registry does not
  // know, or whose dtype signature the op does not take, cannot answer
  // (reported in warnings()).
  //
  // Measured defaults. Per (op, dtype signature, data class, shape) tuned on
  // any machine of `db`, the variant whose fastest measurement is, in
  // geometric mean over the machines that measured the shape, nearest each
  // machine's best (among variants available here and measured on at least
  // half of them; ties to the more often measured, then by name), with its
  // configuration from the machine most similar to this one that measured
  // it and where it is legal. A query nothing else answers takes the
  // measured default of the nearest such shape (log2 distance, legal for the
  // asked one), before the op's hand-written default.
  static absl::StatusOr<Lut> Build(const TuningDb& db, const Registry& registry,
                                   const LutOptions& options = {});

  // A user's table in front of the shipped ones: `front` answers (named
  // `front_name` in LutAnswer::table) unless `behind` (`behind_name`) has an
  // answer of a better match level: exact, then nearest, similar machine,
  // model, default. An exact answer beats a nearest one whatever table it
  // comes from; at one level the user's table answers where it has the
  // key, even from a sweep of a subset of the variants; behind fills only
  // what front lacks. At the default level behind answers (its measured
  // defaults span more machines). The tables are not pooled: front's trials
  // never compete with behind's. warnings() are front's.
  static Lut Layered(Lut front, std::string front_name, Lut behind, std::string behind_name);

  Lut(Lut&&) noexcept;
  Lut& operator=(Lut&&) noexcept;
  ~Lut();

  // `dtype` is the op's dtype signature (OpKey::dtype); `dims` its key dims,
  // in any order; integer attributes equal to their defaults may be given or
  // left out.
  //
  // Exact key first (a hash lookup that allocates nothing unless it must
  // warn), else the nearest tuned problem of the same op, dtype signature,
  // machine, data class and dim names (distance: sum over dims of
  // |log2(a + 1) - log2(b + 1)|, ties to the earlier entry) whose config is
  // legal for the asked shape; else (MachinePolicy::kSimilar) the same two
  // on the similar machines, most similar first; else, for a collective
  // whose backend was calibrated on the asked machine, the cost model's
  // choice; else the measured default (see Build); else the op's own
  // default_variant for the shape, then its default_variants in order, then
  // its other available kernels by name, then its reference kernel; the
  // first whose default configuration is legal for the shape. The machine
  // the similarity is judged from is the table's record of `machine_id`, or
  // ThisMachine() for its id; a machine neither knows has no similar ones.
  //
  // A GPU (a machine id of GpuMachine's, "cuda-..."): its entries answer
  // with CUDA kernels only (a CPU's with CPU kernels only); its similar
  // machines are the tuned GPUs of the same SM version; with none, the
  // op's CUDA kernels by name, the first legal for the shape (measured
  // defaults and cost models are the CPU's).
  //
  // The shape is checked only when the exact lookup misses: InvalidArgument
  // for dims or a dtype signature the op does not take, or when no kernel
  // takes the shape (k > n); NotFound for an op the registry does not know
  // or with no available kernel.
  //
  // Legality is the kernel's Check on shape-only arguments the op builds
  // (Op::MakeShapeArgs: tensors with the asked shapes and dtypes whose data
  // must not be read).
  //
  // `threads`: how many threads the caller will run with (0: all cores).
  // An entry holds measurements on several thread counts (the thread
  // round, or sweeps with --threads); with fewer threads than the cores of
  // the machine an entry was measured on, it answers with its fastest
  // measurement on no more than `threads` (one on all cores counts as that
  // machine's cores), or, with none, its fastest.
  absl::StatusOr<LutAnswer> Query(absl::string_view op, absl::string_view dtype, const Dims& dims,
                                  absl::string_view machine_id, absl::string_view data_class = {},
                                  int threads = 0) const;

  // Found while building, one line each: stale entries, entries whose key
  // the op does not take (an unknown dtype signature or dim), and ops the
  // registry does not know (one line per op).
  const std::vector<std::string>& warnings() const;
  // Entries that can answer (a layered Lut's: both tables').
  size_t size() const;

 private:
  struct Impl;
  explicit Lut(std::unique_ptr<const Impl> impl);
  absl::StatusOr<LutAnswer> QueryOwn(absl::string_view op, absl::string_view dtype, const Dims& dims,
                                     absl::string_view machine_id, absl::string_view data_class, int threads) const;
  std::unique_ptr<const Impl> impl_;
  // Layered: this table's name, and the Lut behind it.
  std::string name_;
  std::unique_ptr<const Lut> behind_;
};

}  // namespace kreg

#endif  // KREG_TUNING_DB_LUT_H_
