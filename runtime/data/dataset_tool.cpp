// `mt-dataset`: inspect and verify Megatron indexed datasets, and print the
// training samples Megatron would build from them (see dataset_tool.h).
#include "runtime/data/dataset_tool.h"

#include "runtime/data/gpt_dataset.h"
#include "runtime/data/indexed_dataset.h"
#include "runtime/data/tokenizers/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {
namespace {

const char *kMainHelp = R"TXT(usage: mt-dataset <command> [options]

Inspects and checks Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx), as
written by mt-preprocess or Megatron-LM's tools/preprocess_data.py, and prints
the training samples Megatron-LM builds from them.

commands:
  inspect PREFIX        counts, document lengths and the first documents
                        (see 'mt-dataset inspect --help')
  verify PREFIX...      check every dataset is consistent and usable
                        (see 'mt-dataset verify --help')
  samples PREFIX        the token ids of training samples, in Megatron's order
                        (see 'mt-dataset samples --help')
  help, --help, -h      this text

PREFIX is the path without suffix; a trailing .bin or .idx is ignored.
)TXT";

const char *kInspectHelp = R"TXT(usage: mt-dataset inspect PREFIX [options]

Prints the dataset's dtype (uint16 or int32, as Megatron picks it from the
vocabulary size), counts of documents, sequences and tokens, the
min/mean/max document length, and the first tokens of the first documents.
With a tokenizer (mt-preprocess's flags) it shows the documents' text too.

options:
  --documents N         how many documents to show (default 1)
  --tokenizer-type TYPE the tokenizer, with its files (below)
  --help, -h            this text
)TXT";

const char *kVerifyHelp = R"TXT(usage: mt-dataset verify PREFIX [PREFIX...] [options]

Checks each dataset as the runtime does before training: header, counts,
sequence lengths and offsets, document indices and the .bin size. With a
vocabulary it also reads every token and checks its id is in [0, vocab size).
Prints "PREFIX: ok (DTYPE, ...)" or one error line per dataset; exits 1 if any
fails.

options:
  --vocab-size N        check token ids are below N (alone, or NullTokenizer's)
  --tokenizer-type TYPE check ids against that tokenizer's vocabulary, with its
                        files (below)
  --help, -h            this text
)TXT";

const char *kSamplesHelp = R"TXT(usage: mt-dataset samples PREFIX [options]
       mt-dataset samples W1 PREFIX1 W2 PREFIX2 ... [options]
       mt-dataset samples --mock --vocab-size V [options]
       mt-dataset samples --mock --tokenizer-type TYPE [its files] [options]

Builds (or loads from the index cache) the indices of one split exactly as
Megatron-LM's GPTDataset does (BlendedDataset for weighted prefixes,
MockGPTDataset with --mock) and prints samples 0, 1, ... one line each: the
seq-length + 1 token ids, separated by spaces. What was built (split range,
epochs, cache file) goes to stderr.

options:
  --seq-length L        Megatron's --seq-length: a sample is L + 1 ids (required)
  --num-samples N       samples to build the indices for (required)
  --which SPLIT         train (default), valid or test
  --split S             Megatron's split string (default 969,30,1; mock data
                        always uses 1,1,1)
  --seed S              Megatron's --seed (default 1234)
  --show K              how many samples to print (default 10; at most the
                        split's size)
  --cache-dir DIR       where index files are cached (default
                        PREFIX/cache/GPTDataset_indices, Megatron's)
  --vocab-size V        check every token id is below V; mock data needs it
                        (its end-of-document id is V - 1)
  --tokenizer-type TYPE instead of --vocab-size: the tokenizer's vocabulary, and
                        its end-of-document id for mock data (flags below)
  --mock                Megatron's mock data instead of a dataset
  --help, -h            this text
)TXT";

// How many token ids and how many characters of text inspect shows. Byte-level
// BPE tokens are at least one byte and a character at most four, so decoding
// 4 * kShownChars tokens always yields enough text to clip.
constexpr size_t kShownIds = 32;
constexpr size_t kShownChars = 400;
constexpr size_t kDecodedTokens = 4 * kShownChars;

size_t edit_distance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "; did you mean 'X'?" for the closest candidate, or "" when none is close.
std::string did_you_mean(const std::string &word, const std::vector<std::string> &candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string &c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  if (best.empty() || best_d > std::max<size_t>(2, best.size() / 3))
    return "";
  return "; did you mean '" + best + "'?";
}

int usage_error(const std::string &cmd, const std::string &msg) {
  std::fprintf(stderr, "mt-dataset %s: error: %s; see 'mt-dataset %s --help'\n", cmd.c_str(),
               msg.c_str(), cmd.c_str());
  return 2;
}

std::string strip_suffix(std::string prefix) {
  for (const char *s : {".bin", ".idx"})
    if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, s) == 0)
      return prefix.substr(0, prefix.size() - 4);
  return prefix;
}

