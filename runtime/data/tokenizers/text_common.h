// Pieces the byte-level tokenizers share: GPT-2's byte alphabet, UTF-8
// checks, the Unicode classes their split patterns need spelled out for
// PCRE2, hashing, the (left, right) -> merge table, the per-encoder cache of
// pre-token -> ids, and file and message helpers. Header-only.
#ifndef MT_RUNTIME_TOKENIZERS_TEXT_COMMON_H
#define MT_RUNTIME_TOKENIZERS_TEXT_COMMON_H

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace mt::rt::tok {

// ---------------------------------------------------------------------------
// GPT-2's bytes_to_unicode: bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand
// for themselves; the other 68 bytes map, in increasing order, to U+0100,
// U+0101, ... so every byte has a printable code point (encoder.py).

struct ByteAlphabet {
  uint16_t byte_to_cp[256];
  int16_t cp_to_byte[256 + 68]; // -1 where the code point is not in the alphabet

  ByteAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t(-1));
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = static_cast<uint16_t>(printable ? b : next++);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

inline const ByteAlphabet &alphabet() {
  static const ByteAlphabet table;
  return table;
}

inline void append_utf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---------------------------------------------------------------------------
// UTF-8 validation by the well-formed byte sequences of Unicode's Table 3-7
// (no overlongs, no surrogates, nothing above U+10FFFF): exactly what PCRE2
// accepts in UTF mode. pcre2_jit_match does not check its subject, so nothing
// invalid may reach it.

// Length of the well-formed sequence starting at p (n > 0 bytes left), or 0.
inline size_t utf8_sequence(const uint8_t *p, size_t n) {
  uint8_t c = p[0];
  if (c < 0x80)
    return 1;
  auto cont = [&](size_t i, uint8_t lo, uint8_t hi) {
    return i < n && p[i] >= lo && p[i] <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF)
    return cont(1, 0x80, 0xBF) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

// Length of the longest well-formed prefix of [p, p+n).
inline size_t valid_utf8_prefix(const uint8_t *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    // ASCII is most text: skip it eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull)
        break;
      i += 8;
    }
    if (i >= n)
      break;
    size_t len = utf8_sequence(p + i, n - i);
    if (len == 0)
      break;
    i += len;
  }
  return i;
}

// ---------------------------------------------------------------------------
// Unicode classes for PCRE2 patterns, spelled out so that a split is the one
// HF tokenizers (Oniguruma, Unicode 16) makes whatever PCRE2's Unicode tables
// are:
// - \s is Unicode's White_Space. PCRE2's UCP \s adds U+180E (via \h), which
//   HF and Python's `regex` do not count as space.
// - \p{L} and \p{N} add the letters and numbers that Unicode 15.0-16.0
//   assigned (new scripts such as Kawi, Garay, Todhri; CJK extensions H, I):
//   Debian's PCRE2 10.42 has Unicode 14 tables and sees them as unassigned.
//   The lists were found by probing HF tokenizers 0.23 on every code point;
//   with newer PCRE2 tables they repeat what \p{L} / \p{N} already hold.
// ASCII letters and digits lead their classes although \p{L} / \p{N} hold
// them: JIT then settles most characters with its bitmap test.
// Each is the inside of a character class.

inline constexpr char kSpace[] = "\\t-\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
                      "\\x{202F}\\x{205F}\\x{3000}";
inline constexpr char kLetter[] =
    "A-Za-z\\p{L}"
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
    "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"
    "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}"
    "\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}"
    "\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}"
    "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}"
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}"
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";
inline constexpr char kNumber[] =
    "0-9\\p{N}"
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}";

// GPT-2's pre-tokenisation pattern (encoder.py; HF's ByteLevel uses it too):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with the classes above. Every character is space, letter, number or
// other, so its matches tile any text.
inline std::string gpt2_split_pattern() {
  std::string s = kSpace, l = kLetter, n = kNumber;
  return "'s|'t|'re|'ve|'m|'ll|'d| ?[" + l + "]+| ?[" + n + "]+| ?[^" + s + l + n + "]+|[" + s +
         "]+(?![^" + s + "])|[" + s + "]+";
}

// ---------------------------------------------------------------------------
// Hashing for the tables below.

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull * (n + 1);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
  }
  return mix64(h);
}

