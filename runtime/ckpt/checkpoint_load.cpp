// Training checkpoints: atomic save, validating load (see checkpoint.h).
//
// The tracker file and iter_XXXXXXX names follow Megatron-LM's
// megatron/training/checkpointing.py (get_checkpoint_tracker_filename,
// read_metadata, get_checkpoint_name); the CRC32C polynomial 0x82F63B78
// (reflected) is from RFC 3720, appendix B.4.
#include "runtime/ckpt/checkpoint.h"

#include "runtime/base/atomic_file.h"
#include "runtime/base/byte_order.h"
#include "runtime/base/crc32c.h"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace mt::rt {

namespace {

constexpr char kMagic[8] = {'M', 'T', 'C', 'K', 'P', 'T', '\0', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 64;
constexpr uint64_t kAlign = 64;
constexpr const char *kTracker = "latest_checkpointed_iteration.txt";
constexpr const char *kSuffix = ".mtckpt";
constexpr const char *kDistribOptimSuffix = ".distrib_optim.mtckpt";
constexpr const char *kTmpPrefix = ".tmp.iter_";
// Tensor data is checksummed and written in pieces of this size, so the
// checksum reads memory the write then finds in cache.
constexpr size_t kChunk = 8 << 20;

void (*g_step_hook)(const char *) = nullptr;
void step(const char *name) {
  if (g_step_hook)
    g_step_hook(name);
}

// ---------------------------------------------------------------------------
// Dtypes, shapes, text
// ---------------------------------------------------------------------------

struct DtypeInfo {
  const char *name;
  uint8_t code;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {"f32", 1, 4}, {"bf16", 2, 2}, {"f16", 3, 2}, {"i32", 4, 4},
    {"i64", 5, 8}, {"u64", 6, 8},  {"u8", 7, 1},
};
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
const char *kDtypeList = "f32, bf16, f16, i32, i64, u64 or u8";

std::string shape_str(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Bytes of a tensor of this shape and element size; false on a negative
// dimension or overflow.
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

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::string os_error() { return std::strerror(errno); }

std::string iter_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07" PRId64, iteration);
  return buf;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}


bool valid_utf8(const std::string &s) { return simdjson::validate_utf8(s.data(), s.size()); }

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

// Shortest text that reads back as the same double.
std::string json_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s;
}

std::string meta_json(const CheckpointMeta &m, int tp_rank, int pp_rank, int pp_size) {
  std::string j = "{\n  \"format\": \"mt-checkpoint\",\n";
  auto num = [&](const char *key, int64_t v) {
    j += std::string("  \"") + key + "\": " + std::to_string(v) + ",\n";
  };
  auto str = [&](const char *key, const std::string &v) {
    j += std::string("  \"") + key + "\": ";
    json_string(j, v);
    j += ",\n";
  };
  num("iteration", m.iteration);
  num("consumed_train_samples", m.consumed_train_samples);
  num("consumed_valid_samples", m.consumed_valid_samples);
  str("model_fingerprint", m.model_fingerprint);
  str("spec_toml", m.spec_toml);
  j += "  \"rng_state\": [";
  for (size_t i = 0; i < m.rng_state.size(); ++i)
    j += (i ? ", " : "") + std::to_string(m.rng_state[i]);
  j += "],\n";
  j += "  \"loss_scale\": " + json_double(m.loss_scale) + ",\n";
  num("loss_scale_growth_tracker", m.loss_scale_growth_tracker);
  num("loss_scale_hysteresis_tracker", m.loss_scale_hysteresis_tracker);
  num("tp_rank", tp_rank);
  num("pp_rank", pp_rank);
  num("pp_size", pp_size);
  j += "  \"values\": {";
  bool first = true;
  for (const auto &[k, v] : m.values) {
    j += first ? "\n    " : ",\n    ";
    first = false;
    json_string(j, k);
    j += ": ";
    json_string(j, v);
  }
  j += first ? "}\n}\n" : "\n  }\n}\n";
  return j;
}

// ---------------------------------------------------------------------------
// File system
// ---------------------------------------------------------------------------

bool pwrite_all(int fd, const void *data, size_t n, off_t at) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, at);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
    at += w;
  }
  return true;
}

// Flushes a directory's entries. EINVAL means the file system cannot sync
// directories (some network file systems), where there is nothing more to do.
bool fsync_path(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return false;
  bool ok = ::fsync(fd) == 0 || errno == EINVAL;
  int saved = errno;
  ::close(fd);
  errno = saved;
  return ok;
}

