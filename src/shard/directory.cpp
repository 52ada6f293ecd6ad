#include "shard/directory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "shard/directory_impl.hpp"
#include "shard/dual_key_map.hpp"
#include "shard/key_life.hpp"
#include "shard/key_map.hpp"
#include "shard/verify.hpp"

// directory: this core's slice of key completeness (keys whose key_hash maps here).
// A 32-lowercase-hex key whose tp_world_size fits 16 bits (all of them in practice) is
// stored packed, {tp, count} in its 4-byte word; any other key, or a larger tp, is
// stored with heap key bytes and full int32 counts (dual_key_map's two forms). Beside it:
// key_life (recency and read leases), the incomplete keys by their last confirmation
// (for stale-key reclamation) and the bookkeeping of removals in progress.
namespace metad::shard {
namespace {

using directory_detail::completion;
using directory_detail::packed_count_max;
using directory_detail::packed_tp_max;

// With METAD_VERIFY: verifies the directory when an operation with several ways out ends.
struct verify_on_exit {
  const directory& d;
  const char* what;
  ~verify_on_exit() { METAD_VERIFY_AFTER(what, d.size() + d.incomplete_count(), d.verify()); }
};
}  // namespace

directory::directory() : impl_(std::make_unique<impl>()) {}
directory::~directory() = default;
directory::directory(directory&&) noexcept = default;
directory& directory::operator=(directory&&) noexcept = default;

void directory::set_lru(bool on) { impl_->life.set_lru(on); }

bool directory::add_confirmation(std::string_view key, std::int32_t tp_world_size,
                                 std::uint64_t now) {
  parsed_key p;
  parse_key(key, p);
  const bool entered = impl_->add_confirmation(key, p, tp_world_size, now);
  METAD_VERIFY_AFTER("directory::add_confirmation", impl_->verify_size(), verify());
  return entered;
}

void directory::add_confirmations(std::span<const std::string_view> keys,
                                  std::span<const std::uint32_t> at, std::int32_t tp_world_size,
                                  std::uint64_t now, std::span<std::uint8_t> entered) {
  impl& m = *impl_;
  m.grouped(keys, at, m.life.lru(), [&](std::uint32_t i, const parsed_key& p) {
    entered[i] = m.add_confirmation(keys[i], p, tp_world_size, now) ? 1 : 0;
  });
  METAD_VERIFY_AFTER("directory::add_confirmations", m.verify_size(), verify());
}

bool directory::complete(std::string_view key) const {
  parsed_key p;
  parse_key(key, p);
  return impl_->complete(key, p);
}

key_report directory::inspect(std::string_view key) const {
  parsed_key p;
  parse_key(key, p);
  impl& m = *impl_;
  key_report r;
  const impl::entry e = m.find(key, p);
  if (!e) return r;
  const completion c = e.get();
  r.present = true;
  r.tp_world_size = c.tp_world_size;
  r.confirmations = c.confirmed_count;
  r.removing = m.is_removing(key);
  r.complete = impl::is_complete(c) && !r.removing;
  std::uint64_t unused = 0;
  if (!impl::is_complete(c)) m.incomplete.times(key, p, r.last_confirmed, unused);
  m.life.times(key, p, r.last_used, r.lease_until);
  return r;
}

bool directory::use(std::string_view key, std::uint64_t now, std::uint64_t lease_until) {
  parsed_key p;
  parse_key(key, p);
  const bool used = impl_->use(key, p, now, lease_until);
  METAD_VERIFY_AFTER("directory::use", impl_->verify_size(), verify());
  return used;
}

void directory::use_each(std::span<const std::string_view> keys, std::span<const std::uint32_t> at,
                         std::uint64_t now, std::uint64_t lease_until,
                         std::span<std::uint8_t> used) {
  impl& m = *impl_;
  m.grouped(keys, at, lease_until != 0 || m.life.lru(), [&](std::uint32_t i, const parsed_key& p) {
    used[i] = m.use(keys[i], p, now, lease_until) ? 1 : 0;
  });
  METAD_VERIFY_AFTER("directory::use_each", m.verify_size(), verify());
}

directory::removal directory::begin_removal(std::string_view key, std::uint64_t now) {
  impl& m = *impl_;
  parsed_key p;
  parse_key(key, p);
  if (!m.find(key, p)) return removal::absent;
  if (m.is_removing(key)) return removal::busy;
  if (m.life.leased(key, now)) return removal::leased;
  m.life.forget(key, p);
  if (const completion c = m.find(key, p).get(); !impl::is_complete(c))
    m.untrack(key, p, c.confirmed_count);
  m.removing.insert_new(key, table_hash(key), 1);
  METAD_VERIFY_AFTER("directory::begin_removal", m.verify_size(), verify());
  return removal::started;
}

bool directory::finish_removal(std::string_view key, std::int32_t bindings, std::uint64_t now) {
  const verify_on_exit verify_after{*this, "directory::finish_removal"};
  impl& m = *impl_;
  if (!m.end_removal(key)) return false;  // the directory was cleared meanwhile
  parsed_key p;
  parse_key(key, p);
  const impl::entry e = m.find(key, p);
  METAD_ASSERT(e);  // only a clear drops a key being removed
  const completion c = e.get();
  const std::int32_t left = c.confirmed_count - bindings;
  m.erase(e);
  if (left > 0) {  // confirmed again by ranks the removal had passed already
    m.insert(key, p, c.tp_world_size, left);
    if (!impl::is_complete({c.tp_world_size, left})) {
      m.track(key, p, left, now);
    } else if (m.life.lru()) {
      m.life.touch(key, p, now);
    }
    return false;
  }
  if (left < 0) {
    if (auto* s = m.owed.find(key, table_hash(key))) {
      s->value -= left;
    } else {
      m.owed.insert_new(key, table_hash(key), -left);
    }
  }
  return true;
}

bool directory::lose_binding(std::string_view key, std::uint64_t now) {
  const verify_on_exit verify_after{*this, "directory::lose_binding"};
  impl& m = *impl_;
  parsed_key p;
  parse_key(key, p);
  const impl::entry e = m.find(key, p);
  if (!e) {
    if (auto* s = m.owed.find(key, table_hash(key))) {
      ++s->value;
    } else {
      m.owed.insert_new(key, table_hash(key), 1);
    }
    return false;
  }
  const completion c = e.get();
  // A key being removed is in neither list, and keeps an entry (even at count 0) until
  // its removal's end, which then counts one binding less to drop.
  const bool removing = m.is_removing(key);
  if (!removing) {
    if (impl::is_complete(c)) {
      m.life.forget(key, p);
    } else {
      m.untrack(key, p, c.confirmed_count);
    }
  }
  const std::int32_t left = c.confirmed_count - 1;
  m.erase(e);
  if (left == 0 && !removing) return true;
  m.insert(key, p, c.tp_world_size, left);
  if (removing) return false;
  if (!impl::is_complete({c.tp_world_size, left})) {
    m.track(key, p, left, now);
  } else if (m.life.lru()) {
    m.life.touch(key, p, now);
  }
  return false;
}

std::size_t directory::take_least_recent_impl(std::uint64_t now, std::size_t n, void* take,
                                              void (*call)(void*, std::string_view,
                                                           std::uint64_t)) {
  const verify_on_exit verify_after{*this, "directory::take_least_recent"};
  impl& m = *impl_;
  return m.life.take_oldest(now, n, [&](std::string_view key, std::uint64_t used) {
    parsed_key p;
    parse_key(key, p);
    if (!m.complete(key, p)) return key_life::offer::discard;  // stale: not to be tracked
    m.removing.insert_new(key, table_hash(key), 1);
    call(take, key, used);
    return key_life::offer::take;
  });
}

void directory::abort_removal(std::string_view key, std::uint64_t used, bool in_front) {
  const verify_on_exit verify_after{*this, "directory::abort_removal"};
  impl& m = *impl_;
  if (!m.end_removal(key)) return;  // cleared meanwhile
  parsed_key p;
  parse_key(key, p);
  m.life.restore(key, p, used, in_front);
}

std::size_t directory::take_stale_impl(std::uint64_t cutoff, std::size_t n, void* take,
                                       void (*call)(void*, std::string_view, std::uint64_t)) {
  const verify_on_exit verify_after{*this, "directory::take_stale"};
  impl& m = *impl_;
  std::size_t taken = 0;
  // Without leases the list is in order of last confirmation: its front is the stalest.
  while (taken < n && m.incomplete.oldest_time() <= cutoff) {
    m.incomplete.take_oldest(0, 1, [&](std::string_view key, std::uint64_t confirmed) {
      parsed_key p;
      parse_key(key, p);
      const impl::entry e = m.find(key, p);
      METAD_ASSERT(e && !impl::is_complete(e.get()) && !m.is_removing(key));
      METAD_ASSERT(m.incomplete_bindings >= static_cast<std::uint64_t>(e.get().confirmed_count));
      m.incomplete_bindings -= static_cast<std::uint64_t>(e.get().confirmed_count);
      m.removing.insert_new(key, table_hash(key), 1);
      call(take, key, confirmed);
      return key_life::offer::take;
    });
    ++taken;
  }
  return taken;
}

void directory::abort_stale(std::string_view key, std::uint64_t confirmed, bool in_place,
                            std::uint64_t now) {
  const verify_on_exit verify_after{*this, "directory::abort_stale"};
  impl& m = *impl_;
  if (!m.end_removal(key)) return;  // cleared meanwhile
  parsed_key p;
  parse_key(key, p);
  const impl::entry e = m.find(key, p);
  METAD_ASSERT(e);  // only a clear drops a key being removed
  const completion c = e.get();
  if (impl::is_complete(c)) {  // the last confirmations came while it was taken
    if (m.life.lru()) m.life.touch(key, p, now);
  } else if (in_place) {
    m.incomplete.restore(key, p, confirmed, true);
    m.incomplete_bindings += static_cast<std::uint64_t>(c.confirmed_count);
  } else {
    m.track(key, p, c.confirmed_count, now);
  }
}

std::size_t directory::incomplete_count() const { return impl_->incomplete.size(); }

void directory::for_each_incomplete_impl(void* visit, bool (*call)(void*, std::string_view)) const {
  impl_->incomplete.for_each_key([&](std::string_view key) { return call(visit, key); });
}
std::uint64_t directory::incomplete_bindings() const { return impl_->incomplete_bindings; }
std::uint64_t directory::oldest_incomplete() const { return impl_->incomplete.oldest_time(); }

void directory::oldest_used(std::uint64_t now, std::size_t n, std::vector<std::uint64_t>& out) {
  impl_->life.oldest_used(now, n, out);
}

std::size_t directory::leased_count(std::uint64_t now) const {
  return impl_->life.leased_count(now);
}

void directory::sweep(std::uint64_t now) {
  impl_->life.sweep(now);
  METAD_VERIFY_AFTER("directory::sweep", impl_->verify_size(), verify());
}

void directory::advance_growth() {
  impl_->keys.advance_growth();
  impl_->life.advance_growth();
  impl_->incomplete.advance_growth();
  // What a peak of keys left behind (e.g. every key incomplete at once while a rank-by-
  // rank fill ran) goes back once the keys have left.
  impl_->incomplete.shrink_if_sparse();
  impl_->life.shrink_if_sparse();
}

void directory::restore(std::string_view key, std::int32_t tp_world_size, std::int32_t count,
                        std::uint64_t now) {
  const verify_on_exit verify_after{*this, "directory::restore"};
  impl& m = *impl_;
  parsed_key p;
  parse_key(key, p);
  // Drop any entry the key has (it is in one map at most), then store it in the form
  // add_confirmation would use.
  if (const impl::entry e = m.find(key, p)) {
    if (const completion c = e.get(); !impl::is_complete(c) && !m.is_removing(key))
      m.untrack(key, p, c.confirmed_count);
    m.erase(e);
  }
  m.insert(key, p, tp_world_size, count);
  if (!impl::is_complete({tp_world_size, count})) {
    m.track(key, p, count, now);
  } else if (m.life.lru()) {
    m.life.touch(key, p, now);
  }
}

// --- staging (recovery, and a hot standby until promotion) -----------------------------
//
// A staged entry is (tp, count): tp the key's tp_world_size as its directory records name
// it, or unnamed (a key whose bindings arrived before its name, or whose name a
// directory_remove or a clear forgot while bindings of it are still held); count the
// confirmed bindings counted so far, never below 0. An entry that is unnamed and has no
// binding is erased. In the packed form a staged word is tp << 16 | count with tp in
// [1, packed_tp_max] or unnamed_bits, so it is never 0, and count below
// packed_count_max, so that it never saturates (a count must come down exactly); any
// other entry lives in the key_map form.

namespace {
constexpr std::int32_t unnamed = directory_detail::unnamed_tp;
constexpr std::uint32_t unnamed_bits = directory_detail::unnamed_bits;

bool staged_fits_packed(const completion& c) {
  return (c.tp_world_size == unnamed ||
          (c.tp_world_size >= 1 && c.tp_world_size <= directory_detail::packed_tp_max)) &&
         c.confirmed_count >= 0 &&
         static_cast<std::uint32_t>(c.confirmed_count) < directory_detail::packed_count_max;
}
std::uint32_t staged_word(const completion& c) {
  const std::uint32_t tp =
      c.tp_world_size == unnamed ? unnamed_bits : static_cast<std::uint32_t>(c.tp_world_size);
  return (tp << 16) | static_cast<std::uint32_t>(c.confirmed_count);
}
completion staged_value(std::uint32_t word) {
  const std::uint32_t tp = word >> 16;
  return {tp == unnamed_bits ? unnamed : static_cast<std::int32_t>(tp),
          static_cast<std::int32_t>(word & directory_detail::packed_count_max)};
}
}  // namespace

completion directory::impl::staged_of(const entry& e) const {
  return e.slot != nullptr ? e.slot->value : staged_value(*e.word);
}

void directory::impl::stage(std::string_view key, const parsed_key& p, const entry& e,
                            const completion& c) {
  METAD_ASSERT(c.confirmed_count >= 0);
  const bool gone = c.tp_world_size == unnamed && c.confirmed_count == 0;
  if (e) {
    if (!gone && e.word != nullptr && staged_fits_packed(c)) {
      *e.word = staged_word(c);
      return;
    }
    erase(e);
  }
  if (gone) return;
  if (!((p.hex || p.wide) && staged_fits_packed(c) && keys.insert_packed(p, staged_word(c))))
    keys.insert_other(key, p, c);
}

void directory::restore_reserve(std::size_t n) {
  impl_->staged = true;
  impl_->keys.reserve(n);
  impl_->keys.set_bulk(true);
}

void directory::restore_key(std::string_view key, std::int32_t tp_world_size) {
  parsed_key p;
  parse_key(key, p);
  impl& m = *impl_;
  m.staged = true;
  const impl::entry e = m.find(key, p);
  completion c = e ? m.staged_of(e) : completion{unnamed, 0};
  c.tp_world_size =
      c.tp_world_size == unnamed ? tp_world_size : std::min(tp_world_size, c.tp_world_size);
  m.stage(key, p, e, c);
}

void directory::restore_key(const packed_key& key, std::int32_t tp_world_size) {
  impl& m = *impl_;
  m.staged = true;
  // With no hex key in the other form, the packed one is the only place the key can be.
  if (m.keys.hex_others() == 0) {
    const parsed_key p{key, packed_hash(key), true};
    if (std::uint32_t* word = m.keys.find_packed(key, p.hash)) {
      completion c = staged_value(*word);
      c.tp_world_size =
          c.tp_world_size == unnamed ? tp_world_size : std::min(tp_world_size, c.tp_world_size);
      if (staged_fits_packed(c)) {
        *word = staged_word(c);
        return;
      }
    } else if (const completion c{tp_world_size, 0}; staged_fits_packed(c)) {
      m.keys.insert_packed(p, staged_word(c));
      return;
    }
  }
  char text[packed_key_chars];
  unpack_hex_key(key, text);
  restore_key(std::string_view(text, sizeof text), tp_world_size);
}

void directory::restore_forget(std::string_view key) {
  parsed_key p;
  parse_key(key, p);
  impl& m = *impl_;
  if (const impl::entry e = m.find(key, p)) {
    completion c = m.staged_of(e);
    c.tp_world_size = unnamed;
    m.stage(key, p, e, c);
  }
}

void directory::restore_forget_all() {
  impl& m = *impl_;
  // The bindings counted so far, kept unnamed; every name goes.
  std::vector<std::pair<std::string, std::int32_t>> bound;
  for_each_key_impl(
      &bound,
      [](void* out, std::string_view key, std::int32_t, std::int32_t count) {
        if (count > 0) static_cast<decltype(bound)*>(out)->emplace_back(std::string(key), count);
      },
      /*with_unnamed=*/true);
  clear();
  m.staged = true;
  for (const auto& [key, count] : bound) {
    parsed_key p;
    parse_key(key, p);
    m.stage(key, p, {}, completion{unnamed, count});
  }
}

std::size_t directory::restore_count(std::span<const packed_key> keys, std::int32_t fallback_tp,
                                     bool second) {
  impl& m = *impl_;
  m.staged = true;
  std::size_t guessed = 0;
  constexpr std::size_t batch = packed_map::sweep_batch;
  std::uint64_t hashes[batch];
  std::uint32_t* words[batch];
  for (std::size_t first = 0; first < keys.size(); first += batch) {
    const std::size_t n = std::min(batch, keys.size() - first);
    for (std::size_t i = 0; i < n; ++i) hashes[i] = packed_hash(keys[first + i]);
    m.keys.packed_form().find_sweep(&keys[first], hashes, n, second, words);
    bool moved = false;  // a key staged another way may have moved the words found
    for (std::size_t i = 0; i < n; ++i) {
      const packed_key& k = keys[first + i];
      std::uint32_t* word = moved ? m.keys.find_packed(k, hashes[i]) : words[i];
      if (word != nullptr && (*word & packed_count_max) + 1 < packed_count_max) {
        ++*word;
        continue;
      }
      char text[packed_key_chars];
      unpack_hex_key(k, text);
      guessed += restore_count(std::string_view(text, sizeof text), fallback_tp);
      moved = true;
    }
  }
  return guessed;
}

std::size_t directory::restore_count(std::string_view key, std::int32_t fallback_tp) {
  impl& m = *impl_;
  m.staged = true;
  parsed_key p;
  parse_key(key, p);
  const impl::entry e = m.find(key, p);
  completion c = e ? m.staged_of(e) : completion{unnamed, 0};
  std::size_t guessed = 0;
  if (c.tp_world_size == unnamed && fallback_tp != unnamed) {
    c.tp_world_size = fallback_tp;
    guessed = 1;
  }
  if (c.confirmed_count < std::numeric_limits<std::int32_t>::max()) ++c.confirmed_count;
  m.stage(key, p, e, c);
  return guessed;
}

void directory::restore_uncount(std::span<const packed_key> keys) {
  impl& m = *impl_;
  METAD_ASSERT(m.staged);
  char text[packed_key_chars];
  for (const packed_key& k : keys) {
    if (std::uint32_t* word = m.keys.find_packed(k, packed_hash(k))) {
      // A named key keeps its word at count 0 (tp << 16 is not 0).
      if ((*word & packed_count_max) > 1 || (*word >> 16) != unnamed_bits) {
        METAD_ASSERT((*word & packed_count_max) > 0);
        --*word;
        continue;
      }
    }
    unpack_hex_key(k, text);
    restore_uncount(std::string_view(text, sizeof text));
  }
}

void directory::restore_uncount(std::string_view key) {
  impl& m = *impl_;
  METAD_ASSERT(m.staged);
  parsed_key p;
  parse_key(key, p);
  const impl::entry e = m.find(key, p);
  METAD_ASSERT(e);  // a binding dropped is one counted before (its core's order)
  completion c = m.staged_of(e);
  METAD_ASSERT(c.confirmed_count > 0);
  --c.confirmed_count;
  m.stage(key, p, e, c);
}

std::size_t directory::restore_finish(std::uint64_t now, std::int32_t fallback_tp) {
  impl& m = *impl_;
  // Keys counted but never named (their directory record was lost with an unacknowledged
  // confirm, or has not arrived): fallback_tp.
  std::vector<std::string> unnamed_keys;
  for_each_key_impl(
      &unnamed_keys,
      [](void* out, std::string_view key, std::int32_t tp, std::int32_t count) {
        if (tp == unnamed && count > 0)
          static_cast<std::vector<std::string>*>(out)->emplace_back(key);
      },
      /*with_unnamed=*/true);
  for (const std::string& key : unnamed_keys) {
    parsed_key p;
    parse_key(key, p);
    const impl::entry e = m.find(key, p);
    m.stage(key, p, e, completion{fallback_tp, m.staged_of(e).confirmed_count});
  }
  m.staged = false;
  m.keys.set_bulk(false);
  std::vector<packed_key> unbound;
  std::vector<std::string> unbound_others;
  char text[packed_key_chars];
  m.keys.for_each_packed([&](const packed_key& k, const std::uint32_t& word) {
    const completion c{static_cast<std::int32_t>(word >> 16),
                       static_cast<std::int32_t>(word & packed_count_max)};
    if (c.confirmed_count == 0) {
      unbound.push_back(k);
      return;
    }
    const parsed_key p{k, packed_hash(k), true};
    unpack_hex_key(k, text);
    const std::string_view key(text, sizeof text);
    if (!impl::is_complete(c)) {
      m.track(key, p, c.confirmed_count, now);
    } else if (m.life.lru()) {
      m.life.touch(key, p, now);
    }
  });
  std::string wide_text;
  m.keys.for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
    dual_key_map<completion>::key_text(h, wide_text);
    const completion c{static_cast<std::int32_t>(word >> 16),
                       static_cast<std::int32_t>(word & packed_count_max)};
    if (c.confirmed_count == 0) {
      unbound_others.push_back(wide_text);
      return;
    }
    parsed_key p;
    parse_key(wide_text, p);
    if (!impl::is_complete(c)) {
      m.track(wide_text, p, c.confirmed_count, now);
    } else if (m.life.lru()) {
      m.life.touch(wide_text, p, now);
    }
  });
  m.keys.for_each_other([&](const key_map<completion>::slot& s) {
    const std::string_view key = key_blob::view(s.key);
    if (s.value.confirmed_count == 0) {
      unbound_others.emplace_back(key);
      return;
    }
    parsed_key p;
    parse_key(key, p);
    if (!impl::is_complete(s.value)) {
      m.track(key, p, s.value.confirmed_count, now);
    } else if (m.life.lru()) {
      m.life.touch(key, p, now);
    }
  });
  for (const packed_key& k : unbound) m.keys.erase(m.keys.find(key_handle{k, nullptr}));
  for (const std::string& key : unbound_others) {
    parsed_key p;
    parse_key(key, p);
    if (const impl::entry e = m.find(key, p)) m.erase(e);
  }
  m.keys.shrink_to_fit();
  METAD_VERIFY_AFTER("directory::restore_finish", m.verify_size(), verify());
  return unnamed_keys.size();
}

