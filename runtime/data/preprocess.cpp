// mt-preprocess: raw text or jsonl -> Megatron indexed dataset. Reads input in
// order, tokenizes batches on worker threads, writes results back in input
// order, so output is the same whatever --workers is. Semantics follow
// Megatron-LM's tools/preprocess_data.py (Encoder.encode, process_json_file).
#include "runtime/data/preprocess.h"

#include "runtime/data/tokenizers/tokenizer.h"
#include "runtime/data/indexed_dataset.h"

#include <simdjson.h>

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace mt::rt {
namespace {

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

struct Options {
  std::vector<std::string> inputs; // as given (globs expanded later)
  std::string input_format = "json";
  bool document_per_file = false;
  std::vector<std::string> json_keys = {"text"};
  std::string output_prefix;
  TokenizerOptions tokenizer;
  bool append_eod = false;
  int workers = 0; // 0 = one per core
  long log_interval = 1000;
  bool skip_bad_documents = false;
  bool quiet = false;
};

const char *kUsage = R"(usage: mt-preprocess --input FILE [FILE...] --output-prefix PREFIX
                     --tokenizer-type TYPE [its files] [options]

Tokenizes documents with one of Megatron-LM's tokenizers and writes Megatron-LM's indexed dataset
PREFIX_KEY_document.bin/.idx (one pair per JSON key), byte for byte as
Megatron-LM's tools/preprocess_data.py writes it.

input:
  --input FILE...           one or more files or quoted globs, read in order
  --input-format json|text  json (default): one JSON object per line (jsonl);
                            text: plain text, one document per line
  --document-per-file       with text: each file is one document
  --json-keys KEY...        keys to extract (default: text); a key's value is a
                            string, or a list of strings (one sequence each)
  --skip-bad-documents      count and report malformed lines instead of stopping
tokenization:
  --append-eod              append the tokenizer's end-of-document id to each
                            non-empty document
output and run:
  --output-prefix PREFIX    output path without suffix
  --workers N               tokenizer threads (default: one per core)
  --log-interval N          progress line every N documents (default 1000)
  --quiet                   no progress output
  --help                    this text

Accepted for compatibility and without effect: --dataset-impl mmap,
--partitions N, --keep-sequential-samples (order is always kept).
)";

int usage_error(const std::string &msg) {
  std::fprintf(stderr, "mt-preprocess: error: %s; see 'mt-preprocess --help'\n", msg.c_str());
  return 2;
}

// Parses argv; returns an exit status when the run should stop here.
std::optional<int> parse_options(const std::vector<std::string> &args, Options &o) {
  auto is_flag = [](const std::string &s) { return s.rfind("--", 0) == 0; };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], inline_value;
    bool has_inline = false;
    if (is_flag(a)) {
      size_t eq = a.find('=');
      if (eq != std::string::npos) {
        inline_value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
    }
    // Values of a flag: the inline one, or the following non-flag words.
    auto values = [&](bool many) -> std::vector<std::string> {
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
    auto one = [&](std::string &dst) -> bool {
      std::vector<std::string> v = values(false);
      if (v.empty() || v[0].empty())
        return false;
      dst = v[0];
      return true;
    };
    auto number = [&](long &dst, long min) -> bool {
      std::string v;
      if (!one(v))
        return false;
      char *end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || n < min)
        return false;
      dst = n;
      return true;
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::fputs(tokenizer_flags_usage(), stdout);
      return 0;
    } else if (a == "--input") {
      std::vector<std::string> v = values(true);
      if (v.empty())
        return usage_error("--input needs at least one file");
      o.inputs.insert(o.inputs.end(), v.begin(), v.end());
    } else if (a == "--input-format") {
      if (!one(o.input_format) || (o.input_format != "json" && o.input_format != "text"))
        return usage_error("--input-format must be 'json' or 'text'");
    } else if (a == "--document-per-file") {
      o.document_per_file = true;
    } else if (a == "--json-keys") {
      o.json_keys = values(true);
      if (o.json_keys.empty())
        return usage_error("--json-keys needs at least one key");
    } else if (a == "--output-prefix") {
      if (!one(o.output_prefix))
        return usage_error("--output-prefix needs a path");
    } else if (std::string error; parse_tokenizer_flag(args, i, o.tokenizer, &error)) {
      if (!error.empty())
        return usage_error(error);
    } else if (a == "--append-eod") {
      o.append_eod = true;
    } else if (a == "--workers") {
      long n = 0;
      if (!number(n, 1) || n > 1024)
        return usage_error("--workers needs a whole number from 1 to 1024");
      o.workers = static_cast<int>(n);
    } else if (a == "--log-interval") {
      if (!number(o.log_interval, 1))
        return usage_error("--log-interval needs a positive whole number");
    } else if (a == "--skip-bad-documents") {
      o.skip_bad_documents = true;
    } else if (a == "--quiet") {
      o.quiet = true;
    } else if (a == "--dataset-impl") {
      std::string v;
      if (!one(v) || v != "mmap")
        return usage_error("--dataset-impl: only 'mmap' exists (Megatron's indexed format)");
    } else if (a == "--partitions") {
      long n = 0;
      if (!number(n, 1))
        return usage_error("--partitions needs a positive whole number");
    } else if (a == "--keep-sequential-samples") {
    } else if (a == "--split-sentences" || a == "--keep-newlines" || a == "--lang") {
      return usage_error(a + " is not supported: sentence splitting needs NLTK's punkt "
                             "models; give documents as a list of sentences in the JSON "
                             "value instead");
    } else {
      return usage_error("unknown option '" + args[i] + "'");
    }
  }
  if (o.inputs.empty())
    return usage_error("no input: give --input FILE");
  if (o.output_prefix.empty())
    return usage_error("no output: give --output-prefix PREFIX");
  if (std::string bad = check_tokenizer_options(o.tokenizer); !bad.empty())
    return usage_error(bad);
  if (o.document_per_file && o.input_format != "text")
    return usage_error("--document-per-file goes with --input-format text");
  if (o.input_format == "text" && !(o.json_keys.size() == 1 && o.json_keys[0] == "text"))
    return usage_error("--json-keys applies to json input only");
  if (o.workers == 0)
    o.workers = std::max(1u, std::thread::hardware_concurrency());
  return std::nullopt;
}

