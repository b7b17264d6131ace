// The threads backend through the ABI table kernels see: matching and
// order, size disagreements, timeouts, failed ranks, cancellation, and that
// waiting ranks sleep.
#include "kreg/comm.h"

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kreg/registry.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// One posted message, waited for: the status and its message.
absl::Status Post(const Comm& c, bool send, int peer, int tag, void* buf, size_t bytes, void** request) {
  char msg[256] = "";
  const kreg_comm& a = *c.abi();
  const kreg_status s = send ? a.isend(a.ctx, peer, tag, buf, bytes, request, msg, sizeof msg)
                             : a.irecv(a.ctx, peer, tag, buf, bytes, request, msg, sizeof msg);
  return s == KREG_OK ? absl::OkStatus() : FromAbi(s, msg);
}
absl::Status Wait(const Comm& c, void* request) {
  char msg[256] = "";
  const kreg_status s = c.abi()->wait(c.abi()->ctx, request, msg, sizeof msg);
  return s == KREG_OK ? absl::OkStatus() : FromAbi(s, msg);
}
absl::Status SendRecv(const Comm& c, bool send, int peer, int tag, void* buf, size_t bytes) {
  void* request = nullptr;
  if (absl::Status s = Post(c, send, peer, tag, buf, bytes, &request); !s.ok()) return s;
  return Wait(c, request);
}

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(ThreadCommTest, MessagesMatchBySourceAndTagInPostingOrder) {
  auto comms = ThreadComms(3, {});
  ASSERT_TRUE(RunRanks(comms, [](Comm& c) -> absl::Status {
                if (c.rank() == 0) {
                  // Two messages per tag to each peer, tags posted in opposite orders.
                  for (int peer : {1, 2}) {
                    for (int tag : {7, 3}) {
                      for (int i = 0; i < 2; ++i) {
                        int v = peer * 100 + tag * 10 + i;
                        if (absl::Status s = SendRecv(c, true, peer, tag, &v, sizeof v); !s.ok()) return s;
                      }
                    }
                  }
                  return absl::OkStatus();
                }
                int got[4] = {};
                void* requests[4];
                int at = 0;
                for (int tag : {3, 7}) {
                  for (int i = 0; i < 2; ++i, ++at) {
                    absl::Status s = Post(c, false, 0, tag, &got[at], sizeof(int), &requests[at]);
                    if (!s.ok()) return s;
                  }
                }
                for (void* r : requests) {
                  if (absl::Status s = Wait(c, r); !s.ok()) return s;
                }
                const int p = c.rank() * 100;
                EXPECT_EQ(got[0], p + 30);
                EXPECT_EQ(got[1], p + 31);
                EXPECT_EQ(got[2], p + 70);
                EXPECT_EQ(got[3], p + 71);
                return absl::OkStatus();
              }).ok());
}

TEST(ThreadCommTest, TestReportsDoneOnceTheCopyHappened) {
  auto comms = ThreadComms(2, {});
  ASSERT_TRUE(RunRanks(comms, [](Comm& c) -> absl::Status {
                std::vector<float> buf(1000, static_cast<float>(c.rank()));
                void* request = nullptr;
                if (absl::Status s = Post(c, c.rank() == 0, 1 - c.rank(), 0, buf.data(), 4000, &request); !s.ok()) {
                  return s;
                }
                int done = 0;
                char msg[256];
                while (!done) {
                  if (c.abi()->test(c.abi()->ctx, request, &done, msg, sizeof msg) != KREG_OK) {
                    return absl::InternalError(msg);
                  }
                  if (!done) std::this_thread::yield();
                }
                if (c.rank() == 1) {
                  EXPECT_EQ(buf[999], 0.0f);
                }
                return absl::OkStatus();
              }).ok());
}

TEST(ThreadCommTest, SizesThatDisagreeFailBothSidesNamingThem) {
  auto comms = ThreadComms(2, {});
  std::vector<absl::Status> seen(2);
  (void)RunRanks(comms, [&](Comm& c) {
    std::vector<char> buf(100);
    seen[c.rank()] = SendRecv(c, c.rank() == 0, 1 - c.rank(), 4, buf.data(), c.rank() == 0 ? 40 : 80);
    return absl::OkStatus();
  });
  for (const absl::Status& s : seen) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 sent 40 bytes (tag 4) to rank 1, which expected 80"));
  }
}

// What a consume function saw: the bytes it was handed, and how often.
struct Consumed {
  std::vector<char> bytes;
  int calls = 0;
  static void Take(void* arg, const void* data, size_t n) {
    auto* self = static_cast<Consumed*>(arg);
    self->bytes.assign(static_cast<const char*>(data), static_cast<const char*>(data) + n);
    ++self->calls;
  }
};

absl::Status PostConsume(const Comm& c, int peer, int tag, size_t bytes, Consumed* into, void** request) {
  char msg[256] = "";
  const kreg_comm& a = *c.abi();
  if (!KREG_HAS_FIELD(&a, kreg_comm, irecv_consume) || a.irecv_consume == nullptr) {
    return absl::UnimplementedError("no irecv_consume");
  }
  const kreg_status s = a.irecv_consume(a.ctx, peer, tag, bytes, Consumed::Take, into, request, msg, sizeof msg);
  return s == KREG_OK ? absl::OkStatus() : FromAbi(s, msg);
}