bool parse_count(const std::string &s, uint64_t *out) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *out = std::strtoull(s.c_str(), nullptr, 10);
  return true;
}

struct Args {
  std::vector<std::string> positional;
  TokenizerOptions tokenizer;
  bool tokenizer_given = false; // a tokenizer flag other than --vocab-size
  uint64_t documents = 1, vocab_size = 0;
  bool has_vocab_size = false, help = false;
  // samples
  uint64_t seq_length = 0, num_samples = 0, seed = 1234, show = 10;
  bool has_seq_length = false, has_num_samples = false, mock = false;
  std::string which = "train", split = "969,30,1", cache_dir;
};

// Parses `--opt VALUE` / `--opt=VALUE`, and with `tokenizer` Megatron's
// tokenizer flags; returns "" or the usage error.
std::string parse_args(const std::vector<std::string> &args, const std::vector<std::string> &known,
                       Args *out, bool tokenizer = false) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    if (a == "--help" || a == "-h") {
      out->help = true;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') {
      out->positional.push_back(a);
      continue;
    }
    const bool vocab_size = a == "--vocab-size" || a.rfind("--vocab-size=", 0) == 0;
    if (std::string err; tokenizer && !vocab_size &&
                         parse_tokenizer_flag(args, i, out->tokenizer, &err)) {
      if (!err.empty())
        return err;
      out->tokenizer_given = true;
      continue;
    }
    std::string name = a, value;
    bool inline_value = false;
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::vector<std::string> all = known;
      if (tokenizer)
        all.insert(all.end(), {"--tokenizer-type", "--vocab-file", "--merge-file",
                               "--tokenizer-model"});
      return "unknown option '" + a + "'" + did_you_mean(name, all);
    }
    if (name == "--mock") {
      if (inline_value)
        return "--mock takes no value";
      out->mock = true;
      continue;
    }
    if (!inline_value) {
      if (i + 1 == args.size())
        return name + " needs a value";
      value = args[++i];
    }
    if (name == "--documents") {
      if (!parse_count(value, &out->documents))
        return "--documents needs a whole number, got '" + value + "'";
    } else if (name == "--vocab-size") {
      if (!parse_count(value, &out->vocab_size) || out->vocab_size == 0)
        return "--vocab-size needs a whole number above 0, got '" + value + "'";
      out->has_vocab_size = true;
      out->tokenizer.vocab_size = static_cast<int64_t>(out->vocab_size);
    } else if (name == "--seq-length") {
      if (!parse_count(value, &out->seq_length) || out->seq_length < 2)
        return "--seq-length needs a whole number of at least 2, got '" + value + "'";
      out->has_seq_length = true;
    } else if (name == "--num-samples") {
      if (!parse_count(value, &out->num_samples))
        return "--num-samples needs a whole number, got '" + value + "'";
      out->has_num_samples = true;
    } else if (name == "--seed") {
      if (!parse_count(value, &out->seed))
        return "--seed needs a whole number, got '" + value + "'";
    } else if (name == "--show") {
      if (!parse_count(value, &out->show))
        return "--show needs a whole number, got '" + value + "'";
    } else if (name == "--which") {
      if (value != "train" && value != "valid" && value != "test")
        return "--which needs train, valid or test, got '" + value + "'" +
               did_you_mean(value, {"train", "valid", "test"});
      out->which = value;
    } else if (name == "--split") {
      out->split = value;
    } else if (name == "--cache-dir") {
      out->cache_dir = value;
    }
  }
  if (out->tokenizer_given) {
    if (std::string bad = check_tokenizer_options(out->tokenizer); !bad.empty())
      return bad;
  }
  return "";
}

