// The commands the decoders fill (one per vLLM endpoint), the keys they carry and the
// decoding error. No JSON here: what a request asks for, once decoded.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace metad::api {

// A decoding failure: always a 4xx with a JSON detail.
struct error {
  int status = 0;  // 0: no error
  std::string detail;
  explicit operator bool() const { return status != 0; }
};

// Keys copied out of the request (the parser's buffer is reused by the next request,
// while this one may still be travelling between cores).
class key_list {
 public:
  key_list() = default;
  // Copies and moves re-point the views at the new owner's bytes (a moved std::string
  // may keep short keys inline, so its data pointer can change).
  key_list(const key_list& other);
  key_list(key_list&& other) noexcept;
  key_list& operator=(const key_list& other);
  key_list& operator=(key_list&& other) noexcept;
  ~key_list() = default;

  void clear();
  // Replaces the contents with copies of `keys` (which may alias this list): the
  // storage is sized once, so the views never move.
  void assign(std::span<const std::string_view> keys);
  // The same, for keys that all point into one buffer (a parsed body's strings, as the
  // decoder's are): the range they span is copied at once when they are in order and
  // close together, else key by key.
  void assign_within_one_buffer(std::span<const std::string_view> keys);
  std::span<const std::string_view> views() const { return views_; }
  std::size_t size() const { return views_.size(); }
  // Heap bytes it holds.
  std::size_t capacity_bytes() const {
    return bytes_.capacity() + views_.capacity() * sizeof(std::string_view);
  }
  std::string_view operator[](std::size_t i) const { return views_[i]; }

 private:
  void take(key_list& other) noexcept;
  void rebase(const char* old_base) noexcept;

  std::string bytes_;
  std::vector<std::string_view> views_;
};

enum class init_kind : std::uint8_t { scheduler, worker, invalid_parameters };

struct initialize_cmd {
  std::int64_t rank = 0;
  init_kind kind = init_kind::invalid_parameters;
  std::int64_t num_pages = 0;
};
struct allocate_cmd {
  std::int64_t rank = 0;
  key_list keys;  // bare keys; prefix keys are accepted and dropped
};
struct confirm_cmd {
  std::int64_t rank = 0;
  key_list keys;                       // confirmation i binds keys[i] ...
  std::vector<std::int64_t> pages;     // ... to pages[i] (>= 0)
  std::vector<std::int64_t> releases;  // pages_to_release (>= 0)
};
struct exists_cmd {
  key_list keys;
};
struct delete_cmd {
  key_list keys;
};
// POST /keys/inspect (and SGLang's /{rank}/inspect): at most kInspectKeysMax keys.
inline constexpr std::size_t kInspectKeysMax = 256;
struct inspect_cmd {
  key_list keys;
};
struct locations_cmd {
  std::int64_t rank = 0;
  key_list keys;
};

// The {rank} path segment: an optional '-' or '+' then decimal digits, within int64.
bool parse_rank(std::string_view text, std::int64_t& rank);

}  // namespace metad::api
