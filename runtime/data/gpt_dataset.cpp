// GPT training samples as Megatron-LM builds them (see gpt_dataset.h): a single dataset or a blend.
//
// Facts from Megatron-LM's megatron/core/datasets (core 0.8):
//  - blended_megatron_dataset_config.py: no blend means mock data with the
//    split forced to "1,1,1".
//  - blended_megatron_dataset_builder.py: a weighted blend's size is the sum
//    of the requests of _get_size_per_split_per_dataset; a single prefix
//    without weight is no blend.
//  - blended_dataset.py: the weights are normalized once more before blending.
//  - the default cache folder is os.path.join(path_prefix, "cache",
//    "GPTDataset_indices"); mock data has none.
// The token sources are in gpt_sources.cpp, the indices and their cache in
// gpt_indices.cpp, the split functions in gpt_split.cpp. This file is built
// with -ffp-contract=off like them.
#include "runtime/data/gpt_dataset.h"

#include "runtime/data/gpt_dataset_internal.h"
#include "runtime/data/numpy_random.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

namespace mt::rt {

using namespace gpt_detail; // runtime/data's own pieces (gpt_dataset_internal.h)

namespace {

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
  std::string replaced; // why the index file at cache_path was unusable, when it was
  bool from_cache = false;
  double seconds = 0;
};

} // namespace

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
  if (config.mock && config.eod >= config.vocab_size) {
    *error = "data: mock data's end-of-document id " + std::to_string(config.eod) +
             " is outside the vocabulary [0, " + std::to_string(config.vocab_size) +
             "); check the tokenizer and vocab_size agree";
    return nullptr;
  }
  if (config.mock && config.vocab_size < 1) {
    *error = "data: mock data needs the vocabulary size (its tokens are 1, 2, ... modulo "
             "it); set it";
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
                                      ? mock_source(config.vocab_size, config.eod)
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
      // Every entry within its dataset's samples, or the file is rebuilt.
      for (int64_t s = 0; s < blend->size && why.empty(); ++s) {
        const int16_t d = blend->dataset_index[s];
        const int64_t j = blend->dataset_sample_index[s];
        if (d < 0 || static_cast<size_t>(d) >= blend->parts.size() || j < 0 ||
            j >= blend->parts[size_t(d)]->size())
          why = "its indices are inconsistent: entry " + std::to_string(s) + " names sample " +
                std::to_string(j) + " of dataset " + std::to_string(d) + ", which the blend "
                "does not have";
      }
      if (why.empty()) {
        blend->from_cache = cached = true;
      } else {
        blend->map.reset();
        blend->dataset_index = nullptr;
        blend->dataset_sample_index = nullptr;
      }
    }
    if (!cached)
      blend->replaced = why;
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
      if (!werr.empty() && !blend->replaced.empty()) {
        *error = "data: the index cache " + blend->cache_path + " is unusable (" +
                 blend->replaced + ") and cannot be replaced (" + werr +
                 "); delete it, or make its folder writable";
        return nullptr;
      }
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

std::string GptDataset::sample(int64_t i, int32_t *tokens) const {
  if (i < 0 || i >= size())
    return "data: error: sample " + std::to_string(i) + " asked of a " +
           data_split_name(impl_->which) + " split of " + std::to_string(size()) + " samples";
  if (impl_->single)
    return impl_->single->sample(i, tokens);
  // The blend's entries were checked when built or loaded.
  const Blend &b = *impl_->blend;
  return b.parts[size_t(b.dataset_index[i])]->sample(b.dataset_sample_index[i], tokens);
}

uint64_t GptDataset::order_hash(uint64_t state, int64_t begin, int64_t end) const {
  const int64_t n = size();
  if (n <= 0)
    return state;
  for (int64_t s = begin; s < end; ++s) {
    const int64_t i = s % n;
    if (impl_->single) {
      state = impl_->single->hash_sample(state, i);
      continue;
    }
    const Blend &b = *impl_->blend;
    state = order_hash_step(state, uint64_t(b.dataset_index[i]));
    state = b.parts[size_t(b.dataset_index[i])]->hash_sample(state, b.dataset_sample_index[i]);
  }
  return state;
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
  if (!b.from_cache && !b.replaced.empty())
    s += "; rebuilt because the index file there was unusable: " + b.replaced;
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
