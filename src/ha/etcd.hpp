// The etcd v3 calls the leader lease needs, over the JSON gateway (keys and values
// base64, int64 fields as JSON strings): lease grant / keepalive / revoke, the
// create-if-absent campaign txn, reads, the epoch-fenced write and a one-key watch.
// Blocking with deadlines; owned and used by the ha thread only. With etcd's password
// authentication (etcd_access::user) every request carries a token from
// /v3/auth/authenticate, fetched again when etcd no longer takes it.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ha/etcd_access.hpp"
#include "ha/http_client.hpp"

namespace metad::ha {

// A value or the reason there is none (transport failure, HTTP error, bad answer).
template <typename T>
struct result {
  std::optional<T> value;
  std::string error;
  explicit operator bool() const { return value.has_value(); }
  T& operator*() { return *value; }
  T* operator->() { return &*value; }
  static result fail(std::string why) { return {std::nullopt, std::move(why)}; }
};

struct key_value {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

struct lease_grant {
  std::int64_t id = 0;
  std::int64_t ttl_s = 0;
};

struct campaign_outcome {
  bool won = false;
  std::int64_t revision = 0;  // the store's revision when the txn ran
  // The leader key after the txn: ours when won (its create_revision is the epoch),
  // else the holder's; absent only if it vanished between compare and read.
  std::optional<key_value> holder;
};

struct read_outcome {
  std::int64_t revision = 0;
  std::vector<std::optional<key_value>> keys;  // one per key asked, in order
};

struct watch_event {
  enum class kind { put, del };
  kind type = kind::put;
  key_value kv;
};

// What authenticate() got: a token; `refused`: etcd answered that these credentials
// are wrong, or that it will not authenticate this client at all (a configuration
// error: retrying cannot help); `failed`: no usable answer (down, timeout).
enum class auth_outcome { ok, refused, failed };

// How long an authentication may take, whatever the request that needs it allows.
inline constexpr std::chrono::milliseconds kAuthenticateTimeout{2000};

class etcd_client {
 public:
  etcd_client(etcd_access access, std::chrono::milliseconds connect_timeout);

  // Password authentication: a new token (replacing any), or why not in `error` (the
  // password never in it). With no user: ok, nothing asked.
  auth_outcome authenticate(time_point deadline, std::string& error);
  // The token requests carry: authenticates first when there is none. Empty without
  // authentication; nullopt (why in `error`) when authentication failed.
  std::optional<std::string> token(time_point deadline, std::string& error);
  // The token was refused (etcd restarted, or it expired unused for etcd's
  // --auth-token-ttl): the next request authenticates again.
  void forget_token() { token_.clear(); }
  // Tokens fetched so far (tests, and the log line on a re-authentication).
  std::uint64_t authentications() const { return authentications_; }
  const etcd_access& access() const { return access_; }

  result<lease_grant> grant(std::int64_t ttl_s, time_point deadline);
  // The TTL etcd granted on renewal; 0 when the lease no longer exists.
  result<std::int64_t> keepalive(std::int64_t lease, time_point deadline);
  // true: revoked; false: no such lease.
  result<bool> revoke(std::int64_t lease, time_point deadline);
  // Puts key = value bound to the lease if the key does not exist (create_revision 0).
  result<campaign_outcome> create_if_absent(std::string_view key, std::string_view value,
                                            std::int64_t lease, time_point deadline);
  // Reads several keys at one revision (a txn of ranges).
  result<read_outcome> read(const std::vector<std::string>& keys, time_point deadline);
  // Puts key = value only while fence_key's create_revision == epoch; false if not.
  result<bool> fenced_put(std::string_view fence_key, std::int64_t epoch, std::string_view key,
                          std::string_view value, time_point deadline);
  // Deletes key only while its mod_revision == mod_revision (unchanged since it was
  // read); false if it changed or is gone.
  result<bool> delete_if_unchanged(std::string_view key, std::int64_t mod_revision,
                                   time_point deadline);

  http_client& http() { return http_; }

 private:
  result<simdjson::dom::element> call(std::string_view path, const std::string& json,
                                      time_point deadline);
  // POSTs with the token; a request refused for its token (401, "invalid auth token")
  // authenticates again and is sent once more.
  http_result send(std::string_view path, const std::string& json, time_point deadline);

  etcd_access access_;
  http_client http_;
  simdjson::dom::parser parser_;
  std::string token_;
  std::uint64_t authentications_ = 0;
  bool refused_logged_ = false;
};

// Watches one key from a revision over its own connection (the member the client last
// used first, then the others). The stream ends when that member goes away; reopen it
// from next_revision() to miss nothing.
class etcd_watch {
 public:
  enum class status { events, timeout, ended };

  bool open(etcd_client& client, std::string_view key, std::int64_t start_revision,
            time_point deadline, std::string& error);
  // Waits until the deadline for the next answer carrying events (appended to `out`).
  // ended: the stream closed, was cancelled (e.g. the revision was compacted) or failed.
  status next(time_point deadline, std::vector<watch_event>& out, std::string& error);
  std::int64_t next_revision() const { return next_revision_; }
  bool is_open() const { return stream_.is_open(); }
  void close() { stream_.close(); }

 private:
  etcd_client* client_ = nullptr;  // open()'s: told when etcd refuses the stream's token
  http_stream stream_;
  simdjson::dom::parser parser_;
  std::int64_t next_revision_ = 0;
};

// The request bodies, exposed for tests.
namespace json {
std::string campaign_txn(std::string_view key, std::string_view value, std::int64_t lease);
std::string read_txn(const std::vector<std::string>& keys);
std::string fenced_put_txn(std::string_view fence_key, std::int64_t epoch, std::string_view key,
                           std::string_view value);
std::string delete_if_unchanged_txn(std::string_view key, std::int64_t mod_revision);
std::string watch_create(std::string_view key, std::int64_t start_revision);
// /v3/auth/authenticate's body (the strings JSON-escaped).
std::string authenticate(std::string_view user, std::string_view password);
// A JSON string literal of `text`, quotes included.
std::string quote(std::string_view text);
// An answer that refuses the request's token (expired, unknown after an etcd restart,
// or issued before the auth store changed): authenticate again and retry.
bool token_refused(int status, std::string_view body);
// "123" or 123 or absent (the gateway omits zero values) → the int64; nullopt if malformed.
std::optional<std::int64_t> int64_field(simdjson::dom::element object, std::string_view name);
std::optional<key_value> parse_kv(simdjson::dom::element kv);
}  // namespace json

}  // namespace metad::ha
