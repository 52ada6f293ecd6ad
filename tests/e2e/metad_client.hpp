// The metadata API as the vLLM connector calls it, over one keep-alive connection:
// request bodies built as compact JSON, responses checked for status and shape.
// A call whose answer is not the success the contract promises throws
// unexpected_response; gtest reports it with the request and the answer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "http_client.hpp"
#include "json.hpp"

namespace e2e {

inline constexpr std::int64_t kNoPage = -1;

struct key_page {
  std::string key;
  std::int64_t page = kNoPage;
  bool operator==(const key_page&) const = default;
};

// For readable gtest failure messages.
inline std::ostream& operator<<(std::ostream& os, const key_page& kp) {
  return os << "[\"" << kp.key << "\"," << kp.page << "]";
}

// A get_locations answer: the confirmed page of a complete key, else nothing.
using location = std::optional<std::int64_t>;

// GET /rank/{rank}: the rank's page accounting.
struct rank_counts {
  std::int64_t num_pages = 0;
  std::int64_t free = 0;
  std::int64_t reserved = 0;
  std::int64_t bound = 0;
  std::int64_t incomplete = 0;  // bound pages whose keys are not confirmed on every rank
};

class unexpected_response : public std::runtime_error {
 public:
  unexpected_response(const std::string& request, const http_response& response,
                      const std::string& why)
      : std::runtime_error(why + "\n  request: " + abbreviate(request) +
                           "\n  response: " + abbreviate(response.describe())) {}

 private:
  static std::string abbreviate(const std::string& text) {
    constexpr std::size_t kShown = 400;
    if (text.size() <= kShown) return text;
    return text.substr(0, kShown) + "... (" + std::to_string(text.size()) + " bytes)";
  }
};

// 32 lowercase hex characters, like a vLLM block hash; distinct for distinct (index, salt).
inline std::string make_key(std::uint64_t index, std::uint64_t salt = 0) {
  auto mix = [](std::uint64_t x) {  // splitmix64 finaliser
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(mix(salt)),
                static_cast<unsigned long long>(index));
  return text;
}

inline std::vector<std::string> make_keys(std::size_t count, std::uint64_t salt = 0) {
  std::vector<std::string> keys;
  keys.reserve(count);
  for (std::size_t i = 0; i < count; ++i) keys.push_back(make_key(i, salt));
  return keys;
}

namespace body {

template <typename T, typename Fn>
std::string list(const std::vector<T>& items, Fn&& element) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i != 0) out.push_back(',');
    out += element(items[i]);
  }
  return out + "]";
}

inline std::string keys(const std::vector<std::string>& keys) {
  return list(keys, [](const std::string& k) { return json::quote(k); });
}
// batch_allocate's [[key, prefix_key], ...] with the empty prefix vLLM sends today.
inline std::string key_pairs(const std::vector<std::string>& keys) {
  return list(keys, [](const std::string& k) { return "[" + json::quote(k) + ",\"\"]"; });
}
inline std::string pages(const std::vector<std::int64_t>& pages) {
  return list(pages, [](std::int64_t p) { return std::to_string(p); });
}
inline std::string confirmations(const std::vector<key_page>& pairs) {
  return list(pairs, [](const key_page& kp) {
    return "[" + json::quote(kp.key) + "," + std::to_string(kp.page) + "]";
  });
}

inline std::string initialize_worker(std::int64_t num_pages) {
  return "{\"num_pages\":" + std::to_string(num_pages) + ",\"role\":\"worker\"}";
}
inline std::string batch_allocate(std::int64_t rank, const std::vector<std::string>& ks) {
  return "{\"rank\":" + std::to_string(rank) + ",\"keys\":" + key_pairs(ks) + "}";
}
inline std::string confirm_write(std::int64_t rank, const std::vector<key_page>& confirmed,
                                 const std::vector<std::int64_t>& released) {
  return "{\"rank\":" + std::to_string(rank) + ",\"confirmations\":" + confirmations(confirmed) +
         ",\"pages_to_release\":" + pages(released) + "}";
}
inline std::string batch_exists(const std::vector<std::string>& ks) {
  return "{\"keys\":" + keys(ks) + "}";
}
inline std::string get_locations(std::int64_t rank, const std::vector<std::string>& ks) {
  return "{\"rank\":" + std::to_string(rank) + ",\"keys\":" + keys(ks) + "}";
}

}  // namespace body

// The "results" of a batch_allocate answer; throws if they are not [key, page] pairs.
inline std::vector<key_page> allocation_results(const json::value& answer) {
  std::vector<key_page> results;
  for (const json::value& entry : answer.at("results").as_array()) {
    const json::array& pair = entry.as_array();
    if (pair.size() != 2) throw std::runtime_error("result entry is not a pair");
    results.push_back({pair[0].as_string(), pair[1].as_int()});
  }
  return results;
}