std::string parent_of(const std::string &path) {
  size_t slash = path.find_last_not_of('/');
  slash = slash == std::string::npos ? std::string::npos : path.rfind('/', slash);
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool is_dir(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string &path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// mkdir -p; each directory it creates is made durable in its parent.
std::string make_dirs(const std::string &dir) {
  if (dir.empty() || is_dir(dir))
    return "";
  std::string parent = parent_of(dir);
  if (parent != dir) {
    std::string err = make_dirs(parent);
    if (!err.empty())
      return err;
  }
  step("mkdir");
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return "cannot create directory '" + dir + "': " + os_error();
  fsync_path(parent);
  return "";
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

int remove_entry(const char *path, const struct stat *, int, struct FTW *) {
  return ::remove(path);
}
bool remove_tree(const std::string &path) {
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

bool starts_with(const std::string &s, const std::string &prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Iterations with an iter_XXXXXXX directory in dir, ascending.
std::vector<int64_t> saved_iterations(const std::string &dir) {
  std::vector<int64_t> its;
  for (const std::string &n : list_dir(dir)) {
    if (!starts_with(n, "iter_") || n.size() < 12)
      continue;
    int64_t v = 0;
    auto r = std::from_chars(n.data() + 5, n.data() + n.size(), v);
    if (r.ec == std::errc() && r.ptr == n.data() + n.size() && v >= 0 && iter_name(v) == n &&
        is_dir(dir + "/" + n))
      its.push_back(v);
  }
  std::sort(its.begin(), its.end());
  return its;
}

std::string iteration_list(const std::vector<int64_t> &its) {
  std::string s;
  for (size_t i = 0; i < its.size(); ++i)
    s += (i ? ", " : "") + std::to_string(its[i]);
  return s;
}

// Removes what an interrupted save left behind: staging directories (also
// the replaced copy of an iteration) and the tracker's temporaries.
void remove_leftovers(const std::string &save_dir) {
  const std::string tracker_tmp = std::string(kTracker) + ".tmp.";
  for (const std::string &n : list_dir(save_dir)) {
    if (starts_with(n, kTmpPrefix) || starts_with(n, tracker_tmp)) {
      step("cleanup");
      remove_tree(save_dir + "/" + n);
    }
  }
}

} // namespace

void set_checkpoint_step_hook(void (*hook)(const char *step)) { g_step_hook = hook; }

std::string checkpoint_rank_name(int tp_rank, int pp_rank, int pp_size) {
  char buf[64];
  if (pp_size == 1)
    std::snprintf(buf, sizeof buf, "mp_rank_%02d", tp_rank);
  else
    std::snprintf(buf, sizeof buf, "mp_rank_%02d_%03d", tp_rank, pp_rank);
  return buf;
}

bool checkpoint_exists(const std::string &load_dir) { return exists(load_dir + "/" + kTracker); }

// ---------------------------------------------------------------------------
// Save
// ---------------------------------------------------------------------------

namespace {

// One rank file laid out in memory before anything touches the disk: its
// table (offsets set, checksums filled while the data is written), sizes.
struct PreparedFile {
  struct Slot {
    const CheckpointTensor *t;
    uint64_t offset;
    size_t crc_at; // where its CRC sits in the table
  };
  std::string name, json, table;
  std::vector<Slot> slots;
  uint64_t table_offset = 0, data_start = 0, file_size = 0;
};

// Checks names, dtypes and sizes and lays out the file; "" or the problem.
std::string prepare_file(const std::string &here, const std::string &json,
                         const std::vector<CheckpointTensor> &tensors, PreparedFile &f) {
  using Slot = PreparedFile::Slot;
  std::vector<Slot> &slots = f.slots;
  std::string &table = f.table;
  f.json = json;
  std::unordered_set<std::string> seen;
  for (const CheckpointTensor &t : tensors) {
    const DtypeInfo *d = dtype_by_name(t.dtype);
    if (t.name.empty() || t.name.size() > 65535 || !valid_utf8(t.name))
      return here + "tensor name '" + t.name + "' must be 1 to 65535 bytes of UTF-8";
    if (!seen.insert(t.name).second)
      return here + "tensor '" + t.name + "' is given twice; names must be unique";
    if (!d)
      return here + "tensor '" + t.name + "' has unknown dtype '" + t.dtype + "'; use " +
             kDtypeList;
    uint64_t need = 0;
    if (t.shape.size() > 255 || !shape_bytes(t.shape, d->size, &need))
      return here + "tensor '" + t.name + "' has invalid shape " + shape_str(t.shape);
    if (need != t.bytes)
      return here + "tensor '" + t.name + "' is " + shape_str(t.shape) + " " + t.dtype + " (" +
             std::to_string(need) + " bytes) but " + std::to_string(t.bytes) + " bytes were given";
    if (t.bytes > 0 && !t.data)
      return here + "tensor '" + t.name + "' has no data";
    put_le<uint16_t>(table, static_cast<uint16_t>(t.name.size()));
    table += t.name;
    put_le<uint8_t>(table, d->code);
    put_le<uint8_t>(table, static_cast<uint8_t>(t.shape.size()));
    for (int64_t dim : t.shape)
      put_le<int64_t>(table, dim);
    put_le<uint64_t>(table, 0); // offset, filled below
    put_le<uint64_t>(table, t.bytes);
    slots.push_back({&t, 0, table.size()});
    put_le<uint32_t>(table, 0); // CRC, filled below
  }
  const uint64_t table_offset = kHeaderSize + json.size();
  const uint64_t data_start = align_up(table_offset + table.size());
  uint64_t file_size = table_offset + table.size(), at = data_start;
  for (Slot &s : slots) {
    s.offset = at;
    file_size = at + s.t->bytes;
    at = align_up(file_size);
    std::memcpy(&table[s.crc_at - 16], &s.offset, 8);
  }
  f.table_offset = table_offset;
  f.data_start = data_start;
  f.file_size = file_size;
  return "";
}

// Writes a prepared file to `tmp_file`, data first, and fsyncs it.
std::string write_prepared(const std::string &here, const std::string &tmp_file,
                           PreparedFile &f) {
  using Slot = PreparedFile::Slot;
  std::vector<Slot> &slots = f.slots;
  std::string &table = f.table;
  const std::string &json = f.json;
  const uint64_t table_offset = f.table_offset, data_start = f.data_start,
                 file_size = f.file_size;
  const std::string no_space = "; check free disk space on the --save file system";
  int fd = ::open(tmp_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return here + "cannot create '" + tmp_file + "': " + os_error();
  auto fail = [&](const std::string &what) {
    std::string e = here + what + " '" + tmp_file + "': " + os_error() + no_space;
    ::close(fd);
    return e;
  };

  // Tensor data first, checksummed piece by piece; the header, metadata and
  // table (which hold the checksums) last, at the front of the file.
  if (::lseek(fd, static_cast<off_t>(data_start), SEEK_SET) < 0)
    return fail("cannot seek in");
  static const char zeros[kAlign] = {};
  uint64_t pos = data_start;
  for (Slot &s : slots) {
    if (s.offset > pos && !write_all(fd, zeros, s.offset - pos))
      return fail("cannot write");
    const auto *p = static_cast<const unsigned char *>(s.t->data);
    uint32_t crc = 0;
    for (size_t done = 0; done < s.t->bytes;) {
      size_t n = std::min(kChunk, s.t->bytes - done);
      crc = crc32c(p + done, n, crc);
      step("write");
      if (!write_all(fd, p + done, n))
        return fail("cannot write");
      done += n;
    }
    pos = s.offset + s.t->bytes;
    std::memcpy(&table[s.crc_at], &crc, 4);
  }
  std::string head;
  head.reserve(data_start);
  head.append(kMagic, sizeof kMagic);
  put_le<uint32_t>(head, kVersion);
  put_le<uint32_t>(head, 0); // header CRC, below
  put_le<uint64_t>(head, file_size);
  put_le<uint64_t>(head, kHeaderSize);
  put_le<uint64_t>(head, json.size());
  put_le<uint64_t>(head, table_offset);
  put_le<uint64_t>(head, table.size());
  put_le<uint64_t>(head, slots.size());
  uint32_t hcrc = crc32c(head.data() + 16, kHeaderSize - 16);
  hcrc = crc32c(json.data(), json.size(), hcrc);
  hcrc = crc32c(table.data(), table.size(), hcrc);
  std::memcpy(&head[12], &hcrc, 4);
  head += json;
  head += table;
  head.resize(std::min<uint64_t>(data_start, file_size), '\0');
  step("write");
  if (!pwrite_all(fd, head.data(), head.size(), 0))
    return fail("cannot write");
  step("fsync");
  if (::fsync(fd) != 0)
    return fail("cannot flush");
  if (::close(fd) != 0)
    return here + "cannot close '" + tmp_file + "': " + os_error() + no_space;
  return "";
}

} // namespace

std::string checkpoint_file_name(int tp_rank, int pp_rank, int pp_size, bool distrib_optim) {
  return checkpoint_rank_name(tp_rank, pp_rank, pp_size) +
         (distrib_optim ? kDistribOptimSuffix : kSuffix);
}

std::string begin_checkpoint_save(const std::string &save_dir, int64_t iteration,
                                  std::string *staging) {
  const std::string here = (save_dir.empty() ? std::string("<empty>") : save_dir) + ": error: ";
  if (save_dir.empty())
    return here + "no directory to save checkpoints to; set --save";
  if (iteration < 0)
    return here + "cannot save iteration " + std::to_string(iteration) + ": iterations are >= 0";
  std::string err = make_dirs(save_dir);
  if (!err.empty())
    return here + err + "; check that --save names a writable place";
  remove_leftovers(save_dir);
  std::string dir = save_dir + "/" + kTmpPrefix + iter_name(iteration).substr(5) + ".XXXXXX";
  step("mkdir");
  if (!::mkdtemp(dir.data()))
    return here + "cannot create a staging directory in '" + save_dir + "': " + os_error() +
           "; check that it is writable";
  ::chmod(dir.c_str(), 0755);
  *staging = dir;
  return "";
}

std::string write_checkpoint_files(const std::string &staging, const CheckpointMeta &meta,
                                   const std::vector<CheckpointTensor> &tensors, int tp_rank,
                                   int pp_rank, int pp_size,
                                   const std::vector<CheckpointTensor> *distrib_optim) {
  const std::string here = parent_of(staging) + ": error: ";
  if (meta.iteration < 0)
    return here + "cannot save iteration " + std::to_string(meta.iteration) +
           ": iterations are >= 0";
  if (tp_rank < 0 || pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size)
    return here + "invalid rank: tensor rank " + std::to_string(tp_rank) + ", pipeline rank " +
           std::to_string(pp_rank) + " of " + std::to_string(pp_size);
  if (!std::isfinite(meta.loss_scale))
    return here + "loss scale " + json_double(meta.loss_scale) +
           " is not finite; a checkpoint must hold a usable loss scale";
  if (!valid_utf8(meta.spec_toml) || !valid_utf8(meta.model_fingerprint))
    return here + "the spec text or the model fingerprint is not valid UTF-8";
  for (const auto &[k, v] : meta.values)
    if (!valid_utf8(k) || !valid_utf8(v))
      return here + "metadata value '" + k + "' is not valid UTF-8";

  const std::string json = meta_json(meta, tp_rank, pp_rank, pp_size);
  PreparedFile files[2];
  files[0].name = checkpoint_file_name(tp_rank, pp_rank, pp_size, false);
  if (std::string e = prepare_file(here, json, tensors, files[0]); !e.empty())
    return e;
  const size_t nfiles = distrib_optim ? 2 : 1;
  if (distrib_optim) {
    files[1].name = checkpoint_file_name(tp_rank, pp_rank, pp_size, true);
    if (std::string e = prepare_file(here, json, *distrib_optim, files[1]); !e.empty())
      return e;
  }
  for (size_t i = 0; i < nfiles; ++i)
    if (std::string e = write_prepared(here, staging + "/" + files[i].name, files[i]); !e.empty())
      return e;
  return "";
}

void abort_checkpoint_save(const std::string &staging) {
  if (!staging.empty())
    remove_tree(staging);
}

std::string commit_checkpoint_save(const std::string &save_dir, int64_t iteration,
                                   const std::string &staging,
                                   const std::vector<std::string> &files) {
  const std::string here = save_dir + ": error: ";
  // Until the rename the staging directory is ours to delete on failure.
  struct Staging {
    std::string path;
    ~Staging() {
      if (!path.empty())
        remove_tree(path);
    }
  } guard{staging};
  // Every rank's file must be there: a checkpoint missing one would load
  // on some ranks and not on others.
  for (const std::string &f : files)
    if (!exists(staging + "/" + f))
      return here + "the staging directory '" + staging + "' lacks " + f +
             " after every rank reported its files written; the --save directory must be one "
             "shared file system that every rank sees";
  step("fsync");
  if (!fsync_path(staging))
    return here + "cannot flush directory '" + staging + "': " + os_error();

  // Into place: a plain rename when the iteration is new, else an exchange
  // with the old directory, which then sits at the staging name.
  const std::string final_dir = save_dir + "/" + iter_name(iteration);
  step("rename");
  bool replaced = false;
  int r = ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE);
  if (r != 0 && errno == EINVAL) {
    // A file system without rename flags: check, then rename.
    if (exists(final_dir)) {
      errno = EEXIST;
    } else {
      r = ::rename(staging.c_str(), final_dir.c_str());
    }
  }
  if (r != 0 && errno == EEXIST) {
    r = ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE);
    if (r != 0 && (errno == EINVAL || errno == ENOSYS))
      return here + "'" + final_dir +
             "' exists and this file system cannot replace a directory atomically "
             "(no RENAME_EXCHANGE); move or delete it, then save again";
    replaced = r == 0;
  }
  if (r != 0)
    return here + "cannot rename '" + staging + "' to '" + final_dir + "': " + os_error();
  if (!replaced)
    guard.path.clear();
  step("fsync");
  if (!fsync_path(save_dir))
    return here + "cannot flush directory '" + save_dir + "': " + os_error();

  step("tracker");
  std::string err = write_file_atomically(save_dir + "/" + kTracker, std::to_string(iteration));
  if (!err.empty())
    return here + err;
  if (replaced)
    step("cleanup"); // the guard deletes the replaced copy
  return "";
}

std::string save_checkpoint(const std::string &save_dir, const CheckpointMeta &meta,
                            const std::vector<CheckpointTensor> &tensors, int tp_rank, int pp_rank,
                            int pp_size, const std::vector<CheckpointTensor> *distrib_optim) {
  const std::string here = (save_dir.empty() ? std::string("<empty>") : save_dir) + ": error: ";
  if (save_dir.empty())
    return here + "no directory to save checkpoints to; set --save";
  if (meta.iteration < 0)
    return here + "cannot save iteration " + std::to_string(meta.iteration) +
           ": iterations are >= 0";
  std::string staging;
  if (std::string e = begin_checkpoint_save(save_dir, meta.iteration, &staging); !e.empty())
    return e;
  std::string e = write_checkpoint_files(staging, meta, tensors, tp_rank, pp_rank, pp_size,
                                         distrib_optim);
  if (!e.empty()) {
    abort_checkpoint_save(staging);
    return e;
  }
  std::vector<std::string> files = {checkpoint_file_name(tp_rank, pp_rank, pp_size, false)};
  if (distrib_optim)
    files.push_back(checkpoint_file_name(tp_rank, pp_rank, pp_size, true));
  return commit_checkpoint_save(save_dir, meta.iteration, staging, files);
}

// ---------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------

struct CheckpointReader::Impl {
  struct Entry {
    std::string name;
    const DtypeInfo *dtype;
    std::vector<int64_t> shape;
    uint64_t offset, bytes;
    uint32_t crc;
  };
  std::string path;
  const unsigned char *data = nullptr;
  size_t size = 0;
  CheckpointMeta meta;
  int tp_rank = 0, pp_rank = 0, pp_size = 1;
  std::vector<Entry> entries;
  std::unordered_map<std::string, size_t> index;

  ~Impl() {
    if (data)
      ::munmap(const_cast<unsigned char *>(data), size);
  }
  std::string parse();
  std::string parse_meta(const unsigned char *p, size_t n);
};

namespace {

const char *kOtherIteration = "load an earlier iteration instead, or start from scratch";

// A tracker's content: the iteration, or an error without the file prefix.
std::string parse_tracker(const std::string &text, int64_t *iteration) {
  size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
  std::string t = b == std::string::npos ? "" : text.substr(b, e - b + 1);
  if (t == "release")
    return "says 'release': this is a converted Megatron-LM checkpoint (torch files under "
           "release/), which mt cannot read; load a checkpoint that mt saved, or start from "
           "scratch";
  int64_t v = -1;
  auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size() || v < 0) {
    std::string shown = t.size() > 40 ? t.substr(0, 40) + "..." : t;
    return "expected an iteration number, found '" + shown +
           "'; the file is damaged: write the number of a complete iter_XXXXXXX directory "
           "into it";
  }
  *iteration = v;
  return "";
}

bool read_small_file(const std::string &path, std::string *out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  char buf[4096];
  out->clear();
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > (1 << 20))
      break;
  }
  ::close(fd);
  return true;
}

// Why an iteration directory has no rank file of ours, as a reason and advice.
std::string missing_rank_file(const std::string &dir, const std::string &file) {
  std::vector<std::string> ours, megatron;
  for (const std::string &n : list_dir(dir)) {
    if (n.size() > std::strlen(kSuffix) &&
        n.compare(n.size() - std::strlen(kSuffix), std::string::npos, kSuffix) == 0)
      ours.push_back(n);
    else if (n == "common.pt" || n == "metadata.json" || starts_with(n, "mp_rank_") ||
             n.find(".distcp") != std::string::npos)
      megatron.push_back(n);
  }
  if (ours.empty() && !megatron.empty())
    return dir + ": error: this is a Megatron-LM checkpoint (it holds " + megatron.front() +
           "), which mt cannot read; load a checkpoint that mt saved, or start from scratch";
  if (ours.empty())
    return dir + ": error: has no " + file +
           " (no mt checkpoint files at all); the save that made it did not finish or the "
           "files were deleted: " +
           kOtherIteration;
  std::string have;
  for (size_t i = 0; i < ours.size(); ++i)
    have += (i ? ", " : "") + ours[i];
  return dir + ": error: has no " + file + " (it has " + have +
         "); the checkpoint was saved with a different tensor/pipeline parallel layout: convert "
         "it with 'mtc reshard', or load it with the layout it was saved with";
}

} // namespace

