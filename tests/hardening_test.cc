// Bad input as a user meets it on the command line: each case ends in one
// clear line (exit 2 for bad input) and changes no file. One test per defect
// of the hardening issue; the unit tests of each part (npy_test, lut_test,
// loader_test, tune_test) go into the details.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/npy.h"
#include "tests/run_kreg.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kFaulty = std::string(KREG_PLUGIN_DIR) + ":" + KREG_TEST_PLUGIN_DIR + "/faulty";

Result Kreg(const std::string& args) { return RunKreg(KREG_PLUGIN_DIR, args); }

std::string Dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/kreg_hardening_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// One line on stderr, with the expected code.
void ExpectError(const Result& r, int code, const std::string& what) {
  EXPECT_EQ(r.code, code) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr(what)) << r.out;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
}

// A small table made by a real sweep.
std::string Table(const std::string& dir, const std::string& name) {
  const std::string db = dir + "/" + name;
  Result r = Kreg("tune topk --dims batch=2,n=300,k=4 --variants sort --strategy exhaustive --reps 2 --db " + db);
  EXPECT_EQ(r.code, 0) << r.out;
  return db;
}

// 1: a kernel asking for nearly SIZE_MAX bytes of workspace gets the
// allocation error, not a wrapped-around size.
TEST(Hardening, AHugeWorkspaceRequestIsAnError) {
  Result r = RunKreg(kFaulty, "run topk/faulty --dims batch=2,n=100,k=3 --param mode=greedy");
  ExpectError(r, 1, "topk/faulty: cannot allocate 18446744073709551605 bytes of workspace");
}

// 2: a damaged binary table is refused by every command, named as damaged
// (whether or not the damage also breaks the parse), and left as it is.
TEST(Hardening, ADamagedBinaryTableIsRefusedAndLeftAlone) {
  const std::string dir = Dir("damaged");
  const std::string db = Table(dir, "t.lut");
  const std::string good = Bytes(db);
  for (size_t at : {size_t{0}, size_t{1}, good.size() / 3, good.size() / 2, good.size() - 12}) {
    std::string bytes = good;
    bytes[at] ^= 0x10;
    Write(db, bytes);
    for (const std::string& command :
         {"query topk --dims batch=2,n=300,k=4 --db " + db, "run topk --dims batch=2,n=300,k=4 --db " + db,
          "tune topk --dims batch=2,n=300,k=4 --variants sort --reps 2 --db " + db, "db show " + db}) {
      Result r = Kreg(command);
      ExpectError(r, 2, db + ": not a kreg tuning database");
      EXPECT_THAT(r.stderr_text, HasSubstr("checksum")) << command << " (byte " << at << " changed)";
      EXPECT_EQ(Bytes(db), bytes) << command;
    }
  }
}

// 3, 4: a .npy header is read as the dict it is, and what it holds is
// quoted escaped, on one line.
TEST(Hardening, NpyHeadersAreParsedStrictlyAndQuotedSafely) {
  const std::string dir = Dir("npy");
  ASSERT_TRUE(WriteNpy(dir + "/good.npy", Tensor(DType::kF32, {3, 4})).ok());
  const std::string good = Bytes(dir + "/good.npy");
  auto with_header = [&](const std::string& name, std::string header) {
    header.resize(117, ' ');
    header += '\n';  // 10 + 118 bytes: the data starts where WriteNpy's does
    Write(dir + "/" + name, std::string("\x93NUMPY\x01\x00\x76\x00", 10) + header + good.substr(128));
    return dir + "/" + name;
  };
  const std::string hidden =
      with_header("hidden.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'x': \"'shape': (1, 1)\"}");
  ExpectError(Kreg("run topk/sort --input input=" + hidden + " --dims k=2"), 2, "unknown key");
  const std::string escape = with_header("escape.npy", "{'descr': '\x1b[31mRED\x01', 'fortran_order': False, "
                                                       "'shape': (3, 4)}");
  Result r = Kreg("run topk/sort --input input=" + escape + " --dims k=2");
  ExpectError(r, 2, "\\x1b[31mRED\\x01");
  EXPECT_THAT(r.stderr_text, Not(HasSubstr("\x1b")));
  const std::string i2 = with_header("i2.npy", "{'descr': '<i2', 'fortran_order': False, 'shape': (3, 8), }");
  ExpectError(Kreg("run topk/sort --input input=" + i2 + " --dims k=2"), 2, "bfloat16 data must be '<u2'");
}

