#include <limits>

#include "shard/key_map.hpp"
#include "shard/state.hpp"

// directory: this core's slice of key completeness (keys whose key_hash maps here).
namespace shard {
namespace {

struct completion {
  std::int32_t tp_world_size;
  std::int32_t confirmed_count;  // ranks that confirmed the key
};

}  // namespace

struct directory::impl {
  key_map<completion> keys;
};

directory::directory() : impl_(std::make_unique<impl>()) {}
directory::~directory() = default;
directory::directory(directory&&) noexcept = default;
directory& directory::operator=(directory&&) noexcept = default;

void directory::add_confirmation(std::string_view key, std::int32_t tp_world_size) {
  const std::uint32_t hash = table_hash(key);
  if (auto* s = impl_->keys.find(key, hash)) {
    if (s->value.confirmed_count < std::numeric_limits<std::int32_t>::max()) {
      ++s->value.confirmed_count;
    }
    return;
  }
  impl_->keys.insert_new(key, hash, completion{tp_world_size, 1});
}

bool directory::complete(std::string_view key) const {
  const auto* s = impl_->keys.find(key, table_hash(key));
  return s != nullptr && s->value.confirmed_count >= s->value.tp_world_size;
}

std::size_t directory::size() const { return impl_->keys.size(); }
void directory::clear() { impl_->keys.clear(); }

}  // namespace shard
