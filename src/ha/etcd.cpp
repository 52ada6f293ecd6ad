#include "ha/etcd.hpp"

#include <fmt/format.h>

#include <tuple>

#include "ha/base64.hpp"
#include "ha/parse_int.hpp"
#include "metad/log.hpp"

namespace metad::ha {
namespace json {

std::string campaign_txn(std::string_view key, std::string_view value, std::int64_t lease) {
  const std::string k = base64_encode(key);
  // Both branches read the key back: on success its create_revision is the epoch, on
  // failure it names the holder (and a retried txn that had won finds its own lease).
  return fmt::format(
      R"({{"compare":[{{"key":"{0}","target":"CREATE","result":"EQUAL","create_revision":"0"}}],)"
      R"("success":[{{"request_put":{{"key":"{0}","value":"{1}","lease":"{2}"}}}},)"
      R"({{"request_range":{{"key":"{0}"}}}}],)"
      R"("failure":[{{"request_range":{{"key":"{0}"}}}}]}})",
      k, base64_encode(value), lease);
}

std::string read_txn(const std::vector<std::string>& keys) {
  std::string out = R"({"success":[)";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out += fmt::format(R"({}{{"request_range":{{"key":"{}"}}}})", i == 0 ? "" : ",",
                       base64_encode(keys[i]));
  }
  out += "]}";
  return out;
}

std::string fenced_put_txn(std::string_view fence_key, std::int64_t epoch, std::string_view key,
                           std::string_view value) {
  return fmt::format(
      R"({{"compare":[{{"key":"{}","target":"CREATE","result":"EQUAL","create_revision":"{}"}}],)"
      R"("success":[{{"request_put":{{"key":"{}","value":"{}"}}}}]}})",
      base64_encode(fence_key), epoch, base64_encode(key), base64_encode(value));
}

std::string delete_if_unchanged_txn(std::string_view key, std::int64_t mod_revision) {
  const std::string k = base64_encode(key);
  return fmt::format(
      R"({{"compare":[{{"key":"{0}","target":"MOD","result":"EQUAL","mod_revision":"{1}"}}],)"
      R"("success":[{{"request_delete_range":{{"key":"{0}"}}}}]}})",
      k, mod_revision);
}

std::string watch_create(std::string_view key, std::int64_t start_revision) {
  return fmt::format(R"({{"create_request":{{"key":"{}","start_revision":"{}"}}}})",
                     base64_encode(key), start_revision);
}

std::string quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string authenticate(std::string_view user, std::string_view password) {
  return fmt::format(R"({{"name":{},"password":{}}})", quote(user), quote(password));
}

bool token_refused(int status, std::string_view body) {
  return status == 401 || body.find("invalid auth token") != std::string_view::npos ||
         body.find("revision of auth store is old") != std::string_view::npos;
}

std::optional<std::int64_t> int64_field(simdjson::dom::element object, std::string_view name) {
  simdjson::dom::element value;
  const auto error = object[name].get(value);
  if (error == simdjson::NO_SUCH_FIELD) return 0;
  if (error) return std::nullopt;
  if (std::int64_t number = 0; value.get_int64().get(number) == simdjson::SUCCESS) return number;
  std::string_view text;
  if (value.get_string().get(text) != simdjson::SUCCESS) return std::nullopt;
  std::int64_t number = 0;
  if (!parse_whole(text, number)) return std::nullopt;
  return number;
}

namespace {

std::optional<std::string> base64_field(simdjson::dom::element object, std::string_view name) {
  std::string_view text;
  const auto error = object[name].get_string().get(text);
  if (error == simdjson::NO_SUCH_FIELD) return std::string();
  if (error) return std::nullopt;
  return base64_decode(text);
}

}  // namespace

std::optional<key_value> parse_kv(simdjson::dom::element kv) {
  key_value out;
  auto key = base64_field(kv, "key");
  auto value = base64_field(kv, "value");
  auto create = int64_field(kv, "create_revision");
  auto mod = int64_field(kv, "mod_revision");
  auto version = int64_field(kv, "version");
  auto lease = int64_field(kv, "lease");
  if (!key || !value || !create || !mod || !version || !lease) return std::nullopt;
  out.key = std::move(*key);
  out.value = std::move(*value);
  out.create_revision = *create;
  out.mod_revision = *mod;
  out.version = *version;
  out.lease = *lease;
  return out;
}

}  // namespace json