void directory::for_each_key_impl(void* visit,
                                  void (*call)(void*, std::string_view, std::int32_t, std::int32_t),
                                  bool with_unnamed) const {
  const impl& m = *impl_;
  // Staged: words may say unnamed_tp, and an unnamed key is not named to the visitor
  // unless it asks (a standby's snapshot carries names only).
  const auto value = [&](std::uint32_t word) {
    return m.staged ? staged_value(word)
                    : completion{static_cast<std::int32_t>(word >> 16),
                                 static_cast<std::int32_t>(word & packed_count_max)};
  };
  const auto visit_one = [&](std::string_view key, const completion& c) {
    if (c.tp_world_size == unnamed && !with_unnamed) return;
    call(visit, key, c.tp_world_size, c.confirmed_count);
  };
  char text[packed_key_chars];
  m.keys.for_each_packed([&](const packed_key& k, const std::uint32_t& word) {
    unpack_hex_key(k, text);
    visit_one(std::string_view(text, sizeof text), value(word));
  });
  std::string wide_text;
  m.keys.for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
    dual_key_map<completion>::key_text(h, wide_text);
    visit_one(wide_text, value(word));
  });
  m.keys.for_each_other(
      [&](const key_map<completion>::slot& s) { visit_one(key_blob::view(s.key), s.value); });
}

