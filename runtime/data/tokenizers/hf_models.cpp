// The models of a Hugging Face tokenizer.json: BPE (merges by rank, byte
// fallback, unknown tokens, ignore_merges), Unigram (Viterbi over the
// pieces' scores) and WordLevel, each as HF `tokenizers` 0.23 encodes one
// pre-token (models/bpe/model.rs and word.rs, models/unigram/model.rs).
#include "runtime/data/tokenizers/hf_internal.h"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <unordered_map>

namespace mt::rt::hf {

using namespace tok;

// ---------------------------------------------------------------------------
// StringTable

void StringTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2)
    cap <<= 1;
  if (cap <= slots_.size())
    return;
  std::vector<Slot> old(cap);
  old.swap(slots_);
  for (const Slot &s : old)
    if (s.id >= 0)
      place(s);
}

void StringTable::place(const Slot &s) {
  size_t mask = slots_.size() - 1;
  size_t i = s.hash & mask;
  while (slots_[i].id >= 0)
    i = (i + 1) & mask;
  slots_[i] = s;
}

bool StringTable::set(std::string_view key, int32_t id) {
  if ((entries_ + 1) * 2 > slots_.size())
    reserve(entries_ * 2 + 16);
  uint64_t h = hash_bytes(reinterpret_cast<const uint8_t *>(key.data()), key.size());
  size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    Slot &s = slots_[i];
    if (s.id < 0) {
      s.hash = h;
      s.off = static_cast<uint32_t>(keys_.size());
      s.len = static_cast<uint32_t>(key.size());
      s.id = id;
      keys_.append(key);
      ++entries_;
      return true;
    }
    if (s.hash == h && s.len == key.size() && keys_.compare(s.off, s.len, key) == 0) {
      s.id = id;
      return false;
    }
  }
}

int32_t StringTable::find(const void *p, size_t n) const {
  if (slots_.empty())
    return -1;
  uint64_t h = hash_bytes(static_cast<const uint8_t *>(p), n);
  size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot &s = slots_[i];
    if (s.id < 0)
      return -1;
    if (s.hash == h && s.len == n && std::memcmp(keys_.data() + s.off, p, n) == 0)
      return s.id;
  }
}

Model::~Model() = default;

namespace {

using simdjson::dom::element;

// GPT-2's byte alphabet undone: the raw bytes a byte-level token stands for,
// or false when a character is outside the alphabet (such a token can never
// come out of byte-level pre-tokens).
bool unmap_byte_level(std::string_view token, std::string &out) {
  const ByteAlphabet &abc = alphabet();
  out.clear();
  const uint8_t *p = reinterpret_cast<const uint8_t *>(token.data());
  size_t n = token.size();
  for (size_t i = 0; i < n;) {
    size_t len = utf8_sequence(p + i, n - i);
    if (len == 0 || len > 2)
      return false;
    uint32_t cp = len == 1 ? p[i] : ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
    if (cp >= 256 + 68 || abc.cp_to_byte[cp] < 0)
      return false;
    out += static_cast<char>(abc.cp_to_byte[cp]);
    i += len;
  }
  return true;
}

// The double HF `tokenizers` reads for a JSON number. serde_json without
// its float_roundtrip feature (as tokenizers builds it) takes the decimal
// significand as a u64 (digits past 19-20 ignored), converts it to f64 and
// multiplies or divides by a power of ten: two roundings, so a 17-digit
// score can differ from the correctly rounded value by an ulp, and Unigram's
// Viterbi breaks exact ties by those ulps. The number is rebuilt from its
// shortest representation (what HF and Python write) and read that way.
double serde_json_f64(double correctly_rounded) {
  static const std::vector<double> pow10 = [] {
    std::vector<double> t(309);
    for (int i = 0; i <= 308; ++i)
      t[i] = std::strtod(("1e" + std::to_string(i)).c_str(), nullptr);
    return t;
  }();
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, correctly_rounded);
  const char *p = buf, *end = res.ptr;
  bool negative = p < end && *p == '-';
  if (negative)
    ++p;
  uint64_t sig = 0;
  int exponent = 0;
  bool full = false;
  auto digit = [&](int d, bool fraction) {
    if (full || sig > UINT64_MAX / 10 || (sig == UINT64_MAX / 10 && uint64_t(d) > UINT64_MAX % 10)) {
      full = true; // further digits are ignored (integer digits still scale)
      if (!fraction)
        ++exponent;
      return;
    }
    sig = sig * 10 + uint64_t(d);
    if (fraction)
      --exponent;
  };
  for (; p < end && *p >= '0' && *p <= '9'; ++p)
    digit(*p - '0', false);
  if (p < end && *p == '.')
    for (++p; p < end && *p >= '0' && *p <= '9'; ++p)
      digit(*p - '0', true);
  if (p < end && (*p == 'e' || *p == 'E'))
    exponent += std::atoi(p + 1);
  double f = static_cast<double>(sig);
  for (;;) {
    int a = exponent < 0 ? -exponent : exponent;
    if (a <= 308) {
      if (exponent >= 0)
        f *= pow10[a];
      else
        f /= pow10[a];
      break;
    }
    if (f == 0.0 || exponent >= 0)
      break;
    f /= 1e308;
    exponent += 308;
  }
  return negative ? -f : f;
}

