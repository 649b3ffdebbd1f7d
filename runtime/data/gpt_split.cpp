// The train/valid/test split of GPT datasets, and the samples each split gets.
//
// Facts from Megatron-LM's megatron/core/datasets (core 0.8):
//  - blended_megatron_dataset_config.py: parse_and_normalize_split (numbers
//    matched by [.0-9]+, padded to three, normalize()),
//    convert_split_vector_to_split_matrix; no blend means mock data with the
//    split forced to "1,1,1".
//  - blended_megatron_dataset_builder.py: _build_megatron_dataset_splits
//    (beg = int(round(bookend * num_elements)), elements are sequences for
//    GPT).
// Floating-point expressions follow Megatron's evaluation order, and this file
// is built with -ffp-contract=off so no multiply-add is fused (a fused one
// rounds differently from Megatron's Python).
#include "runtime/data/gpt_dataset.h"

#include "runtime/data/gpt_dataset_internal.h"
#include "runtime/data/indexed_dataset.h"
#include "runtime/data/numpy_random.h"

#include <cmath>
#include <cstdlib>

namespace mt::rt {

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
    add(gpt_detail::kMockSequences);
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

} // namespace mt::rt
