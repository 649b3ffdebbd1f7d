// Megatron's HuggingFaceTokenizer (see hf_tokenizer.h): loading
// tokenizer.json and tokenizer_config.json, the added tokens, the
// post-processor, and the encoder that runs the pipeline of hf_internal.h.
#include "runtime/data/tokenizers/hf_tokenizer.h"

#include "runtime/data/tokenizers/hf_internal.h"

#include <simdjson.h>

#include <sys/stat.h>

#include <functional>
#include <unordered_map>

namespace mt::rt {

using namespace tok;
using namespace hf;
using simdjson::dom::element;

namespace {

// ---------------------------------------------------------------------------
// Added tokens (tokenizer/added_vocabulary.rs)

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// One of the two matching sets of added_vocabulary.rs (the tokens matched
// on raw text, or those matched on normalized text): leftmost-longest over
// a byte trie, then single_word, lstrip and rstrip as find_matches applies
// them.
class AddedMatcher {
public:
  struct Split {
    uint32_t start, end;
    int32_t id; // -1: text between tokens
  };

  bool empty() const { return tokens_.empty(); }

  void add(std::string_view pattern, const AddedToken &t) {
    if (pattern.empty())
      return;
    if (node_tok_.empty()) {
      node_tok_.push_back(-1);
      edges_.reserve(1024);
    }
    int32_t node = 0;
    for (unsigned char c : pattern) {
      const PairTable::Merge *m = edges_.find(node, c);
      int32_t next;
      if (m) {
        next = m->id;
      } else {
        next = static_cast<int32_t>(node_tok_.size());
        node_tok_.push_back(-1);
        if (edges_size_ * 2 + 2 > edges_cap_)
          rehash();
        edges_.insert(node, c, {0, next});
        all_edges_.push_back({node, c, next});
        ++edges_size_;
      }
      node = next;
    }
    node_tok_[node] = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(t);
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  }

  void split(std::string_view s, std::vector<Split> &out) const {
    const uint8_t *p = reinterpret_cast<const uint8_t *>(s.data());
    size_t n = s.size();
    size_t start_offset = 0;
    for (size_t i = 0; i < n;) {
      if (!first_byte_[p[i]]) {
        ++i;
        continue;
      }
      int32_t node = 0, best = -1;
      size_t best_end = 0;
      for (size_t k = i; k < n; ++k) {
        const PairTable::Merge *m = edges_.find(node, p[k]);
        if (!m)
          break;
        node = m->id;
        if (node_tok_[node] >= 0) {
          best = node_tok_[node];
          best_end = k + 1;
        }
      }
      if (best < 0) {
        ++i;
        continue;
      }
      const AddedToken &t = tokens_[best];
      size_t start = i, stop = best_end;
      i = best_end; // the search goes on after the match, kept or not
      if (t.single_word) {
        bool start_space = start == 0 || !last_is_word(p, start);
        bool stop_space = stop == n || !first_is_word(p + stop, n - stop);
        if (!start_space || !stop_space)
          continue;
      }
      if (t.lstrip) {
        size_t b = start;
        while (b > 0) {
          size_t c = b - 1;
          while (c > 0 && (p[c] & 0xC0) == 0x80)
            --c;
          size_t len;
          if (!is_white_space(decode_utf8(p + c, b - c, &len)))
            break;
          b = c;
        }
        start = std::max(b, start_offset);
      }
      if (t.rstrip) {
        while (stop < n) {
          size_t len;
          if (!is_white_space(decode_utf8(p + stop, n - stop, &len)))
            break;
          stop += len;
        }
      }
      // A token may begin inside the white space an rstrip token before it
      // took: it still counts (added_vocabulary.rs find_matches).
      if (start_offset < start)
        out.push_back({static_cast<uint32_t>(start_offset), static_cast<uint32_t>(start), -1});
      out.push_back({static_cast<uint32_t>(start), static_cast<uint32_t>(stop), t.id});
      start_offset = stop;
    }
    if (start_offset < n)
      out.push_back({static_cast<uint32_t>(start_offset), static_cast<uint32_t>(n), -1});
  }

private:
  static bool last_is_word(const uint8_t *p, size_t end) {
    size_t c = end - 1;
    while (c > 0 && (p[c] & 0xC0) == 0x80)
      --c;
    size_t len;
    return is_word_char(decode_utf8(p + c, end - c, &len));
  }
  static bool first_is_word(const uint8_t *p, size_t n) {
    size_t len;
    return is_word_char(decode_utf8(p, n, &len));
  }
  void rehash() {
    edges_cap_ = std::max<size_t>(1024, edges_cap_ * 2);
    edges_.reserve(edges_cap_);
    for (const auto &e : all_edges_)
      edges_.insert(e.from, e.byte, {0, e.to});
  }
  struct Edge {
    int32_t from;
    int32_t byte;
    int32_t to;
  };
  PairTable edges_;
  size_t edges_size_ = 0, edges_cap_ = 1024;
  std::vector<Edge> all_edges_;
  std::vector<int32_t> node_tok_;
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
};

// ---------------------------------------------------------------------------
// The loaded tokenizer

struct HfData {
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
  std::unique_ptr<Model> model;
  std::vector<AddedToken> added; // in id order of registration
  std::unordered_map<int32_t, size_t> added_by_id; // for decode
  StringTable added_by_content;
  AddedMatcher raw_added, norm_added;
  std::vector<int32_t> prefix_ids, suffix_ids; // the post-processor's, single sequence
  bool post = true;                            // apply the post-processor
  int32_t eod = -1;
  size_t vocab_size = 0;
  // decode
  bool dec_byte_level = false, dec_byte_fallback = false, dec_strip_space = false;
  std::string dec_wordpiece_prefix; // WordPiece decoder: "##" pieces join the word
  bool dec_wordpiece = false;
  std::vector<std::pair<std::string, std::string>> dec_replace;
  std::string describe;

