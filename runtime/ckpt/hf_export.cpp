// A checkpoint as a Hugging Face transformers model folder (see hf_export.h).
#include "runtime/ckpt/hf_export.h"

#include "runtime/base/atomic_file.h"
#include "runtime/ckpt/checkpoint_format.h"
#include "runtime/ckpt/safetensors.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <simdjson.h>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>

namespace mt::rt {

using ckpt_detail::json_string;
using ckpt_detail::shape_str;

namespace {

std::string num(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eE") == std::string::npos)
    s += ".0";
  return s;
}

std::string quoted(const std::string &s) {
  std::string out;
  json_string(out, s);
  return out;
}


} // namespace

// ---------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------

std::string hf_tensors(const HfModelSpec &m, const std::string &arch,
                       const std::map<std::string, WholeWeight> &weights, bool keep_padded_vocab,
                       std::vector<HfTensor> *out) {
  const int64_t vp = m.padded_vocab_size;
  if (m.vocab_size < 1 || m.vocab_size > vp)
    return "the spec's vocab_size " + std::to_string(m.vocab_size) +
           " is not in [1, the padded vocabulary " + std::to_string(vp) + "]";
  std::map<std::string, bool> used;
  for (const HfMapEntry &e : hf_mapping(m, arch, keep_padded_vocab ? vp : m.vocab_size)) {
    const WholeWeight *t = nullptr;
    if (!e.mt_name.empty()) {
      auto it = weights.find(e.mt_name);
      if (it == weights.end())
        return "the checkpoint has no tensor " + e.mt_name + ", which the spec's model has";
      if (it->second.shape != e.mt_shape)
        return "the checkpoint's " + e.mt_name + " is " + shape_str(it->second.shape) +
               " but the spec's model makes it " + shape_str(e.mt_shape) +
               "; the checkpoint was saved from another model";
      t = &it->second;
      used[e.mt_name] = true;
    }
    const int64_t cols = e.mt_shape.size() >= 2 ? e.mt_shape.back() : 1;
    for (const HfPiece &p : e.pieces) {
      const int64_t n = p.row_count();
      std::vector<float> d(size_t(n * cols), 0.0f);
      int64_t at = 0; // rows placed
      for (const auto &[b, end] : t ? p.rows : std::vector<std::pair<int64_t, int64_t>>{})
        for (int64_t r = b; r < end; ++r, ++at)
          for (int64_t k = 0; k < cols; ++k)
            d[size_t(p.transpose ? k * n + at : at * cols + k)] =
                t->data[size_t(r * cols + k)] + (e.one_plus ? 1.0f : 0.0f);
      out->push_back({p.name, p.shape, std::move(d)});
    }
  }
  for (const auto &[name, t] : weights)
    if (!used.count(name))
      return "the checkpoint holds " + name + " " + shape_str(t.shape) +
             ", which the spec's model does not have; the checkpoint was saved from another "
             "model";
  return "";
}

// ---------------------------------------------------------------------------
// The tokenizer
// ---------------------------------------------------------------------------

namespace {

std::string parent_of(const std::string &path);

// 1: read, 0: not here, -1: here but unreadable (*error set).
int read_whole_file(const std::string &path, std::string *bytes, std::string *error) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return 0;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || !S_ISREG(st.st_mode)) {
    *error = path + ": error: cannot read the tokenizer file: " +
             (fd < 0 ? std::strerror(errno) : "not a regular file");
    if (fd >= 0)
      ::close(fd);
    return -1;
  }
  bytes->resize(size_t(st.st_size));
  size_t got = 0;
  while (got < bytes->size()) {
    ssize_t n = ::read(fd, bytes->data() + got, bytes->size() - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      *error = path + ": error: cannot read the tokenizer file: " +
               (n < 0 ? std::strerror(errno) : "it shrank while being read");
      ::close(fd);
      return -1;
    }
    got += size_t(n);
  }
  ::close(fd);
  return 1;
}

// The content of tokenizer.json's added token `id`, or "".
std::string added_token(const std::string &json, int64_t id) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  simdjson::dom::array added;
  if (parser.parse(json).get(root) != simdjson::SUCCESS ||
      root["added_tokens"].get_array().get(added) != simdjson::SUCCESS)
    return "";
  for (auto t : added) {
    int64_t tid = -1;
    std::string_view content;
    if (t["id"].get_int64().get(tid) == simdjson::SUCCESS && tid == id &&
        t["content"].get_string().get(content) == simdjson::SUCCESS)
      return std::string(content);
  }
  return "";
}

} // namespace