// 5: sizes are checked before anything is allocated, at once.
TEST(Hardening, OversizedProblemsAreRefusedBeforeAllocating) {
  const auto start = std::chrono::steady_clock::now();
  ExpectError(Kreg("run topk/sort --dims batch=1,n=2147483648,k=10 --dtype bf16"), 2,
              "topk: dimension n=2147483648 exceeds its limit 2147483647");
  ExpectError(Kreg("run topk/sort --dims batch=1,n=99999999999,k=10"), 2, "exceeds its limit");
  ExpectError(Kreg("run topk/sort --dims batch=2000000,n=2000000000,k=10"), 2,
              "topk: the problem takes 14901161.4 GiB (its tensors, and what its kernels keep per group or row), "
              "more than this machine's");
  const std::string dir = Dir("oversized");
  ExpectError(Kreg("tune topk --dims batch=2000000,n=2000000000,k=10 --db " + dir + "/t.lut"), 2,
              "more than this machine's");
  // 7 (second round): what kernels keep per group counts too: two billion
  // empty groups of a 1x1x1 product were ~47 GB of per-group state.
  for (const char* kernel : {"gmm/tiled", "tgmm/tiled", "gmm/onednn"}) {
    ExpectError(Kreg(std::string("run ") + kernel + " --dims m=1,k=1,n=1,groups=2147483647"), 2,
                "the problem takes 528.0 GiB (its tensors, and what its kernels keep per group or row), more than "
                "this machine's");
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/t.lut"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// 6: --threads is bounded.
TEST(Hardening, ThreadCountsAreValidated) {
  ExpectError(Kreg("run topk/sort --dims batch=2,n=100,k=3 --threads 100000"), 2,
              "--threads: expected 0 (all cores) to 1024, got 100000");
  ExpectError(Kreg("run topk/sort --dims batch=2,n=100,k=3 --threads -1"), 2, "--threads: expected 0 (all cores) to 1024, got -1");
  ExpectError(Kreg("tune topk --dims batch=2,n=100,k=3 --threads 5000 --db /nonexistent/t.lut"), 2,
              "--threads: expected 0 (all cores) to 1024, got 5000");
}

// 7: a table behind a symbolic link is updated where it lives, and what is
// not a regular file is refused rather than read (a FIFO would block).
TEST(Hardening, LinksAreFollowedAndFifosRefused) {
  const std::string dir = Dir("links");
  std::filesystem::create_directory(dir + "/real");
  const std::string db = Table(dir + "/real", "t.lut");
  std::filesystem::create_symlink("real/t.lut", dir + "/link.lut");
  Result r = Kreg("tune topk --dims batch=2,n=300,k=5 --variants sort --strategy exhaustive --reps 2 --db " + dir +
                  "/link.lut");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.lut"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/link.lut.lock"));
  EXPECT_THAT(Kreg("db show " + db).out, HasSubstr("k=5"));
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  ExpectError(Kreg("query topk --dims batch=2,n=300,k=4 --db " + dir + "/fifo"), 2, "fifo: not a regular file");
  ExpectError(Kreg("run topk/sort --input input=" + dir + "/fifo --dims k=2"), 2, "fifo: not a regular file");
  ExpectError(Kreg("tune topk --dims batch=2,n=300,k=4 --db " + dir + "/fifo"), 2, "fifo: not a regular file");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// 8: a third party's topk/sort earlier on the plugin path shadows the
// built-in one alone; the built-in plugin's other kernels stay.
TEST(Hardening, ADuplicateKernelShadowsOnlyThatKernel) {
  const std::string plugins = std::string(KREG_TEST_PLUGIN_DIR) + "/shadow:" + KREG_PLUGIN_DIR;
  Result r = RunKreg(plugins, "list");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("kernel topk/sort skipped: " + std::string(KREG_TEST_PLUGIN_DIR) +
                                       "/shadow/test_shadow.so, earlier on the plugin path, registers it"));
  for (const char* kernel : {"topk/heap", "topk/radix", "topk/blockwise", "topk/sort"}) {
    EXPECT_THAT(r.stdout_text, HasSubstr(kernel));
  }
  // topk/sort is the third party's: it takes its `mode`.
  r = RunKreg(plugins, "run topk/sort --dims batch=2,n=100,k=3 --param mode=wrong --check");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("check FAILED"));
  r = RunKreg(plugins, "run topk/heap --dims batch=2,n=100,k=3 --check");
  EXPECT_EQ(r.code, 0) << r.out;
}