namespace {

std::optional<std::int64_t> header_revision(simdjson::dom::element answer) {
  simdjson::dom::element header;
  if (answer["header"].get(header)) return std::nullopt;
  return json::int64_field(header, "revision");
}

// The key of a range answer: nullopt (outer) if malformed, inner nullopt if absent.
std::optional<std::optional<key_value>> range_kv(simdjson::dom::element response) {
  simdjson::dom::element range;
  if (response["response_range"].get(range)) return std::nullopt;
  simdjson::dom::array kvs;
  const auto error = range["kvs"].get_array().get(kvs);
  if (error == simdjson::NO_SUCH_FIELD) return std::optional<key_value>{};
  if (error || kvs.size() > 1) return std::nullopt;
  if (kvs.size() == 0) return std::optional<key_value>{};
  auto kv = json::parse_kv(kvs.at(0).value_unsafe());
  if (!kv) return std::nullopt;
  return std::optional<key_value>{std::move(*kv)};
}

}  // namespace

etcd_client::etcd_client(etcd_access access, std::chrono::milliseconds connect_timeout)
    : access_(std::move(access)), http_(access_.endpoints, connect_timeout, access_.tls) {}

auth_outcome etcd_client::authenticate(time_point deadline, std::string& error) {
  token_.clear();
  if (!access_.authenticates()) return auth_outcome::ok;
  const http_result answer = http_.post(
      "/v3/auth/authenticate", json::authenticate(access_.user, access_.password), deadline);
  if (!answer.ok) {
    error = fmt::format("etcd authentication as {}: {}", access_.user, answer.error);
    return auth_outcome::failed;
  }
  simdjson::dom::element doc;
  const bool is_json = !parser_.parse(answer.body).get(doc);
  std::string_view message = answer.body;
  if (is_json) std::ignore = doc["message"].get(message);
  if (answer.status == 200 && is_json) {
    std::string_view token;
    if (!doc["token"].get(token) && !token.empty()) {
      token_ = token;
      ++authentications_;
      refused_logged_ = false;
      return auth_outcome::ok;
    }
  }
  std::string said(message.substr(0, 200));
  while (!said.empty() && (said.back() == '\n' || said.back() == '\r')) said.pop_back();
  auth_outcome outcome = auth_outcome::failed;
  if (said.find("invalid user ID or password") != std::string::npos) {
    error = fmt::format(
        "etcd refused the password of user {} (--ha-etcd-user, --ha-etcd-password-file): "
        "etcd said \"{}\"",
        access_.user, said);
    outcome = auth_outcome::refused;
  } else if (said.find("CommonName") != std::string::npos) {
    // etcd --client-cert-auth refuses gateway requests whose client certificate has a
    // CN (etcd 3.4: "CommonName of client sending a request against gateway will be
    // ignored and not used as expected").
    error = fmt::format(
        "etcd refuses requests with --ha-etcd-cert {}: its certificate has a Common Name, "
        "which etcd's JSON gateway does not accept with --client-cert-auth; issue one "
        "without a CN (subject alternative names only). etcd said \"{}\"",
        access_.tls_paths.cert, said);
    outcome = auth_outcome::refused;
  } else if (said.find("authentication is not enabled") != std::string::npos) {
    error = fmt::format(
        "etcd's authentication is not enabled, but --ha-etcd-user {} is given: run "
        "etcdctl auth enable (docs/operations.md), or drop --ha-etcd-user",
        access_.user);
    outcome = auth_outcome::refused;
  } else {
    error =
        fmt::format("etcd authentication as {}: HTTP {}: {}", access_.user, answer.status, said);
  }
  return outcome;
}

std::optional<std::string> etcd_client::token(time_point deadline, std::string& error) {
  if (access_.authenticates() && token_.empty()) {
    // etcd checks the password with bcrypt (cost 10: ~0.1 s, several times that on a
    // busy member), longer than a renewal's deadline: bounded by its own, else a node
    // whose token was dropped could time out authenticating for ever. The caller's
    // request may then miss its deadline; the next one has the token.
    const auth_outcome outcome =
        authenticate(std::max(deadline, steady::now() + kAuthenticateTimeout), error);
    if (outcome == auth_outcome::refused && !refused_logged_) {
      // While running (start-up stops on it instead): the password changed, the user
      // was removed... Every request fails until an operator fixes it; say so once.
      refused_logged_ = true;
      metad::log::error("ha: {}", error);
    }
    if (outcome != auth_outcome::ok) return std::nullopt;
    if (authentications_ > 1) {
      metad::log::info(
          "ha: etcd no longer took this node's token (unused past etcd's --auth-token-ttl, "
          "or etcd restarted): authenticated again as {}",
          access_.user);
    }
  }
  return token_;
}

