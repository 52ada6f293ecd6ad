#include "pipeline/connection.hpp"

#include <fmt/format.h>

#include <utility>

#include "http/response.hpp"
#include "metad/assert.hpp"
#include "metad/log.hpp"
#include "pipeline/ha_gate.hpp"
#include "smp/clock.hpp"
#include "smp/core.hpp"

namespace metad::pipeline {
namespace {

// Equal-length comparison whose time does not depend on where the first difference is.
bool same_secret(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
  return diff == 0;
}

// The token of "Authorization: Bearer <token>"; the scheme name is case-insensitive (RFC
// 9110 11.1). False when there is none.
bool bearer_token(std::string_view given, std::string_view& token) {
  constexpr std::string_view scheme = "bearer ";
  bool scheme_ok = given.size() > scheme.size();
  for (std::size_t i = 0; scheme_ok && i < scheme.size(); ++i)
    scheme_ok = (given[i] | 0x20) == scheme[i];
  if (scheme_ok) token = given.substr(scheme.size());
  return scheme_ok;
}

}  // namespace

connection::connection(node& nd, core_state& home, net::waker& waker)
    : node_(nd),
      home_(home),
      waker_(waker),
      parser_(http::limits{nd.cfg.header_bytes_max, nd.cfg.body_bytes_max}) {}

net::flow connection::on_bytes(std::size_t bytes) {
  parser_.commit(bytes);
  return advance();
}

net::flow connection::on_resume() {
  parser_.consume();
  if (!keep_alive_) return net::flow::close;
  return advance();
}

// Answers not yet handed to the transport: past this the connection stops reading and
// sends them first (flow::drain), so a client that pipelines requests and never reads
// holds at most this plus one answer here (and as much in the transport's send).
constexpr std::size_t kUnsentBytesMax = 1 << 20;
// Bodies and answers up to this are part of a connection's steady cost (not charged to
// the memory budget, an empty output buffer of this size is kept).
constexpr std::size_t kSteadyBytes = 64 * 1024;
// What a connection's buffers may keep between requests: the usual ones (a 1,250-key
// batch_exists needs ~150 KB) are reused rather than freed and taken again (trimming
// past 8 KiB bodies cost the epoll transport ~50% more CPU per batch_exists in an A/B);
// a bigger request's buffers go back at the next trim().
constexpr std::size_t kRetainedBytesMax = 256 * 1024;

net::flow connection::advance() {
  for (;;) {
    if (out_.size() >= kUnsentBytesMax) return net::flow::drain;
    switch (parser_.next()) {
      case http::parse_status::need_more:
        if (!charge_body()) return refuse_body();
        if (parser_.take_continue_request())
          out_.append(http::canned_bytes(http::canned::continue_100, true));
        return net::flow::read;
      case http::parse_status::error:
        head_ = false;
        start(kInvalidHttp);
        finish(answer::raw(http::parse_error_bytes(parser_.error())));
        return net::flow::close;
      case http::parse_status::ready:
        break;
    }
    const http::request& request = parser_.current();
    keep_alive_ = request.keep_alive && !request.http_1_0;  // spec: 1.0 is answered, then closed
    head_ = request.verb == http::method::head;
    in_flight_ = true;
    dispatch(request);
    if (in_flight_) {  // the endpoint is running on other cores
      parked_ = true;
      return net::flow::wait;
    }
    parser_.consume();
    if (!keep_alive_) return net::flow::close;
  }
}

// A body past the steady size is charged to the memory budget as soon as its size is
// announced, and stays charged until the connection gives its buffers back.
bool connection::charge_body() {
  const std::size_t announced = parser_.body_bytes_announced();
  if (announced <= kSteadyBytes || announced <= body_charge_) return true;
  if (!node_.memory.charge_body(announced - body_charge_)) return false;
  body_charge_ = announced;
  return true;
}

void connection::release_body() { node_.memory.release_body(std::exchange(body_charge_, 0)); }

// The body does not fit the budget: a 503 before it is read, and the connection closes
// (what the client still sends is dropped by the transport's lingering close).
net::flow connection::refuse_body() {
  node_.memory.refused_bodies.fetch_add(1, std::memory_order_relaxed);
  head_ = false;
  keep_alive_ = false;
  start(kInvalidHttp);
  scratch_.detail = fmt::format(
      "Request body of {} bytes refused: it does not fit the memory budget (--memory-max {} "
      "bytes, {} in use)",
      parser_.body_bytes_announced(), node_.memory.max(), node_.memory.used());
  finish(answer::error(503, scratch_.detail));
  return net::flow::close;
}

connection::~connection() { release_body(); }

void connection::trim() {
  if (in_flight_) return;
  release_body();
  if (!grew_) return;
  grew_ = false;
  if (out_.empty() && out_.capacity() > kSteadyBytes) std::string().swap(out_);
  // Every per-request buffer, sized by the requests that used it, goes with `old`. Not
  // `scratch_ = scratch{}`: a string moved from a short one keeps its own allocation.
  scratch old;
  std::swap(scratch_, old);
}

std::size_t connection::buffer_bytes() const {
  const scratch& s = scratch_;
  return parser_.buffer_bytes() + out_.capacity() + s.exists.keys.capacity_bytes() +
         s.locations.keys.capacity_bytes() + s.allocate.keys.capacity_bytes() +
         s.confirm.keys.capacity_bytes() + s.remove.keys.capacity_bytes() + s.body.capacity() +
         s.flags.capacity() + s.pages.capacity() * sizeof(s.pages[0]) +
         s.indices.capacity() * sizeof(s.indices[0]) + s.walk.capacity() * sizeof(s.walk[0]) +
         s.key_owner.capacity() * sizeof(s.key_owner[0]) +
         s.selected.capacity() * sizeof(s.selected[0]) + s.removal.bytes.capacity();
}

void connection::start(route_label route) {
  route_ = route;
  leader_only_ = false;
  status_ = 0;
  started_ns_ = smp::monotonic_ns();
  scratch_.tenant_row = nullptr;
}

void connection::complete() {
  const std::uint64_t elapsed_ns = smp::monotonic_ns() - started_ns_;
  if (buffer_bytes() > kRetainedBytesMax) grew_ = true;
  home_.metrics.record(route_, status_, elapsed_ns);
  if (scratch_.tenant_row != nullptr)
    ++scratch_.tenant_row->requests[static_cast<std::size_t>(scratch_.api)];
  if (node_.cfg.access_log) {
    metad::log::info("access {} {} {} {} {}us", route_name(route_), status_,
                     keep_alive_ ? "keep-alive" : "close",
                     target_.empty() ? std::string_view("-") : target_, elapsed_ns / 1000);
  }
  in_flight_ = false;
  if (parked_) {
    parked_ = false;
    waker_.wake();
  }
}

// Decided when the answer is written, not when the request arrived: a request in flight
// when the stop began is answered after it. Stopping, the last request the connection
// has received says `connection: close`, so that the client sends no more on it; one
// received after it (buffered, or already in the socket) is answered first.
bool connection::answer_keeps_alive() {
  if (keep_alive_ && node_.stopping.load(std::memory_order_relaxed))
    keep_alive_ = parser_.more_buffered() || waker_.input_pending();
  return keep_alive_;
}

void connection::respond_json(int status, std::string_view body) {
  status_ = status;
  http::append_json(out_, status, body, answer_keeps_alive());
  drop_body_of_head(body.size());
}

void connection::respond_metrics(std::string_view text) {
  status_ = 200;
  http::append_body(out_, 200, "text/plain; version=0.0.4; charset=utf-8", text,
                    answer_keeps_alive());
  drop_body_of_head(text.size());
}

void connection::respond_error(int status, std::string_view detail) {
  status_ = status;
  scratch_.body.clear();
  api::encode_error(scratch_.body, detail);
  http::append_json(out_, status, scratch_.body, answer_keeps_alive());
  drop_body_of_head(scratch_.body.size());
}

void connection::respond_canned(http::canned what) {
  const std::string_view bytes = http::canned_bytes(what, answer_keeps_alive());
  status_ = http::status_of(bytes);
  out_.append(bytes);
  drop_body_of_head(bytes.size() - (bytes.find("\r\n\r\n") + 4));
}

void connection::drop_body_of_head(std::size_t body_bytes) {
  // The answer to HEAD has the headers GET's would have (content-length included) and
  // no content (RFC 9110 9.3.2): a body would be read as the start of the next answer.
  if (head_) out_.resize(out_.size() - body_bytes);
}

bool connection::authorized(const http::request& request, access auth) const {
  const metad::config& cfg = node_.cfg;
  if (auth == access::open) return true;
  const bool admin_only =
      (auth == access::admin || auth == access::sg_admin) && !cfg.admin_token.empty();
  const std::string& token = admin_only ? cfg.admin_token : cfg.auth_token;
  if (token.empty()) return true;
  std::string_view given;
  return bearer_token(request.authorization, given) && same_secret(given, token);
}

const tenant_table& connection::current_tenants() {
  // core_state::tenants is this core's own: only its thread takes a new table into it.
  METAD_ASSERT(smp::this_core() == home_.index);
  return node_.tenants.take(home_.tenants);
}

int connection::authorize_tenant(const http::request& request, bool found, http::route& route) {
  const metad::config& cfg = node_.cfg;
  scratch& s = scratch_;
  s.rank_quota = -1;
  s.page_quota = -1;
  s.usage = nullptr;
  const access auth = found ? kEndpoints[route.row].auth : access::token;
  if (auth == access::open) return 0;
  std::string_view given;
  if (!bearer_token(request.authorization, given)) return 401;
  const bool admin_row = auth == access::admin || auth == access::sg_admin;
  // As without tenants: with --admin-token-file, the destructive calls take that token
  // and no other. On SGLang's rows the path names the tenant (/{rank}/clear: the default
  // tenant's pools, those from before --tenants-file or an import); on vLLM's (/clear,
  // /keys/delete) the X-Metad-Tenant header does (none: the unnamed state).
  if (admin_row && !cfg.admin_token.empty()) {
    if (!same_secret(given, cfg.admin_token)) return 401;
    if (auth == access::admin && !request.tenant.empty()) return admin_space(request.tenant);
    return 0;
  }
  // The operator's tokens open what shows every tenant (and the 404s and 405s).
  if ((auth == access::monitor || auth == access::stats || !found) &&
      ((!cfg.auth_token.empty() && same_secret(given, cfg.auth_token)) ||
       (!cfg.admin_token.empty() && same_secret(given, cfg.admin_token)))) {
    if (auth == access::stats && !request.tenant.empty()) return admin_space(request.tenant);
    return 0;
  }
  // One SHA-256 of the token, one hash-map lookup of its digest (tenants.hpp: why this
  // leaks nothing of the token); or, for the token this connection's last request
  // presented under the same table, one constant-time comparison (verified_).
  const tenant_table& table = current_tenants();
  const tenant* t = nullptr;
  // (The comparison's time depends on the presented token's length only.)
  if (verified_.who != nullptr && verified_.version == table.version &&
      same_secret(verified_.token, given)) {
    t = verified_.who;
  } else {
    t = table.find(token_sha256(given));
    if (t == nullptr) return 401;
    verified_.token.assign(given);
    verified_.version = table.version;
    verified_.who = t;
  }
  if (!found) return 0;  // the 404 or 405
  if (auth == access::monitor) {
    s.detail = fmt::format(
        "{} shows every tenant's state: it takes --auth-token-file's or --admin-token-file's "
        "token, not a tenant's (tenant {})",
        kEndpoints[route.row].pattern.path, t->name);
    return 403;
  }
  if (auth == access::token || auth == access::admin || auth == access::stats) {
    // vLLM's API (and /stats): the tenant's own state
    if (t->space < 0) {
      s.detail = fmt::format(
          "tenant {} has no vLLM state: this process has made {} tenants' states, its limit "
          "(restart it to forget those of tenants no longer in --tenants-file)",
          t->name, tenant_registry::kSpacesMax);
      return 503;
    }
    s.space = t->space;
    s.rank_quota = t->ranks;
    s.page_quota = t->pages;
    s.quota_tenant.assign(t->name);
    s.usage = t->usage;
    return 0;
  }
  // SGLang's API: the token's own tenant, whether the path names it or not.
  if (!route.tenant.empty() && route.tenant != t->name) {
    s.detail = fmt::format(
        "tenant {}'s token may not use tenant {}'s pools: a token acts on its own tenant's "
        "(/{}/{{rank}}/... or /{{rank}}/...)",
        t->name, route.tenant, t->name);
    return 403;
  }
  route.tenant = t->name;  // copied by the start function (sg_target), before any reload
  s.rank_quota = t->ranks;
  s.page_quota = t->pages;
  s.usage = t->usage;
  return 0;
}

int connection::admin_space(std::string_view name) {
  scratch& s = scratch_;
  // The `vllm` tenant's state is the unnamed one; any other name's is its own, whether or
  // not the current file has it (a removed tenant's state stays until an operator clears
  // it). A name no state was ever made for has nothing to act on.
  const tenant* vllm = node_.tenants.enabled() ? current_tenants().vllm_tenant() : nullptr;
  if (vllm != nullptr && vllm->name == name) return 0;
  const int space = node_.tenants.find_space(name);
  if (space < 0) {
    s.detail = fmt::format("X-Metad-Tenant: no tenant {} has vLLM state on this server",
                           name.substr(0, 64));
    return 404;
  }
  s.space = space;
  return 0;
}

void connection::count_tenant(const http::route& route) {
  scratch& s = scratch_;
  const access auth = kEndpoints[route.row].auth;
  if (auth == access::token || auth == access::admin) {
    // The row of the request's vLLM space: its tenant's (space 0: the `vllm` tenant's,
    // else the default tenant's). Looked up once per core, space and table, not per request.
    auto& rows = home_.vllm_tenant_rows;
    if (home_.vllm_tenant_version != node_.tenants.version()) {
      rows.clear();
      home_.vllm_tenant_version = node_.tenants.version();
    }
    const auto at = static_cast<std::size_t>(s.space);
    if (at >= rows.size()) rows.resize(at + 1, nullptr);
    if (rows[at] == nullptr) {
      std::string name;
      if (s.space != 0) {
        name = node_.tenants.space_name(s.space);
      } else if (node_.tenants.enabled()) {
        const tenant* owner = current_tenants().vllm_tenant();
        if (owner != nullptr) name = owner->name;
      }
      rows[at] = &home_.tenant_rows.of(name);
    }
    s.api = tenant_api::vllm;
    s.tenant_row = rows[at];
  } else if (auth == access::sg_token || auth == access::sg_admin) {
    s.api = tenant_api::sglang;  // the token's tenant (authorize_tenant) or the path's
    s.tenant_row = &home_.tenant_rows.of(route.tenant);
  }
}

answer connection::refused(api::error err) {
  scratch_.detail = std::move(err.detail);
  return answer::error(err.status, scratch_.detail);
}

void connection::finish(const answer& a) {
  METAD_ASSERT(!a.is_later());
  if (leader_only_) {
    // Fencing (docs/replication.md, "Fencing and lease timing"): the deadline may have
    // passed while the request ran (a group commit, hops). A change already made is then
    // not acknowledged: the client retries, at the leader.
    leader_only_ = false;
    if (!ha_serving(node_, smp::monotonic_ns()))
      return finish(answer::error(503, not_leader_detail(node_)));
  }
  switch (a.kind_) {
    case answer::kind::later:
      return;
    case answer::kind::canned:
      respond_canned(a.canned_);
      break;
    case answer::kind::json:
      respond_json(a.status_, a.text_);
      break;
    case answer::kind::error:
      respond_error(a.status_, a.text_);
      break;
    case answer::kind::metrics:
      respond_metrics(a.text_);
      break;
    case answer::kind::html:
      status_ = 200;
      // The page loads nothing from elsewhere and may be framed by nobody; its script and
      // style are inline. Extra headers ride after the content type.
      http::append_body(out_, 200,
                        "text/html; charset=utf-8\r\n"
                        "cache-control: no-store\r\n"
                        "x-content-type-options: nosniff\r\n"
                        "x-frame-options: DENY\r\n"
                        "referrer-policy: no-referrer\r\n"
                        "content-security-policy: default-src 'none'; script-src 'unsafe-inline'; "
                        "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
                        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                        a.text_, answer_keeps_alive());
      drop_body_of_head(a.text_.size());
      break;
    case answer::kind::raw:
      status_ = http::status_of(a.text_);
      out_.append(a.text_);
      break;
  }
  complete();
}

void endpoint_task::promise_type::return_value(const answer& a) {
  // Endpoints answer on their connection's core.
  METAD_ASSERT(smp::this_core() == x.home().index);
  x.finish(a);
}

// Routes on the home core and hands the request to its row's start function (routes.cpp).
// Requests no row answers (unknown path, wrong method) are answered here; they need the
// token as any endpoint does.
void connection::dispatch(const http::request& request) {
  // Endpoint coroutines hop from this_core(): it must be the connection's core.
  METAD_ASSERT(smp::this_core() == home_.index);
  http::route route = http::match(kPatterns, request.verb, request.target);
  const bool found = route.result == http::match_result::found;
  const bool unknown = route.result == http::match_result::not_found;
  start(found ? route.row : unknown ? kNotFound : kMethodNotAllowed);
  target_ = request.target;
  scratch_.space = 0;             // the unnamed vLLM state, unless a tenant's token says otherwise
  scratch_.quota_tenant.clear();  // no tenant's (authorize_tenant names it)
  if (!node_.tenants.enabled()) {
    const access auth = found ? kEndpoints[route.row].auth : access::token;
    if (!authorized(request, auth)) return finish(answer::canned(http::canned::unauthorized));
    // Tenants' states recovered from a run with --tenants-file: the operator still names
    // one (else the unnamed state).
    if ((auth == access::admin || auth == access::stats) && !request.tenant.empty())
      if (const int refusal = admin_space(request.tenant); refusal != 0)
        return finish(answer::error(refusal, scratch_.detail));
  } else if (const int refusal = authorize_tenant(request, found, route); refusal != 0) {
    if (refusal == 401) return finish(answer::canned(http::canned::unauthorized));
    return finish(answer::error(refusal, scratch_.detail));
  }
  if (!found) {
    return finish(answer::canned(unknown ? http::canned::not_found
                                 : route.allow == http::methods::get
                                     ? http::canned::method_not_allowed_get
                                     : http::canned::method_not_allowed));
  }
  count_tenant(route);
  // High availability: the API answers on the serving leader only (one atomic load).
  leader_only_ = node_.ha != nullptr && kEndpoints[route.row].on == serves::leader;
  if (leader_only_ && !ha_serving(node_, started_ns_)) {
    leader_only_ = false;
    return finish(answer::error(503, not_leader_detail(node_)));
  }
  const answer a = kEndpoints[route.row].start(*this, request, route);
  if (!a.is_later()) finish(a);
}

}  // namespace metad::pipeline
