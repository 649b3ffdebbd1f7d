// Training checkpoints: the atomic save, alone or in the collective's steps (see checkpoint.h).
//
// The tracker file is Megatron-LM's (megatron/training/checkpointing.py,
// get_checkpoint_tracker_filename); the CRC32C polynomial 0x82F63B78
// (reflected) is from RFC 3720, appendix B.4.
#include "runtime/ckpt/checkpoint.h"

#include "runtime/base/atomic_file.h"
#include "runtime/base/byte_order.h"
#include "runtime/base/crc32c.h"
#include "runtime/ckpt/checkpoint_format.h"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_set>

namespace mt::rt {

using namespace ckpt_detail;

namespace {

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
// Metadata
// ---------------------------------------------------------------------------

bool valid_utf8(const std::string &s) { return simdjson::validate_utf8(s.data(), s.size()); }

// Shortest text that reads back as the same double.
std::string json_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s;
}

std::string meta_json(const CheckpointMeta &m, int tp_rank, int pp_rank, int pp_size,
                      int ep_rank, int ep_size) {
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
  if (ep_size > 1) { // absent: saved without expert parallelism
    num("ep_rank", ep_rank);
    num("ep_size", ep_size);
  }
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

// errno after a failed write, with its name and what to do.
std::string write_error() {
  const int e = errno;
  std::string s = os_error();
  if (e == EFBIG)
    return s + " (EFBIG); the file size limit (ulimit -f) is below the checkpoint's size: "
               "raise it";
  if (e == ENOSPC || e == EDQUOT)
    return s + (e == ENOSPC ? " (ENOSPC)" : " (EDQUOT)") +
           "; free disk space (or quota) on the --save file system";
  return s + "; check the --save file system";
}

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

int remove_entry(const char *path, const struct stat *, int, struct FTW *) {
  return ::remove(path);
}
bool remove_tree(const std::string &path) {
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
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

// ---------------------------------------------------------------------------
// Save
// ---------------------------------------------------------------------------

namespace {

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

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
    if (unsafe_name(t.name))
      return here + "tensor name '" + t.name + "' starts with '/' or contains '..'; name "
                    "tensors without them";
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
  int fd = ::open(tmp_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return here + "cannot create '" + tmp_file + "': " + os_error();
  auto fail = [&](const std::string &what) {
    std::string e = here + what + " '" + tmp_file + "': " + write_error();
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
    return here + "cannot close '" + tmp_file + "': " + write_error();
  return "";
}

} // namespace

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
                                   const std::vector<CheckpointTensor> *distrib_optim,
                                   int ep_rank, int ep_size) {
  const std::string here = parent_of(staging) + ": error: ";
  if (meta.iteration < 0)
    return here + "cannot save iteration " + std::to_string(meta.iteration) +
           ": iterations are >= 0";
  if (tp_rank < 0 || pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size)
    return here + "invalid rank: tensor rank " + std::to_string(tp_rank) + ", pipeline rank " +
           std::to_string(pp_rank) + " of " + std::to_string(pp_size);
  if (ep_size < 1 || ep_rank < 0 || ep_rank >= ep_size)
    return here + "invalid rank: expert-parallel rank " + std::to_string(ep_rank) + " of " +
           std::to_string(ep_size);
  if (!std::isfinite(meta.loss_scale))
    return here + "loss scale " + json_double(meta.loss_scale) +
           " is not finite; a checkpoint must hold a usable loss scale";
  if (!valid_utf8(meta.spec_toml) || !valid_utf8(meta.model_fingerprint))
    return here + "the spec text or the model fingerprint is not valid UTF-8";
  for (const auto &[k, v] : meta.values)
    if (!valid_utf8(k) || !valid_utf8(v))
      return here + "metadata value '" + k + "' is not valid UTF-8";

  const std::string json = meta_json(meta, tp_rank, pp_rank, pp_size, ep_rank, ep_size);
  PreparedFile files[2];
  files[0].name = checkpoint_file_name(tp_rank, pp_rank, pp_size, false, ep_rank, ep_size);
  if (std::string e = prepare_file(here, json, tensors, files[0]); !e.empty())
    return e;
  const size_t nfiles = distrib_optim ? 2 : 1;
  if (distrib_optim) {
    files[1].name = checkpoint_file_name(tp_rank, pp_rank, pp_size, true, ep_rank, ep_size);
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
                            int pp_size, const std::vector<CheckpointTensor> *distrib_optim,
                            int ep_rank, int ep_size) {
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
                                         distrib_optim, ep_rank, ep_size);
  if (!e.empty()) {
    abort_checkpoint_save(staging);
    return e;
  }
  std::vector<std::string> files = {
      checkpoint_file_name(tp_rank, pp_rank, pp_size, false, ep_rank, ep_size)};
  if (distrib_optim)
    files.push_back(checkpoint_file_name(tp_rank, pp_rank, pp_size, true, ep_rank, ep_size));
  return commit_checkpoint_save(save_dir, meta.iteration, staging, files);
}

} // namespace mt::rt
