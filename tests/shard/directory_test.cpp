#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "shard/directory.hpp"
#include "shard/ownership.hpp"
#include "shard/packed_key.hpp"

namespace metad::shard {
namespace {

TEST(Directory, UnknownKeyIsIncomplete) {
  directory d;
  EXPECT_FALSE(d.complete("k"));
  EXPECT_EQ(d.size(), 0u);
}

class DirectoryTp : public ::testing::TestWithParam<std::int32_t> {};

TEST_P(DirectoryTp, CompleteOnceTpRanksConfirmed) {
  const std::int32_t tp = GetParam();
  directory d;
  d.add_confirmation("k", tp, 0);
  for (std::int32_t n = 1; n < tp; ++n) {
    EXPECT_FALSE(d.complete("k")) << n;
    d.add_confirmation("k", tp, 0);
  }
  EXPECT_TRUE(d.complete("k"));
  // Over-confirmation (more ranks than expected) stays complete: >=, not ==.
  d.add_confirmation("k", tp, 0);
  d.add_confirmation("k", 99, 0);  // a later tp size does not change the recorded one
  EXPECT_TRUE(d.complete("k"));
  EXPECT_EQ(d.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, DirectoryTp, ::testing::Values(0, 1, 2, 8));

TEST(Directory, FirstConfirmationRecordsTpWorldSize) {
  directory d;
  d.add_confirmation("k", 2, 0);
  d.add_confirmation("k", 1, 0);  // would complete under tp 1, but the key keeps tp 2
  EXPECT_TRUE(d.complete("k"));
  d.add_confirmation("j", 3, 0);
  d.add_confirmation("j", 1, 0);
  EXPECT_FALSE(d.complete("j"));
  d.add_confirmation("j", 1, 0);
  EXPECT_TRUE(d.complete("j"));
}

TEST(Directory, KeysAreIndependent) {
  directory d;
  d.add_confirmation("a", 1, 0);
  d.add_confirmation("b", 2, 0);
  EXPECT_TRUE(d.complete("a"));
  EXPECT_FALSE(d.complete("b"));
  EXPECT_FALSE(d.complete("c"));
  EXPECT_EQ(d.size(), 2u);
}

// A shrunk rank loses a binding without a removal: both key forms, complete keys become
// incomplete (leases end), the last binding takes the key out, a binding whose
// confirmation has not arrived yet absorbs it, and a removal in progress counts one less.
TEST(Directory, LostBindingsCountOneLess) {
  for (const std::string& key : {std::string(32, 'a'), std::string("odd key")}) {
    SCOPED_TRACE(key);
    directory d;
    d.add_confirmation(key, 2, 1);
    d.add_confirmation(key, 2, 1);
    ASSERT_TRUE(d.use(key, 2, 100));  // leased until 100
    EXPECT_FALSE(d.lose_binding(key, 3));
    EXPECT_FALSE(d.complete(key));
    EXPECT_EQ(d.incomplete_count(), 1u);
    EXPECT_EQ(d.incomplete_bindings(), 1u);
    EXPECT_EQ(d.leased_count(3), 0u);
    EXPECT_TRUE(d.lose_binding(key, 4)) << "the last binding: the key leaves";
    EXPECT_EQ(d.size(), 0u);
    EXPECT_EQ(d.incomplete_count(), 0u);

    EXPECT_FALSE(d.lose_binding(key, 5)) << "its confirmation is on the way";
    EXPECT_FALSE(d.add_confirmation(key, 1, 6)) << "... and absorbed";
    EXPECT_EQ(d.size(), 0u);

    d.add_confirmation(key, 1, 7);
    ASSERT_EQ(d.begin_removal(key, 8), directory::removal::started);
    EXPECT_FALSE(d.lose_binding(key, 9));
    EXPECT_TRUE(d.finish_removal(key, 0, 10)) << "no binding was left for the removal";
    EXPECT_EQ(d.size(), 0u);
  }
}

TEST(Directory, ClearDropsEveryKey) {
  directory d;
  for (int i = 0; i < 1000; ++i) d.add_confirmation(std::to_string(i), 1, 0);
  EXPECT_EQ(d.size(), 1000u);
  EXPECT_TRUE(d.complete("999"));
  d.clear();
  EXPECT_EQ(d.size(), 0u);
  EXPECT_FALSE(d.complete("999"));
  d.add_confirmation("999", 2, 0);
  EXPECT_FALSE(d.complete("999"));
}

TEST(Directory, SliceOfOneCoreStillFindsEveryKey) {
  // A core's slice holds keys with equal key_hash mod cores; the table must cope.
  directory d;
  std::vector<std::string> mine;
  for (int i = 0; mine.size() < 20000; ++i) {
    std::string k = "key-" + std::to_string(i);
    if (owner_of_key(k, 16) == 5) mine.push_back(k);
  }
  for (const auto& k : mine) d.add_confirmation(k, 1, 0);
  EXPECT_EQ(d.size(), mine.size());
  for (const auto& k : mine) ASSERT_TRUE(d.complete(k));
}

TEST(Directory, MovedDirectoryKeepsItsState) {
  directory d;
  d.add_confirmation("k", 1, 0);
  directory moved(std::move(d));
  EXPECT_TRUE(moved.complete("k"));
  directory assigned;
  assigned = std::move(moved);
  EXPECT_TRUE(assigned.complete("k"));
}

namespace staging {

// Keys of every form a directory stores: 32 lowercase hex (packed), 64 hex of either case
// (wide), and any other text.
std::string staged_key(int i) {
  switch (i % 4) {
    case 0:
      return fmt::format("{:032x}", 0x5ee0000u + static_cast<unsigned>(i));
    case 1:
      return fmt::format("{:064x}", 0x5ee0000u + static_cast<unsigned>(i));
    case 2:
      return fmt::format("{:064X}", 0x5ee0000u + static_cast<unsigned>(i));
    default:
      return "other-" + std::to_string(i);
  }
}

struct model_entry {
  std::optional<std::int32_t> tp;  // named (the smallest name since the last forget)
  std::int32_t count = 0;
};

}  // namespace staging

// A hot standby's directory until promotion: names (directory records, in their core's
// order) and counts (bindings gained and lost, from other cores, in any order relative
// to the names) arrive interleaved; forgets unname a key but keep its count. Finished, it
// holds exactly the keys with a binding, each with its smallest name since its last
// forget, or the fallback when none; after each step the staging invariants hold.
TEST(DirectoryStaging, NamesAndCountsInAnyOrderFinishAsTheModelSays) {
  using staging::staged_key;
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    directory d;
    d.restore_reserve(0);
    std::map<std::string, staging::model_entry> model;
    const int keys = 24;
    for (int step = 0; step < 600; ++step) {
      const std::string k = staged_key(static_cast<int>(rng() % keys));
      staging::model_entry& m = model[k];
      const unsigned op = rng() % 100;
      if (op < 25) {
        const auto tp = static_cast<std::int32_t>(rng() % 5);  // 0 too: complete at once
        d.restore_key(k, tp);
        m.tp = m.tp ? std::min(*m.tp, tp) : tp;
      } else if (op < 32) {
        d.restore_forget(k);
        m.tp.reset();
      } else if (op < 33) {
        d.restore_forget_all();
        for (auto& [key, e] : model) e.tp.reset();
      } else if (op < 70) {
        packed_key packed;
        if (rng() % 2 == 0 && pack_hex_key(k, packed))
          EXPECT_EQ(d.restore_count(std::span<const packed_key>(&packed, 1), directory::unnamed_tp),
                    0u);
        else
          EXPECT_EQ(d.restore_count(k, directory::unnamed_tp), 0u);
        ++m.count;
      } else if (m.count > 0) {
        packed_key packed;
        if (rng() % 2 == 0 && pack_hex_key(k, packed))
          d.restore_uncount(std::span<const packed_key>(&packed, 1));
        else
          d.restore_uncount(k);
        --m.count;
      }
      ASSERT_EQ(d.verify(), "") << "step " << step;
    }
    const std::int32_t fallback = 3;
    std::size_t unnamed = 0;
    std::map<std::string, std::pair<std::int32_t, std::int32_t>> expected, got;
    for (const auto& [key, e] : model) {
      if (e.count == 0) continue;
      if (!e.tp) ++unnamed;
      expected[key] = {e.tp.value_or(fallback), e.count};
    }
    EXPECT_EQ(d.restore_finish(0, fallback), unnamed);
    ASSERT_EQ(d.verify(), "");
    d.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t count) {
      got[std::string(key)] = {tp, count};
    });
    EXPECT_EQ(got, expected);
    for (const auto& [key, v] : expected) EXPECT_EQ(d.complete(key), v.second >= v.first) << key;
  }
}

