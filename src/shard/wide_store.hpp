// wide_store: the records of wide keys (the hex shapes besides 32 lowercase characters:
// SHA-256 hashes in either case, 32 uppercase characters), one record per key, found by
// the key's index key (see wide_mask in dual_key_map.hpp). The dual_key_maps of one core
// that hold such keys share one store (rank_table: a core's ranks), so a key that eight
// ranks hold has one record, not eight; a map nobody gives a store to has its own.
//
// A record carries one map's word inline: the first map to hold the key that finds the
// inline word unused (its owner). Every other map holding the key keeps its word in its
// own index (index key → word). With one map per store (a core with one rank) a wide
// key costs its index slot and its record, as it did before stores were shared; with
// eight, one index slot and one record plus seven index slots.
//
// Records never move (a key_handle points at one) and live while a map holds the key
// (refs). Single-threaded: only the owning core touches a store and its maps.
//
// Invariants (verify()):
// - every index entry names a record in range that is in use (refs > 0), whose key is the
//   one the index key stands for;
// - records in use and free records add up to all records; no free record has an owner;
// - each map's holdings add up to the refs (checked by the store's owner, rank_table,
//   against its maps' wide_size()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "metad/assert.hpp"
#include "shard/chunked_vector.hpp"
#include "shard/packed_key.hpp"
#include "shard/packed_map.hpp"
#include "shard/parsed_key.hpp"

namespace metad::shard {

// A wide key's record. refs == 0: free (rest.lo then links the free records).
struct wide_record {
  static constexpr std::uint16_t owner_mask = 0x3FFF;
  packed_key rest;          // characters 32..63 packed (zero for 32 characters)
  std::uint32_t value = 0;  // the owner's word (0 when no map keeps its word here)
  std::uint16_t tag = 0;    // bits 0..13: the owner map (0: none); 14..15: the shape - 2
  std::uint16_t refs = 0;   // maps holding the key
  key_shape shape() const { return static_cast<key_shape>((tag >> 14) + 2); }
  std::uint16_t owner() const { return tag & owner_mask; }
  void set_owner(std::uint16_t o) {
    METAD_ASSERT(o <= owner_mask);
    tag = static_cast<std::uint16_t>((tag & ~owner_mask) | o);
  }
  static std::uint16_t shape_tag(key_shape s) {
    METAD_ASSERT(s == key_shape::hex32_upper || s == key_shape::hex64 ||
                 s == key_shape::hex64_upper);
    return static_cast<std::uint16_t>((static_cast<unsigned>(s) - 2) << 14);
  }
};
static_assert(sizeof(wide_record) == 24, "a wide key's record is its cost besides the index");

class wide_store {
 public:
  // The most maps one store serves at once (a map past it keeps its own store).
  static constexpr std::uint16_t maps_max = wide_record::owner_mask;
  static constexpr std::uint16_t refs_max = UINT16_MAX;
  static_assert(maps_max <= refs_max, "every map of a store may hold a key");

  wide_store() = default;
  wide_store(const wide_store&) = delete;  // maps point at it
  wide_store& operator=(const wide_store&) = delete;

  // A new map's id (1..maps_max), or 0 when all are taken.
  std::uint16_t attach() {
    if (!free_ids_.empty()) {
      const std::uint16_t id = free_ids_.back();
      free_ids_.pop_back();
      return id;
    }
    if (next_id_ > maps_max) return 0;
    return next_id_++;
  }
  // A map that holds no key of this store any more gives its id back.
  void detach(std::uint16_t id) {
    METAD_ASSERT(id != 0 && id < next_id_);
    free_ids_.push_back(id);
  }

  std::size_t size() const { return index_.size(); }  // keys (records in use)

  // The record of the wide key parsed as p, or nullptr.
  wide_record* find(const parsed_key& p) {
    std::uint32_t* id = index_.find(p.packed, p.hash);
    if (id == nullptr) return nullptr;
    wide_record& r = records_[*id - 1];
    return r.rest == p.rest && r.shape() == p.shape ? &r : nullptr;
  }
  // The record under an index key that is stored.
  wide_record& at(const packed_key& index_key) {
    std::uint32_t* id = index_.find(index_key, packed_hash(index_key));
    METAD_ASSERT(id != nullptr);
    return records_[*id - 1];
  }
  const wide_record& at(const packed_key& index_key) const {
    return const_cast<wide_store*>(this)->at(index_key);
  }
  bool contains(const packed_key& index_key) const {
    return index_.find(index_key, packed_hash(index_key)) != nullptr;
  }
  void prefetch(std::uint64_t hash) const {
    if (index_.size() != 0) index_.prefetch(hash);
  }

