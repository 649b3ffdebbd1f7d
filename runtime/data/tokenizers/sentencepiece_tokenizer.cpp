// Megatron's SentencePiece tokenizer types over Google's SentencePiece C++
// library (Debian's libsentencepiece): the library encodes; this file adds
// what each Megatron class does around it.
//
// Facts used (megatron/core/tokenizers/text/libraries/sentencepiece_tokenizer.py
// of core 0.16-0.17, and megatron/training/tokenizer/tokenizer.py of core
// 0.14-0.16 for --legacy-tokenizer):
// - Current Megatron: all three types are one class; tokenize() is the
//   library's encode_as_ids, eod its eos_id(), vocab_size its piece count.
//   With --tokenizer-sentencepiece-legacy, --tokenizer-special-tokens are
//   split out of the text first (earliest occurrence, ties to the first
//   listed), a token that is not a piece gets the next id past the pieces,
//   and a text segment that follows a special token loses a leading "▁"
//   piece (except the last segment). That class has no eod then.
// - Legacy SentencePieceTokenizer: <CLS> <SEP> <EOD> <MASK>, then the pad,
//   bos and eos pieces (or <PAD>/<BOS>/<EOS> when the model has none) are
//   special: found in the text the same way (no trimming), the missing ones
//   appended to the vocabulary in that order; eod is <EOD>.
// - Legacy GPTSentencePieceTokenizer: encode_as_ids, eod = eos_id().
// - Legacy Llama2Tokenizer: bos_id() then encode_as_ids, eod = eos_id().
#include "runtime/data/tokenizers/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mt::rt {

namespace {

enum class Mode {
  Plain,    // encode_as_ids
  Bos,      // bos_id() + encode_as_ids (legacy Llama2Tokenizer)
  Specials, // special tokens split out of the text first
};

struct Special {
  std::string text;
  int32_t id;
};

class SentencePieceTokenizer final : public Tokenizer {
public:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp;
  std::string type, path, version;
  Mode mode = Mode::Plain;
  int32_t bos = -1, eod_id = -1;
  size_t size = 0;
  std::vector<Special> specials; // in Megatron's search order
  std::vector<std::string> added; // text of ids size_pieces, size_pieces+1, ...
  bool trim_separator = false;    // --tokenizer-sentencepiece-legacy's "▁" rule
  int32_t separator_id = -1;
  std::vector<bool> is_special_id; // over [0, size)

  size_t vocab_size() const override { return size; }
  int32_t eod() const override { return eod_id; }
  std::unique_ptr<TokenEncoder> encoder() const override;
  std::string decode(const int32_t *ids, size_t n) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      if (!run.empty())
        out += sp->DecodeIds(run);
      run.clear();
    };
    int32_t pieces = sp->GetPieceSize();
    for (size_t i = 0; i < n; ++i) {
      int32_t id = ids[i];
      if (id >= 0 && id < pieces) {
        run.push_back(id);
        continue;
      }
      flush();
      if (id >= pieces && size_t(id - pieces) < added.size())
        out += added[id - pieces];
      else
        out += "<id " + std::to_string(id) + ">";
    }
    flush();
    return out;
  }
  std::string describe() const override { return type + " (" + path + ", " + version + ")"; }
};

class SentencePieceEncoder final : public TokenEncoder {
public:
  explicit SentencePieceEncoder(const SentencePieceTokenizer &t)
      : t_(t), next_(t.specials.size()) {}

