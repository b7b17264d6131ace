// The mpi backend through the ABI table, run under mpirun -n 2 (see
// tests/CMakeLists.txt): host collectives, sizes that disagree, matching
// through the node's rings, a message over 2 GiB (slow label only:
// KREG_MPI_BIG=1), and a rank that never answers. Every rank runs every
// test, in the same order.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kreg/comm.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;

// This process's rank, from the first test until every test has run (its
// destruction finalises MPI).
std::unique_ptr<Comm> g_world;

class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    CommOptions options;
    options.timeout_seconds = 2;
    options.mesh = {{"x", 2}, {"y", 1}};
    absl::StatusOr<std::unique_ptr<Comm>> c = LoadMpiComm(options);
    ASSERT_TRUE(c.ok()) << c.status();
    g_world = *std::move(c);
  }
  void TearDown() override { g_world.reset(); }
};
::testing::Environment* const kEnvironment = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

Comm& World() { return *g_world; }

absl::Status SendRecv(Comm& c, bool send, int peer, int tag, void* buf, size_t bytes) {
  char msg[512] = "";
  void* request = nullptr;
  const kreg_comm& a = *c.abi();
  kreg_status s = send ? a.isend(a.ctx, peer, tag, buf, bytes, &request, msg, sizeof msg)
                       : a.irecv(a.ctx, peer, tag, buf, bytes, &request, msg, sizeof msg);
  if (s == KREG_OK) s = a.wait(a.ctx, request, msg, sizeof msg);
  return s == KREG_OK ? absl::OkStatus() : FromAbi(s, msg);
}

TEST(MpiCommTest, HostCollectivesAgree) {
  Comm& c = World();
  ASSERT_EQ(c.size(), 2);
  ASSERT_TRUE(c.Barrier().ok());
  absl::StatusOr<std::vector<double>> m = c.AllMax({static_cast<double>(c.rank()), 5.0});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, (std::vector<double>{1.0, 5.0}));
  std::string text = c.rank() == 0 ? "allreduce/ring\nchunks=4" : "";
  ASSERT_TRUE(c.Broadcast(&text).ok());
  EXPECT_EQ(text, "allreduce/ring\nchunks=4");
  // The 2 x 1 mesh: axis x holds both ranks, axis y each alone.
  const kreg_comm* x = c.abi()->axis(c.abi()->ctx, "x");
  const kreg_comm* y = c.abi()->axis(c.abi()->ctx, "y");
  ASSERT_TRUE(x != nullptr && y != nullptr);
  EXPECT_EQ(x->size, 2);
  EXPECT_EQ(x->rank, c.rank());
  EXPECT_EQ(y->size, 1);
  EXPECT_EQ(y->rank, 0);
  EXPECT_TRUE(c.axis("x")->Barrier().ok());
}

TEST(MpiCommTest, AllGatherAndPostedMessages) {
  Comm& c = World();
  absl::StatusOr<std::vector<std::string>> all = c.AllGather(c.rank() == 0 ? "zero" : "one");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, (std::vector<std::string>{"zero", "one"}));
  const std::vector<std::string> texts = {"first", "", std::string(1 << 20, 'y'), "last"};
  if (c.rank() == 1) {
    for (const std::string& t : texts) ASSERT_TRUE(c.Post(0, t).ok());
    ASSERT_TRUE(c.Flush().ok());
  } else {
    for (const std::string& t : texts) {
      std::optional<std::string> got;
      while (!got.has_value()) {
        absl::StatusOr<std::optional<std::string>> r = c.Receive(1);
        ASSERT_TRUE(r.ok()) << r.status();
        got = *std::move(r);
      }
      EXPECT_EQ(*got, t);
    }
  }
  ASSERT_TRUE(c.Barrier().ok());
}

TEST(MpiCommTest, SizesThatDisagreeAreNamed) {
  Comm& c = World();
  std::vector<char> buf(64);
  // Rank 0 sends 40 bytes where rank 1 expects 32, then 16 where it expects 32.
  absl::Status more = SendRecv(c, c.rank() == 0, 1 - c.rank(), 3, buf.data(), c.rank() == 0 ? 40 : 32);
  absl::Status fewer = SendRecv(c, c.rank() == 0, 1 - c.rank(), 4, buf.data(), c.rank() == 0 ? 16 : 32);
  if (c.rank() == 1) {
    EXPECT_THAT(std::string(more.message()), HasSubstr("rank 0 sent more than the 32 bytes rank 1 expected (tag 3)"));
    EXPECT_THAT(std::string(fewer.message()), HasSubstr("rank 0 sent 16 bytes (tag 4) to rank 1, which expected 32"));
  }
  EXPECT_TRUE(c.Barrier().ok());
}

