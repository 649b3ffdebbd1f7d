// CRC-32C (Castagnoli): SSE4.2's crc32 instruction where the CPU has it,
// slicing-by-8 tables otherwise.
#include "runtime/base/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mt::rt {
namespace {


struct CrcTables {
  uint32_t t[8][256];
};

const CrcTables &crc_tables() {
  static const CrcTables tables = [] {
    CrcTables x{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      x.t[0][i] = c;
    }
    // t[k][i]: byte i followed by k zero bytes (slicing by 8).
    for (int k = 1; k < 8; ++k)
      for (int i = 0; i < 256; ++i)
        x.t[k][i] = (x.t[k - 1][i] >> 8) ^ x.t[0][x.t[k - 1][i] & 0xFF];
    return x;
  }();
  return tables;
}

// Both take and return the raw register (no pre/post inversion).
uint32_t crc_software(const unsigned char *p, size_t n, uint32_t c) {
  const auto &t = crc_tables().t;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
  }
  for (; n > 0; ++p, --n)
    c = t[0][(c ^ *p) & 0xFF] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
// SSE4.2's crc32 instruction computes exactly this polynomial.
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char *p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; ++p, --n)
    c = _mm_crc32_u8(c, *p);
  return c;
}
#endif

uint32_t crc_raw(const unsigned char *p, size_t n, uint32_t c) {
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42)
    return crc_sse42(p, n, c);
#endif
  return crc_software(p, n, c);
}

} // namespace

uint32_t crc32c(const void *data, size_t n, uint32_t crc) {
  return ~crc_raw(static_cast<const unsigned char *>(data), n, ~crc);
}

} // namespace mt::rt