uint64_t file_size(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Tokens of document `doc` (all its sequences in order), at most `limit`.
std::vector<int32_t> document_tokens(const IndexedDataset &ds, uint64_t doc, size_t limit) {
  std::vector<int32_t> out;
  for (int64_t s = ds.document_index(doc); s < ds.document_index(doc + 1) && out.size() < limit;
       ++s) {
    size_t n = std::min<size_t>(static_cast<size_t>(ds.sequence_length(s)), limit - out.size());
    size_t at = out.size();
    out.resize(at + n);
    ds.read(static_cast<uint64_t>(s), 0, n, out.data() + at);
  }
  return out;
}

uint64_t document_length(const IndexedDataset &ds, uint64_t doc) {
  uint64_t n = 0;
  for (int64_t s = ds.document_index(doc); s < ds.document_index(doc + 1); ++s)
    n += static_cast<uint64_t>(ds.sequence_length(s));
  return n;
}

// Text on one line: control characters escaped, clipped on a UTF-8 boundary.
std::string quote_clipped(const std::string &text, bool more) {
  std::string out = "\"";
  size_t shown = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (shown >= kShownChars && (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      more = true;
      break;
    }
    unsigned char c = static_cast<unsigned char>(text[i]);
    char esc[8];
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c == '"' || c == '\\')
      out += std::string("\\") + static_cast<char>(c);
    else if (c < 0x20 || c == 0x7f) {
      std::snprintf(esc, sizeof(esc), "\\x%02x", c);
      out += esc;
    } else
      out += static_cast<char>(c);
    if ((c & 0xC0) != 0x80)
      ++shown;
  }
  out += "\"";
  if (more)
    out += "...";
  return out;
}

// The tokenizer the flags name, or null when none is named (*failed: it
// was named and did not load; the error is printed).
std::shared_ptr<const Tokenizer> load_named_tokenizer(const Args &a, bool *failed) {
  *failed = false;
  if (!a.tokenizer_given)
    return nullptr;
  std::string err;
  auto tokenizer = load_tokenizer(a.tokenizer, &err);
  if (!tokenizer) {
    std::fprintf(stderr, "%s\n", err.c_str());
    *failed = true;
  }
  return tokenizer;
}

