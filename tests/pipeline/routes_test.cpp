#include "pipeline/routes.hpp"

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <string_view>

namespace metad::pipeline {
namespace {

using http::method;

// What the vLLM table makes of a request: a row's label, or the protocol answer.
constexpr std::string_view not_found = "not_found";
constexpr std::string_view method_not_allowed = "405 allow: POST";
constexpr std::string_view method_not_allowed_get = "405 allow: GET, HEAD";

std::string_view outcome(const http::route& r) {
  switch (r.result) {
    case http::match_result::found:
      return kEndpoints[r.row].label;
    case http::match_result::not_found:
      return not_found;
    case http::match_result::wrong_method:
      return r.allow == http::methods::get ? method_not_allowed_get : method_not_allowed;
  }
  return {};
}

struct route_case {
  method verb;
  std::string_view path;
  std::string_view target;  // a row's label, or one of the three above
  std::string_view rank_text = {};
};

std::ostream& operator<<(std::ostream& os, const route_case& c) {
  return os << "verb " << static_cast<int>(c.verb) << " " << c.path;
}

class RouterTable : public ::testing::TestWithParam<route_case> {};

TEST_P(RouterTable, MatchesPathAndMethod) {
  const route_case& c = GetParam();
  const http::route r = http::match(kPatterns, c.verb, c.path);
  EXPECT_EQ(outcome(r), c.target);
  if (c.target == "initialize" || c.target == "rank_info" || !c.rank_text.empty()) {
    EXPECT_EQ(r.rank_text, c.rank_text);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Endpoints, RouterTable,
    ::testing::Values(
        route_case{method::post, "/rank/0/initialize", "initialize", "0"},
        route_case{method::post, "/rank/-12/initialize", "initialize", "-12"},
        route_case{method::post, "/rank/abc/initialize", "initialize", "abc"},
        route_case{method::post, "/rank/%31/initialize", "initialize", "%31"},
        route_case{method::get, "/rank/3", "rank_info", "3"},
        route_case{method::head, "/rank/3", "rank_info", "3"},
        route_case{method::head, "/health", "health"}, route_case{method::head, "/stats", "stats"},
        route_case{method::get, "/rank/x y", "rank_info", "x y"},
        route_case{method::post, "/keys/batch_allocate", "batch_allocate"},
        route_case{method::post, "/keys/confirm_write", "confirm_write"},
        route_case{method::post, "/keys/batch_exists", "batch_exists"},
        route_case{method::post, "/keys/get_locations", "get_locations"},
        route_case{method::post, "/keys/delete", "delete"},
        route_case{method::post, "/clear", "clear"}, route_case{method::get, "/stats", "stats"},
        route_case{method::post, "/keys/inspect", "inspect"},
        route_case{method::get, "/", "status_page"}, route_case{method::head, "/", "status_page"},
        route_case{method::get, "/status.json", "status"}));

INSTANTIATE_TEST_SUITE_P(
    WrongMethod, RouterTable,
    ::testing::Values(route_case{method::get, "/rank/0/initialize", method_not_allowed},
                      route_case{method::put, "/rank/0/initialize", method_not_allowed},
                      route_case{method::post, "/rank/3", method_not_allowed_get},
                      route_case{method::delete_, "/rank/3", method_not_allowed_get},
                      route_case{method::get, "/keys/batch_allocate", method_not_allowed},
                      route_case{method::put, "/keys/confirm_write", method_not_allowed},
                      route_case{method::options, "/keys/batch_exists", method_not_allowed},
                      route_case{method::patch, "/keys/get_locations", method_not_allowed},
                      route_case{method::get, "/clear", method_not_allowed},
                      route_case{method::delete_, "/clear", method_not_allowed},
                      route_case{method::other, "/clear", method_not_allowed},
                      route_case{method::get, "/keys/delete", method_not_allowed},
                      route_case{method::delete_, "/keys/delete", method_not_allowed},
                      route_case{method::post, "/stats", method_not_allowed_get},
                      route_case{method::delete_, "/stats", method_not_allowed_get},
                      route_case{method::get, "/keys/inspect", method_not_allowed},
                      route_case{method::post, "/", method_not_allowed_get},
                      route_case{method::post, "/status.json", method_not_allowed_get}));

INSTANTIATE_TEST_SUITE_P(
    Unknown, RouterTable,
    ::testing::Values(
        route_case{method::post, "", not_found}, route_case{method::post, "/clear/", not_found},
        route_case{method::post, "/clearx", not_found},
        route_case{method::post, "/CLEAR", not_found},
        route_case{method::post, "//clear", not_found},
        route_case{method::post, "/keys", not_found}, route_case{method::post, "/keys/", not_found},
        route_case{method::post, "/keys/batch_exists/", not_found},
        route_case{method::post, "/keys/batch_exist", not_found},
        route_case{method::post, "/keys/unknown", not_found},
        route_case{method::post, "/keys//batch_exists", not_found},
        route_case{method::get, "/rank", not_found}, route_case{method::get, "/rank/", not_found},
        route_case{method::post, "/rank//initialize", not_found},
        route_case{method::get, "/rank/3/", not_found},
        route_case{method::post, "/rank/3/initialize/", not_found},
        route_case{method::post, "/rank/3/init", not_found},
        route_case{method::post, "/rank/3/4/initialize", not_found},
        route_case{method::get, "/docs", not_found},
        route_case{method::post, "/keys/delete/", not_found},
        route_case{method::post, "/keys/deletes", not_found},
        route_case{method::post, "/keys/DELETE", not_found},
        route_case{method::delete_, "/keys", not_found},
        route_case{method::post, "/delete", not_found},
        route_case{method::get, "/stats/", not_found}, route_case{method::get, "/STATS", not_found},
        route_case{method::get, "/stat", not_found},
        route_case{method::get, "/keys/stats", not_found}, route_case{method::get, "//", not_found},
        route_case{method::get, "/status", not_found},
        route_case{method::get, "/status.json/", not_found},
        route_case{method::get, "/index.html", not_found}));

// SGLang's routes (docs/sglang-api.md): an integer first segment is the default tenant;
// a tenant name before the rank, a named tenant (whose rank segment is checked later).
INSTANTIATE_TEST_SUITE_P(
    Sglang, RouterTable,
    ::testing::Values(
        route_case{method::post, "/0/initialize", "sglang_initialize", "0"},
        route_case{method::post, "/-1/exists", "sglang_exists", "-1"},
        route_case{method::post, "/+01/exists", "sglang_exists", "+01"},
        route_case{method::post, "/3/reserve_and_allocate_page_indices", "sglang_reserve", "3"},
        route_case{method::post, "/3/confirm_write", "sglang_confirm_write", "3"},
        route_case{method::post, "/3/delete_keys", "sglang_delete_keys", "3"},
        route_case{method::post, "/3/clear", "sglang_clear", "3"},
        route_case{method::post, "/3/get_page_indices", "sglang_get_page_indices", "3"},
        route_case{method::post, "/99999999999999999999/exists", "sglang_exists",
                   "99999999999999999999"},
        route_case{method::post, "/llama70b/3/exists", "sglang_tenant_exists", "3"},
        route_case{method::post, "/_a.b-c/3/initialize", "sglang_tenant_initialize", "3"},
        route_case{method::post, "/t/x/clear", "sglang_tenant_clear", "x"},
        route_case{method::post, "/t/0/reserve_and_allocate_page_indices", "sglang_tenant_reserve"},
        route_case{method::post, "/t/0/confirm_write", "sglang_tenant_confirm_write"},
        route_case{method::post, "/t/0/delete_keys", "sglang_tenant_delete_keys"},
        route_case{method::post, "/t/0/get_page_indices", "sglang_tenant_get_page_indices"},
        route_case{method::post, "/3/inspect", "sglang_inspect", "3"},
        route_case{method::post, "/t/0/inspect", "sglang_tenant_inspect"},
        route_case{method::post, "/status.json/0/inspect", not_found},
        route_case{method::get, "/0/exists", method_not_allowed},
        route_case{method::get, "/t/0/exists", method_not_allowed},
        route_case{method::post, "/0/exists/", not_found},
        route_case{method::post, "/x/exists", not_found},
        route_case{method::post, "/1x/exists", not_found},
        route_case{method::post, "/0/unknown", not_found},
        route_case{method::post, "/0/0/exists", not_found},
        route_case{method::post, "/keys/0/exists", not_found},
        route_case{method::post, "/rank/0/exists", not_found},
        route_case{method::post, "/clear/0/exists", not_found},
        route_case{method::post, "/stats/0/exists", not_found},
        route_case{method::post, "/9t/0/exists", not_found},
        route_case{method::post, "/a b/0/exists", not_found},
        route_case{method::post,
                   "/t1234567890123456789012345678901234567890123456789012345678901234/0/exists",
                   not_found},
        route_case{method::post, "/t/u/0/exists", not_found},
        // A tenant may be any name that does not start another row's path.
        route_case{method::post, "/ranks/3/initialize", "sglang_tenant_initialize", "3"}));

// The labels are the metrics' endpoint names, which dashboards use: they do not change.
TEST(RouteTable, LabelsInMetricsOrder) {
  const std::string_view names[] = {"initialize",
                                    "batch_allocate",
                                    "confirm_write",
                                    "batch_exists",
                                    "get_locations",
                                    "clear",
                                    "rank_info",
                                    "health",
                                    "ready",
                                    "metrics",
                                    "delete",
                                    "stats",
                                    "inspect",
                                    "status_page",
                                    "status",
                                    "sglang_initialize",
                                    "sglang_exists",
                                    "sglang_reserve",
                                    "sglang_confirm_write",
                                    "sglang_delete_keys",
                                    "sglang_clear",
                                    "sglang_get_page_indices",
                                    "sglang_inspect",
                                    "sglang_tenant_initialize",
                                    "sglang_tenant_exists",
                                    "sglang_tenant_reserve",
                                    "sglang_tenant_confirm_write",
                                    "sglang_tenant_delete_keys",
                                    "sglang_tenant_clear",
                                    "sglang_tenant_get_page_indices",
                                    "sglang_tenant_inspect",
                                    "not_found",
                                    "method_not_allowed",
                                    "invalid_http"};
  ASSERT_EQ(std::size(names), kRouteLabels);
  for (std::size_t i = 0; i < kRouteLabels; ++i)
    EXPECT_EQ(route_name(static_cast<route_label>(i)), names[i]) << i;
}

TEST(RouteTable, Access) {
  for (const endpoint_row& row : kEndpoints) {
    const bool sglang = row.label.starts_with("sglang_");
    const bool admin = row.label == "clear" || row.label == "delete" ||
                       row.label == "sglang_clear" || row.label == "sglang_tenant_clear";
    // What shows every tenant's state (--tenants-file: the operator's tokens only); /stats
    // shows one tenant's vLLM state (a tenant's token: its own).
    const bool monitor = row.label == "ready" || row.label == "metrics" || row.label == "status";
    // The status page carries no data: it asks for the token and sends it to status.json.
    const access want = row.label == "health" || row.label == "status_page" ? access::open
                        : row.label == "stats"                              ? access::stats
                        : monitor                                           ? access::monitor
                        : sglang && admin                                   ? access::sg_admin
                        : sglang                                            ? access::sg_token
                        : admin                                             ? access::admin
                                                                            : access::token;
    EXPECT_EQ(row.auth, want) << row.label;
  }
}

}  // namespace
}  // namespace metad::pipeline
