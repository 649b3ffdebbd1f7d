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

// ---------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------

uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it one, quiet
    return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

uint16_t f32_to_f16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u)
    return sign | 0x7e00u; // NaN
  if (abs >= 0x477ff000u)  // rounds to 65520 or more: infinity
    return sign | 0x7c00u;
  const int exp = int(abs >> 23) - 127;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  if (exp < -25) // below half the smallest subnormal
    return sign;
  // Shift the 24-bit significand to the 10 bits (plus the implicit one) of a
  // normal half, or fewer for a subnormal; round to nearest even.
  const int shift = exp >= -14 ? 13 : 13 + (-14 - exp);
  const uint32_t rest = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  uint32_t m = mant >> shift;
  if (rest > halfway || (rest == halfway && (m & 1u)))
    ++m;
  if (exp >= -14) // normal: the carry of m into bit 11 bumps the exponent
    return uint16_t(sign | ((uint32_t(exp + 15) << 10) + (m - 0x400u)));
  return uint16_t(sign | m); // subnormal (m may round up into the smallest normal)
}

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

// ---------------------------------------------------------------------------
// Architecture
// ---------------------------------------------------------------------------

std::string refuse(const std::string &key, const std::string &why, const std::string &cls) {
  return "model." + key + " = " + why + ", which " + cls +
         " cannot express; this checkpoint cannot be exported to Hugging Face";
}

} // namespace

std::string hf_architecture(const HfModelSpec &m, std::string *error) {
  if (m.rope) {
    const char *cls = "LlamaForCausalLM (the class for RoPE models)";
    if (!m.rmsnorm)
      *error = refuse("normalization", "\"LayerNorm\" with RoPE", cls);
    else if (!m.swiglu)
      *error = refuse("swiglu", "false (a GeLU MLP) with RoPE", cls);
    else if (m.kv_channels % 2 != 0)
      *error = refuse("kv_channels", std::to_string(m.kv_channels) +
                                         ", odd (RoPE leaves the last element unrotated)",
                      cls);
    else if (m.num_attention_heads % m.num_query_groups != 0)
      *error = refuse("num_query_groups", std::to_string(m.num_query_groups) +
                                              ", not a divisor of num_attention_heads",
                      cls);
    return error->empty() ? "llama" : "";
  }
  const char *cls = "GPT2LMHeadModel (the class for learned absolute positions)";
  if (m.rmsnorm)
    *error = refuse("normalization", "\"RMSNorm\" with learned_absolute positions", cls);
  else if (m.swiglu)
    *error = refuse("swiglu", "true with learned_absolute positions", cls);
  else if (m.num_query_groups != m.num_attention_heads)
    *error = refuse("num_query_groups",
                    std::to_string(m.num_query_groups) + " (grouped-query attention) with "
                                                         "learned_absolute positions",
                    cls);
  else if (m.kv_channels * m.num_attention_heads != m.hidden_size)
    *error = refuse("kv_channels",
                    std::to_string(m.kv_channels) + " (heads x kv_channels != hidden_size) with "
                                                    "learned_absolute positions",
                    cls);
  return error->empty() ? "gpt2" : "";
}

// ---------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------

namespace {

struct Converter {
  const HfModelSpec &m;
  const std::map<std::string, WholeWeight> &w;
  std::vector<HfTensor> *out;
  std::string error;