  void encode(std::string_view text, std::vector<int32_t> &out) override {
    if (t_.mode == Mode::Bos)
      out.push_back(t_.bos);
    if (t_.mode != Mode::Specials) {
      piece(text, out, false, 0);
      return;
    }
    // Megatron searches text[idx:] for every special token after each one it
    // finds; a token's earlier hit stays valid while it lies past idx.
    size_t first = out.size(), idx = 0;
    for (size_t k = 0; k < next_.size(); ++k)
      next_[k] = text.find(t_.specials[k].text);
    for (;;) {
      size_t best = std::string_view::npos, which = 0;
      for (size_t k = 0; k < next_.size(); ++k) {
        if (next_[k] != std::string_view::npos && next_[k] < idx)
          next_[k] = text.find(t_.specials[k].text, idx);
        if (next_[k] < best) {
          best = next_[k];
          which = k;
        }
      }
      if (best == std::string_view::npos)
        break;
      piece(text.substr(idx, best - idx), out, t_.trim_separator, first);
      out.push_back(t_.specials[which].id);
      idx = best + t_.specials[which].text.size();
    }
    piece(text.substr(idx), out, false, first);
  }

private:
  // Appends encode_as_ids(s); with `trim`, drops a leading separator piece
  // when the ids so far (from `first`) end with a special token.
  void piece(std::string_view s, std::vector<int32_t> &out, bool trim, size_t first) {
    ids_.clear();
    if (!s.empty()) {
      // Through a proto kept across calls: the library's Encode into ids
      // builds and frees a fresh one per text, which costs 1.6x the time.
      t_.sp->Encode(s, result_.mutable_proto()).IgnoreError();
      for (size_t i = 0, n = result_.pieces_size(); i < n; ++i)
        ids_.push_back(int32_t(result_.pieces(int(i)).id()));
    }
    size_t skip = 0;
    if (trim && out.size() > first && !ids_.empty() && ids_[0] == t_.separator_id) {
      int32_t last = out.back();
      if (last >= 0 && size_t(last) < t_.is_special_id.size() && t_.is_special_id[last])
        skip = 1;
    }
    out.insert(out.end(), ids_.begin() + skip, ids_.end());
  }

  const SentencePieceTokenizer &t_;
  std::vector<size_t> next_;
  std::vector<int32_t> ids_;
  sentencepiece::ImmutableSentencePieceText result_;
};

std::unique_ptr<TokenEncoder> SentencePieceTokenizer::encoder() const {
  return std::make_unique<SentencePieceEncoder>(*this);
}

} // namespace

bool is_sentencepiece_type(const std::string &type) {
  return type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" ||
         type == "Llama2Tokenizer";
}

std::string check_sentencepiece_options(const TokenizerOptions &o) {
  if (o.model.empty())
    return o.type + " needs --tokenizer-model (the SentencePiece .model file)";
  if (!o.tiktoken_pattern.empty())
    return "--tiktoken-pattern is for TikTokenizer, not " + o.type;
  if (!o.tiktoken_special_tokens.empty())
    return "--tiktoken-special-tokens is for TikTokenizer, not " + o.type +
           "; SentencePiece types take --tokenizer-special-tokens with "
           "--tokenizer-sentencepiece-legacy";
  if (!o.special_tokens.empty()) {
    if (o.legacy)
      return "--tokenizer-special-tokens is not used by --legacy-tokenizer's " + o.type +
             " (Megatron's old class ignores it); drop the flag";
    if (!o.sentencepiece_legacy)
      return "--tokenizer-special-tokens with " + o.type +
             " needs --tokenizer-sentencepiece-legacy (Megatron refuses special tokens "
             "without it: they belong in the model at training time)";
    for (const std::string &s : o.special_tokens)
      if (s.empty())
        return "--tokenizer-special-tokens: a special token cannot be empty";
  }
  if (o.sentencepiece_legacy && o.legacy)
    return "--tokenizer-sentencepiece-legacy is a flag of current Megatron's tokenizers; "
           "--legacy-tokenizer's classes do not read it, drop one of the two";
  return "";
}

