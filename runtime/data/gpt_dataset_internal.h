// What the gpt_* files share: GptDataset's insides, internal to runtime/data.
//
// GptDataset::build (gpt_dataset.cpp) opens a Source per dataset
// (gpt_sources.cpp) and has build_part (gpt_indices.cpp) build or load one
// split's indices over it, a GptPart; a blend's indices are built there too.
// Both read and write the index cache (gpt_indices.cpp, with the small
// helpers below). gpt_split.cpp holds gpt_dataset.h's split functions.
#ifndef MT_RUNTIME_GPT_DATASET_INTERNAL_H
#define MT_RUNTIME_GPT_DATASET_INTERNAL_H

#include "runtime/data/gpt_dataset.h"
#include "runtime/data/indexed_dataset.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mt::rt::gpt_detail {

// ---------------------------------------------------------------------------
// Helpers (gpt_indices.cpp)
// ---------------------------------------------------------------------------

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;

uint64_t fnv1a(const void *data, size_t n, uint64_t h = kFnvOffset);
std::string hex16(uint64_t v); // 16 hex digits
std::string commas(int64_t v); // 1234567 -> "1,234,567"
std::string plural(int64_t n, const char *word); // "1 token", "1,024 tokens"
std::string fmt_double(double v); // the shortest of %.15g, %.16g, %.17g that reads back as v
std::string fmt_seconds(double s); // "0.25 s"
double seconds_since(std::chrono::steady_clock::time_point t0);
// mkdir -p; returns "" or the reason.
std::string make_dirs(const std::string &dir);

// ---------------------------------------------------------------------------
// The index cache (gpt_indices.cpp): .mtidx files, laid out as gpt_dataset.h
// says.
// ---------------------------------------------------------------------------

// A whole file mapped read-only.
struct Mapping {
  const unsigned char *data = nullptr;
  size_t size = 0;
  ~Mapping();
};

constexpr uint32_t kKindGpt = 1, kKindBlend = 2;

// What one cache file holds besides its arrays.
struct CacheShape {
  uint32_t kind = 0;
  uint64_t count[3] = {0, 0, 0};
  uint8_t width[2] = {0, 0};
  int64_t min_token = 0, max_token = -1;
};

// Writes the header and `arrays` (sized as `s` says) atomically; "" or the error.
std::string write_cache(const std::string &path, const CacheShape &s, const std::string &description,
                        const std::vector<const void *> &arrays);

// Maps a cache file and checks it holds exactly what `expect` and the
// description say. On success fills the token range and the array pointers;
// otherwise returns null with *why "" (no file) or what is wrong with it.
std::unique_ptr<Mapping> load_cache(const std::string &path, const std::string &description,
                                    CacheShape *expect, std::vector<const void *> *arrays,
                                    std::string *why);

// ---------------------------------------------------------------------------
// Token sources (gpt_sources.cpp): an indexed dataset, or Megatron's mock data.
// ---------------------------------------------------------------------------

// MockGPTLowLevelDataset's constants.
constexpr int64_t kMockSequences = 100000;
constexpr int32_t kMockMaxLength = 4096;
constexpr uint64_t kMockSeed = 0;

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

// The dataset at `prefix`, or null with *error set.
std::shared_ptr<Source> open_source(const std::string &prefix, int64_t vocab, std::string *error);
// MockGPTLowLevelDataset with a vocabulary of `vocab` ids.
std::shared_ptr<Source> mock_source(int64_t vocab, int64_t eod);

// Min and max token id of sequences [beg, end), read by a few threads.
std::pair<int64_t, int64_t> token_range(const Source &src, int64_t beg, int64_t end);

// The error for the first token of sequences [beg, end) outside [0, vocab).
std::string bad_token_error(const Source &src, int64_t beg, int64_t end);

// ---------------------------------------------------------------------------
// Megatron's GPTDataset: one split of one source (gpt_indices.cpp).
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
  std::string replaced; // why the index file at cache_path was unusable, when it was
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

  // The error for sample i: the split, the dataset, the index file.
  std::string corrupt(int64_t i, const std::string &what) const;
  // The tokens between sample index rows j and j + 1 (sample i), checked.
  std::string span(int64_t j, int64_t i, int32_t *out) const;

  // _query_document_sample_shuffle_indices: the pieces of the documents
  // between two consecutive sample index rows, concatenated. "" or an error.
  std::string sample(int64_t i, int32_t *out) const;
  // "" when every entry of the three indices is what sample() can use; else
  // what is wrong (an index file that holds something else is rebuilt).
  std::string check_indices() const;
  // `h` advanced over what sample i holds (GptDataset::order_hash).
  uint64_t hash_sample(uint64_t h, int64_t i) const;

  std::string describe() const;
};

// One step of the sample-order hash: FNV-1a's prime over a mixed 64-bit word.
inline uint64_t order_hash_step(uint64_t h, uint64_t v) {
  v ^= v >> 33;
  v *= 0xff51afd7ed558ccdull;
  v ^= v >> 33;
  return (h ^ v) * 0x100000001b3ull;
}

// Builds or loads the indices of `num_samples` samples of one split.
std::unique_ptr<GptPart> build_part(std::shared_ptr<const Source> src, const Settings &set,
                                    std::optional<std::pair<int64_t, int64_t>> range,
                                    int64_t num_samples, std::string *error);

} // namespace mt::rt::gpt_detail

#endif // MT_RUNTIME_GPT_DATASET_INTERNAL_H