// 9: contradictions are errors, not "the last one wins".
TEST(Hardening, ContradictoryFlagsAreRefused) {
  const std::string dir = Dir("contradictions");
  ASSERT_TRUE(WriteNpy(dir + "/bf16.npy", Tensor(DType::kBF16, {3, 8})).ok());
  ExpectError(Kreg("run topk/blockwise --dims batch=4,n=1000,k=10 --param num_blocks=8 --param num_blocks=16"), 2,
              "--param num_blocks=... is given twice");
  ExpectError(Kreg("run topk/sort --input input=" + dir + "/bf16.npy --input input=" + dir + "/bf16.npy --dims k=2"),
              2, "--input input=... is given twice");
  ExpectError(Kreg("run topk/sort --input input=" + dir + "/bf16.npy --dtype f32 --dims k=2"), 2,
              "--dtype f32 contradicts input 'input', whose file holds bf16");
  ExpectError(Kreg("tune topk --dims batch=4,n=100,k=3 --budget -1 --db " + dir + "/t.lut"), 2,
              "--budget: expected 0 to 604800 seconds (a week), got");
  for (const char* list : {"m_schedule=", "m_schedule=,", "m_schedule=5,,8", "m_schedule=5,8,"}) {
    Result r = Kreg(std::string("run topk/blockwise --dims batch=4,n=1000,k=10 --param ") + list);
    EXPECT_EQ(r.code, 2) << list << ": " << r.out;
  }
  // A sweep in which no candidate succeeded (every mode crashes) is a
  // failure, though every failure is recorded.
  Result r = RunKreg(kFaulty, "tune topk --dims batch=4,n=1000,k=10 --variants faulty --strategy exhaustive "
                              "--reps 3 --timeout 5 --db " + dir + "/t.lut", "KREG_FAULTY_ALL_CRASH=1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("kreg tune: no candidate succeeded for topk f32 batch=4,n=1000,k=10"));
}

// What the fuzzers found, through the command line: a shape whose element
// count overflows 64 bits, a mesh axis of size 0 given by name, a text table
// with invalid UTF-8 saved as binary, and fields this kreg does not know
// printed as text.
TEST(Hardening, FuzzerFindingsStayFixed) {
  const std::string dir = Dir("fuzzed");
  const std::string db = Table(dir, "t.lut");
  Result r = Kreg("query gmm --db " + db + " --dims m=2147483647,k=2147483647,n=2147483647,groups=2147483647");
  EXPECT_THAT(r.out, Not(HasSubstr("runtime error"))) << r.out;
  EXPECT_THAT(r.out, HasSubstr("more elements than a 64-bit count holds")) << r.out;
  ExpectError(Kreg("run sharded_matmul/plain --dims m=64,k=96,n=40 --mesh x=0"), 2,
              "mesh 'x=0': axis size '0' is not in [1, 65536]");
  std::string text = Kreg("db export " + db).stdout_text;
  const size_t at = text.find("variant: \"sort\"");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 16, "variant: \"s\\377rt\"");  // an escaped byte that is not UTF-8
  Write(dir + "/bad_utf8.txtpb", text);
  r = Kreg("db merge " + dir + "/out.lut " + dir + "/bad_utf8.txtpb");
  ASSERT_EQ(r.code, 0) << r.out;
  r = Kreg("db show " + dir + "/out.lut");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("s\\xffrt"));
}

