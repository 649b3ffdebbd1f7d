// The tokenizer flags and the factory behind --tokenizer-type.
#include "runtime/data/tokenizers/tokenizer.h"

#include "runtime/data/tokenizers/gpt2_tokenizer.h"
#include "runtime/data/tokenizers/hf_tokenizer.h"
#include "runtime/data/tokenizers/null_tokenizer.h"
#include "runtime/data/tokenizers/sentencepiece_tokenizer.h"
#include "runtime/data/tokenizers/tiktoken_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace mt::rt {

TokenEncoder::~TokenEncoder() = default;
Tokenizer::~Tokenizer() = default;

namespace {

bool is_flag(const std::string &s) { return s.rfind("--", 0) == 0; }

bool parse_int(const std::string &v, int64_t min, int64_t &out) {
  if (v.empty())
    return false;
  errno = 0;
  char *end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || n < min)
    return false;
  out = n;
  return true;
}

// GPT2BPETokenizer: vocab.json + merges.txt.
class Gpt2Tokenizer final : public Tokenizer {
public:
  Gpt2Tokenizer(std::shared_ptr<const Gpt2Vocabulary> v, std::string files)
      : vocab_(std::move(v)), files_(std::move(files)) {}
  size_t vocab_size() const override { return vocab_->size(); }
  int32_t eod() const override { return vocab_->eod_id(); }
  std::unique_ptr<TokenEncoder> encoder() const override {
    struct E final : TokenEncoder {
      explicit E(std::shared_ptr<const Gpt2Vocabulary> v) : enc(std::move(v)) {}
      void encode(std::string_view text, std::vector<int32_t> &out) override {
        enc.encode(text, out);
      }
      Gpt2Encoder enc;
    };
    return std::make_unique<E>(vocab_);
  }
  std::string decode(const int32_t *ids, size_t n) const override {
    return Gpt2Encoder(vocab_).decode(ids, n);
  }
  std::string describe() const override { return "GPT2BPETokenizer (" + files_ + ")"; }

private:
  std::shared_ptr<const Gpt2Vocabulary> vocab_;
  std::string files_;
};

} // namespace

namespace {
bool parse_one_tokenizer_flag(const std::vector<std::string> &args, size_t &i,
                              TokenizerOptions &o, std::string *error) {
  error->clear();
  std::string a = args[i], inline_value;
  bool has_inline = false;
  if (size_t eq = a.find('='); is_flag(a) && eq != std::string::npos) {
    inline_value = a.substr(eq + 1);
    a = a.substr(0, eq);
    has_inline = true;
  }
  auto values = [&](bool many) {
    std::vector<std::string> out;
    if (has_inline) {
      out.push_back(inline_value);
      return out;
    }
    while (i + 1 < args.size() && !is_flag(args[i + 1])) {
      out.push_back(args[++i]);
      if (!many)
        break;
    }
    return out;
  };
  auto one = [&](std::string &dst, const char *what) {
    std::vector<std::string> v = values(false);
    if (v.empty() || v[0].empty()) {
      *error = a + " needs " + what;
      return true;
    }
    dst = v[0];
    return true;
  };
  if (a == "--tokenizer-type")
    return one(o.type, "a tokenizer type");
  if (a == "--vocab-file" || a == "--vocab")
    return one(o.vocab_file, "a file");
  if (a == "--merge-file")
    return one(o.merge_file, "a file");
  if (a == "--tokenizer-model")
    return one(o.model, "a file or directory");
  if (a == "--tiktoken-pattern") {
    one(o.tiktoken_pattern, "v1 or v2");
    if (error->empty() && o.tiktoken_pattern != "v1" && o.tiktoken_pattern != "v2")
      *error = "--tiktoken-pattern must be v1 or v2, not '" + o.tiktoken_pattern + "'";
    return true;
  }
  if (a == "--vocab-size" || a == "--tiktoken-num-special-tokens") {
    std::string v;
    one(v, "a whole number");
    int64_t n = 0;
    if (error->empty() && !parse_int(v, a == "--vocab-size" ? 1 : 0, n))
      *error = a + " needs a whole number" + (a == "--vocab-size" ? " of at least 1" : "") +
               ", not '" + v + "'";
    else if (a == "--vocab-size")
      o.vocab_size = n;
    else
      o.tiktoken_num_special_tokens = n;
    return true;
  }
  if (a == "--tokenizer-special-tokens" || a == "--tiktoken-special-tokens") {
    std::vector<std::string> v = values(true);
    if (v.empty())
      *error = a + " needs at least one token";
    (a == "--tokenizer-special-tokens" ? o.special_tokens : o.tiktoken_special_tokens) = v;
    return true;
  }
  if (a == "--tokenizer-sentencepiece-legacy") {
    o.sentencepiece_legacy = true;
    return true;
  }
  if (a == "--legacy-tokenizer") {
    o.legacy = true;
    return true;
  }
  if (a == "--tokenizer-hf-no-include-special-tokens") {
    o.hf_include_special_tokens = false;
    return true;
  }
  // Megatron's defaults, spelled out: accepted, nothing to change.
  if (a == "--tokenizer-hf-use-fast" || a == "--tokenizer-hf-include-special-tokens")
    return true;
  if (a == "--tokenizer-hf-no-use-fast" || a == "--trust-remote-code" ||
      a == "--tokenizer-metadata" || a == "--vocab-extra-ids") {
    *error = a + " is not supported: mt reads tokenizer files itself (no Python "
                 "tokenizer classes, no remote code, no extra ids)";
    return true;
  }
  return false;
}

} // namespace

