// GPT-2's byte-level BPE (see gpt2_tokenizer.h): file loading, pre-tokenisation
// with PCRE2, the merge loop and the per-encoder cache.
//
// The algorithm follows OpenAI's gpt-2 src/encoder.py (bytes_to_unicode, the
// pre-tokenisation pattern, bpe()); the facts used are listed where they are
// used. Nothing here is copied from another implementation.
#include "runtime/data/tokenizers/gpt2_tokenizer.h"

#include "runtime/data/tokenizers/text_common.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_map>

namespace mt::rt {

using namespace tok;

namespace {

// ---------------------------------------------------------------------------
// Pre-tokenisation: GPT-2's pattern (encoder.py)
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with its classes spelled out (text_common.h says why).
// Every character is space, letter, number or other, so the matches tile the
// text; compiling ANCHORED changes nothing for that reason and lets JIT skip
// searching.


struct Pattern {
  pcre2_code *code = nullptr;
  bool jit = false;
  std::string error;

  Pattern() {
    int err = 0;
    PCRE2_SIZE offset = 0;
    std::string text = gpt2_split_pattern();
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      error = "PCRE2 rejects GPT-2's pattern: " + std::string(reinterpret_cast<char *>(buf)) +
              "; PCRE2 must be built with Unicode support";
      return;
    }
    // Without JIT (an unsupported CPU) the interpreter gives the same matches.
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pattern() { pcre2_code_free(code); }
};

// Compiled once per process; PCRE2 patterns, JIT code included, are read-only
// while matching and may be shared by threads.
const Pattern &pattern() {
  static const Pattern p;
  return p;
}

// Per-thread match state: PCRE2 needs its own match data and JIT stack per
// concurrent matcher.
struct Matcher {
  pcre2_match_data *data = nullptr;
  pcre2_match_context *context = nullptr;
  pcre2_jit_stack *stack = nullptr;

  Matcher() {
    const Pattern &pat = pattern();
    data = pcre2_match_data_create_from_pattern(pat.code, nullptr);
    context = pcre2_match_context_create(nullptr);
    // The pattern's repeats are single-character classes, which need little
    // stack; the 1 MiB ceiling is only a backstop.
    stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
    if (stack)
      pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~Matcher() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  Matcher(const Matcher &) = delete;
  Matcher &operator=(const Matcher &) = delete;

  // Length of the pre-token at `start` in the well-formed UTF-8 run [s, s+n).
  size_t next(const uint8_t *s, size_t n, size_t start) {
    const Pattern &pat = pattern();
    int rc;
    if (pat.jit)
      rc = pcre2_jit_match(pat.code, s, n, start, 0, data, context);
    else
      rc = pcre2_match(pat.code, s, n, start, PCRE2_NO_UTF_CHECK, data, context);
    if (rc > 0) {
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(data);
      if (ov[0] == start && ov[1] > start)
        return ov[1] - start;
    }
    // Unreachable for this pattern (every character matches some branch)
    // unless PCRE2 runs out of resources; one character keeps the round trip.
    return std::max<size_t>(1, utf8_sequence(s + start, n - start));
  }
};

// Calls piece(ptr, len) for each pre-token of text. Well-formed UTF-8 runs go
// through the pattern, each on its own (as if it were the whole text); every
// byte that does not start a well-formed sequence is a pre-token by itself.
// So "a\xffb" gives "a", "\xff", "b": bytes GPT-2 could never see (its Python
// reads text as str) keep their own tokens and decode back exactly.
template <typename F> void for_each_pretoken(Matcher &m, std::string_view text, F &&piece) {
  const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
  size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    size_t run = valid_utf8_prefix(p + i, n - i);
    for (size_t at = 0; at < run;) {
      size_t len = m.next(p + i, run, at);
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

// ---------------------------------------------------------------------------
// vocab.json: a strict reader for the one shape it has, a JSON object
// (RFC 8259) whose values are whole numbers.

struct VocabEntry {
  std::string key;   // as written in vocab.json (the byte alphabet), UTF-8
  int64_t id;
  size_t offset;     // where the value starts, for messages
};

class VocabJsonReader {
public:
  VocabJsonReader(const std::string &path, const std::string &text, std::string *error)
      : path_(path), text_(text), error_(error) {}

  bool read(std::vector<VocabEntry> &entries) {
    skip_ws();
    if (!expect('{', "expected '{': vocab.json is a JSON object of token -> id"))
      return false;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        VocabEntry e;
        skip_ws();
        if (peek() != '"')
          return fail(pos_, "expected a token string in double quotes");
        if (!read_string(e.key))
          return false;
        skip_ws();
        if (!expect(':', "expected ':' after the token string"))
          return false;
        skip_ws();
        e.offset = pos_;
        if (!read_id(e.id))
          return false;
        entries.push_back(std::move(e));
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        if (!expect('}', "expected ',' or '}' after the id"))
          return false;
        break;
      }
    }
    skip_ws();
    if (pos_ != text_.size())
      return fail(pos_, "unexpected text after the closing '}'");
    return true;
  }

  // "FILE:LINE:COL: error: what; fix" for byte offset `at`.
  std::string where(size_t at) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return path_ + ":" + std::to_string(line) + ":" + std::to_string(col);
  }

private:
  int peek() const { return pos_ < text_.size() ? static_cast<unsigned char>(text_[pos_]) : -1; }