int run_inspect(const std::vector<std::string> &args) {
  Args a;
  std::string err = parse_args(args, {"--documents", "--vocab-size", "--help"}, &a, true);
  if (!err.empty())
    return usage_error("inspect", err);
  if (a.help) {
    std::fputs(kInspectHelp, stdout);
    std::fputs(tokenizer_flags_usage(), stdout);
    return 0;
  }
  if (a.has_vocab_size && !a.tokenizer_given)
    return usage_error("inspect", "--vocab-size goes with --tokenizer-type NullTokenizer here");
  if (a.positional.empty())
    return usage_error("inspect", "no dataset given: mt-dataset inspect PREFIX");
  if (a.positional.size() > 1)
    return usage_error("inspect", "more than one dataset given ('" + a.positional[0] + "' and '" +
                                      a.positional[1] + "'); inspect takes one");
  bool tokenizer_failed;
  auto tokenizer = load_named_tokenizer(a, &tokenizer_failed);
  if (tokenizer_failed)
    return 1;

  const std::string prefix = strip_suffix(a.positional[0]);
  auto ds = IndexedDataset::open(prefix, &err);
  if (!ds) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  const uint64_t docs = ds->num_documents();
  std::printf("path:      %s (.bin %llu bytes, .idx %llu bytes)\n", prefix.c_str(),
              static_cast<unsigned long long>(file_size(prefix + ".bin")),
              static_cast<unsigned long long>(file_size(prefix + ".idx")));
  std::printf("dtype:     %s\n", dtype_name(ds->dtype()));
  if (tokenizer) {
    TokenDtype expected = dtype_for_vocab_size(tokenizer->vocab_size());
    std::printf("tokenizer: %s: %zu ids, end of document %d\n", tokenizer->describe().c_str(),
                tokenizer->vocab_size(), tokenizer->eod());
    if (expected != ds->dtype())
      std::printf("note:      Megatron writes %s for this tokenizer's %zu ids, not %s; check "
                  "the dataset was made with it\n",
                  dtype_name(expected), tokenizer->vocab_size(), dtype_name(ds->dtype()));
  }
  std::printf("documents: %llu\n", static_cast<unsigned long long>(docs));
  std::printf("sequences: %llu\n", static_cast<unsigned long long>(ds->num_sequences()));
  std::printf("tokens:    %llu\n", static_cast<unsigned long long>(ds->num_tokens()));
  if (docs == 0) {
    std::printf("document length: no documents\n");
    return 0;
  }
  uint64_t lo = UINT64_MAX, hi = 0;
  for (uint64_t d = 0; d < docs; ++d) {
    uint64_t n = document_length(*ds, d);
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  std::printf("document length: min %llu, mean %.1f, max %llu tokens\n",
              static_cast<unsigned long long>(lo),
              static_cast<double>(ds->num_tokens()) / static_cast<double>(docs),
              static_cast<unsigned long long>(hi));

  for (uint64_t d = 0; d < std::min(docs, a.documents); ++d) {
    int64_t sequences = ds->document_index(d + 1) - ds->document_index(d);
    uint64_t n = document_length(*ds, d);
    std::printf("document %llu: %llu tokens in %llu sequence%s\n",
                static_cast<unsigned long long>(d), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(sequences), sequences == 1 ? "" : "s");
    std::vector<int32_t> ids = document_tokens(*ds, d, std::max(kShownIds, kDecodedTokens));
    std::string line = "  ids:  [";
    for (size_t i = 0; i < std::min(ids.size(), kShownIds); ++i)
      line += (i ? ", " : "") + std::to_string(ids[i]);
    line += "]";
    if (n > kShownIds)
      line += " ... (" + std::to_string(n - kShownIds) + " more)";
    std::printf("%s\n", line.c_str());
    if (!tokenizer)
      continue;
    auto bad = std::find_if(ids.begin(), ids.end(), [&](int32_t id) {
      return id < 0 || static_cast<size_t>(id) >= tokenizer->vocab_size();
    });
    if (bad != ids.end()) {
      std::printf("  text: (not shown: token id %d is outside the vocabulary of %zu ids)\n", *bad,
                  tokenizer->vocab_size());
      continue;
    }
    std::string text = tokenizer->decode(ids.data(), ids.size());
    std::printf("  text: %s\n", quote_clipped(text, n > ids.size()).c_str());
  }
  return 0;
}

// Every token id in [0, vocab); returns "" or the error line.
std::string check_token_ids(const IndexedDataset &ds, const std::string &prefix, uint64_t vocab) {
  constexpr uint64_t kChunk = 1 << 16;
  std::vector<int32_t> buf(kChunk);
  for (uint64_t s = 0; s < ds.num_sequences(); ++s) {
    uint64_t len = static_cast<uint64_t>(ds.sequence_length(s));
    for (uint64_t at = 0; at < len; at += kChunk) {
      uint64_t n = std::min(kChunk, len - at);
      ds.read(s, at, n, buf.data());
      for (uint64_t i = 0; i < n; ++i) {
        if (buf[i] >= 0 && static_cast<uint64_t>(buf[i]) < vocab)
          continue;
        uint64_t doc = ds.document_of_sequence(s);
        return prefix + ".bin: error: token id " + std::to_string(buf[i]) + " (document " +
               std::to_string(doc) + ", sequence " + std::to_string(s) + ", position " +
               std::to_string(at + i) + ") is outside the vocabulary [0, " + std::to_string(vocab) +
               "); check the vocabulary matches the one the dataset was made with";
      }
    }
  }
  return "";
}

int run_verify(const std::vector<std::string> &args) {
  Args a;
  std::string err = parse_args(args, {"--vocab-size", "--help"}, &a, true);
  if (!err.empty())
    return usage_error("verify", err);
  if (a.help) {
    std::fputs(kVerifyHelp, stdout);
    std::fputs(tokenizer_flags_usage(), stdout);
    return 0;
  }
  if (a.positional.empty())
    return usage_error("verify", "no dataset given: mt-dataset verify PREFIX [PREFIX...]");
  if (a.has_vocab_size && a.tokenizer_given && a.tokenizer.type != "NullTokenizer" &&
      a.tokenizer.type != "TikTokenizer")
    return usage_error("verify", "give --vocab-size or a tokenizer's files, not both");
  bool tokenizer_failed;
  auto tokenizer = load_named_tokenizer(a, &tokenizer_failed);
  if (tokenizer_failed)
    return 1;
  uint64_t vocab_size = tokenizer ? tokenizer->vocab_size() : a.vocab_size;

  int status = 0;
  for (const std::string &given : a.positional) {
    const std::string prefix = strip_suffix(given);
    err.clear();
    auto ds = IndexedDataset::open(prefix, &err);
    if (ds && vocab_size)
      err = check_token_ids(*ds, prefix, vocab_size);
    if (!ds || !err.empty()) {
      std::fprintf(stderr, "%s\n", err.c_str());
      status = 1;
      continue;
    }
    std::printf("%s: ok (%s, %llu documents, %llu sequences, %llu tokens)\n", prefix.c_str(),
                dtype_name(ds->dtype()), static_cast<unsigned long long>(ds->num_documents()),
                static_cast<unsigned long long>(ds->num_sequences()),
                static_cast<unsigned long long>(ds->num_tokens()));
    std::fflush(stdout);
  }
  return status;
}

// A blend weight: a finite number >= 0, as Python's float() reads it.
bool parse_weight(const std::string &s, double *out) {
  if (s.empty())
    return false;
  char *end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v) || v < 0)
    return false;
  *out = v;
  return true;
}

