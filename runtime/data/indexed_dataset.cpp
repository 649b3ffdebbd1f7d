// Megatron indexed dataset (.bin/.idx): streaming writer and validating mmap
// reader (see indexed_dataset.h).
//
// Format facts follow Megatron-LM's megatron/core/datasets/indexed_dataset.py
// (_IndexWriter, _IndexReader, IndexedDatasetBuilder, DType): the builder
// starts document_indices at [0] and appends len(sequence_lengths) once per
// document, so a document without tokens repeats the previous entry and an
// empty dataset has S = 0, D = 1, document_indices = [0] and an empty .bin;
// sequence pointers are the running sum of length * itemsize from 0.
#include "runtime/data/indexed_dataset.h"

#include "runtime/base/atomic_file.h"
#include "runtime/base/byte_order.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

namespace mt::rt {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
// Magic of the legacy 'lazy'/'cached' format Megatron once wrote (8 bytes).
constexpr char kLegacyMagic[8] = {'T', 'N', 'T', 'I', 'D', 'X', '\0', '\0'};
// magic, <Q version, <B dtype code, <Q sequence count, <Q document count.
constexpr size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;
// Streamed .bin writes go through a buffer of this many bytes.
constexpr size_t kWriteBuffer = 1 << 20;

std::string os_error() { return std::strerror(errno); }

std::string dir_of(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void fsync_dir(const std::string &path) {
  int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

bool known_dtype(uint8_t code) { return code >= 1 && code <= 8; }

// The range of ids a dtype stores exactly, as {lo, hi}.
std::pair<int64_t, int64_t> dtype_range(TokenDtype d) {
  switch (d) {
  case TokenDtype::UInt8: return {0, 255};
  case TokenDtype::Int8: return {-128, 127};
  case TokenDtype::Int16: return {-32768, 32767};
  case TokenDtype::UInt16: return {0, 65535};
  // float32 holds every integer up to 2^24 exactly, no further.
  case TokenDtype::Float32: return {-(int64_t(1) << 24), int64_t(1) << 24};
  default: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  }
}

template <typename T> void append_as(std::string &buf, const int32_t *t, size_t n) {
  size_t at = buf.size();
  buf.resize(at + n * sizeof(T));
  char *p = &buf[at];
  for (size_t i = 0; i < n; ++i) {
    T v = static_cast<T>(t[i]);
    std::memcpy(p + i * sizeof(T), &v, sizeof(T));
  }
}

template <typename T> void widen(const unsigned char *src, uint64_t n, int32_t *out) {
  for (uint64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    out[i] = static_cast<int32_t>(v);
  }
}


std::string u64s(uint64_t v) { return std::to_string(v); }

std::string u128s(unsigned __int128 v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v);
  return s;
}

} // namespace

size_t dtype_size(TokenDtype d) {
  switch (d) {
  case TokenDtype::UInt8:
  case TokenDtype::Int8: return 1;
  case TokenDtype::Int16:
  case TokenDtype::UInt16: return 2;
  case TokenDtype::Int32:
  case TokenDtype::Float32: return 4;
  case TokenDtype::Int64:
  case TokenDtype::Float64: return 8;
  }
  return 0;
}

const char *dtype_name(TokenDtype d) {
  switch (d) {
  case TokenDtype::UInt8: return "uint8";
  case TokenDtype::Int8: return "int8";
  case TokenDtype::Int16: return "int16";
  case TokenDtype::Int32: return "int32";
  case TokenDtype::Int64: return "int64";
  case TokenDtype::Float64: return "float64";
  case TokenDtype::Float32: return "float32";
  case TokenDtype::UInt16: return "uint16";
  }
  return "unknown";
}

TokenDtype dtype_for_vocab_size(size_t vocab_size) {
  // DType.optimal_dtype: 65500, not 65536, is Megatron's threshold.
  return vocab_size < 65500 ? TokenDtype::UInt16 : TokenDtype::Int32;
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

struct IndexedDatasetWriter::Impl {
  std::string prefix, bin_path, idx_path, bin_tmp;
  TokenDtype dtype;
  int fd = -1;
  std::string buffer; // tokens not yet written to bin_tmp
  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> document_indices{0};
  uint64_t tokens = 0;
  std::string failed; // a write error sticks: the .bin is then unusable
  bool finished = false;

  std::string flush() {
    if (!write_all(fd, buffer.data(), buffer.size()))
      return fail("cannot write '" + bin_tmp + "': " + os_error() + "; check free disk space");
    buffer.clear();
    return "";
  }
  std::string fail(const std::string &msg) {
    failed = prefix + ".bin: error: " + msg;
    return failed;
  }
  void discard() {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
    if (!bin_tmp.empty())
      ::unlink(bin_tmp.c_str());
    bin_tmp.clear();
  }
};

IndexedDatasetWriter::IndexedDatasetWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!impl_->finished)
    impl_->discard();
}

