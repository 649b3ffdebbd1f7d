// What the save and the load share: the dtype table, names and file-system queries.
//
// The iter_XXXXXXX and mp_rank_XX names follow Megatron-LM's
// megatron/training/checkpointing.py (get_checkpoint_name).
#include "runtime/ckpt/checkpoint_format.h"

#include "runtime/ckpt/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <limits>
#include <sys/stat.h>

namespace mt::rt {

namespace ckpt_detail {

// ---------------------------------------------------------------------------
// Dtypes, shapes, text
// ---------------------------------------------------------------------------

namespace {
constexpr DtypeInfo kDtypes[] = {
    {"f32", 1, 4}, {"bf16", 2, 2}, {"f16", 3, 2}, {"i32", 4, 4},
    {"i64", 5, 8}, {"u64", 6, 8},  {"u8", 7, 1},
};
} // namespace

const DtypeInfo *dtype_by_name(const std::string &name) {
  for (const DtypeInfo &d : kDtypes)
    if (name == d.name)
      return &d;
  return nullptr;
}
const DtypeInfo *dtype_by_code(uint8_t code) {
  for (const DtypeInfo &d : kDtypes)
    if (code == d.code)
      return &d;
  return nullptr;
}

// A JSON string literal of s (UTF-8 passed through, controls escaped).
void json_string(std::string &out, const std::string &s) {
  out += '"';
  for (unsigned char ch : s) {
    switch (ch) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    default:
      if (ch < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", ch);
        out += buf;
      } else {
        out += static_cast<char>(ch);
      }
    }
  }
  out += '"';
}

std::string shape_str(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string size_text(uint64_t bytes) {
  char buf[32];
  if (bytes < 10000)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else if (bytes < 10000000)
    std::snprintf(buf, sizeof buf, "%.1f KB", double(bytes) / 1e3);
  else if (bytes < 10000000000ull)
    std::snprintf(buf, sizeof buf, "%.1f MB", double(bytes) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f GB", double(bytes) / 1e9);
  return buf;
}

bool shape_bytes(const std::vector<int64_t> &shape, size_t elem, uint64_t *out) {
  unsigned __int128 n = elem;
  for (int64_t d : shape) {
    if (d < 0)
      return false;
    n *= static_cast<uint64_t>(d);
    if (n > std::numeric_limits<uint64_t>::max())
      return false;
  }
  *out = static_cast<uint64_t>(n);
  return true;
}

std::string os_error() { return std::strerror(errno); }

bool unsafe_name(const std::string &name) {
  return (!name.empty() && name[0] == '/') || name.find("..") != std::string::npos;
}

std::string iter_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07" PRId64, iteration);
  return buf;
}

bool parse_int(const std::string &text, int64_t lo, int64_t hi, int64_t *out) {
  int64_t v = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (text.empty() || r.ec != std::errc() || r.ptr != text.data() + text.size() || v < lo ||
      v > hi)
    return false;
  *out = v;
  return true;
}

// ---------------------------------------------------------------------------
// File system
// ---------------------------------------------------------------------------

bool is_dir(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string &path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::vector<std::string> list_dir(const std::string &dir) {
  std::vector<std::string> names;
  if (DIR *d = ::opendir(dir.c_str())) {
    while (dirent *e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..")
        names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool starts_with(const std::string &s, const std::string &prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

} // namespace ckpt_detail

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

std::string checkpoint_rank_name(int tp_rank, int pp_rank, int pp_size, int ep_rank,
                                 int ep_size) {
  char buf[64];
  if (pp_size == 1)
    std::snprintf(buf, sizeof buf, "mp_rank_%02d", tp_rank);
  else
    std::snprintf(buf, sizeof buf, "mp_rank_%02d_%03d", tp_rank, pp_rank);
  std::string name = buf;
  // Megatron's get_checkpoint_name: the expert-parallel rank last, when ep > 1.
  if (ep_size > 1) {
    std::snprintf(buf, sizeof buf, "_%03d", ep_rank);
    name += buf;
  }
  return name;
}

std::string checkpoint_file_name(int tp_rank, int pp_rank, int pp_size, bool distrib_optim,
                                 int ep_rank, int ep_size) {
  return checkpoint_rank_name(tp_rank, pp_rank, pp_size, ep_rank, ep_size) +
         (distrib_optim ? ckpt_detail::kDistribOptimSuffix : ckpt_detail::kSuffix);
}

} // namespace mt::rt
