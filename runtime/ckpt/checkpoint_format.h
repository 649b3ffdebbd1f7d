// Internal to runtime/ckpt: what the save and the load share of the rank file's format.
#ifndef MT_RUNTIME_CHECKPOINT_FORMAT_H
#define MT_RUNTIME_CHECKPOINT_FORMAT_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mt::rt::ckpt_detail {

// The rank file's layout (checkpoint.h has the whole of it).
inline constexpr char kMagic[8] = {'M', 'T', 'C', 'K', 'P', 'T', '\0', '\0'};
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kHeaderSize = 64;
inline constexpr uint64_t kAlign = 64;
// Names in SAVE and iter_XXXXXXX/.
inline constexpr const char *kTracker = "latest_checkpointed_iteration.txt";
inline constexpr const char *kSuffix = ".mtckpt";
inline constexpr const char *kDistribOptimSuffix = ".distrib_optim.mtckpt";

// ---------------------------------------------------------------------------
// Dtypes, shapes, text
// ---------------------------------------------------------------------------

struct DtypeInfo {
  const char *name;
  uint8_t code;
  size_t size;
};
// Entries of one table, so a dtype's identity is its pointer.
const DtypeInfo *dtype_by_name(const std::string &name);
const DtypeInfo *dtype_by_code(uint8_t code);
inline constexpr const char *kDtypeList = "f32, bf16, f16, i32, i64, u64 or u8";

std::string shape_str(const std::vector<int64_t> &shape);
// "512 B", "48.0 KB", "1.2 MB", "3.4 GB" (decimal units).
std::string size_text(uint64_t bytes);

// Appends s to out as a JSON string literal (UTF-8 passed through, controls escaped).
void json_string(std::string &out, const std::string &s);

// Bytes of a tensor of this shape and element size; false on a negative
// dimension or overflow.
bool shape_bytes(const std::vector<int64_t> &shape, size_t elem, uint64_t *out);

std::string os_error();

// A name read from a checkpoint (a tensor's) that could be taken for a path
// outside where it belongs: absolute (starts with '/') or with a "..".
bool unsafe_name(const std::string &name);

std::string iter_name(int64_t iteration);

// Decimal text (an optional '-', digits, nothing else) in [lo, hi]; false
// otherwise, overflow included.
bool parse_int(const std::string &text, int64_t lo, int64_t hi, int64_t *out);

// ---------------------------------------------------------------------------
// File system
// ---------------------------------------------------------------------------

bool is_dir(const std::string &path);
bool exists(const std::string &path);
// The names in dir but . and .., sorted; none when it cannot be read.
std::vector<std::string> list_dir(const std::string &dir);
bool starts_with(const std::string &s, const std::string &prefix);

} // namespace mt::rt::ckpt_detail

#endif // MT_RUNTIME_CHECKPOINT_FORMAT_H
