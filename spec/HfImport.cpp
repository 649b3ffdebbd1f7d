// `mtc import-hf` (see HfImport.h): config.json's keys to spec keys, as
// transformers' GPT2Config, LlamaConfig and MixtralConfig define them (their
// defaults apply to keys a file leaves out).
#include "spec/HfImport.h"

#include "runtime/base/atomic_file.h"
#include "spec/Spec.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <simdjson.h>
#include <sstream>
#include <sys/stat.h>

namespace mt::spec {
namespace {

// Keys that do not change what the model computes from its weights
// (generation, tokens, bookkeeping, caches, saving): read past.
const std::set<std::string> kHarmless = {
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype",
    "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "task_specific_params", "output_attentions",
    "output_hidden_states", "return_dict", "id2label", "label2id", "problem_type",
    "tokenizer_class", "prefix", "chunk_size_feed_forward", "is_encoder_decoder",
    "is_decoder", "tie_encoder_decoder", "torchscript", "use_bfloat16", "pruned_heads",
    "finetuning_task", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "cross_attention_hidden_size",
    "add_cross_attention", "tf_legacy_loss", "use_return_dict", "_attn_implementation",
    "attn_implementation", "initializer_range",
    // GPT-2's sequence-summary head (GPT2DoubleHeadsModel), unused by the LM head.
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "n_ctx",
    // Llama: inference-time splitting of the linears, the same math.
    "pretraining_tp"};

std::string jsonText(simdjson::dom::element v) { return simdjson::minify(v); }

class Reader {
public:
  Reader(simdjson::dom::object obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  std::optional<simdjson::dom::element> get(const std::string &key) {
    used_.insert(key);
    simdjson::dom::element v;
    if (obj_[key].get(v) != simdjson::SUCCESS || v.is_null())
      return std::nullopt;
    return v;
  }
  absl::StatusOr<int64_t> integer(const std::string &key, std::optional<int64_t> dflt) {
    auto v = get(key);
    if (!v) {
      if (dflt)
        return *dflt;
      return fail(key, "is missing; a " + arch + " config.json has it");
    }
    int64_t n = 0;
    double d = 0;
    if (v->get_int64().get(n) == simdjson::SUCCESS)
      return n;
    if (v->get_double().get(d) == simdjson::SUCCESS && std::floor(d) == d && std::abs(d) < 9e15)
      return int64_t(d);
    return fail(key, "is " + jsonText(*v) + ", not an integer");
  }
  absl::StatusOr<double> number(const std::string &key, double dflt) {
    auto v = get(key);
    if (!v)
      return dflt;
    double d = 0;
    int64_t n = 0;
    if (v->get_double().get(d) == simdjson::SUCCESS)
      return d;
    if (v->get_int64().get(n) == simdjson::SUCCESS)
      return double(n);
    return fail(key, "is " + jsonText(*v) + ", not a number");
  }
  absl::StatusOr<bool> boolean(const std::string &key, bool dflt) {
    auto v = get(key);
    if (!v)
      return dflt;
    bool b = false;
    if (v->get_bool().get(b) != simdjson::SUCCESS)
      return fail(key, "is " + jsonText(*v) + ", not true or false");
    return b;
  }
  absl::StatusOr<std::string> string(const std::string &key, const std::string &dflt) {
    auto v = get(key);
    if (!v)
      return dflt;
    std::string_view s;
    if (v->get_string().get(s) != simdjson::SUCCESS)
      return fail(key, "is " + jsonText(*v) + ", not a string");
    return std::string(s);
  }
  absl::Status fail(const std::string &key, const std::string &why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": error: \"", key, "\" ", why));
  }
  // Keys neither read nor harmless: mt cannot say they leave the math alone.
  absl::Status unknownKeys() {
    std::vector<std::string> unknown;
    for (auto field : obj_) {
      std::string k(field.key);
      if (!used_.count(k) && !kHarmless.count(k))
        unknown.push_back("\"" + k + "\"");
    }
    if (unknown.empty())
      return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ": error: ", absl::StrJoin(unknown, ", "), unknown.size() == 1 ? " is a key" : " are keys",
        " that mt does not know for ", arch,
        "; it cannot tell whether they change the model's math, so the import stops (remove "
        "them from a copy of config.json if they do not)"));
  }

  std::string arch;

private:
  simdjson::dom::object obj_;
  std::string source_;
  std::set<std::string> used_;
};

// The shortest text that reads back as v, always a TOML float.
std::string num(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string t(buf, r.ptr);
  if (t.find_first_of(".eEn") == std::string::npos)
    t += ".0";
  return t;
}