  void skip_ws() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool fail(size_t at, const std::string &what) {
    std::string found = at < text_.size() ? "" : " (the file ends here)";
    *error_ = where(at) + ": error: malformed JSON: " + what + found +
              "; vocab.json must be GPT-2's JSON object of token -> id";
    return false;
  }

  bool expect(char c, const char *what) {
    if (peek() != static_cast<unsigned char>(c))
      return fail(pos_, what);
    ++pos_;
    return true;
  }

  bool hex4(uint32_t &v) {
    v = 0;
    for (int k = 0; k < 4; ++k) {
      int c = peek();
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0)
        return fail(pos_, "expected four hex digits after \\u");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return true;
  }

  bool read_string(std::string &out) {
    size_t open = pos_++;
    for (;;) {
      if (pos_ >= text_.size())
        return fail(open, "unterminated string");
      unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20)
        return fail(pos_, "control character in a string (write it as \\u00XX)");
      if (c >= 0x80) {
        size_t len = utf8_sequence(reinterpret_cast<const uint8_t *>(text_.data()) + pos_,
                                   text_.size() - pos_);
        if (len == 0)
          return fail(pos_, "invalid UTF-8");
        out.append(text_, pos_, len);
        pos_ += len;
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      size_t esc = pos_++;
      switch (peek()) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        ++pos_;
        uint32_t cp;
        if (!hex4(cp))
          return false;
        // JSON spells code points above U+FFFF as UTF-16 surrogate pairs.
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t low;
          if (peek() != '\\' || pos_ + 1 >= text_.size() || text_[pos_ + 1] != 'u')
            return fail(esc, "high surrogate \\u escape without a low surrogate after it");
          pos_ += 2;
          if (!hex4(low))
            return false;
          if (low < 0xDC00 || low > 0xDFFF)
            return fail(esc, "high surrogate \\u escape without a low surrogate after it");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return fail(esc, "low surrogate \\u escape without a high surrogate before it");
        }
        append_utf8(out, cp);
        continue; // pos_ is past the escape already
      }
      default:
        return fail(esc, "unknown escape in a string");
      }
      ++pos_;
    }
  }

  bool read_id(int64_t &id) {
    size_t start = pos_;
    int c = peek();
    if (c == '-')
      return fail(start, "negative id; ids are whole numbers from 0");
    if (c < '0' || c > '9')
      return fail(start, "expected a token id (a whole number)");
    if (c == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9')
      return fail(start, "leading zero in a number");
    id = 0;
    while (peek() >= '0' && peek() <= '9') {
      id = id * 10 + (peek() - '0');
      if (id > INT32_MAX)
        return fail(start, "id too large for a 32-bit token id");
      ++pos_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E')
      return fail(start, "ids must be whole numbers");
    return true;
  }

  const std::string &path_;
  const std::string &text_;
  std::string *error_;
  size_t pos_ = 0;
};

} // namespace

// ---------------------------------------------------------------------------
// The vocabulary.

struct Gpt2Vocabulary::Impl {
  std::string bytes;               // every token's bytes, by id
  std::vector<uint32_t> offsets;   // id -> [offsets[id], offsets[id+1]) in bytes
  int32_t eod = -1;
  int32_t byte_id[256];            // the single-byte tokens, BPE's starting symbols
  PairTable merges;
};