std::string CheckpointReader::Impl::parse_meta(const unsigned char *p, size_t n) {
  simdjson::dom::parser parser;
  simdjson::padded_string text(reinterpret_cast<const char *>(p), n);
  simdjson::dom::element root;
  simdjson::dom::object obj;
  if (parser.parse(text).get(root) != simdjson::SUCCESS ||
      root.get_object().get(obj) != simdjson::SUCCESS)
    return "the metadata is not a JSON object";
  std::string_view format;
  if (obj["format"].get_string().get(format) != simdjson::SUCCESS || format != "mt-checkpoint")
    return "the metadata does not say \"format\": \"mt-checkpoint\"";
  std::string missing;
  auto need_int = [&](const char *key, int64_t *out) {
    if (obj[key].get_int64().get(*out) != simdjson::SUCCESS && missing.empty())
      missing = key;
  };
  auto need_str = [&](const char *key, std::string *out) {
    std::string_view v;
    if (obj[key].get_string().get(v) != simdjson::SUCCESS) {
      if (missing.empty())
        missing = key;
      return;
    }
    out->assign(v.data(), v.size());
  };
  int64_t tp = -1, pp = -1, pps = -1;
  need_int("iteration", &meta.iteration);
  need_int("consumed_train_samples", &meta.consumed_train_samples);
  need_int("consumed_valid_samples", &meta.consumed_valid_samples);
  need_str("model_fingerprint", &meta.model_fingerprint);
  need_str("spec_toml", &meta.spec_toml);
  need_int("loss_scale_growth_tracker", &meta.loss_scale_growth_tracker);
  need_int("loss_scale_hysteresis_tracker", &meta.loss_scale_hysteresis_tracker);
  need_int("tp_rank", &tp);
  need_int("pp_rank", &pp);
  need_int("pp_size", &pps);
  if (obj["loss_scale"].get_double().get(meta.loss_scale) != simdjson::SUCCESS && missing.empty())
    missing = "loss_scale";
  simdjson::dom::array rng;
  if (obj["rng_state"].get_array().get(rng) != simdjson::SUCCESS) {
    if (missing.empty())
      missing = "rng_state";
  } else {
    for (simdjson::dom::element e : rng) {
      uint64_t v;
      if (e.get_uint64().get(v) != simdjson::SUCCESS)
        return "the metadata's rng_state holds something other than unsigned integers";
      meta.rng_state.push_back(v);
    }
  }
  simdjson::dom::object values;
  if (obj["values"].get_object().get(values) != simdjson::SUCCESS) {
    if (missing.empty())
      missing = "values";
  } else {
    for (auto field : values) {
      std::string_view v;
      if (field.value.get_string().get(v) != simdjson::SUCCESS)
        return "the metadata value '" + std::string(field.key) + "' is not a string";
      meta.values.emplace(std::string(field.key), std::string(v));
    }
  }
  if (!missing.empty())
    return "the metadata lacks '" + missing + "' (or it has the wrong type)";
  tp_rank = static_cast<int>(tp);
  pp_rank = static_cast<int>(pp);
  pp_size = static_cast<int>(pps);
  return "";
}

