#include <gtest/gtest.h>

#include <string>

#include "shard/directory.hpp"
#include "shard/ownership.hpp"

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

}  // namespace
}  // namespace metad::shard
