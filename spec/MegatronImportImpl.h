// Internal to spec/: what MegatronShell, MegatronFlags and MegatronImport.cpp share.
#ifndef MT_SPEC_MEGATRONIMPORTIMPL_H
#define MT_SPEC_MEGATRONIMPORTIMPL_H

#include "spec/SpecKeys.h"

#include "absl/status/statusor.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mt::spec::megatron {

inline bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

inline bool startsWith(const std::string &s, const std::string &prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

//===----------------------------------------------------------------------===//
// Shell words (MegatronShell.cpp)
//===----------------------------------------------------------------------===//

// `NAME=value`, an environment assignment before a command.
bool isAssignment(const std::string &w);

// `set -x` prefixes traced commands with `+`, one per nesting level.
bool isTracePrefix(const std::string &w);

// Words before the command proper: env assignments and `set -x` markers.
template <typename T, typename GetText>
size_t leadingNoise(const std::vector<T> &words, GetText text) {
  size_t k = 0;
  while (k < words.size() &&
         (isAssignment(text(words[k])) || isTracePrefix(text(words[k]))))
    ++k;
  return k;
}

// Quotes a word for the header comment so it reads back as one word.
std::string shellQuote(const std::string &w);

inline constexpr char kScript[] = "pretrain_gpt.py";

//===----------------------------------------------------------------------===//
// Key-table lookups (MegatronFlags.cpp; the flag table is MegatronFlags.h)
//===----------------------------------------------------------------------===//

// The key a plain `--flag VALUE` (or a bool switch) sets, from the key table;
// null for flags the translation handles itself.
const KeyInfo *keyForFlag(const std::string &flag);

// The key table's entry; a missing one is an internal error (aborts).
const KeyInfo &key(const char *section, const char *name);

// The key's Megatron flag when it is a plain `--name`, else "".
std::string flagOf(const KeyInfo &k);

// Megatron switches (flags without a value) that set one key to a fixed value.
struct Switch {
  const char *flag, *section, *key, *value;
};
const Switch *findSwitch(const std::string &flag);

//===----------------------------------------------------------------------===//
// Tokenizer files (MegatronTokenizer.cpp)
//===----------------------------------------------------------------------===//

// GPT2BPETokenizer's vocabulary: the entries of vocab.json.
absl::StatusOr<int64_t> gpt2VocabSize(const std::string &vocabJson);

// HuggingFaceTokenizer's vocabulary from a local tokenizer.json (or a
// directory holding one): len(tokenizer), as Megatron takes it.
struct HfVocab {
  std::string file;  // the tokenizer.json read
  int64_t model = 0; // model.vocab's tokens
  int64_t total = 0; // with the added tokens not already in it
};
absl::StatusOr<HfVocab> hfVocabSize(const std::string &tokenizerModel);

} // namespace mt::spec::megatron

#endif // MT_SPEC_MEGATRONIMPORTIMPL_H