// Validates the mapped file; returns an error without the file prefix.
std::string CheckpointReader::Impl::parse() {
  const unsigned char *p = data;
  const uint64_t n = size;
  const std::string truncated_advice =
      "; the save was cut short or the file was copied incompletely: copy it again or " +
      std::string(kOtherIteration);
  if (n < sizeof kMagic) {
    if (std::memcmp(p, kMagic, n) == 0)
      return "truncated: " + std::to_string(n) + " bytes, shorter than the " +
             std::to_string(kHeaderSize) + "-byte header" + truncated_advice;
  }
  if (n < sizeof kMagic || std::memcmp(p, kMagic, sizeof kMagic) != 0) {
    if (n >= 4 && std::memcmp(p, "PK\x03\x04", 4) == 0)
      return "this is a PyTorch file (torch.save), not an mt checkpoint; mt cannot read "
             "Megatron-LM checkpoints: load a checkpoint that mt saved, or start from scratch";
    return "not an mt checkpoint (it does not start with \"MTCKPT\"); the file is damaged or "
           "is something else: " +
           std::string(kOtherIteration);
  }
  if (n < 12)
    return "truncated: " + std::to_string(n) + " bytes, shorter than the " +
           std::to_string(kHeaderSize) + "-byte header" + truncated_advice;
  const uint32_t version = get_le<uint32_t>(p + 8);
  if (version > kVersion)
    return "format version " + std::to_string(version) + " is newer than this mt reads (version " +
           std::to_string(kVersion) + "); load it with the mt that saved it, or update mt";
  if (version == 0)
    return "format version 0 does not exist; the header is damaged: " +
           std::string(kOtherIteration);
  if (n < kHeaderSize)
    return "truncated: " + std::to_string(n) + " bytes, shorter than the " +
           std::to_string(kHeaderSize) + "-byte header" + truncated_advice;
  const uint64_t file_size = get_le<uint64_t>(p + 16);
  if (n < file_size)
    return "truncated: the file has " + std::to_string(n) + " bytes but its header says " +
           std::to_string(file_size) + truncated_advice;
  if (n > file_size)
    return "the file has " + std::to_string(n) + " bytes but its header says " +
           std::to_string(file_size) +
           "; something was appended or the header is damaged: " + kOtherIteration;
  const uint64_t meta_off = get_le<uint64_t>(p + 24), meta_size = get_le<uint64_t>(p + 32);
  const uint64_t table_off = get_le<uint64_t>(p + 40), table_size = get_le<uint64_t>(p + 48);
  const uint64_t count = get_le<uint64_t>(p + 56);
  const std::string damaged = "; the file was damaged after it was written: ";
  if (meta_off != kHeaderSize || meta_size > n - meta_off || table_off != meta_off + meta_size ||
      table_size > n - table_off)
    return "the header's metadata and table bounds lie outside the file" + damaged +
           kOtherIteration;
  uint32_t crc = crc32c(p + 16, kHeaderSize - 16);
  crc = crc32c(p + meta_off, meta_size, crc);
  crc = crc32c(p + table_off, table_size, crc);
  if (crc != get_le<uint32_t>(p + 12))
    return "the header, metadata or tensor table is corrupt (CRC32C " + hex32(crc) + ", recorded " +
           hex32(get_le<uint32_t>(p + 12)) + ")" + damaged + kOtherIteration;
  std::string err = parse_meta(p + meta_off, meta_size);
  if (!err.empty())
    return err + damaged + kOtherIteration;

  // The table: every field in bounds, data in order, aligned, not overlapping.
  const unsigned char *t = p + table_off, *end = t + table_size;
  uint64_t next_free = table_off + table_size;
  auto bad = [&](uint64_t i, const std::string &what) {
    return "tensor table entry " + std::to_string(i) + " " + what + damaged + kOtherIteration;
  };
  if (count > table_size / 25)
    return bad(0, "count " + std::to_string(count) + " cannot fit the table");
  for (uint64_t i = 0; i < count; ++i) {
    Entry e;
    if (end - t < 2)
      return bad(i, "runs past the table");
    uint16_t name_size = get_le<uint16_t>(t);
    t += 2;
    if (static_cast<size_t>(end - t) < name_size + 2u || name_size == 0)
      return bad(i, "runs past the table");
    e.name.assign(reinterpret_cast<const char *>(t), name_size);
    t += name_size;
    e.dtype = dtype_by_code(t[0]);
    uint8_t rank = t[1];
    t += 2;
    if (!e.dtype)
      return bad(i, "('" + e.name + "') has unknown dtype code " + std::to_string(t[-2]));
    if (static_cast<size_t>(end - t) < rank * 8u + 20u)
      return bad(i, "('" + e.name + "') runs past the table");
    for (uint8_t k = 0; k < rank; ++k, t += 8)
      e.shape.push_back(get_le<int64_t>(t));
    e.offset = get_le<uint64_t>(t);
    e.bytes = get_le<uint64_t>(t + 8);
    e.crc = get_le<uint32_t>(t + 16);
    t += 20;
    uint64_t need = 0;
    if (!shape_bytes(e.shape, e.dtype->size, &need) || need != e.bytes)
      return bad(i, "('" + e.name + "') has shape " + shape_str(e.shape) + " " + e.dtype->name +
                        " but " + std::to_string(e.bytes) + " bytes");
    if (e.offset % kAlign != 0 || e.offset < next_free || e.offset > n || e.bytes > n - e.offset)
      return bad(i, "('" + e.name + "') has data at [" + std::to_string(e.offset) + ", +" +
                        std::to_string(e.bytes) + "), outside the file's data area");
    next_free = e.offset + e.bytes;
    if (!index.emplace(e.name, entries.size()).second)
      return bad(i, "repeats the name '" + e.name + "'");
    entries.push_back(std::move(e));
  }
  if (t != end)
    return "the tensor table has " + std::to_string(end - t) + " bytes after its last entry" +
           damaged + kOtherIteration;
  for (const Entry &e : entries) {
    uint32_t c = crc32c(p + e.offset, e.bytes);
    if (c != e.crc)
      return "tensor '" + e.name + "' is corrupt (CRC32C " + hex32(c) + ", recorded " +
             hex32(e.crc) + ")" + damaged + kOtherIteration;
  }
  return "";
}

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

