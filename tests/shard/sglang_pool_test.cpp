// sglang_pool: each rule of docs/sglang-api.md and each of its Fixes (B4, B5, B6, B7, B9, B10,
// B17, B18), with the reference's page numbers where the contract fixes them.
#include "shard/sglang_pool.hpp"

#include <gtest/gtest.h>

#include "sglang_helpers.hpp"
#include "shard/sglang_pools.hpp"

namespace metad::shard {
namespace {

using namespace shard::sg_testing;

// ---------------------------------------------------------------------------------------
// Page order

TEST(SglangPool, FreshPoolHandsOutHighestPageFirst) {
  sglang_pool pool(4);
  EXPECT_EQ(reserve(pool, {"a", "b"}), S({{false, 3}, {false, 2}}));
  EXPECT_EQ(reserve(pool, {"c"}), S({{false, 1}}));
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0}));
}

TEST(SglangPool, FreedPagesAreHandedOutNextMostRecentFirst) {
  sglang_pool pool(8);
  EXPECT_EQ(store(pool, {"a", "b", "c"}), (ints{7, 6, 5}));
  EXPECT_EQ(del(pool, {"c", "a"}), 2u);  // pushes 5, then 7
  EXPECT_EQ(reserve(pool, {"x", "y", "z"}), S({{false, 7}, {false, 5}, {false, 4}}));
}

TEST(SglangPool, ReleasedPagesReturnOnTopInReleaseOrder) {
  sglang_pool pool(4);
  reserve(pool, {"a", "b"});  // 3, 2
  EXPECT_EQ(confirm(pool, {}, {}, {3, 2}), "");
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 3, 2}));
  EXPECT_EQ(reserve(pool, {"c"}), S({{false, 2}}));
}

TEST(SglangPool, EmptyBatchAndZeroCapacity) {
  sglang_pool pool(0);
  EXPECT_EQ(reserve(pool, {}), slots{});
  EXPECT_EQ(reserve(pool, {"a", "b"}), S({{false, -1}, {false, -1}}));
  EXPECT_EQ(exists(pool, {"a"}), std::vector<bool>{false});
}

// ---------------------------------------------------------------------------------------
// Reserve: hits, in-flight keys, eviction, -1

TEST(SglangPool, BoundKeyIsAHitAndTakesNoPage) {
  sglang_pool pool(4);
  store(pool, {"a"});  // 3
  sglang_reserve_stats st;
  EXPECT_EQ(reserve(pool, {"b", "a"}, 0, &st), S({{false, 2}, {true, 3}}));
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.allocated, 1u);
}

TEST(SglangPool, InFlightKeyIsInvisibleAndGetsAnotherPage) {
  sglang_pool pool(4);
  EXPECT_EQ(reserve(pool, {"a"}), S({{false, 3}}));
  EXPECT_EQ(exists(pool, {"a"}), std::vector<bool>{false});
  EXPECT_EQ(get(pool, {"a"}), ints{-1});
  EXPECT_EQ(reserve(pool, {"a"}), S({{false, 2}}));  // not a hit, not reissued
}

TEST(SglangPool, FullPoolEvictsTheLeastRecentlyUsedKeyAtOnce) {
  sglang_pool pool(2);
  store(pool, {"a", "b"});  // a:1, b:0
  sglang_reserve_stats st;
  EXPECT_EQ(reserve(pool, {"c"}, 0, &st), S({{false, 1}}));
  EXPECT_EQ(st.evicted, 1u);
  EXPECT_EQ(exists(pool, {"a", "b", "c"}), (std::vector<bool>{false, true, false}));
}

TEST(SglangPool, RecencyFollowsHitsConfirmsAndGetsButNotExists) {
  sglang_pool pool(3);
  store(pool, {"a", "b", "c"});                      // LRU a, b, c
  exists(pool, {"a"});                               // no recency
  get(pool, {"b"});                                  // b to MRU: a, c, b
  EXPECT_EQ(reserve(pool, {"x"}), S({{false, 2}}));  // evicts a (page 2)
  reserve(pool, {"c"});                              // hit: b, c
  EXPECT_EQ(reserve(pool, {"y"}), S({{false, 1}}));  // evicts b (page 1)
  EXPECT_EQ(exists(pool, {"a", "b", "c"}), (std::vector<bool>{false, false, true}));
}

