// dual_key_map: request key → value, in the forms keys take. A key of 32 lowercase
// hex characters (vLLM's block hashes: nearly all keys) lives packed in a packed_map, one
// nonzero 4-byte word and no heap block. A key of the other hex shapes (32 uppercase, 64
// of one case: SHA-256 hashes) lives in the wide form: its record (its second half and
// shape) in a wide_store, which the maps of one core may share (a core's ranks), found
// from its index key (its first half XOR a mix of the rest and the shape, so that the
// record and the index key give back the whole key); its word is the record's inline
// word when this map owns that, else in this map's wide index (index key → word). Any
// other key, a hex key its user chooses to store so (a value that does not fit a word),
// and a wide key whose index key another wide key holds (a 128-bit collision: never in
// practice, but possible) lives in a key_map<Other> with its bytes on the heap. A key is
// in one form at most. Single-threaded: only the owning core touches it (a rank's keys,
// a directory slice, its recency lists) and its store.
//
// Invariants (verify()):
// - every key of the packed form has a nonzero word and a lookup of it finds that word;
// - every key of the wide index has a nonzero word and a record in the store that this
//   map does not own; the records this map owns have a nonzero word; together they are
//   as many as it counts in the wide form (the store's own invariants: wide_store);
// - every key of the key_map form has heap bytes, its slot's hash is table_hash of them,
//   and a lookup of them finds that slot; a 32-lowercase-hex key there is not also in
//   the packed form;
// - each form holds as many keys as it counts; hex_others() and wide_others() count
//   exactly the hex and wide keys of the key_map form.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "metad/assert.hpp"
#include "shard/key_map.hpp"
#include "shard/packed_key.hpp"
#include "shard/packed_map.hpp"
#include "shard/parsed_key.hpp"
#include "shard/wide_store.hpp"

namespace metad::shard {

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
      return p.wide && packed == p.packed && r->rest == p.rest && r->shape() == p.shape;
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

  dual_key_map() = default;
  dual_key_map(const dual_key_map&) = delete;
  dual_key_map& operator=(const dual_key_map&) = delete;
  dual_key_map(dual_key_map&& o) noexcept { swap(o); }
  dual_key_map& operator=(dual_key_map&& o) noexcept {
    if (this != &o) {
      clear();
      detach();
      swap(o);
    }
    return *this;
  }
  ~dual_key_map() {
    clear();
    detach();
  }

  // Keeps this map's wide keys in `store`, shared with the other maps given it (a core's
  // ranks: see wide_store), instead of a store of its own. The map must be empty and
  // have no store yet; past wide_store::maps_max maps it keeps its own.
  void share(wide_store& store) {
    METAD_ASSERT(size() == 0 && store_ == nullptr);
    if (const std::uint16_t id = store.attach(); id != 0) {
      store_ = &store;
      id_ = id;
    }
  }
  // Whether the map's wide keys are in a store other maps share.
  bool shares_store() const { return store_ != nullptr && own_ == nullptr; }
  // The keys of its store (what for_each_wide and verify() walk besides its own).
  std::size_t store_size() const { return store_ == nullptr ? 0 : store_->size(); }

  // Where find() found a key: `word` in the packed or wide form (`record` set: the wide
  // form, its record, named by `index_key`), or `slot` in the key_map form (neither:
  // absent). Valid until the next insert, erase or advance_growth of a map of the store.
  template <bool Const>
  struct basic_entry {
    std::conditional_t<Const, const std::uint32_t*, std::uint32_t*> word = nullptr;
    std::conditional_t<Const, const other_slot*, other_slot*> slot = nullptr;
    std::conditional_t<Const, const wide_record*, wide_record*> record = nullptr;
    packed_key index_key{};  // when record != nullptr
    explicit operator bool() const { return word != nullptr || slot != nullptr; }
    // The value in whichever form holds it (a map whose two forms hold the same word).
    auto* value() const requires std::same_as<Other, std::uint32_t> {
      return word != nullptr ? word : slot != nullptr ? &slot->value : nullptr;
    }
  };
  using entry = basic_entry<false>;
  using const_entry = basic_entry<true>;

