// SHA-256 (FIPS 180-4), for content keys and checksums of cached files.
#ifndef MT_RUNTIME_SHA256_H
#define MT_RUNTIME_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mt::rt {

class Sha256 {
public:
  Sha256();
  void update(const void *data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // The digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();

private:
  void block(const uint8_t *p);
  uint32_t h[8];
  uint8_t buf[64];
  size_t used = 0;
  uint64_t total = 0;
};

std::array<uint8_t, 32> sha256(std::string_view bytes);
// Lower-case hexadecimal of a digest.
std::string to_hex(const std::array<uint8_t, 32> &digest);

} // namespace mt::rt

#endif // MT_RUNTIME_SHA256_H
