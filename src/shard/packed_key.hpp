// Keys of exactly 32 lowercase hex characters (the MD5 / xxh3-128 block hashes vLLM
// sends) packed into 16 binary bytes, the form the shard's maps store inline, and the
// hash those maps index with. Also the other hex shapes clients send (32 uppercase, 64
// lowercase or uppercase: SHA-256 hashes), packed into two halves and a shape tag (the
// case is part of a key's identity: "AB.." and "ab.." are different keys; a key of mixed
// case is not packed). Pure functions: any core may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace metad::shard {

struct packed_key {
  std::uint64_t lo = 0;  // bytes 0..7 (hex characters 0..15), little-endian
  std::uint64_t hi = 0;  // bytes 8..15 (hex characters 16..31)
  bool operator==(const packed_key&) const = default;
};
static_assert(sizeof(packed_key) == 16);

inline constexpr std::size_t packed_key_chars = 32;

namespace packed_detail {
// Nibble value of a hex digit of one case, or 0xFF. The other case is not hex there: "AB"
// and "ab" are different keys, so each packed form holds one case only.
inline constexpr auto make_nibble_table(char ten) {
  struct table {
    unsigned char v[256];
  } t{};
  for (int c = 0; c < 256; ++c) t.v[c] = 0xFF;
  for (int c = '0'; c <= '9'; ++c) t.v[c] = static_cast<unsigned char>(c - '0');
  for (int c = ten; c < ten + 6; ++c) t.v[c] = static_cast<unsigned char>(c - ten + 10);
  return t;
}
inline constexpr auto nibble_table = make_nibble_table('a');
inline constexpr auto upper_nibble_table = make_nibble_table('A');

// 32 hex characters of one case (upper: 'A'..'F', else 'a'..'f') into 16 bytes.
inline bool pack_scalar(const char* s, packed_key& out, bool upper = false) noexcept {
  const auto& table = upper ? upper_nibble_table : nibble_table;
  unsigned char bytes[16];
  unsigned bad = 0;
  for (int i = 0; i < 16; ++i) {
    const unsigned h = table.v[static_cast<unsigned char>(s[2 * i])];
    const unsigned l = table.v[static_cast<unsigned char>(s[2 * i + 1])];
    bad |= (h | l) & 0xF0;
    bytes[i] = static_cast<unsigned char>((h << 4) | (l & 0xF));
  }
  if (bad != 0) return false;
  std::memcpy(&out.lo, bytes, 8);
  std::memcpy(&out.hi, bytes + 8, 8);
  return true;
}

#if defined(__AVX2__)
inline bool pack_avx2(const char* s, packed_key& out, bool upper = false) noexcept {
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i d = _mm256_sub_epi8(c, _mm256_set1_epi8('0'));
  const __m256i l = _mm256_sub_epi8(c, _mm256_set1_epi8(upper ? 'A' : 'a'));
  const __m256i is_digit = _mm256_cmpeq_epi8(_mm256_min_epu8(d, _mm256_set1_epi8(9)), d);
  const __m256i is_lower = _mm256_cmpeq_epi8(_mm256_min_epu8(l, _mm256_set1_epi8(5)), l);
  if (_mm256_movemask_epi8(_mm256_or_si256(is_digit, is_lower)) != -1) return false;
  const __m256i nibbles = _mm256_blendv_epi8(_mm256_add_epi8(l, _mm256_set1_epi8(10)), d, is_digit);
  // Each 16-bit lane: first character * 16 + second; then narrow to bytes, in order.
  const __m256i words = _mm256_maddubs_epi16(nibbles, _mm256_set1_epi16(0x0110));
  const __m256i narrow = _mm256_packus_epi16(words, words);
  const __m256i ordered = _mm256_permute4x64_epi64(narrow, 0b00'00'10'00);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&out), _mm256_castsi256_si128(ordered));
  return true;
}
#endif

inline bool pack32(const char* s, packed_key& out, bool upper) noexcept {
#if defined(__AVX2__)
  return pack_avx2(s, out, upper);
#else
  return pack_scalar(s, out, upper);
#endif
}
}  // namespace packed_detail

// True (and `out` set) when `key` is exactly 32 characters of [0-9a-f].
inline bool pack_hex_key(std::string_view key, packed_key& out) noexcept {
  if (key.size() != packed_key_chars) return false;
#if defined(__AVX2__)
  return packed_detail::pack_avx2(key.data(), out);
#else
  return packed_detail::pack_scalar(key.data(), out);
#endif
}

// Writes the 32 characters `k` was packed from (the exact original key; upper: the
// uppercase form's).
inline void unpack_hex_key(const packed_key& k, char* out, bool upper = false) noexcept {
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  unsigned char bytes[16];
  std::memcpy(bytes, &k.lo, 8);
  std::memcpy(bytes + 8, &k.hi, 8);
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 0xF];
  }
}