// Ids index tables by id; far larger ones can only be a corrupt file.
constexpr int64_t kMaxId = int64_t(1) << 27;

// Reads an optional string field; null and absence give "".
bool opt_string(element obj, const char *key, std::string &out, bool &present) {
  element v;
  present = false;
  if (obj.at_key(key).get(v) || v.is_null())
    return true;
  std::string_view s;
  if (v.get_string().get(s))
    return false;
  out.assign(s);
  present = true;
  return true;
}

bool opt_bool(element obj, const char *key, bool &out) {
  element v;
  if (obj.at_key(key).get(v) || v.is_null())
    return true;
  return !v.get_bool().get(out);
}

// ---------------------------------------------------------------------------
// BPE

class BpeModel final : public Model {
public:
  PairTable merges;          // (left, right) -> (rank, merged id)
  int32_t unit_id[256];      // byte-level: the token of each byte, or -1
  int32_t fallback_id[256];  // "<0xNN>" tokens, or -1
  int32_t unk_id = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string prefix, suffix; // continuing_subword_prefix, end_of_word_suffix
  StringTable keys;           // model keys: raw bytes when byte-level

  void encode(const uint8_t *p, size_t n, ModelScratch &s,
              std::vector<int32_t> &out) const override;

private:
  void add(ModelScratch &s, int32_t id) const {
    int32_t pos = static_cast<int32_t>(s.symbols.size());
    s.symbols.push_back({id, pos - 1, -1, true});
    if (pos > 0)
      s.symbols[pos - 1].next = pos;
  }
};

