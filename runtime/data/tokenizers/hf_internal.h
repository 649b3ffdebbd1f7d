// The parts of the Hugging Face tokenizer (hf_tokenizer.h) that its files
// share: the pipeline's steps as loaded from tokenizer.json, PCRE2 patterns
// in Oniguruma's meaning, and the models. Not for other users.
//
// The semantics follow HF `tokenizers` 0.23 (tokenizer.json's meaning):
// added tokens are split out of the raw text, the rest is normalized, split
// again on the normalized added tokens, pre-tokenized and given to the model;
// the post-processor adds the template's special tokens. Facts taken from its
// sources are cited where they are used; no code is copied.
#ifndef MT_RUNTIME_TOKENIZERS_HF_INTERNAL_H
#define MT_RUNTIME_TOKENIZERS_HF_INTERNAL_H

#include "runtime/data/tokenizers/text_common.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

typedef struct pcre2_real_code_8 pcre2_code_8;
typedef struct pcre2_real_match_data_8 pcre2_match_data_8;
typedef struct pcre2_real_match_context_8 pcre2_match_context_8;
typedef struct pcre2_real_jit_stack_8 pcre2_jit_stack_8;

namespace mt::rt::hf {

// ---------------------------------------------------------------------------
// Strings -> ids: open addressing over an arena (no allocation per lookup).
class StringTable {
public:
  void reserve(size_t n);
  // Sets (or overwrites) the id of `key`; returns false when it overwrote.
  bool set(std::string_view key, int32_t id);
  int32_t find(const void *p, size_t n) const; // -1 when absent
  int32_t find(std::string_view s) const { return find(s.data(), s.size()); }
  size_t size() const { return entries_; }

private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = 0;
    int32_t id = -1; // -1: empty
  };
  void place(const Slot &s);
  std::vector<Slot> slots_;
  std::string keys_;
  size_t entries_ = 0;
};

// ---------------------------------------------------------------------------
// A pattern from tokenizer.json, written for Oniguruma (HF's SysRegex), run
// by PCRE2 (UTF, UCP, JIT) after \s, \p{L} and \p{N} are spelled out as
// Oniguruma's Unicode tables have them (text_common.h).
class Regex {
public:
  ~Regex();
  // On failure sets *error to PCRE2's message.
  bool compile(std::string_view onig, std::string *error);
  // A pattern that matches `literal` (HF's String patterns, regex-escaped).
  bool compile_literal(std::string_view literal, std::string *error);
  pcre2_code_8 *code = nullptr;
  bool jit = false;
};

// Per-thread PCRE2 state (match data and JIT stack), for any Regex.
class Matcher {
public:
  Matcher();
  ~Matcher();
  Matcher(const Matcher &) = delete;
  Matcher &operator=(const Matcher &) = delete;
  // Appends the matches of `re` in s[0, n) as Oniguruma's find_iter yields
  // them (an empty match right after the previous match is skipped), as
  // (start, end) pairs.
  void find_all(const Regex &re, const uint8_t *s, size_t n,
                std::vector<std::pair<uint32_t, uint32_t>> &out);

private:
  pcre2_match_data_8 *data_ = nullptr;
  pcre2_match_context_8 *context_ = nullptr;
  pcre2_jit_stack_8 *stack_ = nullptr;
};

// ---------------------------------------------------------------------------
// Normalizers (tokenizer.json "normalizer", Sequence flattened).
struct NormStep {
  enum Kind {
    NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, Precompiled, Bert, Nmt
  } kind;
  bool left = false, right = false; // Strip
  // BertNormalizer
  bool clean_text = true, chinese_chars = true, bert_strip_accents = true, lowercase = true;
  std::string text;                 // Prepend's prefix, Replace's content
  std::shared_ptr<Regex> regex;     // Replace's pattern
  // Precompiled: SentencePiece's precompiled_charsmap, a double-array trie
  // of UTF-8 keys whose values are offsets of \0-ended replacements.
  std::vector<uint32_t> trie;
  std::string replacements;
};

