// The validated run description: what `spec.toml` says, with Megatron-LM's defaults
// filled in and every cross-key rule checked. Plain C++; no MLIR, no TOML types.
#ifndef MT_SPEC_SPEC_H
#define MT_SPEC_SPEC_H

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace mt::spec {

enum class PositionEmbedding { LearnedAbsolute, Rope };
enum class Normalization { LayerNorm, RMSNorm };
enum class Precision { FP32, FP16, BF16 };
enum class LrDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
// WSD's anneal (Megatron's --lr-wsd-decay-style).
enum class WsdDecayStyle { Exponential, Linear, Cosine, MinusSqrt };
enum class RecomputeGranularity { None, Selective, Full };
enum class RecomputeMethod { None, Uniform, Block };
// Megatron's --optimizer: Adam (AdamW: decoupled weight decay) or SGD with
// momentum (torch.optim.SGD: weight decay added to the gradient).
enum class Optimizer { Adam, SGD };
// Mixture of experts (Megatron-Core's MoE layer; docs/spec.md).
enum class MoeLoadBalancing { AuxLoss, SeqAuxLoss, None };
enum class MoeScoreFunction { Softmax, Sigmoid };
enum class MoeTokenDropPolicy { Probs, Position };
enum class MoeRouterDtype { None, FP32, FP64 }; // None: the model's precision
enum class MoeTokenDispatcher { AllGather, AllToAll };

const char *toString(PositionEmbedding v);
const char *toString(Normalization v);
const char *toString(Precision v);
const char *toString(LrDecayStyle v);
const char *toString(WsdDecayStyle v);
const char *toString(RecomputeGranularity v);
const char *toString(RecomputeMethod v);
const char *toString(Optimizer v);
const char *toString(MoeLoadBalancing v);
const char *toString(MoeScoreFunction v);
const char *toString(MoeTokenDropPolicy v);
const char *toString(MoeRouterDtype v);
const char *toString(MoeTokenDispatcher v);

// [model]: the network. Names mirror Megatron-LM's flags.
struct ModelConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;       // default 4h, or Megatron's SwiGLU rule
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;      // default num_attention_heads (no GQA)
  int64_t kv_channels = 0;           // default hidden_size / num_attention_heads
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0; // default seq_length
  int64_t vocab_size = 0;            // tokenizer vocabulary, before padding
  int64_t make_vocab_size_divisible_by = 128;
  PositionEmbedding position_embedding_type = PositionEmbedding::LearnedAbsolute;
  int64_t rotary_base = 10000;
  bool use_rope_scaling = false;     // Llama 3.1's frequency scaling (rope only)
  double rope_scaling_factor = 8.0;  // only with use_rope_scaling
  Normalization normalization = Normalization::LayerNorm;
  double norm_epsilon = 1e-5;
  bool apply_layernorm_1p = false;   // norm weights stored as w, applied as 1 + w
  bool swiglu = false;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double init_method_std = 0.02;

  // Mixture of experts: Megatron's --num-experts and --moe-* flags. The
  // layers moe_layers marks replace their MLP by a router and num_experts
  // experts, each token going to moe_router_topk of them.
  int64_t num_experts = 0;                      // 0: dense model
  int64_t moe_ffn_hidden_size = 0;              // resolved: ffn_hidden_size when not given
  int64_t moe_router_topk = 2;
  MoeLoadBalancing moe_router_load_balancing_type = MoeLoadBalancing::AuxLoss;
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;                // 0: off (Megatron: None)
  MoeScoreFunction moe_router_score_function = MoeScoreFunction::Softmax;
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = 0.0;  // 0: none
  double moe_expert_capacity_factor = 0.0;      // 0: no capacity, no token dropped
  bool moe_pad_expert_input_to_capacity = false;
  MoeTokenDropPolicy moe_token_drop_policy = MoeTokenDropPolicy::Probs;
  // Resolved moe_layer_freq: num_layers entries, true = MoE layer; empty
  // when num_experts == 0.
  std::vector<bool> moe_layers;
  int64_t moe_shared_expert_intermediate_size = 0; // 0: no shared expert
  bool moe_grouped_gemm = false;
  MoeRouterDtype moe_router_dtype = MoeRouterDtype::None;

  bool isMoeLayer(int64_t layer) const {
    return num_experts > 0 && layer >= 0 && size_t(layer) < moe_layers.size() &&
           moe_layers[size_t(layer)];
  }
  int64_t numMoeLayers() const;
};

