// Enum spellings, vocabulary padding, the analytic parameter count, device
// presets and the resolved-spec echo (toToml).
#include "spec/Spec.h"

#include <sstream>

#include "spec/SpecKeys.h"

namespace mt::spec {

const char *toString(PositionEmbedding v) {
  switch (v) {
  case PositionEmbedding::LearnedAbsolute:
    return "learned_absolute";
  case PositionEmbedding::Rope:
    return "rope";
  }
  return "";
}

const char *toString(Normalization v) {
  switch (v) {
  case Normalization::LayerNorm:
    return "LayerNorm";
  case Normalization::RMSNorm:
    return "RMSNorm";
  }
  return "";
}

const char *toString(Precision v) {
  switch (v) {
  case Precision::FP32:
    return "fp32";
  case Precision::FP16:
    return "fp16";
  case Precision::BF16:
    return "bf16";
  }
  return "";
}

const char *toString(Optimizer v) {
  switch (v) {
  case Optimizer::Adam:
    return "adam";
  case Optimizer::SGD:
    return "sgd";
  }
  return "?";
}

const char *toString(LrDecayStyle v) {
  switch (v) {
  case LrDecayStyle::Constant:
    return "constant";
  case LrDecayStyle::Linear:
    return "linear";
  case LrDecayStyle::Cosine:
    return "cosine";
  case LrDecayStyle::InverseSquareRoot:
    return "inverse-square-root";
  case LrDecayStyle::WSD:
    return "WSD";
  }
  return "";
}

const char *toString(WsdDecayStyle v) {
  switch (v) {
  case WsdDecayStyle::Exponential:
    return "exponential";
  case WsdDecayStyle::Linear:
    return "linear";
  case WsdDecayStyle::Cosine:
    return "cosine";
  case WsdDecayStyle::MinusSqrt:
    return "minus_sqrt";
  }
  return "";
}

const char *toString(RecomputeGranularity v) {
  switch (v) {
  case RecomputeGranularity::None:
    return "none";
  case RecomputeGranularity::Selective:
    return "selective";
  case RecomputeGranularity::Full:
    return "full";
  }
  return "";
}

const char *toString(RecomputeMethod v) {
  switch (v) {
  case RecomputeMethod::None:
    return "none";
  case RecomputeMethod::Uniform:
    return "uniform";
  case RecomputeMethod::Block:
    return "block";
  }
  return "";
}

const char *toString(MoeLoadBalancing v) {
  switch (v) {
  case MoeLoadBalancing::AuxLoss:
    return "aux_loss";
  case MoeLoadBalancing::SeqAuxLoss:
    return "seq_aux_loss";
  case MoeLoadBalancing::None:
    return "none";
  }
  return "";
}

const char *toString(MoeScoreFunction v) {
  switch (v) {
  case MoeScoreFunction::Softmax:
    return "softmax";
  case MoeScoreFunction::Sigmoid:
    return "sigmoid";
  }
  return "";
}

const char *toString(MoeTokenDropPolicy v) {
  switch (v) {
  case MoeTokenDropPolicy::Probs:
    return "probs";
  case MoeTokenDropPolicy::Position:
    return "position";
  }
  return "";
}

const char *toString(MoeRouterDtype v) {
  switch (v) {
  case MoeRouterDtype::None:
    return "none";
  case MoeRouterDtype::FP32:
    return "fp32";
  case MoeRouterDtype::FP64:
    return "fp64";
  }
  return "";
}

const char *toString(MoeTokenDispatcher v) {
  switch (v) {
  case MoeTokenDispatcher::AllGather:
    return "allgather";
  case MoeTokenDispatcher::AllToAll:
    return "alltoall";
  }
  return "";
}

int64_t ModelConfig::numMoeLayers() const {
  if (num_experts == 0)
    return 0;
  int64_t n = 0;
  for (bool b : moe_layers)
    n += b ? 1 : 0;
  return n;
}

double Spec::flopsPerIteration() const {
  // megatron/training/training.py, num_floating_point_operations ->
  // transformer_flops() without MTP or multi-latent attention: 3 GEMMs per
  // matrix (forward, data and weight gradients) x 2 FLOPs per multiply-add;
  // the causal core attention counts half the s x s scores. An MoE layer's
  // MLP counts the moe_router_topk experts a token goes through and the
  // shared expert (not the router, as Megatron's formula).
  const double h = double(model.hidden_size), s = double(model.seq_length);
  const double q = double(model.kv_channels * model.num_attention_heads);
  const double kv = double(model.kv_channels * model.num_query_groups);
  const double layers = double(model.num_layers);
  const double ffnFactor = model.swiglu ? 3.0 : 2.0;
  const double attention = 3.0 * 2.0 * (h * (q + 2.0 * kv) + q * s / 2.0 * 2.0 + q * h);
  const double moeLayers = double(model.numMoeLayers());
  const double mlp =
      3.0 * 2.0 * h * ffnFactor *
      (double(model.ffn_hidden_size) * (layers - moeLayers) +
       (double(model.moe_ffn_hidden_size) * double(model.moe_router_topk) +
        double(model.moe_shared_expert_intermediate_size)) *
           moeLayers);
  const double logits = 3.0 * 2.0 * h * double(paddedVocabSize());
  return double(training.global_batch_size) * s * (mlp + attention * layers + logits);
}

int64_t Spec::paddedVocabSize() const {
  // Megatron pads so every tensor-parallel rank gets an equal, aligned slice
  // of the embedding (megatron/training/tokenizer: _vocab_size_with_padding).
  int64_t multiple = model.make_vocab_size_divisible_by * parallel.tensor_model_parallel_size;
  if (multiple <= 0)
    return model.vocab_size;
  return (model.vocab_size + multiple - 1) / multiple * multiple;
}

ParamCount countParameters(const ModelConfig &m, int64_t paddedVocab) {
  ParamCount c;
  const int64_t h = m.hidden_size;
  const int64_t bias = m.add_bias_linear ? 1 : 0;
  const int64_t norm = m.normalization == Normalization::LayerNorm ? 2 * h : h;
  c.word_embeddings = paddedVocab * h;
  if (m.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    c.position_embeddings = m.max_position_embeddings * h;
  // Fused QKV: n query heads plus g key and g value heads, d channels each.
  const int64_t qkvOut =
      m.num_attention_heads * m.kv_channels + 2 * m.num_query_groups * m.kv_channels;
  const int64_t projIn = m.num_attention_heads * m.kv_channels;
  c.per_layer_attention = h * qkvOut + bias * qkvOut + projIn * h + bias * h;
  // SwiGLU's FC1 holds the gate and the up projection side by side.
  const int64_t fc1Out = m.ffn_hidden_size * (m.swiglu ? 2 : 1);
  c.per_layer_mlp = h * fc1Out + bias * fc1Out + m.ffn_hidden_size * h + bias * h;
  c.per_layer_norms = 2 * norm;
  c.final_norm = norm;
  if (m.num_experts > 0) {
    // megatron/core/transformer/moe: the router's weight [E, h] (no bias),
    // each expert an MLP of moe_ffn_hidden_size (mt's have no biases), the
    // shared expert one of moe_shared_expert_intermediate_size.
    auto mlp = [&](int64_t ffn) {
      const int64_t fc1 = ffn * (m.swiglu ? 2 : 1);
      return h * fc1 + bias * fc1 + ffn * h + bias * h;
    };
    c.moe_layers = m.numMoeLayers();
    c.per_moe_layer_router = m.num_experts * h;
    c.per_moe_layer_experts = m.num_experts * mlp(m.moe_ffn_hidden_size);
    c.per_moe_layer_active_experts = m.moe_router_topk * mlp(m.moe_ffn_hidden_size);
    if (m.moe_shared_expert_intermediate_size > 0)
      c.per_moe_layer_shared = mlp(m.moe_shared_expert_intermediate_size);
  }
  if (m.untie_embeddings_and_output_weights)
    c.output_layer = paddedVocab * h;
  return c;
}

const std::vector<DevicePreset> &devicePresets() {
  // Total memory as the driver reports it (nvidia-smi's MiB * 2^20).
  static const std::vector<DevicePreset> presets = {
      {"H100-80GB", 85520809984LL},    // 81559 MiB
      {"H200-141GB", 150754820096LL},  // 143771 MiB
      {"A100-80GB", 85899345920LL},    // 81920 MiB
      {"A100-40GB", 42949672960LL},    // 40960 MiB
      {"RTX5080-16GB", 17094934528LL}, // 16303 MiB
  };
  return presets;
}

namespace {

std::string quote(const std::string &s) {
  std::string r = "\"";
  for (unsigned char c : s) {
    switch (c) {
    case '"':
      r += "\\\"";
      break;
    case '\\':
      r += "\\\\";
      break;
    case '\n':
      r += "\\n";
      break;
    case '\t':
      r += "\\t";
      break;
    case '\r':
      r += "\\r";
      break;
    default:
      if (c < 0x20 || c == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04X", c);
        r += buf;
      } else {
        r += static_cast<char>(c);
      }
    }
  }
  return r + "\"";
}

// A TOML float literal that reads back bit-exact.
std::string tomlFloat(double v) {
  std::string s = formatNumber(v);
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  return s;
}

class TomlWriter {
public:
  explicit TomlWriter(std::ostringstream &os) : os(os) {}
  void section(const char *name) {
    os << (first ? "" : "\n") << "[" << name << "]\n";
    first = false;
  }
  void integer(const char *key, int64_t v) { os << key << " = " << v << "\n"; }
  void real(const char *key, double v) { os << key << " = " << tomlFloat(v) << "\n"; }
  void boolean(const char *key, bool v) { os << key << " = " << (v ? "true" : "false") << "\n"; }
  void string(const char *key, const std::string &v) { os << key << " = " << quote(v) << "\n"; }
  void strings(const char *key, const std::vector<std::string> &v) {
    os << key << " = [";
    for (size_t i = 0; i < v.size(); ++i)
      os << (i ? ", " : "") << quote(v[i]);
    os << "]\n";
  }
  void integers(const char *key, const std::vector<int64_t> &v) {
    os << key << " = [";
    for (size_t i = 0; i < v.size(); ++i)
      os << (i ? ", " : "") << v[i];
    os << "]\n";
  }
  // Keys without a value stay visible, so the echo still lists every key.
  void unset(const char *key, const char *why) { os << "# " << key << ": " << why << "\n"; }

private:
  std::ostringstream &os;
  bool first = true;
};

} // namespace

std::string toToml(const Spec &spec) {
  std::ostringstream os;
  os << "# Resolved mt spec: every key explicit, defaults filled in";
  if (!spec.source.empty()) {
    std::string src = spec.source;
    for (char &c : src)
      if (c == '\n' || c == '\r')
        c = ' ';
    os << " (from " << src << ")";
  }
  os << ".\n";
  TomlWriter w(os);
  const ModelConfig &m = spec.model;
  w.section("model");
  w.integer("num_layers", m.num_layers);
  w.integer("hidden_size", m.hidden_size);
  w.integer("ffn_hidden_size", m.ffn_hidden_size);
  w.integer("num_attention_heads", m.num_attention_heads);
  w.integer("num_query_groups", m.num_query_groups);
  w.integer("kv_channels", m.kv_channels);
  w.integer("seq_length", m.seq_length);
  w.integer("max_position_embeddings", m.max_position_embeddings);
  w.integer("vocab_size", m.vocab_size);
  w.integer("make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  w.string("position_embedding_type", toString(m.position_embedding_type));
  if (m.position_embedding_type == PositionEmbedding::Rope)
    w.integer("rotary_base", m.rotary_base);
  else
    w.unset("rotary_base", "only with position_embedding_type = \"rope\"");
  if (m.position_embedding_type == PositionEmbedding::Rope)
    w.boolean("use_rope_scaling", m.use_rope_scaling);
  else
    w.unset("use_rope_scaling", "only with position_embedding_type = \"rope\"");
  if (m.use_rope_scaling)
    w.real("rope_scaling_factor", m.rope_scaling_factor);
  else
    w.unset("rope_scaling_factor", "only with use_rope_scaling = true");
  w.string("normalization", toString(m.normalization));
  w.real("norm_epsilon", m.norm_epsilon);
  w.boolean("apply_layernorm_1p", m.apply_layernorm_1p);
  w.boolean("swiglu", m.swiglu);
  w.boolean("untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights);
  w.boolean("add_bias_linear", m.add_bias_linear);
  w.real("hidden_dropout", m.hidden_dropout);
  w.real("attention_dropout", m.attention_dropout);
  w.real("init_method_std", m.init_method_std);
  if (m.num_experts > 0) {
    w.integer("num_experts", m.num_experts);
    w.integer("moe_ffn_hidden_size", m.moe_ffn_hidden_size);
    w.integer("moe_router_topk", m.moe_router_topk);
    w.string("moe_router_load_balancing_type", toString(m.moe_router_load_balancing_type));
    w.real("moe_aux_loss_coeff", m.moe_aux_loss_coeff);
    if (m.moe_z_loss_coeff > 0)
      w.real("moe_z_loss_coeff", m.moe_z_loss_coeff);
    else
      w.unset("moe_z_loss_coeff", "not set (no z-loss)");
    w.string("moe_router_score_function", toString(m.moe_router_score_function));
    if (m.moe_router_score_function == MoeScoreFunction::Softmax)
      w.boolean("moe_router_pre_softmax", m.moe_router_pre_softmax);
    else
      w.unset("moe_router_pre_softmax", "only with moe_router_score_function = \"softmax\"");
    if (m.moe_router_topk_scaling_factor > 0)
      w.real("moe_router_topk_scaling_factor", m.moe_router_topk_scaling_factor);
    else
      w.unset("moe_router_topk_scaling_factor", "not set (no scaling)");
    if (m.moe_expert_capacity_factor > 0) {
      w.real("moe_expert_capacity_factor", m.moe_expert_capacity_factor);
      w.boolean("moe_pad_expert_input_to_capacity", m.moe_pad_expert_input_to_capacity);
      w.string("moe_token_drop_policy", toString(m.moe_token_drop_policy));
    } else {
      const char *noCapacity = "only with moe_expert_capacity_factor";
      w.unset("moe_expert_capacity_factor", "not set (no token is dropped)");
      w.unset("moe_pad_expert_input_to_capacity", noCapacity);
      w.unset("moe_token_drop_policy", noCapacity);
    }
    // The resolved pattern: Megatron's integer form when one gives it.
    int64_t every = 0;
    for (int64_t n = 1; n <= m.num_layers && every == 0; ++n) {
      bool same = true;
      for (int64_t i = 0; i < m.num_layers && same; ++i)
        same = m.moe_layers[size_t(i)] == (i % n == 0);
      if (same)
        every = n;
    }
    if (every > 0) {
      w.integer("moe_layer_freq", every);
    } else {
      std::vector<int64_t> flags;
      for (bool b : m.moe_layers)
        flags.push_back(b ? 1 : 0);
      w.integers("moe_layer_freq", flags);
    }
    if (m.moe_shared_expert_intermediate_size > 0)
      w.integer("moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size);
    else
      w.unset("moe_shared_expert_intermediate_size", "not set (no shared expert)");
    w.boolean("moe_grouped_gemm", m.moe_grouped_gemm);
    if (m.moe_router_dtype != MoeRouterDtype::None)
      w.string("moe_router_dtype", toString(m.moe_router_dtype));
    else
      w.unset("moe_router_dtype", "not set (the model's precision)");
  } else {
    const char *dense = "only with num_experts > 0";
    w.unset("num_experts", "not set (a dense model)");
    for (const char *k :
         {"moe_ffn_hidden_size", "moe_router_topk", "moe_router_load_balancing_type",
          "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_score_function",
          "moe_router_pre_softmax", "moe_router_topk_scaling_factor",
          "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
          "moe_token_drop_policy", "moe_layer_freq", "moe_shared_expert_intermediate_size",
          "moe_grouped_gemm", "moe_router_dtype"})
      w.unset(k, dense);
  }

  const ParallelConfig &p = spec.parallel;
  w.section("parallel");
  w.integer("tensor_model_parallel_size", p.tensor_model_parallel_size);
  w.integer("pipeline_model_parallel_size", p.pipeline_model_parallel_size);
  w.integer("data_parallel_size", p.data_parallel_size);
  w.integer("virtual_pipeline_model_parallel_size", p.virtual_pipeline_model_parallel_size);
  if (p.decoder_first_pipeline_num_layers)
    w.integer("decoder_first_pipeline_num_layers", p.decoder_first_pipeline_num_layers);
  else
    w.unset("decoder_first_pipeline_num_layers", "not set (an even share)");
  if (p.decoder_last_pipeline_num_layers)
    w.integer("decoder_last_pipeline_num_layers", p.decoder_last_pipeline_num_layers);
  else
    w.unset("decoder_last_pipeline_num_layers", "not set (an even share)");
  w.boolean("sequence_parallel", p.sequence_parallel);
  w.boolean("use_distributed_optimizer", p.use_distributed_optimizer);
  w.boolean("overlap_grad_reduce", p.overlap_grad_reduce);
  w.boolean("overlap_param_gather", p.overlap_param_gather);
  if (p.ddp_bucket_size > 0)
    w.integer("ddp_bucket_size", p.ddp_bucket_size);
  else
    w.unset("ddp_bucket_size", "not set (max(40000000, 1000000 * dp))");
  if (p.recompute_granularity != RecomputeGranularity::None)
    w.string("recompute_granularity", toString(p.recompute_granularity));
  else
    w.unset("recompute_granularity", "not set (no recomputation)");
  if (p.recompute_method != RecomputeMethod::None)
    w.string("recompute_method", toString(p.recompute_method));
  else
    w.unset("recompute_method", "not set");
  if (p.recompute_num_layers > 0)
    w.integer("recompute_num_layers", p.recompute_num_layers);
  else
    w.unset("recompute_num_layers", "not set");
  if (spec.model.num_experts > 0) {
    w.integer("expert_model_parallel_size", p.expert_model_parallel_size);
    w.integer("expert_tensor_parallel_size", p.expert_tensor_parallel_size);
    w.string("moe_token_dispatcher_type", toString(p.moe_token_dispatcher_type));
    if (p.moe_dispatch_buffer_factor > 0)
      w.real("moe_dispatch_buffer_factor", p.moe_dispatch_buffer_factor);
    else
      w.unset("moe_dispatch_buffer_factor", "not set (the worst case)");
  } else {
    const char *dense = "only with num_experts > 0";
    w.unset("expert_model_parallel_size", dense);
    w.unset("expert_tensor_parallel_size", dense);
    w.unset("moe_token_dispatcher_type", dense);
    w.unset("moe_dispatch_buffer_factor", dense);
  }

  const TrainingConfig &t = spec.training;
  const bool fp16 = t.precision == Precision::FP16;
  const char *fp16Only = "only with precision = \"fp16\"";
  w.section("training");
  w.integer("micro_batch_size", t.micro_batch_size);
  w.integer("global_batch_size", t.global_batch_size);
  // One of the two units: the other's keys are comments, so the echo
  // reads back as the same spec.
  const bool bySamples = t.sampleBased();
  const bool wsd = t.lr_decay_style == LrDecayStyle::WSD;
  const char *notWsd = "not set (lr_decay_style is not WSD)";
  const char *inSamples = "not set (sample-based training)";
  const char *inIters = "not set (iteration-based training)";
  if (bySamples) {
    const std::string derived =
        "derived from train_samples: " + std::to_string(t.train_iters) + " iterations";
    w.unset("train_iters", derived.c_str());
    w.integer("train_samples", t.train_samples);
    if (t.rampup_batch_size.size() == 3)
      w.integers("rampup_batch_size", t.rampup_batch_size);
    else
      w.unset("rampup_batch_size", "not set (no batch-size ramp-up)");
  } else {
    w.integer("train_iters", t.train_iters);
    w.unset("train_samples", inIters);
    w.unset("rampup_batch_size", inIters);
  }
  w.real("lr", t.lr);
  w.real("min_lr", t.min_lr);
  if (t.decoupled_lr > 0) {
    w.real("decoupled_lr", t.decoupled_lr);
    w.real("decoupled_min_lr", t.decoupled_min_lr);
  } else {
    w.unset("decoupled_lr", "not set (the embedding and output layer use lr)");
    w.unset("decoupled_min_lr", "only with decoupled_lr");
  }
  w.string("lr_decay_style", toString(t.lr_decay_style));
  if (bySamples) {
    w.unset("lr_decay_iters", inSamples);
    w.integer("lr_decay_samples", t.lr_decay_samples);
    w.unset("lr_warmup_iters", inSamples);
    w.integer("lr_warmup_samples", t.lr_warmup_samples);
    w.unset("lr_warmup_fraction", "resolved into lr_warmup_samples");
  } else {
    w.integer("lr_decay_iters", t.lr_decay_iters);
    w.unset("lr_decay_samples", inIters);
    w.integer("lr_warmup_iters", t.lr_warmup_iters);
    w.unset("lr_warmup_samples", inIters);
    w.unset("lr_warmup_fraction", "resolved into lr_warmup_iters");
  }
  if (wsd) {
    w.string("lr_wsd_decay_style", toString(t.lr_wsd_decay_style));
    if (bySamples) {
      w.unset("lr_wsd_decay_iters", inSamples);
      w.integer("lr_wsd_decay_samples", t.lr_wsd_decay_samples);
    } else {
      w.integer("lr_wsd_decay_iters", t.lr_wsd_decay_iters);
      w.unset("lr_wsd_decay_samples", inIters);
    }
  } else {
    w.unset("lr_wsd_decay_style", notWsd);
    w.unset("lr_wsd_decay_iters", notWsd);
    w.unset("lr_wsd_decay_samples", notWsd);
  }
  w.string("optimizer", toString(t.optimizer));
  w.real("weight_decay", t.weight_decay);
  if (t.optimizer == Optimizer::SGD) {
    w.real("sgd_momentum", t.sgd_momentum);
    const char *adamOnly = "only with optimizer = \"adam\"";
    w.unset("adam_beta1", adamOnly);
    w.unset("adam_beta2", adamOnly);
    w.unset("adam_eps", adamOnly);
  } else {
    w.unset("sgd_momentum", "only with optimizer = \"sgd\"");
    w.real("adam_beta1", t.adam_beta1);
    w.real("adam_beta2", t.adam_beta2);
    w.real("adam_eps", t.adam_eps);
  }
  w.real("clip_grad", t.clip_grad);
  w.boolean("calculate_per_token_loss", t.calculate_per_token_loss);
  w.string("precision", toString(t.precision));
  if (t.precision == Precision::BF16)
    w.boolean("grad_reduce_in_bf16", t.grad_reduce_in_bf16);
  else
    w.unset("grad_reduce_in_bf16", "only with precision = \"bf16\"");
  if (fp16) {
    w.real("initial_loss_scale", t.initial_loss_scale);
    w.real("min_loss_scale", t.min_loss_scale);
    w.integer("loss_scale_window", t.loss_scale_window);
    w.integer("hysteresis", t.hysteresis);
  } else {
    w.unset("initial_loss_scale", fp16Only);
    w.unset("min_loss_scale", fp16Only);
    w.unset("loss_scale_window", fp16Only);
    w.unset("hysteresis", fp16Only);
  }
  w.integer("seed", t.seed);
  w.integer("log_interval", t.log_interval);
  w.boolean("log_throughput", t.log_throughput);
  w.boolean("log_params_norm", t.log_params_norm);
  w.boolean("log_num_zeros_in_grad", t.log_num_zeros_in_grad);
  w.integer("timing_log_level", t.timing_log_level);
  w.string("timing_log_option", t.timing_log_option);
  w.boolean("log_memory_to_tensorboard", t.log_memory_to_tensorboard);
  if (!t.power_log.empty())
    w.string("power_log", t.power_log);
  else
    w.unset("power_log", "not set");
  w.integer("power_log_interval_ms", t.power_log_interval_ms);
  w.boolean("check_for_nan_in_loss_and_grad", t.check_for_nan_in_loss_and_grad);
  w.integer("eval_interval", t.eval_interval);
  w.integer("eval_iters", t.eval_iters);
  w.integer("save_interval", t.save_interval);
  if (!t.save.empty())
    w.string("save", t.save);
  else
    w.unset("save", "not set");
  if (!t.load.empty())
    w.string("load", t.load);
  else
    w.unset("load", "not set");
  if (t.ckpt_step >= 0)
    w.integer("ckpt_step", t.ckpt_step);
  else
    w.unset("ckpt_step", "not set");
  w.boolean("finetune", t.finetune);
  w.boolean("load_optim", t.load_optim);
  w.boolean("load_rng", t.load_rng);
  w.boolean("save_optim", t.save_optim);
  w.boolean("save_rng", t.save_rng);

  const DataConfig &d = spec.data;
  w.section("data");
  if (d.data_path.size() == 1 && d.data_path[0].first == 1.0) {
    w.string("data_path", d.data_path[0].second);
  } else if (!d.data_path.empty()) {
    os << "data_path = [";
    for (size_t i = 0; i < d.data_path.size(); ++i)
      os << (i ? ", " : "") << tomlFloat(d.data_path[i].first) << ", "
         << quote(d.data_path[i].second);
    os << "]\n";
  } else {
    w.unset("data_path", "not set");
  }
  w.string("split", d.split);
  w.string("tokenizer_type", d.tokenizer_type);
  if (!d.vocab_file.empty())
    w.string("vocab_file", d.vocab_file);
  else
    w.unset("vocab_file", "not set");
  if (!d.merge_file.empty())
    w.string("merge_file", d.merge_file);
  else
    w.unset("merge_file", "not set");
  if (!d.tokenizer_model.empty())
    w.string("tokenizer_model", d.tokenizer_model);
  else
    w.unset("tokenizer_model", "not set");
  if (!d.tokenizer_special_tokens.empty())
    w.strings("tokenizer_special_tokens", d.tokenizer_special_tokens);
  else
    w.unset("tokenizer_special_tokens", "not set");
  if (!d.tiktoken_pattern.empty())
    w.string("tiktoken_pattern", d.tiktoken_pattern);
  else
    w.unset("tiktoken_pattern", "not set");
  w.integer("tiktoken_num_special_tokens", d.tiktoken_num_special_tokens);
  if (!d.tiktoken_special_tokens.empty())
    w.strings("tiktoken_special_tokens", d.tiktoken_special_tokens);
  else
    w.unset("tiktoken_special_tokens", "not set");
  w.boolean("tokenizer_sentencepiece_legacy", d.tokenizer_sentencepiece_legacy);
  w.boolean("tokenizer_hf_include_special_tokens", d.tokenizer_hf_include_special_tokens);
  w.boolean("legacy_tokenizer", d.legacy_tokenizer);
  w.boolean("mock_data", d.mock_data);

  const ClusterConfig &c = spec.cluster;
  w.section("cluster");
  bool preset = false;
  for (const DevicePreset &dp : devicePresets())
    preset |= c.device == dp.name && c.device_memory_bytes == dp.bytes;
  if (preset)
    w.string("device_memory", c.device);
  else
    w.real("device_memory", static_cast<double>(c.device_memory_bytes) / (1LL << 30));
  w.integer("gpus_per_node", c.gpus_per_node);
  w.integer("nodes", c.nodes);
  return os.str();
}

} // namespace mt::spec
