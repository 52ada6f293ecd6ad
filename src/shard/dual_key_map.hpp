// dual_key_map: request key → value, in the two forms keys take. A key of 32 lowercase
// hex characters (vLLM's block hashes: nearly all keys) lives packed in a packed_map, one
// nonzero 4-byte word and no heap block; any other key, and a hex key its user chooses
// to store so (a value that does not fit a word), lives in a key_map<Other> with its
// bytes on the heap. A key is in one of the two at most. Single-threaded: only the
// owning core touches it (a rank's keys, a directory slice, its recency lists).
//
// Invariants (verify()):
// - every key of the packed form has a nonzero word and a lookup of it finds that word;
// - every key of the key_map form has heap bytes, its slot's hash is table_hash of them,
//   and a lookup of them finds that slot;
// - a hex key of the key_map form is not also in the packed form (one form at most);
// - each form holds as many keys as it counts, and hex_others() counts exactly the hex
//   keys of the key_map form.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "metad/assert.hpp"
#include "shard/key_map.hpp"
#include "shard/packed_key.hpp"
#include "shard/packed_map.hpp"

namespace metad::shard {

// A request key, parsed once per call.
struct parsed_key {
  packed_key packed;   // when hex
  std::uint64_t hash;  // packed_hash(packed) when hex, else table_hash(key)
  bool hex;
};

// Parses in place: returning the struct by value costs a store-forwarding stall per key
// (the copy reads back bytes just written by narrower stores).
inline void parse_key(std::string_view key, parsed_key& p) {
  p.hex = pack_hex_key(key, p.packed);
  p.hash = p.hex ? packed_hash(p.packed) : table_hash(key);
}

// A stored key named without its text (owner records, recency nodes): its packed form,
// or the key_map's heap copy of it, whose address is stable until the key is erased.
struct key_handle {
  packed_key packed;           // when blob == nullptr
  const char* blob = nullptr;  // the key's bytes in the key_map form
  bool operator==(const key_handle&) const = default;
};
static_assert(sizeof(key_handle) == 24);

template <class Other>
class dual_key_map {
 public:
  using other_map = key_map<Other>;
  using other_slot = typename other_map::slot;

  // Where find() found a key: `word` in the packed form, or `slot` in the key_map form
  // (neither: absent). Valid until the next insert, erase or advance_growth.
  template <bool Const>
  struct basic_entry {
    std::conditional_t<Const, const std::uint32_t*, std::uint32_t*> word = nullptr;
    std::conditional_t<Const, const other_slot*, other_slot*> slot = nullptr;
    explicit operator bool() const { return word != nullptr || slot != nullptr; }
    // The value in whichever form holds it (a map whose two forms hold the same word).
    auto* value() const requires std::same_as<Other, std::uint32_t> {
      return word != nullptr ? word : slot != nullptr ? &slot->value : nullptr;
    }
  };
  using entry = basic_entry<false>;
  using const_entry = basic_entry<true>;

  std::size_t size() const { return packed_.size() + others_.size(); }
  std::size_t packed_size() const { return packed_.size(); }
  std::size_t other_size() const { return others_.size(); }
  // Keys of the hex form stored in the key_map form (0 unless the user puts them there).
  std::size_t hex_others() const { return hex_others_; }

  entry find(std::string_view key, const parsed_key& p) {
    if (p.hex) {
      if (std::uint32_t* word = packed_.find(p.packed, p.hash)) return {word, nullptr};
      if (hex_others_ == 0) return {};
    }
    return {nullptr, find_other(key, p)};
  }
  const_entry find(std::string_view key, const parsed_key& p) const {
    const entry e = const_cast<dual_key_map*>(this)->find(key, p);
    return {e.word, e.slot};
  }
  // The entry a handle names, which must be stored.
  entry find(const key_handle& h) {
    if (h.blob == nullptr) return {packed_.find(h.packed, packed_hash(h.packed)), nullptr};
    const std::string_view key = key_blob::view(h.blob);
    other_slot* s = others_.find(key, table_hash(key));
    METAD_ASSERT(s == nullptr || s->key == h.blob);
    return {nullptr, s};
  }
  const_entry find(const key_handle& h) const {
    const entry e = const_cast<dual_key_map*>(this)->find(h);
    return {e.word, e.slot};
  }
  // The packed form's word of `k` (h = packed_hash(k)), or nullptr; the key_map form is
  // not looked at (recovery's packed records).
  std::uint32_t* find_packed(const packed_key& k, std::uint64_t h) { return packed_.find(k, h); }

  // The value of a key, in whichever form (a map whose two forms hold the same word).
  std::uint32_t* find_value(std::string_view key,
                            const parsed_key& p) requires std::same_as<Other, std::uint32_t> {
    if (p.hex) {
      if (std::uint32_t* word = packed_.find(p.packed, p.hash)) return word;
      if (hex_others_ == 0) return nullptr;
    }
    other_slot* s = find_other(key, p);
    return s == nullptr ? nullptr : &s->value;
  }
  const std::uint32_t* find_value(
      std::string_view key, const parsed_key& p) const requires std::same_as<Other, std::uint32_t> {
    return const_cast<dual_key_map*>(this)->find_value(key, p);
  }