  // One more map holds the key: its record (a new one has no owner and refs 1), or
  // nullptr when another key holds its index key (the map stores it in another form).
  wide_record* acquire(const parsed_key& p) {
    if (std::uint32_t* id = index_.find(p.packed, p.hash)) {
      wide_record& r = records_[*id - 1];
      if (r.rest != p.rest || r.shape() != p.shape) return nullptr;
      METAD_ASSERT(r.refs < refs_max);
      ++r.refs;
      return &r;
    }
    std::uint32_t i;
    if (free_ != 0) {
      i = free_ - 1;
      free_ = static_cast<std::uint32_t>(records_[i].rest.lo);
    } else {
      METAD_ASSERT(records_.size() < UINT32_MAX);
      i = static_cast<std::uint32_t>(records_.size());
      records_.emplace_back();
    }
    wide_record& r = records_[i];
    r = {p.rest, 0, wide_record::shape_tag(p.shape), 1};
    index_.insert_new(p.packed, p.hash, i + 1);
    return &r;
  }
  // A map no longer holds the key under `index_key` (record r, not owned by that map any
  // more): the last one frees the record.
  void release(const packed_key& index_key, wide_record& r) {
    METAD_ASSERT(r.refs > 0);
    if (--r.refs != 0) return;
    METAD_ASSERT(r.owner() == 0);
    std::uint32_t* id = index_.find(index_key, packed_hash(index_key));
    METAD_ASSERT(id != nullptr && &records_[*id - 1] == &r);
    const std::uint32_t i = *id - 1;
    index_.erase(id);
    r = {};
    r.rest.lo = free_;
    free_ = i + 1;
  }

  // fn(const packed_key& index_key, wide_record&) for each record in use.
  template <class Fn>
  void for_each(Fn&& fn) {
    index_.for_each([&](const packed_key& k, const std::uint32_t& id) { fn(k, records_[id - 1]); });
  }
  template <class Fn>
  void for_each(Fn&& fn) const {
    index_.for_each([&](const packed_key& k, const std::uint32_t& id) { fn(k, records_[id - 1]); });
  }

  // Recovery (bulk loading) and growth: see packed_map.
  void set_bulk(bool on) { index_.set_bulk(on); }
  void shrink_to_fit() { index_.shrink_to_fit(); }
  void advance_growth() { index_.advance_growth(); }
  std::size_t maps() const { return next_id_ - 1 - free_ids_.size(); }

  // The invariants above; "" when they hold. `refs` gets the holdings summed.
  std::string verify(std::size_t& refs) const {
    std::string e;
    refs = 0;
    std::size_t used = 0;
    index_.for_each([&](const packed_key& k, const std::uint32_t& id) {
      ++used;
      if (!e.empty()) return;
      if (id == 0 || id > records_.size()) {
        e = "a wide key's record index is out of range";
        return;
      }
      const wide_record& r = records_[id - 1];
      if (r.refs == 0) {
        e = "a wide key's record is free (no map holds it)";
      } else if (r.owner() >= next_id_) {
        e = "a wide key's record has an owner no map was given";
      } else if (index_.find(k, packed_hash(k)) != &id) {
        e = "a wide key is not found where it is stored";
      }
      refs += r.refs;
    });
    if (!e.empty()) return "wide_store: " + e;
    std::size_t free_records = 0;
    for (std::uint32_t i = free_; i != 0; i = static_cast<std::uint32_t>(records_[i - 1].rest.lo)) {
      if (i > records_.size() || ++free_records > records_.size() || records_[i - 1].refs != 0 ||
          records_[i - 1].tag != 0)
        return "wide_store: the free records' chain is broken";
    }
    if (used + free_records != records_.size()) {
      return "wide_store: " + std::to_string(used) + " keys and " + std::to_string(free_records) +
             " free records, " + std::to_string(records_.size()) + " records";
    }
    return {};
  }

 private:
  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it

  packed_map index_;  // index key → record index + 1
  chunked_vector<wide_record> records_;
  std::uint32_t free_ = 0;               // the first free record + 1 (0: none)
  std::uint16_t next_id_ = 1;            // the next map id never handed out
  std::vector<std::uint16_t> free_ids_;  // ids given back
};

}  // namespace metad::shard