const char *tokenizer_flags_usage() {
  return R"(tokenizer (Megatron's flags):
  --tokenizer-type TYPE     GPT2BPETokenizer (default), NullTokenizer,
                            SentencePieceTokenizer, GPTSentencePieceTokenizer,
                            Llama2Tokenizer, HuggingFaceTokenizer, TikTokenizer
  --vocab-file FILE         GPT-2 vocab.json
  --merge-file FILE         GPT-2 merges.txt
  --tokenizer-model PATH    the tokenizer file or directory of the other types
  --vocab-size N            NullTokenizer's vocabulary
  --tiktoken-pattern v1|v2, --tiktoken-num-special-tokens N,
  --tiktoken-special-tokens TOKEN..., --tokenizer-special-tokens TOKEN...
  --tokenizer-sentencepiece-legacy, --tokenizer-hf-no-include-special-tokens
  --legacy-tokenizer        the classes of megatron/training/tokenizer (core 0.14)
)";
}

bool parse_tokenizer_flag(const std::vector<std::string> &args, size_t &i,
                          TokenizerOptions &o, std::string *error) {
  const std::string a = args[i].substr(0, args[i].find('='));
  if (!parse_one_tokenizer_flag(args, i, o, error))
    return false;
  o.given.push_back(a == "--vocab" ? "--vocab-file" : a);
  return true;
}

