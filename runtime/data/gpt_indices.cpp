// GPT training samples as Megatron-LM builds them (see gpt_dataset.h).
//
// Facts from Megatron-LM's megatron/core/datasets (core 0.8):
//  - blended_megatron_dataset_config.py: parse_and_normalize_split (numbers
//    matched by [.0-9]+, padded to three, normalize()),
//    convert_split_vector_to_split_matrix; no blend means mock data with the
//    split forced to "1,1,1".
//  - blended_megatron_dataset_builder.py: _build_megatron_dataset_splits
//    (beg = int(round(bookend * num_elements)), elements are sequences for
//    GPT), _get_size_per_split_per_dataset (ceil(size * weight * 1.005)), a
//    weighted blend's size is the sum of those requests; a single prefix
//    without weight is no blend.
//  - gpt_dataset.py: _build_document_sample_shuffle_indices,
//    _get_num_tokens_per_epoch, _get_num_epochs, the 0.80 threshold for a
//    separate final epoch, _build_document_index, _build_shuffle_index (uint32
//    below 2^32 - 2 samples, else int64), _query_document_sample_shuffle_indices,
//    MockGPTLowLevelDataset (100000 lengths from default_rng(0).integers(1,
//    4096, dtype=int32); tokens 1, 2, ... modulo the vocabulary, then EOD).
//  - helpers.cpp / helpers.py: build_sample_idx (int32 entries unless the
//    document index or a length exceeds int32) and build_blending_indices.
//  - blended_dataset.py: the weights are normalized once more before blending.
//  - the default cache folder is os.path.join(path_prefix, "cache",
//    "GPTDataset_indices"); mock data has none.
// Floating-point expressions follow Megatron's evaluation order, and this file
// is built with -ffp-contract=off so no multiply-add is fused (a fused one
// rounds differently from Megatron's Python and its -O3 x86-64 helpers).
#include "runtime/data/gpt_dataset.h"

#include "runtime/base/atomic_file.h"
#include "runtime/base/byte_order.h"
#include "runtime/data/indexed_dataset.h"
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
#include <limits>
#include <numeric>
#include <thread>