std::unique_ptr<IndexedDatasetWriter>
IndexedDatasetWriter::create(const std::string &prefix, TokenDtype dtype, std::string *error) {
  auto impl = std::make_unique<Impl>();
  impl->prefix = prefix;
  impl->bin_path = prefix + ".bin";
  impl->idx_path = prefix + ".idx";
  impl->dtype = dtype;
  if (dtype_size(dtype) == 0) {
    *error = impl->idx_path + ": error: unknown dtype code " +
             std::to_string(static_cast<int>(dtype)) + "; use one of Megatron's codes 1..8";
    return nullptr;
  }
  std::string tmpl = impl->bin_path + ".tmp.XXXXXX";
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) {
    *error = impl->bin_path + ": error: cannot create a temporary file beside it: " + os_error() +
             "; check the directory exists and is writable";
    return nullptr;
  }
  impl->fd = fd;
  impl->bin_tmp = tmpl;
  impl->buffer.reserve(kWriteBuffer + 4096);
  return std::unique_ptr<IndexedDatasetWriter>(new IndexedDatasetWriter(std::move(impl)));
}

std::string IndexedDatasetWriter::add_document(const int32_t *tokens, size_t n,
                                               const std::vector<int32_t> &sequence_lengths) {
  Impl &w = *impl_;
  if (!w.failed.empty())
    return w.failed;
  if (w.finished || w.fd < 0)
    return w.prefix + ".bin: error: add_document after finish()";
  // Check the whole document first so a refused one leaves the writer as it was.
  uint64_t sum = 0;
  for (int32_t len : sequence_lengths) {
    if (len < 0)
      return w.prefix + ".bin: error: negative sequence length " + std::to_string(len) +
             " in document " + u64s(w.document_indices.size() - 1);
    sum += static_cast<uint64_t>(len);
  }
  if (sum != n)
    return w.prefix + ".bin: error: document " + u64s(w.document_indices.size() - 1) + " has " +
           u64s(n) + " tokens but its sequence lengths add up to " + u64s(sum);
  auto [lo, hi] = dtype_range(w.dtype);
  if (lo > std::numeric_limits<int32_t>::min() || hi < std::numeric_limits<int32_t>::max()) {
    for (size_t i = 0; i < n; ++i) {
      if (tokens[i] < lo || tokens[i] > hi)
        return w.prefix + ".bin: error: token id " + std::to_string(tokens[i]) + " (document " +
               u64s(w.document_indices.size() - 1) + ", position " + u64s(i) +
               ") does not fit the dataset's dtype " + dtype_name(w.dtype) + " (" +
               std::to_string(lo) + ".." + std::to_string(hi) +
               "); use int32 (Megatron picks uint16 only for vocabularies under 65500 ids)";
    }
  }
  switch (w.dtype) {
  case TokenDtype::UInt8: append_as<uint8_t>(w.buffer, tokens, n); break;
  case TokenDtype::Int8: append_as<int8_t>(w.buffer, tokens, n); break;
  case TokenDtype::Int16: append_as<int16_t>(w.buffer, tokens, n); break;
  case TokenDtype::UInt16: append_as<uint16_t>(w.buffer, tokens, n); break;
  case TokenDtype::Int32: append_as<int32_t>(w.buffer, tokens, n); break;
  case TokenDtype::Int64: append_as<int64_t>(w.buffer, tokens, n); break;
  case TokenDtype::Float32: append_as<float>(w.buffer, tokens, n); break;
  case TokenDtype::Float64: append_as<double>(w.buffer, tokens, n); break;
  }
  w.sequence_lengths.insert(w.sequence_lengths.end(), sequence_lengths.begin(),
                            sequence_lengths.end());
  w.document_indices.push_back(static_cast<int64_t>(w.sequence_lengths.size()));
  w.tokens += n;
  if (w.buffer.size() >= kWriteBuffer)
    return w.flush();
  return "";
}

std::string IndexedDatasetWriter::add_document(const int32_t *tokens, size_t n) {
  // Megatron's add_item + end_document: one sequence, even when empty.
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return impl_->prefix + ".bin: error: a document of " + u64s(n) +
           " tokens does not fit one sequence (int32 length); split it into sequences";
  return add_document(tokens, n, {static_cast<int32_t>(n)});
}