  const WholeWeight *get(const std::string &name, const std::vector<int64_t> &shape) {
    if (!error.empty())
      return nullptr;
    auto it = w.find(name);
    if (it == w.end()) {
      error = "the checkpoint has no tensor " + name + ", which the spec's model has";
      return nullptr;
    }
    if (it->second.shape != shape) {
      error = "the checkpoint's " + name + " is " + shape_str(it->second.shape) +
              " but the spec's model makes it " + shape_str(shape) +
              "; the checkpoint was saved from another model";
      return nullptr;
    }
    return &it->second;
  }
  void put(const std::string &name, std::vector<int64_t> shape, std::vector<float> data) {
    out->push_back({name, std::move(shape), std::move(data)});
  }
  // A [rows, cols] matrix, its first `keep` rows, optionally transposed.
  void matrix(const std::string &to, const WholeWeight *t, int64_t keep, bool transpose) {
    const int64_t cols = t->shape[1];
    std::vector<float> d(size_t(keep * cols));
    for (int64_t r = 0; r < keep; ++r)
      for (int64_t c = 0; c < cols; ++c)
        d[size_t(transpose ? c * keep + r : r * cols + c)] = t->data[size_t(r * cols + c)];
    put(to, transpose ? std::vector<int64_t>{cols, keep} : std::vector<int64_t>{keep, cols},
        std::move(d));
  }
  void copy(const std::string &from, const std::string &to, const std::vector<int64_t> &shape,
            bool transpose = false) {
    if (const WholeWeight *t = get(from, shape))
      shape.size() == 2 ? matrix(to, t, shape[0], transpose) : put(to, shape, t->data);
  }
  void norm(const std::string &from, const std::string &to, bool bias) {
    const int64_t h = m.hidden_size;
    if (const WholeWeight *t = get(from + "weight", {h})) {
      std::vector<float> d = t->data;
      if (m.apply_layernorm_1p)
        for (float &x : d)
          x += 1.0f;
      put(to + "weight", {h}, std::move(d));
    }
    if (bias)
      copy(from + "bias", to + "bias", {h});
  }
  // Rows [begin, end) of each of the fused QKV's parts, as Megatron lays it
  // out: per query group, heads/groups query heads, then a key and a value
  // head. part 0: the query heads, 1: the keys, 2: the values.
  std::vector<int64_t> qkv_rows(int part) const {
    const int64_t d = m.kv_channels, g = m.num_query_groups, per = m.num_attention_heads / g;
    std::vector<int64_t> rows;
    for (int64_t k = 0; k < g; ++k) {
      const int64_t base = k * (per + 2) * d;
      const int64_t from = part == 0 ? 0 : part == 1 ? per : per + 1;
      const int64_t n = part == 0 ? per : 1;
      for (int64_t r = 0; r < n * d; ++r)
        rows.push_back(base + from * d + r);
    }
    return rows;
  }
};

std::vector<float> gather_rows(const WholeWeight &t, const std::vector<int64_t> &rows) {
  const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
  std::vector<float> d(rows.size() * size_t(cols));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(&d[i * size_t(cols)], &t.data[size_t(rows[i] * cols)], size_t(cols) * 4);
  return d;
}

std::vector<float> transposed(const std::vector<float> &d, int64_t rows, int64_t cols) {
  std::vector<float> t(d.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t[size_t(c * rows + r)] = d[size_t(r * cols + c)];
  return t;
}

} // namespace

std::string hf_tensors(const HfModelSpec &m, const std::string &arch,
                       const std::map<std::string, WholeWeight> &weights, bool keep_padded_vocab,
                       std::vector<HfTensor> *out) {
  Converter c{m, weights, out, ""};
  const int64_t h = m.hidden_size, f = m.ffn_hidden_size, d = m.kv_channels;
  const int64_t heads = m.num_attention_heads, groups = m.num_query_groups;
  const int64_t qkv = (heads + 2 * groups) * d, vp = m.padded_vocab_size;
  const int64_t vocab = keep_padded_vocab ? vp : m.vocab_size;
  const bool gpt2 = arch == "gpt2", bias = m.add_bias_linear;
  if (m.vocab_size < 1 || m.vocab_size > vp)
    return "the spec's vocab_size " + std::to_string(m.vocab_size) +
           " is not in [1, the padded vocabulary " + std::to_string(vp) + "]";
  std::map<std::string, bool> used;
  auto use = [&](const std::string &n) { used[n] = true; };

  const std::string emb = "embedding.word_embeddings.weight";
  use(emb);
  if (const WholeWeight *t = c.get(emb, {vp, h}))
    c.matrix(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight", t, vocab, false);
  if (gpt2) {
    use("embedding.position_embeddings.weight");
    c.copy("embedding.position_embeddings.weight", "transformer.wpe.weight",
           {m.max_position_embeddings, h});
  }
  for (int64_t i = 0; i < m.num_layers && c.error.empty(); ++i) {
    const std::string p = "decoder.layers." + std::to_string(i) + ".";
    const std::string q = gpt2 ? "transformer.h." + std::to_string(i) + "."
                               : "model.layers." + std::to_string(i) + ".";
    for (const char *n : {"input_layernorm.weight", "input_layernorm.bias",
                          "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
                          "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                          "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
                          "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight",
                          "mlp.linear_fc2.bias"})
      use(p + n);
    c.norm(p + "input_layernorm.", q + (gpt2 ? "ln_1." : "input_layernorm."), !m.rmsnorm);
    c.norm(p + "pre_mlp_layernorm.", q + (gpt2 ? "ln_2." : "post_attention_layernorm."),
           !m.rmsnorm);
    const WholeWeight *wqkv = c.get(p + "self_attention.linear_qkv.weight", {qkv, h});
    const WholeWeight *bqkv = bias ? c.get(p + "self_attention.linear_qkv.bias", {qkv}) : nullptr;
    if (!c.error.empty())
      break;
    if (gpt2) {
      // c_attn: Conv1D [in, out] with out = [q | k | v].
      std::vector<int64_t> rows;
      for (int part = 0; part < 3; ++part)
        for (int64_t r : c.qkv_rows(part))
          rows.push_back(r);
      c.put(q + "attn.c_attn.weight", {h, 3 * h},
            transposed(gather_rows(*wqkv, rows), 3 * h, h));
      c.put(q + "attn.c_attn.bias", {3 * h},
            bias ? gather_rows(*bqkv, rows) : std::vector<float>(size_t(3 * h), 0.0f));
      if (const WholeWeight *t = c.get(p + "self_attention.linear_proj.weight", {h, heads * d}))
        c.put(q + "attn.c_proj.weight", {h, h}, transposed(t->data, h, h));
      if (bias)
        c.copy(p + "self_attention.linear_proj.bias", q + "attn.c_proj.bias", {h});
      else
        c.put(q + "attn.c_proj.bias", {h}, std::vector<float>(size_t(h), 0.0f));
      if (const WholeWeight *t = c.get(p + "mlp.linear_fc1.weight", {f, h}))
        c.put(q + "mlp.c_fc.weight", {h, f}, transposed(t->data, f, h));
      if (bias)
        c.copy(p + "mlp.linear_fc1.bias", q + "mlp.c_fc.bias", {f});
      else
        c.put(q + "mlp.c_fc.bias", {f}, std::vector<float>(size_t(f), 0.0f));
      if (const WholeWeight *t = c.get(p + "mlp.linear_fc2.weight", {h, f}))
        c.put(q + "mlp.c_proj.weight", {f, h}, transposed(t->data, h, f));
      if (bias)
        c.copy(p + "mlp.linear_fc2.bias", q + "mlp.c_proj.bias", {h});
      else
        c.put(q + "mlp.c_proj.bias", {h}, std::vector<float>(size_t(h), 0.0f));
      continue;
    }
    const char *proj[3] = {"self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."};
    for (int part = 0; part < 3; ++part) {
      std::vector<int64_t> rows = c.qkv_rows(part);
      c.put(q + proj[part] + "weight", {int64_t(rows.size()), h}, gather_rows(*wqkv, rows));
      if (bias)
        c.put(q + proj[part] + "bias", {int64_t(rows.size())}, gather_rows(*bqkv, rows));
    }
    c.copy(p + "self_attention.linear_proj.weight", q + "self_attn.o_proj.weight",
           {h, heads * d});
    if (bias)
      c.copy(p + "self_attention.linear_proj.bias", q + "self_attn.o_proj.bias", {h});
    // SwiGLU's fc1: rows [0, ffn) are the gate, [ffn, 2 ffn) the up projection.
    if (const WholeWeight *t = c.get(p + "mlp.linear_fc1.weight", {2 * f, h})) {
      c.put(q + "mlp.gate_proj.weight", {f, h},
            std::vector<float>(t->data.begin(), t->data.begin() + f * h));
      c.put(q + "mlp.up_proj.weight", {f, h},
            std::vector<float>(t->data.begin() + f * h, t->data.end()));
    }
    if (bias)
      if (const WholeWeight *t = c.get(p + "mlp.linear_fc1.bias", {2 * f})) {
        c.put(q + "mlp.gate_proj.bias", {f},
              std::vector<float>(t->data.begin(), t->data.begin() + f));
        c.put(q + "mlp.up_proj.bias", {f}, std::vector<float>(t->data.begin() + f, t->data.end()));
      }
    c.copy(p + "mlp.linear_fc2.weight", q + "mlp.down_proj.weight", {h, f});
    if (bias)
      c.copy(p + "mlp.linear_fc2.bias", q + "mlp.down_proj.bias", {h});
  }
  use("decoder.final_layernorm.weight");
  use("decoder.final_layernorm.bias");
  c.norm("decoder.final_layernorm.", gpt2 ? "transformer.ln_f." : "model.norm.", !m.rmsnorm);
  if (m.untie_embeddings_and_output_weights) {
    use("output_layer.weight");
    if (const WholeWeight *t = c.get("output_layer.weight", {vp, h}))
      c.matrix("lm_head.weight", t, vocab, false);
  }
  if (!c.error.empty())
    return c.error;
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
    return load_dir + ": error: the spec's " + error;

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
  *summary = "wrote " + dir + ": " + (arch == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM") +
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