Gpt2Vocabulary::Gpt2Vocabulary(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Vocabulary::~Gpt2Vocabulary() = default;

size_t Gpt2Vocabulary::size() const { return impl_->offsets.size() - 1; }
int32_t Gpt2Vocabulary::eod_id() const { return impl_->eod; }

std::string_view Gpt2Vocabulary::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= size())
    return {};
  return std::string_view(impl_->bytes).substr(impl_->offsets[id],
                                               impl_->offsets[id + 1] - impl_->offsets[id]);
}

std::shared_ptr<const Gpt2Vocabulary>
Gpt2Vocabulary::load(const std::string &vocab_json_path, const std::string &merges_txt_path,
                     std::string *error) {
  std::string scratch;
  if (!error)
    error = &scratch;
  const Pattern &pat = pattern();
  if (!pat.code) {
    *error = "error: " + pat.error;
    return nullptr;
  }
  const ByteAlphabet &abc = alphabet();
  auto impl = std::make_unique<Impl>();

  // vocab.json.
  std::string text;
  if (!read_file(vocab_json_path, text, error))
    return nullptr;
  std::vector<VocabEntry> entries;
  VocabJsonReader reader(vocab_json_path, text, error);
  if (!reader.read(entries))
    return nullptr;
  if (entries.empty()) {
    *error = vocab_json_path + ": error: the vocabulary is empty; check that this is GPT-2's vocab.json";
    return nullptr;
  }
  std::unordered_map<std::string_view, int32_t> by_key;
  by_key.reserve(entries.size() * 2);
  for (const VocabEntry &e : entries) {
    if (!by_key.emplace(e.key, static_cast<int32_t>(e.id)).second) {
      *error = reader.where(e.offset) + ": error: token " + quoted(e.key) +
               " appears twice; each token needs exactly one id";
      return nullptr;
    }
  }
  // Ids must be exactly 0..N-1: sort by id and look for repeats, then gaps.
  std::vector<const VocabEntry *> by_id;
  by_id.reserve(entries.size());
  for (const VocabEntry &e : entries)
    by_id.push_back(&e);
  std::sort(by_id.begin(), by_id.end(), [](const VocabEntry *a, const VocabEntry *b) {
    return a->id != b->id ? a->id < b->id : a->offset < b->offset;
  });
  for (size_t i = 1; i < by_id.size(); ++i) {
    if (by_id[i]->id == by_id[i - 1]->id) {
      *error = reader.where(by_id[i]->offset) + ": error: id " + std::to_string(by_id[i]->id) +
               " is given to both " + quoted(by_id[i - 1]->key) + " and " + quoted(by_id[i]->key) +
               "; each token needs its own id";
      return nullptr;
    }
  }
  for (size_t i = 0; i < by_id.size(); ++i) {
    if (by_id[i]->id != static_cast<int64_t>(i)) {
      *error = vocab_json_path + ": error: no token has id " + std::to_string(i) + " (ids go up to " +
               std::to_string(by_id.back()->id) + "); ids must run from 0 to " +
               std::to_string(by_id.size() - 1) + " without gaps";
      return nullptr;
    }
  }
  // Token bytes: undo the byte alphabet. A character outside it (never the
  // case in GPT-2's file) stands for its own UTF-8 bytes.
  impl->offsets.reserve(by_id.size() + 1);
  for (const VocabEntry *e : by_id) {
    impl->offsets.push_back(static_cast<uint32_t>(impl->bytes.size()));
    const uint8_t *p = reinterpret_cast<const uint8_t *>(e->key.data());
    size_t n = e->key.size();
    for (size_t i = 0; i < n;) {
      size_t len = utf8_sequence(p + i, n - i); // well-formed: the reader checked
      uint32_t cp = len == 1   ? p[i]
                    : len == 2 ? ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu)
                               : 0x110000; // 3 and 4 bytes are never in the alphabet
      if (cp < 256 + 68 && abc.cp_to_byte[cp] >= 0)
        impl->bytes += static_cast<char>(abc.cp_to_byte[cp]);
      else
        impl->bytes.append(e->key, i, len);
      i += len;
    }
  }
  impl->offsets.push_back(static_cast<uint32_t>(impl->bytes.size()));

  for (int b = 0; b < 256; ++b) {
    std::string sym;
    append_utf8(sym, abc.byte_to_cp[b]);
    auto it = by_key.find(sym);
    if (it == by_key.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", b);
      *error = vocab_json_path + ": error: no token for byte " + hex + " (spelled " + quoted(sym) +
               "); a byte-level BPE vocabulary needs all 256 byte tokens";
      return nullptr;
    }
    impl->byte_id[b] = it->second;
  }
  auto eod = by_key.find("<|endoftext|>");
  if (eod == by_key.end()) {
    *error = vocab_json_path +
             ": error: no \"<|endoftext|>\" token; GPT-2's vocab.json has it (id 50256), "
             "check that this is a GPT-2 vocabulary";
    return nullptr;
  }
  impl->eod = eod->second;

  // merges.txt: an optional "#version" first line, then one "left right" pair
  // per line; the rank is the order (encoder.py).
  if (!read_file(merges_txt_path, text, error))
    return nullptr;
  size_t line_no = 0;
  std::vector<std::pair<std::string_view, size_t>> lines;
  for (size_t at = 0; at < text.size();) {
    size_t nl = text.find('\n', at);
    size_t end = nl == std::string::npos ? text.size() : nl;
    std::string_view line(text.data() + at, end - at);
    ++line_no;
    at = end + 1;
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    if (line_no == 1 && line.substr(0, 8) == "#version")
      continue;
    if (line.empty())
      continue;
    lines.emplace_back(line, line_no);
  }
  impl->merges.reserve(lines.size());
  std::string joined;
  for (size_t rank = 0; rank < lines.size(); ++rank) {
    auto [line, no] = lines[rank];
    std::string where = merges_txt_path + ":" + std::to_string(no) + ": error: ";
    size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      *error = where + "expected two symbols separated by one space, got " + quoted(line) +
               "; each line of merges.txt is a pair such as \"\xC4\xA0 t\"";
      return nullptr;
    }
    std::string_view left = line.substr(0, space), right = line.substr(space + 1);
    if (valid_utf8_prefix(reinterpret_cast<const uint8_t *>(line.data()), line.size()) != line.size()) {
      *error = where + "invalid UTF-8; merges.txt must be UTF-8 text";
      return nullptr;
    }
    auto l = by_key.find(left), r = by_key.find(right);
    for (auto [it, sym] : {std::pair{l, left}, std::pair{r, right}}) {
      if (it == by_key.end()) {
        *error = where + "symbol " + quoted(sym) +
                 " is not in vocab.json; the two files must come from the same tokenizer";
        return nullptr;
      }
    }
    joined.assign(left);
    joined.append(right);
    auto merged = by_key.find(joined);
    if (merged == by_key.end()) {
      *error = where + "the merged symbol " + quoted(joined) +
               " is not in vocab.json; the two files must come from the same tokenizer";
      return nullptr;
    }
    if (!impl->merges.insert(l->second, r->second,
                             {static_cast<int32_t>(rank), merged->second})) {
      *error = where + "the pair " + quoted(line) + " was already listed; each merge appears once";
      return nullptr;
    }
  }
  return std::make_shared<const Gpt2Vocabulary>(std::move(impl));
}