// Expands globs (sorted, as the shell would) and checks every input exists.
bool expand_inputs(const std::vector<std::string> &given, std::vector<std::string> &out,
                   uint64_t &total_bytes, std::string &error) {
  total_bytes = 0;
  for (const std::string &pattern : given) {
    std::vector<std::string> matched;
    if (pattern.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i)
          matched.push_back(g.gl_pathv[i]);
      ::globfree(&g);
      if (matched.empty()) {
        error = pattern + ": error: the pattern matches no file; check the path";
        return false;
      }
    } else {
      matched.push_back(pattern);
    }
    for (const std::string &path : matched) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        error = path + ": error: cannot read input: " +
                (errno ? std::strerror(errno) : "not a regular file") + "; check the path";
        return false;
      }
      total_bytes += static_cast<uint64_t>(st.st_size);
      out.push_back(path);
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Reading: documents in input order, batched
// ---------------------------------------------------------------------------

struct RawDoc {
  uint32_t file = 0;   // index into the input list
  uint64_t line = 0;   // 1-based; 0 for --document-per-file
  std::string bytes;   // the line (without '\n') or the whole file
  bool newline = false; // the line ended with '\n'
};

struct Batch {
  uint64_t seq = 0;
  std::vector<RawDoc> docs;
};

// Streams lines from the inputs in fixed-size reads, so memory stays bounded
// by the batch size and the longest line, not by the input size.
class DocumentReader {
public:
  DocumentReader(const std::vector<std::string> &files, bool whole_files)
      : files_(files), whole_files_(whole_files) {}

  // Fills up to `max_bytes` of documents; false at end of input or on error.
  bool next(std::vector<RawDoc> &docs, size_t max_bytes, std::string &error) {
    docs.clear();
    size_t bytes = 0;
    while (bytes < max_bytes) {
      RawDoc doc;
      int r = read_one(doc, error);
      if (r < 0)
        return false;
      if (r == 0)
        break;
      bytes += doc.bytes.size() + 1;
      docs.push_back(std::move(doc));
    }
    return !docs.empty();
  }