inline std::string initialize_path(std::int64_t rank) {
  return "/rank/" + std::to_string(rank) + "/initialize";
}

// Parses an answer and reads it with `read`; a malformed answer throws
// unexpected_response naming the request.
template <typename Fn>
auto decode(const std::string& request, const http_response& response, Fn&& read) {
  try {
    return read(json::parse(response.body));
  } catch (const std::runtime_error& e) {
    throw unexpected_response(request, response, std::string("malformed answer: ") + e.what());
  }
}

class metad_client {
 public:
  explicit metad_client(std::uint16_t port) : connection_(port) {}

  http_connection& connection() { return connection_; }

  http_response post(const std::string& path, const std::string& request_body) {
    return connection_.post(path, request_body);
  }

  void initialize_scheduler() {
    expect_body(initialize_path(0), R"({"num_pages":0,"role":"scheduler"})", 200,
                R"({"message":"Scheduler role does not require initialization"})");
  }

  void initialize_worker(std::int64_t rank, std::int64_t num_pages) {
    expect_body(initialize_path(rank), body::initialize_worker(num_pages), 200,
                "{\"message\":\"Rank " + std::to_string(rank) + " initialized with " +
                    std::to_string(num_pages) + " pages\"}");
  }

  // One entry per distinct key, in first-occurrence order (checked by the caller).
  std::vector<key_page> batch_allocate(std::int64_t rank, const std::vector<std::string>& keys) {
    const std::string path = "/keys/batch_allocate";
    const std::string request_body = body::batch_allocate(rank, keys);
    const http_response response = expect_status(path, request_body, 200);
    return decode(path + " " + request_body, response, [&](const json::value& doc) {
      if (doc.at("rank").as_int() != rank) throw std::runtime_error("wrong rank echoed");
      return allocation_results(doc);
    });
  }

  void confirm_write(std::int64_t rank, const std::vector<key_page>& confirmed,
                     const std::vector<std::int64_t>& released = {}) {
    const std::string request_body = body::confirm_write(rank, confirmed, released);
    const http_response response = expect_status("/keys/confirm_write", request_body, 204);
    if (!response.body.empty()) {
      throw unexpected_response(request_body, response, "a 204 carries no body");
    }
  }

  std::vector<bool> batch_exists(const std::vector<std::string>& keys) {
    const std::string path = "/keys/batch_exists";
    const std::string request_body = body::batch_exists(keys);
    const http_response response = expect_status(path, request_body, 200);
    return decode(path + " " + request_body, response, [&](const json::value& doc) {
      std::vector<bool> exists;
      for (const json::value& flag : doc.at("exists").as_array()) exists.push_back(flag.as_bool());
      if (exists.size() != keys.size()) throw std::runtime_error("one flag per key expected");
      return exists;
    });
  }

  std::vector<location> get_locations(std::int64_t rank, const std::vector<std::string>& keys) {
    const std::string path = "/keys/get_locations";
    const std::string request_body = body::get_locations(rank, keys);
    const http_response response = expect_status(path, request_body, 200);
    return decode(path + " " + request_body, response, [&](const json::value& doc) {
      std::vector<location> locations;
      for (const json::value& page : doc.at("locations").as_array()) {
        locations.push_back(page.is_null() ? location{} : location{page.as_int()});
      }
      if (locations.size() != keys.size())
        throw std::runtime_error("one location per key expected");
      return locations;
    });
  }

  rank_counts rank_info(std::int64_t rank) {
    const std::string path = "/rank/" + std::to_string(rank);
    const http_response response = connection_.request("GET", path);
    if (response.status != 200) throw unexpected_response("GET " + path, response, "expected 200");
    return decode("GET " + path, response, [](const json::value& doc) {
      return rank_counts{doc.at("num_pages").as_int(), doc.at("free").as_int(),
                         doc.at("reserved").as_int(), doc.at("bound").as_int(),
                         doc.at("incomplete").as_int()};
    });
  }

 private:
  http_response expect_status(const std::string& path, const std::string& request_body,
                              int status) {
    http_response response = connection_.post(path, request_body);
    if (response.status != status) {
      throw unexpected_response("POST " + path + " " + request_body, response,
                                "expected HTTP " + std::to_string(status));
    }
    return response;
  }

  void expect_body(const std::string& path, const std::string& request_body, int status,
                   const std::string& expected) {
    const http_response response = expect_status(path, request_body, status);
    if (response.body != expected) {
      throw unexpected_response("POST " + path + " " + request_body, response,
                                "expected body " + expected);
    }
  }

  http_connection connection_;
};

}  // namespace e2e
