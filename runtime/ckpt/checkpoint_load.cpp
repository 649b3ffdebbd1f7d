// Training checkpoints: the validating load (see checkpoint.h).
//
// The tracker file and iter_XXXXXXX names follow Megatron-LM's
// megatron/training/checkpointing.py (get_checkpoint_tracker_filename,
// read_metadata, get_checkpoint_name); the CRC32C polynomial 0x82F63B78
// (reflected) is from RFC 3720, appendix B.4.
#include "runtime/ckpt/checkpoint.h"

#include "runtime/base/byte_order.h"
#include "runtime/base/crc32c.h"
#include "runtime/ckpt/checkpoint_format.h"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace mt::rt {

using namespace ckpt_detail;

bool checkpoint_exists(const std::string &load_dir) { return exists(load_dir + "/" + kTracker); }

std::vector<std::string> checkpoint_contents(const std::string &load_dir) {
  std::vector<std::string> held;
  const size_t suffix = std::strlen(kSuffix);
  for (const std::string &n : list_dir(load_dir)) {
    bool iter_dir = starts_with(n, "iter_") && is_dir(load_dir + "/" + n);
    bool rank_file = n.size() > suffix && n.compare(n.size() - suffix, suffix, kSuffix) == 0;
    if (iter_dir || rank_file)
      held.push_back(n);
  }
  return held;
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
  int ep_rank = 0, ep_size = 1; // absent from files saved without expert parallelism
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

constexpr int64_t kMaxRanks = 1 << 16;

const char *kOtherIteration = "load an earlier iteration instead, or start from scratch";

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
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
  if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size() || v < 0 ||
      v > kMaxCheckpointCount) {
    // What it holds, on the error's one line: bytes other than printable
    // ASCII (line breaks, binary damage) shown as \xHH.
    std::string shown;
    for (size_t i = 0; i < t.size() && i < 40; ++i) {
      const unsigned char c = static_cast<unsigned char>(t[i]);
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      shown += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : std::string(hex);
    }
    if (t.size() > 40)
      shown += "...";
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

// "" when s has no control byte (below 0x20, or 0x7f); otherwise where the
// first is, as "the control byte \x0a at byte 5". mt writes tensor names
// and the model fingerprint without them, and the errors that quote them
// stay one line; so do the values mt reads (the others are free-form text).
std::string control_byte(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "the control byte \\x%02x at byte %zu", c, i);
      return buf;
    }
  }
  return "";
}

