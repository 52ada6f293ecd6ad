// Each shard structure's verify() reports a broken invariant: a test breaks one (through
// verify_access, which the structures befriend) and checks the message
// names it. With METAD_VERIFY (the sanitizer builds), the next mutating operation aborts.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "keys.hpp"
#include "shard/directory.hpp"
#include "shard/directory_impl.hpp"
#include "shard/dual_key_map.hpp"
#include "shard/key_life.hpp"
#include "shard/rank_table.hpp"
#include "shard/rank_table_impl.hpp"
#include "shard/reservation_queue.hpp"
#include "shard/sglang_pool.hpp"
#include "shard/sglang_pools.hpp"
#include "shard/verify.hpp"

namespace metad::shard {

template <>
struct verify_access<dual_key_map<std::uint32_t>> {
  static std::size_t& hex_others(dual_key_map<std::uint32_t>& m) { return m.hex_others_; }
};
template <>
struct verify_access<key_life> {
  static std::size_t& leased(key_life& l) { return l.leased_; }
  static void break_prev_link(key_life& l) { l.nodes_[l.nodes_[0].prev].prev = 0; }
  static void drop_lease_entries(key_life& l) { l.leases_.clear(); }
};
template <>
struct verify_access<reservation_queue> {
  static void push_raw(reservation_queue& q, std::uint64_t deadline, std::uint32_t page) {
    q.entries_.push_back({deadline, page});
  }
};
template <>
struct verify_access<sglang_pool> {
  static void drop_expiry(sglang_pool& p) { p.expiry_.clear(); }
  static void lose_free_node(sglang_pool& p) { p.nodes_.emplace_back(); }
};
template <>
struct verify_access<sglang_pools> {
  static void drop_index(sglang_pools& p) { p.index_.clear(); }
};
template <>
struct verify_access<rank_table> {
  // Breaks invariant `which` of initialised rank `rank`: 0, a reserved page loses its owner
  // record (its key still naming it); 1, the expiry queue loses its entries; 2, a free
  // page is quarantined; 3, a wide key's record counts a holder no rank is.
  static void break_invariant(rank_table& t, std::int64_t rank, int which) {
    rank_table_detail::rank_state& rs = t.impl_->ranks.at(rank);
    switch (which) {
      case 0: {
        std::uint64_t page = UINT64_MAX;
        rs.keys.owners.for_each(
            [&](std::uint64_t p, const key_owner&) { page = std::min(page, p); });
        if (page != UINT64_MAX) rs.keys.owners.take(page);
        break;
      }
      case 1:
        rs.expiry.clear();
        break;
      case 2:
        rs.quarantine.push_back({0, static_cast<std::uint32_t>(rs.pool.high_water())});
        break;
      case 3:
        t.impl_->wide_keys.for_each([](const packed_key&, wide_record& r) { ++r.refs; });
        break;
    }
  }
};
template <>
struct verify_access<directory> {
  // The incomplete keys' confirmations miscounted.
  static void miscount_incomplete(directory& d) { ++d.impl_->incomplete_bindings; }
  // A key being removed that is not in the directory.
  static void remove_absent_key(directory& d) {
    d.impl_->removing.insert_new("absent-key", table_hash("absent-key"), 1);
  }
};

namespace {

using testing_helpers::as_parsed;

// Whether `problem` reports a broken invariant whose description contains `what`.
::testing::AssertionResult verify_reports(const std::string& problem, std::string_view what) {
  if (problem.find(what) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "verify() gave '" << problem << "', wanted '" << what << "'";
}

const std::string kVerifyHexA(32, 'a'), kVerifyHexB(32, 'b');

TEST(Verify, DualKeyMapReportsAMiscountedForm) {
  dual_key_map<std::uint32_t> m;
  m.insert(kVerifyHexA, as_parsed(kVerifyHexA), 1);
  m.insert("other key", as_parsed("other key"), 2);
  ASSERT_EQ(m.verify(), "");
  ++verify_access<dual_key_map<std::uint32_t>>::hex_others(m);
  EXPECT_TRUE(verify_reports(m.verify(), "hex keys in the key_map form, 1 counted"));
  --verify_access<dual_key_map<std::uint32_t>>::hex_others(m);
  // A packed word of 0 reads as an empty slot: the stored keys no longer match the count.
  *m.find_value(kVerifyHexA, as_parsed(kVerifyHexA)) = 0;
  EXPECT_NE(m.verify(), "");
}

TEST(Verify, KeyLifeReportsLeaseCountsLinksAndEntries) {
  const auto fresh = [] {
    key_life l;
    l.set_lru(true);
    l.touch(kVerifyHexA, as_parsed(kVerifyHexA), 1);
    l.lease("other", as_parsed("other"), 2, 100);
    l.touch(kVerifyHexB, as_parsed(kVerifyHexB), 3);
    return l;
  };
  key_life a = fresh();
  ASSERT_EQ(a.verify(), "");
  ++verify_access<key_life>::leased(a);
  EXPECT_TRUE(verify_reports(a.verify(), "1 listed nodes leased, 2 counted"));
  key_life b = fresh();
  verify_access<key_life>::break_prev_link(b);
  EXPECT_TRUE(verify_reports(b.verify(), "prev 0 but follows"));
  key_life c = fresh();
  verify_access<key_life>::drop_lease_entries(c);
  EXPECT_TRUE(verify_reports(c.verify(), "has a lease but no lease entry"));
}

TEST(Verify, ReservationQueueReportsEntriesOutOfDeadlineOrder) {
  reservation_queue q;
  const auto live = [](const reservation_queue::entry&) { return true; };
  q.push(1, 10, 1, live);
  q.push(2, 20, 2, live);
  ASSERT_EQ(q.verify(), "");
  verify_access<reservation_queue>::push_raw(q, 15, 3);
  EXPECT_TRUE(verify_reports(q.verify(), "entry 2 is due before the one ahead of it"));
}

// A rank with two reservations (TTL on) and a bound page.
rank_table verify_test_table() {
  rank_table t;
  t.set_reservation_ttl(100);
  t.initialize(3, 16);
  const std::vector<std::string_view> keys{kVerifyHexA, "key-b", "key-c"};
  std::vector<std::uint32_t> distinct;
  std::vector<std::int64_t> pages;
  t.allocate(3, keys, 1, distinct, pages);
  std::string detail;
  std::vector<std::uint32_t> newly;
  const std::vector<std::string_view> confirmed{"key-c"};
  const std::vector<std::int64_t> confirmed_pages{pages[2]};
  t.confirm(3, confirmed, confirmed_pages, {}, 0, detail, newly);
  return t;
}

TEST(Verify, RankTableReportsOwnersExpiryAndQuarantine) {
  rank_table a = verify_test_table();
  ASSERT_EQ(a.verify(), "");
  verify_access<rank_table>::break_invariant(a, 3, 0);
  EXPECT_TRUE(verify_reports(a.verify(), "rank 3: "));
  EXPECT_TRUE(verify_reports(a.verify(), "reserved page 0 does not point back to key"));
  rank_table b = verify_test_table();
  verify_access<rank_table>::break_invariant(b, 3, 1);
  EXPECT_TRUE(verify_reports(b.verify(), "is not in the expiry queue"));
  rank_table c = verify_test_table();
  verify_access<rank_table>::break_invariant(c, 3, 2);
  EXPECT_TRUE(verify_reports(c.verify(), "1 quarantined pages, 2 reserved pages"));
  EXPECT_EQ(c.check_invariants(), c.verify());
  // Two ranks hold one SHA-256 key: one record, two holders; a third is a miscount.
  rank_table d;
  const std::string sha(64, 'c');
  for (std::int64_t rank : {1, 2}) {
    d.initialize(rank, 4);
    const std::vector<std::string_view> keys{sha};
    std::vector<std::uint32_t> distinct;
    std::vector<std::int64_t> pages;
    d.allocate(rank, keys, 1, distinct, pages);
  }
  ASSERT_EQ(d.verify(), "");
  verify_access<rank_table>::break_invariant(d, 1, 3);
  EXPECT_TRUE(verify_reports(d.verify(), "the ranks hold 2 wide keys, their records count 3"));
}

TEST(Verify, DirectoryReportsBindingsAndRemovals) {
  const auto fresh = [] {
    directory d;
    d.set_lru(true);
    d.add_confirmation(kVerifyHexA, 2, 1);  // incomplete
    d.add_confirmation("key-b", 1, 2);      // complete
    return d;
  };
  directory a = fresh();
  ASSERT_EQ(a.verify(), "");
  verify_access<directory>::miscount_incomplete(a);
  EXPECT_TRUE(verify_reports(a.verify(), "incomplete keys hold 1 confirmations, 2 counted"));
  directory b = fresh();
  verify_access<directory>::remove_absent_key(b);
  EXPECT_TRUE(verify_reports(b.verify(), "key absent-key is being removed but absent"));
}

TEST(Verify, SglangPoolReportsExpiryAndLostNodes) {
  const auto fresh = [] {
    sglang_pool p(8, sglang_config{.reservation_ttl = 50});
    const std::vector<std::string_view> keys{"k1", "k2"};
    std::vector<sglang_slot> out;
    p.reserve(keys, 1, out);
    return p;
  };
  sglang_pool a = fresh();
  ASSERT_EQ(a.verify(), "");
  verify_access<sglang_pool>::drop_expiry(a);
  EXPECT_TRUE(verify_reports(a.verify(), "2 reservations with a deadline, 0 live expiry entries"));
  sglang_pool b = fresh();
  verify_access<sglang_pool>::lose_free_node(b);
  EXPECT_TRUE(verify_reports(b.verify(), "(a node is lost)"));
}

TEST(Verify, SglangPoolsReportAnIndexThatLostAPool) {
  sglang_pools pools;
  pools.initialize(0, "ns", 4);
  ASSERT_EQ(pools.verify(), "");
  verify_access<sglang_pools>::drop_index(pools);
  EXPECT_TRUE(verify_reports(pools.verify(), "1 pools, 0 index entries"));
}

TEST(VerifyDeathTest, ABrokenInvariantAbortsNamingIt) {
  EXPECT_DEATH(verify_or_die("rank_table::allocate", "rank 3: broken", __FILE__, __LINE__),
               "rank_table::allocate: rank 3: broken");
  verify_or_die("nothing", "", __FILE__, __LINE__);  // "" holds: no abort
}

// With METAD_VERIFY, the operation after a corruption aborts (a small table is verified
// after every operation).
TEST(VerifyDeathTest, UnderMetadVerifyTheNextOperationAborts) {
  if (!verify_enabled) GTEST_SKIP() << "built without METAD_VERIFY";
  EXPECT_DEATH(
      {
        rank_table t = verify_test_table();
        verify_access<rank_table>::break_invariant(t, 3, 1);
        const std::vector<std::string_view> keys{"key-d"};
        std::vector<std::uint32_t> distinct;
        std::vector<std::int64_t> pages;
        t.allocate(3, keys, 2, distinct, pages);
      },
      "rank_table::allocate: the reservation of page");
  EXPECT_DEATH(
      {
        directory d;
        d.add_confirmation(kVerifyHexA, 2, 1);
        verify_access<directory>::miscount_incomplete(d);
        d.add_confirmation(kVerifyHexB, 2, 2);
      },
      "directory::add_confirmation: directory: incomplete keys hold");
}

TEST(Verify, SamplingVerifiesSmallStructuresAlwaysAndLargeOnesPeriodically) {
  std::uint64_t ops = 0;
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(verify_due(ops, 31));
  ops = 0;
  int due = 0;
  for (int i = 0; i < 1 << 16; ++i) due += verify_due(ops, 1 << 20) ? 1 : 0;
  EXPECT_EQ(due, 1);  // n = 2^20: once in 2^16 operations, ~16 entries per operation
}

}  // namespace
}  // namespace metad::shard
