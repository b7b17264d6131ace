// Adopting parsed records as a TuningDb: the checks a table must pass
// (unknown fields dropped, schema, every number within kreg/limits.h's
// bounds) and the records moved into the table's index, merging what a
// hand-edited file repeats.
#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "kreg/limits.h"
#include "kreg/lut.h"
#include "tuning_db_internal.h"

namespace kreg {

using tuning::Trial;
using tuning_db_internal::HasUnknownFields;
using tuning_db_internal::KeyId;
using tuning_db_internal::Sanitize;
using tuning_db_internal::TrialIdOf;

namespace {

// The numbers of a table's records within kreg/limits.h's bounds: a hostile
// or careless value fails the load, naming its record (a 2^31 thread count
// would crash oneTBB's arena; a -1 median win every query; NaN break every
// comparison).
absl::Status CheckNumbers(const tuning::Database& db) {
  for (const tuning::Machine& m : db.machines()) {
    if (absl::Status s = limits::CheckCores(m.cores(), absl::StrCat("machine ", m.id(), ": cores")); !s.ok()) return s;
  }
  for (const tuning::CommModel& m : db.comm_models()) {
    const std::string where = absl::StrCat("communicator model ", m.backend(), " @", m.machine_id(), ": ");
    for (const auto& [value, name] : {std::pair{m.alpha_s(), "alpha_s"}, std::pair{m.beta_s_per_byte(), "beta_s_per_byte"},
                                      std::pair{m.gamma_s_per_byte(), "gamma_s_per_byte"}}) {
      if (absl::Status s = limits::CheckFinite(value, absl::StrCat(where, name)); !s.ok()) return s;
    }
    if (absl::Status s = limits::CheckRanks(m.ranks(), absl::StrCat(where, "ranks")); !s.ok()) return s;
  }
  auto check_entry = [&](int i) -> absl::Status {
    const tuning::Entry& e = db.entries(i);
    // The inline tests first; the checks and the record's name only for a
    // failure (a table of 10k entries is checked on every load).
    auto check = [&](const Trial& t, absl::string_view which) -> absl::Status {
      if (limits::ThreadsIn(t.threads()) && limits::NsIn(t.median_ns()) && limits::NsIn(t.min_ns()) &&
          limits::NsIn(t.max_ns()) && limits::RatioIn(t.relative_iqr()) && limits::RepsIn(t.reps(), 0)) {
        return absl::OkStatus();
      }
      const std::pair<const char*, absl::Status> checks[] = {
          {"threads", limits::CheckThreads(t.threads(), "")},
          {"median_ns", limits::CheckNs(t.median_ns(), "")},
          {"min_ns", limits::CheckNs(t.min_ns(), "")},
          {"max_ns", limits::CheckNs(t.max_ns(), "")},
          {"relative_iqr", limits::CheckFinite(t.relative_iqr(), "")},
          {"reps", limits::CheckReps(t.reps(), "", 0)},
      };
      for (const auto& [field, s] : checks) {
        if (s.ok()) continue;
        return absl::InvalidArgumentError(absl::StrCat("entry ", i, " (", KeyString(e.key()), "): ", which, " ",
                                                       t.variant(), " ", ConfigText(t.config()), ": ", field, ": ",
                                                       s.message()));
      }
      return absl::OkStatus();
    };
    for (const Trial& t : e.trials()) {
      if (absl::Status s = check(t, "trial"); !s.ok()) return s;
    }
    for (const Trial& t : e.partial()) {
      if (absl::Status s = check(t, "partial trial"); !s.ok()) return s;
    }
    if (e.has_best()) {
      if (absl::Status s = check(e.best(), "best"); !s.ok()) return s;
    }
    if (e.has_runner_up()) {
      if (absl::Status s = check(e.runner_up(), "runner_up"); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  // The entries on every core; the first that fails, in table order, is named.
  std::atomic<int> first{db.entries_size()};
  tbb::parallel_for(tbb::blocked_range<int>(0, db.entries_size(), 256), [&](const tbb::blocked_range<int>& r) {
    for (int i = r.begin(); i < r.end() && i < first.load(std::memory_order_relaxed); ++i) {
      if (check_entry(i).ok()) continue;
      for (int f = first.load(); i < f && !first.compare_exchange_weak(f, i);) {
      }
    }
  });
  if (first.load() < db.entries_size()) return check_entry(first.load());
  return absl::OkStatus();
}

}  // namespace

namespace {

// Whether two trials have the same TrialIdOf for certain, without making
// it: the same variant, version and thread count, and the same parameters in
// the same order. (False does not say that the ids differ.)
bool SameTrialId(const Trial& a, const Trial& b) {
  if (a.variant_version() != b.variant_version() || std::max(a.threads(), 0) != std::max(b.threads(), 0) ||
      a.variant() != b.variant() || a.config().params_size() != b.config().params_size()) {
    return false;
  }
  for (int i = 0; i < a.config().params_size(); ++i) {
    const tuning::ParamValue& p = a.config().params(i);
    const tuning::ParamValue& q = b.config().params(i);
    if (p.name() != q.name() || p.value_case() != q.value_case()) return false;
    switch (p.value_case()) {
      case tuning::ParamValue::kIntValue:
        if (p.int_value() != q.int_value()) return false;
        break;
      case tuning::ParamValue::kListValue:
        if (!std::equal(p.list_value().values().begin(), p.list_value().values().end(),
                        q.list_value().values().begin(), q.list_value().values().end())) {
          return false;
        }
        break;
      case tuning::ParamValue::kChoice:
        if (p.choice() != q.choice()) return false;
        break;
      case tuning::ParamValue::VALUE_NOT_SET:
        break;
    }
  }
  return true;
}

// Whether no two of `ids` are the same.
bool Unique(const std::vector<std::string>& ids) {
  if (ids.size() <= 16) {
    for (size_t j = 1; j < ids.size(); ++j) {
      if (std::find(ids.begin(), ids.begin() + j, ids[j]) != ids.begin() + j) return false;
    }
    return true;
  }
  absl::flat_hash_set<absl::string_view> seen(ids.begin(), ids.end());
  return seen.size() == ids.size();
}

}  // namespace

absl::StatusOr<TuningDb> TuningDb::FromProto(tuning::Database database) {
  Sanitize(&database);
  return Adopt(&database);
}

absl::StatusOr<TuningDb> TuningDb::Adopt(tuning::Database* parsed, std::unique_ptr<google::protobuf::Arena> arena) {
  tuning::Database& database = *parsed;
  // Fields this kreg does not know (a newer kreg's: it bumps schema_version
  // for any it needs kept) are dropped, so what it prints parses again.
  if (HasUnknownFields(database)) database.DiscardUnknownFields();
  if (database.schema_version() == 0) {
    return absl::DataLossError("no schema_version: not a kreg tuning database");
  }
  if (database.schema_version() > kSchemaVersion) {
    return absl::DataLossError(absl::StrCat("schema_version ", database.schema_version(),
                                            " is newer than this kreg reads (", kSchemaVersion,
                                            "); upgrade kreg"));
  }
  for (int i = 0; i < database.entries_size(); ++i) {
    if (database.entries(i).key().op().empty()) {
      return absl::DataLossError(absl::StrCat("entry ", i, " has no op"));
    }
  }
  if (absl::Status s = CheckNumbers(database); !s.ok()) return s;
  // On the parse's arena, keys and trials move into the table instead of
  // being copied (the emptied messages stay on the arena until it goes).
  TuningDb out = arena != nullptr ? TuningDb(std::move(arena)) : TuningDb();
  for (tuning::Machine& m : *database.mutable_machines()) out.AddMachine(std::move(m));
  for (const tuning::CommModel& m : database.comm_models()) out.SetCommModel(m);
  // The entries' ids (KeyId, and TrialIdOf of their trials and partial
  // ones), made on every core first, and whether each entry can be kept as
  // it is: ids unique, winners among its trials, fields a fresh entry takes.
  const int n = database.entries_size();
  std::vector<std::string> key_ids(n);
  std::vector<std::vector<std::string>> trial_ids(n), partial_ids(n);
  std::atomic<bool> as_is{true};
  tbb::parallel_for(tbb::blocked_range<int>(0, n, 128), [&](const tbb::blocked_range<int>& r) {
    for (int i = r.begin(); i < r.end(); ++i) {
      const tuning::Entry& e = database.entries(i);
      key_ids[i] = KeyId(e.key());
      for (const Trial& t : e.trials()) trial_ids[i].push_back(TrialIdOf(t));
      for (const Trial& t : e.partial()) partial_ids[i].push_back(TrialIdOf(t));
      if (!as_is.load(std::memory_order_relaxed)) continue;
      auto listed = [&](const Trial& winner) {
        for (int j = 0; j < e.trials_size(); ++j) {
          if (SameTrialId(e.trials(j), winner)) return true;
        }
        const std::string id = TrialIdOf(winner);
        return std::find(trial_ids[i].begin(), trial_ids[i].end(), id) != trial_ids[i].end();
      };
      if (e.tuned_at() < 0 || !Unique(trial_ids[i]) || !Unique(partial_ids[i]) ||
          (e.has_best() && !listed(e.best())) || (e.has_runner_up() && !listed(e.runner_up()))) {
        as_is.store(false, std::memory_order_relaxed);
      }
    }
  });
  // A table as Save writes it (every key once) is kept as it is: its
  // entries move over whole, and only the index is made.
  bool kept = as_is.load();
  if (kept) {
    out.entries_.reserve(n);
    for (int i = 0; i < n && kept; ++i) kept = out.entries_.try_emplace(std::move(key_ids[i]), i).second;
    if (!kept) {
      out.entries_.clear();
      for (std::string& id : key_ids) id.clear();  // the moved ones are made again below
    }
  }
  if (kept) {
    out.db_->mutable_entries()->Swap(database.mutable_entries());
    out.db_->set_entry_count(static_cast<uint64_t>(n));
    out.index_.resize(n);
    for (int i = 0; i < n; ++i) {
      for (std::string& id : trial_ids[i]) out.index_[i].trials.Add(std::move(id));
      for (std::string& id : partial_ids[i]) out.index_[i].partial.Add(std::move(id));
    }
  }
  // Else each entry is merged into the table as a record would be.
  std::vector<int> listed;  // where e's trials went in its entry
  for (int i = 0; i < n && !kept; ++i) {
    tuning::Entry& e = *database.mutable_entries(i);
    // Keys parsed or sanitized: valid UTF-8.
    const int index = out.FindOrAddEntry(e.key(), KeyStrings::kValidUtf8, e.mutable_key(), std::move(key_ids[i]));
    tuning::Entry* entry = out.db_->mutable_entries(index);
    // A slim file's only trials are its winners. Where the winners are
    // among the trials too, the trials are the truth: the winner fields
    // are copies (an edited trial beats a stale copy of itself). Winners
    // are set by the RecomputeWinners below.
    listed.clear();
    for (int j = 0; j < e.trials_size(); ++j) {
      Trial& t = *e.mutable_trials(j);
      listed.push_back(out.PutTrialWithId(index, t, std::move(trial_ids[i][j]), /*keep_newer=*/true, Ties::kIncoming,
                                          &t, /*sync=*/false));
    }
    for (const Trial& t : e.partial()) out.PutPartial(index, t);
    const EntryIndex& ids = out.index_[index];
    auto put_unlisted = [&](Trial* winner) {
      const tuning::Entry& mine = out.db_->entries(index);
      for (int at : listed) {
        if (SameTrialId(mine.trials(at), *winner)) return;  // without making the id
      }
      std::string id = TrialIdOf(*winner);
      if (std::any_of(listed.begin(), listed.end(), [&](int at) { return ids.trials[at] == id; })) return;
      out.PutTrialWithId(index, *winner, std::move(id), /*keep_newer=*/true, Ties::kIncoming, winner,
                         /*sync=*/false);
    };
    if (e.has_best()) put_unlisted(e.mutable_best());
    if (e.has_runner_up()) put_unlisted(e.mutable_runner_up());
    if (e.tuned_at() >= entry->tuned_at()) {
      entry->set_tool_version(e.tool_version());
      entry->set_strategy(e.strategy());
      entry->set_tuned_at(e.tuned_at());
      entry->set_incomplete(e.incomplete());
    }
  }
  // Each entry's winners on its own: they share nothing (the arena is safe to share).
  tbb::parallel_for(0, out.db_->entries_size(), [&](int i) { out.RecomputeWinners(i); });
  return out;
}

}  // namespace kreg
