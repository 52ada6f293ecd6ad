// The path matcher on a table of its own: placeholders, methods, first match. The
// server's table (vLLM's routes) is tested in tests/pipeline/routes_test.cpp.
#include "http/router.hpp"

#include <gtest/gtest.h>

#include <array>
#include <ostream>
#include <string_view>

namespace metad::http {
namespace {

// vLLM's shapes beside SGLang's (POST /{rank}/<op>, and /{tenant}/{rank}/<op>).
constexpr std::array<path_pattern, 6> kRows = {{
    "POST /rank/{rank}/initialize",  // 0
    "GET /rank/{rank}",              // 1
    "POST /keys/batch_exists",       // 2
    "GET /health",                   // 3
    "POST /{int}/exists",            // 4
    "POST /{tenant}/{rank}/exists",  // 5
}};

struct match_case {
  method verb;
  std::string_view path;
  match_result result;
  int row = -1;  // found: the row; wrong_method: -1 for allow POST, -2 for allow GET
  std::string_view rank_text = {};
  std::string_view tenant = {};
};

std::ostream& operator<<(std::ostream& os, const match_case& c) {
  return os << "verb " << static_cast<int>(c.verb) << " " << c.path;
}

class Matcher : public ::testing::TestWithParam<match_case> {};

TEST_P(Matcher, MatchesRowsInOrder) {
  const match_case& c = GetParam();
  const route r = match(kRows, c.verb, c.path);
  ASSERT_EQ(r.result, c.result);
  if (c.result == match_result::found) {
    EXPECT_EQ(r.row, c.row);
    EXPECT_EQ(r.rank_text, c.rank_text);
    EXPECT_EQ(r.tenant, c.tenant);
  } else if (c.result == match_result::wrong_method) {
    EXPECT_EQ(r.allow, c.row == -2 ? methods::get : methods::post);
  }
}

constexpr auto found = match_result::found;
constexpr auto not_found = match_result::not_found;
constexpr auto wrong_method = match_result::wrong_method;

INSTANTIATE_TEST_SUITE_P(
    Placeholders, Matcher,
    ::testing::Values(match_case{method::post, "/rank/7/initialize", found, 0, "7"},
                      match_case{method::get, "/rank/a%20b", found, 1, "a%20b"},
                      match_case{method::head, "/health", found, 3},
                      match_case{method::post, "/0/exists", found, 4, "0"},
                      match_case{method::post, "/-12/exists", found, 4, "-12"},
                      match_case{method::post, "/+01/exists", found, 4, "+01"},
                      // digits too many for int64 still match: the handler's 400
                      match_case{method::post, "/99999999999999999999/exists", found, 4,
                                 "99999999999999999999"},
                      match_case{method::post, "/llama70b/3/exists", found, 5, "3", "llama70b"},
                      match_case{method::post, "/_a.b-c/x/exists", found, 5, "x", "_a.b-c"}));

INSTANTIATE_TEST_SUITE_P(
    Methods, Matcher,
    ::testing::Values(match_case{method::get, "/rank/7/initialize", wrong_method, -1},
                      match_case{method::post, "/rank/7", wrong_method, -2},
                      match_case{method::put, "/health", wrong_method, -2},
                      match_case{method::get, "/0/exists", wrong_method, -1},
                      match_case{method::head, "/t/0/exists", wrong_method, -1},
                      match_case{method::other, "/keys/batch_exists", wrong_method, -1}));

INSTANTIATE_TEST_SUITE_P(
    Unknown, Matcher,
    ::testing::Values(match_case{method::post, "", not_found},
                      match_case{method::post, "/", not_found},
                      match_case{method::post, "exists", not_found},
                      match_case{method::post, "/exists", not_found},
                      match_case{method::post, "//exists", not_found},
                      match_case{method::post, "/0/exists/", not_found},
                      match_case{method::post, "/0//exists", not_found},
                      match_case{method::post, "/+/exists", not_found},
                      match_case{method::post, "/-/exists", not_found},
                      match_case{method::post, "/1a/exists", not_found},
                      match_case{method::post, "/0/Exists", not_found},
                      // a non-integer first segment is a tenant, which needs a rank
                      match_case{method::post, "/abc/exists", not_found},
                      // tenant names: a letter or '_' first, at most 64 characters
                      match_case{method::post, "/9t/0/exists", not_found},
                      match_case{method::post, "/-t/0/exists", not_found},
                      match_case{method::post, "/t!/0/exists", not_found},
                      match_case{
                          method::post,
                          "/t1234567890123456789012345678901234567890123456789012345678901234/"
                          "0/exists",
                          not_found},
                      // nor another row's literal first segment
                      match_case{method::post, "/rank/0/exists", not_found},
                      match_case{method::post, "/keys/0/exists", not_found},
                      match_case{method::post, "/health/0/exists", not_found},
                      match_case{method::post, "/t//exists", not_found}));

TEST(Matcher, TenantOfSixtyFourCharacters) {
  const std::string_view path =
      "/t123456789012345678901234567890123456789012345678901234567890123/0/exists";
  const route r = match(kRows, method::post, path);
  ASSERT_EQ(r.result, found);
  EXPECT_EQ(r.row, 5);
  EXPECT_EQ(r.tenant.size(), 64u);
}

}  // namespace
}  // namespace metad::http
