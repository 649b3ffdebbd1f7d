// Megatron's SentencePiece tokenizer types (SentencePieceTokenizer,
// GPTSentencePieceTokenizer, Llama2Tokenizer) over Google's SentencePiece
// C++ library, with the tokenize(), eod and vocab_size of each Megatron
// version (see docs/data.md, "Tokenizers").
#ifndef MT_RUNTIME_SENTENCEPIECE_TOKENIZER_H
#define MT_RUNTIME_SENTENCEPIECE_TOKENIZER_H

#include "runtime/data/tokenizers/tokenizer.h"

namespace mt::rt {

// True for the three SentencePiece --tokenizer-type names.
bool is_sentencepiece_type(const std::string &type);

// The flags a SentencePiece type needs or refuses: "" or one line.
std::string check_sentencepiece_options(const TokenizerOptions &o);

// Loads --tokenizer-model; null and *error = "FILE: error: ..." on failure.
std::shared_ptr<const Tokenizer> load_sentencepiece_tokenizer(const TokenizerOptions &o,
                                                              std::string *error);

} // namespace mt::rt

#endif // MT_RUNTIME_SENTENCEPIECE_TOKENIZER_H
