// Megatron's indices (a split's document, sample and shuffle indices; a blend's) and their cache.
//
// Facts from Megatron-LM's megatron/core/datasets (core 0.8):
//  - gpt_dataset.py: _build_document_sample_shuffle_indices,
//    _get_num_tokens_per_epoch, _get_num_epochs, the 0.80 threshold for a
//    separate final epoch, _build_document_index, _build_shuffle_index (uint32
//    below 2^32 - 2 samples, else int64), _query_document_sample_shuffle_indices.
//  - helpers.cpp / helpers.py: build_sample_idx (int32 entries unless the
//    document index or a length exceeds int32) and build_blending_indices.
//  - blended_megatron_dataset_builder.py: _get_size_per_split_per_dataset
//    (ceil(size * weight * 1.005)).
// Floating-point expressions follow Megatron's evaluation order, and this file
// is built with -ffp-contract=off so no multiply-add is fused (a fused one
// rounds differently from Megatron's Python and its -O3 x86-64 helpers).
#include "runtime/data/gpt_dataset_internal.h"

#include "runtime/base/atomic_file.h"
#include "runtime/base/byte_order.h"
#include "runtime/base/crc32c.h"
#include "runtime/data/numpy_random.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <tuple>

namespace mt::rt {

namespace gpt_detail {

namespace {

// A document index past this many entries (16 GiB) means the data is far too
// small for the samples asked; Megatron would try and run out of memory.
constexpr uint64_t kMaxDocumentIndex = uint64_t(1) << 32;

constexpr char kCacheMagic[8] = {'M', 'T', 'G', 'P', 'T', 'I', 'D', 'X'};
// Version 2 added the arrays' CRC-32C (version 1 checked only the header, so
// damage to the arrays that stayed in range went unnoticed).
constexpr uint32_t kCacheVersion = 2;
constexpr size_t kCacheFixed = 80; // header bytes before the description
constexpr size_t kChecksummed = 72;
constexpr size_t kArraysCrc = 52; // u32 CRC-32C of everything after the description

} // namespace

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

uint64_t fnv1a(const void *data, size_t n, uint64_t h) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < n; ++i)
    h = (h ^ p[i]) * kFnvPrime;
  return h;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// 1234567 -> "1,234,567".
std::string commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -static_cast<uint64_t>(v) : static_cast<uint64_t>(v));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string plural(int64_t n, const char *word) {
  return commas(n) + " " + word + (n == 1 ? "" : "s");
}

// The shortest of %.15g, %.16g, %.17g that reads back as v.
std::string fmt_double(double v) {
  char buf[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v)
      break;
  }
  return buf;
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// mkdir -p; returns "" or the reason.
std::string make_dirs(const std::string &dir) {
  std::string failed;
  int e = 0;
  if (make_directories(dir, &failed, &e))
    return "";
  if (e == ENOTDIR && failed == dir)
    return "'" + dir + "' exists and is not a folder";
  return "cannot create '" + failed + "': " + std::strerror(e);
}

// ---------------------------------------------------------------------------
// The index cache
// ---------------------------------------------------------------------------

Mapping::~Mapping() {
  if (data)
    ::munmap(const_cast<unsigned char *>(data), size);
}

namespace {

size_t pad8(size_t n) { return (n + 7) & ~size_t(7); }

std::unique_ptr<Mapping> map_whole_file(const std::string &path, std::string *why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = errno == ENOENT ? "" : std::string("cannot open: ") + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
    ::close(fd);
    *why = "not a regular non-empty file";
    return nullptr;
  }
  auto m = std::make_unique<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  void *p = ::mmap(nullptr, m->size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    *why = std::string("cannot map: ") + std::strerror(errno);
    return nullptr;
  }
  m->data = static_cast<const unsigned char *>(p);
  return m;
}

