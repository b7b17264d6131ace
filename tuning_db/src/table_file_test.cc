// Table files: schema round trips, refusal of corrupt, truncated and
// foreign files, atomic and merged saves (two processes, nothing lost).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "kreg/dispatch.h"
#include "kreg/problem.h"
#include "kreg/topk.h"
#include "lut_test_util.h"

namespace kreg {
namespace lut_test {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

// ---- Files -----------------------------------------------------------------------

TEST(Files, BinaryRoundTrip) {
  std::string dir = TempDir("binary");
  TuningDb db = SampleDb();
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/t.kdb");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(db, *back);
  EXPECT_EQ(back->size(), 3u);
  EXPECT_EQ(back->proto().machines_size(), 2);
  EXPECT_EQ(back->proto().schema_version(), kSchemaVersion);
  EXPECT_EQ(ReadBytes(dir + "/t.kdb").find("schema_version"), std::string::npos);  // binary
}

// One message of every type of the schema (the schema is a tree), those of
// type `unknown_in` with an unknown field; `types` gets every type's name.
void AddEveryMessage(google::protobuf::Message* m, const std::string& unknown_in, std::set<std::string>* types) {
  types->insert(m->GetDescriptor()->full_name());
  const google::protobuf::Reflection* r = m->GetReflection();
  if (m->GetDescriptor()->full_name() == unknown_in) r->MutableUnknownFields(m)->AddVarint(999, 1);
  for (int i = 0; i < m->GetDescriptor()->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = m->GetDescriptor()->field(i);
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    AddEveryMessage(f->is_repeated() ? r->AddMessage(m, f) : r->MutableMessage(m, f), unknown_in, types);
  }
}

// Types (full names) of the messages in `m` that hold unknown fields.
void TypesWithUnknownFields(const google::protobuf::Message& m, std::set<std::string>* out) {
  const google::protobuf::Reflection* r = m.GetReflection();
  if (!r->GetUnknownFields(m).empty()) out->insert(m.GetDescriptor()->full_name());
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (!f->is_repeated()) {
      TypesWithUnknownFields(r->GetMessage(m, f), out);
      continue;
    }
    for (int j = 0; j < r->FieldSize(m, f); ++j) TypesWithUnknownFields(r->GetRepeatedMessage(m, f, j), out);
  }
}

// Adopting a table looks for unknown fields before dropping them (the
// reflective drop costs): the look must reach every message type.
TEST(Files, UnknownFieldsAreDroppedFromEveryMessage) {
  std::set<std::string> types;
  tuning::Database structure;
  AddEveryMessage(&structure, "", &types);
  EXPECT_THAT(types, SizeIs(11));
  for (const std::string& type : types) {
    SCOPED_TRACE(type);
    tuning::Database db;
    std::set<std::string> ignored;
    AddEveryMessage(&db, type, &ignored);
    db.set_schema_version(1);  // a file without a checksum, for Parse
    db.set_entry_count(1);
    db.mutable_machines(0)->set_cores(2);
    db.mutable_comm_models(0)->set_ranks(2);
    tuning::Entry& e = *db.mutable_entries(0);
    e.mutable_key()->set_op("topk");
    for (tuning::Trial* t : {e.mutable_best(), e.mutable_runner_up(), e.mutable_trials(0), e.mutable_partial(0)}) {
      t->set_reps(1);
      t->mutable_config()->mutable_params(0)->mutable_list_value();  // the oneof's message
    }
    std::set<std::string> before;
    TypesWithUnknownFields(db, &before);
    EXPECT_THAT(before, ElementsAre(type));
    // Parsed from a file, and adopted as it is.
    for (absl::StatusOr<TuningDb> out : {TuningDb::Parse(db.SerializeAsString(), "t.kdb"), TuningDb::FromProto(db)}) {
      ASSERT_TRUE(out.ok()) << out.status();
      std::set<std::string> left;
      TypesWithUnknownFields(out->proto(), &left);
      EXPECT_THAT(left, IsEmpty());
    }
  }
}

TEST(Files, TextRoundTripAndFormatByContent) {
  std::string dir = TempDir("text");
  TuningDb db = SampleDb();
  for (std::string name : {"t.txtpb", "t.textproto", "t.pbtxt"}) {
    ASSERT_TRUE(db.Save(dir + "/" + name).ok()) << name;
    std::string text = ReadBytes(dir + "/" + name);
    EXPECT_THAT(text, HasSubstr("schema_version: 2")) << name;
    EXPECT_THAT(text, Not(HasSubstr("checksum"))) << name;  // text files carry none
    EXPECT_THAT(text, HasSubstr("choice: \"nth_element\"")) << name;
    absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/" + name);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(db, *back);
  }
  EXPECT_EQ(FormatForPath("a.txtpb"), FileFormat::kText);
  EXPECT_EQ(FormatForPath("a.kdb"), FileFormat::kBinary);
  // Either format loads under any name.
  WriteBytes(dir + "/text_named.kdb", db.ToText());
  ASSERT_TRUE(db.Save(dir + "/binary.kdb").ok());
  std::filesystem::rename(dir + "/binary.kdb", dir + "/binary_named.txtpb");
  for (std::string name : {"text_named.kdb", "binary_named.txtpb"}) {
    absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/" + name);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status();
    ExpectSame(db, *back);
  }
}

// A table written by hand: dims in another order, and the default attribute
// largest=1 spelled out.

TEST(Files, HandWrittenTextWithoutTrailerLoads) {
  std::string dir = TempDir("hand");
  WriteBytes(dir + "/t.txtpb", kHandWritten);
  absl::StatusOr<TuningDb> db = TuningDb::Load(dir + "/t.txtpb");
  ASSERT_TRUE(db.ok()) << db.status();
  // The key is kept as written (a TuningDb knows no ops); the slim entry's
  // winner becomes its one known trial.
  const tuning::Entry* e = db->FindEntry(MakeProblemKey(
      "topk", "f32", {{"k", 10}, {"n", 1000}, {"batch", 8}, {"largest", 1}}, kMachine));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(KeyString(e->key()),
            absl::StrCat("topk f32 k=10,n=1000,batch=8,largest=1 @", kMachine));
  EXPECT_EQ(e->trials_size(), 1);
  EXPECT_EQ(e->best().median_ns(), 7);
  // Dims in another order are the same key; without largest it is another
  // (the Lut, which knows the op, treats them as one: Query.HandWritten...).
  EXPECT_EQ(db->FindEntry(MakeProblemKey(
                "topk", "f32", {{"batch", 8}, {"largest", 1}, {"n", 1000}, {"k", 10}}, kMachine)),
            e);
  EXPECT_EQ(db->FindEntry(Key(8, 1000, 10)), nullptr);
}

TEST(Files, MissingFileIsNotFound) {
  absl::StatusOr<TuningDb> db = TuningDb::Load(TempDir("missing") + "/nope.kdb");
  EXPECT_EQ(db.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(db.status().message(), HasSubstr("nope.kdb"));
}

void ExpectDataLoss(const std::string& path, absl::string_view why = "") {
  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << path << ": " << db.status();
  EXPECT_THAT(db.status().message(), HasSubstr(path));
  EXPECT_THAT(db.status().message(), HasSubstr(why));
}

TEST(Files, CorruptAndForeignFilesAreDataLossNamingTheFile) {
  std::string dir = TempDir("corrupt");
  WriteBytes(dir + "/empty.kdb", "");
  ExpectDataLoss(dir + "/empty.kdb", "empty");
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::string junk(1 + rng() % 4096, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    WriteBytes(dir + "/random.kdb", junk);
    ExpectDataLoss(dir + "/random.kdb");
  }
  WriteBytes(dir + "/t.json", R"({"schema_version": 1, "entries": []})");
  ExpectDataLoss(dir + "/t.json");
  // A .npy file: magic, version, header length, header, data.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  header.resize(118, ' ');
  header += '\n';
  std::string npy = std::string("\x93NUMPY\x01\x00", 8) +
                    std::string(1, static_cast<char>(header.size())) + std::string(1, '\0') +
                    header + std::string(8, '\x3f');
  WriteBytes(dir + "/t.npy", npy);
  ExpectDataLoss(dir + "/t.npy");
  WriteBytes(dir + "/typo.txtpb", "schema_version: 1\nentries { varient: \"sort\" }\n");
  ExpectDataLoss(dir + "/typo.txtpb", "varient");
  WriteBytes(dir + "/newer.txtpb", "schema_version: 3\n");
  ExpectDataLoss(dir + "/newer.txtpb", "newer");
  WriteBytes(dir + "/none.txtpb", "entries { key { op: \"topk\" } }\n");
  ExpectDataLoss(dir + "/none.txtpb", "schema_version");
  WriteBytes(dir + "/count.txtpb", "schema_version: 1\nentry_count: 3\n");
  ExpectDataLoss(dir + "/count.txtpb", "entry_count");
}

TEST(Files, EveryTruncationOfABinaryFileIsRefused) {
  std::string dir = TempDir("truncated");
  ASSERT_TRUE(SampleDb().Save(dir + "/t.kdb").ok());
  const std::string whole = ReadBytes(dir + "/t.kdb");
  ASSERT_GT(whole.size(), 100u);
  for (size_t size = 0; size < whole.size(); ++size) {
    absl::StatusOr<TuningDb> db =
        TuningDb::Parse(absl::string_view(whole).substr(0, size), "cut.kdb");
    ASSERT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << "cut at " << size;
    ASSERT_THAT(db.status().message(), HasSubstr("cut.kdb"));
  }
  EXPECT_TRUE(TuningDb::Parse(whole, "whole.kdb").ok());
}

// Every single-bit flip anywhere in a binary table is an error (the
// checksum), never a table that loads with other content.
TEST(Files, EveryBitFlipOfABinaryFileIsRefused) {
  const std::string whole = SampleDb().ToBinary();
  for (size_t bit = 0; bit < whole.size() * 8; ++bit) {
    std::string flipped = whole;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    absl::StatusOr<TuningDb> db = TuningDb::Parse(flipped, "flipped.kdb");
    ASSERT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << "bit " << bit;
    ASSERT_THAT(db.status().message(), HasSubstr("flipped.kdb"));
  }
  absl::StatusOr<TuningDb> db = TuningDb::Parse(whole, "whole.kdb");
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(db->unchecked(), "");
}

// Binary files of schema 1 (before checksums) still load, saying so; saved
// again they get one.
TEST(Files, OlderBinaryFilesWithoutAChecksumLoadWithANote) {
  std::string dir = TempDir("old");
  tuning::Database old = SampleDb().proto();
  old.set_schema_version(1);
  WriteBytes(dir + "/old.kdb", old.SerializeAsString());
  absl::StatusOr<TuningDb> db = TuningDb::Load(dir + "/old.kdb");
  ASSERT_TRUE(db.ok()) << db.status();
  ExpectSame(SampleDb(), *db);
  EXPECT_THAT(db->unchecked(), HasSubstr("without a checksum"));
  ASSERT_TRUE(db->SaveMerged(dir + "/old.kdb").ok());
  absl::StatusOr<TuningDb> again = TuningDb::Load(dir + "/old.kdb");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->unchecked(), "");
  EXPECT_EQ(again->proto().schema_version(), kSchemaVersion);
  // A schema 2 file without its checksum is damaged, not old.
  tuning::Database stripped = SampleDb().proto();
  WriteBytes(dir + "/stripped.kdb", stripped.SerializeAsString());
  ExpectDataLoss(dir + "/stripped.kdb", "no checksum");
}

// A table reached through a symbolic link is locked and replaced where it
// lives: the link stays a link.
TEST(Files, SavesThroughALinkReplaceItsTarget) {
  std::string dir = TempDir("link");
  std::filesystem::create_directory(dir + "/real");
  ASSERT_TRUE(SampleDb().Save(dir + "/real/t.kdb").ok());
  std::filesystem::create_symlink("real/t.kdb", dir + "/link.kdb");
  std::filesystem::create_symlink(dir + "/link.kdb", dir + "/link2.kdb");  // a link to a link
  TuningDb more;
  more.AddTrial(Key(1, 10, 1), Sort("partial_sort", 5));
  ASSERT_TRUE(more.SaveMerged(dir + "/link2.kdb").ok());
  ASSERT_TRUE(more.Save(dir + "/link.kdb").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.kdb"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link2.kdb"));
  EXPECT_THAT(Listing(dir + "/real"), ElementsAre("t.kdb", "t.kdb.lock"));
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/real/t.kdb");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->FindEntry(Key(1, 10, 1)), nullptr);
  // A dangling link: the table is made where it points.
  std::filesystem::create_symlink("real/new.kdb", dir + "/dangling.kdb");
  ASSERT_TRUE(more.Save(dir + "/dangling.kdb").ok());
  EXPECT_TRUE(std::filesystem::is_regular_file(dir + "/real/new.kdb"));
  // A loop of links is an error.
  std::filesystem::create_symlink("loop_b", dir + "/loop_a");
  std::filesystem::create_symlink("loop_a", dir + "/loop_b");
  EXPECT_THAT(more.Save(dir + "/loop_a").message(), HasSubstr("symbolic links"));
}

