// Megatron's TikTokenizer (see tiktoken_tokenizer.h): the JSON vocabulary,
// the split patterns through PCRE2, special tokens, and tiktoken's merge.
//
// Facts used, from Megatron-LM's source (megatron/core/tokenizers/text/
// libraries/tiktoken_tokenizer.py of core 0.16-0.17; CustomTikTokenizer in
// megatron/training/tokenizer/tokenizer.py for --legacy-tokenizer) and
// tiktoken's (src/lib.rs: byte_pair_merge, encode_native):
// - The file is a JSON list; entry i is {"rank": i, "token_bytes": base64,
//   "token_str": ...} and nothing else, the first 256 are the single bytes
//   0..255 in order. Only the first vocab_size - num_special_tokens entries
//   are read, and there must be that many. Entry i gets id i + num_special.
// - Ids [0, num_special) are the special tokens, then <SPECIAL_k> fillers.
//   vocab_size is --vocab-size (2^17 when not given); eod is "</s>".
// - Current Megatron encodes with allowed_special="all": special-token text
//   in the input becomes its id, and the split pattern runs on the text
//   between them as if each were a whole text. The legacy class encodes
//   special-token text as plain text (encode_ordinary).
// - A piece that is a token as a whole is that token; otherwise its bytes
//   merge, lowest rank first (leftmost on ties), while some adjacent pair
//   concatenates to a token.
#include "runtime/data/tokenizers/tiktoken_tokenizer.h"

#include "runtime/data/tokenizers/text_common.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <simdjson.h>

#include <algorithm>
#include <array>
#include <functional>
#include <unordered_map>