TEST(SglangPool, ConfirmMovesTheKeyToTheMostRecentEnd) {
  sglang_pool pool(2);
  store(pool, {"a", "b"});                   // a:1 b:0, LRU a, b
  EXPECT_EQ(confirm(pool, {"a"}, {1}), "");  // the same binding again: a to MRU
  reserve(pool, {"c"});
  EXPECT_EQ(exists(pool, {"a", "b"}), (std::vector<bool>{true, false}));
}

TEST(SglangPool, MinusOneOnlyWhenEveryPageIsInFlight) {
  sglang_pool pool(2);
  EXPECT_EQ(reserve(pool, {"a", "b", "c"}), S({{false, 1}, {false, 0}, {false, -1}}));
  sglang_reserve_stats st;
  EXPECT_EQ(reserve(pool, {"d"}, 0, &st), S({{false, -1}}));
  EXPECT_EQ(st.no_page, 1u);
}

TEST(SglangPool, AllocationIsPerKeyAndEvictsWithinOneBatch) {
  sglang_pool pool(3);
  store(pool, {"a", "b"});  // a:2 b:1, page 0 free
  EXPECT_EQ(reserve(pool, {"x", "y", "z", "w"}),
            S({{false, 0}, {false, 2}, {false, 1}, {false, -1}}));
  EXPECT_EQ(exists(pool, {"a", "b"}), (std::vector<bool>{false, false}));
}

// reserve_capped (a tenant's pages=N): at most fresh_max keys take a free (or
// quarantined) page; the rest are answered as by a full pool: evictions, else -1.
TEST(SglangPool, ACappedReserveTakesAtMostThatManyFreePages) {
  sglang_pool pool(4);
  store(pool, {"a", "b"});  // a:3 b:2, pages 1 and 0 free
  slots out;
  const strs names = {"x", "y", "z", "w"}, repeated = {"v", "v"}, three = {"k", "l", "m"};
  const auto keys = views(names);
  const sglang_reserve_stats st = pool.reserve_capped(keys, 0, out, 1);
  EXPECT_EQ(out, S({{false, 1}, {false, 3}, {false, 2}, {false, -1}}));  // 0 stays free
  EXPECT_EQ(st.allocated, 3u);
  EXPECT_EQ(st.evicted, 2u);
  EXPECT_EQ(pool.verify(), "");
  EXPECT_EQ(pool.held(), 3u);
  // A repeat and a hit take nothing of the cap; 0: a full pool's answer (nothing bound).
  const auto more = views(repeated);
  EXPECT_EQ((pool.reserve_capped(more, 0, out, 0), out), S({{false, -1}, {false, -1}}));
  EXPECT_EQ((pool.reserve_capped(more, 0, out, 1), out), S({{false, 0}, {false, 0}}));
  EXPECT_EQ(pool.held(), 4u);
  // reserve(fresh) is the cap's two ends.
  sglang_pool a(2), b(2);
  slots with_a, with_b;
  a.reserve(views(three), 0, with_a, true);
  b.reserve_capped(views(three), 0, with_b, UINT64_MAX);
  EXPECT_EQ(with_a, with_b);
}

TEST(SglangPool, DuplicateKeysInOneBatchShareOneAnswer_B4) {
  sglang_pool pool(4);
  EXPECT_EQ(reserve(pool, {"a", "b", "a", "a"}),
            S({{false, 3}, {false, 2}, {false, 3}, {false, 3}}));
  EXPECT_EQ(pool.stats().free, 2u);
  EXPECT_EQ(confirm(pool, {"a", "b", "a"}, {3, 2, 3}), "");
  EXPECT_EQ(pool.stats().bound, 2u);
  EXPECT_EQ(pool.stats().free, 2u);  // nothing orphaned
  EXPECT_EQ(reserve(pool, {"a", "a"}), S({{true, 3}, {true, 3}}));
}