// What is not a regular file is refused at once: reading a FIFO would wait
// for a writer forever.
TEST(Files, AFifoOrAFolderIsNotATable) {
  std::string dir = TempDir("fifo");
  ASSERT_EQ(mkfifo((dir + "/fifo.kdb").c_str(), 0600), 0);
  absl::StatusOr<TuningDb> db = TuningDb::Load(dir + "/fifo.kdb");
  EXPECT_THAT(db.status().message(), HasSubstr("fifo.kdb: not a regular file"));
  EXPECT_THAT(SampleDb().Save(dir + "/fifo.kdb").message(), HasSubstr("not a regular file"));
  EXPECT_THAT(SampleDb().SaveMerged(dir).message(), HasSubstr("not a regular file"));
}

// A table this user may not write is not replaced through a writable
// folder (here a world-writable one); one it may write keeps its owner,
// group and mode.
TEST(Files, ReadOnlyTablesAreNotReplaced) {
  std::string dir = TempDir("readonly");
  std::filesystem::permissions(dir, std::filesystem::perms(0777));
  ASSERT_TRUE(SampleDb().Save(dir + "/t.kdb").ok());
  std::filesystem::permissions(dir + "/t.kdb", std::filesystem::perms(0444));
  const std::string before = ReadBytes(dir + "/t.kdb");
  auto refused = [&] {
    absl::Status s = SampleDb().SaveMerged(dir + "/t.kdb");
    return s.code() == absl::StatusCode::kPermissionDenied && absl::StrContains(s.message(), "may not write");
  };
  if (geteuid() != 0) {
    EXPECT_TRUE(refused());
    EXPECT_EQ(ReadBytes(dir + "/t.kdb"), before);
  } else {
    // Root may write any file: the refusal is tried as user nobody (in a
    // child), on root's read-only table.
    const pid_t child = fork();
    if (child == 0) {
      _exit(setgid(65534) == 0 && setuid(65534) == 0 && refused() ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(ReadBytes(dir + "/t.kdb"), before);
    // What root replaces keeps its owner, group and mode.
    ASSERT_EQ(chown((dir + "/t.kdb").c_str(), 65534, 65534), 0);
    ASSERT_TRUE(SampleDb().Save(dir + "/t.kdb").ok());
    struct stat st;
    ASSERT_EQ(stat((dir + "/t.kdb").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 65534u);
    EXPECT_EQ(st.st_gid, 65534u);
    EXPECT_EQ(st.st_mode & 07777, 0444u);
  }
}

TEST(Files, SaveIsAtomicAndLeavesNoTemporaries) {
  std::string dir = TempDir("atomic");
  TuningDb db = SampleDb();
  // A temporary left by a writer killed mid-write is cleaned up.
  WriteBytes(dir + "/.t.kdb.tmp-ABCDEF", "half a file");
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  ASSERT_TRUE(db.SaveMerged(dir + "/t.kdb").ok());
  ASSERT_TRUE(db.Save(dir + "/t.kdb", {.winners_only = true}).ok());
  EXPECT_THAT(Listing(dir), ElementsAre("t.kdb", "t.kdb.lock"));
  // Keeps the mode of the file it replaces.
  std::filesystem::permissions(dir + "/t.kdb", std::filesystem::perms(0600));
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  EXPECT_EQ(std::filesystem::status(dir + "/t.kdb").permissions(), std::filesystem::perms(0600));
  // A folder that does not exist: an error, nothing written.
  absl::Status s = db.Save(dir + "/no/such/dir/t.kdb");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no/such/dir/t.kdb"));
}

TEST(Files, WinnersOnlySaveKeepsBestAndRunnerUp) {
  std::string dir = TempDir("slim");
  ASSERT_TRUE(SampleDb().Save(dir + "/t.kdb", {.winners_only = true}).ok());
  absl::StatusOr<TuningDb> db = TuningDb::Load(dir + "/t.kdb");
  ASSERT_TRUE(db.ok()) << db.status();
  const tuning::Entry* e = db->FindEntry(Key(8, 1000, 10));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->trials_size(), 2);  // best and runner-up
  EXPECT_EQ(ConfigText(e->best().config()), "method=nth_element");
  EXPECT_EQ(e->runner_up().variant(), "radix");
}

// Per variant and combination of named choices (a choice may need an ISA
// another machine lacks): sort's two methods both stay, radix's integer
// parameters keep only the fastest.
TEST(Files, BestPerVariantKeepsEachVariantsFastestTrialPerChoice) {
  TuningDb db;
  db.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 500));
  db.AddTrial(Key(8, 1000, 10), Sort("nth_element", 400));
  db.AddTrial(Key(8, 1000, 10), Radix(8, 300));
  db.AddTrial(Key(8, 1000, 10), Radix(11, 250));
  db.AddTrial(Key(8, 1000, 10), Radix(12, 260));
  std::string dir = TempDir("per_variant");
  ASSERT_TRUE(db.Save(dir + "/t.txtpb", {.best_per_variant = true}).ok());
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/t.txtpb");
  ASSERT_TRUE(back.ok()) << back.status();
  const tuning::Entry* e = back->FindEntry(Key(8, 1000, 10));
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->trials_size(), 3);  // fastest first
  EXPECT_EQ(e->trials(0).variant(), "radix");
  EXPECT_EQ(ConfigText(e->trials(0).config()), "first_bits=11 round_bits=8 capacity=4096");
  EXPECT_EQ(e->trials(1).variant(), "sort");
  EXPECT_EQ(ConfigText(e->trials(1).config()), "method=nth_element");
  EXPECT_EQ(ConfigText(e->trials(2).config()), "method=partial_sort");
  EXPECT_EQ(e->best().median_ns(), 250);
  EXPECT_EQ(e->runner_up().variant(), "sort");
}

