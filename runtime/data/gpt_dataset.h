// GPT training samples exactly as Megatron-LM (megatron/core/datasets, core
// 0.8) builds them: the same split of a dataset into train/valid/test, the
// same epochs, the same shuffles (numpy's RandomState, reproduced bit for
// bit), the same blends and the same mock data, so sample i of a split holds
// the same seq_length + 1 token ids as Megatron's GPTDataset / BlendedDataset
// sample i.
//
// How a split's samples are built (Megatron's GPTDataset): the split is a
// range of the dataset's sequences ("documents"); an epoch is every sequence
// of the range once; as many epochs as the requested samples need are laid
// end to end in a document index, shuffled with numpy.random.RandomState(seed)
// (a final epoch that would be used for less than 80% is shuffled on its own);
// the concatenated tokens are cut into samples of seq_length + 1 tokens that
// overlap by one token (the sample index); a shuffle index permutes the
// samples. Token data stays mmapped; the indices are int32/int64 arrays as in
// Megatron.
//
// Index cache: the three indices of one split of one dataset live in a single
// file `<cache_dir>/<hash>-GPTDataset-<train|valid|test>.mtidx`, and a blend's
// dataset/sample indices in `<hash>-BlendedDataset-<split>.mtidx`. <hash> is 16
// hex digits of a hash of the text that determines the indices (dataset path,
// its sequence/token counts, file sizes and a hash of its sequence lengths,
// the split string and range, seq_length, seed, num_samples); the text itself
// is stored in the file and compared on load. cache_dir "" is Megatron's
// default, `PREFIX/cache/GPTDataset_indices/` (a folder named like the
// prefix); blends and mock data are cached only with an explicit cache_dir,
// as in Megatron. Files are written to a temporary, fsynced and renamed into
// place, then mmapped. A file whose header, description, size or checksums do
// not match, or whose entries are not indices sample() can use, is rebuilt
// (describe() says so), never trusted; one that cannot be rewritten is an
// error naming it.
//
// .mtidx layout (little-endian): 8-byte magic "MTGPTIDX", u32 version 2, u32
// kind (1 GPT, 2 blend), u64 description bytes, u64 count0, u64 count1, u64
// count2, u8 width1, u8 width2, 2 zero bytes, u32 CRC-32C of every byte after
// the padded description (the arrays and their padding), i64 min token id,
// i64 max token id, u64 FNV-1a hash of the preceding 72 bytes and the
// description; the description, zero-padded to 8 bytes; then the arrays,
// each zero-padded to 8
// bytes. GPT: count0 int32 document index entries, count1 sample index rows
// of two width1-byte ints (document index position, offset), count2 shuffle
// index entries of width2 bytes (uint32 or int64). Blend: count0 int16
// dataset indices, then count0 int64 dataset sample indices.
#ifndef MT_RUNTIME_GPT_DATASET_H
#define MT_RUNTIME_GPT_DATASET_H

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mt::rt {

struct GptDataConfig {
  // (weight, path prefix). One entry is a single dataset (Megatron's
  // `--data-path PREFIX`); several are a blend (`--data-path W1 P1 W2 P2`).
  // Empty with mock.
  std::vector<std::pair<double, std::string>> blend;
  std::string split = "969,30,1"; // Megatron's split string; mock data always uses "1,1,1"
  bool mock = false;              // Megatron's MockGPTDataset
  int64_t seq_length = 0;         // samples are seq_length + 1 tokens
  uint64_t seed = 1234;
  // Real (unpadded) vocabulary size: a token id outside [0, vocab_size) is an
  // error naming the dataset; 0 skips the check. Mock data needs it: its
  // tokens are 1, 2, ... modulo vocab_size.
  int64_t vocab_size = 0;
  // Mock data's end-of-document id: the tokenizer's (Megatron's
  // tokenizer.eod); -1 is vocab_size - 1, GPT-2's and NullTokenizer's.
  int64_t eod = -1;
  std::string cache_dir; // "" = Megatron's default (see above)
};

enum class DataSplit { Train = 0, Valid = 1, Test = 2 };
const char *data_split_name(DataSplit split); // "train", "valid", "test"

class GptDataset {
public:
  // Builds (or loads from the cache) the indices for `num_samples` samples of
  // one split. On failure returns null and sets *error to one line naming
  // what is wrong and the fix.
  static std::unique_ptr<GptDataset> build(const GptDataConfig &config, DataSplit split,
                                           int64_t num_samples, std::string *error);
  ~GptDataset();

  int64_t size() const; // >= the num_samples requested
  int64_t seq_length() const;
  // Writes the seq_length + 1 token ids of sample i (0 <= i < size()) and
  // returns "", or returns one error line (i out of range; the indices are
  // checked when built or loaded, so nothing else fails). Safe to call from
  // several threads at once.
  std::string sample(int64_t i, int32_t *tokens) const;
  // Which files, split ranges, epochs and samples, and where the indices came
  // from; several lines for a blend.
  std::string describe() const;
  // True when every index was read from the cache rather than built.
  bool loaded_from_cache() const;
  // A running hash of what samples [begin, end) hold, in order, continuing
  // `state` (start from kOrderHashStart): which documents, from which offset
  // to which, and for a blend which dataset. Sample i is read as i % size(),
  // as the training loop reads it. Two indices give the same hash over the
  // same range when they put the same pieces of text there, so a resumed run
  // can tell whether the samples its checkpoint trained on are this index's
  // first ones. O(end - begin), no token is read.
  static constexpr uint64_t kOrderHashStart = 0xcbf29ce484222325ull;
  uint64_t order_hash(uint64_t state, int64_t begin, int64_t end) const;

  struct Impl;

private:
  explicit GptDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The documents `split` holds under config's split string (summed over a
// blend's datasets): 0 when the split gets no share, or when its share
// rounds to no document. -1 with *error one line when a dataset cannot be
// opened or the split string is bad.
int64_t split_documents(const GptDataConfig &config, DataSplit split, std::string *error);

// Megatron's per-split sample counts for a run (megatron/training/training.py,
// get_train_valid_test_num_samples): train_iters * global_batch;
// (train_iters / eval_interval + 1) * eval_iters * global_batch; eval_iters *
// global_batch. An eval_interval <= 0 counts as no periodic evaluation.
std::array<int64_t, 3> megatron_num_samples(int64_t train_iters, int64_t global_batch,
                                            int64_t eval_interval, int64_t eval_iters);

// The pieces, public for tests and tools.

// Megatron's parse_and_normalize_split: the numbers (runs of digits and dots)
// of `split`, padded with zeros to three and normalized. Returns "" or an
// error line.
std::string parse_megatron_split(const std::string &split, std::array<double, 3> *weights);

// The [begin, end) range of each split over `num_elements` sequences, as
// Megatron's builder computes it: bookends are running sums of the weights,
// a split whose bookends do not increase is absent (nullopt), and each bookend
// is round-half-even(bookend * num_elements).
std::array<std::optional<std::pair<int64_t, int64_t>>, 3>
megatron_split_ranges(const std::array<double, 3> &weights, int64_t num_elements);

// Megatron's build_blending_indices (helpers.cpp): sample s goes to the
// dataset whose weight * max(s, 1) most exceeds the samples it already has
// (the first one on ties).
void megatron_blending_indices(const std::vector<double> &weights, int64_t size,
                               int16_t *dataset_index, int64_t *dataset_sample_index);

// The number of samples a blend requests from each dataset for `num_samples`
// (core 0.8's _get_size_per_split_per_dataset): ceil(num_samples * w * 1.005)
// with the normalized weights w.
std::vector<int64_t> megatron_blend_requests(const std::vector<double> &normalized_weights,
                                             int64_t num_samples);

} // namespace mt::rt

#endif // MT_RUNTIME_GPT_DATASET_H
