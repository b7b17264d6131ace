// TuningDb: recording measurements (each entry's trials, partial
// measurements and winners) and combining tables. Files are
// table_file.cc, keys key.cc, printing export.cc; the run-time lookup is
// the Lut (lut.cc).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kreg/lut.h"
#include "kreg/text.h"
#include "tuning_db_internal.h"

namespace kreg {

using tuning::Trial;
using tuning_db_internal::Eligible;
using tuning_db_internal::Faster;
using tuning_db_internal::KeyId;
using tuning_db_internal::Sanitize;
using tuning_db_internal::TrialId;
using tuning_db_internal::TrialIdOf;

namespace tuning_db_internal {

bool Eligible(const Trial& t) { return t.status() == Trial::OK && std::isfinite(t.median_ns()); }

// Whether `a` ranks before `b` as a winner (both eligible).
bool Faster(const Trial& a, absl::string_view a_id, const Trial& b, absl::string_view b_id) {
  if (a.median_ns() != b.median_ns()) return a.median_ns() < b.median_ns();
  return a_id < b_id;
}

bool Faster(const Trial& a, const Trial& b) {
  return a.median_ns() != b.median_ns() ? Faster(a, {}, b, {}) : Faster(a, TrialIdOf(a), b, TrialIdOf(b));
}

}  // namespace tuning_db_internal

// ---- Recording -------------------------------------------------------------------

void TuningDb::AddMachine(tuning::Machine machine) {
  Sanitize(&machine);
  if (machine.id().empty()) machine.set_id(FingerprintId(machine));
  for (tuning::Machine& m : *db_->mutable_machines()) {
    if (m.id() == machine.id()) {
      m = std::move(machine);
      return;
    }
  }
  *db_->add_machines() = std::move(machine);
}

int TuningDb::FindOrAddEntry(const tuning::ProblemKey& key, KeyStrings strings, tuning::ProblemKey* take,
                             std::string id) {
  auto [it, added] = entries_.try_emplace(id.empty() ? KeyId(key) : std::move(id), db_->entries_size());
  if (added) {
    tuning::ProblemKey* stored = db_->add_entries()->mutable_key();
    if (take != nullptr && take->GetArena() == stored->GetArena()) {
      stored->Swap(take);
    } else {
      *stored = key;
    }
    if (strings == KeyStrings::kUnchecked) Sanitize(stored);
    index_.emplace_back();
    db_->set_entry_count(static_cast<uint64_t>(db_->entries_size()));
  }
  return it->second;
}

int TuningDb::FindEntryIndex(const tuning::ProblemKey& key) const {
  auto it = entries_.find(KeyId(key));
  return it == entries_.end() ? -1 : it->second;
}

void TuningDb::AddTrial(const tuning::ProblemKey& key, const Trial& raw) {
  Trial trial = raw;
  Sanitize(&trial);
  PutTrial(FindOrAddEntry(key), trial, /*keep_newer=*/false);
}

void TuningDb::SetTuningInfo(const tuning::ProblemKey& key, absl::string_view tool_version,
                             absl::string_view strategy, int64_t tuned_at, bool complete) {
  tuning::Entry* e = db_->mutable_entries(FindOrAddEntry(key));
  e->set_tool_version(ValidUtf8(tool_version));
  e->set_strategy(ValidUtf8(strategy));
  e->set_tuned_at(tuned_at);
  e->set_incomplete(!complete);
}

void TuningDb::AddPartial(const tuning::ProblemKey& key, const Trial& trial) {
  PutPartial(FindOrAddEntry(key), trial);
}

int TuningDb::Ids::Find(absl::string_view id) const {
  if (ids_.size() > kScanned) {
    auto it = map_.find(id);
    return it == map_.end() ? -1 : it->second;
  }
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (ids_[i] == id) return static_cast<int>(i);
  }
  return -1;
}

void TuningDb::Ids::Add(std::string id) {
  ids_.push_back(std::move(id));
  if (ids_.size() == kScanned + 1) {
    for (size_t i = 0; i < ids_.size(); ++i) map_.emplace(ids_[i], static_cast<int>(i));
  } else if (ids_.size() > kScanned) {
    map_.emplace(ids_.back(), static_cast<int>(ids_.size()) - 1);
  }
}