namespace mt::rt {

using namespace tok;

namespace {

constexpr int64_t kDefaultVocabSize = int64_t(1) << 17; // Megatron's 131072

const std::vector<std::string> &required_specials(bool legacy) {
  static const std::vector<std::string> current = {"<unk>",  "<s>",   "</s>", "<mask>",
                                                   "<pad>", "<cls>", "<sep>"};
  static const std::vector<std::string> old = {"<unk>", "<s>", "</s>"};
  return legacy ? old : current;
}

// The special tokens as Megatron lists them: the flag's (or the defaults),
// then <SPECIAL_k> up to num_special_tokens.
std::vector<std::string> special_tokens(const TokenizerOptions &o) {
  std::vector<std::string> s = !o.special_tokens.empty()          ? o.special_tokens
                               : !o.tiktoken_special_tokens.empty() ? o.tiktoken_special_tokens
                                                                    : required_specials(o.legacy);
  for (int64_t i = int64_t(s.size()); i < o.tiktoken_num_special_tokens; ++i)
    s.push_back("<SPECIAL_" + std::to_string(i) + ">");
  return s;
}

const char *special_flag(const TokenizerOptions &o) {
  return !o.special_tokens.empty() ? "--tokenizer-special-tokens" : "--tiktoken-special-tokens";
}

// ---------------------------------------------------------------------------
// The split patterns (Megatron's _PATTERN_TIKTOKEN_V1 / _V2):
//   v1 [^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+
//   v2 [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
//      |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
//      |\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with the classes spelled out as text_common.h does for GPT-2: tiktoken's
// regex engine has Unicode 16 tables, Debian's PCRE2 10.42 Unicode 14. The
// additions below are what tiktoken 0.14 puts in each class and PCRE2 does
// not, found by probing every code point (a piece "r c r", r in the class,
// stays whole under `[C]+|[^C]` exactly when c is in C); PCRE2 has nothing
// tiktoken lacks except U+180E in \s, which kSpace leaves out. \p{L} and
// \p{N} gain exactly text_common.h's additions.

const char kUpper[] = "A-Z\\p{Lu}\\x{1C89}\\x{A7CB}-\\x{A7CC}\\x{A7DA}\\x{A7DC}\\x{10D50}-\\x{10D65}";
const char kLower[] =
    "a-z\\p{Ll}\\x{1C8A}\\x{A7CD}\\x{A7DB}\\x{10D70}-\\x{10D85}\\x{1DF25}-\\x{1DF2A}";
const char kTitle[] = "\\p{Lt}";
const char kModifier[] = "\\p{Lm}\\x{10D4E}\\x{10D6F}\\x{16D40}-\\x{16D42}\\x{16D6B}-\\x{16D6C}"
                         "\\x{1E030}-\\x{1E06D}\\x{1E4EB}";
const char kOtherLetter[] =
    "\\p{Lo}\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D4D}\\x{10D4F}\\x{10EC2}-\\x{10EC4}"
    "\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}"
    "\\x{113B7}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}"
    "\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}"
    "\\x{16100}-\\x{1611D}\\x{16D43}-\\x{16D6A}\\x{18CFF}\\x{1B132}\\x{1B155}"
    "\\x{1E4D0}-\\x{1E4EA}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}"
    "\\x{31350}-\\x{323AF}";
const char kMark[] =
    "\\p{M}\\x{897}\\x{CF3}\\x{ECE}\\x{10D69}-\\x{10D6D}\\x{10EFC}-\\x{10EFF}\\x{11241}"
    "\\x{113B8}-\\x{113C0}\\x{113C2}\\x{113C5}\\x{113C7}-\\x{113CA}\\x{113CC}-\\x{113D0}"
    "\\x{113D2}\\x{113E1}-\\x{113E2}\\x{11F00}-\\x{11F01}\\x{11F03}\\x{11F34}-\\x{11F3A}"
    "\\x{11F3E}-\\x{11F42}\\x{11F5A}\\x{13440}\\x{13447}-\\x{13455}\\x{1611E}-\\x{1612F}"
    "\\x{1E08F}\\x{1E4EC}-\\x{1E4EF}\\x{1E5EE}-\\x{1E5EF}";

std::string split_pattern(const std::string &version) {
  std::string s = kSpace, l = kLetter, n = kNumber;
  std::string not_crlf_l_n = "[^\\r\\n" + l + n + "]", not_s_l_n = "[^" + s + l + n + "]";
  std::string tail = "[" + s + "]+(?![^" + s + "])|[" + s + "]+";
  if (version == "v1")
    return not_crlf_l_n + "?+[" + l + "]+|[" + n + "]| ?" + not_s_l_n + "++[\\r\\n]*|[" + s +
           "]*[\\r\\n]|" + tail;
  std::string upper = std::string("[") + kUpper + kTitle + kModifier + kOtherLetter + kMark + "]";
  std::string lower = std::string("[") + kLower + kModifier + kOtherLetter + kMark + "]";
  return not_crlf_l_n + "?" + upper + "*" + lower + "+|" + not_crlf_l_n + "?" + upper + "+" +
         lower + "*|[" + n + "]| ?" + not_s_l_n + "+[\\r\\n/]*|[" + s + "]*[\\r\\n]+|" + tail;
}

// A compiled pattern, shared read-only by the encoders (PCRE2 allows that).
struct SplitPattern {
  pcre2_code *code = nullptr;
  bool jit = false;