TEST(Files, TextThatIsNotUtf8IsEscapedSoTheTableStaysReadable) {
  TuningDb db;
  const tuning::ProblemKey key =
      MakeProblemKey("topk", "f32", {{"batch", 1}, {"n", 10}, {"k", 1}}, kMachine, "class\xff\xfe");
  tuning::Trial failed = Sort("partial_sort", 0);
  failed.set_status(tuning::Trial::ERROR);
  failed.set_error(std::string("plugin said \xff\x80 and \xc3\xa9"));
  db.AddTrial(key, failed);
  db.AddTrial(key, Sort("nth_element", 5));
  std::string dir = TempDir("utf8");
  ASSERT_TRUE(db.Save(dir + "/t.kdb").ok());
  absl::StatusOr<TuningDb> back = TuningDb::Load(dir + "/t.kdb");
  ASSERT_TRUE(back.ok()) << back.status();
  // The raw key still finds its (escaped) entry.
  const tuning::Entry* e = back->FindEntry(key);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->key().data_class(), "class\\xff\\xfe");
  bool seen = false;
  for (const tuning::Trial& t : e->trials()) {
    if (t.status() == tuning::Trial::ERROR) {
      EXPECT_EQ(t.error(), "plugin said \\xff\\x80 and \xc3\xa9");  // valid UTF-8 kept
      seen = true;
    }
  }
  EXPECT_TRUE(seen);
}