// Array byte sizes of a cache file, in file order.
std::vector<size_t> cache_arrays(const CacheShape &s) {
  if (s.kind == kKindGpt)
    return {s.count[0] * 4, s.count[1] * 2 * s.width[0], s.count[2] * s.width[1]};
  return {s.count[0] * 2, s.count[0] * 8};
}

std::string cache_header(const CacheShape &s, const std::string &description, uint32_t arrays_crc) {
  std::string h(kCacheMagic, sizeof(kCacheMagic));
  put_le<uint32_t>(h, kCacheVersion);
  put_le<uint32_t>(h, s.kind);
  put_le<uint64_t>(h, description.size());
  for (uint64_t c : s.count)
    put_le<uint64_t>(h, c);
  put_le<uint8_t>(h, s.width[0]);
  put_le<uint8_t>(h, s.width[1]);
  h.append(2, '\0');
  put_le<uint32_t>(h, arrays_crc);
  put_le<int64_t>(h, s.min_token);
  put_le<int64_t>(h, s.max_token);
  put_le<uint64_t>(h, fnv1a(description.data(), description.size(), fnv1a(h.data(), h.size())));
  h += description;
  h.append(pad8(h.size()) - h.size(), '\0');
  return h;
}

} // namespace

std::string write_cache(const std::string &path, const CacheShape &s, const std::string &description,
                        const std::vector<const void *> &arrays) {
  static const char zeros[8] = {};
  std::vector<size_t> sizes = cache_arrays(s);
  std::vector<std::string_view> pieces{std::string_view()};
  uint32_t crc = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    pieces.emplace_back(static_cast<const char *>(arrays[i]), sizes[i]);
    pieces.emplace_back(zeros, pad8(sizes[i]) - sizes[i]);
    crc = crc32c(pieces[pieces.size() - 2].data(), sizes[i], crc);
    crc = crc32c(zeros, pad8(sizes[i]) - sizes[i], crc);
  }
  const std::string header = cache_header(s, description, crc);
  pieces[0] = header;
  return write_pieces_atomically(path, pieces);
}

// Maps a cache file and checks it holds exactly what `expect` and the
// description say. On success fills the token range and the array pointers;
// otherwise returns null with *why "" (no file) or what is wrong with it.
std::unique_ptr<Mapping> load_cache(const std::string &path, const std::string &description,
                                    CacheShape *expect, std::vector<const void *> *arrays,
                                    std::string *why) {
  std::unique_ptr<Mapping> m = map_whole_file(path, why);
  if (!m)
    return nullptr;
  const unsigned char *p = m->data;
  if (m->size < kCacheFixed || std::memcmp(p, kCacheMagic, sizeof(kCacheMagic)) != 0) {
    *why = "no mt index header";
    return nullptr;
  }
  if (get_le<uint32_t>(p + 8) != kCacheVersion || get_le<uint32_t>(p + 12) != expect->kind) {
    *why = "another version or kind of index";
    return nullptr;
  }
  const uint64_t dlen = get_le<uint64_t>(p + 16);
  if (dlen != description.size() || m->size < kCacheFixed + dlen ||
      std::memcmp(p + kCacheFixed, description.data(), dlen) != 0) {
    *why = "its description differs from this dataset's";
    return nullptr;
  }
  if (fnv1a(p + kCacheFixed, dlen, fnv1a(p, kChecksummed)) != get_le<uint64_t>(p + kChecksummed)) {
    *why = "its header checksum is wrong";
    return nullptr;
  }
  for (int i = 0; i < 3; ++i)
    if (get_le<uint64_t>(p + 24 + 8 * i) != expect->count[i]) {
      *why = "its array lengths differ from what the description gives";
      return nullptr;
    }
  if (p[48] != expect->width[0] || p[49] != expect->width[1]) {
    *why = "its element widths differ from what the description gives";
    return nullptr;
  }
  size_t at = kCacheFixed + pad8(dlen);
  std::vector<size_t> sizes = cache_arrays(*expect);
  size_t total = at;
  for (size_t s : sizes)
    total += pad8(s);
  if (total != m->size) {
    *why = "it has " + commas(static_cast<int64_t>(m->size)) + " bytes, expected " +
           commas(static_cast<int64_t>(total)) + " (truncated or overwritten)";
    return nullptr;
  }
  // The arrays: a flipped bit that keeps every entry in range would still
  // change which samples train.
  if (crc32c(p + kCacheFixed + pad8(dlen), m->size - kCacheFixed - pad8(dlen)) !=
      get_le<uint32_t>(p + kArraysCrc)) {
    *why = "its arrays do not match their checksum (damaged after it was written)";
    return nullptr;
  }
  expect->min_token = get_le<int64_t>(p + 56);
  expect->max_token = get_le<int64_t>(p + 64);
  arrays->clear();
  for (size_t s : sizes) {
    arrays->push_back(p + at);
    at += pad8(s);
  }
  return m;
}