// ---------------------------------------------------------------------------
// Pre-tokenizers (tokenizer.json "pre_tokenizer", Sequence flattened).
enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreStep {
  enum Kind {
    Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation,
    CharDelimiterSplit, Bert
  } kind;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;            // Split
  std::shared_ptr<Regex> regex;   // Split; ByteLevel with use_regex; Whitespace
  bool add_prefix_space = false;  // ByteLevel
  bool map_bytes = false;         // ByteLevel before other steps: write the byte alphabet
  std::string replacement;        // Metaspace, as UTF-8
  uint32_t replacement_cp = 0;    // Metaspace; CharDelimiterSplit's delimiter
  enum { Always, First, Never } prepend = Always; // Metaspace
  bool split = true;              // Metaspace
  bool individual_digits = false; // Digits
};

// A piece of text on its way through the pipeline: bytes [off, off+len) of
// the encoder's arena, and whether it starts at offset 0 of the original
// text (Metaspace's prepend_scheme "first").
struct Piece {
  uint32_t off, len;
  bool first;
};

// Runs the normalizer steps on `text` in place (`tmp` is scratch). Returns
// false when the text's first character was removed (Strip, StripAccents,
// Replace with nothing), after which its start is no longer at offset 0 of
// the original (Metaspace's prepend_scheme "first" looks at that).
bool normalize(const std::vector<NormStep> &steps, Matcher &m, std::string &text,
               std::string &tmp);

// Scratch of the pre-tokenizers, reused across texts.
struct PreScratch {
  std::vector<Piece> next;
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  struct Segment {
    uint32_t start, end;
    bool match;
  };
  std::vector<Segment> segments;
};

// Runs the pre-tokenizer steps on `pieces` (of `arena`, to which rewritten
// text is appended), leaving the pre-tokens in `pieces`.
void pre_tokenize(const std::vector<PreStep> &steps, Matcher &m, std::string &arena,
                  std::vector<Piece> &pieces, PreScratch &s);

// The characters classes of Rust that HF uses, by Unicode property (ICU).
bool is_white_space(uint32_t cp);  // char::is_whitespace
bool is_word_char(uint32_t cp);    // regex's \w
// Decodes the well-formed UTF-8 character at p (n > 0 bytes), setting *len.
uint32_t decode_utf8(const uint8_t *p, size_t n, size_t *len);

// ---------------------------------------------------------------------------
// Models. `byte_level`: the pipeline ends in the ByteLevel pre-tokenizer, so
// pre-tokens are raw bytes and vocabulary keys are stored with GPT-2's byte
// alphabet undone; one symbol per byte. Otherwise one symbol per character.
struct ModelScratch;

class Model {
public:
  virtual ~Model();
  // Appends the ids of one pre-token (never empty).
  virtual void encode(const uint8_t *p, size_t n, ModelScratch &s,
                      std::vector<int32_t> &out) const = 0;
  // The model's token strings by id (as in tokenizer.json), for decode and
  // for ids of named tokens.
  std::vector<std::string> tokens;
  StringTable by_token; // tokenizer.json's strings -> ids
  // Number of distinct tokens (HF's get_vocab_size() of the model).
  size_t vocab_size = 0;
  bool byte_level = false;
};

struct ModelScratch {
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Merge {
    uint64_t order; // rank << 32 | position
    int32_t new_id;
    bool operator>(const Merge &o) const { return order > o.order; }
  };
  std::vector<Symbol> symbols;
  std::vector<Merge> heap;
  std::string key;
  struct Node {
    double score;
    int32_t id;
    int32_t start; // -1: not reached
  };
  std::vector<Node> lattice;
  std::vector<std::pair<uint32_t, uint32_t>> spans;
};

// The model of tokenizer.json ("model"), loaded from its JSON text (the
// simdjson element is passed as an opaque pointer to keep simdjson out of
// this header). On failure null and *error names the field.
std::unique_ptr<Model> load_model(const void *json_model, const std::string &path,
                                  bool byte_level, std::string *error);

} // namespace mt::rt::hf

#endif // MT_RUNTIME_TOKENIZERS_HF_INTERNAL_H