// 10: in a world-writable folder, a table this user may not write is not
// replaced through a rename (as root: the command runs as user nobody on
// root's read-only table; as another user: on its own read-only one).
TEST(Hardening, AReadOnlyTableIsNotReplaced) {
  const std::string dir = Dir("readonly");
  std::filesystem::permissions(dir, std::filesystem::perms(0777));
  const std::string db = Table(dir, "t.lut");
  std::filesystem::permissions(db, std::filesystem::perms(0444));
  const std::string before = Bytes(db);
  const std::string as = geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "";
  Result r = RunCommand(as, KREG_BIN, std::string("--plugin_path=") + KREG_PLUGIN_DIR +
                                          " tune topk --dims batch=2,n=300,k=6 --variants sort --reps 2 --db " + db);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr(db + ": this user may not write it; not replaced")) << r.out;
  EXPECT_EQ(Bytes(db), before);
  struct stat st;
  ASSERT_EQ(stat(db.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, geteuid());
}

// ---- Second round (issue 27) ---------------------------------------------------

// 0: a user's own table is not outvoted by the shipped ones. Shipped here:
// a table (in a folder KREG_TABLE_PATH names) with topk/heap exact on this
// machine for two shapes; the user's: topk/sort tuned for one of them.
TEST(Hardening, AUsersTableAnswersBeforeTheShippedOnes) {
  const std::string dir = Dir("layers");
  std::filesystem::create_directories(dir + "/shipped");
  const std::string a = "batch=2,n=300,k=4", b = "batch=64,n=4096,k=16";
  const std::string shipped = "KREG_TABLE_PATH=" + dir + "/shipped";
  ASSERT_EQ(Kreg("tune topk --dims " + a + " --dims " + b + " --variants heap --reps 2 --db " + dir +
                 "/shipped/class.txtpb").code,
            0);
  ASSERT_EQ(Kreg("tune topk --dims " + a + " --variants sort --reps 2 --db " + dir + "/mine.lut").code, 0);
  const std::string mine = " --db " + dir + "/mine.lut";
  // The user's exact answer, from a sweep of one variant, beats the
  // shipped exact one; and says which table answered.
  Result r = RunKreg(KREG_PLUGIN_DIR, "query topk --dims " + a + mine, shipped);
  EXPECT_THAT(r.stdout_text, HasSubstr("-> topk/sort")) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("exact from " + a)) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr(", in " + dir + "/mine.lut]")) << r.out;
  r = RunKreg(KREG_PLUGIN_DIR, "run topk --reps 2 --dims " + a + mine, shipped);
  EXPECT_THAT(r.stdout_text, HasSubstr("topk/sort")) << r.out;
  // An exact shipped answer beats the user's nearest.
  r = RunKreg(KREG_PLUGIN_DIR, "query topk --dims " + b + mine, shipped);
  EXPECT_THAT(r.stdout_text, HasSubstr("-> topk/heap")) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("exact from " + b)) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr(", in the shipped tables]")) << r.out;
  r = RunKreg(KREG_PLUGIN_DIR, "--json query topk --dims " + b + mine, shipped);
  EXPECT_THAT(r.stdout_text, HasSubstr("\"table\":\"the shipped tables\"")) << r.out;
  // Without the shipped tables, the user's nearest.
  r = RunKreg(KREG_PLUGIN_DIR, "query topk --no-shipped --dims " + b + mine, shipped);
  EXPECT_THAT(r.stdout_text, HasSubstr("-> topk/sort")) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("nearest from " + a)) << r.out;
}

