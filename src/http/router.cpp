#include "http/router.hpp"

namespace http {
namespace {

route post_only(method verb, endpoint target) {
  return {verb == method::post ? target : endpoint::method_not_allowed, {}};
}

// HEAD is GET without the body (RFC 9110 9.3.2): the pipeline drops the body.
route get_only(method verb, endpoint target) {
  const bool get = verb == method::get || verb == method::head;
  return {get ? target : endpoint::method_not_allowed_get, {}};
}

// "/rank/{rank}" and "/rank/{rank}/initialize"; `rest` follows "/rank/".
route match_rank(method verb, std::string_view rest) {
  const auto slash = rest.find('/');
  const std::string_view rank = rest.substr(0, slash);
  if (rank.empty()) return {};
  if (slash == std::string_view::npos) {
    return {get_only(verb, endpoint::rank_info).target, rank};
  }
  if (rest.substr(slash) != "/initialize") return {};
  if (verb != method::post) return {endpoint::method_not_allowed, {}};
  return {endpoint::initialize, rank};
}

}  // namespace

route match(method verb, std::string_view path) {
  constexpr std::string_view keys = "/keys/";
  constexpr std::string_view rank = "/rank/";
  if (path.starts_with(keys)) {
    const std::string_view name = path.substr(keys.size());
    if (name == "batch_exists") return post_only(verb, endpoint::batch_exists);
    if (name == "batch_allocate") return post_only(verb, endpoint::batch_allocate);
    if (name == "confirm_write") return post_only(verb, endpoint::confirm_write);
    if (name == "get_locations") return post_only(verb, endpoint::get_locations);
    if (name == "delete") return post_only(verb, endpoint::delete_keys);
    return {};
  }
  if (path.starts_with(rank)) return match_rank(verb, path.substr(rank.size()));
  if (path == "/clear") return post_only(verb, endpoint::clear);
  if (path == "/health") return get_only(verb, endpoint::health);
  if (path == "/ready") return get_only(verb, endpoint::ready);
  if (path == "/metrics") return get_only(verb, endpoint::metrics);
  if (path == "/stats") return get_only(verb, endpoint::stats);
  return {};
}

}  // namespace http