namespace {
// The flags a type reads beyond --tokenizer-type, --legacy-tokenizer,
// --vocab-size and Megatron's spelled-out defaults; null for a type mt lacks.
const std::vector<std::string> *flags_of(const std::string &type) {
  static const std::vector<std::string> gpt2 = {"--vocab-file", "--merge-file"}, none = {},
      sp = {"--tokenizer-model", "--tokenizer-sentencepiece-legacy",
            "--tokenizer-special-tokens"},
      hf = {"--tokenizer-model", "--tokenizer-special-tokens",
            "--tokenizer-hf-no-include-special-tokens"},
      tik = {"--tokenizer-model", "--tiktoken-pattern", "--tiktoken-num-special-tokens",
             "--tiktoken-special-tokens", "--tokenizer-special-tokens"};
  if (type == "GPT2BPETokenizer")
    return &gpt2;
  if (type == "NullTokenizer")
    return &none;
  if (is_sentencepiece_type(type))
    return &sp;
  if (type == "HuggingFaceTokenizer")
    return &hf;
  if (type == "TikTokenizer")
    return &tik;
  return nullptr;
}

// Each type's own checks (its required flags, its own refusals).
std::string check_type_options(const TokenizerOptions &o) {
  if (o.type == "GPT2BPETokenizer") {
    if (o.vocab_file.empty() || o.merge_file.empty())
      return "GPT2BPETokenizer needs --vocab-file and --merge-file";
    return "";
  }
  if (o.type == "NullTokenizer") {
    if (!o.vocab_size)
      return "NullTokenizer needs --vocab-size N (its vocabulary)";
    if (*o.vocab_size > INT32_MAX - 1)
      return "NullTokenizer's --vocab-size " + std::to_string(*o.vocab_size) +
             " is too large: token ids are int32";
    return "";
  }
  if (is_sentencepiece_type(o.type))
    return check_sentencepiece_options(o);
  if (o.type == "HuggingFaceTokenizer") {
    if (o.model.empty())
      return "HuggingFaceTokenizer needs --tokenizer-model (the directory of tokenizer.json, or "
             "the file)";
    if (!o.vocab_file.empty() || !o.merge_file.empty())
      return "HuggingFaceTokenizer reads tokenizer.json: --vocab-file and --merge-file are not "
             "supported with it";
    if (o.legacy && !o.special_tokens.empty())
      return "--tokenizer-special-tokens has no effect on the legacy HuggingFaceTokenizer "
             "(--legacy-tokenizer); drop one of them";
    if (o.legacy && !o.hf_include_special_tokens)
      return "--tokenizer-hf-no-include-special-tokens has no effect on the legacy "
             "HuggingFaceTokenizer (--legacy-tokenizer); drop one of them";
    return "";
  }
  if (o.type == "TikTokenizer")
    return check_tiktoken_options(o);
  return "--tokenizer-type " + o.type + " is not supported; mt has GPT2BPETokenizer, "
         "NullTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, "
         "HuggingFaceTokenizer, TikTokenizer";
}

} // namespace

std::string check_tokenizer_options(const TokenizerOptions &o) {
  if (std::string bad = check_type_options(o); !bad.empty())
    return bad;
  // A flag the type does not read would be dropped without a word.
  if (const std::vector<std::string> *used = flags_of(o.type))
    for (const std::string &flag : o.given) {
      static const std::vector<std::string> always = {
          "--tokenizer-type", "--legacy-tokenizer", "--vocab-size", "--tokenizer-hf-use-fast",
          "--tokenizer-hf-include-special-tokens"};
      if (std::find(always.begin(), always.end(), flag) == always.end() &&
          std::find(used->begin(), used->end(), flag) == used->end())
        return flag + " has no effect with --tokenizer-type " + o.type + "; drop it";
    }
  return "";
}

std::shared_ptr<const Tokenizer> load_tokenizer(const TokenizerOptions &o,
                                                std::string *error) {
  if (std::string bad = check_tokenizer_options(o); !bad.empty()) {
    *error = "error: " + bad;
    return nullptr;
  }
  if (o.type == "GPT2BPETokenizer") {
    auto v = Gpt2Vocabulary::load(o.vocab_file, o.merge_file, error);
    if (!v)
      return nullptr;
    return std::make_shared<Gpt2Tokenizer>(std::move(v), o.vocab_file + ", " + o.merge_file);
  }
  if (o.type == "NullTokenizer")
    return make_null_tokenizer(*o.vocab_size, o.legacy);
  if (is_sentencepiece_type(o.type))
    return load_sentencepiece_tokenizer(o, error);
  if (o.type == "HuggingFaceTokenizer")
    return load_hf_tokenizer(o, error);
  if (o.type == "TikTokenizer")
    return load_tiktoken_tokenizer(o, error);
  *error = "error: --tokenizer-type " + o.type + " has no loader";
  return nullptr;
}

} // namespace mt::rt