  uint64_t bytes_read() const { return bytes_read_; }

private:
  // 1 = a document, 0 = end of input, -1 = error.
  int read_one(RawDoc &doc, std::string &error) {
    while (true) {
      if (!fp_) {
        if (next_file_ >= files_.size())
          return 0;
        cur_file_ = next_file_++;
        fp_ = std::fopen(files_[cur_file_].c_str(), "rb");
        if (!fp_) {
          error = files_[cur_file_] + ": error: cannot open: " + std::strerror(errno) +
                  "; check the path and permissions";
          return -1;
        }
        line_ = 0;
        buf_.clear();
        pos_ = 0;
        eof_ = false;
      }
      if (whole_files_) {
        doc.file = static_cast<uint32_t>(cur_file_);
        doc.line = 0;
        doc.bytes.clear();
        char chunk[1 << 16];
        size_t n;
        while ((n = std::fread(chunk, 1, sizeof chunk, fp_)) > 0)
          doc.bytes.append(chunk, n);
        bool bad = std::ferror(fp_);
        close_file();
        if (bad) {
          error = files_[doc.file] + ": error: read failed; check the file";
          return -1;
        }
        bytes_read_ += doc.bytes.size();
        return 1;
      }
      // Line mode: find '\n' in the buffer, refilling as needed.
      while (true) {
        size_t nl = buf_.find('\n', pos_);
        if (nl != std::string::npos) {
          doc.bytes.assign(buf_, pos_, nl - pos_);
          doc.newline = true;
          bytes_read_ += nl - pos_ + 1;
          pos_ = nl + 1;
          break;
        }
        if (eof_) {
          if (pos_ < buf_.size()) { // last line without '\n'
            doc.bytes.assign(buf_, pos_, std::string::npos);
            doc.newline = false;
            bytes_read_ += buf_.size() - pos_;
            pos_ = buf_.size();
            break;
          }
          close_file();
          goto next_file;
        }
        buf_.erase(0, pos_);
        pos_ = 0;
        size_t old = buf_.size();
        buf_.resize(old + (1 << 20));
        size_t n = std::fread(&buf_[old], 1, 1 << 20, fp_);
        buf_.resize(old + n);
        if (n == 0) {
          if (std::ferror(fp_)) {
            error = files_[cur_file_] + ": error: read failed; check the file";
            return -1;
          }
          eof_ = true;
        }
      }
      doc.file = static_cast<uint32_t>(cur_file_);
      doc.line = ++line_;
      return 1;
    next_file:;
    }
  }

  void close_file() {
    if (fp_)
      std::fclose(fp_);
    fp_ = nullptr;
  }

  const std::vector<std::string> &files_;
  bool whole_files_;
  size_t next_file_ = 0, cur_file_ = 0;
  FILE *fp_ = nullptr;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
  uint64_t line_ = 0;
  uint64_t bytes_read_ = 0;
};

// ---------------------------------------------------------------------------
// Encoding (worker threads)
// ---------------------------------------------------------------------------

// One encoded document: per key, its tokens and sequence lengths.
struct EncodedDoc {
  std::vector<std::vector<int32_t>> tokens;   // [key]
  std::vector<std::vector<int32_t>> lengths;  // [key]
  std::string error;                          // non-empty: a bad document
  uint32_t file = 0;
  uint64_t line = 0;
  // Megatron's bytes_processed: len(json_line), the characters of the line
  // with its '\n' (UTF-8 code points, not bytes).
  uint64_t chars = 0;
};

struct EncodedBatch {
  std::vector<EncodedDoc> docs;
  uint64_t input_bytes = 0;
};

class Worker {
public:
  Worker(const Options &o, const Tokenizer &tokenizer)
      : o_(o), encoder_(tokenizer.encoder()), eod_(tokenizer.eod()) {}

  EncodedBatch encode(const Batch &batch) {
    EncodedBatch out;
    out.docs.resize(batch.docs.size());
    for (size_t i = 0; i < batch.docs.size(); ++i) {
      const RawDoc &raw = batch.docs[i];
      EncodedDoc &doc = out.docs[i];
      doc.file = raw.file;
      doc.line = raw.line;
      doc.chars = raw.newline;
      for (char c : raw.bytes)
        doc.chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
      out.input_bytes += raw.bytes.size() + 1;
      if (o_.input_format == "text")
        encode_text(raw.bytes, doc);
      else
        encode_json(raw.bytes, doc);
    }
    return out;
  }

private:
  // Megatron: tokenize each sentence, keep the non-empty ones as sequences,
  // and with --append-eod add EOD to the last sequence of a non-empty document.
  // False when the tokenizer refuses the text (doc.error says why).
  bool add_sentence(std::string_view text, std::vector<int32_t> &tokens,
                    std::vector<int32_t> &lengths, EncodedDoc &doc) {
    size_t before = tokens.size();
    if (!encoder_->try_encode(text, tokens, &doc.error))
      return false;
    if (tokens.size() > before)
      lengths.push_back(static_cast<int32_t>(tokens.size() - before));
    return true;
  }
  void finish_document(std::vector<int32_t> &tokens, std::vector<int32_t> &lengths) {
    if (o_.append_eod && !tokens.empty()) {
      tokens.push_back(eod_);
      lengths.back() += 1;
    }
  }