TEST(SglangPool, DuplicateOfAKeyWithoutPageCopiesMinusOne) {
  sglang_pool pool(1);
  reserve(pool, {"a"});
  EXPECT_EQ(reserve(pool, {"b", "b"}), S({{false, -1}, {false, -1}}));
}

TEST(SglangPool, AHitIsNeverEvictedByItsOwnBatch_B5) {
  sglang_pool pool(1);
  store(pool, {"a"});
  // The reference answers [[true,0],[false,0]]: page 0 promised twice.
  EXPECT_EQ(reserve(pool, {"a", "b"}), S({{true, 0}, {false, -1}}));
  EXPECT_EQ(exists(pool, {"a"}), std::vector<bool>{true});
  // Order does not matter: the hit is found in pass 1.
  EXPECT_EQ(reserve(pool, {"b", "a"}), S({{false, -1}, {true, 0}}));
}

TEST(SglangPool, EvictionSkipsHitsButTakesOtherKeys_B5) {
  sglang_pool pool(2);
  store(pool, {"a", "b"});  // a:1 b:0, LRU a, b
  EXPECT_EQ(reserve(pool, {"a", "c", "d"}), S({{true, 1}, {false, 0}, {false, -1}}));
  EXPECT_EQ(exists(pool, {"a", "b"}), (std::vector<bool>{true, false}));
}

// ---------------------------------------------------------------------------------------
// confirm_write

TEST(SglangPool, OutOfRangePagesAreRefusedAndNothingIsApplied_B9) {
  sglang_pool pool(4);
  reserve(pool, {"a", "b"});  // 3, 2
  EXPECT_EQ(confirm(pool, {"a", "b"}, {3, 4}),
            "Page 4 at index 1 of written_keys_to_confirm is out of range: the pool has 4 pages");
  EXPECT_EQ(confirm(pool, {"a"}, {-1}),
            "Page -1 at index 0 of written_keys_to_confirm is out of range: the pool has 4 pages");
  EXPECT_EQ(confirm(pool, {"a"}, {3}, {2, 999}),
            "Page 999 at index 1 of pages_to_release is out of range: the pool has 4 pages");
  EXPECT_EQ(exists(pool, {"a", "b"}), (std::vector<bool>{false, false}));
  EXPECT_EQ(pool.stats().in_flight, 2u);
}

TEST(SglangPool, ConfirmingAndReleasingOnePageIsRefused) {
  sglang_pool pool(4);
  reserve(pool, {"a"});
  EXPECT_EQ(confirm(pool, {"a"}, {3}, {3}), "Page 3 is both confirmed and released");
  EXPECT_EQ(pool.stats().in_flight, 1u);
}

TEST(SglangPool, ConfirmBindsOnlyItsOwnReservation_B6) {
  sglang_pool pool(4);
  reserve(pool, {"a", "b"});  // a:3 b:2
  sglang_confirm_stats st;
  // x: a free page; a: its own; b: a's page once bound; a: b's reservation.
  EXPECT_EQ(confirm(pool, {"x", "a", "b", "a"}, {1, 3, 3, 2}, {}, 0, &st), "");
  EXPECT_EQ(st.bound, 1u);
  EXPECT_EQ(st.skipped, 3u);
  EXPECT_EQ(exists(pool, {"x", "a", "b"}), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(get(pool, {"a"}), ints{3});
  EXPECT_EQ(pool.stats().in_flight, 1u);  // b still holds 2
}

TEST(SglangPool, ConfirmOfAnotherKeysBoundPageIsSkipped_B6) {
  sglang_pool pool(4);
  store(pool, {"a"});  // 3
  sglang_confirm_stats st;
  EXPECT_EQ(confirm(pool, {"b"}, {3}, {}, 0, &st), "");
  EXPECT_EQ(st.skipped, 1u);
  EXPECT_EQ(get(pool, {"a", "b"}), (ints{3, -1}));
}

TEST(SglangPool, TwoReservationsOfOneKeyKeepTheLastConfirmedPage) {
  sglang_pool pool(4);
  reserve(pool, {"a"});  // 3
  reserve(pool, {"a"});  // 2 (in flight keys are not hits)
  sglang_confirm_stats st;
  EXPECT_EQ(confirm(pool, {"a", "a"}, {3, 2}, {}, 0, &st), "");
  EXPECT_EQ(st.rebound_freed, 1u);
  EXPECT_EQ(get(pool, {"a"}), ints{2});
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 3}));
}

