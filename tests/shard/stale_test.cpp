// The directory's side of stale-key reclamation: incomplete keys tracked by their last
// confirmation, counted with the pages they hold, taken stalest first once past a
// cutoff, and put back when a writer is still at work. On a fake clock (times are
// arguments), and against a small model under random operations.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "shard/directory.hpp"

namespace metad::shard {
namespace {

const std::string kA(32, 'a'), kB(32, 'b'), kC(32, 'c');

std::vector<std::string> take_stale(directory& d, std::uint64_t cutoff, std::size_t n) {
  std::vector<std::string> out;
  d.take_stale(cutoff, n, [&](std::string_view k, std::uint64_t) { out.emplace_back(k); });
  return out;
}

TEST(DirectoryStale, IncompleteKeysAreCountedWithTheirPages) {
  directory d;
  d.add_confirmation(kA, 3, 10);  // 1 of 3
  d.add_confirmation(kA, 3, 11);  // 2 of 3
  d.add_confirmation(kB, 2, 12);  // 1 of 2
  d.add_confirmation(kC, 1, 13);  // complete at once
  EXPECT_EQ(d.incomplete_count(), 2u);
  EXPECT_EQ(d.incomplete_bindings(), 3u);
  EXPECT_EQ(d.oldest_incomplete(), 11u);  // kA, last confirmed at 11
  d.add_confirmation(kA, 3, 14);          // complete: leaves the count with its 2 pages
  EXPECT_EQ(d.incomplete_count(), 1u);
  EXPECT_EQ(d.incomplete_bindings(), 1u);
  EXPECT_EQ(d.oldest_incomplete(), 12u);
  d.clear();
  EXPECT_EQ(d.incomplete_count(), 0u);
  EXPECT_EQ(d.incomplete_bindings(), 0u);
  EXPECT_EQ(d.oldest_incomplete(), UINT64_MAX);
}

TEST(DirectoryStale, TakesKeysLastConfirmedByTheCutoffStalestFirst) {
  directory d;
  d.add_confirmation(kA, 2, 10);
  d.add_confirmation(kB, 2, 20);
  d.add_confirmation(kC, 2, 30);
  d.add_confirmation(kA, 3, 35);  // kA's second rank: complete (its tp stays 2)
  EXPECT_TRUE(d.complete(kA));
  EXPECT_TRUE(take_stale(d, 19, 10).empty());  // kB was confirmed at 20: not yet
  EXPECT_EQ(take_stale(d, 30, 10), (std::vector<std::string>{kB, kC}));
  // Taken keys read as absent until their removal settles, and are counted no more.
  EXPECT_FALSE(d.complete(kB));
  EXPECT_EQ(d.incomplete_count(), 0u);
  EXPECT_EQ(d.incomplete_bindings(), 0u);
  EXPECT_EQ(d.begin_removal(kB, 40), directory::removal::busy);
  EXPECT_TRUE(d.finish_removal(kB, 1, 40));
  EXPECT_TRUE(d.finish_removal(kC, 1, 40));
  EXPECT_EQ(d.size(), 1u);
}

TEST(DirectoryStale, TakesAtMostN) {
  directory d;
  for (int i = 0; i < 5; ++i) d.add_confirmation(fmt::format("{:032x}", i), 2, 10 + i);
  EXPECT_EQ(take_stale(d, 100, 2).size(), 2u);
  EXPECT_EQ(d.incomplete_count(), 3u);
  EXPECT_EQ(d.oldest_incomplete(), 12u);
}

TEST(DirectoryStale, ALaterConfirmationRestartsTheGrace) {
  directory d;
  d.add_confirmation(kA, 3, 10);
  d.add_confirmation(kB, 3, 20);
  d.add_confirmation(kA, 3, 30);  // a lagging rank: 2 of 3, last confirmed at 30
  EXPECT_EQ(take_stale(d, 25, 10), (std::vector<std::string>{kB}));
  EXPECT_EQ(take_stale(d, 30, 10), (std::vector<std::string>{kA}));
}

TEST(DirectoryStale, AKeyPutBackIsTrackedAgainFromThen) {
  directory d;
  d.add_confirmation(kA, 2, 10);
  d.add_confirmation(kB, 2, 11);
  ASSERT_EQ(take_stale(d, 11, 10).size(), 2u);
  d.abort_stale(kA, 10, false, 50);  // a rank still held a reservation for it
  EXPECT_EQ(d.incomplete_count(), 1u);
  EXPECT_EQ(d.incomplete_bindings(), 1u);
  EXPECT_TRUE(take_stale(d, 49, 10).empty());
  // A key completed while it was taken is put back as complete, not incomplete.
  d.add_confirmation(kB, 2, 60);
  d.abort_stale(kB, 11, false, 61);
  EXPECT_TRUE(d.complete(kB));
  EXPECT_EQ(d.incomplete_count(), 1u);
  EXPECT_EQ(take_stale(d, 100, 10), (std::vector<std::string>{kA}));
}

TEST(DirectoryStale, AKeyPassedOverGoesBackInItsPlaceWithItsTime) {
  directory d;
  d.add_confirmation(kA, 2, 10);
  d.add_confirmation(kB, 2, 11);
  d.add_confirmation(kC, 2, 12);
  std::vector<std::pair<std::string, std::uint64_t>> got;
  d.take_stale(11, 10, [&](std::string_view k, std::uint64_t t) { got.emplace_back(k, t); });
  ASSERT_EQ(got.size(), 2u);
  d.abort_stale(got[1].first, got[1].second, true, 99);  // in reverse order
  d.abort_stale(got[0].first, got[0].second, true, 99);
  EXPECT_EQ(d.oldest_incomplete(), 10u);
  EXPECT_EQ(d.incomplete_bindings(), 3u);
  EXPECT_EQ(take_stale(d, 12, 10), (std::vector<std::string>{kA, kB, kC}));
}

TEST(DirectoryStale, ADeleteOfAnIncompleteKeyStopsTrackingIt) {
  directory d;
  d.add_confirmation(kA, 3, 10);
  d.add_confirmation(kA, 3, 10);
  ASSERT_EQ(d.begin_removal(kA, 20), directory::removal::started);
  EXPECT_EQ(d.incomplete_count(), 0u);
  EXPECT_EQ(d.incomplete_bindings(), 0u);
  d.add_confirmation(kA, 3, 25);              // a confirmation during the removal
  EXPECT_FALSE(d.finish_removal(kA, 2, 30));  // it stays, 1 of 3, confirmed now
  EXPECT_EQ(d.incomplete_count(), 1u);
  EXPECT_EQ(d.incomplete_bindings(), 1u);
  EXPECT_EQ(d.oldest_incomplete(), 30u);
}

TEST(DirectoryStale, RestoredIncompleteKeysStartTheirGraceAtRecovery) {
  directory d;
  d.add_confirmation(kA, 4, 1);
  d.restore(kA, 4, 2, 100);  // replaces the entry: 2 of 4
  d.restore(kB, 2, 2, 100);  // complete
  EXPECT_EQ(d.incomplete_count(), 1u);
  EXPECT_EQ(d.incomplete_bindings(), 2u);
  EXPECT_EQ(d.oldest_incomplete(), 100u);
}

TEST(DirectoryStale, NonHexKeysAreTrackedToo) {
  directory d;
  d.add_confirmation("short key", 2, 5);
  d.add_confirmation(kA, 2, 6);
  EXPECT_EQ(take_stale(d, 10, 10), (std::vector<std::string>{"short key", kA}));
}

// Random confirmations, removals (deletes, stale takes, put-backs), restores and clears
// against a model: the counts, the oldest time and every take agree.
TEST(DirectoryStale, AgreesWithAModelUnderRandomOperations) {
  struct entry {
    std::int32_t tp = 0, count = 0;
    std::uint64_t confirmed = 0;
    bool removing = false;
  };
  std::mt19937_64 rng(20261201);
  for (int round = 0; round < 20; ++round) {
    directory d;
    std::map<std::string, entry> model;
    std::vector<std::string> taken;  // removals begun by take_stale, not yet settled
    std::uint64_t now = 1;
    auto key_of = [](std::uint64_t i) {
      return i % 3 == 0 ? fmt::format("k{}", i) : fmt::format("{:032x}", i);
    };
    auto incomplete = [](const entry& e) { return !e.removing && e.count < e.tp; };
    for (int step = 0; step < 3000; ++step) {
      now += rng() % 3;
      const std::string key = key_of(rng() % 40);
      const unsigned op = rng() % 100;
      if (op < 55) {
        auto it = model.find(key);
        const std::int32_t tp = 1 + static_cast<std::int32_t>(rng() % 4);
        d.add_confirmation(key, tp, now);
        if (it == model.end()) {
          model[key] = {tp, 1, now, false};
        } else {
          entry& e = it->second;
          if (!e.removing && e.count < e.tp) e.confirmed = now;
          ++e.count;
        }
      } else if (op < 65) {  // a delete, settled at once with one binding dropped
        auto it = model.find(key);
        const auto r = d.begin_removal(key, now);
        if (it == model.end()) {
          EXPECT_EQ(r, directory::removal::absent);
          continue;
        }
        if (it->second.removing) {
          EXPECT_EQ(r, directory::removal::busy);
          continue;
        }
        ASSERT_EQ(r, directory::removal::started);
        const std::int32_t left = it->second.count - 1;
        EXPECT_EQ(d.finish_removal(key, 1, now), left <= 0);
        if (left <= 0) {
          model.erase(it);
        } else {
          it->second.count = left;
          it->second.confirmed = now;
        }
      } else if (op < 80) {  // stale take up to a random cutoff
        const std::uint64_t cutoff = now - std::min<std::uint64_t>(now, rng() % 50);
        const std::size_t n = 1 + rng() % 4;
        std::vector<std::pair<std::uint64_t, std::string>> want;
        for (const auto& [k, e] : model)
          if (incomplete(e) && e.confirmed <= cutoff) want.emplace_back(e.confirmed, k);
        std::sort(want.begin(), want.end());
        const std::vector<std::string> got = take_stale(d, cutoff, n);
        ASSERT_EQ(got.size(), std::min(n, want.size()));
        for (std::size_t i = 0; i < got.size(); ++i) {
          // Keys last confirmed at the same time may come in any order among themselves.
          EXPECT_EQ(model[got[i]].confirmed, want[i].first) << got[i];
          model[got[i]].removing = true;
        }
        // A tail of them passed over at once (as an eviction does): back in their places,
        // in reverse; the others stay taken, to be settled or called off later.
        const std::size_t keep = rng() % (got.size() + 1);
        for (std::size_t i = got.size(); i-- > keep;) {
          d.abort_stale(got[i], model[got[i]].confirmed, true, now);
          model[got[i]].removing = false;
        }
        taken.insert(taken.end(), got.begin(), got.begin() + static_cast<std::ptrdiff_t>(keep));
      } else if (op < 90 && !taken.empty()) {  // settle or call off a taken key
        const std::size_t at = rng() % taken.size();
        const std::string k = taken[at];
        taken.erase(taken.begin() + static_cast<std::ptrdiff_t>(at));
        entry& e = model[k];
        if (rng() % 2 == 0) {
          d.abort_stale(k, e.confirmed, false, now);
          e.removing = false;
          e.confirmed = now;
        } else {
          EXPECT_EQ(d.finish_removal(k, e.count, now), true);
          model.erase(k);
        }
      } else if (op < 99) {  // recovery of one key
        auto it = model.find(key);
        if (it != model.end() && it->second.removing) continue;
        const std::int32_t tp = 1 + static_cast<std::int32_t>(rng() % 4);
        const std::int32_t count = 1 + static_cast<std::int32_t>(rng() % 4);
        d.restore(key, tp, count, now);
        model[key] = {tp, count, now, false};
      } else {
        d.clear();
        model.clear();
        taken.clear();
      }
      std::size_t keys = 0;
      std::uint64_t pages = 0, oldest = UINT64_MAX;
      for (const auto& [k, e] : model) {
        if (!incomplete(e)) continue;
        ++keys;
        pages += static_cast<std::uint64_t>(e.count);
        oldest = std::min(oldest, e.confirmed);
      }
      ASSERT_EQ(d.incomplete_count(), keys) << "step " << step;
      ASSERT_EQ(d.incomplete_bindings(), pages) << "step " << step;
      ASSERT_EQ(d.oldest_incomplete(), oldest) << "step " << step;
      ASSERT_EQ(d.size(), model.size());
      ASSERT_EQ(d.verify(), "") << "step " << step;
    }
  }
}

}  // namespace
}  // namespace metad::shard