  int32_t token_to_id(std::string_view t) const {
    int32_t id = added_by_content.find(t);
    return id >= 0 ? id : model->by_token.find(t);
  }
};

class HfEncoder final : public TokenEncoder {
public:
  explicit HfEncoder(std::shared_ptr<const HfData> d) : d_(std::move(d)) {}

  void encode(std::string_view text, std::vector<int32_t> &out) override {
    const HfData &d = *d_;
    std::string_view s = text;
    if (valid_utf8_prefix(reinterpret_cast<const uint8_t *>(text.data()), text.size()) !=
        text.size()) {
      lossy(text, fixed_);
      s = fixed_;
    }
    if (d.post)
      out.insert(out.end(), d.prefix_ids.begin(), d.prefix_ids.end());
    raw_splits_.clear();
    if (d.raw_added.empty())
      raw_splits_.push_back({0, static_cast<uint32_t>(s.size()), -1});
    else
      d.raw_added.split(s, raw_splits_);
    for (const auto &sp : raw_splits_) {
      if (sp.id >= 0)
        out.push_back(sp.id);
      else if (sp.end > sp.start)
        plain(s.substr(sp.start, sp.end - sp.start), sp.start == 0, out);
    }
    if (d.post)
      out.insert(out.end(), d.suffix_ids.begin(), d.suffix_ids.end());
  }

private:
  // Invalid UTF-8 (which Megatron's Python cannot hold in a str) becomes
  // U+FFFD per maximal ill-formed subpart, as Python's
  // bytes.decode("utf-8", "replace") does.
  static void lossy(std::string_view in, std::string &out) {
    out.clear();
    const uint8_t *p = reinterpret_cast<const uint8_t *>(in.data());
    size_t n = in.size();
    for (size_t i = 0; i < n;) {
      size_t len = utf8_sequence(p + i, n - i);
      if (len) {
        out.append(in.substr(i, len));
        i += len;
        continue;
      }
      uint8_t c = p[i];
      size_t need = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
      size_t k = 1;
      for (size_t j = 1; j <= need && i + j < n; ++j) {
        uint8_t lo = 0x80, hi = 0xBF;
        if (j == 1) {
          if (c == 0xE0) lo = 0xA0;
          if (c == 0xED) hi = 0x9F;
          if (c == 0xF0) lo = 0x90;
          if (c == 0xF4) hi = 0x8F;
        }
        if (p[i + j] < lo || p[i + j] > hi)
          break;
        k = j + 1;
      }
      out += "\xEF\xBF\xBD";
      i += k;
    }
  }

  void plain(std::string_view seg, bool first, std::vector<int32_t> &out) {
    const HfData &d = *d_;
    std::string_view text = seg;
    if (!d.norm.empty()) {
      norm_.assign(seg);
      if (!normalize(d.norm, matcher_, norm_, tmp_))
        first = false;
      text = norm_;
    }
    if (d.norm_added.empty()) {
      model_pieces(text, first, out);
      return;
    }
    norm_splits_.clear();
    d.norm_added.split(text, norm_splits_);
    for (const auto &sp : norm_splits_) {
      if (sp.id >= 0)
        out.push_back(sp.id);
      else if (sp.end > sp.start)
        model_pieces(text.substr(sp.start, sp.end - sp.start), first && sp.start == 0, out);
    }
  }

  void model_pieces(std::string_view text, bool first, std::vector<int32_t> &out) {
    const HfData &d = *d_;
    if (text.empty())
      return;
    arena_.assign(text);
    pieces_.clear();
    pieces_.push_back({0, static_cast<uint32_t>(text.size()), first});
    pre_tokenize(d.pre, matcher_, arena_, pieces_, pre_);
    for (const Piece &pc : pieces_) {
      const uint8_t *p = reinterpret_cast<const uint8_t *>(arena_.data()) + pc.off;
      uint64_t h = hash_bytes(p, pc.len);
      size_t count;
      if (const int32_t *ids = cache_.find(p, pc.len, h, &count)) {
        out.insert(out.end(), ids, ids + count);
        continue;
      }
      size_t before = out.size();
      d.model->encode(p, pc.len, scratch_, out);
      cache_.insert(p, pc.len, h, out.data() + before, out.size() - before);
    }
  }

