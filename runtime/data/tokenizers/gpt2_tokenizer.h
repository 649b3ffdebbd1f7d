// GPT-2's byte-level BPE: vocab.json + merges.txt, GPT-2's pre-tokenisation,
// merges by rank. Shared by mtrun and the data tools; no Python, no LLVM.
#ifndef MT_RUNTIME_GPT2_TOKENIZER_H
#define MT_RUNTIME_GPT2_TOKENIZER_H

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mt::rt {

// The immutable tables: loaded once, shared by every worker thread.
class Gpt2Vocabulary {
public:
  // Loads and validates both files. On failure returns null and sets *error to
  // one line naming the file (and line, for merges.txt) and the fix.
  static std::shared_ptr<const Gpt2Vocabulary>
  load(const std::string &vocab_json_path, const std::string &merges_txt_path,
       std::string *error);

  size_t size() const;            // number of token ids (50257 for GPT-2)
  int32_t eod_id() const;         // id of "<|endoftext|>"
  // Bytes of one token (after undoing the byte-to-unicode mapping).
  std::string_view token_bytes(int32_t id) const;

  struct Impl;
  explicit Gpt2Vocabulary(std::unique_ptr<Impl> impl);
  ~Gpt2Vocabulary();
  const Impl &impl() const { return *impl_; }

private:
  std::unique_ptr<Impl> impl_;
};

// Encodes text; one per worker thread (it owns a cache of pre-token -> ids,
// bounded in size so memory stays flat on any input).
class Gpt2Encoder {
public:
  explicit Gpt2Encoder(std::shared_ptr<const Gpt2Vocabulary> vocab);
  ~Gpt2Encoder();
  Gpt2Encoder(const Gpt2Encoder &) = delete;
  Gpt2Encoder &operator=(const Gpt2Encoder &) = delete;

  // Appends the ids of `text` to `out`. Any byte sequence is accepted, invalid
  // UTF-8 included, and decode(encode(x)) == x for every x. "<|endoftext|>" in
  // the text is ordinary text, as in Megatron's preprocessing.
  void encode(std::string_view text, std::vector<int32_t> &out);

  std::string decode(const int32_t *ids, size_t n) const;

private:
  struct State;
  std::shared_ptr<const Gpt2Vocabulary> vocab_;
  std::unique_ptr<State> state_;
};

} // namespace mt::rt

#endif // MT_RUNTIME_GPT2_TOKENIZER_H