  void encode_text(const std::string &text, EncodedDoc &doc) {
    doc.tokens.resize(1);
    doc.lengths.resize(1);
    if (add_sentence(text, doc.tokens[0], doc.lengths[0], doc))
      finish_document(doc.tokens[0], doc.lengths[0]);
  }

  void encode_json(const std::string &line, EncodedDoc &doc) {
    padded_.assign(line);
    padded_.resize(line.size() + simdjson::SIMDJSON_PADDING, '\0');
    simdjson::dom::element root;
    auto err = parser_.parse(padded_.data(), line.size(), false).get(root);
    if (err) {
      doc.error = std::string("malformed JSON: ") + simdjson::error_message(err) +
                  "; fix the line";
      return;
    }
    simdjson::dom::object obj;
    if (root.get_object().get(obj)) {
      doc.error = "the line is JSON but not an object; each line must be one JSON object";
      return;
    }
    doc.tokens.resize(o_.json_keys.size());
    doc.lengths.resize(o_.json_keys.size());
    for (size_t k = 0; k < o_.json_keys.size(); ++k) {
      simdjson::dom::element value;
      if (obj.at_key(o_.json_keys[k]).get(value)) {
        doc.error = "no key '" + o_.json_keys[k] + "' in this JSON object; check --json-keys";
        return;
      }
      std::string_view text;
      simdjson::dom::array sentences;
      if (!value.get_string().get(text)) {
        if (!add_sentence(text, doc.tokens[k], doc.lengths[k], doc))
          return;
      } else if (!value.get_array().get(sentences)) {
        for (simdjson::dom::element s : sentences) {
          if (s.get_string().get(text)) {
            doc.error = "'" + o_.json_keys[k] +
                        "' is a list with a non-string element; use a string or a list of "
                        "strings";
            return;
          }
          if (!add_sentence(text, doc.tokens[k], doc.lengths[k], doc))
            return;
        }
      } else {
        doc.error = "'" + o_.json_keys[k] + "' is not a string or a list of strings";
        return;
      }
      finish_document(doc.tokens[k], doc.lengths[k]);
    }
  }

  const Options &o_;
  std::unique_ptr<TokenEncoder> encoder_;
  int32_t eod_;
  simdjson::dom::parser parser_;
  std::string padded_;
};

// ---------------------------------------------------------------------------
// Progress
// ---------------------------------------------------------------------------

class Progress {
public:
  Progress(const Options &o, uint64_t total_bytes)
      : o_(o), total_bytes_(total_bytes), bar_(!o.quiet && ::isatty(STDOUT_FILENO)),
        start_(std::chrono::steady_clock::now()) {}

  // `chars`: Megatron's total_bytes_processed so far (characters of the
  // lines read, this document's included); `bytes`: input bytes, for the bar.
  void document_done(uint64_t docs, uint64_t chars, uint64_t bytes) {
    if (o_.quiet)
      return;
    if (docs % static_cast<uint64_t>(o_.log_interval) == 0) {
      double s = elapsed();
      // Megatron's print_processing_stats, character for character: the
      // rates as Python prints floats, "MB" = 2^20 characters.
      std::fprintf(stderr, "Processed %llu documents (%s docs/s, %s MB/s).\n",
                   static_cast<unsigned long long>(docs),
                   python_float_repr(static_cast<double>(docs) / s).c_str(),
                   python_float_repr(static_cast<double>(chars) / s / 1024 / 1024).c_str());
    }
    if (bar_ && (docs & 255) == 0)
      draw(bytes, false);
  }

  void finish(uint64_t bytes) {
    if (bar_)
      draw(bytes, true);
  }

  double elapsed() const {
    return std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                        start_).count());
  }

