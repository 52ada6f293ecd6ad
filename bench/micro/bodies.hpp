// Realistic request bodies and requests for the micro benchmarks: the JSON vLLM's client
// posts (compact, 32-hex keys) and the HTTP head python-requests puts in front of it.
#pragma once

#include <cstdint>
#include <string>

#include "common/keys.hpp"

namespace bench {

// {"rank":0,"keys":[["k",""],...]} (batch_allocate) or {"rank":0,"keys":["k",...]}
// (get_locations), or {"keys":[...]} (batch_exists) when rank < 0.
inline std::string keys_body(int count, bool pairs, int rank, std::uint64_t first_id = 0) {
  std::string out = rank < 0 ? "{\"keys\":[" : "{\"rank\":" + std::to_string(rank) + ",\"keys\":[";
  for (int i = 0; i < count; ++i) {
    if (i) out += ',';
    out += pairs ? "[\"" : "\"";
    append_key(out, first_id + static_cast<std::uint64_t>(i));
    out += pairs ? "\",\"\"]" : "\"";
  }
  out += "]}";
  return out;
}

// confirm_write binding key i to page i.
inline std::string confirm_body(int count, int rank) {
  std::string out = "{\"rank\":" + std::to_string(rank) + ",\"confirmations\":[";
  for (int i = 0; i < count; ++i) {
    if (i) out += ',';
    out += "[\"";
    append_key(out, static_cast<std::uint64_t>(i));
    out += "\"," + std::to_string(i) + "]";
  }
  out += "],\"pages_to_release\":[]}";
  return out;
}

inline std::string http_request(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1:18000\r\n"
         "User-Agent: python-requests/2.31.0\r\nAccept-Encoding: gzip, deflate\r\n"
         "Accept: */*\r\nConnection: keep-alive\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nContent-Type: application/json\r\n\r\n" + body;
}

}  // namespace bench