// 1: `kreg db plot` runs kreg's own plotter: a kreg/plot.py, numpy.py or
// matplotlib.py in the current folder or on PYTHONPATH never runs.
TEST(Hardening, PlotImportsNothingFromTheCurrentFolder) {
  const std::string dir = Dir("plant");
  const std::string db = Table(dir, "t.lut");
  std::filesystem::create_directories(dir + "/kreg");
  Write(dir + "/kreg/__init__.py", "");
  for (const std::string module : {"kreg/plot", "numpy", "matplotlib"}) {
    Write(dir + "/" + module + ".py", "open('" + dir + "/ran', 'a').write('" + module + "\\n')\n");
  }
  Result r = RunCommand("cd " + dir + " && PYTHONPATH=" + dir, KREG_BIN,
                        std::string("--plugin_path=") + KREG_PLUGIN_DIR + " db plot t.lut --out pictures");
  if (r.code != 0 && (r.stderr_text.find("matplotlib") != std::string::npos ||
                      r.stderr_text.find("cannot import kreg") != std::string::npos)) {
    GTEST_SKIP() << r.out;
  }
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/ran")) << Bytes(dir + "/ran");
  EXPECT_TRUE(std::filesystem::exists(dir + "/pictures/winners_topk_f32.png")) << r.out;
}

// 2: in a sticky world-writable folder, a link planted by another user is
// not followed (Linux's protected_symlinks, applied by kreg itself): neither
// the table nor its lock is created where it points. Your own link to your
// own table still works and stays a link.
TEST(Hardening, APlantedLinkInASharedFolderIsNotFollowed) {
  const std::string shared = Dir("shared");
  std::filesystem::permissions(shared, std::filesystem::perms(01777));
  const std::string home = Dir("home");
  const std::string tune = "tune topk --dims batch=2,n=300,k=4 --variants sort --reps 2 --db ";
  // Your own link: written through, kept a link.
  std::filesystem::create_symlink(home + "/mine.lut", shared + "/mine.lut");
  Result r = Kreg(tune + shared + "/mine.lut");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::is_symlink(shared + "/mine.lut"));
  EXPECT_TRUE(std::filesystem::exists(home + "/mine.lut"));
  if (geteuid() != 0) GTEST_SKIP() << "planting another user's link needs root";
  // Links made by user nobody: to the table, and to where a lock would go.
  Result planted = RunCommand("setpriv --reuid=65534 --regid=65534 --clear-groups", "ln",
                              "-s " + home + "/t.lut " + shared + "/t.lut && setpriv --reuid=65534 --regid=65534 "
                              "--clear-groups ln -s " + home + "/lock " + shared + "/u.lut.lock");
  ASSERT_EQ(planted.code, 0) << planted.out;
  for (const std::string& command : {tune + shared + "/t.lut", "query topk --dims batch=2,n=300,k=4 --db " + shared +
                                                                    "/t.lut"}) {
    r = Kreg(command);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_THAT(r.stderr_text, HasSubstr(shared + "/t.lut: a symbolic link of user 65534 in the shared folder"));
    EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  }
  EXPECT_FALSE(std::filesystem::exists(home + "/t.lut"));
  EXPECT_FALSE(std::filesystem::exists(home + "/t.lut.lock"));
  r = Kreg(tune + shared + "/u.lut");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr(shared + "/u.lut.lock: the lock file is a symbolic link: not followed"));
  EXPECT_FALSE(std::filesystem::exists(home + "/lock"));
  EXPECT_FALSE(std::filesystem::exists(shared + "/u.lut"));
}

// 3: a table's numbers are input: a thread count oneTBB cannot make, a
// negative, NaN or huge median, a parameter outside the variant's space
// fail the whole load (exit 2) naming the file and the entry, and leave
// the file as it was.
TEST(Hardening, ATablesNumbersAreBounded) {
  const std::string dir = Dir("numbers");
  const std::string db = Table(dir, "t.txtpb");
  const std::string good = Bytes(db);
  struct Edit {
    std::string field, value, message;  // the first `field: ` line gets `value`
  };
  for (const Edit& e : std::vector<Edit>{
           {"threads", "2147483647", "threads: expected 0 (all cores) to 1024, got 2147483647"},
           {"median_ns", "-1", "median_ns: expected 0 to 6.048e+14 ns (a week), got -1"},
           {"median_ns", "nan", "median_ns: expected 0 to 6.048e+14 ns (a week), got nan"},
           {"median_ns", "1e308", "median_ns: expected 0 to 6.048e+14 ns (a week), got 1e+308"},
           {"reps", "-5", "reps: expected 0 to 1000000, got -5"},
           {"choice", "\"bogus\"", "parameter 'method' of topk/sort: 'bogus' is not a choice"},
       }) {
    std::string text = good;
    const size_t at = text.find(e.field + ": ");
    ASSERT_NE(at, std::string::npos) << e.field << " in " << text;
    const size_t value = at + e.field.size() + 2;
    text.replace(value, text.find('\n', value) - value, e.value);
    Write(db, text);
    for (const std::string& command : {"query topk --dims batch=2,n=300,k=4 --db " + db,
                                       "run topk --dims batch=2,n=300,k=4 --reps 2 --db " + db}) {
      Result r = Kreg(command);
      ExpectError(r, 2, db + ": entry ");
      EXPECT_THAT(r.stderr_text, HasSubstr(e.message)) << command;
      EXPECT_EQ(Bytes(db), text) << command;
    }
  }
}