std::unique_ptr<CheckpointReader> CheckpointReader::open(const std::string &load_dir,
                                                         int64_t iteration, int tp_rank,
                                                         int pp_rank, int pp_size,
                                                         std::string *error,
                                                         bool distrib_optim) {
  auto fail = [&](const std::string &msg) {
    *error = msg;
    return nullptr;
  };
  if ((tp_rank < 0 && tp_rank != -1) || pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size)
    return fail(load_dir + ": error: invalid rank: tensor rank " + std::to_string(tp_rank) +
                ", pipeline rank " + std::to_string(pp_rank) + " of " + std::to_string(pp_size));
  const std::string tracker = load_dir + "/" + kTracker;
  bool from_tracker = iteration < 0;
  if (from_tracker) {
    std::string text;
    if (!read_small_file(tracker, &text)) {
      if (errno != ENOENT)
        return fail(tracker + ": error: cannot read: " + os_error());
      if (!is_dir(load_dir))
        return fail("no checkpoint in " + load_dir +
                    " (the directory does not exist); check --load, or start without it to "
                    "train from scratch");
      std::vector<int64_t> its = saved_iterations(load_dir);
      if (!its.empty())
        return fail("no checkpoint in " + load_dir + " (" + kTracker +
                    " is missing, but there are iter_ directories for iterations " +
                    iteration_list(its) + "); load one of them by its iteration");
      return fail("no checkpoint in " + load_dir + " (" + kTracker +
                  " is missing); check --load, or start without it to train from scratch");
    }
    std::string err = parse_tracker(text, &iteration);
    if (!err.empty())
      return fail(tracker + ": error: " + err);
  }
  const std::string dir = load_dir + "/" + iter_name(iteration);
  if (!is_dir(dir)) {
    std::vector<int64_t> its = saved_iterations(load_dir);
    std::string here = its.empty() ? "there are none" : "there are " + iteration_list(its);
    if (from_tracker)
      return fail(tracker + ": error: names iteration " + std::to_string(iteration) + " but " +
                  dir + " does not exist (" + here +
                  "); restore that directory, or write the number of a complete one into the "
                  "tracker");
    return fail("no checkpoint for iteration " + std::to_string(iteration) + " in " + load_dir +
                " (" + iter_name(iteration) + " does not exist; " + here + ")");
  }
  // The first rank's file, whatever the pipeline size (tp_rank -1).
  std::string file;
  if (tp_rank < 0) {
    file = checkpoint_file_name(0, 0, 1, false);
    if (!exists(dir + "/" + file) && exists(dir + "/" + checkpoint_file_name(0, 0, 2, false)))
      file = checkpoint_file_name(0, 0, 2, false);
  } else {
    file = checkpoint_file_name(tp_rank, pp_rank, pp_size, distrib_optim);
  }
  auto impl = std::make_unique<Impl>();
  impl->path = dir + "/" + file;
  const std::string &path = impl->path;

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return fail(missing_rank_file(dir, file));
    return fail(path + ": error: cannot open: " + os_error());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(path + ": error: not a regular file");
  }
  impl->size = static_cast<size_t>(st.st_size);
  if (impl->size > 0) {
    void *m = ::mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
      std::string err = path + ": error: cannot map: " + os_error();
      ::close(fd);
      return fail(err);
    }
    impl->data = static_cast<const unsigned char *>(m);
  }
  ::close(fd);
  static const unsigned char empty[1] = {0};
  const unsigned char *keep = impl->data;
  if (!impl->data)
    impl->data = empty;
  std::string err = impl->parse();
  if (!keep)
    impl->data = nullptr;
  if (!err.empty())
    return fail(path + ": error: " + err);
  const CheckpointMeta &m = impl->meta;
  if (m.iteration != iteration)
    return fail(path + ": error: records iteration " + std::to_string(m.iteration) +
                " but lies in " + iter_name(iteration) +
                "; files were moved between checkpoints: " + kOtherIteration);
  if (tp_rank < 0 ? impl->tp_rank != 0 || impl->pp_rank != 0
                  : impl->tp_rank != tp_rank || impl->pp_rank != pp_rank || impl->pp_size != pp_size)
    return fail(path + ": error: was saved by " +
                checkpoint_rank_name(impl->tp_rank, impl->pp_rank, impl->pp_size) +
                " (pipeline size " + std::to_string(impl->pp_size) +
                "); files were renamed or copied between ranks: " + kOtherIteration);
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(impl)));
}