std::string IndexedDatasetWriter::finish() {
  Impl &w = *impl_;
  if (!w.failed.empty())
    return w.failed;
  if (w.finished)
    return "";
  std::string err = w.flush();
  if (!err.empty())
    return err;
  if (::fchmod(w.fd, 0644) != 0 || ::fsync(w.fd) != 0)
    return w.fail("cannot flush '" + w.bin_tmp + "': " + os_error() + "; check free disk space");
  ::close(w.fd);
  w.fd = -1;

  // _IndexWriter's layout.
  const uint64_t S = w.sequence_lengths.size(), D = w.document_indices.size();
  std::string idx;
  idx.reserve(kHeaderSize + S * 12 + D * 8);
  idx.append(kMagic, sizeof(kMagic));
  put_le<uint64_t>(idx, 1);
  put_le<uint8_t>(idx, static_cast<uint8_t>(w.dtype));
  put_le<uint64_t>(idx, S);
  put_le<uint64_t>(idx, D);
  for (int32_t len : w.sequence_lengths)
    put_le<int32_t>(idx, len);
  const int64_t itemsize = static_cast<int64_t>(dtype_size(w.dtype));
  int64_t pointer = 0;
  for (int32_t len : w.sequence_lengths) {
    put_le<int64_t>(idx, pointer);
    pointer += len * itemsize;
  }
  for (int64_t doc : w.document_indices)
    put_le<int64_t>(idx, doc);

  // A stale .idx beside the new .bin would describe the wrong data: remove it
  // first, then the .bin goes into place and the .idx last, so after a crash
  // an .idx only ever exists with its complete .bin.
  if (::unlink(w.idx_path.c_str()) != 0 && errno != ENOENT)
    return w.fail("cannot replace '" + w.idx_path + "': " + os_error() +
                  "; check the directory is writable");
  if (::rename(w.bin_tmp.c_str(), w.bin_path.c_str()) != 0)
    return w.fail("cannot rename '" + w.bin_tmp + "' onto '" + w.bin_path + "': " + os_error() +
                  "; check the directory is writable");
  w.bin_tmp.clear();
  fsync_dir(w.bin_path);
  err = write_file_atomically(w.idx_path, idx);
  if (!err.empty()) {
    // Without its .idx the new .bin is no dataset; leave nothing half-made.
    ::unlink(w.bin_path.c_str());
    w.failed = w.prefix + ".idx: error: " + err + "; check the directory is writable and has space";
    return w.failed;
  }
  w.finished = true;
  return "";
}

uint64_t IndexedDatasetWriter::num_documents() const { return impl_->document_indices.size() - 1; }
uint64_t IndexedDatasetWriter::num_tokens() const { return impl_->tokens; }

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

struct IndexedDataset::Impl {
  std::string prefix;
  TokenDtype dtype = TokenDtype::Int32;
  size_t itemsize = 4;
  uint64_t sequences = 0, tokens = 0;
  const unsigned char *idx = nullptr, *bin = nullptr;
  size_t idx_size = 0, bin_size = 0;
  const unsigned char *lengths = nullptr, *pointers = nullptr; // unaligned arrays in idx
  // The on-disk document indices start at byte 34 + 12 S, never 8-aligned,
  // so they are read field by field from the mapping.
  const unsigned char *document_indices = nullptr;
  uint64_t documents = 0; // entries of document_indices minus one

  ~Impl() {
    if (idx)
      ::munmap(const_cast<unsigned char *>(idx), idx_size);
    if (bin)
      ::munmap(const_cast<unsigned char *>(bin), bin_size);
  }

  int32_t length(uint64_t i) const { return get_le<int32_t>(lengths + i * 4); }
  int64_t pointer(uint64_t i) const { return get_le<int64_t>(pointers + i * 8); }
  int64_t document(uint64_t i) const { return get_le<int64_t>(document_indices + i * 8); }
};

namespace {

// Maps a whole file read-only; an empty file maps to nullptr.
std::string map_file(const std::string &path, const unsigned char **data, size_t *size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return path + ": error: cannot open: " + os_error() +
           "; check the prefix (PREFIX.bin and PREFIX.idx must both exist)";
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::string why = S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file";
    ::close(fd);
    return path + ": error: " + why + "; check the prefix";
  }
  *size = static_cast<size_t>(st.st_size);
  *data = nullptr;
  if (*size > 0) {
    void *p = ::mmap(nullptr, *size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      std::string err = path + ": error: cannot map: " + os_error();
      ::close(fd);
      return err;
    }
    *data = static_cast<const unsigned char *>(p);
  }
  ::close(fd);
  return "";
}

} // namespace