int run_samples(const std::vector<std::string> &args) {
  Args a;
  std::string err = parse_args(args,
                               {"--seq-length", "--num-samples", "--which", "--split", "--seed",
                                "--show", "--cache-dir", "--vocab-size", "--mock", "--help"},
                               &a, true);
  if (!err.empty())
    return usage_error("samples", err);
  if (a.help) {
    std::fputs(kSamplesHelp, stdout);
    std::fputs(tokenizer_flags_usage(), stdout);
    return 0;
  }
  if (a.has_vocab_size && a.tokenizer_given && a.tokenizer.type != "NullTokenizer" &&
      a.tokenizer.type != "TikTokenizer")
    return usage_error("samples", "give --vocab-size or a tokenizer's files, not both");
  bool tokenizer_failed;
  auto tokenizer = load_named_tokenizer(a, &tokenizer_failed);
  if (tokenizer_failed)
    return 1;
  GptDataConfig config;
  if (tokenizer) {
    a.vocab_size = tokenizer->vocab_size();
    a.has_vocab_size = true;
    config.eod = tokenizer->eod();
  }
  if (a.mock) {
    if (!a.positional.empty())
      return usage_error("samples", "--mock takes no dataset, got '" + a.positional[0] + "'");
    if (!a.has_vocab_size)
      return usage_error("samples", "--mock needs --vocab-size (its end-of-document id is V - 1)");
    config.mock = true;
  } else if (a.positional.empty()) {
    return usage_error("samples", "no dataset given: mt-dataset samples PREFIX, or weighted "
                                  "prefixes W1 PREFIX1 W2 PREFIX2, or --mock");
  } else if (a.positional.size() == 1) {
    config.blend.push_back({1.0, strip_suffix(a.positional[0])});
  } else {
    if (a.positional.size() % 2 != 0)
      return usage_error("samples", std::to_string(a.positional.size()) +
                                        " words given; a blend is pairs of weight and prefix "
                                        "(0.3 A 0.7 B)");
    for (size_t i = 0; i < a.positional.size(); i += 2) {
      double w;
      if (!parse_weight(a.positional[i], &w))
        return usage_error("samples", "blend weight '" + a.positional[i] + "' (before '" +
                                          a.positional[i + 1] +
                                          "') is not a number >= 0; a blend is pairs of weight "
                                          "and prefix");
      config.blend.push_back({w, strip_suffix(a.positional[i + 1])});
    }
  }
  if (!a.has_seq_length)
    return usage_error("samples", "--seq-length is required");
  if (!a.has_num_samples)
    return usage_error("samples", "--num-samples is required");
  config.split = a.split;
  config.seq_length = static_cast<int64_t>(a.seq_length);
  config.seed = a.seed;
  config.vocab_size = static_cast<int64_t>(a.vocab_size);
  config.cache_dir = a.cache_dir;
  DataSplit which = a.which == "train" ? DataSplit::Train
                    : a.which == "valid" ? DataSplit::Valid
                                         : DataSplit::Test;

  auto ds = GptDataset::build(config, which, static_cast<int64_t>(a.num_samples), &err);
  if (!ds) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  std::fprintf(stderr, "%s\n", ds->describe().c_str());
  const int64_t show = std::min<int64_t>(static_cast<int64_t>(a.show), ds->size());
  std::vector<int32_t> tokens(static_cast<size_t>(ds->seq_length() + 1));
  std::string line;
  for (int64_t i = 0; i < show; ++i) {
    if (std::string e = ds->sample(i, tokens.data()); !e.empty()) {
      std::fprintf(stderr, "%s\n", e.c_str());
      return 1;
    }
    line.clear();
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k)
        line += ' ';
      line += std::to_string(tokens[k]);
    }
    line += '\n';
    std::fputs(line.c_str(), stdout);
  }
  return 0;
}

} // namespace

int run_mt_dataset(const std::vector<std::string> &args) {
  if (args.empty()) {
    std::fputs(kMainHelp, stderr);
    return 2;
  }
  const std::string &cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kMainHelp, stdout);
    return 0;
  }
  if (cmd == "inspect")
    return run_inspect(rest);
  if (cmd == "verify")
    return run_verify(rest);
  if (cmd == "samples")
    return run_samples(rest);
  std::string what = cmd.rfind("-", 0) == 0 ? "option" : "command";
  std::fprintf(stderr,
               "mt-dataset: error: unknown %s '%s'%s; run 'mt-dataset --help' for the list\n",
               what.c_str(), cmd.c_str(),
               did_you_mean(cmd, {"inspect", "verify", "samples", "help", "--help"}).c_str());
  return 2;
}

} // namespace mt::rt
