// Little-endian field access for mt's file formats (plan.bin, checkpoints,
// dataset indices and caches). Every target mt builds for is little-endian,
// as the formats are, so a field is its bytes copied.
#ifndef MT_RUNTIME_BYTE_ORDER_H
#define MT_RUNTIME_BYTE_ORDER_H

#include <cstring>
#include <string>

namespace mt::rt {

template <typename T> void put_le(std::string &out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

template <typename T> T get_le(const unsigned char *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

} // namespace mt::rt

#endif // MT_RUNTIME_BYTE_ORDER_H