// ---------------------------------------------------------------------------
// Megatron's GPTDataset: one split of one source.
// ---------------------------------------------------------------------------

std::string GptPart::corrupt(int64_t i, const std::string &what) const {
  return "data: error: the " + std::string(data_split_name(set.which)) + " indices of " +
         src->name + " are inconsistent at sample " + std::to_string(i) + " (" + what + ")" +
         (cache_path.empty() ? std::string() : ": " + cache_path) + "; delete that file and run again";
}

// The pieces of the documents between sample index rows j and j + 1, each
// checked, then read into out.
std::string GptPart::span(int64_t j, int64_t i, int32_t *out) const {
  const int64_t want = set.seq_length + 1;
  const int64_t d0 = sample_entry(j, 0), o0 = sample_entry(j, 1);
  const int64_t d1 = sample_entry(j + 1, 0), o1 = sample_entry(j + 1, 1);
  if (d0 < 0 || d1 < d0 || d1 >= doc_count || o0 < 0 || o1 < 0)
    return corrupt(i, "sample index out of range");
  int64_t n = 0;
  for (int64_t k = d0; k <= d1; ++k) {
    const int64_t seq = doc[k];
    if (seq < beg || seq >= end)
      return corrupt(i, "document index out of range");
    const int64_t len = src->length(seq);
    const int64_t offset = k == d0 ? o0 : 0;
    const int64_t take = k < d1 ? len - offset : o1 + 1 - offset;
    if (take < 0 || offset > len || take > len - offset || take > want - n)
      return corrupt(i, "offsets out of range");
    if (out) // null: only checked
      src->read(seq, offset, take, out + n);
    n += take;
  }
  if (n != want)
    return corrupt(i, "sample shorter than seq_length + 1");
  return "";
}

// _query_document_sample_shuffle_indices: the pieces of the documents
// between two consecutive sample index rows, concatenated.
std::string GptPart::sample(int64_t i, int32_t *out) const {
  if (i < 0 || i >= size())
    return corrupt(i, "sample outside [0, " + std::to_string(size()) + ")");
  const int64_t j = shuffle_entry(i);
  if (j < 0 || j >= size())
    return corrupt(i, "shuffle index out of range");
  return span(j, i, out);
}