std::string hf_tokenizer_files(const HfModelSpec &m, std::map<std::string, std::string> *files,
                               std::string *why) {
  files->clear();
  std::string error;
  const std::string max_len = std::to_string(m.max_position_embeddings);
  if (m.tokenizer_type == "GPT2BPETokenizer") {
    if (m.vocab_file.empty() || m.merge_file.empty()) {
      *why = "the spec names no data.vocab_file and data.merge_file";
      return "";
    }
    std::string vocab, merges;
    int a = read_whole_file(m.vocab_file, &vocab, &error);
    int b = a < 0 ? 0 : read_whole_file(m.merge_file, &merges, &error);
    if (a < 0 || b < 0)
      return error;
    if (a == 0 || b == 0) {
      *why = "data." + std::string(a == 0 ? "vocab_file " + quoted(m.vocab_file)
                                          : "merge_file " + quoted(m.merge_file)) +
             " is not here";
      return "";
    }
    (*files)["vocab.json"] = vocab;
    (*files)["merges.txt"] = merges;
    // GPT-2's tokenizer: <|endoftext|> is its end of document, beginning and
    // unknown token, and no space is added before the text.
    (*files)["tokenizer_config.json"] =
        "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"model_max_length\": " + max_len +
        ",\n  \"bos_token\": \"<|endoftext|>\",\n  \"eos_token\": \"<|endoftext|>\",\n"
        "  \"unk_token\": \"<|endoftext|>\",\n  \"add_prefix_space\": false,\n"
        "  \"errors\": \"replace\"\n}\n";
    return "";
  }
  if (m.tokenizer_type == "HuggingFaceTokenizer") {
    if (m.tokenizer_model.empty()) {
      *why = "the spec names no data.tokenizer_model";
      return "";
    }
    // A file's tokenizer_config.json is the one beside it, as mt reads it.
    const bool dir = ckpt_detail::is_dir(m.tokenizer_model);
    const std::string json_path = dir ? m.tokenizer_model + "/tokenizer.json" : m.tokenizer_model;
    const std::string config_dir = dir ? m.tokenizer_model : parent_of(m.tokenizer_model);
    std::string json;
    int a = read_whole_file(json_path, &json, &error);
    if (a < 0)
      return error;
    if (a == 0) {
      *why = "data.tokenizer_model " + quoted(m.tokenizer_model) +
             (dir ? " has no tokenizer.json" : " is not here");
      return "";
    }
    (*files)["tokenizer.json"] = json;
    for (const char *extra : {"tokenizer_config.json", "special_tokens_map.json"}) {
      std::string bytes;
      int r = read_whole_file(config_dir + "/" + extra, &bytes, &error);
      if (r < 0)
        return error;
      if (r > 0)
        (*files)[extra] = bytes;
    }
    if (!files->count("tokenizer_config.json")) {
      const std::string eos = added_token(json, m.eod_id);
      (*files)["tokenizer_config.json"] =
          "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"model_max_length\": " +
          max_len + (eos.empty() ? "" : ",\n  \"eos_token\": " + quoted(eos)) + "\n}\n";
    }
    return "";
  }
  *why = m.tokenizer_type == "NullTokenizer"
             ? "NullTokenizer has no files"
             : m.tokenizer_type + "'s files are not exported yet (GPT2BPETokenizer's and "
                                  "HuggingFaceTokenizer's are)";
  return "";
}

// ---------------------------------------------------------------------------
// Configuration files
// ---------------------------------------------------------------------------