// ---------------------------------------------------------------------------
// The encoder.

namespace {

// Scratch for the merge loop, reused across pieces.
struct BpeScratch {
  struct Symbol {
    int32_t id;   // -1 once merged into the symbol on its left
    int32_t prev; // linked list over byte positions
    int32_t next;
  };
  struct Candidate {
    uint64_t order; // rank << 32 | position: lowest rank first, then leftmost
    int32_t left, right, merged;
    bool operator>(const Candidate &o) const { return order > o.order; }
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap, deferred;
};

} // namespace

struct Gpt2Encoder::State {
  Matcher matcher;
  PieceCache cache;
  BpeScratch scratch;
};

Gpt2Encoder::Gpt2Encoder(std::shared_ptr<const Gpt2Vocabulary> vocab)
    : vocab_(std::move(vocab)), state_(std::make_unique<State>()) {}
Gpt2Encoder::~Gpt2Encoder() = default;

namespace {

// GPT-2's bpe() on the bytes of one pre-token, appending ids to `out`.
//
// encoder.py repeats: take the adjacent pair of lowest rank, merge every
// occurrence of it left to right, until no pair has a rank. Here candidate
// pairs sit in a heap ordered by (rank, position), so one pre-token costs
// O(n log n) rather than O(n^2) (long runs of one character happen). A pair
// made during the sweep of rank R whose own rank is below R waits until the
// sweep ends, as encoder.py only looks for the next pair after a whole sweep.
void bpe(const Gpt2Vocabulary::Impl &v, BpeScratch &st, const uint8_t *p, size_t n,
         std::vector<int32_t> &out) {
  using Symbol = BpeScratch::Symbol;
  using Candidate = BpeScratch::Candidate;
  auto &sym = st.symbols;
  auto &heap = st.heap;
  auto &deferred = st.deferred;
  sym.resize(n);
  heap.clear();
  deferred.clear();
  for (size_t i = 0; i < n; ++i)
    sym[i] = Symbol{v.byte_id[p[i]], static_cast<int32_t>(i) - 1,
                    i + 1 < n ? static_cast<int32_t>(i + 1) : -1};

  auto greater = std::greater<Candidate>();
  auto consider = [&](int32_t pos, int32_t limit_rank, bool in_sweep) {
    int32_t next = sym[pos].next;
    if (next < 0)
      return;
    const PairTable::Merge *m = v.merges.find(sym[pos].id, sym[next].id);
    if (!m)
      return;
    Candidate c{(uint64_t(uint32_t(m->rank)) << 32) | uint32_t(pos), sym[pos].id, sym[next].id,
                m->id};
    if (in_sweep && m->rank < limit_rank) {
      deferred.push_back(c);
    } else {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), greater);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i)
    consider(static_cast<int32_t>(i), 0, false);

