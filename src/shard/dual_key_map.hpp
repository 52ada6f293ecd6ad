// dual_key_map: request key → value, in the forms keys take. A key of 32 lowercase
// hex characters (vLLM's block hashes: nearly all keys) lives packed in a packed_map, one
// nonzero 4-byte word and no heap block. A key of the other hex shapes (32 uppercase, 64
// of one case: SHA-256 hashes) lives in the wide form: a 24-byte record (its second half,
// its shape and the word) in blocks that never move, found through a packed_map from its
// index key (its first half XOR a mix of the rest and the shape, so that the record and
// the index key give back the whole key). Any other key, a hex key its user chooses to
// store so (a value that does not fit a word), and a wide key whose index key another
// wide key holds (a 128-bit collision: never in practice, but possible) lives in a
// key_map<Other> with its bytes on the heap. A key is in one form at most. Single-
// threaded: only the owning core touches it (a rank's keys, a directory slice, its
// recency lists).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "metad/assert.hpp"
#include "shard/chunked_vector.hpp"
#include "shard/key_map.hpp"
#include "shard/packed_key.hpp"
#include "shard/packed_map.hpp"

namespace metad::shard {

// A request key, parsed once per call.
struct parsed_key {
  packed_key packed;                   // when hex: the key packed; when wide: its index key
  std::uint64_t hash;                  // packed_hash(packed) when hex or wide, else table_hash(key)
  bool hex;                            // 32 lowercase hex characters
  bool wide = false;                   // another hex shape (see key_shape)
  key_shape shape = key_shape::other;  // when wide
  packed_key rest{};  // when wide: characters 32..63 packed (zero for 32 characters)
};

// The mask a wide key's first half is XORed with to make its index key: a mix of its
// other half and its shape, so that two keys sharing a first half (or differing only in
// case) get different index keys, and the record (rest, shape) gives the first half back.
inline packed_key wide_mask(const packed_key& rest, key_shape shape) noexcept {
  auto fold = [](std::uint64_t x, std::uint64_t c) {
    const unsigned __int128 r = static_cast<unsigned __int128>(x) * c;
    return static_cast<std::uint64_t>(r) ^ static_cast<std::uint64_t>(r >> 64);
  };
  const std::uint64_t a = fold(rest.lo ^ 0x2d358dccaa6c78a5ull ^ static_cast<std::uint64_t>(shape),
                               0x8bb84b93962eacc9ull);
  const std::uint64_t b = fold(rest.hi ^ a ^ 0x4b33a62ed433d4a3ull, 0x4d5a2da51de1aa47ull);
  return {a ^ b, fold(b ^ 0x7a5cf3e8e1c0a14full, 0x9fb21c651e98df25ull)};
}

// Out of line: only keys of 32 or 64 characters that are not 32 lowercase hex get here.
[[gnu::noinline]] inline bool parse_wide_key(std::string_view key, parsed_key& p) {
  packed_key first;
  const key_shape shape = pack_any_hex_key(key, first, p.rest);
  if (shape == key_shape::other || shape == key_shape::hex32) return false;
  const packed_key m = wide_mask(p.rest, shape);
  p.packed = {first.lo ^ m.lo, first.hi ^ m.hi};
  p.hash = packed_hash(p.packed);
  p.shape = shape;
  p.wide = true;
  return true;
}

// Parses in place: returning the struct by value costs a store-forwarding stall per key
// (the copy reads back bytes just written by narrower stores).
inline void parse_key(std::string_view key, parsed_key& p) {
  p.hex = pack_hex_key(key, p.packed);
  p.wide = false;
  if (p.hex) {
    p.hash = packed_hash(p.packed);
    return;
  }
  if ((key.size() == 32 || key.size() == 64) && parse_wide_key(key, p)) return;
  p.hash = table_hash(key);
}

// The record of a key in the wide form: in blocks that never move, so a handle may
// point at it. value 0: free (rest.lo then links the free records).
struct wide_record {
  packed_key rest;
  std::uint32_t value = 0;
  key_shape shape = key_shape::other;
};
static_assert(sizeof(wide_record) == 24, "a wide key's record is its cost besides the index");

// A stored key named without its text (owner records, recency nodes): its packed form,
// the key_map's heap copy of it, whose address is stable until the key is erased, or
// (wide form) its index key and its record's address, tagged with bit 0.
struct key_handle {
  packed_key packed;           // when blob == nullptr; the index key when wide
  const char* blob = nullptr;  // the key's bytes in the key_map form, or the wide record | 1
  bool operator==(const key_handle&) const = default;
  bool wide() const { return (reinterpret_cast<std::uintptr_t>(blob) & 1) != 0; }
  const wide_record* record() const {
    return reinterpret_cast<const wide_record*>(reinterpret_cast<std::uintptr_t>(blob) - 1);
  }
  static key_handle of_wide(const packed_key& index_key, const wide_record& r) {
    return {index_key, reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(&r) | 1)};
  }
  // Whether the handle names the key `key` (parsed as p).
  bool names(std::string_view key, const parsed_key& p) const {
    if (blob == nullptr) return p.hex && packed == p.packed;
    if (wide()) {
      const wide_record* r = record();
      return p.wide && packed == p.packed && r->rest == p.rest && r->shape == p.shape;
    }
    return key_blob::view(blob) == key;
  }
};
static_assert(sizeof(key_handle) == 24);

