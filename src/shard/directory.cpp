#include <algorithm>
#include <limits>

#include "shard/key_map.hpp"
#include "shard/packed_map.hpp"
#include "shard/rank_keys.hpp"
#include "shard/state.hpp"

// directory: this core's slice of key completeness (keys whose key_hash maps here).
// A 32-lowercase-hex key whose tp_world_size fits 16 bits (all of them in practice) is
// one packed_map slot, {tp, count} packed into its 4-byte word; any other key, or a
// larger tp, goes to a key_map with heap key bytes and full int32 counts.
namespace shard {
namespace {

struct completion {
  std::int32_t tp_world_size;
  std::int32_t confirmed_count;  // ranks that confirmed the key
};

// Packed word: tp_world_size in the high 16 bits (a tp <= 0 is stored as 0: like tp 1
// it is complete from the first confirmation), the count in the low 16 bits (>= 1, so
// the word is never 0). The count saturates at 65535: since tp <= 65535, "count >= tp"
// answers the same as with the exact count.
constexpr std::int32_t packed_tp_max = 0xFFFF;
constexpr std::uint32_t packed_count_max = 0xFFFF;

}  // namespace

struct directory::impl {
  packed_map packed;           // hex keys with tp <= packed_tp_max
  key_map<completion> others;  // every other key
};

directory::directory() : impl_(std::make_unique<impl>()) {}
directory::~directory() = default;
directory::directory(directory&&) noexcept = default;
directory& directory::operator=(directory&&) noexcept = default;

void directory::add_confirmation(std::string_view key, std::int32_t tp_world_size) {
  parsed_key p;
  parse_key(key, p);
  if (p.hex) {
    if (std::uint32_t* word = impl_->packed.find(p.packed, p.hash)) {
      if ((*word & packed_count_max) < packed_count_max) ++*word;
      return;
    }
    if (tp_world_size <= packed_tp_max) {
      const auto tp = static_cast<std::uint32_t>(std::max<std::int32_t>(tp_world_size, 0));
      impl_->packed.insert_new(p.packed, p.hash, (tp << 16) | 1u);
      return;
    }
  }
  const std::uint32_t hash = p.hex ? table_hash(key) : static_cast<std::uint32_t>(p.hash);
  if (auto* s = impl_->others.find(key, hash)) {
    if (s->value.confirmed_count < std::numeric_limits<std::int32_t>::max()) {
      ++s->value.confirmed_count;
    }
    return;
  }
  impl_->others.insert_new(key, hash, completion{tp_world_size, 1});
}

bool directory::complete(std::string_view key) const {
  parsed_key p;
  parse_key(key, p);
  if (p.hex) {
    if (const std::uint32_t* word = impl_->packed.find(p.packed, p.hash)) {
      return (*word & packed_count_max) >= (*word >> 16);
    }
    if (impl_->others.size() == 0) return false;
  }
  const std::uint32_t hash = p.hex ? table_hash(key) : static_cast<std::uint32_t>(p.hash);
  const auto* s = impl_->others.find(key, hash);
  return s != nullptr && s->value.confirmed_count >= s->value.tp_world_size;
}

void directory::restore(std::string_view key, std::int32_t tp_world_size, std::int32_t count) {
  parsed_key p;
  parse_key(key, p);
  // Drop any entry the key has, then store it in the form add_confirmation would use.
  if (p.hex) {
    if (std::uint32_t* word = impl_->packed.find(p.packed, p.hash)) impl_->packed.erase(word);
  }
  const std::uint32_t hash = p.hex ? table_hash(key) : static_cast<std::uint32_t>(p.hash);
  if (auto* s = impl_->others.find(key, hash)) impl_->others.erase(*s);
  if (p.hex && tp_world_size <= packed_tp_max && count >= 1) {
    const auto tp = static_cast<std::uint32_t>(std::max<std::int32_t>(tp_world_size, 0));
    const auto n = std::min(static_cast<std::uint32_t>(count), packed_count_max);
    impl_->packed.insert_new(p.packed, p.hash, (tp << 16) | n);
    return;
  }
  impl_->others.insert_new(key, hash, completion{tp_world_size, count});
}

void directory::for_each_key_impl(void* visit, void (*call)(void*, std::string_view, std::int32_t,
                                                            std::int32_t)) const {
  char text[packed_key_chars];
  impl_->packed.for_each([&](const packed_key& k, const std::uint32_t& word) {
    unpack_hex_key(k, text);
    call(visit, std::string_view(text, sizeof text), static_cast<std::int32_t>(word >> 16),
         static_cast<std::int32_t>(word & packed_count_max));
  });
  impl_->others.for_each([&](const key_map<completion>::slot& s) {
    call(visit, key_blob::view(s.key), s.value.tp_world_size, s.value.confirmed_count);
  });
}

std::size_t directory::size() const { return impl_->packed.size() + impl_->others.size(); }
void directory::clear() {
  impl_->packed.clear();
  impl_->others.clear();
}

}  // namespace shard
