// Response encoders: exact bytes, as Python's json.dumps(separators=(",", ":"),
// ensure_ascii=False) writes them.
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "api/decode.hpp"
#include "api/encode.hpp"
#include "api/inspect.hpp"
#include "test_util.hpp"

namespace metad::api {
namespace {

using testing::body;

TEST(EncodeInitialized, WritesTheReferenceMessage) {
  std::string out;
  encode_initialized(out, 3, 100);
  EXPECT_EQ(out, R"({"message":"Rank 3 initialized with 100 pages"})");
  out.clear();
  encode_initialized(out, -2, 1);
  EXPECT_EQ(out, R"({"message":"Rank -2 initialized with 1 pages"})");
  out.clear();
  encode_initialized(out, INT64_MIN, 268435456);
  EXPECT_EQ(out, R"({"message":"Rank -9223372036854775808 initialized with 268435456 pages"})");
}

TEST(Encoders, AppendToExistingContents) {
  std::string out = "HEAD";
  encode_initialized(out, 0, 5);
  encode_error(out, "x");
  EXPECT_EQ(out, R"(HEAD{"message":"Rank 0 initialized with 5 pages"}{"detail":"x"})");
}

TEST(EncodeAllocation, WritesRankAndKeyPagePairs) {
  std::string out;
  const std::vector<std::string_view> keys = {"k1", "k2"};
  const std::vector<std::int64_t> pages = {5, -1};
  encode_allocation(out, 0, keys, pages);
  EXPECT_EQ(out, R"({"rank":0,"results":[["k1",5],["k2",-1]]})");
}

TEST(EncodeAllocation, WritesAnEmptyBatch) {
  std::string out;
  encode_allocation(out, -4, {}, {});
  EXPECT_EQ(out, R"({"rank":-4,"results":[]})");
}

TEST(EncodeAllocation, EscapesKeys) {
  std::string out;
  const std::vector<std::string_view> keys = {"a\"b", "caf\xc3\xa9", "\n"};
  const std::vector<std::int64_t> pages = {INT64_MAX, 0, 7};
  encode_allocation(out, 9, keys, pages);
  EXPECT_EQ(out,
            "{\"rank\":9,\"results\":[[\"a\\\"b\",9223372036854775807],"
            "[\"caf\xc3\xa9\",0],[\"\\n\",7]]}");
}

TEST(EncodeAllocation, AppendsAndEscapesKeysThatGrowPastTheirRoom) {
  // Each key escapes to twice its size or more, between clean ones; what was in the
  // buffer stays.
  std::vector<std::string> owned;
  std::string expected = "prefix{\"rank\":3,\"results\":[";
  for (int i = 0; i < 50; ++i) {
    owned.push_back(i % 2 == 0 ? std::string(20, '"') : std::string(32, 'f'));
    if (i != 0) expected += ',';
    expected += "[\"";
    append_escaped(expected, owned.back());
    expected += "\"," + std::to_string(i) + "]";
  }
  expected += "]}";
  const std::vector<std::string_view> keys(owned.begin(), owned.end());
  std::vector<std::int64_t> pages;
  for (int i = 0; i < 50; ++i) pages.push_back(i);
  std::string out = "prefix";
  encode_allocation(out, 3, keys, pages);
  EXPECT_EQ(out, expected);
}

TEST(EncodeAllocation, WritesAFullSaveTask) {
  const std::string key(64, 'e');
  std::vector<std::string_view> keys(128, key);
  std::vector<std::int64_t> pages;
  std::string expected = R"({"rank":1,"results":[)";
  for (int i = 0; i < 128; ++i) {
    pages.push_back(i * 1000);
    expected += (i ? "," : "") + std::string("[\"") + key + "\"," + std::to_string(i * 1000) + "]";
  }
  expected += "]}";
  std::string out;
  encode_allocation(out, 1, keys, pages);
  EXPECT_EQ(out, expected);
}

TEST(EncodeExists, WritesBooleans) {
  std::string out;
  const std::vector<std::uint8_t> exists = {1, 0, 2, 0};
  encode_exists(out, exists);
  EXPECT_EQ(out, R"({"exists":[true,false,true,false]})");
  out.clear();
  encode_exists(out, {});
  EXPECT_EQ(out, R"({"exists":[]})");
}

TEST(EncodeLocations, WritesPagesAndNullForMissing) {
  std::string out;
  const std::vector<std::int64_t> pages = {3, -1, 0, 9223372036854775807};
  encode_locations(out, pages);
  EXPECT_EQ(out, R"({"locations":[3,null,0,9223372036854775807]})");
  out.clear();
  encode_locations(out, {});
  EXPECT_EQ(out, R"({"locations":[]})");
}

TEST(EncodeRankInfo, WritesAllCounters) {
  std::string out;
  encode_rank_info(out, 100, 90, 6, 4, 3);
  EXPECT_EQ(out, R"({"num_pages":100,"free":90,"reserved":6,"bound":4,"incomplete":3})");
}

TEST(EncodeDeleted, WritesTheCount) {
  const std::pair<std::uint64_t, std::string_view> cases[] = {
      {0, R"({"deleted":0})"},
      {3, R"({"deleted":3})"},
      {UINT64_MAX, R"({"deleted":18446744073709551615})"},
  };
  for (const auto& [deleted, expected] : cases) {
    std::string out = "<";
    encode_deleted(out, deleted);
    EXPECT_EQ(out, "<" + std::string(expected)) << deleted;
  }
}

TEST(EncodeStats, WritesRanksInTheGivenOrderThenTotals) {
  const std::vector<rank_info_row> ranks = {
      {.rank = 0, .num_pages = 8, .free = 5, .reserved = 1, .bound = 2},
      {.rank = -3, .num_pages = 1, .free = 0, .reserved = 0, .bound = 1},
      {.rank = 2, .num_pages = 4, .free = 4, .reserved = 0, .bound = 0},
  };
  const stats_totals totals = {.keys = 3,
                               .leased_keys = 4,
                               .evicted_keys = 5,
                               .expired_reservations = 6,
                               .deleted_keys = 7,
                               .refused_releases = 8,
                               .incomplete_keys = 9,
                               .incomplete_pages = 10,
                               .stale_keys = 11};
  const rank_pool pool = {.ranks = 3, .pages = 13, .free = 9, .reserved = 1, .bound = 3};
  std::string out;
  encode_stats(out, ranks, pool, totals);
  EXPECT_EQ(out, R"({"ranks":[{"rank":0,"num_pages":8,"free":5,"reserved":1,"bound":2},)"
                 R"({"rank":-3,"num_pages":1,"free":0,"reserved":0,"bound":1},)"
                 R"({"rank":2,"num_pages":4,"free":4,"reserved":0,"bound":0}],)"
                 R"("ranks_total":3,"ranks_truncated":false,"pages_total":13,"pages_free":9,)"
                 R"("pages_reserved":1,"pages_bound":3,)"
                 R"("keys":3,"leased_keys":4,"evicted_keys":5,"expired_reservations":6,)"
                 R"("deleted_keys":7,"refused_releases":8,"incomplete_keys":9,)"
                 R"("incomplete_pages":10,"stale_keys":11})");
}

TEST(EncodeStats, WritesAnEmptyRankList) {
  std::string out = "<";
  encode_stats(out, {}, rank_pool{}, stats_totals{});
  EXPECT_EQ(
      out,
      R"(<{"ranks":[],"ranks_total":0,"ranks_truncated":false,"pages_total":0,)"
      R"("pages_free":0,"pages_reserved":0,"pages_bound":0,"keys":0,"leased_keys":0,"evicted_keys":0,)"
      R"("expired_reservations":0,"deleted_keys":0,"refused_releases":0,)"
      R"("incomplete_keys":0,"incomplete_pages":0,"stale_keys":0})");
}

TEST(EncodeStats, WritesExtremeValues) {
  const rank_info_row ranks[] = {{INT64_MIN, INT64_MAX, -1, 0, INT64_MIN}};
  const stats_totals totals = {UINT64_MAX, 0,          UINT64_MAX, 0,         UINT64_MAX,
                               0,          UINT64_MAX, 0,          UINT64_MAX};
  const rank_pool pool = {UINT64_MAX, UINT64_MAX, 0, UINT64_MAX, 0};
  std::string out;
  encode_stats(out, ranks, pool, totals);
  EXPECT_EQ(out,
            R"({"ranks":[{"rank":-9223372036854775808,"num_pages":9223372036854775807,)"
            R"("free":-1,"reserved":0,"bound":-9223372036854775808}],)"
            R"("ranks_total":18446744073709551615,"ranks_truncated":true,)"
            R"("pages_total":18446744073709551615,"pages_free":0,)"
            R"("pages_reserved":18446744073709551615,"pages_bound":0,)"
            R"("keys":18446744073709551615,"leased_keys":0,"evicted_keys":18446744073709551615,)"
            R"("expired_reservations":0,"deleted_keys":18446744073709551615,"refused_releases":0,)"
            R"("incomplete_keys":18446744073709551615,"incomplete_pages":0,)"
            R"("stale_keys":18446744073709551615})");
}

// A /stats row and GET /rank/{rank} write the same counters the same way (the rank's
// answer then adds its incomplete pages).
TEST(EncodeStats, RowMatchesTheRankInfoObject) {
  std::string info;
  encode_rank_info(info, 100, 90, 6, 4, 0);
  info.resize(info.find(R"(,"incomplete")"));
  const rank_info_row row = {.rank = 7, .num_pages = 100, .free = 90, .reserved = 6, .bound = 4};
  std::string stats;
  encode_stats(stats, {&row, 1}, rank_pool{}, stats_totals{});
  EXPECT_TRUE(stats.starts_with(R"({"ranks":[{"rank":7,)" + info.substr(1) + "}]")) << stats;
}

// What we write, a JSON parser reads back as the same numbers.
TEST(EncodeStats, RoundTripsThroughAJsonParser) {
  const rank_info_row ranks[] = {{-1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}};
  std::string out;
  encode_stats(out, ranks, {5, 17, 19, 21, 23}, {11, 12, 13, 14, 15, 16});
  simdjson::dom::parser parser;
  const body b(out);
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(b.view().data(), b.view().size(), false).get(doc), simdjson::SUCCESS);
  simdjson::dom::array rows;
  ASSERT_EQ(doc["ranks"].get(rows), simdjson::SUCCESS);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(std::int64_t(rows.at(0)["rank"]), -1);
  EXPECT_EQ(std::int64_t(rows.at(1)["bound"]), 10);
  EXPECT_EQ(std::uint64_t(doc["refused_releases"]), 16u);
  EXPECT_EQ(std::uint64_t(doc["ranks_total"]), 5u);
  EXPECT_EQ(bool(doc["ranks_truncated"]), true);
  EXPECT_EQ(std::uint64_t(doc["pages_bound"]), 23u);
}

// A list as long as the pool is complete; one rank fewer is truncated.
TEST(EncodeStats, TruncatedWhenThePoolHasMoreRanksThanTheList) {
  const rank_info_row ranks[] = {{1, 1, 1, 0, 0}, {2, 1, 1, 0, 0}};
  for (std::uint64_t total : {2u, 3u}) {
    std::string out;
    encode_stats(out, ranks, {.ranks = total, .pages = total, .free = total}, stats_totals{});
    const std::string want =
        total == 2 ? R"("ranks_truncated":false)" : R"("ranks_truncated":true)";
    EXPECT_NE(out.find(want), std::string::npos) << out;
  }
}

TEST(EncodeError, WritesDetail) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"Not Found", R"({"detail":"Not Found"})"},
      {"Invalid request format: need 'rank' and 'keys'",
       R"({"detail":"Invalid request format: need 'rank' and 'keys'"})"},
      {"say \"hi\"", R"({"detail":"say \"hi\""})"},
      {"", R"({"detail":""})"},
  };
  for (const auto& [detail, expected] : cases) {
    std::string out;
    encode_error(out, detail);
    EXPECT_EQ(out, expected);
  }
}