void TuningDb::PutPartial(int entry, const Trial& trial) {
  tuning::Entry& e = *db_->mutable_entries(entry);
  Ids& ids = index_[entry].partial;
  std::string id = TrialIdOf(trial);
  const int i = ids.Find(id);
  if (i < 0) {
    ids.Add(std::move(id));
    *e.add_partial() = trial;
    return;
  }
  // The one of more runs; between as many, the newer, and at the same
  // second a result over the mark of one in flight.
  const Trial& old = e.partial(i);
  const auto rank = [](const Trial& t) { return std::make_tuple(t.reps(), t.measured_at(), t.status() == Trial::OK); };
  if (rank(trial) >= rank(old)) *e.mutable_partial(i) = trial;
}

void TuningDb::PutTrial(int entry, const Trial& trial, bool keep_newer, Ties ties) {
  PutTrialWithId(entry, trial, TrialIdOf(trial), keep_newer, ties, nullptr, /*sync=*/true);
}

int TuningDb::PutTrialWithId(int entry, const Trial& trial, std::string id, bool keep_newer, Ties ties,
                             Trial* take, bool sync) {
  tuning::Entry& e = *db_->mutable_entries(entry);
  EntryIndex& index = index_[entry];
  const int found = index.trials.Find(id);
  const bool added = found < 0;
  const int i = added ? e.trials_size() : found;
  // The trial, copied or moved (`take` is `trial`).
  auto store = [&](Trial* to) {
    if (take != nullptr && take->GetArena() == to->GetArena()) {
      to->Swap(take);
    } else {
      *to = trial;
    }
  };
  if (added) {
    store(e.add_trials());
    index.trials.Add(std::move(id));
  } else {
    if (keep_newer && e.trials(i).measured_at() > trial.measured_at()) return i;
    // Two measurements of one candidate at the same second, canonically:
    // the same one whichever came first.
    if (keep_newer && ties == Ties::kCanonical && e.trials(i).measured_at() == trial.measured_at() &&
        trial.SerializeAsString() >= e.trials(i).SerializeAsString()) {
      return i;
    }
    store(e.mutable_trials(i));
    if (i == index.best || i == index.runner_up) {
      RecomputeWinners(entry);  // the replaced trial held a place
      return i;
    }
  }
  // Only the new trial can move: slot it in if it beats a winner.
  const Trial& stored = e.trials(i);  // `trial` may have been moved from
  if (!Eligible(stored)) return i;
  const std::string& tid = index.trials[i];
  auto beats = [&](int other) {
    return other < 0 || Faster(stored, tid, e.trials(other), index.trials[other]);
  };
  if (beats(index.best)) {
    index.runner_up = index.best;
    index.best = i;
  } else if (beats(index.runner_up)) {
    index.runner_up = i;
  } else {
    return i;
  }
  if (sync) SyncWinners(entry);
  return i;
}

void TuningDb::RecomputeWinners(int entry) {
  const tuning::Entry& e = db_->entries(entry);
  EntryIndex& index = index_[entry];
  index.best = index.runner_up = -1;
  for (int i = 0; i < e.trials_size(); ++i) {
    const Trial& t = e.trials(i);
    if (!Eligible(t)) continue;
    auto beats = [&](int other) {
      return other < 0 || Faster(t, index.trials[i], e.trials(other), index.trials[other]);
    };
    if (beats(index.best)) {
      index.runner_up = index.best;
      index.best = i;
    } else if (beats(index.runner_up)) {
      index.runner_up = i;
    }
  }
  SyncWinners(entry);
}

void TuningDb::SyncWinners(int entry) {
  tuning::Entry& e = *db_->mutable_entries(entry);
  const EntryIndex& index = index_[entry];
  if (index.best >= 0) {
    *e.mutable_best() = e.trials(index.best);
  } else {
    e.clear_best();
  }
  if (index.runner_up >= 0) {
    *e.mutable_runner_up() = e.trials(index.runner_up);
  } else {
    e.clear_runner_up();
  }
}

void TuningDb::Reindex() {
  entries_.clear();
  index_.assign(db_->entries_size(), EntryIndex());
  for (int i = 0; i < db_->entries_size(); ++i) {
    const tuning::Entry& e = db_->entries(i);
    entries_.emplace(KeyId(e.key()), i);
    // A table's trials and partial measurements are unique by id.
    for (const Trial& t : e.trials()) index_[i].trials.Add(TrialIdOf(t));
    for (const Trial& t : e.partial()) index_[i].partial.Add(TrialIdOf(t));
    RecomputeWinners(i);
  }
  db_->set_entry_count(static_cast<uint64_t>(db_->entries_size()));
}