  explicit SplitPattern(const std::string &version, std::string *error) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    std::string text = split_pattern(version);
    // Every character is a letter, mark, number, space or other, and each
    // branch set matches at any of them, so the matches tile the text:
    // ANCHORED matching at the end of the last match is tiktoken's find_iter.
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      *error = "error: PCRE2 rejects tiktoken's " + version +
               " pattern: " + std::string(reinterpret_cast<char *>(buf)) +
               "; PCRE2 must be built with Unicode support";
      return;
    }
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~SplitPattern() { pcre2_code_free(code); }
  SplitPattern(const SplitPattern &) = delete;
  SplitPattern &operator=(const SplitPattern &) = delete;
};

// Per-encoder match state.
class Splitter {
public:
  explicit Splitter(const SplitPattern &p) : pat_(p) {
    data_ = pcre2_match_data_create_from_pattern(p.code, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    // v1's possessive and v2's classes repeat single characters: little stack.
    stack_ = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
    if (stack_)
      pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  ~Splitter() {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  Splitter(const Splitter &) = delete;
  Splitter &operator=(const Splitter &) = delete;

  // Calls piece(ptr, len) for each piece of text. Well-formed UTF-8 runs are
  // split by the pattern; a byte that starts no well-formed sequence is a
  // piece by itself (tiktoken never sees one: Python hands it str).
  template <typename F> void split(std::string_view text, F &&piece) {
    const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
    size_t n = text.size();
    for (size_t i = 0; i < n;) {
      size_t run = valid_utf8_prefix(p + i, n - i);
      for (size_t at = 0; at < run;) {
        size_t len = next(p + i, run, at);
        piece(p + i + at, len);
        at += len;
      }
      i += run;
      if (i < n) {
        piece(p + i, size_t(1));
        ++i;
      }
    }
  }

private:
  size_t next(const uint8_t *s, size_t n, size_t start) {
    int rc = pat_.jit ? pcre2_jit_match(pat_.code, s, n, start, 0, data_, context_)
                      : pcre2_match(pat_.code, s, n, start, PCRE2_NO_UTF_CHECK, data_, context_);
    if (rc > 0) {
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(data_);
      if (ov[0] == start && ov[1] > start)
        return ov[1] - start;
    }
    // Unreachable (the matches tile) unless PCRE2 runs out of resources.
    return std::max<size_t>(1, utf8_sequence(s + start, n - start));
  }

  const SplitPattern &pat_;
  pcre2_match_data *data_ = nullptr;
  pcre2_match_context *context_ = nullptr;
  pcre2_jit_stack *stack_ = nullptr;
};

// ---------------------------------------------------------------------------
// Base64 (RFC 4648's standard alphabet, padded), as the file writes
// token_bytes. False on anything else.
bool base64_decode(std::string_view in, std::string &out) {
  static const auto table = [] {
    std::array<int8_t, 256> t;
    t.fill(-1);
    const char *abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i)
      t[uint8_t(abc[i])] = int8_t(i);
    return t;
  }();
  out.clear();
  if (in.size() % 4 != 0)
    return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad || (v[k] = table[uint8_t(c)]) < 0)
        return false;
    }
    uint32_t w = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | uint32_t(v[3]);
    out += char(w >> 16);
    if (pad < 2)
      out += char((w >> 8) & 0xFF);
    if (pad < 1)
      out += char(w & 0xFF);
  }
  return true;
}

// ---------------------------------------------------------------------------

class TikTokenizer final : public Tokenizer {
public:
  std::string path, pattern_name;
  bool legacy = false;
  size_t size = 0;
  int32_t eod_id = 0;
  int32_t num_special = 0;
  std::vector<std::string> specials;  // ids 0..num_special-1
  std::string bytes;                  // token bytes, id - num_special order
  std::vector<uint32_t> offsets;      // into bytes; one more than tokens
  std::unordered_map<std::string_view, int32_t> by_bytes; // token bytes -> id
  PairTable merges;                   // (left id, right id) -> the token they make
  std::unique_ptr<SplitPattern> pattern;
  // Special tokens in text (current Megatron only): their first bytes, their
  // lengths longest first, and text -> id.
  bool first_byte[256] = {};
  std::vector<size_t> special_lengths;
  std::unordered_map<std::string_view, int32_t> special_ids;

  std::string_view token(int32_t id) const {
    size_t k = size_t(id - num_special);
    return std::string_view(bytes).substr(offsets[k], offsets[k + 1] - offsets[k]);
  }

