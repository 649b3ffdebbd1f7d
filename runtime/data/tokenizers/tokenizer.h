// Megatron-LM's tokenizers behind one interface: `--tokenizer-type` and its
// files in, a shared immutable tokenizer out, and one encoder per thread.
// Used by mt-preprocess, mt-dataset and mtc; no Python, no LLVM.
//
// Semantics follow the tokenize() of Megatron-Core's megatron/core/tokenizers
// (0.17 and later) by default; `legacy` reproduces the classes of
// megatron/training/tokenizer (core 0.14). docs/data.md says which version
// each behaviour follows.
#ifndef MT_RUNTIME_TOKENIZER_H
#define MT_RUNTIME_TOKENIZER_H

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mt::rt {

// The tokenizer flags of Megatron's tools/preprocess_data.py and training
// arguments, as given.
struct TokenizerOptions {
  std::string type = "GPT2BPETokenizer";     // --tokenizer-type
  std::string vocab_file;                    // --vocab-file
  std::string merge_file;                    // --merge-file
  std::string model;                         // --tokenizer-model (file or directory)
  std::optional<int64_t> vocab_size;         // --vocab-size
  std::string tiktoken_pattern;              // --tiktoken-pattern v1|v2
  int64_t tiktoken_num_special_tokens = 1000; // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;   // --tokenizer-special-tokens
  std::vector<std::string> tiktoken_special_tokens; // --tiktoken-special-tokens
  bool sentencepiece_legacy = false;         // --tokenizer-sentencepiece-legacy
  bool hf_include_special_tokens = true;     // --tokenizer-hf-no-include-special-tokens
  bool legacy = false;                       // --legacy-tokenizer
  // The flags parse_tokenizer_flag read, as named (--vocab for --vocab-file
  // too): check_tokenizer_options refuses one that `type` does not use.
  std::vector<std::string> given;
};

// Reads one tokenizer flag at args[i] (with its values, or its `=value`) into
// `o`, advancing i past them. Returns false when args[i] is not a tokenizer
// flag; sets *error when it is one with a bad value.
bool parse_tokenizer_flag(const std::vector<std::string> &args, size_t &i,
                          TokenizerOptions &o, std::string *error);

// The flags `o.type` needs and does not accept, checked before any file is
// read: "" or one line naming the flag ("HuggingFaceTokenizer needs
// --tokenizer-model"), for a usage error.
std::string check_tokenizer_options(const TokenizerOptions &o);

// The usage lines of those flags, for --help texts.
const char *tokenizer_flags_usage();

// Encodes text; one per worker thread (it may own caches).
class TokenEncoder {
public:
  virtual ~TokenEncoder();
  // Appends what Megatron's tokenizer.tokenize(text) returns for `text`
  // (BOS where that tokenizer adds it; special tokens as it treats them).
  // Any byte sequence is accepted, invalid UTF-8 included.
  virtual void encode(std::string_view text, std::vector<int32_t> &out) = 0;
  // As encode, for a tokenizer that refuses some text (NullTokenizer's words
  // that are not ids): false with *error saying what is wrong and the fix,
  // `out` unchanged. A tokenizer that accepts any bytes keeps this default.
  virtual bool try_encode(std::string_view text, std::vector<int32_t> &out,
                          std::string *error) {
    (void)error;
    encode(text, out);
    return true;
  }
};

// A loaded tokenizer: immutable, shared by every thread.
class Tokenizer {
public:
  virtual ~Tokenizer();
  // Megatron's tokenizer.vocab_size: what the embedding is padded from and
  // what picks the .bin dtype.
  virtual size_t vocab_size() const = 0;
  // Megatron's tokenizer.eod: the id --append-eod appends; -1 where that
  // tokenizer has none (mt-preprocess then refuses --append-eod).
  virtual int32_t eod() const = 0;
  virtual std::unique_ptr<TokenEncoder> encoder() const = 0;
  // Text of ids, for inspection (mt-dataset); ids outside the vocabulary are
  // shown as <id N>.
  virtual std::string decode(const int32_t *ids, size_t n) const = 0;
  // One line for logs: the type and its files.
  virtual std::string describe() const = 0;
};

// Loads the tokenizer the options name (check_tokenizer_options first). On
// failure returns null and sets *error to one line "FILE: error: ..." naming
// the file (and the field) and the fix.
std::shared_ptr<const Tokenizer> load_tokenizer(const TokenizerOptions &o,
                                                std::string *error);

} // namespace mt::rt

#endif // MT_RUNTIME_TOKENIZER_H