  int32_t sweep_rank = -1;
  for (;;) {
    if (!deferred.empty() &&
        (heap.empty() || static_cast<int32_t>(heap.front().order >> 32) != sweep_rank)) {
      for (const Candidate &c : deferred) {
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), greater);
      }
      deferred.clear();
    }
    if (heap.empty())
      break;
    std::pop_heap(heap.begin(), heap.end(), greater);
    Candidate c = heap.back();
    heap.pop_back();
    int32_t pos = static_cast<int32_t>(c.order & 0xFFFFFFFFu);
    int32_t next = sym[pos].next;
    // Stale when either side has changed since the pair was seen; a position's
    // symbol only ever grows, so equal ids mean the same symbols.
    if (sym[pos].id != c.left || next < 0 || sym[next].id != c.right)
      continue;
    sweep_rank = static_cast<int32_t>(c.order >> 32);
    sym[pos].id = c.merged;
    sym[pos].next = sym[next].next;
    if (sym[next].next >= 0)
      sym[sym[next].next].prev = pos;
    sym[next].id = -1;
    if (sym[pos].prev >= 0)
      consider(sym[pos].prev, sweep_rank, true);
    consider(pos, sweep_rank, true);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next)
    out.push_back(sym[i].id);
}

} // namespace

void Gpt2Encoder::encode(std::string_view text, std::vector<int32_t> &out) {
  const Gpt2Vocabulary::Impl &v = vocab_->impl();
  State &st = *state_;
  for_each_pretoken(st.matcher, text, [&](const uint8_t *p, size_t n) {
    if (n == 1) {
      out.push_back(v.byte_id[p[0]]);
      return;
    }
    uint64_t h = hash_bytes(p, n);
    size_t count;
    if (const int32_t *ids = st.cache.find(p, n, h, &count)) {
      out.insert(out.end(), ids, ids + count);
      return;
    }
    size_t first = out.size();
    bpe(v, st.scratch, p, n, out);
    st.cache.insert(p, n, h, out.data() + first, out.size() - first);
  });
}

// Ids outside the vocabulary decode to nothing (callers that read ids from
// files check them against size() first, as mt-dataset verify does).
std::string Gpt2Encoder::decode(const int32_t *ids, size_t n) const {
  std::string out;
  size_t total = 0;
  for (size_t i = 0; i < n; ++i)
    total += vocab_->token_bytes(ids[i]).size();
  out.reserve(total);
  for (size_t i = 0; i < n; ++i)
    out.append(vocab_->token_bytes(ids[i]));
  return out;
}

// For the unit test, which declares it: the pre-tokens of `text`, to check the
// split against the pattern's semantics without going through a vocabulary.
std::vector<std::string> gpt2_pretokens_for_test(std::string_view text) {
  Matcher m;
  std::vector<std::string> out;
  for_each_pretoken(m, text, [&](const uint8_t *p, size_t n) {
    out.emplace_back(reinterpret_cast<const char *>(p), n);
  });
  return out;
}

} // namespace mt::rt