http_result etcd_client::send(std::string_view path, const std::string& json, time_point deadline) {
  // A request that had to wait for an authentication gets its whole time after it.
  const auto budget = deadline - steady::now();
  const auto after_authenticating = [&] { deadline = std::max(deadline, steady::now() + budget); };
  http_result answer;
  const std::uint64_t before = authentications_;
  if (!token(deadline, answer.error)) return answer;
  if (authentications_ != before) after_authenticating();
  answer = http_.post(path, json, deadline, token_);
  if (!access_.authenticates() || !answer.ok || !json::token_refused(answer.status, answer.body)) {
    return answer;
  }
  metad::log::debug("ha: etcd refused the token ({} {})", path, answer.status);
  forget_token();
  http_result again;
  if (!token(deadline, again.error)) return again;
  after_authenticating();
  return http_.post(path, json, deadline, token_);
}

result<simdjson::dom::element> etcd_client::call(std::string_view path, const std::string& json,
                                                 time_point deadline) {
  http_result answer = send(path, json, deadline);
  if (!answer.ok) return result<simdjson::dom::element>::fail(answer.error);
  simdjson::dom::element doc;
  if (parser_.parse(answer.body).get(doc)) {
    return result<simdjson::dom::element>::fail(
        fmt::format("{} {}: answer is not JSON", path, answer.status));
  }
  if (answer.status != 200) {
    std::string_view message = "?";
    std::ignore = doc["message"].get(message);
    return result<simdjson::dom::element>::fail(
        fmt::format("{} {}: {}", path, answer.status, message));
  }
  return {doc, {}};
}

result<lease_grant> etcd_client::grant(std::int64_t ttl_s, time_point deadline) {
  auto doc = call("/v3/lease/grant", fmt::format(R"({{"TTL":"{}"}})", ttl_s), deadline);
  if (!doc) return result<lease_grant>::fail(doc.error);
  const auto id = json::int64_field(*doc, "ID");
  const auto ttl = json::int64_field(*doc, "TTL");
  std::string_view error;
  if (!(*doc)["error"].get(error) && !error.empty()) {
    return result<lease_grant>::fail(fmt::format("lease grant: {}", error));
  }
  if (!id || !ttl || *id == 0 || *ttl <= 0) return result<lease_grant>::fail("bad grant answer");
  return {lease_grant{*id, *ttl}, {}};
}

result<std::int64_t> etcd_client::keepalive(std::int64_t lease, time_point deadline) {
  // A bidirectional stream in gRPC; the gateway takes one request per POST and
  // answers {"result":{...,"TTL":"1"}}, without TTL once the lease is gone.
  auto doc = call("/v3/lease/keepalive", fmt::format(R"({{"ID":"{}"}})", lease), deadline);
  if (!doc) return result<std::int64_t>::fail(doc.error);
  simdjson::dom::element answer;
  if ((*doc)["result"].get(answer)) return result<std::int64_t>::fail("keepalive: no result");
  const auto ttl = json::int64_field(answer, "TTL");
  if (!ttl || *ttl < 0) return result<std::int64_t>::fail("keepalive: bad TTL");
  return {*ttl, {}};
}

result<bool> etcd_client::revoke(std::int64_t lease, time_point deadline) {
  http_result answer = send("/v3/lease/revoke", fmt::format(R"({{"ID":"{}"}})", lease), deadline);
  if (!answer.ok) return result<bool>::fail(answer.error);
  if (answer.status == 200) return {true, {}};
  if (answer.status == 404) return {false, {}};  // "etcdserver: requested lease not found"
  return result<bool>::fail(fmt::format("revoke: HTTP {}", answer.status));
}

result<campaign_outcome> etcd_client::create_if_absent(std::string_view key, std::string_view value,
                                                       std::int64_t lease, time_point deadline) {
  auto doc = call("/v3/kv/txn", json::campaign_txn(key, value, lease), deadline);
  if (!doc) return result<campaign_outcome>::fail(doc.error);
  campaign_outcome out;
  bool succeeded = false;  // omitted by the gateway when false
  std::ignore = (*doc)["succeeded"].get(succeeded);
  out.won = succeeded;
  const auto revision = header_revision(*doc);
  simdjson::dom::array responses;
  if (!revision || (*doc)["responses"].get(responses) || responses.size() == 0) {
    return result<campaign_outcome>::fail("txn: bad answer");
  }
  out.revision = *revision;
  auto holder = range_kv(responses.at(responses.size() - 1).value_unsafe());
  if (!holder) return result<campaign_outcome>::fail("txn: bad range answer");
  out.holder = std::move(*holder);
  return {std::move(out), {}};
}