void BpeModel::encode(const uint8_t *p, size_t n, ModelScratch &s,
                      std::vector<int32_t> &out) const {
  if (ignore_merges) {
    int32_t id = keys.find(p, n);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  // The initial symbols (model.rs merge_word): a symbol per character (per
  // byte when byte-level); one not in the vocabulary becomes its "<0xNN>"
  // byte tokens when byte_fallback has them all, else the unknown token,
  // runs of which fuse when fuse_unk. A pending unknown token is written
  // only when a known symbol follows (or at the end), as model.rs does.
  auto &sym = s.symbols;
  sym.clear();
  int32_t pending_unk = -1;
  for (size_t i = 0; i < n;) {
    size_t len = byte_level ? 1 : std::max<size_t>(1, utf8_sequence(p + i, n - i));
    bool first = i == 0, last = i + len >= n;
    int32_t id;
    const uint8_t *key = p + i;
    size_t key_len = len;
    if (byte_level && prefix.empty() && suffix.empty()) {
      id = unit_id[p[i]];
    } else {
      if ((!first && !prefix.empty()) || (last && !suffix.empty())) {
        s.key.clear();
        if (!first)
          s.key += prefix;
        s.key.append(reinterpret_cast<const char *>(p + i), len);
        if (last)
          s.key += suffix;
        key = reinterpret_cast<const uint8_t *>(s.key.data());
        key_len = s.key.size();
      }
      id = keys.find(key, key_len);
    }
    i += len;
    if (id >= 0) {
      if (pending_unk >= 0) {
        add(s, pending_unk);
        pending_unk = -1;
      }
      add(s, id);
      continue;
    }
    if (byte_fallback) {
      // The bytes of the symbol as the model sees it: in a byte-level model,
      // the alphabet character's UTF-8.
      std::string mapped;
      if (byte_level) {
        for (size_t k = 0; k < key_len; ++k)
          append_utf8(mapped, alphabet().byte_to_cp[key[k]]);
        key = reinterpret_cast<const uint8_t *>(mapped.data());
        key_len = mapped.size();
      }
      bool all = true;
      for (size_t k = 0; k < key_len && all; ++k)
        all = fallback_id[key[k]] >= 0;
      if (all) {
        for (size_t k = 0; k < key_len; ++k)
          add(s, fallback_id[key[k]]);
        continue;
      }
    }
    if (unk_id >= 0) {
      if (pending_unk >= 0 && !fuse_unk)
        add(s, pending_unk);
      pending_unk = unk_id;
    }
  }
  if (pending_unk >= 0)
    add(s, pending_unk);

  // word.rs merge_all: repeatedly merge the pair of lowest (rank, position);
  // a queued pair is stale when its left symbol is gone, has no right
  // neighbour, or the current pair does not merge into the same token.
  auto &heap = s.heap;
  heap.clear();
  auto greater = std::greater<ModelScratch::Merge>();
  auto push = [&](int32_t pos) {
    int32_t next = sym[pos].next;
    const PairTable::Merge *m = merges.find(sym[pos].id, sym[next].id);
    if (!m)
      return;
    heap.push_back({(uint64_t(uint32_t(m->rank)) << 32) | uint32_t(pos), m->id});
    std::push_heap(heap.begin(), heap.end(), greater);
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i)
    push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    ModelScratch::Merge top = heap.back();
    heap.pop_back();
    int32_t pos = static_cast<int32_t>(top.order & 0xFFFFFFFFu);
    if (!sym[pos].alive || sym[pos].next < 0)
      continue;
    int32_t next = sym[pos].next;
    const PairTable::Merge *m = merges.find(sym[pos].id, sym[next].id);
    if (!m || m->id != top.new_id)
      continue;
    sym[pos].id = top.new_id;
    sym[pos].next = sym[next].next;
    sym[next].alive = false;
    if (sym[pos].next >= 0)
      sym[sym[pos].next].prev = pos;
    if (sym[pos].prev >= 0)
      push(sym[pos].prev);
    if (sym[pos].next >= 0)
      push(pos);
  }
  for (const auto &x : sym)
    if (x.alive)
      out.push_back(x.id);
}

// ---------------------------------------------------------------------------
// Unigram

class UnigramModel final : public Model {
public:
  std::vector<double> scores;
  int32_t unk_id = -1;
  bool byte_fallback = false;
  int32_t fallback_id[256];
  double min_score = 0;
  // A byte trie of the pieces: (node << 8 | byte) -> child; node_id[node] is
  // the piece ending there or -1.
  PairTable edges;
  std::vector<int32_t> node_id;
  StringTable keys; // model keys (raw bytes when byte-level)

  void encode(const uint8_t *p, size_t n, ModelScratch &s,
              std::vector<int32_t> &out) const override;
  int32_t child(int32_t node, uint8_t b) const {
    const PairTable::Merge *m = edges.find(node, b);
    return m ? m->id : -1;
  }
};