// 4: thread ranks and meshes are bounded before a thread starts, and a
// thread the system refuses is an error, not an abort.
TEST(Hardening, RanksAndMeshesAreBounded) {
  const std::string dir = Dir("ranks");
  const char* ranks = "expected 1 to 256 thread ranks (each is a thread of this process), got ";
  ExpectError(Kreg("run allreduce/ring --dims count=10 --ranks 100000"), 2, std::string("--ranks: ") + ranks + "100000");
  ExpectError(Kreg("run allreduce/ring --dims count=10 --ranks 4097"), 2, std::string("--ranks: ") + ranks + "4097");
  ExpectError(Kreg("calibrate --ranks 100000 --db " + dir + "/c.lut"), 2, std::string("--ranks: ") + ranks + "100000");
  ExpectError(Kreg("run sharded_matmul/plain --dims m=640,k=960,n=40 --mesh 20x20"), 2,
              std::string("--mesh's size: ") + ranks + "400");
  ExpectError(Kreg("tune sharded_matmul --dims m=640,k=960,n=40 --mesh 20x20 --db " + dir + "/t.lut"), 2,
              std::string("--mesh x=20,y=20: ") + ranks + "400");
  ExpectError(Kreg("tune sharded_matmul --dims m=64,k=96,n=40 --mesh 1000x1000 --db " + dir + "/t.lut"), 2,
              "mesh '1000x1000': its size: expected 1 to 65536 ranks, got 1000000");
  ExpectError(Kreg("run sharded_matmul/plain --dims m=64,k=96,n=40 --mesh 65536x65536"), 2,
              "mesh '65536x65536': its size: expected 1 to 65536 ranks, got 4294967296");
  EXPECT_FALSE(std::filesystem::exists(dir + "/c.lut"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/t.lut"));
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory does not fit under ulimit -v";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "a sanitizer's shadow memory does not fit under ulimit -v";
#endif
#endif
  // Address space for a few thread stacks only: the 256 ranks cannot all start.
  Result r = RunCommand("ulimit -v 800000;", KREG_BIN,
                        std::string("--plugin_path=") + KREG_PLUGIN_DIR + " run allreduce/ring --ranks 256 --dims count=10");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("cannot start thread rank ")) << r.out;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
}

// 6: a plugin whose constructor or init crashes, or whose init hangs, is
// named: on a crash by the process's last line, on a hang by a warning after
// five seconds; and kreg list --check-plugins loads each plugin in a child
// and names those that crash or hang.
TEST(Hardening, APluginThatCrashesOrHangsWhileLoadingIsNamed) {
  const std::string plugins = std::string(KREG_TEST_PLUGIN_DIR);
  for (const std::string flaw : {"init_crashes", "ctor_crashes"}) {
    const std::string file = plugins + "/" + flaw + "/test_" + flaw + ".so";
    for (const std::string command :
         {"list", "query topk --dims batch=2,n=100,k=3", "run topk/sort --dims batch=2,n=100,k=3"}) {
      Result r = RunKreg(std::string(KREG_PLUGIN_DIR) + ":" + plugins + "/" + flaw, command);
      EXPECT_NE(r.code, 0) << r.out;
      EXPECT_THAT(r.stderr_text, HasSubstr("kreg: plugin " + file + " crashed while loading")) << command;
    }
  }
  const std::string hangs = plugins + "/init_hangs/test_init_hangs.so";
  Result r = RunCommand("timeout 7", KREG_BIN, "--plugin_path=" + plugins + "/init_hangs list");
  EXPECT_EQ(r.code, 124) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("kreg: warning: plugin " + hangs + " has been loading for 5 s")) << r.out;
  r = RunKreg(std::string(KREG_PLUGIN_DIR) + ":" + plugins + "/init_crashes:" + plugins + "/init_hangs",
              "list --check-plugins");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("crashed  " + plugins + "/init_crashes/test_init_crashes.so: signal 11"));
  EXPECT_THAT(r.stdout_text, HasSubstr("hung     " + hangs + ": still loading after 10 s (killed)"));
  EXPECT_THAT(r.stdout_text, HasSubstr("kreg_topk.so")) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("kreg list: 2 plugins crashed or hung while loading"));
  r = Kreg("list --check-plugins");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, Not(HasSubstr("refused"))) << r.out;
}

