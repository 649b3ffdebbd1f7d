// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): checkpoints'
// checksums and TensorBoard's TFRecord framing.
#ifndef MT_RUNTIME_CRC32C_H
#define MT_RUNTIME_CRC32C_H

#include <cstddef>
#include <cstdint>

namespace mt::rt {

// CRC32C of data, continuing from crc (0 to start).
uint32_t crc32c(const void *data, size_t n, uint32_t crc = 0);

} // namespace mt::rt

#endif // MT_RUNTIME_CRC32C_H
