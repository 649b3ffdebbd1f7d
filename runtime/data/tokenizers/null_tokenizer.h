// Megatron-LM's NullTokenizer (`--tokenizer-type NullTokenizer --vocab-size N`):
// documents that are already token ids, written as integers separated by
// single spaces. For benchmarks, debugging and data tokenized elsewhere.
#ifndef MT_RUNTIME_NULL_TOKENIZER_H
#define MT_RUNTIME_NULL_TOKENIZER_H

#include "runtime/data/tokenizers/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>

namespace mt::rt {

// `vocab_size_flag` is Megatron's --vocab-size N (at least 1). Current
// Megatron-Core (megatron/core/tokenizers, core 0.18 and later): vocab_size
// N, EOD N - 1. `legacy` (megatron/training/tokenizer's _NullTokenizer, core
// 0.14 to 0.16, and megatron/core/tokenizers up to 0.17.1): vocab_size N + 1,
// EOD N. docs/data.md has the details.
std::shared_ptr<const Tokenizer> make_null_tokenizer(int64_t vocab_size_flag, bool legacy);

} // namespace mt::rt

#endif // MT_RUNTIME_NULL_TOKENIZER_H
