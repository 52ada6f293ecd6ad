// The etcd v3 calls the leader lease needs, over the JSON gateway (keys and values
// base64, int64 fields as JSON strings): lease grant / keepalive / revoke, the
// create-if-absent campaign txn, reads, the epoch-fenced write and a one-key watch.
// Blocking with deadlines; owned and used by the ha thread only.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

class etcd_client {
 public:
  etcd_client(std::vector<endpoint> endpoints, std::chrono::milliseconds connect_timeout);

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

  http_client http_;
  simdjson::dom::parser parser_;
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
// "123" or 123 or absent (the gateway omits zero values) → the int64; nullopt if malformed.
std::optional<std::int64_t> int64_field(simdjson::dom::element object, std::string_view name);
std::optional<key_value> parse_kv(simdjson::dom::element kv);
}  // namespace json

}  // namespace metad::ha