  std::shared_ptr<const HfData> d_;
  Matcher matcher_;
  PreScratch pre_;
  ModelScratch scratch_;
  PieceCache cache_;
  std::string fixed_, norm_, tmp_, arena_;
  std::vector<AddedMatcher::Split> raw_splits_, norm_splits_;
  std::vector<Piece> pieces_;
};

class HfTokenizer final : public Tokenizer {
public:
  explicit HfTokenizer(std::shared_ptr<const HfData> d) : d_(std::move(d)) {}
  size_t vocab_size() const override { return d_->vocab_size; }
  int32_t eod() const override { return d_->eod; }
  std::unique_ptr<TokenEncoder> encoder() const override {
    return std::make_unique<HfEncoder>(d_);
  }
  std::string decode(const int32_t *ids, size_t n) const override;
  std::string describe() const override { return d_->describe; }

private:
  std::shared_ptr<const HfData> d_;
};

// For inspection (mt-dataset): the decoder's common steps (ByteLevel,
// ByteFallback, Metaspace, Replace, Strip of the leading space).
std::string HfTokenizer::decode(const int32_t *ids, size_t n) const {
  const HfData &d = *d_;
  std::string out;
  const ByteAlphabet &abc = alphabet();
  for (size_t i = 0; i < n; ++i) {
    int32_t id = ids[i];
    auto it = d.added_by_id.find(id);
    const AddedToken *added = it == d.added_by_id.end() ? nullptr : &d.added[it->second];
    if (added) {
      if (d.dec_wordpiece && !out.empty())
        out += ' ';
      out += added->content;
      continue;
    }
    if (id < 0 || static_cast<size_t>(id) >= d.model->tokens.size()) {
      out += "<id " + std::to_string(id) + ">";
      continue;
    }
    std::string t = d.model->tokens[id];
    unsigned hex;
    if (d.dec_byte_fallback && t.size() == 6 && std::sscanf(t.c_str(), "<0x%2X>", &hex) == 1) {
      out += static_cast<char>(hex);
      continue;
    }
    for (const auto &[from, to] : d.dec_replace) {
      std::string r;
      for (size_t at = 0;;) {
        size_t f = t.find(from, at);
        if (f == std::string::npos || from.empty()) {
          r.append(t, at, std::string::npos);
          break;
        }
        r.append(t, at, f - at);
        r += to;
        at = f + from.size();
      }
      t.swap(r);
    }
    if (d.dec_wordpiece) {
      const std::string &pre = d.dec_wordpiece_prefix;
      if (!pre.empty() && t.compare(0, pre.size(), pre) == 0)
        t.erase(0, pre.size());
      else if (!out.empty())
        out += ' ';
    }
    if (d.dec_byte_level) {
      const uint8_t *p = reinterpret_cast<const uint8_t *>(t.data());
      for (size_t k = 0; k < t.size();) {
        size_t len;
        uint32_t cp = decode_utf8(p + k, t.size() - k, &len);
        if (cp < 256 + 68 && abc.cp_to_byte[cp] >= 0)
          out += static_cast<char>(abc.cp_to_byte[cp]);
        else
          out.append(t, k, len);
        k += len;
      }
    } else {
      out += t;
    }
  }
  if (d.dec_strip_space && !out.empty() && out[0] == ' ')
    out.erase(0, 1);
  return out;
}

// ---------------------------------------------------------------------------
// Loading

bool base64_decode(std::string_view in, std::string &out);

struct Loader {
  std::string path; // tokenizer.json
  std::string *error;
  HfData &d;

  bool fail(const std::string &field, const std::string &what) {
    *error = path + ": error: " + field + " " + what;
    return false;
  }

  static bool get_bool(element e, const char *key, bool dflt) {
    bool v = dflt;
    element x;
    bool got;
    if (!e.at_key(key).get(x) && !x.get_bool().get(got))
      v = got;
    return v;
  }
  static std::string get_str(element e, const char *key) {
    std::string_view v;
    element x;
    if (!e.at_key(key).get(x) && !x.get_string().get(v))
      return std::string(v);
    return "";
  }
  static bool has(element e, const char *key) {
    element x;
    return !e.at_key(key).get(x) && !x.is_null();
  }

  bool type_of(element e, const std::string &field, std::string_view &type) {
    if (!e.is_object() || e.at_key("type").get_string().get(type))
      return fail(field, "must be an object with a \"type\"");
    return true;
  }

  bool pattern(element e, const std::string &field, std::shared_ptr<Regex> &out) {
    std::string_view s;
    std::string err;
    out = std::make_shared<Regex>();
    if (!e.at_key("String").get_string().get(s)) {
      if (!out->compile_literal(s, &err))
        return fail(field + ".String", "cannot be compiled: " + err);
      return true;
    }
    if (!e.at_key("Regex").get_string().get(s)) {
      if (!out->compile(s, &err))
        return fail(field + ".Regex", tok::quoted(s) + " is not a pattern PCRE2 accepts: " + err);
      return true;
    }
    return fail(field, "must be {\"String\": ...} or {\"Regex\": ...}");
  }

