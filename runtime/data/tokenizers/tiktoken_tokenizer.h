// Megatron's TikTokenizer: a tiktoken vocabulary in Megatron's JSON form,
// its v1/v2 split patterns, special tokens at the lowest ids; tokenize(),
// eod and vocab_size of current Megatron-Core or, with --legacy-tokenizer,
// of the old class (see docs/data.md, "Tokenizers").
#ifndef MT_RUNTIME_TIKTOKEN_TOKENIZER_H
#define MT_RUNTIME_TIKTOKEN_TOKENIZER_H

#include "runtime/data/tokenizers/tokenizer.h"

namespace mt::rt {

// The flags TikTokenizer needs or refuses: "" or one line.
std::string check_tiktoken_options(const TokenizerOptions &o);

// Loads --tokenizer-model; null and *error = "FILE: error: ..." on failure.
std::shared_ptr<const Tokenizer> load_tiktoken_tokenizer(const TokenizerOptions &o,
                                                         std::string *error);

// For the unit test: the pieces the v1 or v2 pattern splits `text` into
// (no special tokens).
std::vector<std::string> tiktoken_pretokens_for_test(const std::string &pattern,
                                                     std::string_view text);

} // namespace mt::rt

#endif // MT_RUNTIME_TIKTOKEN_TOKENIZER_H