IndexedDataset::IndexedDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
IndexedDataset::~IndexedDataset() = default;

std::unique_ptr<IndexedDataset> IndexedDataset::open(const std::string &prefix,
                                                     std::string *error) {
  auto d = std::make_unique<Impl>();
  d->prefix = prefix;
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  const std::string rerun = "re-run mt-preprocess on the source data";
  auto fail = [&](const std::string &file, const std::string &msg) {
    *error = file + ": error: " + msg;
    return nullptr;
  };
  std::string err = map_file(idx_path, &d->idx, &d->idx_size);
  if (err.empty())
    err = map_file(bin_path, &d->bin, &d->bin_size);
  if (!err.empty()) {
    *error = err;
    return nullptr;
  }

  // Header.
  const unsigned char *p = d->idx;
  const uint64_t size = d->idx_size;
  if (size >= sizeof(kLegacyMagic) && std::memcmp(p, kLegacyMagic, sizeof(kLegacyMagic)) == 0)
    return fail(idx_path, "not a Megatron indexed dataset index: this is the legacy "
                          "'lazy'/'cached' format (TNTIDX); " +
                              rerun);
  if (size > 0 && std::memcmp(p, kMagic, std::min<size_t>(size, sizeof(kMagic))) != 0)
    return fail(idx_path, "not a Megatron indexed dataset index (no \"MMIDIDX\" magic); "
                          "check the path, or " +
                              rerun);
  if (size < kHeaderSize) // an empty file and a cut-off magic too
    return fail(idx_path, "truncated: " + u64s(size) + " bytes, shorter than the " +
                              u64s(kHeaderSize) + "-byte header; " + rerun);
  uint64_t version = get_le<uint64_t>(p + 9);
  if (version != 1)
    return fail(idx_path,
                "unsupported index version " + u64s(version) + " (Megatron writes 1); " + rerun);
  uint8_t code = p[17];
  if (!known_dtype(code))
    return fail(idx_path, "unknown dtype code " + std::to_string(code) +
                              " (Megatron's codes are 1..8); the file is corrupt, " + rerun);
  d->dtype = static_cast<TokenDtype>(code);
  d->itemsize = dtype_size(d->dtype);
  const uint64_t S = get_le<uint64_t>(p + 18), D = get_le<uint64_t>(p + 26);

  // Sizes: S int32 lengths, S int64 pointers, D int64 document indices. Counts
  // from a corrupt header can be huge: 128-bit arithmetic cannot overflow.
  const unsigned __int128 expected =
      kHeaderSize + static_cast<unsigned __int128>(S) * 12 + static_cast<unsigned __int128>(D) * 8;
  if (expected != size) {
    std::string counts = u64s(S) + " sequences and " + u64s(D) + " document indices";
    if (expected + S == size)
      return fail(idx_path, "multimodal index (a mode byte per sequence) is not supported; "
                            "use a text dataset from mt-preprocess or preprocess_data.py");
    if (expected > size)
      return fail(idx_path, "truncated: the header's " + counts + " need " + u128s(expected) +
                                " bytes, found " + u64s(size) + "; " + rerun);
    return fail(idx_path, u128s(size - expected) + " bytes past the end of the " + counts +
                              " the header declares; the file is corrupt, " + rerun);
  }
  if (D == 0)
    return fail(idx_path, "no document indices (Megatron writes at least the leading 0); " + rerun);
  d->sequences = S;
  d->lengths = p + kHeaderSize;
  d->pointers = d->lengths + S * 4;
  const unsigned char *docs = d->pointers + S * 8;

  // Sequences: lengths >= 0 and contiguous pointers from 0.
  const int64_t itemsize = static_cast<int64_t>(d->itemsize);
  int64_t end = 0; // byte where the previous sequence ends
  for (uint64_t i = 0; i < S; ++i) {
    int32_t len = d->length(i);
    int64_t ptr = d->pointer(i);
    if (len < 0)
      return fail(idx_path, "sequence " + u64s(i) + " has negative length " + std::to_string(len) +
                                "; the file is corrupt, " + rerun);
    if (ptr != end)
      return fail(idx_path, "sequence " + u64s(i) + " starts at byte " + std::to_string(ptr) +
                                " of the .bin, expected " + std::to_string(end) +
                                (i == 0 ? "" : " (where sequence " + u64s(i - 1) + " ends)") +
                                "; the file is corrupt, " + rerun);
    // Corrupt lengths can sum past int64; they would not match the .bin anyway.
    if (__builtin_add_overflow(end, len * itemsize, &end))
      return fail(idx_path, "sequence lengths add up to more bytes than any .bin holds; "
                            "the file is corrupt, " +
                                rerun);
    d->tokens += static_cast<uint64_t>(len);
  }
  if (static_cast<uint64_t>(end) != d->bin_size) {
    if (static_cast<uint64_t>(end) > d->bin_size)
      return fail(bin_path, "truncated: " + idx_path + " describes " + std::to_string(end) +
                                " bytes, found " + u64s(d->bin_size) + "; copy the file again or " +
                                rerun);
    return fail(bin_path, "has " + u64s(d->bin_size) + " bytes but " + idx_path + " describes " +
                              std::to_string(end) + "; the two files do not belong together, " +
                              rerun);
  }

  // Documents: from 0, non-decreasing, ending at S.
  d->document_indices = docs;
  d->documents = D - 1;
  auto di = [&](uint64_t i) { return d->document(i); };
  if (di(0) != 0)
    return fail(idx_path, "document indices start at " + std::to_string(di(0)) +
                              ", expected 0; the file is corrupt, " + rerun);
  for (uint64_t i = 1; i < D; ++i)
    if (di(i) < di(i - 1))
      return fail(idx_path, "document index " + u64s(i) + " (" + std::to_string(di(i)) +
                                ") is smaller than the one before (" + std::to_string(di(i - 1)) +
                                "); the file is corrupt, " + rerun);
  if (static_cast<uint64_t>(di(D - 1)) != S)
    return fail(idx_path, "document indices end at " + std::to_string(di(D - 1)) +
                              " but there are " + u64s(S) + " sequences; the file is corrupt, " +
                              rerun);

  return std::unique_ptr<IndexedDataset>(new IndexedDataset(std::move(d)));
}

