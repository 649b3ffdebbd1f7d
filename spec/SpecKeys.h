// The one table of spec keys: type, default, range, unit, meaning and the
// Megatron-LM flag each mirrors. The parser, did-you-mean, `mtc spec-keys`
// (docs/spec.md) and `mtc import-megatron` all read it.
#ifndef MT_SPEC_SPECKEYS_H
#define MT_SPEC_SPECKEYS_H

#include <string>
#include <vector>

namespace mt::spec {

enum class KeyType {
  Int,          // TOML integer
  Float,        // TOML float or integer
  Bool,         // TOML boolean
  String,       // TOML string
  Enum,         // TOML string, one of `choices`
  DataPath,     // string, or array: [prefix] or [w1, p1, w2, p2, ...]
  DeviceMemory, // preset name (string) or GiB (number)
  IntList,      // TOML array of `listLength` integers, each within the range
  StringList,   // TOML array of strings (at least one)
  LayerPattern, // integer N (every Nth layer), a Python list expression
                // string ("([1]*3+[0]*1)*3"), or an array of 0/1 per layer
};

struct KeyInfo {
  const char *section;      // "model", "parallel", "training", "data", "cluster"
  const char *name;         // snake_case Megatron flag name
  KeyType type;
  bool required;
  const char *defaultText;  // as docs show it ("4 * hidden_size", "1e-5", "")
  const char *unit;         // "tokens", "iterations", "" ...
  const char *megatronFlag; // "--num-layers"; "" when Megatron has no such flag
  const char *doc;          // one or two sentences
  std::vector<std::string> choices; // Enum only
  double min;               // inclusive lower bound for numbers
  double max;               // inclusive upper bound for numbers
  bool minExclusive;        // lower bound is exclusive (e.g. lr > 0)
  bool maxExclusive = false; // upper bound is exclusive (e.g. dropout < 1)
  int listLength = 0;         // IntList only: how many integers
};

const std::vector<KeyInfo> &specKeys();
const std::vector<std::string> &specSections();
const KeyInfo *findKey(const std::string &section, const std::string &name);

// Closest candidate by edit distance, or "" when none is close enough.
std::string didYouMean(const std::string &word,
                       const std::vector<std::string> &candidates);

// docs/spec.md's key reference, rendered from the table.
std::string renderKeyReferenceMarkdown();

// Shortest decimal that reads back as the same double ("1e-05", "0.1").
std::string formatNumber(double v);
// A key's numeric range as docs and errors show it: ">= 1", "in [0, 1)", or "".
std::string rangeText(const KeyInfo &key);

} // namespace mt::spec

#endif // MT_SPEC_SPECKEYS_H
