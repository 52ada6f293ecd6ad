#include "http/router.hpp"

#include <gtest/gtest.h>

#include <ostream>
#include <string_view>

namespace http {
namespace {

struct route_case {
  method verb;
  std::string_view path;
  endpoint target;
  std::string_view rank_text = {};
};

std::ostream& operator<<(std::ostream& os, const route_case& c) {
  return os << "verb " << static_cast<int>(c.verb) << " " << c.path;
}

class RouterTable : public ::testing::TestWithParam<route_case> {};

TEST_P(RouterTable, MatchesPathAndMethod) {
  const route_case& c = GetParam();
  const route r = match(c.verb, c.path);
  EXPECT_EQ(r.target, c.target);
  if (c.target == endpoint::initialize || c.target == endpoint::rank_info) {
    EXPECT_EQ(r.rank_text, c.rank_text);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Endpoints, RouterTable,
    ::testing::Values(route_case{method::post, "/rank/0/initialize", endpoint::initialize, "0"},
                      route_case{method::post, "/rank/-12/initialize", endpoint::initialize, "-12"},
                      route_case{method::post, "/rank/abc/initialize", endpoint::initialize, "abc"},
                      route_case{method::post, "/rank/%31/initialize", endpoint::initialize, "%31"},
                      route_case{method::get, "/rank/3", endpoint::rank_info, "3"},
                      route_case{method::head, "/rank/3", endpoint::rank_info, "3"},
                      route_case{method::head, "/health", endpoint::health},
                      route_case{method::head, "/stats", endpoint::stats},
                      route_case{method::get, "/rank/x y", endpoint::rank_info, "x y"},
                      route_case{method::post, "/keys/batch_allocate", endpoint::batch_allocate},
                      route_case{method::post, "/keys/confirm_write", endpoint::confirm_write},
                      route_case{method::post, "/keys/batch_exists", endpoint::batch_exists},
                      route_case{method::post, "/keys/get_locations", endpoint::get_locations},
                      route_case{method::post, "/keys/delete", endpoint::delete_keys},
                      route_case{method::post, "/clear", endpoint::clear},
                      route_case{method::get, "/stats", endpoint::stats}));

INSTANTIATE_TEST_SUITE_P(
    WrongMethod, RouterTable,
    ::testing::Values(
        route_case{method::get, "/rank/0/initialize", endpoint::method_not_allowed},
        route_case{method::put, "/rank/0/initialize", endpoint::method_not_allowed},
        route_case{method::post, "/rank/3", endpoint::method_not_allowed_get},
        route_case{method::delete_, "/rank/3", endpoint::method_not_allowed_get},
        route_case{method::get, "/keys/batch_allocate", endpoint::method_not_allowed},
        route_case{method::put, "/keys/confirm_write", endpoint::method_not_allowed},
        route_case{method::options, "/keys/batch_exists", endpoint::method_not_allowed},
        route_case{method::patch, "/keys/get_locations", endpoint::method_not_allowed},
        route_case{method::get, "/clear", endpoint::method_not_allowed},
        route_case{method::delete_, "/clear", endpoint::method_not_allowed},
        route_case{method::other, "/clear", endpoint::method_not_allowed},
        route_case{method::get, "/keys/delete", endpoint::method_not_allowed},
        route_case{method::delete_, "/keys/delete", endpoint::method_not_allowed},
        route_case{method::post, "/stats", endpoint::method_not_allowed_get},
        route_case{method::delete_, "/stats", endpoint::method_not_allowed_get}));

INSTANTIATE_TEST_SUITE_P(
    Unknown, RouterTable,
    ::testing::Values(route_case{method::get, "/", endpoint::not_found},
                      route_case{method::post, "", endpoint::not_found},
                      route_case{method::post, "/clear/", endpoint::not_found},
                      route_case{method::post, "/clearx", endpoint::not_found},
                      route_case{method::post, "/CLEAR", endpoint::not_found},
                      route_case{method::post, "//clear", endpoint::not_found},
                      route_case{method::post, "/keys", endpoint::not_found},
                      route_case{method::post, "/keys/", endpoint::not_found},
                      route_case{method::post, "/keys/batch_exists/", endpoint::not_found},
                      route_case{method::post, "/keys/batch_exist", endpoint::not_found},
                      route_case{method::post, "/keys/unknown", endpoint::not_found},
                      route_case{method::post, "/keys//batch_exists", endpoint::not_found},
                      route_case{method::get, "/rank", endpoint::not_found},
                      route_case{method::get, "/rank/", endpoint::not_found},
                      route_case{method::post, "/rank//initialize", endpoint::not_found},
                      route_case{method::get, "/rank/3/", endpoint::not_found},
                      route_case{method::post, "/rank/3/initialize/", endpoint::not_found},
                      route_case{method::post, "/rank/3/init", endpoint::not_found},
                      route_case{method::post, "/rank/3/4/initialize", endpoint::not_found},
                      route_case{method::post, "/ranks/3/initialize", endpoint::not_found},
                      route_case{method::get, "/docs", endpoint::not_found},
                      route_case{method::post, "/keys/delete/", endpoint::not_found},
                      route_case{method::post, "/keys/deletes", endpoint::not_found},
                      route_case{method::post, "/keys/DELETE", endpoint::not_found},
                      route_case{method::delete_, "/keys", endpoint::not_found},
                      route_case{method::post, "/delete", endpoint::not_found},
                      route_case{method::get, "/stats/", endpoint::not_found},
                      route_case{method::get, "/STATS", endpoint::not_found},
                      route_case{method::get, "/stat", endpoint::not_found},
                      route_case{method::get, "/keys/stats", endpoint::not_found}));

}  // namespace
}  // namespace http