TEST(SglangPool, ReleasesFreeInFlightPagesOnly_B7) {
  sglang_pool pool(4);
  store(pool, {"a"});    // 3
  reserve(pool, {"b"});  // 2
  sglang_confirm_stats st;
  EXPECT_EQ(confirm(pool, {}, {}, {3, 2, 1, 2}, 0, &st), "");
  EXPECT_EQ(st.release_refused, 1u);  // bound to a
  EXPECT_EQ(st.released, 1u);         // b's reservation
  EXPECT_EQ(st.release_noop, 2u);     // free pages (1, and 2 once freed)
  EXPECT_EQ(get(pool, {"a"}), ints{3});
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 2}));
}

TEST(SglangPool, EmptyConfirmIsAccepted) {
  sglang_pool pool(2);
  EXPECT_EQ(confirm(pool, {}, {}), "");
}

// ---------------------------------------------------------------------------------------
// delete_keys, clear, get_page_indices

TEST(SglangPool, DeleteDropsBoundKeysOnlyAndCounts) {
  sglang_pool pool(4);
  store(pool, {"a", "b"});  // 3, 2
  reserve(pool, {"c"});     // 1, in flight: not deleted
  EXPECT_EQ(del(pool, {"a", "zz", "c", "a"}), 1u);
  EXPECT_EQ(exists(pool, {"a", "b"}), (std::vector<bool>{false, true}));
  EXPECT_EQ(pool.stats().in_flight, 1u);
  EXPECT_EQ(reserve(pool, {"d"}), S({{false, 3}}));
}

TEST(SglangPool, ClearFreesEveryPageAndKeepsTheSize) {
  sglang_pool pool(4);
  store(pool, {"a", "b"});
  pool.clear();
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(exists(pool, {"a", "b"}), (std::vector<bool>{false, false}));
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(reserve(pool, {"a"}), S({{false, 3}}));
}

TEST(SglangPool, AWriteReservedBeforeAClearNeverBinds_B17) {
  sglang_pool pool(4);
  reserve(pool, {"a", "b"});  // 3, 2
  pool.clear();
  EXPECT_EQ(pool.check(), "");
  // The pages in flight are not handed out again while their writers hold them.
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(reserve(pool, {"c"}), S({{false, 1}}));
  sglang_confirm_stats st;
  EXPECT_EQ(confirm(pool, {"a"}, {3}, {2}, 0, &st), "");
  EXPECT_EQ(st.stale, 1u);
  EXPECT_EQ(st.released, 1u);
  EXPECT_EQ(exists(pool, {"a"}), std::vector<bool>{false});
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 3, 2}));
  EXPECT_EQ(confirm(pool, {"c"}, {1}), "");  // this epoch's reservation binds
  EXPECT_EQ(get(pool, {"c"}), ints{1});
}

TEST(SglangPool, GetPageIndicesAnswersBoundPagesOrMinusOne) {
  sglang_pool pool(4);
  store(pool, {"a"});
  reserve(pool, {"b"});
  EXPECT_EQ(get(pool, {"a", "b", "zz", "a"}), (ints{3, -1, -1, 3}));
}

// ---------------------------------------------------------------------------------------
// Reservation expiry (B10) and read leases (B18)

