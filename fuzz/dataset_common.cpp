// dataset_common.h: a dataset read the way mtrun's data loader reads it.
#include "fuzz/dataset_common.h"

#include "fuzz/fuzz_common.h"
#include "runtime/data/indexed_dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

namespace mt::fuzz {

using namespace mt::rt;

GptDataConfig dataset_config(const std::string &prefix, const std::string &cache_dir) {
  GptDataConfig c;
  c.blend = {{1.0, prefix}};
  c.seq_length = kSeqLength;
  c.vocab_size = kVocab;
  c.cache_dir = cache_dir;
  return c;
}

void check_error(const char *target, const std::string &err, const std::string &what) {
  if (err.empty() || err.find('\n') != std::string::npos || err.find(what) == std::string::npos) {
    std::fprintf(stderr, "%s: the error is not one line naming %s: '%s'\n", target, what.c_str(),
                 err.c_str());
    std::abort();
  }
}

std::string build_and_sample(const GptDataConfig &config, DataSplit split, int64_t samples) {
  std::string err;
  std::unique_ptr<GptDataset> ds;
  // mtrun reports a failed allocation of the indices as an error line.
  try {
    ds = GptDataset::build(config, split, samples, &err);
  } catch (const std::bad_alloc &) {
    return "data: error: out of memory building the indices";
  }
  if (!ds)
    return err.empty() ? "(empty error)" : err;
  // MT_FUZZ_VERBOSE=1 shows where the indices came from (cache or rebuilt),
  // to see how deep a corpus reaches.
  const std::string described = ds->describe();
  if (std::getenv("MT_FUZZ_VERBOSE"))
    std::fprintf(stderr, "%s\n", described.c_str());
  std::vector<int32_t> tokens(size_t(ds->seq_length()) + 1);
  const int64_t n = std::min<int64_t>(ds->size(), 4 * samples);
  for (int64_t i = 0; i < n; ++i)
    if (std::string e = ds->sample(i, tokens.data()); !e.empty())
      return e;
  (void)ds->order_hash(GptDataset::kOrderHashStart, 0, n);
  return "";
}

void exercise_dataset(const std::string &prefix, const std::string &cache_dir) {
  std::string err;
  std::unique_ptr<IndexedDataset> ds = IndexedDataset::open(prefix, &err);
  if (!ds) {
    check_error("dataset", err, prefix);
    return;
  }
  std::vector<int32_t> buf;
  const uint64_t seqs = std::min<uint64_t>(ds->num_sequences(), 256);
  for (uint64_t s = 0; s < seqs; ++s) {
    const int32_t len = ds->sequence_length(s);
    if (len < 0)
      std::abort(); // open() promised lengths >= 0
    buf.resize(size_t(len) + 1);
    ds->read(s, 0, uint64_t(len), buf.data());
    (void)ds->document_of_sequence(s);
  }
  for (uint64_t d = 0; d <= std::min<uint64_t>(ds->num_documents(), 256); ++d)
    (void)ds->document_index(d);
  ds.reset();
  const GptDataConfig config = dataset_config(prefix, cache_dir);
  (void)split_documents(config, DataSplit::Train, &err);
  for (DataSplit split : {DataSplit::Train, DataSplit::Valid})
    if (std::string e = build_and_sample(config, split, kTrainSamples); !e.empty())
      check_error("dataset", e, prefix);
  remove_tree(cache_dir);
}

} // namespace mt::fuzz