TEST(Recording, IncompleteSweepsAreMarkedAndMergedWithTheirTime) {
  TuningDb a, b;
  a.AddTrial(Key(8, 1000, 10), Sort("nth_element", 5));
  a.SetTuningInfo(Key(8, 1000, 10), "kreg test", "halving", /*tuned_at=*/10, /*complete=*/false);
  EXPECT_TRUE(a.FindEntry(Key(8, 1000, 10))->incomplete());
  b.SetTuningInfo(Key(8, 1000, 10), "kreg test", "exhaustive", /*tuned_at=*/20, /*complete=*/true);
  a.MergeFrom(b);  // the later, complete sweep wins
  EXPECT_FALSE(a.FindEntry(Key(8, 1000, 10))->incomplete());
  b.SetTuningInfo(Key(8, 1000, 10), "kreg test", "halving", /*tuned_at=*/30, /*complete=*/false);
  a.MergeFrom(b);
  EXPECT_TRUE(a.FindEntry(Key(8, 1000, 10))->incomplete());
}

TEST(Files, SaveMergedOverACorruptFileFailsAndLeavesItIntact) {
  std::string dir = TempDir("merge_corrupt");
  const std::string path = dir + "/t.kdb";
  ASSERT_TRUE(SampleDb().Save(path).ok());
  std::string whole = ReadBytes(path);
  std::string cut = whole.substr(0, whole.size() / 2);
  WriteBytes(path, cut);
  TuningDb db;
  db.AddTrial(Key(1, 2, 1), Sort("nth_element", 1));
  absl::Status s = db.SaveMerged(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_EQ(ReadBytes(path), cut);
  EXPECT_EQ(db.size(), 1u);  // unchanged too
  EXPECT_THAT(Listing(dir), ElementsAre("t.kdb", "t.kdb.lock"));
}

TEST(Files, SaveMergedCreatesAndExtendsAFile) {
  std::string dir = TempDir("merge");
  const std::string path = dir + "/t.txtpb";
  TuningDb a;
  a.AddTrial(Key(8, 1000, 10), Sort("partial_sort", 10));
  ASSERT_TRUE(a.SaveMerged(path).ok());
  TuningDb b;
  b.AddTrial(Key(8, 1000, 10), Sort("nth_element", 5));
  b.AddTrial(Key(16, 1000, 10), Sort("nth_element", 5));
  ASSERT_TRUE(b.SaveMerged(path).ok());
  EXPECT_EQ(b.size(), 2u);  // b became the merged database
  absl::StatusOr<TuningDb> both = TuningDb::Load(path);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->size(), 2u);
  EXPECT_EQ(both->FindEntry(Key(8, 1000, 10))->trials_size(), 2);
  EXPECT_EQ(ConfigText(both->FindEntry(Key(8, 1000, 10))->best().config()), "method=nth_element");
}