std::size_t directory::size() const { return impl_->keys.size(); }
void directory::clear() {
  impl& m = *impl_;
  m.keys.clear();
  m.life.clear();
  m.incomplete.clear();
  m.incomplete_bindings = 0;
  m.removing.clear();
  m.owed.clear();
  m.staged = false;
}

std::string directory::verify() const {
  const impl& m = *impl_;
  const auto fail = [](std::string what) { return "directory: " + what; };
  if (std::string e = m.keys.verify(); !e.empty()) return fail(e);
  if (std::string e = m.life.verify(); !e.empty()) return fail("recency: " + e);
  if (std::string e = m.incomplete.verify(); !e.empty()) return fail("incomplete keys: " + e);
  if (!m.incomplete.lru()) return fail("the incomplete keys are not tracked by recency");
  if (m.staged) {  // counts being built: only the staging rules hold yet
    std::string e;
    for_each_key_impl(
        &e,
        [](void* out, std::string_view key, std::int32_t tp, std::int32_t count) {
          auto& error = *static_cast<std::string*>(out);
          if (!error.empty()) return;
          if (count < 0) error = fmt::format("staged key {} has a count below 0", key);
          if (tp == unnamed && count == 0)
            error = fmt::format("staged key {} is unnamed and has no binding", key);
        },
        /*with_unnamed=*/true);
    return e.empty() ? e : fail(e);
  }
  std::size_t incomplete = 0, in_life = 0;
  std::uint64_t bindings = 0;
  std::string e;
  const auto visit = [&](std::string_view key, const parsed_key& p, completion c) {
    if (!e.empty()) return;
    const bool removing = m.is_removing(key);
    const bool complete = impl::is_complete(c);
    std::uint64_t used = 0, until = 0;
    const bool tracked = m.incomplete.times(key, p, used, until);
    const bool recent = m.life.times(key, p, used, until);
    in_life += recent ? 1 : 0;
    if (removing) {
      if (tracked || recent) e = fmt::format("key {} is being removed but still tracked", key);
    } else if (complete) {
      if (tracked) {
        e = fmt::format("complete key {} is tracked as incomplete", key);
      } else if (m.life.lru() && !recent) {
        e = fmt::format("complete key {} has no recency (LRU on)", key);
      }
    } else {
      ++incomplete;
      bindings += static_cast<std::uint64_t>(std::max(c.confirmed_count, 0));
      if (!tracked) {
        e = fmt::format("incomplete key {} is not tracked", key);
      } else if (recent) {
        e = fmt::format("incomplete key {} has a recency entry", key);
      }
    }
  };
  char text[packed_key_chars];
  m.keys.for_each_packed([&](const packed_key& k, const std::uint32_t& word) {
    const completion c{static_cast<std::int32_t>(word >> 16),
                       static_cast<std::int32_t>(word & packed_count_max)};
    unpack_hex_key(k, text);
    const std::string_view key(text, sizeof text);
    if (e.empty() && c.confirmed_count < 1)
      e = fmt::format("packed key {} has no confirmation", key);
    visit(key, parsed_key{k, packed_hash(k), true}, c);
  });
  std::string wide_text;
  m.keys.for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
    dual_key_map<completion>::key_text(h, wide_text);
    const completion c{static_cast<std::int32_t>(word >> 16),
                       static_cast<std::int32_t>(word & packed_count_max)};
    if (e.empty() && c.confirmed_count < 1)
      e = fmt::format("wide key {} has no confirmation", wide_text);
    parsed_key p;
    parse_key(wide_text, p);
    visit(wide_text, p, c);
  });
  m.keys.for_each_other([&](const key_map<completion>::slot& s) {
    const std::string_view key = key_blob::view(s.key);
    parsed_key p;
    parse_key(key, p);
    visit(key, p, s.value);
  });
  if (!e.empty()) return fail(e);
  if (incomplete != m.incomplete.size())
    return fail(fmt::format("{} incomplete keys, {} tracked", incomplete, m.incomplete.size()));
  if (bindings != m.incomplete_bindings)
    return fail(fmt::format("incomplete keys hold {} confirmations, {} counted", bindings,
                            m.incomplete_bindings));
  if (in_life != m.life.size())
    return fail(fmt::format("{} keys have recency, {} recency entries", in_life, m.life.size()));
  m.removing.for_each([&](const key_map<std::uint32_t>::slot& s) {
    const std::string_view key = key_blob::view(s.key);
    parsed_key p;
    parse_key(key, p);
    if (e.empty() && !m.keys.find(key, p))
      e = fmt::format("key {} is being removed but absent", key);
  });
  m.owed.for_each([&](const key_map<std::int32_t>::slot& s) {
    if (e.empty() && s.value <= 0)
      e = fmt::format("key {} is owed {} confirmations", key_blob::view(s.key), s.value);
  });
  return e.empty() ? e : fail(e);
}

}  // namespace metad::shard
