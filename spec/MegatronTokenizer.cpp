// The vocabulary size of a Megatron tokenizer's files, for `mtc import-megatron`.
//
// Megatron pads the embedding from tokenizer.vocab_size
// (megatron/training/tokenizer/tokenizer.py, build_tokenizer): for
// GPT2BPETokenizer that is the number of entries of vocab.json; for
// HuggingFaceTokenizer it is len(AutoTokenizer), which the `tokenizers`
// library computes as get_vocab_size(with_added_tokens=True): the distinct
// token strings of the model's vocabulary and the added tokens together.
#include "spec/MegatronImportImpl.h"

#include "absl/strings/str_cat.h"

#include <set>
#include <simdjson.h>
#include <string_view>
#include <sys/stat.h>

namespace mt::spec::megatron {

namespace {

absl::StatusOr<simdjson::dom::element> load(simdjson::dom::parser &parser,
                                            const std::string &path) {
  simdjson::dom::element doc;
  auto err = parser.load(path).get(doc);
  if (err == simdjson::IO_ERROR)
    return absl::NotFoundError("cannot read '" + path + "'");
  if (err)
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not valid JSON (", simdjson::error_message(err), ")"));
  return doc;
}

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

} // namespace

absl::StatusOr<int64_t> gpt2VocabSize(const std::string &vocabJson) {
  simdjson::dom::parser parser;
  absl::StatusOr<simdjson::dom::element> doc = load(parser, vocabJson);
  if (!doc.ok())
    return doc.status();
  simdjson::dom::object obj;
  if (doc->get(obj))
    return absl::InvalidArgumentError("'" + vocabJson +
                                      "' is not a GPT-2 vocab.json (a JSON object of tokens)");
  // json.load keeps the last of repeated keys: count each token once.
  std::set<std::string_view> tokens;
  for (auto field : obj)
    tokens.insert(field.key);
  return static_cast<int64_t>(tokens.size());
}

absl::StatusOr<HfVocab> hfVocabSize(const std::string &tokenizerModel) {
  std::string path = tokenizerModel;
  if (isDirectory(path))
    path += "/tokenizer.json";
  simdjson::dom::parser parser;
  absl::StatusOr<simdjson::dom::element> doc = load(parser, path);
  if (!doc.ok())
    return doc.status();
  auto bad = [&](const std::string &what) {
    return absl::InvalidArgumentError("'" + path + "' is not a tokenizer.json: " + what);
  };
  simdjson::dom::element vocab;
  if ((*doc)["model"]["vocab"].get(vocab))
    return bad("it has no model.vocab");
  HfVocab out;
  out.file = path;
  std::set<std::string_view> tokens;
  simdjson::dom::object byToken;
  simdjson::dom::array pieces;
  if (!vocab.get(byToken)) {
    // BPE, WordPiece, WordLevel: {"token": id, ...}
    for (auto field : byToken)
      tokens.insert(field.key);
  } else if (!vocab.get(pieces)) {
    // Unigram: [["piece", score], ...]
    for (simdjson::dom::element p : pieces) {
      std::string_view piece;
      if (p.at(0).get(piece))
        return bad("a model.vocab entry is not [piece, score]");
      tokens.insert(piece);
    }
  } else {
    return bad("model.vocab is neither an object nor a list");
  }
  out.model = static_cast<int64_t>(tokens.size());
  simdjson::dom::array added;
  if (!(*doc)["added_tokens"].get(added)) {
    for (simdjson::dom::element t : added) {
      std::string_view content;
      if (t["content"].get(content))
        return bad("an added_tokens entry has no content");
      tokens.insert(content);
    }
  }
  out.total = static_cast<int64_t>(tokens.size());
  return out;
}

} // namespace mt::spec::megatron