  bool normalizer(element e, const std::string &field) {
    if (e.is_null())
      return true;
    std::string_view type;
    if (!type_of(e, field, type))
      return false;
    NormStep st;
    if (type == "Sequence") {
      simdjson::dom::array list;
      if (e.at_key("normalizers").get_array().get(list))
        return fail(field + ".normalizers", "must be a list");
      size_t i = 0;
      for (element x : list)
        if (!normalizer(x, field + ".normalizers[" + std::to_string(i++) + "]"))
          return false;
      return true;
    }
    if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      st.kind = type == "NFC"    ? NormStep::NFC
                : type == "NFD"  ? NormStep::NFD
                : type == "NFKC" ? NormStep::NFKC
                                 : NormStep::NFKD;
    } else if (type == "Lowercase") {
      st.kind = NormStep::Lowercase;
    } else if (type == "Strip") {
      st.kind = NormStep::Strip;
      st.left = get_bool(e, "strip_left", true);
      st.right = get_bool(e, "strip_right", true);
    } else if (type == "StripAccents") {
      st.kind = NormStep::StripAccents;
    } else if (type == "Nmt") {
      st.kind = NormStep::Nmt;
    } else if (type == "BertNormalizer") {
      st.kind = NormStep::Bert;
      st.clean_text = get_bool(e, "clean_text", true);
      st.chinese_chars = get_bool(e, "handle_chinese_chars", true);
      st.lowercase = get_bool(e, "lowercase", true);
      st.bert_strip_accents = get_bool(e, "strip_accents", st.lowercase); // null: lowercase
    } else if (type == "Precompiled") {
      st.kind = NormStep::Precompiled;
      std::string_view b64;
      element cm;
      if (e.at_key("precompiled_charsmap").get(cm) || cm.get_string().get(b64))
        return fail(field + ".precompiled_charsmap", "must be a base64 string");
      std::string raw;
      if (!base64_decode(b64, raw))
        return fail(field + ".precompiled_charsmap", "is not valid base64");
      if (raw.empty())
        return true; // no charsmap: nothing changes
      uint32_t trie_bytes = 0;
      if (raw.size() >= 4)
        std::memcpy(&trie_bytes, raw.data(), 4); // little-endian, as x86 and ARM are
      if (raw.size() < 4 || trie_bytes % 4 != 0 || raw.size() - 4 < trie_bytes)
        return fail(field + ".precompiled_charsmap", "is not a SentencePiece charsmap (its trie "
                                                     "size does not fit)");
      st.trie.resize(trie_bytes / 4);
      std::memcpy(st.trie.data(), raw.data() + 4, trie_bytes);
      st.replacements = raw.substr(4 + trie_bytes);
      if (valid_utf8_prefix(reinterpret_cast<const uint8_t *>(st.replacements.data()),
                            st.replacements.size()) != st.replacements.size())
        return fail(field + ".precompiled_charsmap", "has replacements that are not UTF-8");
    } else if (type == "Prepend") {
      st.kind = NormStep::Prepend;
      st.text = get_str(e, "prepend");
    } else if (type == "Replace") {
      st.kind = NormStep::Replace;
      element p;
      if (e.at_key("pattern").get(p))
        return fail(field + ".pattern", "is missing");
      if (!pattern(p, field + ".pattern", st.regex))
        return false;
      st.text = get_str(e, "content");
    } else {
      return fail(field + ".type", tok::quoted(type) +
                                       " is not supported; mt reads the normalizers Sequence, "
                                       "NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, "
                                       "Precompiled, BertNormalizer, Nmt, Prepend and Replace");
    }
    d.norm.push_back(std::move(st));
    return true;
  }

  bool behavior(element e, const std::string &field, Behavior &b) {
    std::string s = get_str(e, "behavior");
    if (s.empty())
      return true;
    for (char &c : s)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "removed")
      b = Behavior::Removed;
    else if (s == "isolated")
      b = Behavior::Isolated;
    else if (s == "merged_with_previous" || s == "mergedwithprevious")
      b = Behavior::MergedWithPrevious;
    else if (s == "merged_with_next" || s == "mergedwithnext")
      b = Behavior::MergedWithNext;
    else if (s == "contiguous")
      b = Behavior::Contiguous;
    else
      return fail(field + ".behavior", tok::quoted(s) + " is not one of Removed, Isolated, "
                                                   "MergedWithPrevious, MergedWithNext, "
                                                   "Contiguous");
    return true;
  }