template <class Other>
class dual_key_map {
 public:
  using other_map = key_map<Other>;
  using other_slot = typename other_map::slot;

  // Where find() found a key: `word` in the packed or wide form (`index` set: the wide
  // form, its index entry), or `slot` in the key_map form (neither: absent). Valid until
  // the next insert, erase or advance_growth.
  template <bool Const>
  struct basic_entry {
    std::conditional_t<Const, const std::uint32_t*, std::uint32_t*> word = nullptr;
    std::conditional_t<Const, const other_slot*, other_slot*> slot = nullptr;
    std::conditional_t<Const, const std::uint32_t*, std::uint32_t*> index = nullptr;
    explicit operator bool() const { return word != nullptr || slot != nullptr; }
    // The value in whichever form holds it (a map whose two forms hold the same word).
    auto* value() const requires std::same_as<Other, std::uint32_t> {
      return word != nullptr ? word : slot != nullptr ? &slot->value : nullptr;
    }
  };
  using entry = basic_entry<false>;
  using const_entry = basic_entry<true>;

  std::size_t size() const { return packed_.size() + wide_index_.size() + others_.size(); }
  std::size_t packed_size() const { return packed_.size(); }
  std::size_t wide_size() const { return wide_index_.size(); }
  std::size_t other_size() const { return others_.size(); }
  // Keys of the hex form stored in the key_map form (0 unless the user puts them there).
  std::size_t hex_others() const { return hex_others_; }
  // Keys of the wide shapes stored in the key_map form.
  std::size_t wide_others() const { return wide_others_; }

  entry find(std::string_view key, const parsed_key& p) {
    if (p.hex) {
      if (std::uint32_t* word = packed_.find(p.packed, p.hash)) return {word, nullptr};
      if (hex_others_ == 0) return {};
    } else if (p.wide) {
      if (std::uint32_t* index = wide_index_.find(p.packed, p.hash)) {
        wide_record& r = wide_[*index - 1];
        if (r.rest == p.rest && r.shape == p.shape) return {&r.value, nullptr, index};
      }
      if (wide_others_ == 0) return {};
    }
    return {nullptr, find_other(key, p)};
  }
  const_entry find(std::string_view key, const parsed_key& p) const {
    const entry e = const_cast<dual_key_map*>(this)->find(key, p);
    return {e.word, e.slot, e.index};
  }
  // The entry a handle names, which must be stored.
  entry find(const key_handle& h) {
    if (h.blob == nullptr) return {packed_.find(h.packed, packed_hash(h.packed)), nullptr};
    if (h.wide()) {
      std::uint32_t* index = wide_index_.find(h.packed, packed_hash(h.packed));
      if (index == nullptr) return {};
      wide_record& r = wide_[*index - 1];
      METAD_ASSERT(&r == h.record());
      return {&r.value, nullptr, index};
    }
    const std::string_view key = key_blob::view(h.blob);
    other_slot* s = others_.find(key, table_hash(key));
    METAD_ASSERT(s == nullptr || s->key == h.blob);
    return {nullptr, s};
  }
  const_entry find(const key_handle& h) const {
    const entry e = const_cast<dual_key_map*>(this)->find(h);
    return {e.word, e.slot, e.index};
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
    } else if (p.wide) {
      return find(key, p).value();
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
    if (p.wide && wide_index_.size() != 0) wide_index_.prefetch(p.hash);
  }

  // Inserts the absent hex or wide key in its word form (packed or wide), with word != 0.
  // False (nothing inserted) for a wide key whose index key another key holds: the
  // caller stores it in the key_map form.
  bool insert_packed(const parsed_key& p, std::uint32_t word) {
    if (p.hex) {
      packed_.insert_new(p.packed, p.hash, word);
      return true;
    }
    return insert_wide(p, word) != nullptr;
  }
  // Inserts the absent key in the key_map form (a hex one too); returns its heap copy.
  const char* insert_other(std::string_view key, const parsed_key& p, const Other& value) {
    const char* blob = others_.insert_new(key, other_hash(key, p), value).key;
    if (p.hex) ++hex_others_;
    if (p.wide) ++wide_others_;
    return blob;
  }
  // Inserts the absent key in its own form, with word != 0.
  key_handle insert(std::string_view key, const parsed_key& p,
                    std::uint32_t word) requires std::same_as<Other, std::uint32_t> {
    if (p.hex) {
      insert_packed(p, word);
      return {p.packed, nullptr};
    }
    if (p.wide) {
      if (const wide_record* r = insert_wide(p, word)) return key_handle::of_wide(p.packed, *r);
    }
    return {{}, insert_other(key, p, word)};
  }