TEST(SglangPool, ADeadWritersPagesComeBackAtTheDeadline_B10) {
  sglang_pool pool(4, sglang_config{.reservation_ttl = 100});
  reserve(pool, {"a", "b"}, 10);  // 3, 2 until 110
  reserve(pool, {"c"}, 50);       // 1 until 150
  std::vector<std::uint64_t> expired;
  EXPECT_EQ(pool.expire(109, &expired), 0u);
  EXPECT_EQ(pool.expire(110, &expired), 2u);
  EXPECT_EQ(expired, (std::vector<std::uint64_t>{3, 2}));
  EXPECT_EQ(pool.check(), "");
  // A late confirm of an expired reservation binds nothing (its page is free).
  sglang_confirm_stats st;
  EXPECT_EQ(confirm(pool, {"a"}, {3}, {}, 120, &st), "");
  EXPECT_EQ(st.skipped, 1u);
  // Reserve expires due reservations itself before it allocates.
  sglang_reserve_stats rs;
  EXPECT_EQ(reserve(pool, {"d"}, 150, &rs), S({{false, 1}}));
  EXPECT_EQ(rs.expired, 1u);
}

// --reservation-ttl lowered across a restart: the restored reservations are due after
// new ones, which still expire at their own deadline, and the image restores.
TEST(SglangPool, AShorterTtlAfterARestoreKeepsTheDeadlinesInOrder) {
  sglang_pool pool(4, sglang_config{.reservation_ttl = 1000});
  reserve(pool, {"a"}, 0);  // 3 until 1000
  const sglang_config shorter{.reservation_ttl = 100};
  sglang_pool copy(0);
  std::string error;
  ASSERT_TRUE(sglang_pool::restore(pool.image(), shorter, copy, error)) << error;
  reserve(copy, {"b"}, 10);  // 2 until 110
  reserve(copy, {"c"}, 20);  // 1 until 120
  std::vector<std::uint64_t> expired;
  EXPECT_EQ(copy.expire(110, &expired), 1u);
  EXPECT_EQ(expired, (std::vector<std::uint64_t>{2}));
  sglang_pool again(0);
  ASSERT_TRUE(sglang_pool::restore(copy.image(), shorter, again, error)) << error;
  EXPECT_EQ(again.check(), "");
  expired.clear();
  EXPECT_EQ(again.expire(1000, &expired), 2u);
  EXPECT_EQ(expired, (std::vector<std::uint64_t>{1, 3}));
}

TEST(SglangPool, ConfirmedReservationsDoNotExpire) {
  sglang_pool pool(2, sglang_config{.reservation_ttl = 5});
  store(pool, {"a"}, 0);
  EXPECT_EQ(pool.expire(1000), 0u);
  EXPECT_EQ(get(pool, {"a"}, 1000), ints{1});
}

TEST(SglangPool, WithoutATtlReservationsNeverExpire) {
  sglang_pool pool(2);
  reserve(pool, {"a"}, 0);
  EXPECT_EQ(pool.expire(UINT64_MAX), 0u);
  EXPECT_EQ(pool.stats().in_flight, 1u);
}

TEST(SglangPool, NoLeaseByDefault_B18) {
  sglang_pool pool(2);
  store(pool, {"a", "b"});
  get(pool, {"b"}, 0);
  get(pool, {"a"}, 0);  // a is the most recent; b is evicted despite the read
  EXPECT_EQ(reserve(pool, {"c"}, 1), S({{false, 0}}));
}

TEST(SglangPool, ALeasedKeyIsPassedOverByEviction_B18) {
  sglang_pool pool(2, sglang_config{.read_lease = 10});
  store(pool, {"a", "b"});                                 // a:1 b:0, LRU a, b
  get(pool, {"a"}, 100);                                   // a leased until 110, LRU b, a
  get(pool, {"b"}, 100);                                   // b leased until 110, LRU a, b
  EXPECT_EQ(reserve(pool, {"c"}, 105), S({{false, -1}}));  // both leased
  EXPECT_EQ(reserve(pool, {"c"}, 110), S({{false, 1}}));   // a's lease ended
  get(pool, {"b"}, 200);
  EXPECT_EQ(exists(pool, {"a", "b"}), (std::vector<bool>{false, true}));
}

// ---------------------------------------------------------------------------------------
// Growth, images, the registry