std::string hf_config_json(const HfModelSpec &m, const std::string &arch,
                           const HfExportOptions &o) {
  const int64_t vocab = o.keep_padded_vocab ? m.padded_vocab_size : m.vocab_size;
  const std::string dtype =
      o.dtype == "bf16" ? "bfloat16" : o.dtype == "fp16" ? "float16" : "float32";
  const std::string eod = m.eod_id >= 0 ? std::to_string(m.eod_id) : "null";
  std::string j = "{\n";
  auto kv = [&](const std::string &k, const std::string &v) {
    j += "  " + quoted(k) + ": " + v + ",\n";
  };
  if (arch == "gpt2") {
    kv("architectures", "[\"GPT2LMHeadModel\"]");
    kv("model_type", "\"gpt2\"");
    kv("activation_function", "\"gelu_new\"");
    kv("attn_pdrop", num(m.attention_dropout));
    kv("embd_pdrop", num(m.hidden_dropout));
    kv("resid_pdrop", num(m.hidden_dropout));
    kv("initializer_range", num(m.init_method_std));
    kv("layer_norm_epsilon", num(m.norm_epsilon));
    kv("n_embd", std::to_string(m.hidden_size));
    kv("n_head", std::to_string(m.num_attention_heads));
    kv("n_inner", std::to_string(m.ffn_hidden_size));
    kv("n_layer", std::to_string(m.num_layers));
    kv("n_positions", std::to_string(m.max_position_embeddings));
    kv("n_ctx", std::to_string(m.max_position_embeddings));
    kv("scale_attn_weights", "true");
    kv("scale_attn_by_inverse_layer_idx", "false");
    kv("reorder_and_upcast_attn", "false");
  } else if (arch == "mixtral") {
    kv("architectures", "[\"MixtralForCausalLM\"]");
    kv("model_type", "\"mixtral\"");
    kv("hidden_act", "\"silu\"");
    kv("attention_dropout", num(m.attention_dropout));
    kv("head_dim", std::to_string(m.kv_channels));
    kv("hidden_size", std::to_string(m.hidden_size));
    kv("initializer_range", num(m.init_method_std));
    kv("intermediate_size", std::to_string(m.moe_ffn_hidden_size));
    kv("max_position_embeddings", std::to_string(m.max_position_embeddings));
    kv("num_attention_heads", std::to_string(m.num_attention_heads));
    kv("num_hidden_layers", std::to_string(m.num_layers));
    kv("num_key_value_heads", std::to_string(m.num_query_groups));
    kv("num_local_experts", std::to_string(m.num_experts));
    kv("num_experts_per_tok", std::to_string(m.moe_router_topk));
    // Mixtral's auxiliary loss is the load-balancing loss of Megatron's
    // aux_loss; the others (seq_aux_loss, the z-loss) are training terms it
    // has no key for and do not change the model's output.
    kv("router_aux_loss_coef",
       num(m.moe_router_load_balancing_type == "aux_loss" ? m.moe_aux_loss_coeff : 0.0));
    kv("output_router_logits", "false");
    kv("router_jitter_noise", "0.0");
    kv("sliding_window", "null");
    kv("rms_norm_eps", num(m.norm_epsilon));
  } else {
    kv("architectures", "[\"LlamaForCausalLM\"]");
    kv("model_type", "\"llama\"");
    kv("hidden_act", "\"silu\"");
    kv("attention_bias", m.add_bias_linear ? "true" : "false");
    kv("mlp_bias", m.add_bias_linear ? "true" : "false");
    kv("attention_dropout", num(m.attention_dropout));
    kv("head_dim", std::to_string(m.kv_channels));
    kv("hidden_size", std::to_string(m.hidden_size));
    kv("initializer_range", num(m.init_method_std));
    kv("intermediate_size", std::to_string(m.ffn_hidden_size));
    kv("max_position_embeddings", std::to_string(m.max_position_embeddings));
    kv("num_attention_heads", std::to_string(m.num_attention_heads));
    kv("num_hidden_layers", std::to_string(m.num_layers));
    kv("num_key_value_heads", std::to_string(m.num_query_groups));
    kv("pretraining_tp", "1");
    kv("rms_norm_eps", num(m.norm_epsilon));
  }
  if (arch != "gpt2") {
    const std::string theta = num(double(m.rotary_base));
    // Llama 3.1's scaling as Megatron applies it: 8192 original positions,
    // low and high frequency factors 1 and 4.
    const std::string scaling =
        "\"rope_type\": \"llama3\", \"factor\": " + num(m.rope_scaling_factor) +
        ", \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 8192";
    kv("rope_theta", theta);
    kv("rope_scaling", m.use_rope_scaling ? "{" + scaling + "}" : "null");
    // transformers 5 reads rope_parameters; 4 reads the two above.
    kv("rope_parameters", m.use_rope_scaling
                              ? "{" + scaling + ", \"rope_theta\": " + theta + "}"
                              : "{\"rope_type\": \"default\", \"rope_theta\": " + theta + "}");
  }
  kv("vocab_size", std::to_string(vocab));
  kv("bos_token_id", eod);
  kv("eos_token_id", eod);
  kv("tie_word_embeddings", m.untie_embeddings_and_output_weights ? "false" : "true");
  kv("torch_dtype", quoted(dtype));
  kv("dtype", quoted(dtype));
  kv("use_cache", "true");
  j.resize(j.size() - 2);
  return j + "\n}\n";
}