// Why an iteration directory has no rank file of ours, as a reason and advice.
std::string missing_rank_file(const std::string &dir, const std::string &file, int ep_rank,
                              int ep_size) {
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
  // An expert-parallel rank's file is asked for once the first file has
  // given the layout: the checkpoint lacks it.
  if (ep_size > 1)
    return dir + ": error: has no " + file + ", the file of expert-parallel rank " +
           std::to_string(ep_rank) + " of " + std::to_string(ep_size) + " (it has " + have +
           "); the save that made it did not finish or the file was deleted: " + kOtherIteration;
  // Files named as this one is (mp_rank_TT or mp_rank_TT_PPP) are of the
  // same layout, which lacks this rank's file; other names, of another
  // tensor/pipeline layout.
  // (the rank part's fields, then the kind of file: model or distrib_optim).
  auto pattern = [](const std::string &n) {
    const size_t dot = n.find('.');
    const std::string rank = n.substr(0, dot);
    return std::make_pair(std::count(rank.begin(), rank.end(), '_'),
                          dot == std::string::npos ? std::string() : n.substr(dot));
  };
  if (std::any_of(ours.begin(), ours.end(),
                  [&](const std::string &n) { return pattern(n) == pattern(file); }))
    return dir + ": error: has no " + file + " (it has " + have +
           "); the save that made it did not finish or the file was deleted: " + kOtherIteration;
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
  std::string missing, wrong;
  auto need_int = [&](const char *key, int64_t *out) {
    simdjson::dom::element e;
    if (obj[key].get(e) != simdjson::SUCCESS) {
      if (missing.empty())
        missing = key;
    } else if (e.get_int64().get(*out) != simdjson::SUCCESS && wrong.empty()) {
      wrong = key;
    }
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
  int64_t epr = 0, eps = 1;
  if (obj["ep_size"].error() == simdjson::SUCCESS || obj["ep_rank"].error() == simdjson::SUCCESS) {
    need_int("ep_rank", &epr);
    need_int("ep_size", &eps);
  }
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
      // The values mt itself reads (and quotes in errors) are mt's text.
      static const char *const kRead[] = {
          "data_parallel",       "distributed_optimizer", "lr_scheduler_samples",
          "no_save_optim",       "no_save_rng",           "optimizer",
          "optimizer_steps",     "param_layout",          "pipeline_parallel",
          "skipped_iterations",  "tensor_parallel",       "train_index_samples",
          "train_order_hash",    "weights_dtype_in_plan", "expert_model_parallel"};
      if (std::find(std::begin(kRead), std::end(kRead), field.key) != std::end(kRead))
        if (std::string c = control_byte(v); !c.empty())
          return "the metadata value '" + std::string(field.key) + "' holds " + c;
      meta.values.emplace(std::string(field.key), std::string(v));
    }
  }
  if (!wrong.empty())
    return "the metadata's " + wrong + " is not an integer in [-2^63, 2^63)";
  if (!missing.empty())
    return "the metadata lacks '" + missing + "' (or it has the wrong type)";
  if (std::string c = control_byte(meta.model_fingerprint); !c.empty())
    return "the metadata's model_fingerprint holds " + c;
  // Every number in its range, before any of them sizes or indexes anything.
  struct Range {
    const char *key;
    int64_t value, lo, hi;
  };
  const Range ranges[] = {
      {"iteration", meta.iteration, 0, kMaxCheckpointCount},
      {"consumed_train_samples", meta.consumed_train_samples, 0, kMaxCheckpointCount},
      {"consumed_valid_samples", meta.consumed_valid_samples, 0, kMaxCheckpointCount},
      {"loss_scale_growth_tracker", meta.loss_scale_growth_tracker, 0, INT32_MAX},
      {"loss_scale_hysteresis_tracker", meta.loss_scale_hysteresis_tracker, INT32_MIN,
       INT32_MAX},
      {"tp_rank", tp, 0, kMaxRanks - 1},
      {"pp_rank", pp, 0, kMaxRanks - 1},
      {"pp_size", pps, 1, kMaxRanks},
      {"ep_rank", epr, 0, kMaxRanks - 1},
      {"ep_size", eps, 1, kMaxRanks},
  };
  for (const Range &r : ranges)
    if (r.value < r.lo || r.value > r.hi)
      return "the metadata's " + std::string(r.key) + " is " + std::to_string(r.value) +
             ", outside [" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]";
  if (pp >= pps)
    return "the metadata's pp_rank is " + std::to_string(pp) + ", not below its pp_size " +
           std::to_string(pps);
  if (epr >= eps)
    return "the metadata's ep_rank is " + std::to_string(epr) + ", not below its ep_size " +
           std::to_string(eps);
  if (!std::isfinite(meta.loss_scale) || meta.loss_scale <= 0)
    return "the metadata's loss_scale is " + std::to_string(meta.loss_scale) +
           ", not a finite number > 0";
  tp_rank = static_cast<int>(tp);
  pp_rank = static_cast<int>(pp);
  pp_size = static_cast<int>(pps);
  ep_rank = static_cast<int>(epr);
  ep_size = static_cast<int>(eps);
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
    if (std::string c = control_byte(e.name); !c.empty())
      return bad(i, "has a name that holds " + c + " (names are printable text)");
    if (unsafe_name(e.name))
      return bad(i, "has the name '" + e.name.substr(0, 80) +
                        "', which starts with '/' or contains '..' (refused: names are never "
                        "paths)");
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
                                                         bool distrib_optim, int ep_rank,
                                                         int ep_size) {
  auto fail = [&](const std::string &msg) {
    *error = msg;
    return nullptr;
  };
  if ((tp_rank < 0 && tp_rank != -1) || pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size ||
      ep_size < 1 || ep_rank < 0 || ep_rank >= ep_size)
    return fail(load_dir + ": error: invalid rank: tensor rank " + std::to_string(tp_rank) +
                ", pipeline rank " + std::to_string(pp_rank) + " of " + std::to_string(pp_size) +
                ", expert-parallel rank " + std::to_string(ep_rank) + " of " +
                std::to_string(ep_size));
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
                " (" + iter_name(iteration) + " does not exist; " + here + ")" +
                (its.empty() ? "; check the directory" : "; name one of those iterations"));
  }
  // The first rank's file, whatever the pipeline and expert-parallel sizes
  // (tp_rank -1): mp_rank_00, mp_rank_00_000 (pp > 1, or ep > 1 alone) or
  // mp_rank_00_000_000 (both); the file's metadata then says which.
  std::string file;
  if (tp_rank < 0) {
    file = checkpoint_file_name(0, 0, 1, false);
    for (const std::string &f :
         {checkpoint_file_name(0, 0, 2, false), checkpoint_file_name(0, 0, 2, false, 0, 2)})
      if (!exists(dir + "/" + file) && exists(dir + "/" + f))
        file = f;
  } else {
    file = checkpoint_file_name(tp_rank, pp_rank, pp_size, distrib_optim, ep_rank, ep_size);
  }
  auto impl = std::make_unique<Impl>();
  impl->path = dir + "/" + file;
  const std::string &path = impl->path;

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return fail(missing_rank_file(dir, file, ep_rank, ep_size));
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
  const bool named = tp_rank < 0
                         ? file == checkpoint_file_name(0, 0, impl->pp_size, false, 0,
                                                        impl->ep_size)
                         : impl->tp_rank == tp_rank && impl->pp_rank == pp_rank &&
                               impl->pp_size == pp_size && impl->ep_rank == ep_rank &&
                               impl->ep_size == ep_size;
  if (tp_rank < 0 ? !named || impl->tp_rank != 0 || impl->pp_rank != 0 || impl->ep_rank != 0
                  : !named)
    return fail(path + ": error: was saved by " +
                checkpoint_rank_name(impl->tp_rank, impl->pp_rank, impl->pp_size, impl->ep_rank,
                                     impl->ep_size) +
                " (pipeline size " + std::to_string(impl->pp_size) +
                (impl->ep_size > 1 ? ", expert-parallel size " + std::to_string(impl->ep_size)
                                   : std::string()) +
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
int CheckpointReader::ep_rank() const { return impl_->ep_rank; }
int CheckpointReader::ep_size() const { return impl_->ep_size; }
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

std::string CheckpointReader::dtype(const std::string &name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? "" : impl_->entries[it->second].dtype->name;
}

uint64_t CheckpointReader::bytes(const std::string &name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? 0 : impl_->entries[it->second].bytes;
}

std::string CheckpointReader::int_value(const std::string &key, int64_t lo, int64_t hi,
                                        int64_t dflt, int64_t *out) const {
  auto it = impl_->meta.values.find(key);
  if (it == impl_->meta.values.end()) {
    *out = dflt;
    return "";
  }
  if (parse_int(it->second, lo, hi, out))
    return "";
  std::string shown = it->second.size() > 40 ? it->second.substr(0, 40) + "..." : it->second;
  return impl_->path + ": error: the metadata value '" + key + "' is '" + shown +
         "', not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
         "]; the file is damaged: " + kOtherIteration;
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