// (left id, right id) -> (rank, merged id), open addressing. The merge loop
// looks pairs up far more often than anything else; one 64-bit key compare
// per probe keeps that cheap.
class PairTable {
public:
  struct Merge {
    int32_t rank;
    int32_t id;
  };

  void reserve(size_t pairs) {
    size_t cap = 16;
    while (cap < pairs * 2)
      cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Merge{-1, -1});
    mask_ = cap - 1;
  }

  // False when the pair is already present.
  bool insert(int32_t a, int32_t b, Merge m) {
    uint64_t key = make_key(a, b);
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key)
        return false;
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        values_[i] = m;
        return true;
      }
    }
  }

  const Merge *find(int32_t a, int32_t b) const {
    uint64_t key = make_key(a, b);
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key)
        return &values_[i];
      if (keys_[i] == kEmpty)
        return nullptr;
    }
  }

private:
  static constexpr uint64_t kEmpty = ~0ull; // ids are non-negative
  static uint64_t make_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
  size_t mask_ = 0;
};

// ---------------------------------------------------------------------------
// The per-encoder cache.

// Pre-token bytes -> ids, open addressing over an arena. It starts small (an
// encoder is cheap to make) and doubles up to kMaxSlots; when that is half
// full it is emptied, which keeps memory flat (a few MB) on any input while
// the common words of a corpus come back within a few documents.
class PieceCache {
public:
  static constexpr size_t kMinSlots = size_t(1) << 10;
  static constexpr size_t kMaxSlots = size_t(1) << 17;
  static constexpr size_t kMaxKey = 64; // longer pieces are rare; not cached

  PieceCache() : slots_(kMinSlots) {}

  // Ids for the piece, or null; *count receives their number.
  const int32_t *find(const uint8_t *p, size_t n, uint64_t h, size_t *count) const {
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot &s = slots_[i];
      if (s.key_len == 0)
        return nullptr;
      if (s.hash == h && s.key_len == n && std::memcmp(keys_.data() + s.key_off, p, n) == 0) {
        *count = s.ids_len;
        return ids_.data() + s.ids_off;
      }
    }
  }

  void insert(const uint8_t *p, size_t n, uint64_t h, const int32_t *ids, size_t count) {
    if (n > kMaxKey || n == 0)
      return;
    if (entries_ >= slots_.size() / 2) {
      if (slots_.size() < kMaxSlots)
        grow();
      else
        clear();
    }
    Slot s;
    s.hash = h;
    s.key_off = static_cast<uint32_t>(keys_.size());
    s.key_len = static_cast<uint32_t>(n);
    s.ids_off = static_cast<uint32_t>(ids_.size());
    s.ids_len = static_cast<uint32_t>(count);
    place(s);
    keys_.append(reinterpret_cast<const char *>(p), n);
    ids_.insert(ids_.end(), ids, ids + count);
    ++entries_;
  }

private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0, key_len = 0; // key_len 0: empty slot
    uint32_t ids_off = 0, ids_len = 0;
  };

  void place(const Slot &s) {
    size_t mask = slots_.size() - 1;
    size_t i = s.hash & mask;
    while (slots_[i].key_len != 0)
      i = (i + 1) & mask;
    slots_[i] = s;
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot &s : old)
      if (s.key_len != 0)
        place(s);
  }

  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    entries_ = 0;
  }

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
};

// ---------------------------------------------------------------------------
// Messages.

inline std::string quoted(std::string_view s) {
  std::string out = "\"";
  size_t shown = 0;
  for (unsigned char c : s) {
    // Stop past 60 bytes, at a character boundary.
    if (++shown > 60 && (c & 0xC0) != 0x80) {
      out += "...";
      break;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

inline bool read_file(const std::string &path, std::string &out, std::string *error) {
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) {
    *error = path + ": error: cannot read: " + std::strerror(errno) + "; check the path";
    return false;
  }
  out.clear();
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0)
    out.append(buf, got);
  bool failed = std::ferror(f);
  int err = errno;
  std::fclose(f);
  if (failed) {
    *error = path + ": error: cannot read: " + std::strerror(err) + "; check the file";
    return false;
  }
  return true;
}

} // namespace mt::rt::tok

#endif // MT_RUNTIME_TOKENIZERS_TEXT_COMMON_H