void UnigramModel::encode(const uint8_t *p, size_t n, ModelScratch &s,
                          std::vector<int32_t> &out) const {
  // model.rs encode_optimized: the best path to each byte offset; for each
  // start, the pieces that begin there in order of length, then the unknown
  // token over one character when no piece is exactly that character. A
  // later candidate replaces a node only with a strictly higher score.
  const double unk_score = min_score - 10.0; // K_UNK_PENALTY
  auto &lat = s.lattice;
  lat.assign(n + 1, ModelScratch::Node{0.0, -1, -1});
  for (size_t start = 0; start < n;) {
    double base = lat[start].score;
    size_t mblen = byte_level ? 1 : std::max<size_t>(1, utf8_sequence(p + start, n - start));
    bool single = false;
    int32_t node = 0;
    for (size_t k = start; k < n; ++k) {
      node = child(node, p[k]);
      if (node < 0)
        break;
      int32_t id = node_id[node];
      if (id < 0)
        continue;
      size_t end = k + 1;
      double cand = scores[id] + base;
      ModelScratch::Node &t = lat[end];
      if (t.start < 0 || cand > t.score)
        t = {cand, id, static_cast<int32_t>(start)};
      if (end - start == mblen)
        single = true;
    }
    if (!single) {
      ModelScratch::Node &t = lat[start + mblen];
      double cand = unk_score + base;
      if (t.start < 0 || cand > t.score)
        t = {cand, unk_id, static_cast<int32_t>(start)};
    }
    start += mblen;
  }
  // Back from the end; adjacent unknown spans fuse into one string.
  auto &spans = s.spans;
  spans.clear();
  bool in_unk = false;
  for (size_t end = n; end > 0;) {
    const ModelScratch::Node &t = lat[end];
    size_t start = static_cast<size_t>(t.start);
    bool unk = t.id == unk_id;
    if (unk && in_unk)
      spans.back().first = static_cast<uint32_t>(start);
    else
      spans.push_back({static_cast<uint32_t>(start), static_cast<uint32_t>(end)});
    in_unk = unk;
    end = start;
  }
  // model.rs tokenize: each string's id, else its "<0xNN>" bytes when all
  // exist, else the unknown id.
  for (size_t i = spans.size(); i-- > 0;) {
    const uint8_t *q = p + spans[i].first;
    size_t len = spans[i].second - spans[i].first;
    int32_t id = keys.find(q, len);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    if (byte_fallback) {
      std::string mapped;
      if (byte_level) {
        for (size_t k = 0; k < len; ++k)
          append_utf8(mapped, alphabet().byte_to_cp[q[k]]);
        q = reinterpret_cast<const uint8_t *>(mapped.data());
        len = mapped.size();
      }
      bool all = true;
      for (size_t k = 0; k < len && all; ++k)
        all = fallback_id[q[k]] >= 0;
      if (all) {
        for (size_t k = 0; k < len; ++k)
          out.push_back(fallback_id[q[k]]);
        continue;
      }
    }
    out.push_back(unk_id);
  }
}

// ---------------------------------------------------------------------------
// WordLevel

class WordLevelModel final : public Model {
public:
  int32_t unk_id = -1;
  StringTable keys;
  void encode(const uint8_t *p, size_t n, ModelScratch &,
              std::vector<int32_t> &out) const override {
    int32_t id = keys.find(p, n);
    out.push_back(id >= 0 ? id : unk_id);
  }
};

// ---------------------------------------------------------------------------
// WordPiece (models/wordpiece/mod.rs): greedy longest match from the left,
// pieces after the first with the continuing prefix; a word with a part no
// piece covers, or longer than max_input_chars_per_word, is the unknown id.

class WordPieceModel final : public Model {
public:
  int32_t unk_id = -1;
  size_t max_chars = 100;
  std::string prefix = "##";
  StringTable keys;
  void encode(const uint8_t *p, size_t n, ModelScratch &s,
              std::vector<int32_t> &out) const override {
    size_t chars = 0;
    for (size_t i = 0; i < n; i += std::max<size_t>(1, utf8_sequence(p + i, n - i)))
      ++chars;
    if (chars > max_chars) {
      out.push_back(unk_id);
      return;
    }
    size_t before = out.size();
    for (size_t start = 0; start < n;) {
      size_t end = n;
      int32_t found = -1;
      while (start < end) {
        s.key.clear();
        if (start > 0)
          s.key += prefix;
        s.key.append(reinterpret_cast<const char *>(p + start), end - start);
        found = keys.find(s.key);
        if (found >= 0)
          break;
        size_t last = end - 1; // step back one character
        while (last > start && (p[last] & 0xC0) == 0x80)
          --last;
        end = last;
      }
      if (found < 0) {
        out.resize(before);
        out.push_back(unk_id);
        return;
      }
      out.push_back(found);
      start = end;
    }
  }
};

// ---------------------------------------------------------------------------
// Loading

struct Loader {
  const std::string &path;
  std::string *error;
  bool byte_level;