// irecv_consume matches in order with irecv (posted before or after the
// send), hands over the sender's bytes once (zero bytes too), and never
// calls consume for a message whose size disagrees.
TEST(ThreadCommTest, ConsumeTakesTheSendersBytesOnceInOrder) {
  auto comms = ThreadComms(2, {});
  Consumed first, empty, mismatched;
  int plain = 0;
  std::vector<absl::Status> mismatch(2);
  ASSERT_TRUE(RunRanks(comms, [&](Comm& c) -> absl::Status {
                if (c.rank() == 0) {
                  int a = 11, b = 22;
                  if (absl::Status s = SendRecv(c, true, 1, 3, &a, sizeof a); !s.ok()) return s;
                  if (absl::Status s = SendRecv(c, true, 1, 3, &b, sizeof b); !s.ok()) return s;
                  if (absl::Status s = SendRecv(c, true, 1, 4, &a, 0); !s.ok()) return s;
                  mismatch[0] = SendRecv(c, true, 1, 5, &a, sizeof a);
                  return absl::OkStatus();
                }
                void* requests[3];
                if (absl::Status s = PostConsume(c, 0, 3, sizeof(int), &first, &requests[0]); !s.ok()) return s;
                if (absl::Status s = Post(c, false, 0, 3, &plain, sizeof plain, &requests[1]); !s.ok()) return s;
                std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sends come first
                if (absl::Status s = PostConsume(c, 0, 4, 0, &empty, &requests[2]); !s.ok()) return s;
                for (void* r : requests) {
                  if (absl::Status s = Wait(c, r); !s.ok()) return s;
                }
                void* request = nullptr;
                if (absl::Status s = PostConsume(c, 0, 5, 2 * sizeof(int), &mismatched, &request); !s.ok()) return s;
                mismatch[1] = Wait(c, request);
                return absl::OkStatus();
              }).ok());
  ASSERT_EQ(first.bytes.size(), sizeof(int));
  int got = 0;
  std::memcpy(&got, first.bytes.data(), sizeof got);
  EXPECT_EQ(got, 11);
  EXPECT_EQ(first.calls, 1);
  EXPECT_EQ(plain, 22);
  EXPECT_EQ(empty.calls, 1);
  EXPECT_TRUE(empty.bytes.empty());
  EXPECT_EQ(mismatched.calls, 0);
  for (const absl::Status& s : mismatch) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 sent 4 bytes (tag 5) to rank 1, which expected 8"));
  }
}

TEST(ThreadCommTest, ARankThatNeverAnswersTimesOutNamingItsPeer) {
  CommOptions options;
  options.timeout_seconds = 0.3;
  auto comms = ThreadComms(2, options);
  const auto start = Clock::now();
  int v = 0;  // rank 1 never takes part
  absl::Status seen = SendRecv(*comms[0], false, 1, 2, &v, sizeof v);
  EXPECT_TRUE(absl::IsUnavailable(seen)) << seen;
  EXPECT_THAT(std::string(seen.message()),
              HasSubstr("within the 0.3s communication timeout, waiting for a receive of 4 bytes from rank 1 (tag 2)"));
  EXPECT_LT(SecondsSince(start), 0.3 + 1.0);
}

TEST(ThreadCommTest, AFailedRankFailsEveryWaitAtOnce) {
  auto comms = ThreadComms(4, {});  // 30 s timeout: failing fast is the abort's doing
  const auto start = Clock::now();
  absl::Status s = RunRanks(comms, [](Comm& c) -> absl::Status {
    if (c.rank() == 2) return absl::InternalError("out of memory in rank 2's kernel");
    return c.Barrier();
  });
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_TRUE(absl::IsInternal(s)) << s;  // the cause, not its consequences
  EXPECT_THAT(std::string(s.message()), HasSubstr("out of memory in rank 2's kernel"));
  int v = 0;
  absl::Status after = SendRecv(*comms[0], false, 1, 0, &v, sizeof v);
  EXPECT_TRUE(absl::IsUnavailable(after)) << after;
  EXPECT_THAT(std::string(after.message()), HasSubstr("rank 2 failed (out of memory in rank 2's kernel)"));
}

TEST(ThreadCommTest, CancellationStopsAWait) {
  std::atomic<int> cancel{0};
  CommOptions options;
  options.cancel_flag = &cancel;
  auto comms = ThreadComms(2, options);
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel = 1;
  });
  int v = 0;
  const auto start = Clock::now();
  absl::Status s = SendRecv(*comms[0], false, 1, 0, &v, sizeof v);
  canceller.join();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_LT(SecondsSince(start), 2.0);
}

