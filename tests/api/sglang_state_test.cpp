// The reference SGLang server's persistence file: both key forms, the LRU and LIFO orders,
// leaked pages reclaimed below the file's free stack, and every malformed file refused
// with a message naming what and where.
#include "api/sglang_state.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace metad::api {
namespace {

using pages = std::vector<std::uint32_t>;
using bindings = std::vector<std::pair<std::string, std::uint32_t>>;

constexpr sg_state_limits kLimits{.pages_max = 1000, .key_bytes_max = 8, .pools_max = 4};

std::vector<sg_state_pool> decode_ok(std::string_view text) {
  std::vector<sg_state_pool> pools;
  const std::string error = decode_sglang_state(text, kLimits, pools);
  EXPECT_EQ(error, "") << text;
  return pools;
}

std::string decode_error(std::string_view text) {
  std::vector<sg_state_pool> pools;
  return decode_sglang_state(text, kLimits, pools);
}

// As json.dump(indent=4) writes it, with a bare-rank pool of an older file.
constexpr std::string_view kReferenceFile = R"({
    "0:kv": {
        "num_pages": 6,
        "free_pages": [
            1,
            0
        ],
        "key_to_index": [
            [
                "old",
                5
            ],
            [
                "new",
                3
            ]
        ]
    },
    "-3:indexer": {"num_pages": 2, "free_pages": [0, 1], "key_to_index": []},
    "7": {"num_pages": 0, "free_pages": [], "key_to_index": []},
    "1:ns:with:colons": {"num_pages": 1, "free_pages": [], "key_to_index": [["\u00e9", 0]]}
})";

TEST(SglangState, ReadsBothKeyFormsInFileOrder) {
  const auto pools = decode_ok(kReferenceFile);
  ASSERT_EQ(pools.size(), 4u);
  EXPECT_EQ(pools[0].rank, 0);
  EXPECT_EQ(pools[0].ns, "kv");
  EXPECT_EQ(pools[1].rank, -3);
  EXPECT_EQ(pools[1].ns, "indexer");
  EXPECT_EQ(pools[2].rank, 7);
  EXPECT_EQ(pools[2].ns, "kv");
  EXPECT_EQ(pools[2].num_pages, 0u);
  EXPECT_EQ(pools[3].rank, 1);
  EXPECT_EQ(pools[3].ns, "ns:with:colons");
  EXPECT_EQ(pools[3].bound, (bindings{{"\xC3\xA9", 0}}));
}

TEST(SglangState, KeepsLruOrderAndPutsLeakedPagesBelowTheFreeStack) {
  const auto pools = decode_ok(kReferenceFile);
  const sg_state_pool& kv = pools[0];
  EXPECT_EQ(kv.num_pages, 6u);
  EXPECT_EQ(kv.bound, (bindings{{"old", 5}, {"new", 3}}));
  // Pages 2 and 4 were in flight when the file was saved: free again, handed out after
  // the file's own free stack (0 next, then 1).
  EXPECT_EQ(kv.free, (pages{2, 4, 1, 0}));
  EXPECT_EQ(kv.reclaimed, 2u);
  EXPECT_EQ(kv.free_and_bound, 0u);
  EXPECT_EQ(pools[1].free, (pages{0, 1}));
  EXPECT_EQ(pools[1].reclaimed, 0u);
}

TEST(SglangState, APageListedFreeAndBoundStaysBound) {
  const auto pools = decode_ok(
      R"({"0:kv": {"num_pages": 3, "free_pages": [2, 1, 0], "key_to_index": [["a", 1]]}})");
  EXPECT_EQ(pools[0].free, (pages{2, 0}));
  EXPECT_EQ(pools[0].bound, (bindings{{"a", 1}}));
  EXPECT_EQ(pools[0].free_and_bound, 1u);
}

TEST(SglangState, AnEmptyObjectHasNoPools) {
  EXPECT_TRUE(decode_ok("{}").empty());
  EXPECT_TRUE(decode_ok(" \n{ }\n").empty());
}