std::string quote(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

bool fileExists(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

#define MT_TRY(var, expr)                                                                          \
  auto var##_or = (expr);                                                                          \
  if (!var##_or.ok())                                                                              \
    return var##_or.status();                                                                      \
  auto var = *var##_or;

} // namespace

absl::StatusOr<HfImportResult> importHfConfig(const std::string &json, const std::string &source,
                                              const std::string &dir) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  simdjson::padded_string text(json);
  if (auto e = parser.parse(text).get(root); e != simdjson::SUCCESS)
    return absl::InvalidArgumentError(absl::StrCat(source, ": error: not valid JSON (",
                                                   simdjson::error_message(e), ")"));
  simdjson::dom::object obj;
  if (root.get_object().get(obj) != simdjson::SUCCESS)
    return absl::InvalidArgumentError(absl::StrCat(source, ": error: not a JSON object"));
  Reader r(obj, source);

  // The class: "architectures" names it; "model_type" alone will do.
  std::string arch;
  if (auto a = r.get("architectures")) {
    simdjson::dom::array list;
    std::string_view first;
    if (a->get_array().get(list) != simdjson::SUCCESS || list.size() != 1 ||
        list.at(0).get_string().get(first) != simdjson::SUCCESS)
      return r.fail("architectures", "is " + jsonText(*a) + "; mt imports a list of one class, "
                                     "GPT2LMHeadModel, LlamaForCausalLM or MixtralForCausalLM");
    arch = std::string(first);
  } else {
    MT_TRY(type, r.string("model_type", ""));
    arch = type == "gpt2"      ? "GPT2LMHeadModel"
           : type == "llama"   ? "LlamaForCausalLM"
           : type == "mixtral" ? "MixtralForCausalLM"
                               : "";
    if (arch.empty())
      return r.fail("model_type", "is " + quote(type) +
                                      " and there are no \"architectures\"; mt imports "
                                      "GPT2LMHeadModel, LlamaForCausalLM and MixtralForCausalLM");
  }
  if (arch != "GPT2LMHeadModel" && arch != "LlamaForCausalLM" && arch != "MixtralForCausalLM")
    return r.fail("architectures",
                  "names " + arch + ", which mt does not import (it imports GPT2LMHeadModel, "
                                    "LlamaForCausalLM and MixtralForCausalLM)");
  r.arch = arch;
  const bool mixtral = arch == "MixtralForCausalLM";
  const std::string wantType =
      arch == "GPT2LMHeadModel" ? "gpt2" : mixtral ? "mixtral" : "llama";
  MT_TRY(modelType, r.string("model_type", wantType));
  if (modelType != wantType)
    return r.fail("model_type", "is " + quote(modelType) + " but \"architectures\" names " + arch);

  // [model], in the spec's key order.
  std::vector<std::pair<std::string, std::string>> model;
  auto set = [&](const std::string &k, const std::string &v) { model.push_back({k, v}); };
  auto setInt = [&](const std::string &k, int64_t v) { set(k, std::to_string(v)); };
  int64_t maxPositions = 0;
  std::vector<std::string> notes;
  if (arch == "GPT2LMHeadModel") {
    MT_TRY(layers, r.integer("n_layer", 12));
    MT_TRY(hidden, r.integer("n_embd", 768));
    MT_TRY(heads, r.integer("n_head", 12));
    MT_TRY(positions, r.integer("n_positions", 1024));
    MT_TRY(vocab, r.integer("vocab_size", 50257));
    std::optional<int64_t> inner;
    if (r.get("n_inner")) {
      MT_TRY(n, r.integer("n_inner", std::nullopt));
      inner = n;
    }
    MT_TRY(act, r.string("activation_function", "gelu_new"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      return r.fail("activation_function",
                    "is " + quote(act) + "; mt's GPT MLP computes the tanh GeLU "
                                         "(\"gelu_new\", \"gelu_pytorch_tanh\") only");
    MT_TRY(eps, r.number("layer_norm_epsilon", 1e-5));
    MT_TRY(tied, r.boolean("tie_word_embeddings", true));
    MT_TRY(scale, r.boolean("scale_attn_weights", true));
    if (!scale)
      return r.fail("scale_attn_weights", "is false; mt scales attention by 1/sqrt(head size) "
                                          "always");
    MT_TRY(byLayer, r.boolean("scale_attn_by_inverse_layer_idx", false));
    if (byLayer)
      return r.fail("scale_attn_by_inverse_layer_idx",
                    "is true; mt does not scale attention by the layer's index");
    MT_TRY(cross, r.boolean("add_cross_attention", false));
    if (cross)
      return r.fail("add_cross_attention", "is true; mt's decoder has no cross-attention");
    r.get("reorder_and_upcast_attn"); // f32 attention scores: mt's fp32 already computes so
    MT_TRY(resid, r.number("resid_pdrop", 0.1));
    MT_TRY(embd, r.number("embd_pdrop", 0.1));
    MT_TRY(attn, r.number("attn_pdrop", 0.1));
    if (embd != resid)
      notes.push_back("embd_pdrop " + num(embd) + " and resid_pdrop " + num(resid) +
                      " differ; mt has one hidden_dropout, set to resid_pdrop");
    setInt("num_layers", layers);
    setInt("hidden_size", hidden);
    if (inner)
      setInt("ffn_hidden_size", *inner);
    setInt("num_attention_heads", heads);
    maxPositions = positions;
    setInt("max_position_embeddings", positions);
    setInt("vocab_size", vocab);
    set("position_embedding_type", "\"learned_absolute\"");
    set("normalization", "\"LayerNorm\"");
    set("norm_epsilon", num(eps));
    set("untie_embeddings_and_output_weights", tied ? "false" : "true");
    set("add_bias_linear", "true");
    set("hidden_dropout", num(resid));
    set("attention_dropout", num(attn));
  } else {
    MT_TRY(layers, r.integer("num_hidden_layers", 32));
    MT_TRY(hidden, r.integer("hidden_size", 4096));
    // LlamaConfig's defaults, or MixtralConfig's.
    MT_TRY(inter, r.integer("intermediate_size", mixtral ? 14336 : 11008));
    MT_TRY(heads, r.integer("num_attention_heads", 32));
    MT_TRY(kvHeads, r.integer("num_key_value_heads", mixtral ? 8 : heads));
    if (heads < 1 || hidden % heads != 0)
      return r.fail("num_attention_heads", "is " + std::to_string(heads) +
                                               ", not a divisor of hidden_size " +
                                               std::to_string(hidden));
    MT_TRY(headDim, r.integer("head_dim", hidden / heads));
    MT_TRY(positions, r.integer("max_position_embeddings", mixtral ? 4096 * 32 : 2048));
    MT_TRY(vocab, r.integer("vocab_size", 32000));
    MT_TRY(act, r.string("hidden_act", "silu"));
    if (act != "silu")
      return r.fail("hidden_act", "is " + quote(act) + "; mt's SwiGLU gates with SiLU (\"silu\")");
    MT_TRY(eps, r.number("rms_norm_eps", mixtral ? 1e-5 : 1e-6));
    MT_TRY(tied, r.boolean("tie_word_embeddings", false));
    // Mixtral has no biases and no key for them.
    bool attnBias = false, mlpBias = false;
    if (!mixtral) {
      MT_TRY(a, r.boolean("attention_bias", false));
      MT_TRY(b, r.boolean("mlp_bias", false));
      attnBias = a;
      mlpBias = b;
    }
    if (attnBias != mlpBias)
      return r.fail(attnBias ? "attention_bias" : "mlp_bias",
                    std::string("is true but \"") + (attnBias ? "mlp_bias" : "attention_bias") +
                        "\" is false; mt's add_bias_linear gives both or neither");
    MT_TRY(attnDrop, r.number("attention_dropout", 0.0));
    // RoPE: transformers 4's rope_theta and rope_scaling, or 5's rope_parameters.
    double theta = mixtral ? 1e6 : 10000;
    std::optional<simdjson::dom::element> scaling = r.get("rope_scaling");
    if (auto params = r.get("rope_parameters")) {
      simdjson::dom::object p;
      if (params->get_object().get(p) != simdjson::SUCCESS)
        return r.fail("rope_parameters", "is " + jsonText(*params) + ", not an object");
      double t = 0;
      if (p["rope_theta"].get_double().get(t) == simdjson::SUCCESS)
        theta = t;
      std::string_view type;
      if (p["rope_type"].get_string().get(type) == simdjson::SUCCESS && type != "default")
        scaling = *params;
    }
    if (r.get("rope_theta")) {
      MT_TRY(t, r.number("rope_theta", 10000));
      theta = t;
    }
    if (theta != std::floor(theta) || theta < 1 || theta > 1e15)
      return r.fail("rope_theta", "is " + num(theta) +
                                      "; mt's rotary_base is a positive integer");
    setInt("num_layers", layers);
    setInt("hidden_size", hidden);
    setInt("ffn_hidden_size", inter);
    setInt("num_attention_heads", heads);
    setInt("num_query_groups", kvHeads);
    if (headDim != hidden / heads)
      setInt("kv_channels", headDim);
    maxPositions = positions;
    setInt("max_position_embeddings", positions);
    setInt("vocab_size", vocab);
    set("position_embedding_type", "\"rope\"");
    setInt("rotary_base", int64_t(theta));
    if (scaling) {
      simdjson::dom::object s;
      if (scaling->get_object().get(s) != simdjson::SUCCESS)
        return r.fail("rope_scaling", "is " + jsonText(*scaling) + ", not an object");
      std::string_view type;
      if (s["rope_type"].get_string().get(type) != simdjson::SUCCESS &&
          s["type"].get_string().get(type) != simdjson::SUCCESS)
        return r.fail("rope_scaling", "has no \"rope_type\"");
      if (type != "llama3")
        return r.fail("rope_scaling", "has rope_type \"" + std::string(type) +
                                          "\"; mt computes Llama 3.1's scaling (\"llama3\") "
                                          "only");
      // mt's scaling is Llama 3.1's as Megatron applies it: these are fixed.
      auto want = [&](const char *k, double v) -> absl::Status {
        double got = 0;
        int64_t n = 0;
        if (s[k].get_double().get(got) != simdjson::SUCCESS) {
          if (s[k].get_int64().get(n) != simdjson::SUCCESS)
            return r.fail("rope_scaling", std::string("has no number \"") + k + "\"");
          got = double(n);
        }
        if (got != v)
          return r.fail("rope_scaling", std::string("has \"") + k + "\" " + num(got) +
                                            "; mt's Llama 3.1 scaling has " + num(v) +
                                            " (Megatron's apply_rope_scaling)");
        return absl::OkStatus();
      };
      for (auto [k, v] : {std::pair<const char *, double>{"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192.0}})
        if (absl::Status st = want(k, v); !st.ok())
          return st;
      double factor = 0;
      int64_t fi = 0;
      if (s["factor"].get_double().get(factor) != simdjson::SUCCESS) {
        if (s["factor"].get_int64().get(fi) != simdjson::SUCCESS)
          return r.fail("rope_scaling", "has no number \"factor\"");
        factor = double(fi);
      }
      set("use_rope_scaling", "true");
      set("rope_scaling_factor", num(factor));
    }
    set("normalization", "\"RMSNorm\"");
    set("norm_epsilon", num(eps));
    set("swiglu", "true");
    set("untie_embeddings_and_output_weights", tied ? "false" : "true");
    set("add_bias_linear", attnBias ? "true" : "false");
    set("hidden_dropout", "0.0");
    set("attention_dropout", num(attnDrop));
    if (mixtral) {
      // MixtralSparseMoeBlock: every layer routes each token to
      // num_experts_per_tok of num_local_experts SwiGLU experts by a softmax
      // router whose top-k weights are renormalized (Megatron's softmax
      // router without pre-softmax), computed in f32; nothing dropped.
      if (auto w = r.get("sliding_window"))
        return r.fail("sliding_window", "is " + jsonText(*w) +
                                            "; mt's attention is full causal attention (a "
                                            "sliding window is not computed)");
      MT_TRY(experts, r.integer("num_local_experts", 8));
      MT_TRY(topk, r.integer("num_experts_per_tok", 2));
      MT_TRY(auxCoef, r.number("router_aux_loss_coef", 0.001));
      MT_TRY(jitter, r.number("router_jitter_noise", 0.0));
      if (jitter != 0.0)
        return r.fail("router_jitter_noise", "is " + num(jitter) +
                                                 "; mt's router multiplies no noise into its "
                                                 "input (Megatron's moe_input_jitter_eps is not "
                                                 "a spec key)");
      MT_TRY(routerLogits, r.boolean("output_router_logits", false));
      (void)routerLogits; // whether transformers' forward adds the aux loss; mt trains with it
      setInt("num_experts", experts);
      setInt("moe_ffn_hidden_size", inter);
      setInt("moe_router_topk", topk);
      set("moe_router_load_balancing_type", "\"aux_loss\"");
      set("moe_aux_loss_coeff", num(auxCoef));
      set("moe_router_dtype", "\"fp32\"");
    }
  }
  MT_TRY(initStd, r.number("initializer_range", 0.02));
  set("init_method_std", num(initStd));
  if (absl::Status st = r.unknownKeys(); !st.ok())
    return st;

  // A training length the model can hold; the rest are starting values.
  const int64_t seq = std::min<int64_t>(maxPositions, 4096);
  std::string toml = absl::StrCat(
      "# ", arch, " from ", source, " (mtc import-hf).\n",
      "# [model] is the checkpoint's architecture: load its weights with\n",
      "#   mt-checkpoint from-hf ", dir.empty() ? "." : dir, " --spec THIS_FILE -o CKPT\n",
      "# [parallel], [training] and [data] are starting values: edit them.\n[model]\n");
  for (const auto &[k, v] : model) {
    toml += k + " = " + v + "\n";
    if (k == "max_position_embeddings")
      toml += "seq_length = " + std::to_string(seq) + "\n";
  }
  // Absolute, so that the spec reads it from wherever it is compiled.
  std::string tokenizer = (dir.empty() ? std::string(".") : dir) + "/tokenizer.json";
  if (char *real = ::realpath(tokenizer.c_str(), nullptr)) {
    tokenizer = real;
    std::free(real);
  }
  toml += "\n[parallel]\ntensor_model_parallel_size = 1\npipeline_model_parallel_size = 1\n"
          "\n[training]\nmicro_batch_size = 1\ntrain_iters = 1000\nlr = 1e-5\n"
          "\n[data]\nmock_data = true\n";
  // The folder's tokenizer, when the spec's reader takes it as the model's
  // (its ids must be vocab_size, its tokenizer_config.json must name eos).
  if (fileExists(tokenizer)) {
    const std::string withTokenizer = toml + "tokenizer_type = \"HuggingFaceTokenizer\"\n"
                                             "tokenizer_model = " + quote(tokenizer) + "\n";
    absl::StatusOr<Spec> spec = parseSpecString(withTokenizer, source + " (imported)");
    if (spec.ok())
      toml = withTokenizer;
    else
      notes.push_back("[data] does not name " + tokenizer + ": " +
                      std::string(spec.status().message()));
  }
  notes.push_back("[training] (1000 iterations at lr 1e-5) and [data] (mock_data) are "
                  "placeholders: set your data_path, batch sizes, schedule and precision");
  absl::StatusOr<Spec> spec = parseSpecString(toml, source + " (imported)");
  if (!spec.ok())
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": error: the imported spec does not validate: ", spec.status().message()));
  return HfImportResult{toml, arch, notes};
}

int runImportHfCommand(const std::vector<std::string> &args) {
  auto error = [](const std::string &msg) {
    std::cerr << "mtc import-hf: error: " << msg << "\n";
    return 1;
  };
  std::string dir, output;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << "usage: mtc import-hf DIR [-o spec.toml]\n\n"
                   "Writes a spec from a Hugging Face model folder's config.json\n"
                   "(GPT2LMHeadModel, LlamaForCausalLM or MixtralForCausalLM): [model] is\n"
                   "the checkpoint's "
                   "architecture; [parallel], [training] and [data] are starting values.\n"
                   "Load the weights into a plan of it with 'mt-checkpoint from-hf'\n"
                   "(docs/checkpoints.md).\n\n"
                   "  -o FILE, --output FILE  write the spec to FILE (atomically) instead of\n"
                   "                          stdout\n";
      return 0;
    }
    if (a == "-o" || a == "--output") {
      if (i + 1 >= args.size())
        return error(a + " needs a file name; see 'mtc import-hf --help'");
      output = args[++i];
    } else if (a.rfind("--output=", 0) == 0) {
      output = a.substr(9);
    } else if (!a.empty() && a[0] == '-') {
      return error("unknown option '" + a + "'; see 'mtc import-hf --help'");
    } else if (dir.empty()) {
      dir = a;
    } else {
      return error("one folder, got '" + dir + "' and '" + a + "'");
    }
  }
  if (dir.empty())
    return error("no folder given: mtc import-hf DIR [-o spec.toml]");
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  std::string config = dir + "/config.json";
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && S_ISREG(st.st_mode)) { // config.json itself
    config = dir;
    size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  }
  std::ifstream in(config, std::ios::binary);
  if (!in)
    return error("cannot read " + config + ": " + std::strerror(errno) +
                 "; give a Hugging Face model folder (the one holding config.json)");
  std::stringstream buf;
  buf << in.rdbuf();
  absl::StatusOr<HfImportResult> result = importHfConfig(buf.str(), config, dir);
  if (!result.ok()) {
    std::cerr << result.status().message() << "\n";
    return 1;
  }
  for (const std::string &n : result->notes)
    std::cerr << "mtc import-hf: note: " << n << "\n";
  if (output.empty()) {
    std::cout << result->toml;
    std::cout.flush();
    return std::cout ? 0 : 1;
  }
  if (std::string err = rt::write_file_atomically(output, result->toml); !err.empty())
    return error(err + "; check the directory exists and is writable");
  std::cerr << "mtc import-hf: wrote " << output << " (" << result->architecture << ")\n";
  return 0;
}

} // namespace mt::spec