// [parallel]: how the model is split over GPUs.
struct ParallelConfig {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t data_parallel_size = 1;
  int64_t virtual_pipeline_model_parallel_size = 1; // 1 = not interleaved
  int64_t decoder_first_pipeline_num_layers = 0;    // 0 = an even share
  int64_t decoder_last_pipeline_num_layers = 0;     // 0 = an even share
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  int64_t ddp_bucket_size = 0; // 0: not set (Megatron's max(40M, 1M * dp) with overlap)
  RecomputeGranularity recompute_granularity = RecomputeGranularity::None;
  RecomputeMethod recompute_method = RecomputeMethod::None;
  int64_t recompute_num_layers = 0;
  // Expert parallelism (only with num_experts > 0).
  int64_t expert_model_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 0; // resolved: tensor_model_parallel_size
  MoeTokenDispatcher moe_token_dispatcher_type = MoeTokenDispatcher::AllGather;
  // mt's own (no Megatron flag): the expert exchange's receive rows bounded
  // at this factor x the balanced load; 0: not set (the worst case).
  double moe_dispatch_buffer_factor = 0.0;
};

// [training]: batch, optimizer, schedule, precision, logging, checkpoints.
struct TrainingConfig {
  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;     // default micro_batch_size * data_parallel_size
  int64_t train_iters = 0;           // derived from train_samples in sample-based training
  // Sample-based training (train_samples > 0): the schedule counts samples,
  // as Megatron's scheduler always does.
  int64_t train_samples = 0;         // 0: iteration-based
  int64_t lr_decay_samples = 0;      // default train_samples
  int64_t lr_warmup_samples = 0;     // lr_warmup_fraction, when given, is resolved into this
  int64_t lr_wsd_decay_samples = 0;  // WSD's anneal, in samples
  // --rampup-batch-size: [start, increment, samples]; empty when off.
  std::vector<int64_t> rampup_batch_size;
  bool sampleBased() const { return train_samples > 0; }
  double lr = 0.0;
  double min_lr = 0.0;
  double decoupled_lr = 0.0;         // 0: not set (the embedding and output layer use lr)
  double decoupled_min_lr = -1.0;    // < 0: not set (min_lr)
  LrDecayStyle lr_decay_style = LrDecayStyle::Linear;
  int64_t lr_decay_iters = 0;        // default train_iters
  int64_t lr_warmup_iters = 0;       // lr_warmup_fraction, when given, is resolved into this
  WsdDecayStyle lr_wsd_decay_style = WsdDecayStyle::Exponential;
  int64_t lr_wsd_decay_iters = 0;    // WSD: the anneal's length, ending at lr_decay_iters
  Optimizer optimizer = Optimizer::Adam;
  double weight_decay = 0.01;
  double sgd_momentum = 0.9;         // only with optimizer = sgd
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;
  // Megatron's --calculate-per-token-loss: the loss over the tokens of the
  // whole global batch instead of each micro-batch's mean. mt has no loss
  // mask, so every micro-batch holds the same tokens and the two agree.
  bool calculate_per_token_loss = false;
  Precision precision = Precision::FP32;
  // Megatron's --grad-reduce-in-bf16: bf16 models keep their gradient
  // buffers in bf16 (accumulated over micro-batches and reduced over data
  // parallelism in bf16) instead of fp32; the optimizer widens them to fp32.
  bool grad_reduce_in_bf16 = false;
  double initial_loss_scale = 4294967296.0; // 2^32
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  int64_t seed = 1234;
  int64_t log_interval = 100;
  // The training log's extras, as Megatron-LM's logging flags.
  bool log_throughput = false;
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  int64_t timing_log_level = 0;              // 0, 1 or 2
  std::string timing_log_option = "minmax";  // "max" | "minmax" | "all"
  bool log_memory_to_tensorboard = false;
  std::string power_log;              // mtrun --power-log's CSV; "" = none
  int64_t power_log_interval_ms = 100; // NVML sampling period
  // Stop on NaN/Inf in the loss or the gradients. Resolved: off with fp16,
  // whose dynamic loss scaling skips such steps (Megatron turns it off too).
  bool check_for_nan_in_loss_and_grad = true;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  int64_t save_interval = 0;         // 0 = only at the end (when `save` is set)
  std::string save;
  std::string load;
  // What a load takes and a save writes, as Megatron's --ckpt-step,
  // --finetune, --no-load-optim, --no-load-rng, --no-save-optim and
  // --no-save-rng (mtrun's flags of those names override them).
  int64_t ckpt_step = -1; // -1: the tracker's iteration
  bool finetune = false;
  bool load_optim = true;
  bool load_rng = true;
  bool save_optim = true;
  bool save_rng = true;
};

// [data]: where tokens come from.
struct DataConfig {
  // A blend: (weight, prefix). A single prefix has weight 1.
  std::vector<std::pair<double, std::string>> data_path;
  std::string split = "969,30,1";
  // The tokenizer, as Megatron's flags name it (--tokenizer-type and its
  // files). When mtc can read it, model.vocab_size and eod_id follow it.
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string vocab_file;
  std::string merge_file;
  std::string tokenizer_model;
  std::vector<std::string> tokenizer_special_tokens;
  std::string tiktoken_pattern;
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> tiktoken_special_tokens;
  bool tokenizer_sentencepiece_legacy = false;
  bool tokenizer_hf_include_special_tokens = true;
  bool legacy_tokenizer = false;
  bool mock_data = false;
  // Resolved, not keys: the tokenizer's end-of-document id (Megatron's
  // tokenizer.eod, which mock data ends its documents with), and the
  // tokenizer's one-line description ("" when mtc did not read it; eod_id is
  // then vocab_size - 1, GPT-2's and NullTokenizer's rule).
  int64_t eod_id = -1;
  std::string tokenizer;
  std::string tokenizer_unread; // why mtc did not read the tokenizer it names
};