private:
  void draw(uint64_t bytes, bool last) {
    double frac = total_bytes_ ? std::min(1.0, double(bytes) / double(total_bytes_)) : 1.0;
    double s = elapsed();
    double eta = frac > 0 ? s * (1.0 - frac) / frac : 0.0;
    int width = 30, filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(static_cast<size_t>(width), '.');
    std::printf("\r[%s] %5.1f%%  %.1f MB/s  ETA %02d:%02d%s", bar.c_str(), frac * 100.0,
                bytes / s / 1e6, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60,
                last ? "\n" : "");
    std::fflush(stdout);
  }

  const Options &o_;
  uint64_t total_bytes_;
  bool bar_;
  std::chrono::steady_clock::time_point start_;
};

// ---------------------------------------------------------------------------
// The pipeline: reader (this thread) -> workers -> in-order writer
// ---------------------------------------------------------------------------

class Pipeline {
public:
  Pipeline(const Options &o, std::vector<std::string> files, uint64_t total_bytes,
           std::shared_ptr<const Tokenizer> tokenizer)
      : o_(o), files_(std::move(files)), total_bytes_(total_bytes),
        tokenizer_(std::move(tokenizer)) {}

  int run() {
    // Writers first, so a bad output path fails before any work.
    TokenDtype dtype = dtype_for_vocab_size(tokenizer_->vocab_size());
    for (const std::string &key : o_.json_keys) {
      std::string prefix = o_.output_prefix + "_" + key + "_document", err;
      auto w = IndexedDatasetWriter::create(prefix, dtype, &err);
      if (!w)
        return fail(err);
      prefixes_.push_back(prefix);
      writers_.push_back(std::move(w));
    }

    Progress progress(o_, total_bytes_);
    const size_t max_inflight = static_cast<size_t>(o_.workers) * 2 + 2;
    std::vector<std::thread> threads;
    for (int t = 0; t < o_.workers; ++t)
      threads.emplace_back([this] { work(); });

    // The reader runs on its own thread; this thread writes in order.
    std::thread reader([&] { read(max_inflight); });

    uint64_t next = 0, docs_done = 0, bytes_done = 0, chars_done = 0, skipped = 0;
    std::string first_skip, error;
    while (true) {
      EncodedBatch batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return done_.count(next) || (reading_finished_ && next == batches_read_) ||
                 !read_error_.empty();
        });
        if (!read_error_.empty() && !done_.count(next)) {
          error = read_error_;
          break;
        }
        if (!done_.count(next))
          break; // all batches written
        batch = std::move(done_[next]);
        done_.erase(next);
        ++next;
      }
      cv_.notify_all(); // a slot freed for the reader
      for (EncodedDoc &doc : batch.docs) {
        chars_done += doc.chars;
        if (!doc.error.empty()) {
          std::string where = files_[doc.file] + ":" + std::to_string(doc.line);
          if (!o_.skip_bad_documents) {
            error = where + ": error: " + doc.error +
                    " (or pass --skip-bad-documents to skip such lines)";
            break;
          }
          if (skipped++ == 0)
            first_skip = where + ": " + doc.error;
          continue;
        }
        for (size_t k = 0; k < writers_.size() && error.empty(); ++k)
          error = writers_[k]->add_document(doc.tokens[k].data(), doc.tokens[k].size(),
                                            doc.lengths[k]);
        if (!error.empty())
          break;
        ++docs_done;
        progress.document_done(docs_done, chars_done, bytes_done);
      }
      bytes_done += batch.input_bytes;
      if (!error.empty())
        break;
    }

    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    reader.join();
    for (auto &t : threads)
      t.join();
    if (!error.empty())
      return fail(error); // writers' destructors remove the temporaries

    for (size_t k = 0; k < writers_.size(); ++k) {
      std::string err = writers_[k]->finish();
      if (!err.empty())
        return fail(err);
    }
    progress.finish(bytes_done);
    double s = progress.elapsed();
    if (!o_.quiet) {
      for (size_t k = 0; k < writers_.size(); ++k)
        std::fprintf(stderr,
                     "mt-preprocess: wrote %s.bin/.idx: %llu documents, %llu tokens (%s)\n",
                     prefixes_[k].c_str(),
                     static_cast<unsigned long long>(writers_[k]->num_documents()),
                     static_cast<unsigned long long>(writers_[k]->num_tokens()),
                     dtype_name(dtype_for_vocab_size(tokenizer_->vocab_size())));
      std::fprintf(stderr, "mt-preprocess: %.1f MB in %.2f s (%.1f MB/s) with %d worker%s\n",
                   bytes_done / 1e6, s, bytes_done / 1e6 / s, o_.workers,
                   o_.workers == 1 ? "" : "s");
    }
    if (skipped)
      std::fprintf(stderr, "mt-preprocess: skipped %llu bad document%s; the first: %s\n",
                   static_cast<unsigned long long>(skipped), skipped == 1 ? "" : "s",
                   first_skip.c_str());
    return 0;
  }