  bool pre_tokenizer(element e, const std::string &field) {
    if (e.is_null())
      return true;
    std::string_view type;
    if (!type_of(e, field, type))
      return false;
    PreStep st;
    if (type == "Sequence") {
      simdjson::dom::array list;
      if (e.at_key("pretokenizers").get_array().get(list))
        return fail(field + ".pretokenizers", "must be a list");
      size_t i = 0;
      for (element x : list)
        if (!pre_tokenizer(x, field + ".pretokenizers[" + std::to_string(i++) + "]"))
          return false;
      return true;
    }
    // A ByteLevel with steps after it (Falcon's) writes its byte alphabet,
    // which the later steps see, as in HF; a last one leaves it to the
    // model's tables (hf_internal.h).
    if (!d.pre.empty() && d.pre.back().kind == PreStep::ByteLevel)
      d.pre.back().map_bytes = true;
    if (type == "Split") {
      st.kind = PreStep::Split;
      element p;
      if (e.at_key("pattern").get(p))
        return fail(field + ".pattern", "is missing");
      if (!pattern(p, field + ".pattern", st.regex) || !behavior(e, field, st.behavior))
        return false;
      st.invert = get_bool(e, "invert", false);
    } else if (type == "ByteLevel") {
      st.kind = PreStep::ByteLevel;
      st.add_prefix_space = get_bool(e, "add_prefix_space", true);
      if (get_bool(e, "use_regex", true)) {
        st.regex = std::make_shared<Regex>();
        std::string err;
        if (!st.regex->compile(gpt2_split_pattern(), &err))
          return fail(field, "GPT-2's split pattern: PCRE2 says " + err);
      }
    } else if (type == "Metaspace") {
      st.kind = PreStep::Metaspace;
      st.replacement = has(e, "replacement") ? get_str(e, "replacement") : "\xE2\x96\x81";
      size_t len = 0;
      if (st.replacement.empty() ||
          utf8_sequence(reinterpret_cast<const uint8_t *>(st.replacement.data()),
                        st.replacement.size()) != st.replacement.size())
        return fail(field + ".replacement", "must be one character");
      st.replacement_cp = decode_utf8(reinterpret_cast<const uint8_t *>(st.replacement.data()),
                                      st.replacement.size(), &len);
      std::string scheme = get_str(e, "prepend_scheme");
      if (scheme.empty()) // older files: add_prefix_space
        scheme = get_bool(e, "add_prefix_space", true) ? "always" : "never";
      if (scheme == "always")
        st.prepend = PreStep::Always;
      else if (scheme == "first")
        st.prepend = PreStep::First;
      else if (scheme == "never")
        st.prepend = PreStep::Never;
      else
        return fail(field + ".prepend_scheme", tok::quoted(scheme) + " is not first, always or never");
      st.split = get_bool(e, "split", true);
    } else if (type == "Digits") {
      st.kind = PreStep::Digits;
      st.individual_digits = get_bool(e, "individual_digits", false);
    } else if (type == "Whitespace") {
      st.kind = PreStep::Whitespace;
    } else if (type == "BertPreTokenizer") {
      st.kind = PreStep::Bert;
    } else if (type == "WhitespaceSplit") {
      st.kind = PreStep::WhitespaceSplit;
    } else if (type == "Punctuation") {
      st.kind = PreStep::Punctuation;
      if (!behavior(e, field, st.behavior))
        return false;
    } else if (type == "CharDelimiterSplit") {
      st.kind = PreStep::CharDelimiterSplit;
      std::string c = get_str(e, "delimiter");
      size_t len = 0;
      if (c.empty() || utf8_sequence(reinterpret_cast<const uint8_t *>(c.data()), c.size()) != c.size())
        return fail(field + ".delimiter", "must be one character");
      st.replacement_cp = decode_utf8(reinterpret_cast<const uint8_t *>(c.data()), c.size(), &len);
    } else {
      return fail(field + ".type", tok::quoted(type) +
                                       " is not supported; mt reads the pre-tokenizers Sequence, "
                                       "Split, ByteLevel, Metaspace, Digits, Whitespace, "
                                       "WhitespaceSplit, Punctuation, CharDelimiterSplit and "
                                       "BertPreTokenizer");
    }
    d.pre.push_back(std::move(st));
    return true;
  }

  bool special_ids(element e, std::string_view name, const std::string &field,
                   std::vector<int32_t> &out) {
    // TemplateProcessing's special_tokens: {"<s>": {"id": "<s>", "ids": [1], ...}}
    simdjson::dom::object specials;
    element entry;
    simdjson::dom::array ids;
    if (e.at_key("special_tokens").get_object().get(specials) ||
        specials.at_key(name).get(entry) || entry.at_key("ids").get_array().get(ids))
      return fail(field, "names the special token " + tok::quoted(name) +
                             ", which post_processor.special_tokens does not list with its ids");
    for (element x : ids) {
      int64_t id;
      if (x.get_int64().get(id) || id < 0 || id > INT32_MAX)
        return fail(field, "special token " + tok::quoted(name) + " has an id that is not a token id");
      out.push_back(static_cast<int32_t>(id));
    }
    return true;
  }

