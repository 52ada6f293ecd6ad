// Cross-core hand-off: ordering, overflow, wake-ups, and real threads (run under TSan).
#include "smp/mailbox.hpp"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <coroutine>
#include <thread>
#include <vector>

using namespace metad;

namespace {

struct fire_and_forget {
  struct promise_type {
    fire_and_forget get_return_object() { return {}; }
    std::suspend_never initial_suspend() { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

// Visits cores 0..n-1 in turn `rounds` times, bumping each core's own counter there.
fire_and_forget tour(smp::mailbox& mb, std::vector<long>& per_core, int rounds,
                     std::atomic<int>& finished) {
  for (int r = 0; r < rounds; ++r) {
    for (int c = 0; c < mb.cores(); ++c) {
      co_await mb.hop_to(c);
      EXPECT_EQ(smp::this_core(), c);
      ++per_core[static_cast<std::size_t>(c)];  // only core c touches its counter
    }
  }
  co_await mb.hop_to(0);
  finished.fetch_add(1);
}

fire_and_forget arrive(smp::mailbox& mb, int to, std::vector<int>& order, int id) {
  co_await mb.hop_to(to);
  EXPECT_EQ(smp::this_core(), to);
  order.push_back(id);
}

// Starts a coroutine on core `from` (this thread is that core until it suspends) that
// hops to `to` and records its arrival there.
void record_arrival(smp::mailbox& mb, int from, int to, std::vector<int>& order, int id) {
  const smp::core_scope as_from(from);
  arrive(mb, to, order, id);
}

}  // namespace

TEST(Mailbox, HopToOwnCoreDoesNotSuspend) {
  smp::mailbox mb(2, 8);
  std::vector<int> order;
  record_arrival(mb, 1, 1, order, 7);
  EXPECT_EQ(order, std::vector<int>{7});
}

TEST(Mailbox, HandlesArriveInPostOrderEvenThroughOverflow) {
  smp::mailbox mb(2, 2);  // ring of 2: most posts spill into the overflow list
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) record_arrival(mb, 0, 1, order, i);
  EXPECT_TRUE(order.empty());
  EXPECT_FALSE(mb.prepare_sleep(0)) << "core 0 still owes spilled work";
  for (int round = 0; round < 100 && order.size() < 50; ++round) {
    mb.drain(0);  // flushes core 0's overflow into the ring
    mb.drain(1);  // core 1 resumes what arrived
  }
  std::vector<int> expected;
  for (int i = 0; i < 50; ++i) expected.push_back(i);
  EXPECT_EQ(order, expected);
}

TEST(Mailbox, PostToSleepingCoreSignalsItsEventfd) {
  smp::mailbox mb(2, 8);
  ASSERT_TRUE(mb.prepare_sleep(1));
  std::vector<int> order;
  record_arrival(mb, 0, 1, order, 1);
  std::uint64_t counter = 0;
  EXPECT_EQ(::read(mb.wake_fd(1), &counter, sizeof counter), static_cast<ssize_t>(sizeof counter));
  EXPECT_GE(counter, 1u);
  mb.woke(1);
  EXPECT_FALSE(mb.prepare_sleep(1)) << "work is waiting: no sleep";
  EXPECT_EQ(mb.drain(1), 1u);
}

TEST(Mailbox, PostToAwakeCoreSkipsTheEventfd) {
  smp::mailbox mb(2, 8);
  std::vector<int> order;
  record_arrival(mb, 0, 1, order, 1);
  std::uint64_t counter = 0;
  EXPECT_LT(::read(mb.wake_fd(1), &counter, sizeof counter), 0) << "no write when awake";
  mb.drain(1);
}

TEST(Mailbox, CoroutinesTourAllCoresOnRealThreads) {
  constexpr int kCores = 4, kTours = 200, kRounds = 20;
  smp::mailbox mb(kCores, 16);
  std::vector<long> per_core(kCores, 0);
  std::atomic<int> finished{0};
  std::atomic<bool> started{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < kCores; ++c) {
    threads.emplace_back([&, c] {
      const smp::core_scope as_core(c);
      if (c == 0) {
        for (int i = 0; i < kTours; ++i) tour(mb, per_core, kRounds, finished);
        started = true;
      }
      while (finished.load() < kTours) {
        if (mb.drain(c) == 0 && mb.prepare_sleep(c)) {
          std::uint64_t counter;
          // Sleep briefly on the eventfd, as a loop would.
          for (int spin = 0; spin < 1000 && finished.load() < kTours; ++spin) {
            if (::read(mb.wake_fd(c), &counter, sizeof counter) > 0) break;
            std::this_thread::yield();
          }
          mb.woke(c);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(started.load());
  for (int c = 0; c < kCores; ++c)
    EXPECT_EQ(per_core[static_cast<std::size_t>(c)], long{kTours} * kRounds);
}

TEST(Mailbox, DrainRunsWhatItResumesAsTheDrainedCore) {
  smp::mailbox mb(3, 8);
  std::vector<int> order;
  record_arrival(mb, 0, 2, order, 1);  // asserts this_core() == 2 where it arrives
  EXPECT_EQ(smp::this_core(), -1) << "the scope ends with the start";
  EXPECT_EQ(mb.drain(2), 1u);
  EXPECT_EQ(order, std::vector<int>{1});
  EXPECT_EQ(smp::this_core(), -1) << "drain gives the thread back as it was";
}