const tuning::Entry* TuningDb::FindEntry(const tuning::ProblemKey& key) const {
  int i = FindEntryIndex(key);
  return i < 0 ? nullptr : &db_->entries(i);
}

const Trial* TuningDb::FindTrial(const tuning::ProblemKey& key, absl::string_view variant,
                                 uint32_t variant_version, const tuning::Config& config, int threads) const {
  int i = FindEntryIndex(key);
  if (i < 0) return nullptr;
  const EntryIndex& index = index_[i];
  const int at = index.trials.Find(TrialId(variant, variant_version, config, threads));
  return at < 0 ? nullptr : &db_->entries(i).trials(at);
}

const Trial* TuningDb::FindPartial(const tuning::ProblemKey& key, absl::string_view variant,
                                   uint32_t variant_version, const tuning::Config& config, int threads) const {
  const int i = FindEntryIndex(key);
  if (i < 0) return nullptr;
  const EntryIndex& index = index_[i];
  const int at = index.partial.Find(TrialId(variant, variant_version, config, threads));
  return at < 0 ? nullptr : &db_->entries(i).partial(at);
}

int TuningDb::DropStale(const Registry& registry) {
  int dropped = 0, stale_partial = 0;
  for (tuning::Entry& e : *db_->mutable_entries()) {
    auto stale = [&](const Trial& t) {
      absl::StatusOr<std::shared_ptr<const Kernel>> k =
          registry.Get(absl::StrCat(e.key().op(), "/", t.variant()));
      return k.ok() && (*k)->version() != t.variant_version();
    };
    // Removes the stale ones of `list`; returns how many.
    auto drop = [&](google::protobuf::RepeatedPtrField<Trial>* list) {
      auto keep = std::stable_partition(list->begin(), list->end(), [&](const Trial& t) { return !stale(t); });
      const int n = static_cast<int>(list->end() - keep);
      list->DeleteSubrange(static_cast<int>(keep - list->begin()), n);
      return n;
    };
    dropped += drop(e.mutable_trials());
    stale_partial += drop(e.mutable_partial());
  }
  if (dropped > 0 || stale_partial > 0) Reindex();
  return dropped;
}

// ---- Combining ---------------------------------------------------------------------

void TuningDb::SetCommModel(const tuning::CommModel& model) {
  for (tuning::CommModel& m : *db_->mutable_comm_models()) {
    if (m.machine_id() == model.machine_id() && m.backend() == model.backend()) {
      if (model.measured_at() >= m.measured_at()) m = model;
      return;
    }
  }
  *db_->add_comm_models() = model;
}

const tuning::CommModel* TuningDb::FindCommModel(absl::string_view machine_id, absl::string_view backend) const {
  for (const tuning::CommModel& m : db_->comm_models()) {
    if (m.machine_id() == machine_id && m.backend() == backend) return &m;
  }
  return nullptr;
}

void TuningDb::MergeFrom(const TuningDb& other, Ties ties) {
  for (const tuning::Machine& m : other.db_->machines()) AddMachine(m);
  for (const tuning::CommModel& m : other.db_->comm_models()) SetCommModel(m);
  for (const tuning::Entry& theirs : other.db_->entries()) {
    const int index = FindOrAddEntry(theirs.key());
    tuning::Entry* mine = db_->mutable_entries(index);
    for (const Trial& t : theirs.trials()) PutTrial(index, t, /*keep_newer=*/true, ties);
    for (const Trial& t : theirs.partial()) PutPartial(index, t);
    const auto sweep = [](const tuning::Entry& e) {
      return std::make_tuple(e.tool_version(), e.strategy(), e.incomplete());
    };
    const bool tie_to_theirs = ties == Ties::kIncoming || sweep(theirs) < sweep(*mine);
    if (theirs.tuned_at() > mine->tuned_at() || (theirs.tuned_at() == mine->tuned_at() && tie_to_theirs)) {
      mine->set_tool_version(theirs.tool_version());
      mine->set_strategy(theirs.strategy());
      mine->set_tuned_at(theirs.tuned_at());
      mine->set_incomplete(theirs.incomplete());
    }
  }
}

TuningDb TuningDb::Merge(const TuningDb& a, const TuningDb& b) {
  TuningDb out = a;
  out.MergeFrom(b);
  return out;
}

}  // namespace kreg