  bool post_processor(element e, const std::string &field, std::vector<int32_t> &pre,
                      std::vector<int32_t> &post) {
    if (e.is_null())
      return true;
    std::string_view type;
    if (!type_of(e, field, type))
      return false;
    if (type == "Sequence") {
      simdjson::dom::array list;
      if (e.at_key("processors").get_array().get(list))
        return fail(field + ".processors", "must be a list");
      size_t i = 0;
      for (element x : list) {
        std::vector<int32_t> a, b;
        if (!post_processor(x, field + ".processors[" + std::to_string(i++) + "]", a, b))
          return false;
        pre.insert(pre.begin(), a.begin(), a.end());
        post.insert(post.end(), b.begin(), b.end());
      }
      return true;
    }
    if (type == "ByteLevel")
      return true; // offsets only
    if (type == "TemplateProcessing") {
      simdjson::dom::array single;
      if (e.at_key("single").get_array().get(single))
        return fail(field + ".single", "must be a list of pieces");
      bool seen_a = false;
      size_t i = 0;
      for (element x : single) {
        std::string f = field + ".single[" + std::to_string(i++) + "]";
        element sp, seq;
        std::string_view name;
        if (!x.at_key("SpecialToken").get(sp)) {
          if (sp.at_key("id").get_string().get(name))
            return fail(f + ".SpecialToken.id", "must be a string");
          if (!special_ids(e, name, f, seen_a ? post : pre))
            return false;
        } else if (!x.at_key("Sequence").get(seq)) {
          if (seen_a)
            return fail(f, "repeats the sequence; a single-sequence template has it once");
          seen_a = true;
        } else {
          return fail(f, "must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
        }
      }
      if (!seen_a)
        return fail(field + ".single", "has no {\"Sequence\": ...} piece for the text");
      return true;
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      simdjson::dom::array cls, sep;
      int64_t c, s;
      if (e.at_key("cls").get_array().get(cls) || cls.size() != 2 || cls.at(1).get_int64().get(c) ||
          e.at_key("sep").get_array().get(sep) || sep.size() != 2 || sep.at(1).get_int64().get(s))
        return fail(field, "needs cls and sep as [token, id]");
      pre.push_back(static_cast<int32_t>(c));
      post.push_back(static_cast<int32_t>(s));
      return true;
    }
    return fail(field + ".type", tok::quoted(type) +
                                     " is not supported; mt reads the post-processors "
                                     "TemplateProcessing, ByteLevel, BertProcessing, "
                                     "RobertaProcessing and Sequence");
  }

  void decoder(element e) {
    std::string_view type;
    if (e.is_null() || e.at_key("type").get_string().get(type))
      return;
    if (type == "Sequence") {
      simdjson::dom::array list;
      if (!e.at_key("decoders").get_array().get(list))
        for (element x : list)
          decoder(x);
    } else if (type == "ByteLevel") {
      d.dec_byte_level = true;
    } else if (type == "ByteFallback") {
      d.dec_byte_fallback = true;
    } else if (type == "WordPiece") {
      d.dec_wordpiece = true;
      d.dec_wordpiece_prefix = has(e, "prefix") ? get_str(e, "prefix") : "##";
    } else if (type == "Metaspace") {
      d.dec_replace.push_back({has(e, "replacement") ? get_str(e, "replacement") : "\xE2\x96\x81", " "});
      d.dec_strip_space = get_str(e, "prepend_scheme") != "never";
    } else if (type == "Replace") {
      element p;
      std::string_view s;
      if (!e.at_key("pattern").get(p) && !p.at_key("String").get_string().get(s))
        d.dec_replace.push_back({std::string(s), get_str(e, "content")});
    } else if (type == "Strip") {
      int64_t start = 0;
      element x;
      if (get_str(e, "content") == " " && !e.at_key("start").get(x) && !x.get_int64().get(start) &&
          start > 0)
        d.dec_strip_space = true;
    }
  }
};

bool base64_decode(std::string_view in, std::string &out) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    int v = val(in[i]);
    if (v < 0)
      return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  for (; i < in.size(); ++i)
    if (in[i] != '=')
      return false;
  return true;
}

bool is_dir(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool exists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// A special token of tokenizer_config.json: a string or an AddedToken object.
bool config_token(element v, AddedToken &t) {
  std::string_view s;
  if (!v.get_string().get(s)) {
    t.content.assign(s);
    t.normalized = false;
    t.special = true;
    return true;
  }
  if (v.is_object() && !v.at_key("content").get_string().get(s)) {
    t.content.assign(s);
    t.single_word = Loader::get_bool(v, "single_word", false);
    t.lstrip = Loader::get_bool(v, "lstrip", false);
    t.rstrip = Loader::get_bool(v, "rstrip", false);
    t.normalized = Loader::get_bool(v, "normalized", false);
    t.special = Loader::get_bool(v, "special", true);
    return true;
  }
  return false;
}

} // namespace

