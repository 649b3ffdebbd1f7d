// The tokenizer [data] names: mtc reads it with the runtime's tokenizers (the
// code mt-preprocess tokenizes with; no Python) so that model.vocab_size and
// the end-of-document id follow it, as Megatron's build_tokenizer makes them
// (the embedding is then padded from that vocabulary:
// make_vocab_size_divisible_by x tp, Spec::paddedVocabSize).
#include "runtime/data/tokenizers/tokenizer.h"
#include "spec/SpecParserImpl.h"

#include <sys/stat.h>

namespace mt::spec::detail {

namespace {

bool present(const std::string &path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0;
}

bool sentencePiece(const std::string &type) {
  return type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" ||
         type == "Llama2Tokenizer";
}

} // namespace

void Parser::resolveTokenizer(Spec &spec) {
  DataConfig &d = spec.data;
  ModelConfig &m = spec.model;
  const std::string &type = d.tokenizer_type;
  const bool gpt2 = type == "GPT2BPETokenizer", null = type == "NullTokenizer",
             hf = type == "HuggingFaceTokenizer", tik = type == "TikTokenizer";
  const bool vocabGiven = given("model", "vocab_size") != nullptr;

  // A key of another tokenizer's set away from its default would not take
  // effect: name it. (The echo writes every key, defaults included.)
  auto onlyFor = [&](const char *key, bool ok, const char *owner) {
    const DataConfig def;
    const std::string k = key;
    const bool changed =
        k == "vocab_file"                       ? !d.vocab_file.empty()
        : k == "merge_file"                     ? !d.merge_file.empty()
        : k == "tokenizer_model"                ? !d.tokenizer_model.empty()
        : k == "tokenizer_special_tokens"       ? !d.tokenizer_special_tokens.empty()
        : k == "tiktoken_pattern"               ? !d.tiktoken_pattern.empty()
        : k == "tiktoken_num_special_tokens"    ? d.tiktoken_num_special_tokens !=
                                                   def.tiktoken_num_special_tokens
        : k == "tiktoken_special_tokens"        ? !d.tiktoken_special_tokens.empty()
        : k == "tokenizer_sentencepiece_legacy" ? d.tokenizer_sentencepiece_legacy
                                                : !d.tokenizer_hf_include_special_tokens;
    if (changed && !ok)
      fail(at("data", key),
           std::string("data.") + key + " is not used by tokenizer_type = " + quote(type) +
               " (it belongs to " + owner + ")",
           "remove it, or set tokenizer_type to the tokenizer it belongs to");
  };
  onlyFor("vocab_file", gpt2, "GPT2BPETokenizer; HuggingFaceTokenizer reads tokenizer.json");
  onlyFor("merge_file", gpt2, "GPT2BPETokenizer; HuggingFaceTokenizer reads tokenizer.json");
  onlyFor("tokenizer_model", !gpt2 && !null,
          "HuggingFaceTokenizer, the SentencePiece types and TikTokenizer");
  onlyFor("tiktoken_pattern", tik, "TikTokenizer");
  onlyFor("tiktoken_num_special_tokens", tik, "TikTokenizer");
  onlyFor("tiktoken_special_tokens", tik, "TikTokenizer");
  onlyFor("tokenizer_sentencepiece_legacy", sentencePiece(type), "the SentencePiece types");
  onlyFor("tokenizer_hf_include_special_tokens", hf, "HuggingFaceTokenizer");
  onlyFor("tokenizer_special_tokens", !gpt2 && !null,
          "HuggingFaceTokenizer, the SentencePiece types and TikTokenizer; mt's "
          "GPT2BPETokenizer adds none to vocab.json's");

  rt::TokenizerOptions o;
  o.type = type;
  o.vocab_file = d.vocab_file;
  o.merge_file = d.merge_file;
  o.model = d.tokenizer_model;
  o.special_tokens = d.tokenizer_special_tokens;
  o.tiktoken_pattern = d.tiktoken_pattern;
  o.tiktoken_num_special_tokens = d.tiktoken_num_special_tokens;
  o.tiktoken_special_tokens = d.tiktoken_special_tokens;
  o.sentencepiece_legacy = d.tokenizer_sentencepiece_legacy;
  o.hf_include_special_tokens = d.tokenizer_hf_include_special_tokens;
  o.legacy = d.legacy_tokenizer;
  if (tik && vocabGiven)
    o.vocab_size = m.vocab_size; // Megatron passes --vocab-size to TikTokenizer
  if (null) {
    // NullTokenizer has no files: its vocabulary is this key. Megatron's
    // --vocab-size N gives N ids (current) or N + 1 (legacy), so the flag
    // behind vocab_size V is V or V - 1; either way EOD is V - 1.
    if (!vocabGiven)
      fail(at("model", "vocab_size"),
           "tokenizer_type = \"NullTokenizer\" takes its vocabulary from model.vocab_size, "
           "which is not set",
           "set model.vocab_size (Megatron's --vocab-size N; N + 1 with legacy_tokenizer)");
    if (d.legacy_tokenizer && m.vocab_size < 2)
      fail(at("model", "vocab_size"),
           "model.vocab_size = 1 leaves the legacy NullTokenizer no id besides its "
           "end-of-document token",
           "set vocab_size to Megatron's --vocab-size + 1");
    o.vocab_size = d.legacy_tokenizer ? m.vocab_size - 1 : m.vocab_size;
  }

  // Is there something mtc can read? The files may live only on the
  // cluster (or be a hub name); then vocab_size must be given.
  std::string fileKey = gpt2 ? "vocab_file" : "tokenizer_model", why;
  if (gpt2 && d.vocab_file.empty() != d.merge_file.empty())
    fail(at("data", d.vocab_file.empty() ? "merge_file" : "vocab_file"),
         "GPT2BPETokenizer needs both data.vocab_file and data.merge_file",
         std::string("add data.") + (d.vocab_file.empty() ? "vocab_file" : "merge_file"));
  if (gpt2 && d.vocab_file.empty())
    why = "the spec names no vocab_file and merge_file";
  else if (gpt2 && !present(d.vocab_file))
    why = "data.vocab_file " + quote(d.vocab_file) + " is not here";
  else if (gpt2 && !present(d.merge_file))
    why = "data.merge_file " + quote(d.merge_file) + " is not here";
  else if (!gpt2 && !null && d.tokenizer_model.empty())
    why = "the spec names no tokenizer_model";
  else if (!gpt2 && !null && !present(d.tokenizer_model))
    why = "data.tokenizer_model " + quote(d.tokenizer_model) +
          " is not a file or directory here (a hub name is not read)";
  std::string bad = rt::check_tokenizer_options(o);
  if (why.empty() && bad.rfind("--tokenizer-type " + type + " is not supported", 0) == 0)
    why = "this mt cannot read " + type + " files yet";

  if (!why.empty()) {
    if (!vocabGiven)
      fail(at("model", "vocab_size"),
           "model.vocab_size is not set and mtc cannot take it from the tokenizer: " + why,
           "set model.vocab_size, or point the tokenizer's [data] keys at local files");
    // GPT-2's <|endoftext|> is its last id; for other tokenizers mock data
    // then ends documents with an id that may not be theirs (the summary
    // says so).
    d.eod_id = m.vocab_size - 1;
    d.tokenizer.clear();
    d.tokenizer_unread = gpt2 && d.vocab_file.empty() ? "" : why;
    return;
  }
  if (!bad.empty())
    fail(at("data", "tokenizer_type"),
         "tokenizer_type = " + quote(type) + " with these [data] keys: " + bad +
             " (in Megatron's flag names; docs/spec.md gives their keys)",
         "change the [data] keys it names");
  std::string error;
  std::shared_ptr<const rt::Tokenizer> tok = rt::load_tokenizer(o, &error);
  if (!tok)
    fail(at("data", null ? "tokenizer_type" : fileKey.c_str()),
         "cannot read the tokenizer: " + error,
         "fix the file, or point data." + fileKey + " at the tokenizer the data was made with");
  const int64_t n = static_cast<int64_t>(tok->vocab_size());
  if (vocabGiven && m.vocab_size != n)
    fail(at("model", "vocab_size"),
         "model.vocab_size = " + std::to_string(m.vocab_size) + " disagrees with the tokenizer: " +
             tok->describe() + " has " + std::to_string(n) + " ids (data." +
             (gpt2 ? "vocab_file " + quote(d.vocab_file)
                   : "tokenizer_model " + quote(d.tokenizer_model)) +
             ")",
         "remove vocab_size (mtc takes it from the tokenizer), or set vocab_size = " +
             std::to_string(n));
  m.vocab_size = n;
  d.eod_id = tok->eod();
  d.tokenizer = tok->describe() + ", end of document " + std::to_string(d.eod_id);
}

} // namespace mt::spec::detail