TEST(SglangPool, GrowingPushesTheNewPagesOnTop) {
  sglang_pool pool(2);
  reserve(pool, {"a"});  // 1
  pool.grow(4);
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(reserve(pool, {"b", "c", "d", "e"}),
            S({{false, 3}, {false, 2}, {false, 0}, {false, -1}}));
}

TEST(SglangPool, ImageRestoresTheSameFuture) {
  sglang_config config{.reservation_ttl = 50, .read_lease = 0};
  sglang_pool pool(6, config);
  store(pool, {"a", "b", "c"}, 0);
  del(pool, {"b"});
  reserve(pool, {"d", "e"}, 10);
  get(pool, {"a"}, 11);
  const sglang_image img = pool.image();
  sglang_pool copy(0);
  std::string error;
  ASSERT_TRUE(sglang_pool::restore(img, config, copy, error)) << error;
  EXPECT_EQ(copy.check(), "");
  EXPECT_EQ(copy.image().free, img.free);
  EXPECT_EQ(copy.image().bound, img.bound);
  EXPECT_EQ(copy.image().reserved.size(), img.reserved.size());
  for (sglang_pool* p : {&pool, &copy}) {
    EXPECT_EQ(reserve(*p, {"f", "g", "h", "i"}, 60),
              S({{false, 2}, {false, 4}, {false, 1}, {false, 0}}));
  }
}

TEST(SglangPool, RestoreRefusesBadImagesAndLeavesUnownedPagesBindable) {
  std::string error;
  sglang_pool out(0);
  sglang_image img;
  img.num_pages = 4;
  img.free = {{0, 1}, {0, 1}};
  EXPECT_FALSE(sglang_pool::restore(img, {}, out, error));
  EXPECT_EQ(error, "free pages out of range (num_pages 4) or listed twice");
  img.free = {{0, 1}};
  img.bound = {{"a", 4}};
  EXPECT_FALSE(sglang_pool::restore(img, {}, out, error));
  EXPECT_EQ(error, "bound page 4 is out of range (num_pages 4)");
  img.bound = {{"a", 1}, {"a", 2}};
  EXPECT_FALSE(sglang_pool::restore(img, {}, out, error));
  EXPECT_EQ(error, "bound key 'a' is listed twice");
  img.bound = {{"a", 1}};
  img.reserved = {{2, "c", 1, sglang_pool::no_deadline}};
  EXPECT_FALSE(sglang_pool::restore(img, {}, out, error));
  EXPECT_EQ(error, "reserved page 2: epoch 1 is past the pool's 0");
  img.reserved.clear();
  ASSERT_TRUE(sglang_pool::restore(img, {}, out, error)) << error;
  EXPECT_EQ(out.stats().unowned, 2u);  // pages 2 and 3: leaked before the image
  sglang_confirm_stats st;
  EXPECT_EQ(confirm(out, {"b", "a"}, {3, 2}, {}, 0, &st), "");  // unowned pages bind
  EXPECT_EQ(st.bound, 2u);
  EXPECT_EQ(get(out, {"a", "b"}), (ints{2, 3}));
  EXPECT_EQ(free_stack(out), (std::vector<std::uint32_t>{0, 1}));  // a's old page
}

// ---------------------------------------------------------------------------------------
// Keys: 32- and 64-hex keys are stored packed, every key comes back as it was sent

namespace {
const std::string hex64_lower = "0123456789abcdef0123456789abcdef00112233445566778899aabbccddeeff";
const std::string hex64_upper = "0123456789ABCDEF0123456789ABCDEF00112233445566778899AABBCCDDEEFF";
const std::string hex64_mixed = "0123456789ABCDEF0123456789abcdef00112233445566778899aabbccddeeff";
const std::string hex32_lower = "0123456789abcdef0123456789abcdef";
const std::string hex32_upper = "0123456789ABCDEF0123456789ABCDEF";
}  // namespace