// Counts past the packed word's 16 bits stay exact while staged (a key held by more than
// 65534 ranks moves to the other form), so that they come down exactly.
TEST(DirectoryStaging, CountsPastSixteenBitsStayExact) {
  const std::string k = staging::staged_key(0);
  packed_key packed;
  ASSERT_TRUE(pack_hex_key(k, packed));
  directory d;
  d.restore_reserve(0);
  d.restore_key(k, 70000);
  std::vector<packed_key> many(70001, packed);
  d.restore_count(many, directory::unnamed_tp);
  d.restore_uncount(std::span<const packed_key>(many.data(), 2));
  ASSERT_EQ(d.verify(), "");
  EXPECT_EQ(d.restore_finish(0, 1), 0u);
  EXPECT_FALSE(d.complete(k));  // 69999 of 70000
  d.for_each_key([&](std::string_view, std::int32_t tp, std::int32_t count) {
    EXPECT_EQ(tp, 70000);
    EXPECT_EQ(count, 69999);
  });
}

}  // namespace
}  // namespace metad::shard

namespace metad::shard {
namespace {

// tp_world_size at and around the staged word's unnamed tp bits (0xFFFF): 65535 is a name
// like any other (kept in the other form), 65534 the largest the packed word holds; and a
// fallback of 65535 for keys left unnamed.
TEST(DirectoryStaging, TpsAtTheUnnamedBitsAreNamesLikeAnyOther) {
  const std::string a = staging::staged_key(0), b = staging::staged_key(4),
                    c = staging::staged_key(8), w = staging::staged_key(1);
  packed_key pa, pb;
  ASSERT_TRUE(pack_hex_key(a, pa));
  ASSERT_TRUE(pack_hex_key(b, pb));
  directory d;
  d.restore_reserve(0);
  d.restore_key(pa, 65535);
  d.restore_key(pb, 65534);
  d.restore_key(w, 65535);
  d.restore_count(std::span<const packed_key>(&pa, 1), directory::unnamed_tp);
  d.restore_count(std::span<const packed_key>(&pb, 1), directory::unnamed_tp);
  d.restore_count(w, directory::unnamed_tp);
  d.restore_count(c, directory::unnamed_tp);  // never named
  d.restore_forget(b);
  d.restore_key(b, 65535);
  ASSERT_EQ(d.verify(), "");
  EXPECT_EQ(d.restore_finish(0, 65535), 1u);
  ASSERT_EQ(d.verify(), "");
  std::map<std::string, std::pair<std::int32_t, std::int32_t>> got;
  d.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t count) {
    got[std::string(key)] = {tp, count};
  });
  const std::map<std::string, std::pair<std::int32_t, std::int32_t>> expected{
      {a, {65535, 1}}, {b, {65535, 1}}, {c, {65535, 1}}, {w, {65535, 1}}};
  EXPECT_EQ(got, expected);
  for (const auto& [key, v] : expected) EXPECT_FALSE(d.complete(key)) << key;
}

}  // namespace
}  // namespace metad::shard
