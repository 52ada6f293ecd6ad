#include "shard/ownership.hpp"

#if defined(__SSSE3__) && defined(__SSE4_1__)
#include <immintrin.h>
#endif

#include <bit>
#include <cstring>

#include "metad/assert.hpp"

// Ownership: which core holds a rank or a key. The hash is part of the on-disk and
// cross-core contract (every core must agree), so it is fixed here and never seeded.
namespace metad::shard {
namespace {

static_assert(std::endian::native == std::endian::little, "key_hash reads little-endian words");

// wyhash's constants and mixing (final version 4), unseeded.
constexpr std::uint64_t k_secret0 = 0xa0761d6478bd642full;
constexpr std::uint64_t k_secret1 = 0xe7037ed1a0b428dbull;
constexpr std::uint64_t k_secret2 = 0x8ebc6af09c88c6e3ull;
constexpr std::uint64_t k_secret3 = 0x589965cc75374cc3ull;

inline void mum(std::uint64_t& a, std::uint64_t& b) {
  const unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  a = static_cast<std::uint64_t>(r);
  b = static_cast<std::uint64_t>(r >> 64);
}
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  mum(a, b);
  return a ^ b;
}
inline std::uint64_t read64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline std::uint64_t read32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline std::uint64_t read_small(const unsigned char* p, std::size_t k) {
  return (std::uint64_t{p[0]} << 16) | (std::uint64_t{p[k >> 1]} << 8) | p[k - 1];
}

}  // namespace

int owner_of_rank(std::int64_t rank, int cores) {
  METAD_ASSERT(cores > 0);
  return static_cast<int>(((rank % cores) + cores) % cores);
}

std::uint64_t key_hash(std::string_view key) {
  const auto* p = reinterpret_cast<const unsigned char*>(key.data());
  const std::size_t len = key.size();
  std::uint64_t seed = k_secret0;
  std::uint64_t a = 0, b = 0;
  if (len <= 16) {
    if (len >= 4) {
      const std::size_t step = (len >> 3) << 2;
      a = (read32(p) << 32) | read32(p + step);
      b = (read32(p + len - 4) << 32) | read32(p + len - 4 - step);
    } else if (len > 0) {
      a = read_small(p, len);
    }
  } else {
    std::size_t i = len;
    if (i > 48) {
      std::uint64_t s1 = seed, s2 = seed;
      do {
        seed = mix(read64(p) ^ k_secret1, read64(p + 8) ^ seed);
        s1 = mix(read64(p + 16) ^ k_secret2, read64(p + 24) ^ s1);
        s2 = mix(read64(p + 32) ^ k_secret3, read64(p + 40) ^ s2);
        p += 48;
        i -= 48;
      } while (i > 48);
      seed ^= s1 ^ s2;
    }
    while (i > 16) {
      seed = mix(read64(p) ^ k_secret1, read64(p + 8) ^ seed);
      p += 16;
      i -= 16;
    }
    a = read64(p + i - 16);
    b = read64(p + i - 8);
  }
  a ^= k_secret1;
  b ^= seed;
  mum(a, b);
  return mix(a ^ k_secret0 ^ len, b ^ k_secret1);
}

std::uint64_t key_hash(const packed_key& k) {
#if !(defined(__SSSE3__) && defined(__SSE4_1__))
  char text[packed_key_chars];
  unpack_hex_key(k, text);
  return key_hash(std::string_view(text, sizeof text));
#else
  // The characters as four little-endian words, as key_hash reads them: each byte's
  // high nibble's digit, then its low nibble's.
  const __m128i bytes = _mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  const __m128i digits =
      _mm_setr_epi8('0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f');
  const __m128i high = _mm_shuffle_epi8(digits, _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
  const __m128i low = _mm_shuffle_epi8(digits, _mm_and_si128(bytes, nibble));
  const __m128i first = _mm_unpacklo_epi8(high, low);   // characters 0-15
  const __m128i second = _mm_unpackhi_epi8(high, low);  // characters 16-31
  const auto w0 = static_cast<std::uint64_t>(_mm_cvtsi128_si64(first));
  const auto w1 = static_cast<std::uint64_t>(_mm_extract_epi64(first, 1));
  const auto w2 = static_cast<std::uint64_t>(_mm_cvtsi128_si64(second));
  const auto w3 = static_cast<std::uint64_t>(_mm_extract_epi64(second, 1));
  // key_hash's steps for 32 bytes: one 16-byte round, then the last 16 bytes.
  const std::uint64_t seed = mix(w0 ^ k_secret1, w1 ^ k_secret0);
  std::uint64_t a = w2 ^ k_secret1, b = w3 ^ seed;
  mum(a, b);
  return mix(a ^ k_secret0 ^ packed_key_chars, b ^ k_secret1);
#endif
}

int owner_of_key(const packed_key& k, int cores) {
  METAD_ASSERT(cores > 0);
  return static_cast<int>(key_hash(k) % static_cast<std::uint64_t>(cores));
}

int owner_of_key(std::string_view key, int cores) {
  METAD_ASSERT(cores > 0);
  return static_cast<int>(key_hash(key) % static_cast<std::uint64_t>(cores));
}

}  // namespace metad::shard