namespace mt::rt {

namespace {

// MockGPTLowLevelDataset's constants.
constexpr int64_t kMockSequences = 100000;
constexpr int32_t kMockMaxLength = 4096;
constexpr uint64_t kMockSeed = 0;

// A document index past this many entries (16 GiB) means the data is far too
// small for the samples asked; Megatron would try and run out of memory.
constexpr uint64_t kMaxDocumentIndex = uint64_t(1) << 32;

constexpr char kCacheMagic[8] = {'M', 'T', 'G', 'P', 'T', 'I', 'D', 'X'};
constexpr uint32_t kCacheVersion = 1;
constexpr uint32_t kKindGpt = 1, kKindBlend = 2;
constexpr size_t kCacheFixed = 80; // header bytes before the description
constexpr size_t kChecksummed = 72;

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;

uint64_t fnv1a(const void *data, size_t n, uint64_t h = kFnvOffset) {
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

size_t pad8(size_t n) { return (n + 7) & ~size_t(7); }

std::string dir_of(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
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

// A whole file mapped read-only.
struct Mapping {
  const unsigned char *data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data)
      ::munmap(const_cast<unsigned char *>(data), size);
  }
};

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


// What one cache file holds besides its arrays.
struct CacheShape {
  uint32_t kind = 0;
  uint64_t count[3] = {0, 0, 0};
  uint8_t width[2] = {0, 0};
  int64_t min_token = 0, max_token = -1;
};

// Array byte sizes of a cache file, in file order.
std::vector<size_t> cache_arrays(const CacheShape &s) {
  if (s.kind == kKindGpt)
    return {s.count[0] * 4, s.count[1] * 2 * s.width[0], s.count[2] * s.width[1]};
  return {s.count[0] * 2, s.count[0] * 8};
}

std::string cache_header(const CacheShape &s, const std::string &description) {
  std::string h(kCacheMagic, sizeof(kCacheMagic));
  put_le<uint32_t>(h, kCacheVersion);
  put_le<uint32_t>(h, s.kind);
  put_le<uint64_t>(h, description.size());
  for (uint64_t c : s.count)
    put_le<uint64_t>(h, c);
  put_le<uint8_t>(h, s.width[0]);
  put_le<uint8_t>(h, s.width[1]);
  h.append(6, '\0');
  put_le<int64_t>(h, s.min_token);
  put_le<int64_t>(h, s.max_token);
  put_le<uint64_t>(h, fnv1a(description.data(), description.size(), fnv1a(h.data(), h.size())));
  h += description;
  h.append(pad8(h.size()) - h.size(), '\0');
  return h;
}

std::string write_cache(const std::string &path, const CacheShape &s, const std::string &description,
                        const std::vector<const void *> &arrays) {
  static const char zeros[8] = {};
  std::string header = cache_header(s, description);
  std::vector<size_t> sizes = cache_arrays(s);
  std::vector<std::string_view> pieces{header};
  for (size_t i = 0; i < sizes.size(); ++i) {
    pieces.emplace_back(static_cast<const char *>(arrays[i]), sizes[i]);
    pieces.emplace_back(zeros, pad8(sizes[i]) - sizes[i]);
  }
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
// Token sources: an indexed dataset, or Megatron's mock data.
// ---------------------------------------------------------------------------

struct Source {
  std::string name;                     // the prefix, or "mock data"
  std::string identity;                 // description lines that pin its content's shape
  std::unique_ptr<IndexedDataset> data; // null for mock data
  std::vector<int32_t> mock_lengths;
  int64_t vocab = 0;
  int32_t eod = 0;
  int64_t max_length = 0; // of any sequence

  bool mock() const { return !data; }
  int64_t num_sequences() const {
    return data ? static_cast<int64_t>(data->num_sequences()) : kMockSequences;
  }
  int64_t length(int64_t s) const {
    return data ? data->sequence_length(static_cast<uint64_t>(s)) : mock_lengths[s];
  }
  // Every sequence length as one array (Megatron's sizes): a copy for an
  // indexed dataset, whose lengths sit unaligned in the mmapped .idx.
  std::vector<int32_t> all_lengths() const {
    if (!data)
      return mock_lengths;
    std::vector<int32_t> out(static_cast<size_t>(num_sequences()));
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = data->sequence_length(i);
    return out;
  }
  void read(int64_t s, int64_t offset, int64_t n, int32_t *out) const {
    if (data) {
      data->read(static_cast<uint64_t>(s), static_cast<uint64_t>(offset), static_cast<uint64_t>(n),
                 out);
      return;
    }
    // MockGPTLowLevelDataset: position p < length - 1 holds (p + 1) % vocab,
    // the last one EOD.
    const int64_t len = mock_lengths[s];
    for (int64_t i = 0; i < n; ++i) {
      int64_t p = offset + i;
      out[i] = p < len - 1 ? static_cast<int32_t>((p + 1) % vocab) : eod;
    }
  }
};

std::string canonical_prefix(const std::string &prefix) {
  char *real = ::realpath((prefix + ".idx").c_str(), nullptr);
  if (!real)
    return prefix;
  std::string r(real);
  std::free(real);
  return r.substr(0, r.size() - 4);
}

uint64_t file_bytes(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::shared_ptr<Source> open_source(const std::string &prefix, int64_t vocab, std::string *error) {
  auto src = std::make_shared<Source>();
  src->name = prefix;
  src->vocab = vocab;
  src->data = IndexedDataset::open(prefix, error);
  if (!src->data)
    return nullptr;
  uint64_t h = kFnvOffset;
  for (uint64_t i = 0; i < src->data->num_sequences(); ++i) {
    const int32_t len = src->data->sequence_length(i);
    h = (h ^ static_cast<uint32_t>(len)) * kFnvPrime;
    src->max_length = std::max<int64_t>(src->max_length, len);
  }
  src->identity = "dataset: " + canonical_prefix(prefix) + "\n" +
                  "dataset shape: " + std::to_string(src->data->num_sequences()) + " sequences, " +
                  std::to_string(src->data->num_tokens()) + " tokens, .idx " +
                  std::to_string(file_bytes(prefix + ".idx")) + " bytes, .bin " +
                  std::to_string(file_bytes(prefix + ".bin")) + " bytes, lengths " + hex16(h) +
                  "\n";
  return src;
}

std::shared_ptr<Source> mock_source(int64_t vocab) {
  auto src = std::make_shared<Source>();
  src->name = "mock data";
  src->vocab = vocab;
  src->eod = static_cast<int32_t>(vocab - 1);
  NumpyDefaultRng rng(kMockSeed);
  src->mock_lengths.resize(kMockSequences);
  for (int32_t &len : src->mock_lengths) {
    len = rng.integers_int32(1, kMockMaxLength);
    src->max_length = std::max<int64_t>(src->max_length, len);
  }
  src->identity = "dataset: Megatron's MockGPTLowLevelDataset (" + std::to_string(kMockSequences) +
                  " sequences, lengths from default_rng(" + std::to_string(kMockSeed) +
                  "), EOD " + std::to_string(src->eod) + ", vocab " + std::to_string(vocab) + ")\n";
  return src;
}

// Min and max token id of sequences [beg, end), read by a few threads.
std::pair<int64_t, int64_t> token_range(const Source &src, int64_t beg, int64_t end) {
  if (src.mock()) {
    // 1 .. max length - 1 modulo the vocabulary, and EOD.
    int64_t hi = std::min<int64_t>(kMockMaxLength - 1, src.vocab - 1);
    return {0, std::max<int64_t>(hi, src.eod)};
  }
  const int64_t n = end - beg;
  unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  if (n < 1024)
    threads = 1;
  std::vector<std::pair<int64_t, int64_t>> part(threads, {INT64_MAX, INT64_MIN});
  auto scan = [&](unsigned t) {
    constexpr int64_t kChunk = 1 << 16;
    std::vector<int32_t> buf(kChunk);
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t s = beg + n * t / threads; s < beg + n * (t + 1) / threads; ++s) {
      int64_t len = src.length(s);
      for (int64_t at = 0; at < len; at += kChunk) {
        int64_t k = std::min(kChunk, len - at);
        src.read(s, at, k, buf.data());
        auto [mn, mx] = std::minmax_element(buf.begin(), buf.begin() + k);
        lo = std::min<int64_t>(lo, *mn);
        hi = std::max<int64_t>(hi, *mx);
      }
    }
    part[t] = {lo, hi};
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t)
    pool.emplace_back(scan, t);
  scan(0);
  for (std::thread &th : pool)
    th.join();
  std::pair<int64_t, int64_t> r{INT64_MAX, INT64_MIN};
  for (auto [lo, hi] : part) {
    r.first = std::min(r.first, lo);
    r.second = std::max(r.second, hi);
  }
  if (r.first > r.second)
    r = {0, -1}; // no tokens
  return r;
}

// The error for the first token of sequences [beg, end) outside [0, vocab).
std::string bad_token_error(const Source &src, int64_t beg, int64_t end) {
  std::vector<int32_t> buf;
  for (int64_t s = beg; s < end; ++s) {
    int64_t len = src.length(s);
    buf.resize(static_cast<size_t>(len));
    src.read(s, 0, len, buf.data());
    for (int64_t i = 0; i < len; ++i) {
      if (buf[i] >= 0 && buf[i] < src.vocab)
        continue;
      int64_t doc = int64_t(src.data->document_of_sequence(uint64_t(s)));
      return "data: " + src.name + " has token id " + std::to_string(buf[i]) + " (document " +
             std::to_string(doc) + ", sequence " + std::to_string(s) + ", position " +
             std::to_string(i) + "), outside the vocabulary [0, " + std::to_string(src.vocab) +
             "); re-run mt-preprocess with the model's tokenizer or fix [model] vocab_size";
    }
  }
  return "data: " + src.name + " has a token id outside the vocabulary [0, " +
         std::to_string(src.vocab) + "); re-run mt-preprocess with the model's tokenizer";
}

// ---------------------------------------------------------------------------
// Megatron's GPTDataset: one split of one source.
// ---------------------------------------------------------------------------

struct Settings {
  int64_t seq_length = 0;
  uint32_t seed = 0;
  std::string split; // the split string in force
  std::string cache_dir; // "" = no cache
  DataSplit which = DataSplit::Train;
};

struct GptPart {
  std::shared_ptr<const Source> src;
  Settings set;
  int64_t beg = 0, end = 0; // sequence range of the split
  int64_t requested = 0;
  int64_t tokens_per_epoch = 0, num_epochs = 0;
  bool separate_final_epoch = false;
  int64_t min_token = 0, max_token = -1;

  // The three indices: views into `map`, or into the vectors when not cached.
  const int32_t *doc = nullptr;
  int64_t doc_count = 0;
  const void *sample_idx = nullptr;
  int sample_width = 4;
  int64_t sample_rows = 0; // samples + 1
  const void *shuffle = nullptr;
  int shuffle_width = 4;
  std::unique_ptr<Mapping> map;
  std::vector<int32_t> own_doc, own_sample32;
  std::vector<int64_t> own_sample64, own_shuffle64;
  std::vector<uint32_t> own_shuffle32;

  std::string cache_path, cache_note;
  bool from_cache = false;
  double seconds = 0;

  int64_t size() const { return sample_rows > 0 ? sample_rows - 1 : 0; }

  int64_t sample_entry(int64_t row, int col) const {
    return sample_width == 4 ? static_cast<const int32_t *>(sample_idx)[2 * row + col]
                             : static_cast<const int64_t *>(sample_idx)[2 * row + col];
  }
  int64_t shuffle_entry(int64_t i) const {
    return shuffle_width == 4 ? static_cast<const uint32_t *>(shuffle)[i]
                              : static_cast<const int64_t *>(shuffle)[i];
  }

  [[noreturn]] void corrupt(int64_t i, const char *what) const {
    std::fprintf(stderr,
                 "data: error: the %s indices of %s are inconsistent at sample %lld (%s)%s%s; "
                 "delete that file and run again\n",
                 data_split_name(set.which), src->name.c_str(), static_cast<long long>(i), what,
                 cache_path.empty() ? "" : ": ", cache_path.c_str());
    std::abort();
  }

  // _query_document_sample_shuffle_indices: the pieces of the documents
  // between two consecutive sample index rows, concatenated.
  void sample(int64_t i, int32_t *out) const {
    const int64_t want = set.seq_length + 1;
    const int64_t j = shuffle_entry(i);
    if (j < 0 || j >= size())
      corrupt(i, "shuffle index out of range");
    const int64_t d0 = sample_entry(j, 0), o0 = sample_entry(j, 1);
    const int64_t d1 = sample_entry(j + 1, 0), o1 = sample_entry(j + 1, 1);
    if (d0 < 0 || d1 < d0 || d1 >= doc_count || o0 < 0 || o1 < 0)
      corrupt(i, "sample index out of range");
    int64_t n = 0;
    for (int64_t k = d0; k <= d1; ++k) {
      const int64_t seq = doc[k];
      if (seq < beg || seq >= end)
        corrupt(i, "document index out of range");
      const int64_t len = src->length(seq);
      const int64_t offset = k == d0 ? o0 : 0;
      const int64_t take = k < d1 ? len - offset : o1 + 1 - offset;
      if (take < 0 || offset + take > len || n + take > want)
        corrupt(i, "offsets out of range");
      src->read(seq, offset, take, out + n);
      n += take;
    }
    if (n != want)
      corrupt(i, "sample shorter than seq_length + 1");
  }

  std::string describe() const {
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
    return s;
  }
};

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
      part->from_cache = cached = true;
    } else if (!why.empty()) {
      part->cache_note = "rebuilt (the cached file was unusable: " + why + ")";
    }
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

// Megatron's BlendedDataset over several GPTDatasets.
struct Blend {
  std::vector<std::unique_ptr<GptPart>> parts;
  std::vector<double> given, weights; // as given; as blended
  std::vector<int64_t> requests;
  int64_t size = 0;
  const int16_t *dataset_index = nullptr;
  const int64_t *dataset_sample_index = nullptr;
  std::unique_ptr<Mapping> map;
  std::vector<int16_t> own_index;
  std::vector<int64_t> own_sample_index;
  std::string cache_path, cache_note;
  bool from_cache = false;
  double seconds = 0;
};

} // namespace

// ---------------------------------------------------------------------------
// Public pieces
// ---------------------------------------------------------------------------

const char *data_split_name(DataSplit split) {
  switch (split) {
  case DataSplit::Train: return "train";
  case DataSplit::Valid: return "valid";
  case DataSplit::Test: return "test";
  }
  return "unknown";
}

int64_t split_documents(const GptDataConfig &config, DataSplit split, std::string *error) {
  std::array<double, 3> weights;
  // As build(): mock data takes an even split.
  if (std::string e = parse_megatron_split(config.mock ? "1,1,1" : config.split, &weights);
      !e.empty()) {
    *error = e;
    return -1;
  }
  int64_t docs = 0;
  auto add = [&](int64_t sequences) {
    if (auto r = megatron_split_ranges(weights, sequences)[static_cast<int>(split)])
      docs += r->second - r->first;
  };
  if (config.mock) {
    add(kMockSequences);
    return docs;
  }
  for (const auto &part : config.blend) {
    auto data = IndexedDataset::open(part.second, error);
    if (!data)
      return -1;
    add(static_cast<int64_t>(data->num_sequences()));
  }
  return docs;
}

std::array<int64_t, 3> megatron_num_samples(int64_t train_iters, int64_t global_batch,
                                            int64_t eval_interval, int64_t eval_iters) {
  const int64_t evals = eval_interval > 0 ? train_iters / eval_interval + 1 : 1;
  return {train_iters * global_batch, evals * eval_iters * global_batch,
          eval_iters * global_batch};
}

std::string parse_megatron_split(const std::string &split, std::array<double, 3> *weights) {
  std::vector<double> values;
  auto is_num = [](char c) { return (c >= '0' && c <= '9') || c == '.'; };
  for (size_t i = 0; i < split.size();) {
    if (!is_num(split[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < split.size() && is_num(split[j]))
      ++j;
    const std::string word = split.substr(i, j - i);
    char *end = nullptr;
    double v = std::strtod(word.c_str(), &end);
    if (end != word.c_str() + word.size() || word.find_first_of("0123456789") == std::string::npos)
      return "data: [data] split '" + split + "': '" + word +
             "' is not a number; write proportions like '969,30,1'";
    values.push_back(v);
    i = j;
  }
  if (values.empty())
    return "data: [data] split '" + split +
           "' has no numbers; write train, valid and test proportions like '969,30,1'";
  if (values.size() > 3)
    return "data: [data] split '" + split + "' has " + std::to_string(values.size()) +
           " numbers; give at most three (train, valid, test) like '969,30,1'";
  values.resize(3, 0.0);
  if (numpy_sum(values.data(), 3) <= 0)
    return "data: [data] split '" + split +
           "' gives every split 0; give the train split a share, like '969,30,1'";
  std::vector<double> w = numpy_normalize(values);
  *weights = {w[0], w[1], w[2]};
  return "";
}

std::array<std::optional<std::pair<int64_t, int64_t>>, 3>
megatron_split_ranges(const std::array<double, 3> &w, int64_t num_elements) {
  // Bookends [0, w0, w0 + w1, (w0 + w1) + w2], as Python sums them.
  const double e[4] = {0.0, w[0], w[0] + w[1], (w[0] + w[1]) + w[2]};
  const double n = static_cast<double>(num_elements);
  std::array<std::optional<std::pair<int64_t, int64_t>>, 3> out;
  for (int i = 0; i < 3; ++i) {
    if (e[i + 1] <= e[i])
      continue;
    // Python's round(): half to even, which nearbyint does in the default mode.
    out[i] = std::make_pair(static_cast<int64_t>(std::nearbyint(e[i] * n)),
                            static_cast<int64_t>(std::nearbyint(e[i + 1] * n)));
  }
  return out;
}

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

// ---------------------------------------------------------------------------
// GptDataset
// ---------------------------------------------------------------------------

struct GptDataset::Impl {
  DataSplit which = DataSplit::Train;
  int64_t seq_length = 0, requested = 0;
  std::unique_ptr<GptPart> single;
  std::unique_ptr<Blend> blend;
};

GptDataset::GptDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GptDataset::~GptDataset() = default;

std::unique_ptr<GptDataset> GptDataset::build(const GptDataConfig &config, DataSplit which,
                                              int64_t num_samples, std::string *error) {
  if (config.seq_length < 2 || config.seq_length >= INT32_MAX) {
    *error = "data: seq_length " + std::to_string(config.seq_length) +
             " is out of range; samples need at least 2 tokens (Megatron asserts "
             "seq_length > 1)";
    return nullptr;
  }
  if (num_samples < 0) {
    *error = "data: " + std::to_string(num_samples) + " samples asked; ask for 0 or more";
    return nullptr;
  }
  if (config.seed > UINT32_MAX) {
    *error = "data: seed " + std::to_string(config.seed) +
             " does not fit numpy's RandomState (0 .. 4294967295), which Megatron seeds with "
             "it; use a smaller [training] seed";
    return nullptr;
  }
  if (config.vocab_size < 0 || config.vocab_size > INT32_MAX) {
    *error = "data: vocab_size " + std::to_string(config.vocab_size) + " is out of range";
    return nullptr;
  }
  if (config.mock && !config.blend.empty()) {
    *error = "data: both mock data and a data path are set; give [data] mock_data = true or "
             "data_path, not both";
    return nullptr;
  }
  if (!config.mock && config.blend.empty()) {
    *error = "data: no data: set [data] data_path to a dataset prefix, or mock_data = true";
    return nullptr;
  }
  if (config.mock && config.vocab_size < 1) {
    *error = "data: mock data needs the vocabulary size (its end-of-document id is "
             "vocab_size - 1); set it";
    return nullptr;
  }

  Settings set;
  set.seq_length = config.seq_length;
  set.seed = static_cast<uint32_t>(config.seed);
  set.which = which;
  // Megatron replaces the split of mock data by an even one.
  set.split = config.mock ? "1,1,1" : config.split;
  std::array<double, 3> split_weights;
  std::string err = parse_megatron_split(set.split, &split_weights);
  if (!err.empty()) {
    *error = err;
    return nullptr;
  }
  const int w = static_cast<int>(which);

  auto impl = std::make_unique<Impl>();
  impl->which = which;
  impl->seq_length = config.seq_length;
  impl->requested = num_samples;

  if (config.mock || config.blend.size() == 1) {
    std::shared_ptr<Source> src = config.mock
                                      ? mock_source(config.vocab_size)
                                      : open_source(config.blend[0].second, config.vocab_size, error);
    if (!src)
      return nullptr;
    set.cache_dir = config.cache_dir;
    if (set.cache_dir.empty() && !config.mock)
      set.cache_dir = config.blend[0].second + "/cache/GPTDataset_indices";
    auto ranges = megatron_split_ranges(split_weights, src->num_sequences());
    impl->single = build_part(src, set, ranges[w], num_samples, error);
    if (!impl->single)
      return nullptr;
    return std::unique_ptr<GptDataset>(new GptDataset(std::move(impl)));
  }

  // A weighted blend (core 0.8's BlendedMegatronDatasetBuilder).
  const auto t0 = std::chrono::steady_clock::now();
  auto blend = std::make_unique<Blend>();
  for (const auto &[weight, prefix] : config.blend) {
    if (!(weight >= 0) || !std::isfinite(weight)) {
      *error = "data: blend weight " + fmt_double(weight) + " of " + prefix +
               " is not a non-negative number; fix [data] data_path";
      return nullptr;
    }
    blend->given.push_back(weight);
  }
  if (numpy_sum(blend->given.data(), blend->given.size()) <= 0) {
    *error = "data: the blend weights of [data] data_path add up to 0; give a dataset a weight";
    return nullptr;
  }
  if (config.blend.size() >= 32767) {
    *error = "data: a blend of " + commas(static_cast<int64_t>(config.blend.size())) +
             " datasets; Megatron's blend takes fewer than 32767";
    return nullptr;
  }
  const std::vector<double> normalized = numpy_normalize(blend->given);
  blend->requests = megatron_blend_requests(normalized, num_samples);
  for (size_t d = 0; d < config.blend.size(); ++d) {
    const std::string &prefix = config.blend[d].second;
    std::shared_ptr<Source> src = open_source(prefix, config.vocab_size, error);
    if (!src)
      return nullptr;
    Settings part_set = set;
    part_set.cache_dir =
        config.cache_dir.empty() ? prefix + "/cache/GPTDataset_indices" : config.cache_dir;
    auto ranges = megatron_split_ranges(split_weights, src->num_sequences());
    auto part = build_part(src, part_set, ranges[w], blend->requests[d], error);
    if (!part)
      return nullptr;
    blend->parts.push_back(std::move(part));
  }
  blend->size = std::accumulate(blend->requests.begin(), blend->requests.end(), int64_t(0));
  // BlendedDataset normalizes the weights once more.
  blend->weights = numpy_normalize(normalized);

  std::string description = "mt BlendedDataset indices\nweights:";
  for (double x : blend->weights)
    description += " " + fmt_double(x);
  description += "\nsize: " + std::to_string(blend->size) + "\n";
  for (const auto &part : blend->parts)
    description += "part: " + part->src->name + " " + std::to_string(part->size()) + "\n";

  CacheShape shape;
  shape.kind = kKindBlend;
  shape.count[0] = static_cast<uint64_t>(blend->size);
  bool cached = false;
  if (!config.cache_dir.empty()) {
    blend->cache_path = config.cache_dir + "/" +
                        hex16(fnv1a(description.data(), description.size())) +
                        "-BlendedDataset-" + data_split_name(which) + ".mtidx";
    std::vector<const void *> arrays;
    std::string why;
    blend->map = load_cache(blend->cache_path, description, &shape, &arrays, &why);
    if (blend->map) {
      blend->dataset_index = static_cast<const int16_t *>(arrays[0]);
      blend->dataset_sample_index = static_cast<const int64_t *>(arrays[1]);
      blend->from_cache = cached = true;
    } else if (!why.empty()) {
      blend->cache_note = "rebuilt (the cached file was unusable: " + why + ")";
    }
  }
  if (!cached) {
    blend->own_index.resize(static_cast<size_t>(blend->size));
    blend->own_sample_index.resize(static_cast<size_t>(blend->size));
    megatron_blending_indices(blend->weights, blend->size, blend->own_index.data(),
                              blend->own_sample_index.data());
    blend->dataset_index = blend->own_index.data();
    blend->dataset_sample_index = blend->own_sample_index.data();
    if (!config.cache_dir.empty()) {
      std::string werr = make_dirs(config.cache_dir);
      if (werr.empty())
        werr = write_cache(blend->cache_path, shape, description,
                           {blend->dataset_index, blend->dataset_sample_index});
      if (!werr.empty())
        blend->cache_note = "not cached: " + werr;
    } else {
      blend->cache_note = "not cached (blends are cached only with a cache_dir)";
    }
  }
  // The builder's check: the blend must not draw past any dataset's end.
  std::vector<int64_t> needed(blend->parts.size(), 0);
  for (int64_t s = 0; s < blend->size; ++s) {
    const int16_t d = blend->dataset_index[s];
    if (d < 0 || static_cast<size_t>(d) >= blend->parts.size()) {
      *error = "data: the blend index " + blend->cache_path + " is corrupt; delete it";
      return nullptr;
    }
    needed[d] = std::max(needed[d], blend->dataset_sample_index[s] + 1);
  }
  for (size_t d = 0; d < blend->parts.size(); ++d)
    if (needed[d] > blend->parts[d]->size()) {
      *error = "data: the blend needs " + commas(needed[d]) + " " + data_split_name(which) +
               " samples of " + blend->parts[d]->src->name + " but it has " +
               commas(blend->parts[d]->size()) + "; " +
               (blend->parts[d]->size() == 0 ? "give that split a share of [data] split '" +
                                                   set.split + "' or change the weights"
                                             : "change the blend weights");
      return nullptr;
    }
  blend->seconds = seconds_since(t0);
  impl->blend = std::move(blend);
  return std::unique_ptr<GptDataset>(new GptDataset(std::move(impl)));
}

int64_t GptDataset::size() const {
  return impl_->single ? impl_->single->size() : impl_->blend->size;
}

int64_t GptDataset::seq_length() const { return impl_->seq_length; }

void GptDataset::sample(int64_t i, int32_t *tokens) const {
  if (i < 0 || i >= size()) {
    std::fprintf(stderr, "data: internal error: sample %lld of a %s split of %lld samples\n",
                 static_cast<long long>(i), data_split_name(impl_->which),
                 static_cast<long long>(size()));
    std::abort();
  }
  if (impl_->single) {
    impl_->single->sample(i, tokens);
    return;
  }
  const Blend &b = *impl_->blend;
  const int16_t d = b.dataset_index[i];
  const int64_t j = b.dataset_sample_index[i];
  if (d < 0 || static_cast<size_t>(d) >= b.parts.size() || j < 0 || j >= b.parts[d]->size()) {
    std::fprintf(stderr,
                 "data: error: the blend index %s is inconsistent at sample %lld; delete it and "
                 "run again\n",
                 b.cache_path.c_str(), static_cast<long long>(i));
    std::abort();
  }
  b.parts[d]->sample(j, tokens);
}

std::string GptDataset::describe() const {
  const Impl &m = *impl_;
  if (m.single)
    return m.single->describe();
  const Blend &b = *m.blend;
  std::string s = "blend of " + std::to_string(b.parts.size()) + " datasets, " +
                  data_split_name(m.which) + " split: " + plural(b.size, "sample") + " (" +
                  commas(m.requested) + " asked); blend indices ";
  if (b.from_cache)
    s += "loaded from " + b.cache_path;
  else
    s += "built in " + fmt_seconds(b.seconds) +
         (b.cache_note.empty() ? ", cached in " + b.cache_path : ", " + b.cache_note);
  for (size_t d = 0; d < b.parts.size(); ++d)
    s += "\n  weight " + fmt_double(b.given[d]) + ", " + commas(b.requests[d]) +
         " samples asked: " + b.parts[d]->describe();
  return s;
}

bool GptDataset::loaded_from_cache() const {
  if (impl_->single)
    return impl_->single->from_cache;
  bool all = impl_->blend->from_cache;
  for (const auto &part : impl_->blend->parts)
    all = all && part->from_cache;
  return all;
}

} // namespace mt::rt