  size_t vocab_size() const override { return size; }
  int32_t eod() const override { return eod_id; }
  std::unique_ptr<TokenEncoder> encoder() const override;
  std::string decode(const int32_t *ids, size_t n) const override {
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      int32_t id = ids[i];
      if (id >= 0 && id < num_special)
        out += specials[id];
      else if (id >= num_special && size_t(id - num_special) + 1 < offsets.size())
        out += token(id);
      else
        out += "<id " + std::to_string(id) + ">";
    }
    return out;
  }
  std::string describe() const override {
    return "TikTokenizer (" + path + ", pattern " + pattern_name + ", " +
           std::to_string(num_special) + " special tokens, vocab " + std::to_string(size) +
           (legacy ? ", --legacy-tokenizer)" : ", Megatron-Core)");
  }
};

// Scratch for the merge, reused across pieces.
struct MergeScratch {
  struct Part {
    int32_t id;   // -1 once merged into the part on its left
    int32_t next; // next part's start, -1 at the end
    int32_t prev;
  };
  struct Candidate {
    uint64_t order; // rank << 32 | start: lowest rank first, then leftmost
    int32_t left, right, merged;
    bool operator>(const Candidate &o) const { return order > o.order; }
  };
  std::vector<Part> parts;
  std::vector<Candidate> heap;
};

// tiktoken's byte_pair_merge on one piece: while some adjacent pair
// concatenates to a token, merge the pair whose token has the lowest rank
// (leftmost on ties). A heap of (rank, start) with stale entries skipped
// gives the same choices in O(n log n).
void merge(const TikTokenizer &t, MergeScratch &st, const uint8_t *p, size_t n,
           std::vector<int32_t> &out) {
  using Candidate = MergeScratch::Candidate;
  auto &parts = st.parts;
  auto &heap = st.heap;
  parts.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i)
    parts[i] = {t.num_special + p[i], i + 1 < n ? int32_t(i + 1) : -1, int32_t(i) - 1};
  auto greater = std::greater<Candidate>();
  auto consider = [&](int32_t at) {
    int32_t next = parts[at].next;
    if (next < 0)
      return;
    const PairTable::Merge *m = t.merges.find(parts[at].id, parts[next].id);
    if (!m)
      return;
    heap.push_back({(uint64_t(uint32_t(m->rank)) << 32) | uint32_t(at), parts[at].id,
                    parts[next].id, m->id});
    std::push_heap(heap.begin(), heap.end(), greater);
  };
  for (size_t i = 0; i + 1 < n; ++i)
    consider(int32_t(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    Candidate c = heap.back();
    heap.pop_back();
    int32_t at = int32_t(c.order & 0xFFFFFFFFu);
    int32_t next = parts[at].next;
    // Stale when either side changed since; a part only grows, so equal ids
    // mean the same parts.
    if (parts[at].id != c.left || next < 0 || parts[next].id != c.right)
      continue;
    parts[at].id = c.merged;
    parts[at].next = parts[next].next;
    if (parts[next].next >= 0)
      parts[parts[next].next].prev = at;
    parts[next].id = -1;
    if (parts[at].prev >= 0)
      consider(parts[at].prev);
    consider(at);
  }
  for (int32_t i = 0; i >= 0; i = parts[i].next)
    out.push_back(parts[i].id);
}

class TikEncoder final : public TokenEncoder {
public:
  explicit TikEncoder(const TikTokenizer &t) : t_(t), splitter_(*t.pattern) {}

  void encode(std::string_view text, std::vector<int32_t> &out) override {
    if (t_.legacy || t_.special_ids.empty()) {
      ordinary(text, out);
      return;
    }
    // encode_native with every special token allowed: the leftmost special
    // token ends the segment the pattern splits.
    const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
    size_t n = text.size(), start = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!t_.first_byte[p[i]])
        continue;
      for (size_t len : t_.special_lengths) {
        if (len > n - i)
          continue;
        auto it = t_.special_ids.find(text.substr(i, len));
        if (it == t_.special_ids.end())
          continue;
        ordinary(text.substr(start, i - start), out);
        out.push_back(it->second);
        start = i + len;
        i = start - 1;
        break;
      }
    }
    ordinary(text.substr(start), out);
  }