TEST(AppendEscaped, EscapesLikePythonJson) {
  using namespace std::string_view_literals;
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"", ""},
      {"0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"},
      {"a\"b", "a\\\"b"},
      {"back\\slash", "back\\\\slash"},
      {"\n\r\t\b\f", "\\n\\r\\t\\b\\f"},
      {"\x01", "\\u0001"},
      {"\x1f", "\\u001f"},
      {"\x0b", "\\u000b"},
      {"\x1b[0m", "\\u001b[0m"},
      {"nul\0byte"sv, "nul\\u0000byte"},
      {"\x7f", "\x7f"},                  // DEL is not escaped
      {"a/b", "a/b"},                    // nor is '/'
      {"caf\xc3\xa9", "caf\xc3\xa9"},    // UTF-8 verbatim (ensure_ascii=False)
      {"\xe2\x80\xa8", "\xe2\x80\xa8"},  // U+2028 verbatim
      {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
      {"\xa0\xa2\xdc\x80\xff\xfe\xbc\xa2\x9f", "\xa0\xa2\xdc\x80\xff\xfe\xbc\xa2\x9f"},
      {"' <>&", "' <>&"},
  };
  for (const auto& [text, expected] : cases) {
    std::string out = "<";
    append_escaped(out, text);
    EXPECT_EQ(out, "<" + std::string(expected)) << text;
  }
}