TEST(SglangPoolKeys, EveryShapeIsItsOwnKeyAndComesBackAsSent) {
  sglang_pool pool(16);
  const strs keys{hex64_upper, hex64_lower,       hex64_mixed, hex32_lower,
                  hex32_upper, hex32_lower + "x", "k1"};
  const ints pages = store(pool, keys);
  EXPECT_EQ(pages, (ints{15, 14, 13, 12, 11, 10, 9}));  // seven keys, seven pages
  EXPECT_EQ(get(pool, keys), pages);
  const sglang_image img = pool.image();
  ASSERT_EQ(img.bound.size(), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(img.bound[i].first, keys[i]);  // case included
    EXPECT_EQ(img.bound[i].second, static_cast<std::uint64_t>(pages[i]));
  }
  // Case is identity: the other case of a stored key is another key.
  EXPECT_EQ(exists(pool, {"0123456789abcdef0123456789abcdef00112233445566778899AABBCCDDEEFF",
                          hex32_lower.substr(0, 31) + "F", hex64_upper}),
            (std::vector<bool>{false, false, true}));
  std::vector<std::string_view> v{hex64_upper};
  std::vector<sglang_key_report> report(1);
  pool.inspect(v, report);
  EXPECT_EQ(report[0].page, 15);
  EXPECT_EQ(pool.verify(), "");
}

TEST(SglangPoolKeys, PackedKeysSurviveEvictionDeleteRestoreAndClear) {
  sglang_pool pool(3, sglang_config{.reservation_ttl = 100, .read_lease = 0});
  EXPECT_EQ(store(pool, {hex64_upper, hex32_upper, hex64_lower}), (ints{2, 1, 0}));
  // A fourth key evicts the least recently used: the upper-case 64-hex key.
  EXPECT_EQ(reserve(pool, {hex64_mixed}, 1), S({{false, 2}}));
  EXPECT_EQ(exists(pool, {hex64_upper, hex64_lower}), (std::vector<bool>{false, true}));
  // In flight, the key comes back as sent from inspect's scan and the image.
  std::vector<std::string_view> v{hex64_mixed};
  std::vector<sglang_key_report> report(1);
  pool.inspect(v, report);
  EXPECT_EQ(report[0].reserved_page, 2);
  EXPECT_EQ(pool.image().reserved.at(0).key, hex64_mixed);
  EXPECT_EQ(del(pool, {hex32_upper, hex32_lower}), 1u);
  EXPECT_EQ(confirm(pool, {hex64_mixed}, {2}, {}, 2), "");
  const sglang_image img = pool.image();
  ASSERT_EQ(img.bound.size(), 2u);
  EXPECT_EQ(img.bound[0], (std::pair<std::string, std::uint64_t>{hex64_lower, 0}));
  EXPECT_EQ(img.bound[1], (std::pair<std::string, std::uint64_t>{hex64_mixed, 2}));
  sglang_pool copy(0);
  std::string error;
  ASSERT_TRUE(sglang_pool::restore(img, {}, copy, error)) << error;
  EXPECT_EQ(copy.verify(), "");
  EXPECT_EQ(copy.image().bound, img.bound);
  EXPECT_EQ(get(copy, {hex64_mixed, hex64_lower, hex64_upper}), (ints{2, 0, -1}));
  copy.clear();
  EXPECT_EQ(exists(copy, {hex64_lower}), (std::vector<bool>{false}));
  EXPECT_EQ(store(copy, {hex64_lower, hex64_upper}), (ints{2, 1}));
  EXPECT_EQ(copy.verify(), "");
}

TEST(SglangPoolKeys, PagesPast32BitsAreKeptWhole) {
  sglang_pool pool(std::uint64_t{1} << 47);
  const std::int64_t top = (std::int64_t{1} << 47) - 1;
  EXPECT_EQ(store(pool, {hex64_upper, "k"}), (ints{top, top - 1}));
  EXPECT_EQ(get(pool, {hex64_upper, "k"}), (ints{top, top - 1}));
  EXPECT_EQ(pool.image().bound.at(0).second, static_cast<std::uint64_t>(top));
  EXPECT_EQ(pool.verify(), "");
}