  // Erases a found entry (its heap copy too).
  void erase(const entry& e) {
    METAD_ASSERT(e);
    if (e.index != nullptr) {
      const std::uint32_t i = *e.index - 1;
      wide_index_.erase(e.index);
      wide_record& r = wide_[i];
      r.value = 0;
      r.rest = {wide_free_, 0};
      wide_free_ = i + 1;
      return;
    }
    if (e.word != nullptr) {
      packed_.erase(e.word);
      return;
    }
    if (hex_others_ != 0 || wide_others_ != 0) {
      parsed_key p;
      parse_key(key_blob::view(e.slot->key), p);
      if (p.hex) --hex_others_;
      if (p.wide) --wide_others_;
    }
    others_.erase(*e.slot);
  }

  // fn(const packed_key&, const std::uint32_t& word) for each key of the packed form.
  template <class Fn>
  void for_each_packed(Fn&& fn) const {
    packed_.for_each(fn);
  }
  // fn(const key_handle&, const std::uint32_t& word) for each key of the wide form.
  template <class Fn>
  void for_each_wide(Fn&& fn) const {
    wide_index_.for_each([&](const packed_key& k, const std::uint32_t& index) {
      const wide_record& r = wide_[index - 1];
      fn(key_handle::of_wide(k, r), r.value);
    });
  }
  // fn(const other_slot&) for each key of the key_map form.
  template <class Fn>
  void for_each_other(Fn&& fn) const {
    others_.for_each(fn);
  }

  // The key a handle names, as the client sent it.
  static void key_text(const key_handle& h, std::string& out) {
    if (h.wide()) {
      const wide_record* r = h.record();
      const packed_key m = wide_mask(r->rest, r->shape);
      out.resize(shape_chars(r->shape));
      unpack_any_hex_key(r->shape, {h.packed.lo ^ m.lo, h.packed.hi ^ m.hi}, r->rest, out.data());
    } else if (h.blob != nullptr) {
      out.assign(key_blob::view(h.blob));
    } else {
      out.resize(packed_key_chars);
      unpack_hex_key(h.packed, out.data());
    }
  }

  // Recovery (bulk loading) and growth of the packed form: see packed_map.
  void reserve(std::size_t n) { packed_.reserve(n); }
  void set_bulk(bool on) {
    packed_.set_bulk(on);
    wide_index_.set_bulk(on);
  }
  void shrink_to_fit() {
    packed_.shrink_to_fit();
    wide_index_.shrink_to_fit();
  }
  void advance_growth() {
    packed_.advance_growth();
    wide_index_.advance_growth();
  }

  void clear() noexcept {
    packed_.clear();
    wide_index_.clear();
    wide_.clear();
    wide_free_ = 0;
    others_.clear();
    hex_others_ = 0;
    wide_others_ = 0;
  }

 private:
  // The key_map form hashes every key with table_hash, a hex or wide one too.
  static std::uint32_t other_hash(std::string_view key, const parsed_key& p) {
    return p.hex || p.wide ? table_hash(key) : static_cast<std::uint32_t>(p.hash);
  }
  // Inserts the absent wide key with word != 0; nullptr when its index key is taken.
  const wide_record* insert_wide(const parsed_key& p, std::uint32_t word) {
    METAD_ASSERT(p.wide && word != 0);
    if (wide_index_.find(p.packed, p.hash) != nullptr) return nullptr;
    std::uint32_t i;
    if (wide_free_ != 0) {
      i = wide_free_ - 1;
      wide_free_ = static_cast<std::uint32_t>(wide_[i].rest.lo);
    } else {
      METAD_ASSERT(wide_.size() < UINT32_MAX);
      i = static_cast<std::uint32_t>(wide_.size());
      wide_.emplace_back();
    }
    wide_record& r = wide_[i];
    r = {p.rest, word, p.shape};
    wide_index_.insert_new(p.packed, p.hash, i + 1);
    return &r;
  }
  // Out of line: keys of the key_map form are rare, and the packed lookup stays small.
  [[gnu::noinline]] other_slot* find_other(std::string_view key, const parsed_key& p) {
    return others_.find(key, other_hash(key, p));
  }

  packed_map packed_;                 // the hex form
  packed_map wide_index_;             // the wide form: index key → record index + 1
  chunked_vector<wide_record> wide_;  // the wide form's records
  std::uint32_t wide_free_ = 0;       // the first free record + 1 (0: none)
  other_map others_;                  // every other key, and hex or wide keys put there
  std::size_t hex_others_ = 0;        // hex keys in others_
  std::size_t wide_others_ = 0;       // wide keys in others_
};

}  // namespace metad::shard