// 8: a table's lock held by another process is waited for a bounded time,
// saying so after a second, and the wait ends on SIGTERM; nothing is written.
TEST(Hardening, ALockHeldElsewhereIsWaitedForABoundedTime) {
  const std::string dir = Dir("lock");
  const std::string db = dir + "/t.lut", other = Table(dir, "other.lut");
  Write(db + ".lock", "");
  Result holder = RunCommand("", "flock", "-x " + db + ".lock sleep 60 >/dev/null 2>&1 & echo $!");
  const pid_t pid = std::stoi(holder.stdout_text);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (const std::string& command :
       {"tune topk --dims batch=2,n=300,k=4 --variants sort --reps 2 --lock-timeout 1.5 --db " + db,
        "db merge " + db + " " + other + " --lock-timeout 1.5", "db slim " + other + " " + db + " --lock-timeout 1.5",
        "calibrate --lock-timeout 1.5 --db " + db}) {
    const auto start = std::chrono::steady_clock::now();
    Result r = Kreg(command);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << command;
    EXPECT_EQ(r.code, 1) << command << ": " << r.out;
    EXPECT_THAT(r.stderr_text, HasSubstr("waiting for the lock " + db + ".lock")) << command;
    EXPECT_THAT(r.stderr_text, HasSubstr(db + ".lock: still held by another process after 1.5 s; not written"))
        << command;
    EXPECT_FALSE(std::filesystem::exists(db)) << command;
  }
  Result r = RunCommand("", "sh", std::string("-c '") + KREG_BIN + " --plugin_path=" + KREG_PLUGIN_DIR + " db merge " +
                                      db + " " + other + " --lock-timeout 60 2>/dev/null & p=$!; sleep 1.5; kill -TERM "
                                      "$p; wait $p; echo $?'");
  EXPECT_EQ(r.stdout_text, "143\n") << r.out;  // ended by the signal, not after 60 s
  EXPECT_FALSE(std::filesystem::exists(db));
  kill(pid, SIGKILL);
}