TokenDtype IndexedDataset::dtype() const { return impl_->dtype; }
uint64_t IndexedDataset::num_sequences() const { return impl_->sequences; }
uint64_t IndexedDataset::num_documents() const { return impl_->documents; }
uint64_t IndexedDataset::num_tokens() const { return impl_->tokens; }
int32_t IndexedDataset::sequence_length(uint64_t i) const { return impl_->length(i); }
int64_t IndexedDataset::sequence_offset(uint64_t i) const { return impl_->pointer(i); }
int64_t IndexedDataset::document_index(uint64_t i) const { return impl_->document(i); }

uint64_t IndexedDataset::document_of_sequence(uint64_t s) const {
  // The last document whose first sequence is <= s.
  uint64_t lo = 0, hi = impl_->documents; // answer in [lo, hi)
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (impl_->document(mid) <= static_cast<int64_t>(s))
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

void IndexedDataset::read(uint64_t sequence, uint64_t start, uint64_t n, int32_t *out) const {
  const Impl &d = *impl_;
  if (sequence >= d.sequences || start > static_cast<uint64_t>(d.length(sequence)) ||
      n > static_cast<uint64_t>(d.length(sequence)) - start) {
    // A caller bug, not bad data: open() validated every sequence.
    std::fprintf(stderr,
                 "%s: internal error: read of tokens [%llu, %llu) of sequence %llu "
                 "is out of range\n",
                 d.prefix.c_str(), static_cast<unsigned long long>(start),
                 static_cast<unsigned long long>(start + n),
                 static_cast<unsigned long long>(sequence));
    std::abort();
  }
  if (n == 0)
    return;
  const unsigned char *src = d.bin + d.pointer(sequence) + start * d.itemsize;
  switch (d.dtype) {
  case TokenDtype::UInt8: widen<uint8_t>(src, n, out); break;
  case TokenDtype::Int8: widen<int8_t>(src, n, out); break;
  case TokenDtype::Int16: widen<int16_t>(src, n, out); break;
  case TokenDtype::UInt16: widen<uint16_t>(src, n, out); break;
  case TokenDtype::Int32: std::memcpy(out, src, n * 4); break;
  case TokenDtype::Int64: widen<int64_t>(src, n, out); break;
  case TokenDtype::Float32: widen<float>(src, n, out); break;
  case TokenDtype::Float64: widen<double>(src, n, out); break;
  }
}

} // namespace mt::rt