// Everything sample() and hash_sample() rely on, over the whole index, so
// that an index file whose checksums hold but whose entries do not (written
// by something else, or crafted) is rebuilt instead of read out of bounds.
// O(documents + samples).
std::string GptPart::check_indices() const {
  for (int64_t k = 0; k < doc_count; ++k)
    if (doc[k] < beg || doc[k] >= end)
      return "document index entry " + std::to_string(k) + " is " + std::to_string(doc[k]) +
             ", outside the split's documents [" + std::to_string(beg) + ", " +
             std::to_string(end) + ")";
  // Row j is a position in the documents laid end to end: P_j = the tokens
  // of document index entries [0, d_j), plus o_j. Sample j is tokens
  // [P_j, P_j+1], so consecutive positions lie seq_length apart, an offset
  // lies within its document (a sample may start at a document's end, as row
  // 0 does at an empty one, but not end there), and rows never go back. This
  // is what span() checks sample by sample, in one pass over both arrays.
  const std::vector<int32_t> lengths = src->all_lengths();
  int64_t k = 0, before = 0; // the tokens of entries [0, k)
  int64_t prev = 0;
  for (int64_t j = 0; j < sample_rows; ++j) {
    const int64_t d = sample_entry(j, 0), o = sample_entry(j, 1);
    bool ok = d >= k && d < doc_count;
    if (ok) {
      for (; k < d; ++k)
        before += lengths[size_t(doc[k])];
      const int64_t len = lengths[size_t(doc[d])];
      ok = o >= 0 && (j == 0 ? o <= len : o < len) &&
           (j == 0 || before + o - prev == set.seq_length);
      if (ok)
        prev = before + o;
    }
    if (!ok)
      return j == 0 ? "sample index row 0 is (" + std::to_string(d) + ", " + std::to_string(o) +
                          "), outside the document index"
                    : "sample index rows " + std::to_string(j - 1) + " and " + std::to_string(j) +
                          " do not cut " + std::to_string(set.seq_length + 1) +
                          " tokens from the documents";
  }
  for (int64_t i = 0; i < size(); ++i)
    if (shuffle_entry(i) < 0 || shuffle_entry(i) >= size())
      return "shuffle index entry " + std::to_string(i) + " is " +
             std::to_string(shuffle_entry(i)) + ", outside [0, " + std::to_string(size()) + ")";
  return "";
}

uint64_t GptPart::hash_sample(uint64_t h, int64_t i) const {
  // The indices were checked when built or loaded (check_indices).
  const int64_t j = shuffle_entry(i);
  const int64_t d0 = sample_entry(j, 0), o0 = sample_entry(j, 1);
  const int64_t d1 = sample_entry(j + 1, 0), o1 = sample_entry(j + 1, 1);
  h = order_hash_step(h, uint64_t(o0));
  h = order_hash_step(h, uint64_t(o1));
  h = order_hash_step(h, uint64_t(d1 - d0));
  for (int64_t k = d0; k <= d1; ++k)
    h = order_hash_step(h, uint64_t(int64_t(doc[k])));
  return h;
}

std::string GptPart::describe() const {
  std::string s = src->name + ": " + data_split_name(set.which);
  if (sample_rows == 0)
    return s + " split: no samples (none asked, and it has no tokens to cut)";
  s += " documents [" + commas(beg) + ", " + commas(end) + ") of " +
       commas(src->num_sequences()) + " (split '" + set.split + "'), " +
       plural(tokens_per_epoch, "token") + " an epoch, " + plural(num_epochs, "epoch");
  if (separate_final_epoch)
    s += " (the last shuffled apart)";
  s += ", " + plural(size(), "sample") + " (" + commas(requested) + " asked); indices ";
  if (from_cache)
    s += "loaded in " + fmt_seconds(seconds) + " from " + cache_path;
  else
    s += "built in " + fmt_seconds(seconds) +
         (cache_note.empty() ? ", cached in " + cache_path : ", " + cache_note);
  if (!from_cache && !replaced.empty())
    s += "; rebuilt because the index file there was unusable: " + replaced;
  return s;
}