TEST(SglangState, IgnoresFieldsItDoesNotKnow) {
  const auto pools = decode_ok(
      R"({"0:kv": {"num_pages": 1, "free_pages": [0], "key_to_index": [], "lock": null}})");
  EXPECT_EQ(pools[0].free, (pages{0}));
}

TEST(SglangState, AcceptsLimitsExactly) {
  const auto pools = decode_ok(
      R"({"9223372036854775807:kv": {"num_pages": 1000, "free_pages": [999],
          "key_to_index": [["12345678", 0]]},
          "-9223372036854775808:x": {"num_pages": 0, "free_pages": [], "key_to_index": []}})");
  EXPECT_EQ(pools[0].rank, INT64_MAX);
  EXPECT_EQ(pools[0].free.size(), 999u);
  EXPECT_EQ(pools[0].free.back(), 999u);
  EXPECT_EQ(pools[1].rank, INT64_MIN);
}

struct bad_file {
  std::string text;
  std::string error;
};

std::string pool(std::string_view body) { return R"({"0:kv": )" + std::string(body) + "}"; }

TEST(SglangState, RefusesEveryMalformedFileNamingWhatAndWhere) {
  const std::string key129(129, 'n');
  const std::vector<bad_file> cases = {
      {"", "not valid JSON: "},
      {"{\"0:kv\": ", "not valid JSON: "},
      {"{} {}", "not valid JSON: "},
      {"[]", "the top level is not a JSON object"},
      {R"({"x:kv": {}})", R"(pool "x:kv": the rank "x" is not an integer within int64)"},
      {R"({":kv": {}})", R"(pool ":kv": the rank "" is not an integer within int64)"},
      {R"({"9223372036854775808": {}})",
       R"(pool "9223372036854775808": the rank "9223372036854775808" is not an integer)"},
      {R"({"0:": {}})", R"(pool "0:": the namespace must be 1 to 128 characters)"},
      {R"({"0:)" + key129 + R"(": {}})", "the namespace must be 1 to 128 characters"},
      {R"({"0": {"num_pages": 0, "free_pages": [], "key_to_index": []},
           "0:kv": {"num_pages": 0, "free_pages": [], "key_to_index": []}})",
       R"(pools "0" and "0:kv" are both rank 0 namespace "kv")"},
      {R"({"1:a": {}, "2:a": {}, "3:a": {}, "4:a": {}, "5:a": {}})", "pool \"1:a\": no num_pages"},
      {pool("[]"), R"(pool "0:kv": not a JSON object)"},
      {pool(R"({"free_pages": [], "key_to_index": []})"), R"(pool "0:kv": no num_pages)"},
      {pool(R"({"num_pages": 1, "key_to_index": []})"), R"(pool "0:kv": no free_pages)"},
      {pool(R"({"num_pages": 1, "free_pages": []})"), R"(pool "0:kv": no key_to_index)"},
      {pool(R"({"num_pages": -1, "free_pages": [], "key_to_index": []})"),
       R"(pool "0:kv": num_pages must be an integer in 0..1000 (--pages-per-rank-max))"},
      {pool(R"({"num_pages": 1001, "free_pages": [], "key_to_index": []})"),
       "num_pages must be an integer in 0..1000"},
      {pool(R"({"num_pages": true, "free_pages": [], "key_to_index": []})"),
       "num_pages must be an integer"},
      {pool(R"({"num_pages": 2.0, "free_pages": [], "key_to_index": []})"),
       "num_pages must be an integer"},
      {pool(R"({"num_pages": 2, "free_pages": [1, 1], "key_to_index": [["a", 1]]})"),
       R"(pool "0:kv": free_pages[1]: page 1 is listed free twice)"},
      {pool(R"({"num_pages": 2, "free_pages": {}, "key_to_index": []})"),
       R"(pool "0:kv": free_pages must be a list of pages)"},
      {pool(R"({"num_pages": 2, "free_pages": [0, "1"], "key_to_index": []})"),
       R"(pool "0:kv": free_pages[1]: a page must be an integer)"},
      {pool(R"({"num_pages": 2, "free_pages": [0, 2], "key_to_index": []})"),
       R"(pool "0:kv": free_pages[1]: page 2 is outside 0..1 (num_pages 2))"},
      {pool(R"({"num_pages": 2, "free_pages": [-1], "key_to_index": []})"),
       R"(free_pages[0]: page -1 is outside 0..1)"},
      {pool(R"({"num_pages": 2, "free_pages": [1, 0, 1], "key_to_index": []})"),
       R"(pool "0:kv": free_pages[2]: page 1 is listed free twice)"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": {}})"),
       R"(pool "0:kv": key_to_index must be a list of [key, page] pairs)"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": [["a"]]})"),
       R"(pool "0:kv": key_to_index[0]: not a [key, page] pair with a string key)"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": [["a", 0, 1]]})"),
       "key_to_index[0]: not a [key, page] pair"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": [[1, 0]]})"),
       "key_to_index[0]: not a [key, page] pair with a string key"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": [["a", null]]})"),
       R"(pool "0:kv": key_to_index[0]: a page must be an integer)"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": [["a", 5]]})"),
       R"(pool "0:kv": key_to_index[0]: page 5 is outside 0..1 (num_pages 2))"},
      {pool(R"({"num_pages": 0, "free_pages": [], "key_to_index": [["a", 0]]})"),
       "key_to_index[0]: page 0 is outside 0..-1 (num_pages 0)"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": [["a", 0], ["b", 0]]})"),
       R"(pool "0:kv": key_to_index[1]: page 0 is bound to two keys)"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": [["a", 0], ["a", 1]]})"),
       R"(pool "0:kv": key_to_index[1]: the key "a" is listed twice (also key_to_index[0]))"},
      {pool(R"({"num_pages": 2, "free_pages": [], "key_to_index": [["123456789", 0]]})"),
       R"(pool "0:kv": key_to_index[0]: the key is 9 bytes long; the limit is 8)"},
  };
  for (const bad_file& c : cases) {
    const std::string error = decode_error(c.text);
    EXPECT_NE(error.find(c.error), std::string::npos)
        << "file: " << c.text << "\nerror: " << error << "\nwanted: " << c.error;
  }
}