// A byte-at-a-time model of Python's escaping, to check every position of the word scan.
std::string reference_escape(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
  return out;
}

TEST(AppendEscaped, EscapesAtEveryPositionOfLongStrings) {
  const char specials[] = {'"', '\\', '\n', '\0', '\x1f', '\x01'};
  for (std::size_t length = 1; length <= 40; ++length) {
    for (std::size_t at = 0; at < length; ++at) {
      for (char special : specials) {
        std::string text(length, 'a');
        text[at] = special;
        std::string out;
        append_escaped(out, text);
        EXPECT_EQ(out, reference_escape(text)) << length << " " << at;
      }
    }
  }
}

TEST(AppendEscaped, MatchesTheModelOnRandomBytes) {
  std::mt19937 rng(12345);
  // Bias towards interesting bytes: controls, quotes, and bytes near them.
  const unsigned char pool[] = {0x00, 0x01, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x5b, 0x5c, 0x5d,
                                0x7f, 0x80, 0x9f, 0xa0, 0xa2, 0xdc, 0xff, 'a',  '0',  'f'};
  for (int round = 0; round < 2000; ++round) {
    std::string text(rng() % 70, '\0');
    for (char& ch : text) ch = static_cast<char>(pool[rng() % sizeof pool]);
    std::string out;
    append_escaped(out, text);
    ASSERT_EQ(out, reference_escape(text));
  }
}