  // Starts loading the lines a lookup of a hex key reads (batches parse first, then probe).
  void prefetch(const parsed_key& p) const {
    if (p.hex && packed_.size() != 0) packed_.prefetch(p.hash);
  }

  // Inserts the absent hex key in the packed form, with word != 0.
  void insert_packed(const parsed_key& p, std::uint32_t word) {
    METAD_ASSERT(p.hex);
    packed_.insert_new(p.packed, p.hash, word);
  }
  // Inserts the absent key in the key_map form (a hex one too); returns its heap copy.
  const char* insert_other(std::string_view key, const parsed_key& p, const Other& value) {
    const char* blob = others_.insert_new(key, other_hash(key, p), value).key;
    if (p.hex) ++hex_others_;
    return blob;
  }
  // Inserts the absent key in its own form, with word != 0.
  key_handle insert(std::string_view key, const parsed_key& p,
                    std::uint32_t word) requires std::same_as<Other, std::uint32_t> {
    if (p.hex) {
      insert_packed(p, word);
      return {p.packed, nullptr};
    }
    return {{}, insert_other(key, p, word)};
  }

  // Erases a found entry (its heap copy too).
  void erase(const entry& e) {
    METAD_ASSERT(e);
    if (e.word != nullptr) {
      packed_.erase(e.word);
      return;
    }
    if (hex_others_ != 0 && is_hex(key_blob::view(e.slot->key))) --hex_others_;
    others_.erase(*e.slot);
  }

  // fn(const packed_key&, const std::uint32_t& word) for each key of the packed form.
  template <class Fn>
  void for_each_packed(Fn&& fn) const {
    packed_.for_each(fn);
  }
  // fn(const other_slot&) for each key of the key_map form.
  template <class Fn>
  void for_each_other(Fn&& fn) const {
    others_.for_each(fn);
  }

  // The key a handle names, as the client sent it.
  static void key_text(const key_handle& h, std::string& out) {
    if (h.blob != nullptr) {
      out.assign(key_blob::view(h.blob));
    } else {
      out.resize(packed_key_chars);
      unpack_hex_key(h.packed, out.data());
    }
  }

  // Recovery (bulk loading) and growth of the packed form: see packed_map.
  void reserve(std::size_t n) { packed_.reserve(n); }
  void set_bulk(bool on) { packed_.set_bulk(on); }
  void shrink_to_fit() { packed_.shrink_to_fit(); }
  void advance_growth() { packed_.advance_growth(); }

  void clear() noexcept {
    packed_.clear();
    others_.clear();
    hex_others_ = 0;
  }

  // The invariants above, O(size()): "" when they hold, else the first broken one.
  std::string verify() const {
    std::size_t packed = 0, others = 0, hex = 0;
    std::string e;
    packed_.for_each([&](const packed_key& k, const std::uint32_t& word) {
      ++packed;
      if (!e.empty()) return;
      if (word == 0) {
        e = "a packed key has the empty word 0";
      } else if (packed_.find(k, packed_hash(k)) != &word) {
        e = "a packed key is not found where it is stored";
      }
    });
    if (!e.empty()) return "dual_key_map: " + e;
    others_.for_each([&](const other_slot& s) {
      ++others;
      if (!e.empty()) return;
      if (s.key == nullptr) {
        e = "a key_map slot counted as used has no key";
        return;
      }
      const std::string_view key = key_blob::view(s.key);
      if (s.hash != table_hash(key)) {
        e = "key '" + std::string(key) + "' has a slot hash that is not its table_hash";
      } else if (others_.find(key, s.hash) != &s) {
        e = "key '" + std::string(key) + "' is not found where it is stored";
      } else if (packed_key k; pack_hex_key(key, k)) {
        ++hex;
        if (packed_.find(k, packed_hash(k)) != nullptr)
          e = "hex key '" + std::string(key) + "' is in both forms";
      }
    });
    if (!e.empty()) return "dual_key_map: " + e;
    if (packed != packed_.size() || others != others_.size()) {
      return "dual_key_map: " + std::to_string(packed) + " packed and " + std::to_string(others) +
             " other keys stored, " + std::to_string(packed_.size()) + " and " +
             std::to_string(others_.size()) + " counted";
    }
    if (hex != hex_others_) {
      return "dual_key_map: " + std::to_string(hex) + " hex keys in the key_map form, " +
             std::to_string(hex_others_) + " counted";
    }
    return {};
  }

 private:
  static bool is_hex(std::string_view key) {
    packed_key unused;
    return pack_hex_key(key, unused);
  }
  // The key_map form hashes every key with table_hash, a hex one too.
  static std::uint32_t other_hash(std::string_view key, const parsed_key& p) {
    return p.hex ? table_hash(key) : static_cast<std::uint32_t>(p.hash);
  }
  // Out of line: keys of the key_map form are rare, and the packed lookup stays small.
  [[gnu::noinline]] other_slot* find_other(std::string_view key, const parsed_key& p) {
    return others_.find(key, other_hash(key, p));
  }

  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it

  packed_map packed_;           // the hex form
  other_map others_;            // every other key, and hex keys put there
  std::size_t hex_others_ = 0;  // hex keys in others_
};

}  // namespace metad::shard