TEST(SglangState, RefusesMorePoolsThanTheLimit) {
  std::string text = "{";
  for (int i = 0; i < 5; ++i)
    text += (i ? "," : "") + std::string("\"") + std::to_string(i) +
            R"(": {"num_pages": 0, "free_pages": [], "key_to_index": []})";
  text += "}";
  EXPECT_EQ(decode_error(text), "more than 4 pools (--ranks-max)");
}

TEST(SglangState, ReadsAnUnpaddedBufferAtItsEnd) {
  // The decoder copies what it parses: a buffer ending exactly at the file is fine.
  const std::string text = R"({"0": {"num_pages": 1, "free_pages": [0], "key_to_index": []}})";
  std::vector<char> exact(text.begin(), text.end());
  std::vector<sg_state_pool> pools;
  EXPECT_EQ(decode_sglang_state(std::string_view(exact.data(), exact.size()), kLimits, pools), "");
  ASSERT_EQ(pools.size(), 1u);
}

TEST(SglangState, PoolsPastTheBytesBudgetAreRefusedInFileOrder) {
  sg_state_limits limits = kLimits;
  limits.bytes_max = 5 * 150;  // 150 declared pages at 5 bytes each
  std::vector<sg_state_pool> pools;
  const std::string file = R"({"0:kv": {"num_pages": 100, "free_pages": [], "key_to_index": []},)"
                           R"( "1:kv": {"num_pages": 50, "free_pages": [], "key_to_index": []},)"
                           R"( "2:kv": {"num_pages": 1, "free_pages": [], "key_to_index": []}})";
  EXPECT_EQ(decode_sglang_state(file, limits, pools),
            "pool \"2:kv\": the pools up to this one declare 151 pages, which take 755 bytes to "
            "import, more than the 750 bytes the memory budget leaves (--memory-max)");
  limits.bytes_max = 5 * 151;
  EXPECT_EQ(decode_sglang_state(file, limits, pools), "");
  EXPECT_EQ(pools.size(), 3u);
}

}  // namespace
}  // namespace metad::api