std::string hf_generation_config_json(const HfModelSpec &m) {
  const std::string eod = m.eod_id >= 0 ? std::to_string(m.eod_id) : "null";
  return "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": " + eod +
         ",\n  \"eos_token_id\": " + eod + "\n}\n";
}

bool parse_shard_size(const std::string &text, uint64_t *bytes) {
  uint64_t v = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (r.ec != std::errc() || r.ptr == text.data())
    return false;
  std::string unit(r.ptr, text.data() + text.size());
  for (char &ch : unit)
    ch = char(std::toupper(static_cast<unsigned char>(ch)));
  static const std::pair<const char *, uint64_t> kUnits[] = {
      {"", 1},           {"B", 1},           {"KB", 1000},       {"MB", 1000000},
      {"GB", 1000000000}, {"TB", 1000000000000}, {"KIB", 1ull << 10}, {"MIB", 1ull << 20},
      {"GIB", 1ull << 30}, {"TIB", 1ull << 40}};
  for (const auto &[name, mult] : kUnits)
    if (unit == name) {
      if (v == 0 || v > UINT64_MAX / mult)
        return false;
      *bytes = v * mult;
      return true;
    }
  return false;
}

// ---------------------------------------------------------------------------
// The export
// ---------------------------------------------------------------------------

namespace {

int remove_entry(const char *path, const struct stat *, int, struct FTW *) {
  return ::remove(path);
}
void remove_tree(const std::string &dir) {
  ::nftw(dir.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

std::string parent_of(const std::string &path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool fsync_path(const std::string &path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0)
    return false;
  bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

} // namespace

std::string export_hf(const std::string &load_dir, int64_t iteration, const HfModelSpec &m,
                      const HfExportOptions &o, const std::string &out_dir,
                      std::string *summary) {
  std::string dir = out_dir;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  if (dir.empty())
    return "mt-checkpoint: error: -o names no directory; give the folder to write";
  if (o.dtype != "fp32" && o.dtype != "bf16" && o.dtype != "fp16")
    return "mt-checkpoint: error: --dtype " + o.dtype + " is none of fp32, bf16, fp16";
  if (ckpt_detail::exists(dir) &&
      (!ckpt_detail::is_dir(dir) || !ckpt_detail::list_dir(dir).empty()))
    return dir + ": error: exists and is not an empty directory; write to a new directory "
                 "(nothing was written)";
  std::string error;
  const std::string arch = hf_architecture(m, &error);
  if (arch.empty())
    return load_dir + ": error: the spec's " + error +
           "; this checkpoint cannot be exported to Hugging Face";

  CheckpointMeta meta;
  std::map<std::string, WholeWeight> weights;
  if (std::string e = read_whole_weights(load_dir, iteration, &meta, &weights); !e.empty())
    return e;
  std::map<std::string, std::string> tokenizer;
  std::string no_tokenizer;
  if (std::string e = hf_tokenizer_files(m, &tokenizer, &no_tokenizer); !e.empty())
    return e + " (nothing was written)";
  std::vector<HfTensor> tensors;
  if (std::string e = hf_tensors(m, arch, weights, o.keep_padded_vocab, &tensors); !e.empty())
    return load_dir + ": error: " + e + " (nothing was written)";
  weights.clear();

  // The tensors in the file's dtype.
  const std::string st_dtype = o.dtype == "bf16" ? "BF16" : o.dtype == "fp16" ? "F16" : "F32";
  const size_t elem = o.dtype == "fp32" ? 4 : 2;
  std::vector<std::vector<uint16_t>> halves(tensors.size());
  std::vector<SafetensorsTensor> st;
  uint64_t total = 0, params = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const HfTensor &t = tensors[i];
    const void *data = t.data.data();
    if (elem == 2) {
      halves[i].resize(t.data.size());
      for (size_t k = 0; k < t.data.size(); ++k)
        halves[i][k] = o.dtype == "bf16" ? f32_to_bf16(t.data[k]) : f32_to_f16(t.data[k]);
      data = halves[i].data();
    }
    st.push_back({t.name, st_dtype, t.shape, data, t.data.size() * elem});
    total += t.data.size() * elem;
    params += t.data.size();
  }
  // Shards: tensors in model order, a new shard when the next would pass the
  // limit (one larger than the limit is a shard of its own), as transformers'
  // save_pretrained splits them.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < st.size(); ++i) {
    if (!shards.back().empty() && in_shard + st[i].bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += st[i].bytes;
  }

  // Stage beside the target, then rename.
  std::string failed;
  int err_no = 0;
  const std::string parent = parent_of(dir);
  if (!make_directories(parent, &failed, &err_no))
    return failed + ": error: cannot create the directory: " + std::strerror(err_no);
  std::string tmpl = parent + "/.tmp." + dir.substr(dir.find_last_of('/') + 1) + ".XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    return parent + ": error: cannot create a staging directory: " + std::strerror(errno);
  const std::string staging = tmpl;
  auto fail = [&](const std::string &e) {
    remove_tree(staging);
    return e + " (nothing was written to " + dir + ")";
  };
  ::chmod(staging.c_str(), 0755);
  const std::map<std::string, std::string> st_meta = {{"format", "pt"}};
  std::string index;
  if (shards.size() == 1) {
    if (std::string e = write_safetensors(staging + "/model.safetensors", st, st_meta); !e.empty())
      return fail(e);
  } else {
    index = "{\n  \"metadata\": {\n    \"total_parameters\": " + std::to_string(params) +
            ",\n    \"total_size\": " + std::to_string(total) + "\n  },\n  \"weight_map\": {\n";
    std::map<std::string, std::string> where;
    for (size_t s = 0; s < shards.size(); ++s) {
      std::vector<SafetensorsTensor> part;
      for (size_t i : shards[s]) {
        part.push_back(st[i]);
        where[st[i].name] = shard_name(s, shards.size());
      }
      if (std::string e = write_safetensors(staging + "/" + shard_name(s, shards.size()), part,
                                            st_meta);
          !e.empty())
        return fail(e);
    }
    bool first = true;
    for (const auto &[name, file] : where) {
      index += std::string(first ? "" : ",\n") + "    " + quoted(name) + ": " + quoted(file);
      first = false;
    }
    index += "\n  }\n}\n";
    if (std::string e = write_file_atomically(staging + "/model.safetensors.index.json", index);
        !e.empty())
      return fail(e);
  }
  if (std::string e = write_file_atomically(staging + "/config.json", hf_config_json(m, arch, o));
      !e.empty())
    return fail(e);
  if (std::string e = write_file_atomically(staging + "/generation_config.json",
                                            hf_generation_config_json(m));
      !e.empty())
    return fail(e);
  for (const auto &[name, bytes] : tokenizer)
    if (std::string e = write_file_atomically(staging + "/" + name, bytes); !e.empty())
      return fail(e);
  if (!fsync_path(staging, O_RDONLY | O_DIRECTORY))
    return fail(staging + ": error: cannot sync: " + std::strerror(errno));
  // rename(2) replaces an empty directory and refuses a non-empty one.
  if (::rename(staging.c_str(), dir.c_str()) != 0)
    return fail(dir + ": error: cannot rename the staging directory into place: " +
                std::strerror(errno));
  fsync_path(parent, O_RDONLY | O_DIRECTORY);
  *summary = "wrote " + dir + ": " + hf_class_name(arch) +
             " from iteration " + std::to_string(meta.iteration) + " of " + load_dir + ", " +
             std::to_string(st.size()) + " tensors, " + std::to_string(params) +
             " parameters, " + o.dtype + ", vocabulary " +
             std::to_string(o.keep_padded_vocab ? m.padded_vocab_size : m.vocab_size) +
             (o.keep_padded_vocab || m.vocab_size == m.padded_vocab_size
                  ? ""
                  : " (padded " + std::to_string(m.padded_vocab_size) + ")") +
             ", " + ckpt_detail::size_text(total) + " in " + std::to_string(shards.size()) + " safetensors file" +
             (shards.size() == 1 ? "" : "s");
  std::string names;
  for (const auto &[name, bytes] : tokenizer)
    names += (names.empty() ? "" : ", ") + name;
  *summary += "; tokenizer: " + (names.empty() ? "none (" + no_tokenizer + ")" : names);
  return "";
}

} // namespace mt::rt