// The hex shapes packed besides 32 lowercase characters (hex32, kept by packed_key alone).
enum class key_shape : std::uint8_t {
  other = 0,        // not packed: stored as its bytes
  hex32 = 1,        // 32 lowercase: packed_key
  hex32_upper = 2,  // 32 uppercase: first half only
  hex64 = 3,        // 64 lowercase: both halves
  hex64_upper = 4,  // 64 uppercase: both halves
};

inline constexpr std::size_t shape_chars(key_shape s) {
  return s == key_shape::hex64 || s == key_shape::hex64_upper ? 64 : s == key_shape::other ? 0 : 32;
}
inline constexpr bool shape_upper(key_shape s) {
  return s == key_shape::hex32_upper || s == key_shape::hex64_upper;
}

// The shape of `key` and its packed halves: first = characters 0..31, rest = 32..63
// (zero for 32 characters). A key of mixed case, of another length or with a non-hex
// character is key_shape::other (first and rest then unspecified).
inline key_shape pack_any_hex_key(std::string_view key, packed_key& first,
                                  packed_key& rest) noexcept {
  using packed_detail::pack32;
  if (key.size() == 32) {
    rest = {};
    if (pack32(key.data(), first, false)) return key_shape::hex32;
    if (pack32(key.data(), first, true)) return key_shape::hex32_upper;
    return key_shape::other;
  }
  if (key.size() == 64) {
    if (pack32(key.data(), first, false) && pack32(key.data() + 32, rest, false))
      return key_shape::hex64;
    if (pack32(key.data(), first, true) && pack32(key.data() + 32, rest, true))
      return key_shape::hex64_upper;
  }
  return key_shape::other;
}

// Writes the shape_chars(shape) characters a key of `shape` was packed from.
inline void unpack_any_hex_key(key_shape shape, const packed_key& first, const packed_key& rest,
                               char* out) noexcept {
  const bool upper = shape_upper(shape);
  unpack_hex_key(first, out, upper);
  if (shape_chars(shape) == 64) unpack_hex_key(rest, out + 32, upper);
}

// The hash packed maps index with: wyhash's multiply-fold, once per word, each time by
// a constant (a product of the two words would be 0 for every key with one word equal
// to a constant). Local to a table: no part of key ownership (key_hash), so it may change,
// with packed_map::image_layout (snapshots hold tables laid out by it).
inline std::uint64_t packed_hash(const packed_key& k) noexcept {
  auto fold = [](std::uint64_t x, std::uint64_t c) {
    const unsigned __int128 r = static_cast<unsigned __int128>(x) * c;
    return static_cast<std::uint64_t>(r) ^ static_cast<std::uint64_t>(r >> 64);
  };
  return fold(fold(k.lo ^ 0xa0761d6478bd642full, 0xe7037ed1a0b428dbull) ^ k.hi,
              0x8ebc6af09c88c6e3ull);
}

}  // namespace metad::shard