// 12: every float flag is finite and in range, or a clear error.
TEST(Hardening, FloatFlagsAreFiniteAndInRange) {
  const std::string dir = Dir("floats");
  const std::string tune = "tune topk --dims batch=2,n=100,k=3 --variants sort --db " + dir + "/t.lut ";
  const char* week = "seconds (a week), got ";
  for (const char* v : {"nan", "inf", "-inf", "1e300", "0", "-1"}) {
    ExpectError(Kreg(tune + "--timeout " + v), 2, "--timeout: expected more than 0 and at most 604800 ");
    ExpectError(Kreg("run allreduce/ring --dims count=10 --ranks 2 --comm-timeout " + std::string(v)), 2,
                "--comm-timeout: expected more than 0 and at most 604800 ");
  }
  for (const char* v : {"nan", "inf", "1e300", "-1"}) {
    ExpectError(Kreg(tune + "--budget " + v), 2, std::string("--budget: expected 0 to 604800 ") + week);
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/t.lut"));
}

// 13: the smaller ones.
TEST(Hardening, SmallerOnesOfTheSecondRound) {
  const std::string dir = Dir("smaller");
  // A single-valued flag given twice keeps the last.
  Result r = Kreg("--json run topk/sort --dims batch=2,n=100,k=3 --reps 1 --warmup 0 --reps 2");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("\"reps\":2")) << r.out;
  // Empty list items and empty lists are errors.
  ExpectError(Kreg("run topk/sort --dims batch=4,,n=100,k=3"), 2, "--dims: 'batch=4,,n=100,k=3' has an empty item");
  ExpectError(Kreg("run topk/sort --dims batch=4,n=100,k=3,"), 2, "has an empty item");
  ExpectError(Kreg("tune topk --dims batch=4,n=100,k=3 --variants sort,,heap --db " + dir + "/t.lut"), 2,
              "--variants: 'sort,,heap' has an empty item");
  ExpectError(Kreg("run topk/sort --dims batch=4,n=100,k=3 --dtype ''"), 2, "--dtype: the value is empty");
  // A dtype asked for a tensor whose dtype is not its own to choose.
  ExpectError(Kreg("run topk/sort --dims batch=4,n=100,k=3 --dtype values=bf16"), 2,
              "tensor 'values' has the dtype of 'input' (f32), not bf16");
  // A table that cannot be written fails before anything is measured.
  r = Kreg("tune topk --dims batch=4,n=100,k=3 --db /nonexistent/dir/t.lut");
  ExpectError(r, 2, "/nonexistent/dir/t.lut: no folder /nonexistent/dir");
  EXPECT_EQ(r.stdout_text, "");
  EXPECT_FALSE(std::filesystem::exists(dir + "/t.lut"));
  // Two tables with one candidate measured at the same second, differently:
  // merged the same whichever comes first, and told apart by db diff.
  const std::string a = Table(dir, "a.txtpb");
  std::string text = Bytes(a);
  const size_t at = text.find("median_ns: ");  // the winner's (its best record, then its trial)
  ASSERT_NE(at, std::string::npos);
  const std::string median = text.substr(at, text.find('\n', at) - at);
  text = absl::StrReplaceAll(text, {{median, "median_ns: " + std::to_string(std::stod(median.substr(11)) / 2)}});
  Write(dir + "/b.txtpb", text);
  ASSERT_EQ(Kreg("db merge " + dir + "/ab.txtpb " + a + " " + dir + "/b.txtpb").code, 0);
  ASSERT_EQ(Kreg("db merge " + dir + "/ba.txtpb " + dir + "/b.txtpb " + a).code, 0);
  EXPECT_EQ(Kreg("db export " + dir + "/ab.txtpb").stdout_text, Kreg("db export " + dir + "/ba.txtpb").stdout_text);
  r = Kreg("db diff " + a + " " + dir + "/b.txtpb");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stdout_text, HasSubstr("measured at the same time as")) << r.out;
  // db slim X X works in place.
  const std::string in_place = Table(dir, "slim.txtpb");
  r = Kreg("db slim " + in_place + " " + in_place);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(Kreg("db show " + in_place).stdout_text, HasSubstr("topk f32 batch=2,n=300,k=4"));
  // Plot errors name the command.
  r = Kreg("db plot " + a + " --out /proc/no/such/folder");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.stderr_text, HasSubstr("kreg db plot: ")) << r.out;
  // Text from a table is escaped in an error or warning line, and the line bounded.
  text = Bytes(a);
  const size_t choice = text.find("choice: \"");
  ASSERT_NE(choice, std::string::npos);
  text.replace(choice, text.find('\n', choice) - choice, "choice: \"\\033[2J\\n" + std::string(5000, 'x') + "\"");
  Write(dir + "/evil.txtpb", text);
  r = Kreg("query topk --dims batch=2,n=300,k=4 --db " + dir + "/evil.txtpb");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.stderr_text.find('\x1b'), std::string::npos) << r.stderr_text;
  EXPECT_THAT(r.stderr_text, HasSubstr("method=\\x1b[2J; xxx")) << r.stderr_text;
  for (absl::string_view line : absl::StrSplit(r.stderr_text, '\n')) EXPECT_LE(line.size(), 2200u) << line;
}

}  // namespace
}  // namespace kreg