private:
  void ordinary(std::string_view text, std::vector<int32_t> &out) {
    splitter_.split(text, [&](const uint8_t *p, size_t n) {
      if (n == 1) {
        out.push_back(t_.num_special + p[0]);
        return;
      }
      uint64_t h = hash_bytes(p, n);
      size_t count;
      if (const int32_t *ids = cache_.find(p, n, h, &count)) {
        out.insert(out.end(), ids, ids + count);
        return;
      }
      size_t first = out.size();
      auto whole = t_.by_bytes.find(std::string_view(reinterpret_cast<const char *>(p), n));
      if (whole != t_.by_bytes.end())
        out.push_back(whole->second);
      else
        merge(t_, scratch_, p, n, out);
      cache_.insert(p, n, h, out.data() + first, out.size() - first);
    });
  }

  const TikTokenizer &t_;
  Splitter splitter_;
  PieceCache cache_;
  MergeScratch scratch_;
};

std::unique_ptr<TokenEncoder> TikTokenizer::encoder() const {
  return std::make_unique<TikEncoder>(*this);
}

const char *json_type(simdjson::dom::element_type t) {
  switch (t) {
  case simdjson::dom::element_type::ARRAY: return "a list";
  case simdjson::dom::element_type::OBJECT: return "an object";
  case simdjson::dom::element_type::STRING: return "a string";
  case simdjson::dom::element_type::BOOL: return "a boolean";
  case simdjson::dom::element_type::NULL_VALUE: return "null";
  default: return "a number";
  }
}

} // namespace

std::string check_tiktoken_options(const TokenizerOptions &o) {
  const char *who = o.legacy ? "--legacy-tokenizer's TikTokenizer" : "TikTokenizer";
  if (o.model.empty())
    return std::string(who) + " needs --tokenizer-model (Megatron's tiktoken .json vocabulary)";
  if (o.legacy && o.tiktoken_pattern.empty())
    return "--legacy-tokenizer's TikTokenizer needs --tiktoken-pattern v1 or v2";
  if (o.sentencepiece_legacy)
    return "--tokenizer-sentencepiece-legacy is for the SentencePiece types, not TikTokenizer";
  if (!o.special_tokens.empty() && !o.tiktoken_special_tokens.empty() &&
      o.special_tokens != o.tiktoken_special_tokens)
    return "--tokenizer-special-tokens and --tiktoken-special-tokens differ; give one "
           "(--tiktoken-special-tokens is Megatron's deprecated name for the other)";
  int64_t vocab = o.vocab_size.value_or(kDefaultVocabSize);
  const char *flag = special_flag(o);
  std::vector<std::string> given = !o.special_tokens.empty() ? o.special_tokens
                                   : !o.tiktoken_special_tokens.empty()
                                       ? o.tiktoken_special_tokens
                                       : required_specials(o.legacy);
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i].empty())
      return std::string(flag) + ": a special token cannot be empty";
    for (size_t j = 0; j < i; ++j)
      if (given[j] == given[i])
        return std::string(flag) + " lists \"" + given[i] + "\" twice; special tokens are unique";
  }
  for (const std::string &r : required_specials(o.legacy))
    if (std::find(given.begin(), given.end(), r) == given.end()) {
      std::string all;
      for (const std::string &s : required_specials(o.legacy))
        all += (all.empty() ? "" : " ") + s;
      return std::string(flag) + " lacks \"" + r + "\"; " + who + " needs " + all;
    }
  if (int64_t(given.size()) > o.tiktoken_num_special_tokens)
    return std::string(flag) + " gives " + std::to_string(given.size()) +
           " special tokens, more than --tiktoken-num-special-tokens " +
           std::to_string(o.tiktoken_num_special_tokens);
  if (o.tiktoken_num_special_tokens >= vocab)
    return "--tiktoken-num-special-tokens " + std::to_string(o.tiktoken_num_special_tokens) +
           " leaves no room in the vocabulary of " + std::to_string(vocab) +
           (o.vocab_size ? "" : " (Megatron's default; set --vocab-size)");
  if (vocab > INT32_MAX)
    return "TikTokenizer's --vocab-size " + std::to_string(vocab) + " is too large: ids are int32";
  for (int64_t i = int64_t(given.size()); i < o.tiktoken_num_special_tokens; ++i) {
    std::string filler = "<SPECIAL_" + std::to_string(i) + ">";
    if (std::find(given.begin(), given.end(), filler) != given.end())
      return std::string(flag) + " names \"" + filler + "\", which is also the filler at id " +
             std::to_string(i) + "; special tokens are unique";
  }
  return "";
}

