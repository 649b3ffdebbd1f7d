// Megatron's HuggingFaceTokenizer: a Hugging Face tokenizer.json (BPE,
// byte-level or SentencePiece-style with byte fallback, Unigram, WordLevel;
// the normalizers, pre-tokenizers, added tokens and post-processors that
// real models use) read and run without Python, with the special tokens of
// tokenizer_config.json as transformers reads them. docs/data.md lists what
// is supported and which Megatron version each behaviour follows.
#ifndef MT_RUNTIME_TOKENIZERS_HF_TOKENIZER_H
#define MT_RUNTIME_TOKENIZERS_HF_TOKENIZER_H

#include "runtime/data/tokenizers/tokenizer.h"

#include <memory>
#include <string>

namespace mt::rt {

// Loads --tokenizer-model (a directory holding tokenizer.json, or the file
// itself; tokenizer_config.json and special_tokens_map.json are read from
// the same directory when present). On failure returns null and sets *error
// to one line "FILE: error: FIELD ..." naming the file and the JSON field.
std::shared_ptr<const Tokenizer> load_hf_tokenizer(const TokenizerOptions &o,
                                                   std::string *error);

} // namespace mt::rt

#endif // MT_RUNTIME_TOKENIZERS_HF_TOKENIZER_H