std::shared_ptr<const Tokenizer> load_hf_tokenizer(const TokenizerOptions &o,
                                                   std::string *error) {
  std::string dir, file;
  if (is_dir(o.model)) {
    dir = o.model;
    file = dir + "/tokenizer.json";
    if (!exists(file)) {
      *error = file + ": error: no tokenizer.json in --tokenizer-model " + o.model +
               "; mt reads the fast tokenizer's tokenizer.json (save it with "
               "tokenizer.save_pretrained or tokenizers' Tokenizer.save)";
      return nullptr;
    }
  } else {
    file = o.model;
    size_t slash = file.rfind('/');
    dir = slash == std::string::npos ? "." : file.substr(0, slash);
  }
  auto data = std::make_shared<HfData>();
  HfData &d = *data;
  Loader l{file, error, d};

  simdjson::dom::parser parser;
  element root;
  if (auto err = parser.load(file).get(root)) {
    if (err == simdjson::IO_ERROR)
      *error = file + ": error: cannot read: " + std::strerror(errno) + "; check --tokenizer-model";
    else
      *error = file + ": error: not valid JSON (" + simdjson::error_message(err) +
               "); a tokenizer.json is one JSON object";
    return nullptr;
  }
  if (!root.is_object()) {
    l.fail("the file", "is not a JSON object; a tokenizer.json is one");
    return nullptr;
  }
  element e;
  if (!root.at_key("normalizer").get(e) && !l.normalizer(e, "normalizer"))
    return nullptr;
  if (!root.at_key("pre_tokenizer").get(e) && !l.pre_tokenizer(e, "pre_tokenizer"))
    return nullptr;
  bool byte_level = !d.pre.empty() && d.pre.back().kind == PreStep::ByteLevel;
  element model;
  if (root.at_key("model").get(model)) {
    l.fail("model", "is missing");
    return nullptr;
  }
  d.model = load_model(&model, file, byte_level, error);
  if (!d.model)
    return nullptr;
  if (!root.at_key("post_processor").get(e) &&
      !l.post_processor(e, "post_processor", d.prefix_ids, d.suffix_ids))
    return nullptr;
  if (!root.at_key("decoder").get(e))
    l.decoder(e);

  // Added tokens, as tokenizer.json lists them.
  Matcher m;
  std::string tmp;
  auto register_token = [&](AddedToken t) {
    int32_t have = d.added_by_content.find(t.content);
    if (have >= 0)
      return have; // (HF would update its options; files do not repeat tokens)
    if (t.id < 0) {
      t.id = d.model->by_token.find(t.content);
      if (t.id < 0) { // added_vocabulary.rs add_tokens: after the largest id
        int32_t next = static_cast<int32_t>(d.model->vocab_size);
        for (const AddedToken &a : d.added)
          next = std::max(next, a.id + 1);
        t.id = next;
      }
    }
    d.added_by_content.set(t.content, t.id);
    d.added.push_back(t);
    return t.id;
  };
  simdjson::dom::array added;
  if (!root.at_key("added_tokens").get_array().get(added)) {
    size_t i = 0;
    for (element x : added) {
      std::string field = "added_tokens[" + std::to_string(i++) + "]";
      AddedToken t;
      std::string_view content;
      int64_t id;
      if (x.at_key("content").get_string().get(content) || x.at_key("id").get_int64().get(id) ||
          id < 0 || id > INT32_MAX) {
        l.fail(field, "needs a \"content\" string and a token \"id\"");
        return nullptr;
      }
      // serialization.rs adds them with add_tokens, which ignores the
      // stored id: a token of the model's vocabulary keeps its id there,
      // another gets the next free one (the stored id, in a consistent file).
      t.content.assign(content);
      t.single_word = Loader::get_bool(x, "single_word", false);
      t.lstrip = Loader::get_bool(x, "lstrip", false);
      t.rstrip = Loader::get_bool(x, "rstrip", false);
      t.special = Loader::get_bool(x, "special", false);
      t.normalized = Loader::get_bool(x, "normalized", !t.special);
      register_token(t);
    }
  }

  // tokenizer_config.json (and special_tokens_map.json), as transformers
  // reads them: its added_tokens_decoder and its special tokens join the
  // added tokens (new ones get the next ids); eos_token is Megatron's eod.
  std::string config_path = dir + "/tokenizer_config.json";
  simdjson::dom::parser cparser, mparser;
  element config, smap;
  bool have_config = exists(config_path);
  if (have_config) {
    if (auto err = cparser.load(config_path).get(config); err || !config.is_object()) {
      *error = config_path + ": error: not a valid JSON object (" +
               std::string(err ? simdjson::error_message(err) : "not an object") + ")";
      return nullptr;
    }
  }
  std::string map_path = dir + "/special_tokens_map.json";
  bool have_map = exists(map_path) && !mparser.load(map_path).get(smap) && smap.is_object();
  auto special = [&](const char *key, AddedToken &t) {
    element v;
    if (have_config && !config.at_key(key).get(v) && config_token(v, t))
      return true;
    if (have_map && !smap.at_key(key).get(v) && config_token(v, t))
      return true;
    return false;
  };
  if (have_config) {
    simdjson::dom::object dec;
    if (!config.at_key("added_tokens_decoder").get_object().get(dec)) {
      for (auto [key, v] : dec) {
        AddedToken t;
        if (!config_token(v, t)) {
          *error = config_path + ": error: added_tokens_decoder." + std::string(key) +
                   " must be an AddedToken object with a \"content\"";
          return nullptr;
        }
        register_token(t);
      }
    }
  }
  const char *names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                         "pad_token", "cls_token", "mask_token"};
  std::string tokens[7];
  for (int k = 0; k < 7; ++k) {
    AddedToken t;
    if (special(names[k], t)) {
      tokens[k] = t.content;
      register_token(t);
    }
  }
  for (const char *key : {"additional_special_tokens"}) {
    element v;
    simdjson::dom::array list;
    if ((have_config && !config.at_key(key).get_array().get(list)) ||
        (have_map && !smap.at_key(key).get_array().get(list))) {
      for (element x : list) {
        AddedToken t;
        if (config_token(x, t))
          register_token(t);
      }
    }
    (void)v;
  }
  const std::string &bos = tokens[0], &eos = tokens[1];
  if (!o.legacy) {
    // Megatron-Core's HuggingFaceTokenizer: sep_token defaults to eos_token
    // and cls_token to bos_token; --tokenizer-special-tokens are added.
    for (const std::string &s : o.special_tokens) {
      AddedToken t;
      t.content = s;
      t.normalized = false;
      t.special = true;
      register_token(t);
    }
  }
  // transformers' Llama and Gemma fast tokenizers rebuild the post-processor
  // from add_bos_token / add_eos_token (defaults true / false).
  std::string cls = have_config ? Loader::get_str(config, "tokenizer_class") : "";
  if (cls.size() > 4 && cls.compare(cls.size() - 4, 4, "Fast") == 0)
    cls.resize(cls.size() - 4);
  if (cls == "LlamaTokenizer" || cls == "CodeLlamaTokenizer" || cls == "GemmaTokenizer") {
    bool add_bos = Loader::get_bool(config, "add_bos_token", true);
    bool add_eos = Loader::get_bool(config, "add_eos_token", false);
    d.prefix_ids.clear();
    d.suffix_ids.clear();
    if ((add_bos && bos.empty()) || (add_eos && eos.empty())) {
      *error = config_path + ": error: add_" + std::string(add_bos && bos.empty() ? "bos" : "eos") +
               "_token is true but no " + (add_bos && bos.empty() ? "bos" : "eos") +
               "_token is named; name it or set the flag to false";
      return nullptr;
    }
    if (add_bos)
      d.prefix_ids.push_back(d.token_to_id(bos));
    if (add_eos)
      d.suffix_ids.push_back(d.token_to_id(eos));
  }

  // Normalized added tokens match the normalized text: their patterns go
  // through the normalizer (added_vocabulary.rs refresh_added_tokens).
  for (const AddedToken &t : d.added) {
    if (t.normalized && !d.norm.empty()) {
      std::string pat = t.content;
      normalize(d.norm, m, pat, tmp);
      d.norm_added.add(pat, t);
    } else if (t.normalized) {
      d.norm_added.add(t.content, t);
    } else {
      d.raw_added.add(t.content, t);
    }
  }
  // added_tokens are matched in id order of registration by daachorse; the
  // trie keeps the last token of equal content, as the map does.

  for (size_t i = 0; i < d.added.size(); ++i)
    d.added_by_id[d.added[i].id] = i;

  // vocab_size: len(tokenizer), the model's tokens and the added ones it
  // does not already have (tokenizer/mod.rs get_vocab_size).
  d.vocab_size = d.model->vocab_size;
  for (const AddedToken &t : d.added)
    if (d.model->by_token.find(t.content) < 0)
      ++d.vocab_size;

  // eod: the eos_token's id (Megatron-Core falls back to sep_token, which
  // it sets from eos_token; the legacy class reads eos_token_id only).
  std::string eod_name = eos;
  if (eod_name.empty() && !o.legacy)
    eod_name = tokens[3];
  if (eod_name.empty()) {
    *error = (have_config ? config_path : dir + "/tokenizer_config.json") +
             ": error: no eos_token" + (have_config ? "" : " (no such file)") +
             "; Megatron's eod for HuggingFaceTokenizer is the eos_token of "
             "tokenizer_config.json: name it there";
    return nullptr;
  }
  d.eod = d.token_to_id(eod_name);
  if (d.eod < 0) {
    *error = config_path + ": error: eos_token " + tok::quoted(eod_name) + " is not a token of " + file;
    return nullptr;
  }
  d.post = o.legacy || o.hf_include_special_tokens;
  d.describe = "HuggingFaceTokenizer (" + file + ")";
  return std::make_shared<HfTokenizer>(std::move(data));
}

} // namespace mt::rt