std::shared_ptr<const Tokenizer> load_tiktoken_tokenizer(const TokenizerOptions &o,
                                                         std::string *error) {
  const std::string &path = o.model;
  auto t = std::make_shared<TikTokenizer>();
  t->path = path;
  t->legacy = o.legacy;
  t->pattern_name = o.tiktoken_pattern.empty() ? "v2" : o.tiktoken_pattern;
  t->size = size_t(o.vocab_size.value_or(kDefaultVocabSize));
  t->specials = special_tokens(o);
  t->num_special = int32_t(t->specials.size());
  t->eod_id = int32_t(std::find(t->specials.begin(), t->specials.end(), "</s>") -
                      t->specials.begin());
  const size_t inner = t->size - size_t(t->num_special);

  if (path.size() < 5 || path.compare(path.size() - 5, 5, ".json") != 0) {
    *error = path + ": error: TikTokenizer reads Megatron's tiktoken vocabulary, a .json file "
                    "(Megatron asserts the name ends in .json)";
    return nullptr;
  }
  std::string text;
  if (!read_file(path, text, error))
    return nullptr;
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(text).get(root)) {
    *error = path + ": error: not valid JSON (" + simdjson::error_message(err) +
             "); TikTokenizer's file is a JSON list of {\"rank\", \"token_bytes\", \"token_str\"}";
    return nullptr;
  }
  simdjson::dom::array list;
  if (root.get(list)) {
    *error = path + ": error: the file is " + json_type(root.type()) +
             ", not a JSON list of {\"rank\", \"token_bytes\", \"token_str\"}";
    return nullptr;
  }
  size_t entries = list.size();
  if (entries < inner) {
    *error = path + ": error: " + std::to_string(entries) + " tokens, but vocabulary size " +
             std::to_string(t->size) + (o.vocab_size ? "" : " (Megatron's default)") +
             " less " + std::to_string(t->num_special) + " special tokens needs " +
             std::to_string(inner) + "; pass --vocab-size " +
             std::to_string(entries + size_t(t->num_special)) +
             " (Megatron requires the file to fill every id below the vocabulary size)";
    return nullptr;
  }
  t->offsets.reserve(inner + 1);
  t->by_bytes.reserve(inner * 2);
  std::string decoded;
  size_t i = 0;
  for (simdjson::dom::element e : list) {
    if (i == inner)
      break;
    std::string where = path + ": entry " + std::to_string(i) + ": error: ";
    simdjson::dom::object obj;
    if (e.get(obj)) {
      *error = where + "expected an object {\"rank\", \"token_bytes\", \"token_str\"}, got " +
               json_type(e.type());
      return nullptr;
    }
    bool has_rank = false, has_bytes = false, has_str = false;
    for (auto field : obj) {
      std::string_view key = field.key;
      if (key == "rank") {
        int64_t rank;
        if (field.value.get(rank)) {
          *error = where + "\"rank\" is " + json_type(field.value.type()) + ", not a whole number";
          return nullptr;
        }
        if (rank != int64_t(i)) {
          *error = where + "\"rank\" is " + std::to_string(rank) + "; entry i must have rank i";
          return nullptr;
        }
        has_rank = true;
      } else if (key == "token_bytes") {
        std::string_view b64;
        if (field.value.get(b64) || !base64_decode(b64, decoded)) {
          *error = where + "\"token_bytes\" is not base64 text";
          return nullptr;
        }
        has_bytes = true;
      } else if (key == "token_str") {
        has_str = true;
      } else {
        *error = where + "unexpected field " + tok::quoted(key) +
                 "; an entry has exactly \"rank\", \"token_bytes\" and \"token_str\"";
        return nullptr;
      }
    }
    for (auto [has, name] : {std::pair{has_rank, "rank"}, std::pair{has_bytes, "token_bytes"},
                             std::pair{has_str, "token_str"}})
      if (!has) {
        *error = where + "no \"" + name + "\" field; an entry has \"rank\", \"token_bytes\" "
                                          "and \"token_str\"";
        return nullptr;
      }
    if (i < 256 && (decoded.size() != 1 || uint8_t(decoded[0]) != i)) {
      *error = where + "token_bytes is " + tok::quoted(decoded) +
               "; the first 256 entries are the single bytes 0 to 255, in order";
      return nullptr;
    }
    if (decoded.empty()) {
      *error = where + "token_bytes is empty; a token has at least one byte";
      return nullptr;
    }
    t->offsets.push_back(uint32_t(t->bytes.size()));
    t->bytes += decoded;
    ++i;
  }
  t->offsets.push_back(uint32_t(t->bytes.size()));
  for (size_t k = 0; k < inner; ++k) {
    int32_t id = t->num_special + int32_t(k);
    auto [it, fresh] = t->by_bytes.emplace(t->token(id), id);
    if (!fresh) {
      *error = path + ": entry " + std::to_string(k) + ": error: token_bytes " +
               tok::quoted(t->token(id)) + " repeat entry " + std::to_string(it->second - t->num_special) +
               "'s; each token appears once";
      return nullptr;
    }
  }
  // Every split of a token into two tokens is a merge to it.
  size_t pairs = 0;
  for (size_t k = 0; k < inner; ++k)
    pairs += t->offsets[k + 1] - t->offsets[k] - 1;
  t->merges.reserve(pairs);
  for (size_t k = 256; k < inner; ++k) {
    int32_t id = t->num_special + int32_t(k);
    std::string_view tok = t->token(id);
    for (size_t cut = 1; cut < tok.size(); ++cut) {
      auto l = t->by_bytes.find(tok.substr(0, cut)), r = t->by_bytes.find(tok.substr(cut));
      if (l != t->by_bytes.end() && r != t->by_bytes.end())
        t->merges.insert(l->second, r->second, {id, id});
    }
  }
  std::string pattern_error;
  t->pattern = std::make_unique<SplitPattern>(t->pattern_name, &pattern_error);
  if (!t->pattern->code) {
    *error = pattern_error;
    return nullptr;
  }
  if (!o.legacy) {
    for (int32_t id = 0; id < t->num_special; ++id) {
      std::string_view s = t->specials[id];
      t->special_ids.emplace(s, id);
      t->first_byte[uint8_t(s[0])] = true;
      if (std::find(t->special_lengths.begin(), t->special_lengths.end(), s.size()) ==
          t->special_lengths.end())
        t->special_lengths.push_back(s.size());
    }
    std::sort(t->special_lengths.rbegin(), t->special_lengths.rend());
  }
  return t;
}

std::vector<std::string> tiktoken_pretokens_for_test(const std::string &pattern,
                                                     std::string_view text) {
  std::string error;
  SplitPattern p(pattern, &error);
  Splitter s(p);
  std::vector<std::string> out;
  s.split(text, [&](const uint8_t *b, size_t n) {
    out.emplace_back(reinterpret_cast<const char *>(b), n);
  });
  return out;
}

} // namespace mt::rt