// The target (<= 72 bytes per binding with 64-hex keys), as the pool counts its
// own memory: a 64-byte node and a share of the bucket table, no key on the heap.
TEST(SglangPoolKeys, A64HexKeyCostsItsNodeAndABucket) {
  constexpr std::size_t n = 4096;
  sglang_pool pool(n);
  strs keys;
  for (std::size_t i = 0; i < n; ++i) {
    std::string k = hex64_lower;
    for (int d = 0; d < 4; ++d)
      k[static_cast<std::size_t>(d)] = "0123456789abcdef"[(i >> (4 * d)) & 15];
    keys.push_back(k);
  }
  const std::size_t before = pool.memory_bytes();
  for (std::size_t i = 0; i < n; i += 128) {
    store(pool, strs(keys.begin() + static_cast<std::ptrdiff_t>(i),
                     keys.begin() + static_cast<std::ptrdiff_t>(i + 128)));
  }
  EXPECT_EQ(pool.stats().keys, n);
  EXPECT_LE((pool.memory_bytes() - before) / n, 72u);
  EXPECT_EQ(pool.verify(), "");
}

TEST(SglangPools, PoolsAreIndependentPerRankAndNamespace) {
  sglang_pools pools;
  EXPECT_EQ(pools.initialize(0, "kv", 4).outcome, sglang_init::created);
  EXPECT_EQ(pools.initialize(0, "mamba", 2).outcome, sglang_init::created);
  EXPECT_EQ(pools.initialize(-1, "kv", 3).outcome, sglang_init::created);
  EXPECT_EQ(pools.find(1, "kv"), nullptr);
  EXPECT_EQ(pools.find(0, "kv")->num_pages(), 4u);
  store(*pools.find(0, "kv"), {"a"});
  EXPECT_EQ(exists(*pools.find(0, "mamba"), {"a"}), std::vector<bool>{false});
  pools.find(0, "mamba")->clear();
  EXPECT_EQ(exists(*pools.find(0, "kv"), {"a"}), std::vector<bool>{true});
  std::vector<std::string> order;
  pools.for_each([&](std::int64_t rank, std::string_view ns, const sglang_pool&) {
    order.push_back(std::to_string(rank) + ":" + std::string(ns));
  });
  EXPECT_EQ(order, (std::vector<std::string>{"0:kv", "0:mamba", "-1:kv"}));
}

TEST(SglangPools, ReinitialisingKeepsGrowsOrRefuses) {
  sglang_pools pools;
  pools.initialize(0, "kv", 4);
  store(*pools.find(0, "kv"), {"a"});
  EXPECT_EQ(pools.initialize(0, "kv", 4).outcome, sglang_init::unchanged);
  const auto smaller = pools.initialize(0, "kv", 2);
  EXPECT_EQ(smaller.outcome, sglang_init::smaller_ignored);
  EXPECT_EQ(smaller.old_pages, 4u);
  EXPECT_EQ(pools.find(0, "kv")->num_pages(), 4u);
  const auto grown = pools.initialize(0, "kv", 6);
  EXPECT_EQ(grown.outcome, sglang_init::grown);
  EXPECT_EQ(grown.old_pages, 4u);
  EXPECT_EQ(exists(*pools.find(0, "kv"), {"a"}), std::vector<bool>{true});
  EXPECT_EQ(reserve(*pools.find(0, "kv"), {"b"}), S({{false, 5}}));

  sglang_pools strict({}, /*strict_reinit=*/true);
  strict.initialize(0, "kv", 4);
  EXPECT_EQ(strict.initialize(0, "kv", 3).outcome, sglang_init::smaller_refused);
  EXPECT_EQ(strict.initialize(0, "kv", 5).outcome, sglang_init::grown);
}

TEST(SglangPools, ExpireCoversEveryPool) {
  sglang_pools pools(sglang_config{.reservation_ttl = 10});
  pools.initialize(0, "kv", 2);
  pools.initialize(1, "kv", 2);
  reserve(*pools.find(0, "kv"), {"a"}, 0);
  reserve(*pools.find(1, "kv"), {"a", "b"}, 0);
  EXPECT_EQ(pools.expire(10), 3u);
}

}  // namespace
}  // namespace metad::shard
