// Tests of key_list (owned copies of request keys) and the {rank} path segment parser.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "api/decode.hpp"
#include "api/encode.hpp"
#include "test_util.hpp"

namespace metad::api {
namespace {

using testing::strings;
using strs = std::vector<std::string>;

key_list make_list(const strs& keys) {
  std::vector<std::string_view> views(keys.begin(), keys.end());
  key_list list;
  list.assign(views);
  return list;
}

// Views must point into the list's own storage, not into whatever it was built from.
void expect_owned(const key_list& list, const strs& expected) {
  ASSERT_EQ(strings(list), expected);
  for (std::size_t i = 0; i < list.size(); ++i) {
    EXPECT_EQ(list[i], expected[i]);
    EXPECT_EQ(list.views()[i].size(), expected[i].size());
  }
}

TEST(KeyList, AssignCopiesKeysInOrderWithDuplicates) {
  strs source = {"a", "bb", "", "a", std::string(64, 'f')};
  key_list list = make_list(source);
  for (std::string& s : source) s.assign(s.size(), 'X');  // the source may go away
  expect_owned(list, {"a", "bb", "", "a", std::string(64, 'f')});
}

TEST(KeyList, AssignReplacesPreviousContents) {
  key_list list = make_list({"one", "two", "three"});
  std::vector<std::string_view> next = {"x"};
  list.assign(next);
  expect_owned(list, {"x"});
  list.assign({});
  EXPECT_EQ(list.size(), 0u);
}

TEST(KeyList, ClearEmptiesTheList) {
  key_list list = make_list({"a", "b"});
  list.clear();
  EXPECT_EQ(list.size(), 0u);
  EXPECT_TRUE(list.views().empty());
}

// Both assign forms, which must agree everywhere.
using assign_fn = void (key_list::*)(std::span<const std::string_view>);
constexpr assign_fn both_assigns[] = {&key_list::assign, &key_list::assign_within_one_buffer};

TEST(KeyList, AssignFromItsOwnViewsIsSafe) {
  for (assign_fn assign : both_assigns) {
    key_list list = make_list({"alpha", "beta", "gamma"});
    (list.*assign)(list.views());
    expect_owned(list, {"alpha", "beta", "gamma"});
    std::vector<std::string_view> tail = {list[1], list[2]};  // in order
    (list.*assign)(tail);
    expect_owned(list, {"beta", "gamma"});
    std::vector<std::string_view> swapped = {list[1], list[0]};
    (list.*assign)(swapped);
    expect_owned(list, {"gamma", "beta"});
    (list.*assign)({});
    EXPECT_EQ(list.size(), 0u);
  }
}

// Short keys fit in std::string's inline buffer, which moves with the object.
TEST(KeyList, MoveKeepsViewsValidForShortKeys) {
  key_list source = make_list({"a", "b"});
  key_list moved(std::move(source));
  source = make_list({"zz", "yy"});  // reuse the moved-from list
  expect_owned(moved, {"a", "b"});
  expect_owned(source, {"zz", "yy"});
}

TEST(KeyList, MoveKeepsViewsValidForLongKeys) {
  const std::string key(64, 'c');
  key_list source = make_list({key, key, "x"});
  key_list moved(std::move(source));
  expect_owned(moved, {key, key, "x"});
}

TEST(KeyList, MoveAssignKeepsViewsValid) {
  key_list target = make_list({std::string(100, 't')});
  {
    key_list source = make_list({"s1", "s2"});
    target = std::move(source);
  }
  expect_owned(target, {"s1", "s2"});
}

TEST(KeyList, CopyIsIndependentOfTheOriginal) {
  for (const strs& keys : {strs{"a", "b"}, strs{std::string(40, 'k'), "z"}}) {
    key_list original = make_list(keys);
    key_list copy(original);
    key_list assigned = make_list({"old"});
    assigned = original;
    original = make_list({"changed"});
    expect_owned(copy, keys);
    expect_owned(assigned, keys);
  }
}

TEST(KeyList, SelfAssignmentKeepsContents) {
  key_list list = make_list({"a", "b"});
  key_list& alias = list;
  list = alias;
  expect_owned(list, {"a", "b"});
  list = std::move(alias);
  expect_owned(list, {"a", "b"});
}

TEST(KeyList, VectorOfListsSurvivesReallocation) {
  std::vector<key_list> lists;
  for (int i = 0; i < 50; ++i) lists.push_back(make_list({std::to_string(i), "k"}));
  for (int i = 0; i < 50; ++i) expect_owned(lists[i], {std::to_string(i), "k"});
}

// Views of `buffer` at (offset, size) pairs.
std::vector<std::string_view> views_into(
    const std::string& buffer, std::initializer_list<std::pair<std::size_t, std::size_t>> at) {
  std::vector<std::string_view> views;
  for (auto [offset, size] : at) views.emplace_back(buffer.data() + offset, size);
  return views;
}

bool inside(std::string_view view, const std::string& buffer) {
  std::less<const char*> lt;
  return !lt(view.data(), buffer.data()) && lt(view.data(), buffer.data() + buffer.size());
}

TEST(KeyList, AssignWithinOneBufferCopiesKeysSpreadThroughIt) {
  // As simdjson lays strings out: a length prefix before each, a NUL after.
  std::string buffer = "....alpha.....beta.........gamma.";
  const auto views = views_into(buffer, {{4, 5}, {14, 4}, {18, 0}, {27, 5}});
  key_list list = make_list({"old", "contents"});
  list.assign_within_one_buffer(views);
  for (std::string_view v : list.views()) EXPECT_FALSE(inside(v, buffer));
  // Copied as one range: the keys keep their distances (one by one they would not).
  EXPECT_EQ(list[3].data() - list[0].data(), 27 - 4);
  buffer.assign(buffer.size(), 'X');  // the parser reuses its buffer
  expect_owned(list, {"alpha", "beta", "", "gamma"});
  key_list copy(list);
  list.clear();
  expect_owned(copy, {"alpha", "beta", "", "gamma"});
}

TEST(KeyList, AssignWithinOneBufferTakesKeysOutOfOrderOrFarApartOneByOne) {
  std::string buffer(4096, '.');
  buffer.replace(0, 3, "one");
  buffer.replace(10, 3, "two");
  buffer.replace(20, 3, "six");
  buffer.replace(4000, 5, "three");
  const std::vector<std::vector<std::string_view>> cases = {
      views_into(buffer, {{10, 3}, {0, 3}}),             // out of order
      views_into(buffer, {{10, 3}, {0, 3}, {20, 3}}),    // one key out of order
      views_into(buffer, {{0, 3}, {0, 3}}),              // the same key twice
      views_into(buffer, {{0, 3}, {10, 3}, {4000, 5}}),  // far apart
      views_into(buffer, {{0, 3}, {1, 2}}),              // overlapping
  };
  const std::vector<strs> expected = {{"two", "one"},
                                      {"two", "one", "six"},
                                      {"one", "one"},
                                      {"one", "two", "three"},
                                      {"one", "ne"}};
  std::vector<key_list> lists(cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) lists[i].assign_within_one_buffer(cases[i]);
  buffer.assign(buffer.size(), 'X');
  for (std::size_t i = 0; i < cases.size(); ++i) expect_owned(lists[i], expected[i]);
}

struct rank_case {
  std::string_view text;
  bool ok;
  std::int64_t rank;
};

TEST(ParseRank, AcceptsSignedDecimalInt64) {
  const rank_case cases[] = {
      {"0", true, 0},
      {"7", true, 7},
      {"42", true, 42},
      {"-42", true, -42},
      {"+42", true, 42},
      {"-0", true, 0},
      {"+0", true, 0},
      {"007", true, 7},
      {"-007", true, -7},
      {"9223372036854775807", true, INT64_MAX},
      {"-9223372036854775808", true, INT64_MIN},
      {"00000000000000000000000001", true, 1},
  };
  for (const rank_case& c : cases) {
    std::int64_t rank = 12345;
    EXPECT_TRUE(parse_rank(c.text, rank)) << c.text;
    EXPECT_EQ(rank, c.rank) << c.text;
  }
}

TEST(ParseRank, RejectsAnythingElse) {
  const std::string_view cases[] = {
      "",
      "-",
      "+",
      " 1",
      "1 ",
      "\t1",
      "0x10",
      "1.0",
      "1e3",
      "+-1",
      "-+1",
      "--1",
      "1a",
      "a1",
      "1_000",
      "%31",
      "\xd9\xa1" /* Arabic-Indic one */,
      "9223372036854775808",
      "-9223372036854775809",
      "18446744073709551616",
      "99999999999999999999999",
      std::string_view("1\0", 2),
  };
  for (std::string_view text : cases) {
    std::int64_t rank = 0;
    EXPECT_FALSE(parse_rank(text, rank)) << text;
  }
}

}  // namespace
}  // namespace metad::api