std::shared_ptr<const Tokenizer> load_sentencepiece_tokenizer(const TokenizerOptions &o,
                                                              std::string *error) {
  const std::string &path = o.model;
  // Read it ourselves first: the library's messages about a missing file
  // name no fix.
  if (std::FILE *f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    *error = path + ": error: cannot read the SentencePiece model: " + std::strerror(errno) +
             "; --tokenizer-model needs a SentencePiece .model file (such as Llama-2's "
             "tokenizer.model)";
    return nullptr;
  }
  auto t = std::make_shared<SentencePieceTokenizer>();
  t->sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  if (auto st = t->sp->Load(path); !st.ok()) {
    *error = path + ": error: not a SentencePiece model (" + st.ToString() +
             "); --tokenizer-model needs the .model file SentencePiece's trainer writes "
             "(such as Llama-2's tokenizer.model)";
    return nullptr;
  }
  const sentencepiece::SentencePieceProcessor &sp = *t->sp;
  t->type = o.type;
  t->path = path;
  t->version = o.legacy ? "--legacy-tokenizer" : "Megatron-Core";
  const int32_t pieces = sp.GetPieceSize();
  t->size = size_t(pieces);
  t->eod_id = sp.eos_id();

  if (o.legacy && o.type == "Llama2Tokenizer") {
    if (sp.bos_id() < 0) {
      *error = path + ": error: the model has no BOS piece (bos_id -1), which "
                      "--legacy-tokenizer's Llama2Tokenizer puts before every text; train "
                      "the model with a BOS piece or drop --legacy-tokenizer";
      return nullptr;
    }
    t->mode = Mode::Bos;
    t->bos = sp.bos_id();
  } else if (o.legacy && o.type == "SentencePieceTokenizer") {
    // The old class's special tokens: an existing piece keeps its id (the
    // unk piece included), a new one takes the next id.
    auto id_of = [&](const std::string &s) -> int32_t {
      int32_t id = sp.PieceToId(s);
      if (id != sp.unk_id() || (id >= 0 && sp.IdToPiece(id) == s))
        return id;
      for (size_t i = 0; i < t->added.size(); ++i)
        if (t->added[i] == s)
          return pieces + int32_t(i);
      return -1;
    };
    auto piece_or = [&](int id, const char *fallback) -> std::string {
      return id >= 0 && id < pieces ? sp.IdToPiece(id) : fallback;
    };
    std::vector<std::string> names = {"<CLS>", "<SEP>", "<EOD>", "<MASK>",
                                      piece_or(sp.pad_id(), "<PAD>"),
                                      piece_or(sp.bos_id(), "<BOS>"),
                                      piece_or(sp.eos_id(), "<EOS>")};
    for (const std::string &s : names) {
      int32_t id = id_of(s);
      if (id < 0) {
        id = pieces + int32_t(t->added.size());
        t->added.push_back(s);
      }
      bool listed = false;
      for (const Special &sp_tok : t->specials)
        listed |= sp_tok.text == s;
      if (!listed)
        t->specials.push_back({s, id});
    }
    t->size = size_t(pieces) + t->added.size();
    t->eod_id = id_of("<EOD>");
    t->mode = Mode::Specials;
  } else if (!o.legacy && o.sentencepiece_legacy) {
    // add_special_tokens(list) of the current class, literally: "is it a
    // piece" is piece_to_id(token) != unk_id().
    for (const std::string &s : o.special_tokens) {
      int32_t id = sp.PieceToId(s);
      bool known = false;
      for (const Special &sp_tok : t->specials)
        known |= sp_tok.text == s;
      if (id == sp.unk_id()) {
        if (known)
          continue;
        id = pieces + int32_t(t->added.size());
        t->added.push_back(s);
        t->specials.push_back({s, id});
      } else if (!known) {
        t->specials.push_back({s, id});
      } else {
        for (Special &sp_tok : t->specials)
          if (sp_tok.text == s)
            sp_tok.id = id;
      }
    }
    t->size = size_t(pieces) + t->added.size();
    // Its eos_id looks up an eos_token attribute that only a dict of special
    // tokens sets, so Megatron has no eod here: --append-eod is refused.
    t->eod_id = -1;
    if (!t->specials.empty()) {
      t->mode = Mode::Specials;
      t->trim_separator = true;
      t->separator_id = sp.PieceToId("\xE2\x96\x81"); // "▁"; unk_id when absent, as in Megatron
    }
  }
  t->is_special_id.assign(t->size, false);
  for (const Special &s : t->specials)
    if (s.id >= 0 && size_t(s.id) < t->size)
      t->is_special_id[s.id] = true;
  return t;
}

} // namespace mt::rt