TEST(ThreadCommTest, AllMaxAndBarrierOnAnyRankCount) {
  for (int n : {1, 2, 3, 5, 8}) {
    auto comms = ThreadComms(n, {});
    ASSERT_TRUE(RunRanks(comms, [n](Comm& c) -> absl::Status {
                  if (absl::Status s = c.Barrier(); !s.ok()) return s;
                  absl::StatusOr<std::vector<double>> m = c.AllMax({1.0 * c.rank(), -1.0 * c.rank()});
                  if (!m.ok()) return m.status();
                  EXPECT_EQ(*m, (std::vector<double>{n - 1.0, 0.0}));
                  return absl::OkStatus();
                }).ok());
  }
}

// Every rank's text on every rank; and messages posted to rank 0 without
// waiting, received in order as they come (what a sweep under mpirun
// streams), empty ones and large ones too.
TEST(ThreadCommTest, AllGatherAndPostedMessages) {
  for (int n : {1, 3}) {
    auto comms = ThreadComms(n, {});
    ASSERT_TRUE(RunRanks(comms, [n](Comm& c) -> absl::Status {
                  absl::StatusOr<std::vector<std::string>> all = c.AllGather(std::string(c.rank(), 'x'));
                  if (!all.ok()) return all.status();
                  for (int q = 0; q < n; ++q) EXPECT_EQ((*all)[q], std::string(q, 'x'));
                  const std::vector<std::string> texts = {"first", "", std::string(1 << 20, 'y'), "last"};
                  if (c.rank() != 0) {
                    for (const std::string& t : texts) {
                      if (absl::Status s = c.Post(0, absl::StrCat(c.rank(), t)); !s.ok()) return s;
                    }
                    return c.Flush();
                  }
                  for (int q = 1; q < n; ++q) {
                    for (const std::string& t : texts) {
                      std::optional<std::string> got;
                      while (!got.has_value()) {
                        absl::StatusOr<std::optional<std::string>> r = c.Receive(q);
                        if (!r.ok()) return r.status();
                        got = *std::move(r);
                      }
                      EXPECT_EQ(*got, absl::StrCat(q, t));
                    }
                  }
                  return absl::OkStatus();
                }).ok());
  }
}

TEST(ThreadCommTest, AMeshHasACommunicatorPerAxis) {
  // 2 x 3, row-major: rank = ix * 3 + iy.
  EXPECT_EQ(AxisGroup({{"x", 2}, {"y", 3}}, 0, 4), (std::vector<int>{1, 4}));
  EXPECT_EQ(AxisGroup({{"x", 2}, {"y", 3}}, 1, 4), (std::vector<int>{3, 4, 5}));
  CommOptions options;
  options.mesh = {{"x", 2}, {"y", 3}};
  auto comms = ThreadComms(6, options);
  ASSERT_TRUE(RunRanks(comms, [](Comm& c) -> absl::Status {
                const int ix = c.rank() / 3, iy = c.rank() % 3;
                const kreg_comm* x = c.abi()->axis(c.abi()->ctx, "x");
                const kreg_comm* y = c.abi()->axis(c.abi()->ctx, "y");
                EXPECT_EQ(c.abi()->axis(c.abi()->ctx, "z"), nullptr);
                if (x == nullptr || y == nullptr) return absl::InternalError("no axis");
                EXPECT_EQ(x->size, 2);
                EXPECT_EQ(x->rank, ix);
                EXPECT_EQ(y->size, 3);
                EXPECT_EQ(y->rank, iy);
                // Around the y ring, each rank's world rank: the one before it on its row.
                int got = -1, mine = c.rank();
                void* requests[2];
                if (absl::Status s = Post(*c.axis("y"), false, (iy + 2) % 3, 0, &got, sizeof got, &requests[0]);
                    !s.ok()) {
                  return s;
                }
                if (absl::Status s = Post(*c.axis("y"), true, (iy + 1) % 3, 0, &mine, sizeof mine, &requests[1]);
                    !s.ok()) {
                  return s;
                }
                for (void* r : requests) {
                  if (absl::Status s = Wait(*c.axis("y"), r); !s.ok()) return s;
                }
                EXPECT_EQ(got, ix * 3 + (iy + 2) % 3);
                return absl::OkStatus();
              }).ok());
}

double ThreadCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// 8 ranks (more than this machine's cores), one joining a second late: the
// others wait that second asleep, in a barrier and in a receive.
TEST(ThreadCommTest, WaitingRanksSleep) {
  auto comms = ThreadComms(8, {});
  std::vector<double> cpu(8);
  ASSERT_TRUE(RunRanks(comms, [&](Comm& c) -> absl::Status {
                if (c.rank() == 7) std::this_thread::sleep_for(std::chrono::seconds(1));
                const double t0 = ThreadCpuSeconds();
                int v = c.rank();
                absl::Status s = c.rank() == 7 ? SendRecv(c, true, 0, 0, &v, sizeof v)
                                 : c.rank() == 0 ? SendRecv(c, false, 7, 0, &v, sizeof v)
                                                 : c.Barrier();
                if (s.ok() && (c.rank() == 0 || c.rank() == 7)) s = c.Barrier();
                cpu[c.rank()] = ThreadCpuSeconds() - t0;
                return s;
              }).ok());
  for (int r = 0; r < 7; ++r) EXPECT_LT(cpu[r], 0.1) << "rank " << r;
}

}  // namespace
}  // namespace kreg
