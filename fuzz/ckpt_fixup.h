// Recomputes a checkpoint rank file's CRC32Cs (each tensor's, then the
// header's over header, metadata and table) wherever the mutated file's
// bounds still let them be found, so that mutations reach the checks behind
// the checksums. Layout: runtime/ckpt/checkpoint.h.
#ifndef MT_FUZZ_CKPT_FIXUP_H
#define MT_FUZZ_CKPT_FIXUP_H

#include "fuzz/fuzz_common.h"
#include "runtime/base/crc32c.h"

#include <cstring>
#include <string>

namespace mt::fuzz {

inline void fix_checkpoint_crcs(std::string *file) {
  auto *p = reinterpret_cast<uint8_t *>(file->data());
  const uint64_t n = file->size();
  if (n < 64 || std::memcmp(p, "MTCKPT", 6) != 0)
    return;
  const uint64_t meta_off = get_u64(p + 24), meta_size = get_u64(p + 32);
  const uint64_t table_off = get_u64(p + 40), table_size = get_u64(p + 48);
  const uint64_t count = get_u64(p + 56);
  if (meta_off > n || meta_size > n - meta_off || table_off > n || table_size > n - table_off)
    return;
  // Each tensor's CRC, as far as the table can be walked.
  uint8_t *t = p + table_off, *end = t + table_size;
  for (uint64_t i = 0; i < count && end - t >= 2; ++i) {
    const size_t name = size_t(t[0]) | size_t(t[1]) << 8;
    t += 2;
    if (size_t(end - t) < name + 2)
      break;
    t += name;
    const size_t rank = t[1];
    t += 2;
    if (size_t(end - t) < rank * 8 + 20)
      break;
    t += rank * 8;
    const uint64_t off = get_u64(t), bytes = get_u64(t + 8);
    if (off <= n && bytes <= n - off)
      put_u32(t + 16, mt::rt::crc32c(p + off, bytes));
    t += 20;
  }
  uint32_t crc = mt::rt::crc32c(p + 16, 48);
  crc = mt::rt::crc32c(p + meta_off, meta_size, crc);
  crc = mt::rt::crc32c(p + table_off, table_size, crc);
  put_u32(p + 12, crc);
}

} // namespace mt::fuzz

#endif // MT_FUZZ_CKPT_FIXUP_H