  bool fail(const std::string &field, const std::string &what) {
    *error = path + ": error: " + field + " " + what;
    return false;
  }

  // Registers token `t` with id `id` in the model's tables; byte-level keys
  // are stored as raw bytes (skipped when outside the alphabet).
  void add_token(Model &m, StringTable &keys, std::string_view t, int32_t id) {
    if (static_cast<size_t>(id) >= m.tokens.size())
      m.tokens.resize(id + 1);
    m.tokens[id].assign(t);
    m.by_token.set(t, id);
    if (byte_level) {
      std::string raw;
      if (unmap_byte_level(t, raw))
        keys.set(raw, id);
    } else {
      keys.set(t, id);
    }
  }

  static void fallback_ids(const StringTable &by_token, int32_t *out) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      out[b] = by_token.find(std::string_view(name));
    }
  }

  std::unique_ptr<Model> bpe(element m) {
    auto model = std::make_unique<BpeModel>();
    simdjson::dom::object vocab;
    if (m.at_key("vocab").get_object().get(vocab))
      return fail("model.vocab", "must be an object of token -> id"), nullptr;
    size_t count = 0;
    for (auto [key, value] : vocab) {
      int64_t id;
      if (value.get_int64().get(id) || id < 0 || id > INT32_MAX)
        return fail("model.vocab", "has a non-integer or negative id for " + tok::quoted(key)),
               nullptr;
      if (id >= kMaxId)
        return fail("model.vocab", "gives " + tok::quoted(key) + " the id " + std::to_string(id) +
                                       ", beyond the 2^27 ids a vocabulary may have here"),
               nullptr;
      ++count;
      add_token(*model, model->keys, key, static_cast<int32_t>(id));
    }
    model->vocab_size = model->by_token.size();
    (void)count;
    double dropout = 0;
    element d;
    if (!m.at_key("dropout").get(d) && !d.is_null() && (d.get_double().get(dropout) || dropout != 0))
      return fail("model.dropout", "is set; BPE dropout samples merges at random and mt "
                                   "tokenizes deterministically: set it to null"),
             nullptr;
    std::string unk;
    bool has_unk = false, present;
    if (!opt_string(m, "unk_token", unk, has_unk))
      return fail("model.unk_token", "must be a string or null"), nullptr;
    if (!opt_string(m, "continuing_subword_prefix", model->prefix, present) ||
        !opt_string(m, "end_of_word_suffix", model->suffix, present))
      return fail("model.continuing_subword_prefix", "and end_of_word_suffix must be strings or null"),
             nullptr;
    if (!opt_bool(m, "fuse_unk", model->fuse_unk) ||
        !opt_bool(m, "byte_fallback", model->byte_fallback) ||
        !opt_bool(m, "ignore_merges", model->ignore_merges))
      return fail("model", "fuse_unk, byte_fallback and ignore_merges must be true or false"),
             nullptr;
    if (has_unk) {
      model->unk_id = model->by_token.find(unk);
      if (model->unk_id < 0)
        return fail("model.unk_token", tok::quoted(unk) + " is not in model.vocab; add it or set "
                                                      "unk_token to null"),
               nullptr;
    }
    for (int b = 0; b < 256; ++b) {
      char one = static_cast<char>(b);
      model->unit_id[b] = model->keys.find(&one, 1);
    }
    fallback_ids(model->by_token, model->fallback_id);

    // merges: "left right" strings (tokenizers < 0.20) or [left, right].
    simdjson::dom::array merges;
    element mv;
    bool have_merges = !m.at_key("merges").get(mv) && !mv.is_null();
    if (have_merges && mv.get_array().get(merges))
      return fail("model.merges", "must be a list of \"left right\" strings or [left, right] pairs"),
             nullptr;
    model->merges.reserve(have_merges ? merges.size() + 1 : 1);
    std::string joined;
    int32_t rank = 0;
    if (have_merges) {
      for (element e : merges) {
        std::string_view left, right, both;
        std::string field = "model.merges[" + std::to_string(rank) + "]";
        if (!e.get_string().get(both)) {
          size_t sp = both.find(' ', 1);
          if (sp == std::string_view::npos)
            return fail(field, tok::quoted(both) + " is not two tokens separated by a space"), nullptr;
          left = both.substr(0, sp);
          right = both.substr(sp + 1);
        } else {
          simdjson::dom::array pair;
          if (e.get_array().get(pair) || pair.size() != 2 || pair.at(0).get_string().get(left) ||
              pair.at(1).get_string().get(right))
            return fail(field, "must be a \"left right\" string or a [left, right] pair"), nullptr;
        }
        int32_t a = model->by_token.find(left), b = model->by_token.find(right);
        if (a < 0 || b < 0)
          return fail(field, "names " + tok::quoted(a < 0 ? left : right) +
                                 ", which is not in model.vocab; the merges and the vocabulary "
                                 "must come from the same tokenizer"),
                 nullptr;
        // models/bpe/model.rs: the merged token drops the right side's
        // continuing_subword_prefix.
        joined.assign(left);
        std::string_view r = right;
        if (!model->prefix.empty() && r.substr(0, model->prefix.size()) == model->prefix)
          r.remove_prefix(model->prefix.size());
        joined.append(r);
        int32_t merged = model->by_token.find(joined);
        if (merged < 0)
          return fail(field, "makes " + tok::quoted(joined) +
                                 ", which is not in model.vocab; the merges and the vocabulary "
                                 "must come from the same tokenizer"),
                 nullptr;
        // A pair listed twice keeps its last rank (HF collects into a map).
        if (!model->merges.insert(a, b, {rank, merged}))
          const_cast<PairTable::Merge *>(model->merges.find(a, b))[0] = {rank, merged};
        ++rank;
      }
    }
    return model;
  }

  std::unique_ptr<Model> unigram(element m) {
    auto model = std::make_unique<UnigramModel>();
    simdjson::dom::array vocab;
    if (m.at_key("vocab").get_array().get(vocab))
      return fail("model.vocab", "must be a list of [piece, score] pairs"), nullptr;
    int32_t id = 0;
    model->node_id.push_back(-1);
    model->edges.reserve(16);
    std::vector<std::pair<std::string, int32_t>> entries;
    for (element e : vocab) {
      simdjson::dom::array pair;
      std::string_view piece;
      double score;
      if (e.get_array().get(pair) || pair.size() != 2 || pair.at(0).get_string().get(piece) ||
          pair.at(1).get_double().get(score))
        return fail("model.vocab[" + std::to_string(id) + "]", "must be a [piece, score] pair"),
               nullptr;
      model->scores.push_back(serde_json_f64(score));
      if (static_cast<size_t>(id) >= model->tokens.size())
        model->tokens.resize(id + 1);
      model->tokens[id].assign(piece);
      model->by_token.set(piece, id);
      std::string key(piece);
      if (byte_level && !unmap_byte_level(piece, key))
        key.clear();
      if (!key.empty()) {
        model->keys.set(key, id);
        entries.emplace_back(std::move(key), id);
      }
      ++id;
    }
    if (id == 0)
      return fail("model.vocab", "is empty"), nullptr;
    model->vocab_size = static_cast<size_t>(id);
    size_t total = 0;
    for (auto &e : entries)
      total += e.first.size();
    model->edges.reserve(total + 1);
    for (auto &[key, tid] : entries) {
      int32_t node = 0;
      for (unsigned char c : key) {
        int32_t next = model->child(node, c);
        if (next < 0) {
          next = static_cast<int32_t>(model->node_id.size());
          model->node_id.push_back(-1);
          model->edges.insert(node, c, {0, next});
        }
        node = next;
      }
      // The id of a piece listed twice is its last one (token_to_ids).
      model->node_id[node] = model->keys.find(key);
    }
    model->min_score = model->scores[0];
    for (double sc : model->scores)
      model->min_score = std::min(model->min_score, sc);
    element u;
    if (m.at_key("unk_id").get(u) || u.is_null())
      return fail("model.unk_id", "is null; HF tokenizers fails on any character outside the "
                                  "pieces then, so mt needs the id of the unknown piece"),
             nullptr;
    int64_t unk;
    if (u.get_int64().get(unk) || unk < 0 || unk >= id)
      return fail("model.unk_id", "must be the index of a piece in model.vocab"), nullptr;
    model->unk_id = static_cast<int32_t>(unk);
    if (!opt_bool(m, "byte_fallback", model->byte_fallback))
      return fail("model.byte_fallback", "must be true or false"), nullptr;
    fallback_ids(model->by_token, model->fallback_id);
    return model;
  }

  std::unique_ptr<Model> word_piece(element m) {
    auto model = std::make_unique<WordPieceModel>();
    simdjson::dom::object vocab;
    if (m.at_key("vocab").get_object().get(vocab))
      return fail("model.vocab", "must be an object of token -> id"), nullptr;
    for (auto [key, value] : vocab) {
      int64_t id;
      if (value.get_int64().get(id) || id < 0 || id >= kMaxId)
        return fail("model.vocab", "has a bad id for " + tok::quoted(key)), nullptr;
      add_token(*model, model->keys, key, static_cast<int32_t>(id));
    }
    model->vocab_size = model->by_token.size();
    std::string unk;
    bool has_unk = false, present = false;
    if (!opt_string(m, "unk_token", unk, has_unk) || !has_unk ||
        (model->unk_id = model->by_token.find(unk)) < 0)
      return fail("model.unk_token", "must name a token of model.vocab"), nullptr;
    if (!opt_string(m, "continuing_subword_prefix", model->prefix, present))
      return fail("model.continuing_subword_prefix", "must be a string"), nullptr;
    element mx;
    int64_t max_chars;
    if (!m.at_key("max_input_chars_per_word").get(mx) && !mx.get_int64().get(max_chars) && max_chars >= 0)
      model->max_chars = static_cast<size_t>(max_chars);
    return model;
  }

  std::unique_ptr<Model> word_level(element m) {
    auto model = std::make_unique<WordLevelModel>();
    simdjson::dom::object vocab;
    if (m.at_key("vocab").get_object().get(vocab))
      return fail("model.vocab", "must be an object of token -> id"), nullptr;
    for (auto [key, value] : vocab) {
      int64_t id;
      if (value.get_int64().get(id) || id < 0 || id > INT32_MAX)
        return fail("model.vocab", "has a non-integer or negative id for " + tok::quoted(key)),
               nullptr;
      if (id >= kMaxId)
        return fail("model.vocab", "gives " + tok::quoted(key) + " the id " + std::to_string(id) +
                                       ", beyond the 2^27 ids a vocabulary may have here"),
               nullptr;
      add_token(*model, model->keys, key, static_cast<int32_t>(id));
    }
    model->vocab_size = model->by_token.size();
    std::string unk;
    bool has_unk = false;
    if (!opt_string(m, "unk_token", unk, has_unk) || !has_unk ||
        (model->unk_id = model->by_token.find(unk)) < 0)
      return fail("model.unk_token", "must name a token of model.vocab (HF fails on any word "
                                     "outside the vocabulary without it)"),
             nullptr;
    return model;
  }
};

} // namespace

std::unique_ptr<Model> load_model(const void *json_model, const std::string &path,
                                  bool byte_level, std::string *error) {
  element m = *static_cast<const element *>(json_model);
  Loader l{path, error, byte_level};
  if (!m.is_object()) {
    l.fail("model", "must be an object");
    return nullptr;
  }
  std::string_view type;
  element t;
  if (m.at_key("type").get(t) || t.get_string().get(type)) {
    // Files from before the "type" tag: BPE has merges, Unigram a list vocab.
    element v;
    if (!m.at_key("merges").get(v))
      type = "BPE";
    else if (!m.at_key("vocab").get(v) && v.is_array())
      type = "Unigram";
  }
  std::unique_ptr<Model> model;
  if (type == "BPE")
    model = l.bpe(m);
  else if (type == "Unigram")
    model = l.unigram(m);
  else if (type == "WordLevel")
    model = l.word_level(m);
  else if (type == "WordPiece")
    model = l.word_piece(m);
  else {
    l.fail("model.type", tok::quoted(type) + " is not supported; mt reads BPE, Unigram, "
                                             "WordPiece and WordLevel models");
    return nullptr;
  }
  if (model)
    model->byte_level = byte_level;
  return model;
}

} // namespace mt::rt::hf