// Two processes, each recording 200 trials one SaveMerged at a time into one
// file: the file ends up with all 400.
TEST(Files, ConcurrentWritersLoseNothing) {
  std::string dir = TempDir("concurrent");
  const std::string path = dir + "/t.kdb";
  constexpr int kTrials = 200;
  pid_t children[2];
  for (int c = 0; c < 2; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child c measures method c on problems n = 1000 + i.
      TuningDb db;
      const char* method = c == 0 ? "partial_sort" : "nth_element";
      for (int i = 0; i < kTrials; ++i) {
        db.AddTrial(Key(8, 1000 + i, 10), Sort(method, 100 + c + i));
        if (!db.SaveMerged(path).ok()) _exit(1);
      }
      _exit(0);
    }
    children[c] = pid;
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  ASSERT_TRUE(db.ok()) << db.status();
  int trials = 0;
  for (const tuning::Entry& e : db->proto().entries()) trials += e.trials_size();
  EXPECT_EQ(db->size(), static_cast<size_t>(kTrials));
  EXPECT_EQ(trials, 2 * kTrials);
  for (int i = 0; i < kTrials; ++i) {
    const tuning::Entry* e = db->FindEntry(Key(8, 1000 + i, 10));
    ASSERT_NE(e, nullptr) << i;
    EXPECT_EQ(ConfigText(e->best().config()), "method=partial_sort") << i;
    EXPECT_EQ(ConfigText(e->runner_up().config()), "method=nth_element") << i;
  }
  EXPECT_THAT(Listing(dir), ElementsAre("t.kdb", "t.kdb.lock"));
}

}  // namespace
}  // namespace lut_test
}  // namespace kreg