result<read_outcome> etcd_client::read(const std::vector<std::string>& keys, time_point deadline) {
  auto doc = call("/v3/kv/txn", json::read_txn(keys), deadline);
  if (!doc) return result<read_outcome>::fail(doc.error);
  read_outcome out;
  const auto revision = header_revision(*doc);
  simdjson::dom::array responses;
  if (!revision || (*doc)["responses"].get(responses) || responses.size() != keys.size()) {
    return result<read_outcome>::fail("read: bad answer");
  }
  out.revision = *revision;
  for (simdjson::dom::element response : responses) {
    auto kv = range_kv(response);
    if (!kv) return result<read_outcome>::fail("read: bad range answer");
    out.keys.push_back(std::move(*kv));
  }
  return {std::move(out), {}};
}

result<bool> etcd_client::fenced_put(std::string_view fence_key, std::int64_t epoch,
                                     std::string_view key, std::string_view value,
                                     time_point deadline) {
  auto doc = call("/v3/kv/txn", json::fenced_put_txn(fence_key, epoch, key, value), deadline);
  if (!doc) return result<bool>::fail(doc.error);
  bool succeeded = false;
  std::ignore = (*doc)["succeeded"].get(succeeded);
  return {succeeded, {}};
}

result<bool> etcd_client::delete_if_unchanged(std::string_view key, std::int64_t mod_revision,
                                              time_point deadline) {
  auto doc = call("/v3/kv/txn", json::delete_if_unchanged_txn(key, mod_revision), deadline);
  if (!doc) return result<bool>::fail(doc.error);
  bool succeeded = false;
  std::ignore = (*doc)["succeeded"].get(succeeded);
  return {succeeded, {}};
}

bool etcd_watch::open(etcd_client& client, std::string_view key, std::int64_t start_revision,
                      time_point deadline, std::string& error) {
  const auto& endpoints = client.http().endpoints();
  const std::string body = json::watch_create(key, start_revision);
  next_revision_ = start_revision;
  client_ = &client;
  const auto token = client.token(deadline, error);
  if (!token) return false;
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    const endpoint& to = endpoints[(client.http().current() + i) % endpoints.size()];
    const auto connect_by = std::min(deadline, steady::now() + client.http().connect_timeout());
    if (stream_.open(to, "/v3/watch", body, connect_by, error, client.http().tls(), *token)) {
      if (stream_.http_status() == 200) return true;
      error = fmt::format("watch {}: HTTP {}", to.url, stream_.http_status());
      stream_.close();
    }
    if (steady::now() >= deadline) break;
  }
  return false;
}

etcd_watch::status etcd_watch::next(time_point deadline, std::vector<watch_event>& out,
                                    std::string& error) {
  std::string line;
  for (;;) {
    switch (stream_.next_line(deadline, line, error)) {
      case http_stream::status::timeout:
        return status::timeout;
      case http_stream::status::ended:
        error = "watch stream ended";
        stream_.close();
        return status::ended;
      case http_stream::status::error:
        stream_.close();
        return status::ended;
      case http_stream::status::line:
        break;
    }
    if (line.empty()) continue;
    simdjson::dom::element doc;
    simdjson::dom::element answer;
    if (parser_.parse(line).get(doc) || doc["result"].get(answer)) {
      error = fmt::format("watch: unexpected line {}", line.substr(0, 200));
      stream_.close();
      return status::ended;
    }
    bool canceled = false;
    std::ignore = answer["canceled"].get(canceled);
    if (canceled) {
      std::string_view reason;
      std::ignore = answer["cancel_reason"].get(reason);
      error = fmt::format("watch cancelled: {}", reason);
      // An expired token is only noticed here: the stream is refused, not the request.
      if (client_ != nullptr && json::token_refused(0, reason)) client_->forget_token();
      stream_.close();
      return status::ended;
    }
    simdjson::dom::array events;
    if (answer["events"].get(events) != simdjson::SUCCESS) continue;  // created, progress
    for (simdjson::dom::element event : events) {
      std::string_view type;
      std::ignore = event["type"].get(type);  // PUT is the zero value, omitted
      simdjson::dom::element kv_json;
      std::optional<key_value> kv;
      if (!event["kv"].get(kv_json)) kv = json::parse_kv(kv_json);
      if (!kv) {
        error = "watch: bad event";
        stream_.close();
        return status::ended;
      }
      next_revision_ = std::max(next_revision_, kv->mod_revision + 1);
      out.push_back(
          {type == "DELETE" ? watch_event::kind::del : watch_event::kind::put, std::move(*kv)});
    }
    return status::events;
  }
}

}  // namespace metad::ha