  std::size_t size() const { return packed_.size() + wide_count_ + others_.size(); }
  std::size_t packed_size() const { return packed_.size(); }
  std::size_t wide_size() const { return wide_count_; }
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
      if (wide_count_ != 0) {
        if (wide_record* r = store_->find(p)) {
          if (std::uint32_t* word = wide_word(p.packed, p.hash, *r))
            return {word, nullptr, r, p.packed};
        }
      }
      if (wide_others_ == 0) return {};
    }
    return {nullptr, find_other(key, p)};
  }
  const_entry find(std::string_view key, const parsed_key& p) const {
    const entry e = const_cast<dual_key_map*>(this)->find(key, p);
    return {e.word, e.slot, e.record, e.index_key};
  }
  // The entry a handle names, which must be stored.
  entry find(const key_handle& h) {
    if (h.blob == nullptr) return {packed_.find(h.packed, packed_hash(h.packed)), nullptr};
    if (h.wide()) {
      auto* r = const_cast<wide_record*>(h.record());
      std::uint32_t* word = wide_word(h.packed, packed_hash(h.packed), *r);
      if (word == nullptr) return {};
      return {word, nullptr, r, h.packed};
    }
    const std::string_view key = key_blob::view(h.blob);
    other_slot* s = others_.find(key, table_hash(key));
    METAD_ASSERT(s == nullptr || s->key == h.blob);
    return {nullptr, s};
  }
  const_entry find(const key_handle& h) const {
    const entry e = const_cast<dual_key_map*>(this)->find(h);
    return {e.word, e.slot, e.record, e.index_key};
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
    if (p.wide && wide_count_ != 0) {
      store_->prefetch(p.hash);
      if (wide_.size() != 0) wide_.prefetch(p.hash);
    }
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
    if (e.record != nullptr) {
      wide_record& r = *e.record;
      if (e.word == &r.value) {
        r.value = 0;
        r.set_owner(0);
      } else {
        wide_.erase(e.word);
      }
      --wide_count_;
      store_->release(e.index_key, r);
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
  // fn(const key_handle&, const std::uint32_t& word) for each key of the wide form. With
  // a shared store this walks every key of the store, not only this map's.
  template <class Fn>
  void for_each_wide(Fn&& fn) const {
    if (wide_count_ == 0) return;
    const wide_store& store = *store_;
    store.for_each([&](const packed_key& k, const wide_record& r) {
      if (r.owner() == id_) fn(key_handle::of_wide(k, r), r.value);
    });
    wide_.for_each([&](const packed_key& k, const std::uint32_t& word) {
      fn(key_handle::of_wide(k, store.at(k)), word);
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
      const packed_key m = wide_mask(r->rest, r->shape());
      out.resize(shape_chars(r->shape()));
      unpack_any_hex_key(r->shape(), {h.packed.lo ^ m.lo, h.packed.hi ^ m.hi}, r->rest, out.data());
    } else if (h.blob != nullptr) {
      out.assign(key_blob::view(h.blob));
    } else {
      out.resize(packed_key_chars);
      unpack_hex_key(h.packed, out.data());
    }
  }

  // The packed form itself, for its images (snapshots: packed_map::image_buckets,
  // for_each_slot, begin_image, place_at). A key placed through it must be in no other
  // form: the caller checks that hex_others() is 0.
  const packed_map& packed_form() const { return packed_; }
  packed_map& packed_form() { return packed_; }

  // Recovery (bulk loading) and growth of the packed form: see packed_map. A shared
  // store's own tables are its owner's to grow (rank_table).
  void reserve(std::size_t n) { packed_.reserve(n); }
  void set_bulk(bool on) {
    packed_.set_bulk(on);
    wide_.set_bulk(on);
    if (own_ != nullptr) own_->set_bulk(on);
  }
  void shrink_to_fit() {
    packed_.shrink_to_fit();
    wide_.shrink_to_fit();
    if (own_ != nullptr) own_->shrink_to_fit();
  }
  void advance_growth() {
    packed_.advance_growth();
    wide_.advance_growth();
    if (own_ != nullptr) own_->advance_growth();
  }

  // Drops every key (a shared store's records of keys no other map holds too). With a
  // shared store this walks every key of the store.
  void clear() noexcept {
    packed_.clear();
    if (wide_count_ != 0) {
      if (own_ != nullptr) {
        own_ = std::make_unique<wide_store>();  // its only map: the records go at once
        own_->attach();
        store_ = own_.get();
      } else {
        release_wide();
      }
      wide_count_ = 0;
    }
    wide_.clear();
    others_.clear();
    hex_others_ = 0;
    wide_others_ = 0;
  }

  // The invariants above, O(size()) (plus the store's keys when shared): "" when they
  // hold, else the first broken one.
  std::string verify() const {
    std::size_t packed = 0, wide = 0, others = 0, hex = 0, wide_other = 0;
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
    if (store_ != nullptr) {
      if (own_ != nullptr) {
        std::size_t refs = 0;
        if (std::string s = own_->verify(refs); !s.empty()) return "dual_key_map: " + s;
        if (refs != wide_count_) {
          return "dual_key_map: its own store's keys are held " + std::to_string(refs) +
                 " times, " + std::to_string(wide_count_) + " wide keys counted";
        }
      }
      const wide_store& store = *store_;
      store.for_each([&](const packed_key&, const wide_record& r) {
        if (r.owner() != id_) return;
        ++wide;
        if (e.empty() && r.value == 0) e = "a wide key's record holds the empty word 0";
      });
      wide_.for_each([&](const packed_key& k, const std::uint32_t& word) {
        ++wide;
        if (!e.empty()) return;
        if (word == 0) {
          e = "a wide key has the empty word 0";
        } else if (!store.contains(k)) {
          e = "a wide key of the map's index has no record";
        } else if (store.at(k).owner() == id_) {
          e = "a wide key is both in the map's index and its record";
        } else if (wide_.find(k, packed_hash(k)) != &word) {
          e = "a wide key is not found where it is stored";
        }
      });
      if (!e.empty()) return "dual_key_map: " + e;
    }
    if (wide != wide_count_) {
      return "dual_key_map: " + std::to_string(wide) + " wide keys held, " +
             std::to_string(wide_count_) + " counted";
    }
    others_.for_each([&](const other_slot& s) {
      ++others;
      if (!e.empty()) return;
      if (s.key == nullptr) {
        e = "a key_map slot counted as used has no key";
        return;
      }
      const std::string_view key = key_blob::view(s.key);
      parsed_key p;
      parse_key(key, p);
      if (s.hash != table_hash(key)) {
        e = "key '" + std::string(key) + "' has a slot hash that is not its table_hash";
      } else if (others_.find(key, s.hash) != &s) {
        e = "key '" + std::string(key) + "' is not found where it is stored";
      } else if (p.hex) {
        ++hex;
        if (packed_.find(p.packed, p.hash) != nullptr)
          e = "hex key '" + std::string(key) + "' is in both forms";
      } else if (p.wide) {
        ++wide_other;
      }
    });
    if (!e.empty()) return "dual_key_map: " + e;
    if (packed != packed_.size() || others != others_.size()) {
      return "dual_key_map: " + std::to_string(packed) + " packed and " + std::to_string(others) +
             " other keys stored, " + std::to_string(packed_.size()) + " and " +
             std::to_string(others_.size()) + " counted";
    }
    if (hex != hex_others_ || wide_other != wide_others_) {
      return "dual_key_map: " + std::to_string(hex) + " hex keys in the key_map form, " +
             std::to_string(hex_others_) + " counted; " + std::to_string(wide_other) +
             " wide ones, " + std::to_string(wide_others_) + " counted";
    }
    return {};
  }

 private:
  void swap(dual_key_map& o) noexcept {
    std::swap(packed_, o.packed_);
    std::swap(wide_, o.wide_);
    std::swap(store_, o.store_);
    std::swap(own_, o.own_);
    std::swap(id_, o.id_);
    std::swap(wide_count_, o.wide_count_);
    std::swap(others_, o.others_);
    std::swap(hex_others_, o.hex_others_);
    std::swap(wide_others_, o.wide_others_);
  }
  // Gives a shared store this map's id back (the map holds none of its keys).
  void detach() noexcept {
    METAD_ASSERT(wide_count_ == 0);
    if (store_ != nullptr && own_ == nullptr) store_->detach(id_);
    store_ = nullptr;
    own_.reset();
    id_ = 0;
  }
  // This map's word of the wide key under `index_key` (record r), or nullptr.
  std::uint32_t* wide_word(const packed_key& index_key, std::uint64_t hash, wide_record& r) {
    if (r.owner() == id_) return &r.value;
    return wide_.size() == 0 ? nullptr : wide_.find(index_key, hash);
  }
  // Inserts the absent wide key with word != 0; nullptr when its index key is taken.
  const wide_record* insert_wide(const parsed_key& p, std::uint32_t word) {
    METAD_ASSERT(p.wide && word != 0);
    if (store_ == nullptr) {
      own_ = std::make_unique<wide_store>();
      store_ = own_.get();
      id_ = store_->attach();
    }
    wide_record* r = store_->acquire(p);
    if (r == nullptr) return nullptr;
    if (r->owner() == 0) {
      r->set_owner(id_);
      r->value = word;
    } else {
      wide_.insert_new(p.packed, p.hash, word);
    }
    ++wide_count_;
    return r;
  }
  // Releases every wide key this map holds in its shared store.
  void release_wide() noexcept {
    std::vector<std::pair<packed_key, wide_record*>> owned;
    store_->for_each([&](const packed_key& k, wide_record& r) {
      if (r.owner() == id_) owned.emplace_back(k, &r);
    });
    for (auto& [k, r] : owned) {
      r->value = 0;
      r->set_owner(0);
      store_->release(k, *r);
    }
    wide_.for_each(
        [&](const packed_key& k, const std::uint32_t&) { store_->release(k, store_->at(k)); });
  }
  // Out of line: keys of the key_map form are rare, and the packed lookup stays small.
  [[gnu::noinline]] other_slot* find_other(std::string_view key, const parsed_key& p) {
    return others_.find(key, other_hash(key, p));
  }
  // The key_map form hashes every key with table_hash, a hex or wide one too.
  static std::uint32_t other_hash(std::string_view key, const parsed_key& p) {
    return p.hex || p.wide ? table_hash(key) : static_cast<std::uint32_t>(p.hash);
  }

  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it

  packed_map packed_;                // the hex form
  packed_map wide_;                  // the wide form's words not in their record
  wide_store* store_ = nullptr;      // the wide form's records (nullptr: none yet)
  std::unique_ptr<wide_store> own_;  // the store when not shared
  std::uint16_t id_ = 0;             // this map's id in the store
  std::size_t wide_count_ = 0;       // wide keys held
  other_map others_;                 // every other key, and hex or wide keys put there
  std::size_t hex_others_ = 0;       // hex keys in others_
  std::size_t wide_others_ = 0;      // wide keys in others_
};

}  // namespace metad::shard