// What we write, a JSON parser reads back unchanged.
TEST(EncodeError, RoundTripsThroughAJsonParser) {
  std::string detail;
  for (int c = 1; c < 0x80; ++c) detail += static_cast<char>(c);
  detail += "caf\xc3\xa9";
  std::string out;
  encode_error(out, detail);
  simdjson::dom::parser parser;
  const body b(out);
  std::string_view decoded;
  ASSERT_EQ(parser.parse(b.view().data(), b.view().size(), false)["detail"].get(decoded),
            simdjson::SUCCESS);
  EXPECT_EQ(decoded, detail);
}

}  // namespace
}  // namespace metad::api

namespace metad::api {
namespace {

TEST(EncodeInspect, WritesEveryStateAndNullsForUnknownTimes) {
  const inspect_hold holds[] = {{0, 3, true, -1}, {1, 5, false, 1700000000123}};
  inspect_row complete;
  complete.key = "a\"b";
  complete.present = complete.complete = true;
  complete.tp_world_size = complete.confirmations = 2;
  complete.last_used_ms = 1700000000000;
  complete.leased_until_ms = 1700000010000;
  complete.holds = holds;
  inspect_row absent;
  absent.key = "z";
  inspect_row reserved;
  reserved.key = "r";
  reserved.holds = std::span<const inspect_hold>(holds + 1, 1);
  inspect_row incomplete = reserved;
  incomplete.key = "i";
  incomplete.present = true;
  incomplete.tp_world_size = 2;
  incomplete.confirmations = 1;
  incomplete.incomplete_since_ms = 1600000000000;
  const inspect_row rows[] = {complete, absent, reserved, incomplete};
  std::string out;
  encode_inspect(out, rows);
  EXPECT_EQ(out,
            R"({"keys":[)"
            R"({"key":"a\"b","exists":true,"state":"complete","tp_world_size":2,"confirmations":2,)"
            R"("ranks":[{"rank":0,"page":3,"state":"bound"},{"rank":1,"page":5,"state":"reserved",)"
            R"("reserved_until":1700000000123}],"incomplete_since":null,"last_used":1700000000000,)"
            R"("leased_until":1700000010000},)"
            R"({"key":"z","exists":false,"state":"absent","tp_world_size":0,"confirmations":0,)"
            R"("ranks":[],"incomplete_since":null,"last_used":null,"leased_until":null},)"
            R"({"key":"r","exists":false,"state":"reserved","tp_world_size":0,"confirmations":0,)"
            R"("ranks":[{"rank":1,"page":5,"state":"reserved","reserved_until":1700000000123}],)"
            R"("incomplete_since":null,"last_used":null,"leased_until":null},)"
            R"({"key":"i","exists":false,"state":"incomplete","tp_world_size":2,"confirmations":1,)"
            R"("ranks":[{"rank":1,"page":5,"state":"reserved","reserved_until":1700000000123}],)"
            R"("incomplete_since":1600000000000,"last_used":null,"leased_until":null}]})");
}

TEST(EncodeInspect, SglangStates) {
  const sg_inspect_row rows[] = {{"b", 3, 1700000000000, -1, -1, false},
                                 {"f", -1, -1, 7, -1, true},
                                 {"\n", -1, -1, -1, -1, false}};
  std::string out;
  encode_sglang_inspect(out, rows);
  EXPECT_EQ(out, R"({"keys":[{"key":"b","exists":true,"state":"bound","page":3,)"
                 R"("leased_until":1700000000000,"reserved_page":null,"reserved_until":null,)"
                 R"("reserved_before_clear":false},{"key":"f","exists":false,"state":"in_flight",)"
                 R"("page":null,"leased_until":null,"reserved_page":7,"reserved_until":null,)"
                 R"("reserved_before_clear":true},{"key":"\n","exists":false,"state":"absent",)"
                 R"("page":null,"leased_until":null,"reserved_page":null,"reserved_until":null,)"
                 R"("reserved_before_clear":false}]})");
}

}  // namespace
}  // namespace metad::api