// Between ranks of one node, messages up to a slot's size pass rings in
// shared memory, larger ones MPI (announced in the ring); either way they
// match receives by (source, tag) in the order posted, and a send of a
// small message is done before its receive is posted.
TEST(MpiCommTest, MessagesMatchByTagInTheOrderPosted) {
  Comm& c = World();
  const kreg_comm& a = *c.abi();
  char msg[512] = "";
  auto post = [&](bool send, int tag, std::vector<unsigned char>& buf) {
    void* request = nullptr;
    const kreg_status s = send ? a.isend(a.ctx, 1 - c.rank(), tag, buf.data(), buf.size(), &request, msg, sizeof msg)
                               : a.irecv(a.ctx, 1 - c.rank(), tag, buf.data(), buf.size(), &request, msg, sizeof msg);
    EXPECT_EQ(s, KREG_OK) << msg;
    return request;
  };
  auto wait_all = [&](std::vector<void*>& requests) {
    for (void* r : requests) EXPECT_EQ(a.wait(a.ctx, r, msg, sizeof msg), KREG_OK) << msg;
    requests.clear();
  };
  // Message i: tag 7 + i % 2, bytes sizes[i % sizes.size()], every byte i.
  auto check = [](const std::vector<std::vector<unsigned char>>& got) {
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(std::count(got[i].begin(), got[i].end(), static_cast<unsigned char>(i)), got[i].size()) << i;
    }
  };
  struct Round {
    std::vector<size_t> sizes;
    size_t n;
    bool eager;  // the sender waits for its sends before the receiver posts
  };
  const Round rounds[] = {{{0, 1, 1024, 4099, 16384}, 20, true},  // more than the ring's 8 slots
                          {{16384, 16385, 1 << 20, 7, 0}, 10, false}};
  for (const auto& [sizes, n, eager] : rounds) {
    std::vector<std::vector<unsigned char>> bufs(n);
    std::vector<void*> requests;
    for (size_t i = 0; i < n; ++i) bufs[i].assign(sizes[i % sizes.size()], c.rank() == 0 ? i : 0xff);
    if (c.rank() == 0) {
      for (size_t i = 0; i < n; ++i) requests.push_back(post(true, 7 + i % 2, bufs[i]));
      if (eager) wait_all(requests);  // before any receive is posted
      ASSERT_TRUE(c.Barrier().ok());
    } else {
      ASSERT_TRUE(c.Barrier().ok());
      for (size_t i = 1; i < n; i += 2) requests.push_back(post(false, 8, bufs[i]));  // tag 8 first
      for (size_t i = 0; i < n; i += 2) requests.push_back(post(false, 7, bufs[i]));
    }
    wait_all(requests);
    if (c.rank() == 1) check(bufs);
  }
  // Sizes that disagree across a slot's size: the receive fails naming them.
  std::vector<unsigned char> small(100), large(100000);
  for (int round = 0; round < 2; ++round) {
    const bool sends_large = round == 0;
    std::vector<unsigned char>& mine = (c.rank() == 0) == sends_large ? large : small;
    void* r = post(c.rank() == 0, 9, mine);
    const kreg_status s = a.wait(a.ctx, r, msg, sizeof msg);
    if (c.rank() == 1) {
      EXPECT_EQ(s, KREG_INVALID_ARGUMENT);
      EXPECT_THAT(msg, HasSubstr(sends_large ? "rank 0 sent more than the 100 bytes rank 1 expected (tag 9)"
                                             : "rank 0 sent 100 bytes (tag 9) to rank 1, which expected 100000"));
    }
  }
  EXPECT_TRUE(c.Barrier().ok());
}

TEST(MpiCommTest, AMessageOverTwoGiB) {
  if (std::getenv("KREG_MPI_BIG") == nullptr) GTEST_SKIP() << "set KREG_MPI_BIG=1 (4.5 GB of memory)";
  Comm& c = World();
  const size_t bytes = (size_t{1} << 31) + 4097;
  std::vector<unsigned char> buf(bytes, c.rank() == 0 ? 7 : 0);
  buf[bytes - 1] = c.rank() == 0 ? 9 : 0;
  ASSERT_TRUE(SendRecv(c, c.rank() == 0, 1 - c.rank(), 5, buf.data(), bytes).ok());
  if (c.rank() == 1) {
    EXPECT_EQ(buf[0], 7);
    EXPECT_EQ(buf[bytes - 2], 7);
    EXPECT_EQ(buf[bytes - 1], 9);
  }
}

// Last: rank 1 stops answering; rank 0 gives up after the 2 s timeout,
// naming it, and has slept meanwhile.
TEST(MpiCommTest, ARankThatNeverAnswersTimesOut) {
  Comm& c = World();
  if (c.rank() == 1) return;
  int v = 0;
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu = std::clock();
  absl::Status s = SendRecv(c, false, 1, 6, &v, sizeof v);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 0: nothing came within the 2s communication timeout, waiting for a receive of 4 bytes "
                        "from rank 1 (tag 6)"));
  EXPECT_LT(seconds, 3.0);
  EXPECT_LT(static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC, 0.5);  // it slept
}

}  // namespace
}  // namespace kreg