namespace {

// Megatron's helpers.cpp build_sample_idx with drop_last_partial_sequence and
// add_extra_token_to_sequence: row k is (document index position, offset) of
// the first token of sample k; samples step by seq_length tokens, so
// consecutive samples share one token.
template <typename T>
std::vector<T> build_sample_index(const int32_t *sizes, const int32_t *doc, int64_t doc_count,
                                  int64_t seq_length, int64_t num_samples) {
  std::vector<T> idx(2 * static_cast<size_t>(num_samples + 1));
  T doc_pos = 0, offset = 0;
  idx[0] = 0;
  idx[1] = 0;
  for (int64_t row = 1; row <= num_samples; ++row) {
    int64_t remaining = seq_length + 1;
    while (remaining != 0) {
      const int64_t len = sizes[doc[doc_pos]] - static_cast<int64_t>(offset);
      remaining -= len;
      if (remaining <= 0) {
        offset += static_cast<T>(remaining + len - 1);
        remaining = 0;
      } else {
        // num_samples * seq_length + 1 <= epochs * tokens, so the last
        // document is never passed.
        if (doc_pos == doc_count - 1)
          return {};
        ++doc_pos;
        offset = 0;
      }
    }
    idx[2 * row] = doc_pos;
    idx[2 * row + 1] = offset;
  }
  return idx;
}

// _build_shuffle_index: [0, first) shuffled, then [first, total) shuffled.
template <typename T>
std::vector<T> build_shuffle_index(int64_t first, int64_t total, NumpyRandomState &rng) {
  std::vector<T> idx(static_cast<size_t>(total));
  std::iota(idx.begin(), idx.end(), T(0));
  rng.shuffle(idx.data(), static_cast<uint64_t>(first));
  if (first != total)
    rng.shuffle(idx.data() + first, static_cast<uint64_t>(total - first));
  return idx;
}

} // namespace