// [cluster]: what the job runs on.
struct ClusterConfig {
  std::string device = "H100-80GB"; // preset name, or "custom" when given in GiB
  int64_t device_memory_bytes = 0;
  int64_t gpus_per_node = 0;        // default: enough for the world size
  int64_t nodes = 1;
};

struct Spec {
  std::string source;               // file the spec came from
  ModelConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  DataConfig data;
  ClusterConfig cluster;

  // Megatron's rule: ceil(V / (divisible_by * tp)) * divisible_by * tp.
  int64_t paddedVocabSize() const;
  // Floating-point operations of one iteration over the global batch, as
  // Megatron-LM's num_floating_point_operations counts them (its transformer
  // branch, MoE layers with their top-k experts and shared expert;
  // bench/flops.py is the same formula for dense models): the log's
  // throughput per GPU is this over the iteration time and the world size.
  double flopsPerIteration() const;
  int64_t worldSize() const {
    return parallel.tensor_model_parallel_size *
           parallel.pipeline_model_parallel_size * parallel.data_parallel_size;
  }
  int64_t numMicroBatches() const {
    return training.global_batch_size /
           (training.micro_batch_size * parallel.data_parallel_size);
  }
};

// A `--set section.key=VALUE` override (VALUE in TOML syntax).
struct Override {
  std::string text; // as the user typed it, e.g. "model.num_layers=24"
};

// Parse and validate. On failure the status message is one line:
//   FILE:LINE:COL: error: what is wrong; what to do
absl::StatusOr<Spec> parseSpecFile(const std::string &path,
                                   const std::vector<Override> &overrides = {});
absl::StatusOr<Spec> parseSpecString(const std::string &text,
                                     const std::string &sourceName,
                                     const std::vector<Override> &overrides = {});

// Renders a validated spec back to TOML with every key explicit (the echo
// stored in plans and checkpoints; parsing it gives the same Spec).
std::string toToml(const Spec &spec);

// Analytic parameter count, independent of the IR (Megatron's GPT layout).
// With experts, the layers model.moe_layers marks hold a router, the routed
// experts and the shared expert instead of the dense MLP.
struct ParamCount {
  int64_t word_embeddings = 0;
  int64_t position_embeddings = 0;
  int64_t per_layer_attention = 0;  // QKV + projection, with biases
  int64_t per_layer_mlp = 0;        // a dense layer's FC1 (+gate) + FC2, with biases
  int64_t per_layer_norms = 0;      // both norms of one layer
  int64_t final_norm = 0;
  int64_t output_layer = 0;         // 0 when tied
  // Mixture of experts (0 for a dense model).
  int64_t moe_layers = 0;              // layers whose MLP is an MoE block
  int64_t per_moe_layer_router = 0;    // [num_experts, hidden]
  int64_t per_moe_layer_experts = 0;   // all num_experts routed experts
  int64_t per_moe_layer_active_experts = 0; // the moe_router_topk a token uses
  int64_t per_moe_layer_shared = 0;    // the shared expert
  // A dense layer.
  int64_t perLayer() const { return per_layer_attention + per_layer_mlp + per_layer_norms; }
  // Every parameter, for a model of numLayers layers of which moe_layers
  // are MoE layers.
  int64_t total(int64_t numLayers) const {
    return outside(numLayers) +
           moe_layers * (per_moe_layer_router + per_moe_layer_experts + per_moe_layer_shared);
  }
  // The parameters one token uses: each MoE layer's router, shared expert
  // and topk routed experts (Megatron's and Mixtral's "active" count).
  int64_t active(int64_t numLayers) const {
    return outside(numLayers) + moe_layers * (per_moe_layer_router +
                                              per_moe_layer_active_experts +
                                              per_moe_layer_shared);
  }

private:
  int64_t outside(int64_t numLayers) const {
    return word_embeddings + position_embeddings +
           numLayers * (per_layer_attention + per_layer_norms) +
           (numLayers - moe_layers) * per_layer_mlp + final_norm + output_layer;
  }
};
ParamCount countParameters(const ModelConfig &model, int64_t paddedVocab);

// Named device-memory presets, bytes as the driver reports total memory.
struct DevicePreset {
  const char *name;
  int64_t bytes;
};
const std::vector<DevicePreset> &devicePresets();

} // namespace mt::spec

#endif // MT_SPEC_SPEC_H
