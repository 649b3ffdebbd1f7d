// The token sources of GPT samples: an indexed dataset, or Megatron's mock data.
//
// MockGPTLowLevelDataset is Megatron-LM's (megatron/core/datasets/gpt_dataset.py,
// core 0.8): 100000 lengths from default_rng(0).integers(1, 4096,
// dtype=int32); tokens 1, 2, ... modulo the vocabulary, then EOD.
#include "runtime/data/gpt_dataset_internal.h"

#include "runtime/data/numpy_random.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <thread>

namespace mt::rt::gpt_detail {

namespace {

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

} // namespace

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

std::shared_ptr<Source> mock_source(int64_t vocab, int64_t eod) {
  auto src = std::make_shared<Source>();
  src->vocab = vocab;
  src->eod = static_cast<int32_t>(eod >= 0 ? eod : vocab - 1);
  src->name = "mock data (end of document " + std::to_string(src->eod) + ")";
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

} // namespace mt::rt::gpt_detail