std::unique_ptr<CheckpointReader> CheckpointReader::open_first(const std::string &load_dir,
                                                               int64_t iteration,
                                                               std::string *error) {
  return open(load_dir, iteration, -1, 0, 1, error);
}

const CheckpointMeta &CheckpointReader::meta() const { return impl_->meta; }
int CheckpointReader::tp_rank() const { return impl_->tp_rank; }
int CheckpointReader::pp_rank() const { return impl_->pp_rank; }
int CheckpointReader::pp_size() const { return impl_->pp_size; }
const std::string &CheckpointReader::path() const { return impl_->path; }

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  for (const Impl::Entry &e : impl_->entries)
    names.push_back(e.name);
  return names;
}

bool CheckpointReader::has(const std::string &name) const { return impl_->index.count(name); }

std::vector<int64_t> CheckpointReader::shape(const std::string &name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? std::vector<int64_t>() : impl_->entries[it->second].shape;
}

std::string CheckpointReader::read(const std::string &name, const std::string &dtype,
                                   const std::vector<int64_t> &shape, void *dst,
                                   size_t bytes) const {
  const std::string &path = impl_->path;
  auto it = impl_->index.find(name);
  if (it == impl_->index.end()) {
    std::string some;
    for (size_t i = 0; i < impl_->entries.size() && i < 3; ++i)
      some += (i ? ", '" : "'") + impl_->entries[i].name + "'";
    return "checkpoint " + path + " has no tensor '" + name + "' (it holds " +
           std::to_string(impl_->entries.size()) + " tensors" +
           (some.empty() ? "" : ": " + some + (impl_->entries.size() > 3 ? ", ..." : "")) +
           "); this checkpoint is from a different model";
  }
  const Impl::Entry &e = impl_->entries[it->second];
  const DtypeInfo *want = dtype_by_name(dtype);
  if (!want)
    return "checkpoint " + path + ": cannot read '" + name + "' as unknown dtype '" + dtype +
           "'; use " + kDtypeList;
  if (want != e.dtype || shape != e.shape)
    return "checkpoint " + path + " has " + name + " as " + shape_str(e.shape) + " " +
           e.dtype->name + " but the plan expects " + shape_str(shape) + " " + want->name +
           (shape != e.shape ? "; this checkpoint is from a different model shape"
                             : "; this checkpoint was saved at a different precision");
  if (bytes != e.bytes)
    return "checkpoint " + path + ": reading " + name + " " + shape_str(shape) + " " + dtype +
           " (" + std::to_string(e.bytes) + " bytes) into a buffer of " + std::to_string(bytes) +
           " bytes";
  if (e.bytes)
    std::memcpy(dst, impl_->data + e.offset, e.bytes);
  return "";
}

} // namespace mt::rt
