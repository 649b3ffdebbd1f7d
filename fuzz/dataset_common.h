// What the dataset targets share: a dataset opened and read as mtrun's data
// loader reads it (IndexedDataset::open, then GptDataset::build for the
// train and valid splits with the index cache in the temporary directory,
// then every sample), with the configuration fuzz/make_seeds.sh uses for
// the seed dataset and its index cache.
#ifndef MT_FUZZ_DATASET_COMMON_H
#define MT_FUZZ_DATASET_COMMON_H

#include "runtime/data/gpt_dataset.h"

#include <string>

namespace mt::fuzz {

// The seed dataset's configuration (fuzz/make_seeds.sh): seq_length 8,
// vocabulary 128, 16 training samples, Megatron's default split and seed.
constexpr int64_t kSeqLength = 8;
constexpr int64_t kVocab = 128;
constexpr int64_t kTrainSamples = 16;
mt::rt::GptDataConfig dataset_config(const std::string &prefix, const std::string &cache_dir);

// Opens PREFIX.idx/.bin, reads every token of its first sequences, builds
// the train and valid samples (caching their indices in `cache_dir`) and
// reads them. Errors must be one line naming the dataset or cache; aborts
// (a finding) otherwise.
void exercise_dataset(const std::string &prefix, const std::string &cache_dir);

// Builds the train split of `config` (16 samples) and reads every sample;
// returns "" or the error.
std::string build_and_sample(const mt::rt::GptDataConfig &config, mt::rt::DataSplit split,
                             int64_t samples);

// Abort unless `err` is one line that names `what` (a path).
void check_error(const char *target, const std::string &err, const std::string &what);

} // namespace mt::fuzz

#endif // MT_FUZZ_DATASET_COMMON_H