// Builds or loads the indices of `num_samples` samples of one split.
std::unique_ptr<GptPart> build_part(std::shared_ptr<const Source> src, const Settings &set,
                                    std::optional<std::pair<int64_t, int64_t>> range,
                                    int64_t num_samples, std::string *error) {
  const auto t0 = std::chrono::steady_clock::now();
  auto part = std::make_unique<GptPart>();
  part->src = src;
  part->set = set;
  part->requested = num_samples;
  const std::string which = data_split_name(set.which);
  const std::string fix = src->mock() ? "ask for fewer samples"
                                      : "change [data] split '" + set.split + "' or add data";
  if (!range) {
    if (num_samples == 0)
      return part;
    *error = "data: split '" + which + "' of " + src->name + " gets no share of [data] split '" +
             set.split + "' but " + commas(num_samples) + " " + which +
             " samples are needed; give it a share" +
             (set.which == DataSplit::Train ? "" : " or ask for none (eval_iters = 0)");
    return nullptr;
  }
  part->beg = range->first;
  part->end = range->second;
  const int64_t docs = part->end - part->beg;
  if (docs == 0) {
    if (num_samples == 0)
      return part;
    *error = "data: split '" + which + "' of " + src->name + " has 0 documents; " + fix;
    return nullptr;
  }

  // _get_num_tokens_per_epoch and _get_num_epochs.
  int64_t tokens = 0;
  for (int64_t s = part->beg; s < part->end; ++s)
    tokens += src->length(s);
  part->tokens_per_epoch = tokens;
  const int64_t L = set.seq_length;
  if (tokens < 2) {
    if (num_samples == 0)
      return part;
    *error = "data: split '" + which + "' of " + src->name + " has " + plural(docs, "document") +
             " but " + plural(tokens, "token") + ", too few to cut samples of " +
             commas(L + 1) + " tokens from; " + fix;
    return nullptr;
  }
  if (num_samples > (INT64_MAX - 1) / L) {
    *error = "data: " + commas(num_samples) + " samples of " + commas(L + 1) +
             " tokens overflow a 64-bit token count; ask for fewer samples";
    return nullptr;
  }
  const int64_t wanted_tokens = num_samples * L + 1;
  const int64_t epochs = std::max<int64_t>(1, (wanted_tokens + tokens - 1) / tokens);
  part->num_epochs = epochs;
  if (static_cast<unsigned __int128>(epochs) * static_cast<uint64_t>(docs) > kMaxDocumentIndex) {
    *error = "data: split '" + which + "' of " + src->name + " has " + plural(tokens, "token") +
             ", too few for " + commas(num_samples) + " samples of " + commas(L + 1) +
             " tokens: it would be repeated " + commas(epochs) +
             " times; add data, or lower train_iters or seq_length";
    return nullptr;
  }
  if (epochs > 1) {
    // The final epoch is shuffled apart when less than 80% of it is used.
    const int64_t sans_final = ((epochs - 1) * tokens - 1) / L;
    const int64_t from_final = num_samples - sans_final;
    const int64_t per_epoch = (tokens - 1) / L;
    part->separate_final_epoch = from_final < static_cast<int64_t>(0.80 * per_epoch);
  }
  const int64_t doc_count = epochs * docs;
  const int64_t samples = (epochs * tokens - 1) / L;
  const int64_t sans_final = ((epochs - 1) * tokens - 1) / L;
  part->doc_count = doc_count;
  part->sample_rows = samples + 1;
  part->sample_width = std::max(doc_count, src->max_length) <= INT32_MAX ? 4 : 8;
  part->shuffle_width = samples >= int64_t(UINT32_MAX) - 1 ? 8 : 4;

  CacheShape shape;
  shape.kind = kKindGpt;
  shape.count[0] = static_cast<uint64_t>(doc_count);
  shape.count[1] = static_cast<uint64_t>(samples + 1);
  shape.count[2] = static_cast<uint64_t>(samples);
  shape.width[0] = static_cast<uint8_t>(part->sample_width);
  shape.width[1] = static_cast<uint8_t>(part->shuffle_width);
  const std::string description =
      "mt GPTDataset indices\n" + src->identity + "split: '" + set.split + "' -> " + which + " [" +
      std::to_string(part->beg) + ", " + std::to_string(part->end) + ")\n" +
      "seq_length: " + std::to_string(L) + "\nseed: " + std::to_string(set.seed) +
      "\nnum_samples: " + std::to_string(num_samples) + "\n";

  bool cached = false;
  if (!set.cache_dir.empty()) {
    part->cache_path = set.cache_dir + "/" + hex16(fnv1a(description.data(), description.size())) +
                       "-GPTDataset-" + which + ".mtidx";
    std::vector<const void *> arrays;
    std::string why;
    part->map = load_cache(part->cache_path, description, &shape, &arrays, &why);
    if (part->map) {
      part->doc = static_cast<const int32_t *>(arrays[0]);
      part->sample_idx = arrays[1];
      part->shuffle = arrays[2];
      part->min_token = shape.min_token;
      part->max_token = shape.max_token;
      if (std::string bad = part->check_indices(); !bad.empty()) {
        why = "its indices are inconsistent: " + bad;
        part->map.reset();
        part->doc = nullptr;
        part->sample_idx = part->shuffle = nullptr;
      } else {
        part->from_cache = cached = true;
      }
    }
    if (!cached)
      part->replaced = why;
  }

  if (!cached) {
    NumpyRandomState rng(set.seed);
    // _build_document_index: every epoch's documents in one array, shuffled
    // as a whole, or all but the final epoch and then the final one apart.
    part->own_doc.resize(static_cast<size_t>(doc_count));
    for (int64_t e = 0; e < epochs; ++e)
      std::iota(part->own_doc.begin() + e * docs, part->own_doc.begin() + (e + 1) * docs,
                static_cast<int32_t>(part->beg));
    if (!part->separate_final_epoch) {
      rng.shuffle(part->own_doc.data(), static_cast<uint64_t>(doc_count));
    } else {
      rng.shuffle(part->own_doc.data(), static_cast<uint64_t>(doc_count - docs));
      rng.shuffle(part->own_doc.data() + doc_count - docs, static_cast<uint64_t>(docs));
    }
    part->doc = part->own_doc.data();

    {
      std::vector<int32_t> sizes = src->all_lengths();
      bool ok;
      if (part->sample_width == 4) {
        part->own_sample32 =
            build_sample_index<int32_t>(sizes.data(), part->doc, doc_count, L, samples);
        ok = !part->own_sample32.empty();
        part->sample_idx = part->own_sample32.data();
      } else {
        part->own_sample64 =
            build_sample_index<int64_t>(sizes.data(), part->doc, doc_count, L, samples);
        ok = !part->own_sample64.empty();
        part->sample_idx = part->own_sample64.data();
      }
      if (!ok) {
        *error = "data: internal error: the sample index of split '" + which + "' of " +
                 src->name + " ran past its documents";
        return nullptr;
      }
    }

    const int64_t first = part->separate_final_epoch ? sans_final : samples;
    if (part->shuffle_width == 4) {
      part->own_shuffle32 = build_shuffle_index<uint32_t>(first, samples, rng);
      part->shuffle = part->own_shuffle32.data();
    } else {
      part->own_shuffle64 = build_shuffle_index<int64_t>(first, samples, rng);
      part->shuffle = part->own_shuffle64.data();
    }

    std::tie(part->min_token, part->max_token) = token_range(*src, part->beg, part->end);
    shape.min_token = part->min_token;
    shape.max_token = part->max_token;

    if (!set.cache_dir.empty()) {
      std::string err = make_dirs(set.cache_dir);
      if (err.empty())
        err = write_cache(part->cache_path, shape, description,
                          {part->doc, part->sample_idx, part->shuffle});
      if (!err.empty() && !part->replaced.empty()) {
        // Never train past an index file known to be bad without saying
        // so once and for all: the next run would meet it again.
        *error = "data: the index cache " + part->cache_path + " is unusable (" + part->replaced +
                 ") and cannot be replaced (" + err + "); delete it, or make its folder writable";
        return nullptr;
      }
      if (!err.empty()) {
        part->cache_note = "not cached: " + err;
      } else {
        // Serve from the file just written: its pages can be dropped under
        // memory pressure, the vectors could not.
        std::vector<const void *> arrays;
        std::string why;
        CacheShape check = shape;
        auto m = load_cache(part->cache_path, description, &check, &arrays, &why);
        if (m) {
          part->map = std::move(m);
          part->doc = static_cast<const int32_t *>(arrays[0]);
          part->sample_idx = arrays[1];
          part->shuffle = arrays[2];
          part->own_doc = {};
          part->own_sample32 = {};
          part->own_sample64 = {};
          part->own_shuffle32 = {};
          part->own_shuffle64 = {};
        } else {
          part->cache_note = "cached, but reading it back failed (" + why + ")";
        }
      }
    } else {
      part->cache_note = "not cached (mock data is cached only with a cache_dir)";
    }
  }
  part->seconds = seconds_since(t0);

  if (src->vocab > 0 && part->min_token <= part->max_token &&
      (part->min_token < 0 || part->max_token >= src->vocab)) {
    *error = bad_token_error(*src, part->beg, part->end);
    return nullptr;
  }
  return part;
}

} // namespace gpt_detail

// ---------------------------------------------------------------------------
// A blend's indices (gpt_dataset.h's public pieces)
// ---------------------------------------------------------------------------

void megatron_blending_indices(const std::vector<double> &weights, int64_t size,
                               int16_t *dataset_index, int64_t *dataset_sample_index) {
  const size_t n = weights.size();
  std::vector<int64_t> current(n, 0);
  for (int64_t s = 0; s < size; ++s) {
    const double at = std::max(static_cast<double>(s), 1.0);
    size_t best = 0;
    double best_error = weights[0] * at - static_cast<double>(current[0]);
    for (size_t d = 1; d < n; ++d) {
      double error = weights[d] * at - static_cast<double>(current[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_index[s] = static_cast<int16_t>(best);
    dataset_sample_index[s] = current[best];
    ++current[best];
  }
}

std::vector<int64_t> megatron_blend_requests(const std::vector<double> &normalized_weights,
                                             int64_t num_samples) {
  std::vector<int64_t> out;
  for (double w : normalized_weights)
    out.push_back(static_cast<int64_t>(std::ceil(static_cast<double>(num_samples) * w * 1.005)));
  return out;
}

} // namespace mt::rt