private:
  int fail(const std::string &msg) {
    std::fprintf(stderr, "%s\n", msg.c_str());
    return 1;
  }

  void read(size_t max_inflight) {
    DocumentReader reader(files_, o_.document_per_file);
    constexpr size_t kBatchBytes = 1 << 20;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Bound the work in flight: memory stays flat on any input size.
        cv_.wait(lock, [&] { return stop_ || in_flight() < max_inflight; });
        if (stop_)
          break;
      }
      Batch batch;
      std::string err;
      bool got = reader.next(batch.docs, kBatchBytes, err);
      std::lock_guard<std::mutex> lock(mu_);
      if (!err.empty()) {
        read_error_ = err;
        break;
      }
      if (!got)
        break;
      batch.seq = batches_read_++;
      todo_.push_back(std::move(batch));
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu_);
    reading_finished_ = true;
    cv_.notify_all();
  }

  // Batches read but not yet handed to the writer.
  size_t in_flight() const { return todo_.size() + working_ + done_.size(); }

  void work() {
    Worker worker(o_, *tokenizer_);
    while (true) {
      Batch batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !todo_.empty() || reading_finished_; });
        if (stop_ || (todo_.empty() && reading_finished_))
          return;
        batch = std::move(todo_.front());
        todo_.pop_front();
        ++working_;
      }
      EncodedBatch out = worker.encode(batch);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --working_;
        done_[batch.seq] = std::move(out);
      }
      cv_.notify_all();
    }
  }

  const Options &o_;
  std::vector<std::string> files_;
  uint64_t total_bytes_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::vector<std::string> prefixes_;
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> todo_;
  std::map<uint64_t, EncodedBatch> done_;
  uint64_t batches_read_ = 0;
  uint64_t working_ = 0;
  bool reading_finished_ = false;
  bool stop_ = false;
  std::string read_error_;
};

} // namespace

std::string python_float_repr(double v) {
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return v < 0 ? "-inf" : "inf";
  if (v == 0)
    return std::signbit(v) ? "-0.0" : "0.0";
  // The shortest round-trip digits, from the scientific form d.ddde[+-]X.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  int exp = std::atoi(sci.c_str() + e + 1);
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() <= static_cast<size_t>(exp) + 1)
        out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
      else
        out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
              digits.substr(static_cast<size_t>(exp) + 1);
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1)
      out += "." + digits.substr(1);
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += ex;
  }
  return sign + out;
}

int run_mt_preprocess(const std::vector<std::string> &args) {
  Options o;
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (std::optional<int> rc = parse_options(args, o))
    return *rc;
  std::vector<std::string> files;
  uint64_t total_bytes = 0;
  std::string error;
  if (!expand_inputs(o.inputs, files, total_bytes, error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  std::shared_ptr<const Tokenizer> tokenizer = load_tokenizer(o.tokenizer, &error);
  if (!tokenizer) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  if (o.append_eod && tokenizer->eod() < 0) {
    std::fprintf(stderr, "error: --append-eod: %s has no end-of-document token (Megatron's "
                         "tokenizer.eod fails for it); drop --append-eod\n",
                 tokenizer->describe().c_str());
    return 1;
  }
  if (!o.quiet)
    std::fprintf(stderr, "mt-preprocess: %zu input file%s, %.1f MB, %d worker%s\n",
                 files.size(), files.size() == 1 ? "" : "s", total_bytes / 1e6, o.workers,
                 o.workers == 1 ? "" : "s");
  if (!o.quiet)
    std::fprintf(stderr, "mt-preprocess: tokenizer %s: vocab size %zu, eod %d\n",
                 tokenizer->describe().c_str(), tokenizer->vocab_size(), tokenizer->eod());
  return Pipeline(o, std::move(files), total_bytes, std::move(tokenizer)).run();
}

} // namespace mt::rt
