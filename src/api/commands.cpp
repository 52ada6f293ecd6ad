// key_list (owned copies of request keys) and the {rank} path segment parser.
// Pure values: any core may use them.
#include "api/commands.hpp"

#include <functional>
#include <limits>

namespace metad::api {

namespace {

// True when `p` lies inside [begin, begin + size): compared through std::less, which
// gives a total order over unrelated pointers.
bool points_into(const void* p, const void* begin, std::size_t size) {
  const auto* b = static_cast<const char*>(begin);
  const auto* q = static_cast<const char*>(p);
  std::less<const char*> lt;
  return !lt(q, b) && lt(q, b + size);
}

}  // namespace

key_list::key_list(const key_list& other) : bytes_(other.bytes_) {
  views_.reserve(other.views_.size());
  const char* old_base = other.bytes_.data();
  for (std::string_view v : other.views_) {
    views_.emplace_back(bytes_.data() + (v.data() - old_base), v.size());
  }
}

key_list::key_list(key_list&& other) noexcept { take(other); }

key_list& key_list::operator=(const key_list& other) {
  if (this != &other) {
    key_list copy(other);
    take(copy);
  }
  return *this;
}

key_list& key_list::operator=(key_list&& other) noexcept {
  if (this != &other) take(other);
  return *this;
}

void key_list::take(key_list& other) noexcept {
  const char* old_base = other.bytes_.data();
  bytes_ = std::move(other.bytes_);
  views_ = std::move(other.views_);
  rebase(old_base);
  other.clear();
}

void key_list::rebase(const char* old_base) noexcept {
  const char* base = bytes_.data();
  if (base == old_base) return;
  for (std::string_view& v : views_) {
    v = std::string_view(base + (v.data() - old_base), v.size());
  }
}

void key_list::clear() {
  bytes_.clear();
  views_.clear();
}

void key_list::assign(std::span<const std::string_view> keys) {
  // Keys that point into our own storage (or the span being our views) would be
  // overwritten while copying: build a fresh list instead. Never on the request path.
  bool aliased =
      points_into(keys.data(), views_.data(), views_.capacity() * sizeof(std::string_view));
  std::size_t total = 0;
  for (std::string_view k : keys) {
    total += k.size();
    aliased = aliased || points_into(k.data(), bytes_.data(), bytes_.capacity() + 1);
  }
  if (aliased) {
    key_list fresh;
    fresh.assign(keys);
    take(fresh);
    return;
  }
  bytes_.clear();
  bytes_.reserve(total);
  views_.clear();
  views_.reserve(keys.size());
  for (std::string_view k : keys) {
    const std::size_t offset = bytes_.size();
    bytes_.append(k);
    views_.emplace_back(bytes_.data() + offset, k.size());
  }
}

void key_list::assign_within_one_buffer(std::span<const std::string_view> keys) {
  if (keys.empty()) {
    clear();
    return;
  }
  // One copy of the range the keys span, gaps included, when they are in order and
  // close together: a parsed body's strings lie in document order, 5 bytes apart (10
  // between the keys of [key, ""] pairs). Addresses are compared as integers, so keys
  // from other buffers (a caller's mistake) only fail these tests.
  constexpr std::size_t gap_max = 16;  // per key, on average
  auto address = [](std::string_view k) { return reinterpret_cast<std::uintptr_t>(k.data()); };
  const std::uintptr_t first = address(keys.front());
  std::uintptr_t end = first;
  std::size_t total = 0;
  bool in_order = true;
  for (std::string_view k : keys) {
    total += k.size();
    in_order = in_order && address(k) >= end;
    end = address(k) + k.size();
  }
  const std::size_t span = end - first;
  const bool aliased =
      points_into(keys.front().data(), bytes_.data(), bytes_.capacity() + 1) ||
      points_into(keys.data(), views_.data(), views_.capacity() * sizeof(std::string_view));
  if (!in_order || aliased || span > total + gap_max * keys.size()) {
    assign(keys);
    return;
  }
  bytes_.assign(keys.front().data(), span);
  views_.clear();
  views_.reserve(keys.size());
  for (std::string_view k : keys)
    views_.emplace_back(bytes_.data() + (address(k) - first), k.size());
}

bool parse_rank(std::string_view text, std::int64_t& rank) {
  std::size_t i = 0;
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    i = 1;
  }
  if (i == text.size()) return false;
  constexpr auto int64_max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  const std::uint64_t limit = negative ? int64_max + 1 : int64_max;
  std::uint64_t value = 0;
  for (; i < text.size(); ++i) {
    const unsigned digit = static_cast<unsigned char>(text[i]) - unsigned{'0'};
    if (digit > 9) return false;
    if (value > (limit - digit) / 10) return false;
    value = value * 10 + digit;
  }
  // Modular conversion (defined in C++20) maps 2^63 to INT64_MIN.
  rank = static_cast<std::int64_t>(negative ? 0 - value : value);
  return true;
}

}  // namespace metad::api
