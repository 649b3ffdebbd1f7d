// Internal to spec/: what MegatronShell, MegatronFlags and MegatronImport.cpp share.
#ifndef MT_SPEC_MEGATRONIMPORTIMPL_H
#define MT_SPEC_MEGATRONIMPORTIMPL_H

#include "spec/SpecKeys.h"

#include <cstddef>
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

} // namespace mt::spec::megatron

#endif // MT_SPEC_MEGATRONIMPORTIMPL_H
