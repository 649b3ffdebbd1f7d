// The spec key table, did-you-mean and the markdown key reference built from it.
#include "spec/SpecKeys.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace mt::spec {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Range {
  double min = -kInf;
  double max = kInf;
  bool minExclusive = false;
  bool maxExclusive = false;
};

Range none() { return {}; }
Range atLeast(double v) { return {v, kInf, false, false}; }
Range above(double v) { return {v, kInf, true, false}; }
// [0, 1): probabilities that must leave something (dropout) or decay (betas).
Range unitOpen() { return {0, 1, false, true}; }
Range unitClosed() { return {0, 1, false, false}; }

KeyInfo key(const char *section, const char *name, KeyType type, bool required,
            const char *defaultText, const char *unit, const char *flag, const char *doc,
            Range range = none(), std::vector<std::string> choices = {}) {
  KeyInfo k{};
  k.section = section;
  k.name = name;
  k.type = type;
  k.required = required;
  k.defaultText = defaultText;
  k.unit = unit;
  k.megatronFlag = flag;
  k.doc = doc;
  k.choices = std::move(choices);
  k.min = range.min;
  k.max = range.max;
  k.minExclusive = range.minExclusive;
  k.maxExclusive = range.maxExclusive;
  return k;
}

std::vector<KeyInfo> buildTable() {
  const KeyType I = KeyType::Int, F = KeyType::Float, B = KeyType::Bool, S = KeyType::String,
                E = KeyType::Enum;
  std::vector<KeyInfo> t;
  // [model]
  t.push_back(key("model", "num_layers", I, true, "", "layers", "--num-layers",
                  "Number of transformer layers.", {1, 10000, false, false}));
  t.push_back(key("model", "hidden_size", I, true, "", "", "--hidden-size",
                  "Width of the residual stream.", atLeast(1)));
  t.push_back(key("model", "ffn_hidden_size", I, false,
                  "4 * hidden_size; with swiglu int((4 * hidden_size * 2 / 3) / 64) * 64", "",
                  "--ffn-hidden-size", "Inner width of the MLP (per branch with swiglu).",
                  atLeast(1)));
  t.push_back(key("model", "num_attention_heads", I, true, "", "heads", "--num-attention-heads",
                  "Number of query heads.", atLeast(1)));
  t.push_back(key("model", "num_query_groups", I, false, "num_attention_heads", "groups",
                  "--num-query-groups",
                  "Key/value heads for grouped-query attention; Megatron also needs "
                  "--group-query-attention. Equal to num_attention_heads means plain "
                  "multi-head attention.",
                  atLeast(1)));
  t.push_back(key("model", "kv_channels", I, false, "hidden_size / num_attention_heads", "",
                  "--kv-channels",
                  "Width of one attention head. When given, hidden_size need not be "
                  "divisible by num_attention_heads.",
                  atLeast(1)));
  t.push_back(key("model", "seq_length", I, true, "", "tokens", "--seq-length",
                  "Tokens per training sample.", atLeast(1)));
  t.push_back(key("model", "max_position_embeddings", I, false, "seq_length", "tokens",
                  "--max-position-embeddings",
                  "Rows of the learned position table; must be >= seq_length with "
                  "learned_absolute positions.",
                  atLeast(1)));
  t.push_back(key("model", "vocab_size", I, false, "the tokenizer's", "tokens", "--vocab-size",
                  "The tokenizer's vocabulary, unpadded (50257 for GPT-2). Required unless "
                  "mtc reads the tokenizer named in [data], which then decides it; "
                  "NullTokenizer's is this key.",
                  atLeast(1)));
  t.push_back(key("model", "make_vocab_size_divisible_by", I, false, "128", "",
                  "--make-vocab-size-divisible-by",
                  "The embedding is padded to a multiple of this times "
                  "tensor_model_parallel_size; 1 keeps vocab_size (with tp 1).",
                  atLeast(1)));
  t.push_back(key("model", "position_embedding_type", E, false, "\"learned_absolute\"", "",
                  "--position-embedding-type", "Position encoding.", none(),
                  {"learned_absolute", "rope"}));
  t.push_back(key("model", "rotary_base", I, false, "10000", "", "--rotary-base",
                  "RoPE base period; only with position_embedding_type = \"rope\".", atLeast(1)));
  t.push_back(key("model", "use_rope_scaling", B, false, "false", "", "--use-rope-scaling",
                  "Llama 3.1's RoPE frequency scaling (Megatron's apply_rope_scaling): "
                  "frequencies whose wavelength exceeds 8192 positions are divided by "
                  "rope_scaling_factor, those below 8192 / 4 are kept, and the ones between "
                  "are interpolated smoothly. Only with position_embedding_type = \"rope\"."));
  t.push_back(key("model", "rope_scaling_factor", F, false, "8.0", "", "--rope-scaling-factor",
                  "Divisor of the low RoPE frequencies (8 for Llama 3.1, 32 for Llama 3.2); "
                  "only with use_rope_scaling = true.",
                  atLeast(1)));
  t.push_back(key("model", "normalization", E, false, "\"LayerNorm\"", "", "--normalization",
                  "Normalization layer.", none(), {"LayerNorm", "RMSNorm"}));
  t.push_back(key("model", "norm_epsilon", F, false, "1e-5", "", "--norm-epsilon",
                  "Epsilon of the normalization layers.", above(0)));
  t.push_back(key("model", "apply_layernorm_1p", B, false, "false", "", "--apply-layernorm-1p",
                  "Zero-centred norm weights (Megatron's layernorm_zero_centered_gamma): each "
                  "LayerNorm or RMSNorm weight w is initialised to 0 and applied as 1 + w. "
                  "Norm weights get no weight decay either way."));
  t.push_back(key("model", "swiglu", B, false, "false", "", "--swiglu",
                  "SwiGLU MLP (gated SiLU) instead of GELU."));
  t.push_back(key("model", "untie_embeddings_and_output_weights", B, false, "false", "",
                  "--untie-embeddings-and-output-weights",
                  "Give the output layer its own weights instead of reusing the word "
                  "embeddings."));
  t.push_back(key("model", "add_bias_linear", B, false, "true", "", "--disable-bias-linear",
                  "Biases in the linear layers. Megatron's --disable-bias-linear sets "
                  "this to false."));
  t.push_back(key("model", "hidden_dropout", F, false, "0.1", "probability", "--hidden-dropout",
                  "Dropout after the attention and MLP blocks.", unitOpen()));
  t.push_back(key("model", "attention_dropout", F, false, "0.1", "probability",
                  "--attention-dropout",
                  "Dropout on the attention probabilities, drawn at 16-bit resolution "
                  "(the rate rounds up to a multiple of 2^-16: 0.1 drops 0.1000061).",
                  unitOpen()));
  t.push_back(key("model", "init_method_std", F, false, "0.02", "", "--init-method-std",
                  "Standard deviation of the normal weight init (output projections are "
                  "scaled by 1 / sqrt(2 * num_layers)).",
                  above(0)));
  // Mixture of experts: megatron/training/arguments.py (_add_moe_args) and
  // TransformerConfig's moe_* fields, whose flags Megatron generates.
  t.push_back(key("model", "num_experts", I, false, "0 (dense)", "experts", "--num-experts",
                  "Experts of each MoE layer; 0 is a dense model (Megatron's None). Each MoE "
                  "layer's MLP becomes a router (a [num_experts, hidden_size] weight, no bias) "
                  "and num_experts MLPs of moe_ffn_hidden_size; each token goes to "
                  "moe_router_topk of them. Needs add_bias_linear = false. The [model] moe_* "
                  "keys and the [parallel] expert keys only apply with num_experts > 0.",
                  atLeast(0)));
  t.push_back(key("model", "moe_ffn_hidden_size", I, false, "ffn_hidden_size", "",
                  "--moe-ffn-hidden-size",
                  "Inner width of each expert's MLP (per branch with swiglu).", atLeast(1)));
  t.push_back(key("model", "moe_router_topk", I, false, "2", "experts", "--moe-router-topk",
                  "Experts each token is routed to; at most num_experts. With 1 and the "
                  "softmax score function, moe_router_pre_softmax must be true (Megatron "
                  "refuses a softmax over one score, whose gradient is zero).",
                  atLeast(1)));
  t.push_back(key("model", "moe_router_load_balancing_type", E, false, "\"aux_loss\"", "",
                  "--moe-router-load-balancing-type",
                  "The router's load-balancing loss: \"aux_loss\" (GShard / Switch "
                  "Transformer, over the micro-batch's tokens), \"seq_aux_loss\" (DeepSeek-V2, "
                  "per sequence) or \"none\". Its weight is moe_aux_loss_coeff.",
                  none(), {"aux_loss", "seq_aux_loss", "none"}));
  t.push_back(key("model", "moe_aux_loss_coeff", F, false, "0.0", "", "--moe-aux-loss-coeff",
                  "Weight of the load-balancing loss in the training loss (1e-2 is "
                  "Megatron's suggested start); 0, as in Megatron, neither computes nor logs it "
                  "(TensorBoard's load_balancing_loss stays 0).",
                  atLeast(0)));
  t.push_back(key("model", "moe_z_loss_coeff", F, false, "not set (no z-loss)", "",
                  "--moe-z-loss-coeff",
                  "Weight of the router z-loss (ST-MoE: the mean squared logsumexp of the "
                  "router logits), logged as z_loss; 1e-3 is Megatron's suggested start.",
                  atLeast(0)));
  t.push_back(key("model", "moe_router_score_function", E, false, "\"softmax\"", "",
                  "--moe-router-score-function",
                  "Routing scores: \"softmax\" over the chosen experts' logits (over all "
                  "experts with moe_router_pre_softmax), or \"sigmoid\" of each logit, "
                  "normalized over the chosen experts when moe_router_topk > 1.",
                  none(), {"softmax", "sigmoid"}));
  t.push_back(key("model", "moe_router_pre_softmax", B, false, "false", "",
                  "--moe-router-pre-softmax",
                  "With the softmax score function, take the softmax over all experts before "
                  "choosing the top k (the chosen probabilities then sum to at most 1). Only "
                  "with moe_router_score_function = \"softmax\"."));
  t.push_back(key("model", "moe_router_topk_scaling_factor", F, false, "not set (1)", "",
                  "--moe-router-topk-scaling-factor",
                  "Multiplies the chosen experts' routing weights.", above(0)));
  t.push_back(key("model", "moe_expert_capacity_factor", F, false, "not set (no dropping)", "",
                  "--moe-expert-capacity-factor",
                  "Expert capacity: each expert takes at most ceil(tokens * moe_router_topk / "
                  "num_experts * factor) tokens of a micro-batch and the rest are dropped as "
                  "moe_token_drop_policy says. Unset, no token is dropped.",
                  above(0)));
  t.push_back(key("model", "moe_pad_expert_input_to_capacity", B, false, "false", "",
                  "--moe-pad-expert-input-to-capacity",
                  "Pad each expert's tokens to its full capacity, so that every expert "
                  "computes the same number of rows. Needs moe_expert_capacity_factor."));
  t.push_back(key("model", "moe_token_drop_policy", E, false, "\"probs\"", "",
                  "--moe-token-drop-policy",
                  "Which tokens an expert over capacity drops: those of the lowest routing "
                  "probability (\"probs\") or the last in the micro-batch (\"position\"). "
                  "Only with moe_expert_capacity_factor.",
                  none(), {"probs", "position"}));
  t.push_back(key("model", "moe_layer_freq", KeyType::LayerPattern, false, "1 (every layer)",
                  "", "--moe-layer-freq",
                  "Which layers are MoE layers, in each of Megatron's forms: an integer N "
                  "(layers 0, N, 2N, ... are MoE layers), a Python list expression string of "
                  "0s and 1s such as \"([1]*3+[0]*1)*3\" or \"[0]+[1]*23\", or an array of "
                  "0/1 (1: MoE layer). A list has one entry per layer (num_layers).",
                  atLeast(1)));
  t.push_back(key("model", "moe_shared_expert_intermediate_size", I, false, "not set (none)", "",
                  "--moe-shared-expert-intermediate-size",
                  "Inner width of the shared expert, an MLP every token goes through beside "
                  "the routed experts (several shared experts: the sum of their widths); its "
                  "output is added to theirs.",
                  atLeast(1)));
  t.push_back(key("model", "moe_grouped_gemm", B, false, "false", "", "--moe-grouped-gemm",
                  "Megatron's grouped GEMM for the local experts. mt always computes the "
                  "experts with grouped GEMMs, so this gives the same numbers either way; "
                  "accepted for Megatron's command lines."));
  t.push_back(key("model", "moe_router_dtype", E, false, "not set (the model's precision)", "",
                  "--moe-router-dtype",
                  "Precision of the routing, as Megatron's router_gating_linear: the router "
                  "GEMM's logits are the fp32 or fp64 product of the model's input and weight "
                  "(not rounded to the model's precision), its backward GEMMs read their fp32 "
                  "or fp64 gradient and round their results once, and scores, top-k, capacity "
                  "ranking and routing weights are computed in that type from the logits "
                  "(cuBLASLt's f64 GEMMs on the GPU). The routing weights reach the experts' "
                  "combine as fp32 in both (Megatron keeps fp64's in fp64 there, a difference "
                  "below the fp32 outputs' rounding). Not set: the logits and each routing "
                  "step are rounded to the model's precision, as Megatron does. The weighted "
                  "sum of the experts' outputs accumulates in fp32 in every setting.",
                  none(), {"fp32", "fp64"}));

  // [parallel]
  t.push_back(key("parallel", "tensor_model_parallel_size", I, false, "1", "GPUs",
                  "--tensor-model-parallel-size",
                  "Tensor parallelism (tp): each layer's matrices are split over tp GPUs.",
                  atLeast(1)));
  t.push_back(key("parallel", "pipeline_model_parallel_size", I, false, "1", "GPUs",
                  "--pipeline-model-parallel-size",
                  "Pipeline parallelism (pp): the layers are split into pp stages.", atLeast(1)));
  t.push_back(key("parallel", "data_parallel_size", I, false, "1", "GPUs", "",
                  "Data parallelism (dp). Megatron derives it from the world size "
                  "(world / (tp * pp)); here it is explicit and the world size is "
                  "tp * pp * dp.",
                  atLeast(1)));
  t.push_back(key("parallel", "virtual_pipeline_model_parallel_size", I, false, "1", "stages",
                  "--num-virtual-stages-per-pipeline-rank",
                  "Model chunks per pipeline rank (vp) for the interleaved schedule; 1 = "
                  "not interleaved. Megatron's --num-layers-per-virtual-pipeline-stage L "
                  "means vp = num_layers / (pp * L).",
                  atLeast(1)));
  t.push_back(key("parallel", "decoder_first_pipeline_num_layers", I, false, "not set", "layers",
                  "--decoder-first-pipeline-num-layers",
                  "Transformer layers on the first pipeline stage; the stages without a "
                  "count of their own share the rest evenly. Needs "
                  "pipeline_model_parallel_size >= 2 and no virtual pipeline.",
                  atLeast(1)));
  t.push_back(key("parallel", "decoder_last_pipeline_num_layers", I, false, "not set", "layers",
                  "--decoder-last-pipeline-num-layers",
                  "Transformer layers on the last pipeline stage; the stages without a "
                  "count of their own share the rest evenly. Needs "
                  "pipeline_model_parallel_size >= 2 and no virtual pipeline.",
                  atLeast(1)));
  t.push_back(key("parallel", "sequence_parallel", B, false, "false", "", "--sequence-parallel",
                  "Split norms and dropout along the sequence over the tp group; needs "
                  "tensor_model_parallel_size > 1."));
  t.push_back(key("parallel", "use_distributed_optimizer", B, false, "false", "",
                  "--use-distributed-optimizer",
                  "Shard optimizer state over the data-parallel group (ZeRO-1). Allowed "
                  "with dp = 1, where it changes nothing."));
  t.push_back(key("parallel", "overlap_grad_reduce", B, false, "false", "",
                  "--overlap-grad-reduce",
                  "Reduce each gradient bucket as soon as the last micro-batch's backward "
                  "has produced it, overlapping the rest of the backward; otherwise all "
                  "gradients are reduced in one bucket after the backward."));
  t.push_back(key("parallel", "overlap_param_gather", B, false, "false", "",
                  "--overlap-param-gather",
                  "Gather the distributed optimizer's updated weights during the next "
                  "iteration's first forward, each bucket before its first use, instead of "
                  "at the end of the optimizer step; needs use_distributed_optimizer and "
                  "overlap_grad_reduce."));
  t.push_back(key("parallel", "ddp_bucket_size", I, false, "max(40000000, 1000000 * dp)",
                  "elements", "--ddp-bucket-size",
                  "Gradient elements per data-parallel reduction bucket (buckets are "
                  "filled in reverse parameter order); needs overlap_grad_reduce = true.",
                  atLeast(1)));
  t.push_back(key("parallel", "recompute_granularity", E, false, "not set", "",
                  "--recompute-granularity",
                  "Activation recomputation: \"selective\" recomputes the attention core, "
                  "\"full\" whole layers (then recompute_method and recompute_num_layers "
                  "are required).",
                  none(), {"full", "selective"}));
  t.push_back(key("parallel", "recompute_method", E, false, "not set", "", "--recompute-method",
                  "With full recomputation: \"uniform\" checkpoints groups of "
                  "recompute_num_layers layers, \"block\" recomputes the first "
                  "recompute_num_layers layers of each model chunk.",
                  none(), {"uniform", "block"}));
  t.push_back(key("parallel", "recompute_num_layers", I, false, "not set", "layers",
                  "--recompute-num-layers",
                  "Counted per model chunk (num_layers / (pp * vp) layers). uniform: "
                  "group size, must divide the chunk; block: layers recomputed, at most "
                  "the chunk.",
                  atLeast(1)));
  t.push_back(key("parallel", "expert_model_parallel_size", I, false, "1", "GPUs",
                  "--expert-model-parallel-size",
                  "Expert parallelism (ep): each MoE layer's experts are split over ep GPUs "
                  "of each pipeline stage's tensor x data-parallel GPUs (num_experts / ep "
                  "each); num_experts must be a multiple of it. Tokens reach their experts' "
                  "GPUs by moe_token_dispatcher_type.",
                  atLeast(1)));
  t.push_back(key("parallel", "expert_tensor_parallel_size", I, false,
                  "tensor_model_parallel_size", "GPUs", "--expert-tensor-parallel-size",
                  "Tensor parallelism inside each expert: each expert's first matmul is split "
                  "column-wise and its second row-wise over this many GPUs (Megatron's "
                  "default: the tensor-parallel size). expert_model_parallel_size times it "
                  "must divide each stage's tensor x data-parallel GPUs, and it must divide "
                  "moe_ffn_hidden_size; 1 keeps every expert whole.",
                  atLeast(1)));
  t.push_back(key("parallel", "moe_token_dispatcher_type", E, false, "\"allgather\"", "",
                  "--moe-token-dispatcher-type",
                  "How tokens reach the ranks that hold their experts: all-gather or "
                  "all-to-all over the expert-parallel group. Both compute the same numbers "
                  "and differ in what they send (and so in buffers and the summary's "
                  "all-to-all volume); Megatron's \"flex\" (DeepEP, HybridEP) is not "
                  "implemented.",
                  none(), {"allgather", "alltoall"}));
  t.push_back(key("parallel", "moe_dispatch_buffer_factor", F, false,
                  "not set (the worst case)", "", "",
                  "mt's own key (Megatron has no such flag: its dropless dispatcher allocates "
                  "what each step's routing needs). Without a capacity, mt plans the rows each "
                  "rank receives from the token exchange for the worst case, every token of "
                  "every expert-parallel peer routed to its experts: expert_model_parallel_size "
                  "x micro-batch tokens x min(moe_router_topk, num_experts / "
                  "expert_model_parallel_size) rows a layer. This key bounds them at factor x "
                  "the balanced load, never above the worst case: the rows a rank receives "
                  "when the router spreads the tokens evenly over the experts, its micro-batch "
                  "tokens (its sequence shard with sequence_parallel) x moe_router_topk x "
                  "expert_tensor_parallel_size. "
                  "A step whose routing needs more rows stops every rank with an error naming "
                  "the layer and this key; no token is ever dropped. Needs an expert exchange "
                  "(expert_model_parallel_size > 1) and no moe_expert_capacity_factor (the "
                  "capacity sizes the rows then).",
                  atLeast(1)));

  // [training]
  t.push_back(key("training", "micro_batch_size", I, true, "", "samples", "--micro-batch-size",
                  "Samples per GPU per forward/backward pass.", atLeast(1)));
  t.push_back(key("training", "global_batch_size", I, false,
                  "micro_batch_size * data_parallel_size", "samples", "--global-batch-size",
                  "Samples per optimizer step; a multiple of micro_batch_size * "
                  "data_parallel_size (the quotient is the number of micro-batches).",
                  atLeast(1)));
  t.push_back(key("training", "train_iters", I, false, "from train_samples", "iterations",
                  "--train-iters",
                  "Optimizer steps to train. Give this (iteration-based training) or "
                  "train_samples (sample-based), not both.",
                  atLeast(1)));
  t.push_back(key("training", "train_samples", I, false, "not set", "samples",
                  "--train-samples",
                  "Samples to train (sample-based training): the iterations are "
                  "train_samples / global_batch_size, or as many as the batch ramp-up's "
                  "batches take (a partial last batch is dropped), and the learning-rate "
                  "schedule counts samples (lr_decay_samples, lr_warmup_samples, "
                  "lr_wsd_decay_samples instead of their _iters forms).",
                  atLeast(1)));
  {
    KeyInfo k = key("training", "rampup_batch_size", KeyType::IntList, false, "not set",
                    "samples", "--rampup-batch-size",
                    "Batch-size ramp-up [start, increment, ramp-up samples]: the global "
                    "batch starts at start and grows by increment in (global_batch_size - "
                    "start) / increment equal shares of the ramp-up samples, reaching "
                    "global_batch_size after them. Needs train_samples; every batch the run "
                    "reaches must be a multiple of micro_batch_size * data_parallel_size "
                    "(with the interleaved schedule, * pipeline_model_parallel_size).",
                    atLeast(1));
    k.listLength = 3;
    t.push_back(std::move(k));
  }
  t.push_back(key("training", "lr", F, true, "", "", "--lr", "Peak learning rate.", above(0)));
  t.push_back(key("training", "min_lr", F, false, "0.0", "", "--min-lr",
                  "Learning rate at the end of the decay; at most lr.", atLeast(0)));
  t.push_back(key("training", "decoupled_lr", F, false, "not set", "", "--decoupled-lr",
                  "Peak learning rate of the input embedding and output layer weights "
                  "(Megatron's is_embedding_or_output_parameter: the word embeddings, and "
                  "the untied output layer), on the same warmup and decay as lr.",
                  above(0)));
  t.push_back(key("training", "decoupled_min_lr", F, false, "min_lr", "", "--decoupled-min-lr",
                  "Floor of decoupled_lr's decay; at most decoupled_lr. Only with "
                  "decoupled_lr.",
                  atLeast(0)));
  t.push_back(key("training", "lr_decay_style", E, false, "\"linear\"", "", "--lr-decay-style",
                  "Decay from lr to min_lr after the warmup. \"inverse-square-root\": lr * "
                  "sqrt(warmup / step), not below min_lr; \"WSD\" (warmup-stable-decay): lr "
                  "until lr_wsd_decay_iters before lr_decay_iters, then an anneal to min_lr.",
                  none(), {"constant", "linear", "cosine", "inverse-square-root", "WSD"}));
  t.push_back(key("training", "lr_decay_iters", I, false, "train_iters", "iterations",
                  "--lr-decay-iters", "Iterations over which the learning rate decays.",
                  atLeast(1)));
  t.push_back(key("training", "lr_decay_samples", I, false, "train_samples", "samples",
                  "--lr-decay-samples",
                  "Samples over which the learning rate decays; sample-based training "
                  "only.",
                  atLeast(1)));
  t.push_back(key("training", "lr_warmup_iters", I, false, "0", "iterations", "--lr-warmup-iters",
                  "Linear warmup from 0 to lr; below lr_decay_iters.", atLeast(0)));
  t.push_back(key("training", "lr_warmup_samples", I, false, "0", "samples",
                  "--lr-warmup-samples",
                  "Linear warmup from 0 to lr over this many samples; below "
                  "lr_decay_samples. Sample-based training only.",
                  atLeast(0)));
  t.push_back(key("training", "lr_warmup_fraction", F, false, "not set", "", "--lr-warmup-fraction",
                  "Warmup as a fraction of lr_decay_iters, resolved to "
                  "floor(fraction * lr_decay_iters) iterations (with train_samples: of "
                  "lr_decay_samples, in samples). Give this or lr_warmup_iters / "
                  "lr_warmup_samples, not both.",
                  unitClosed()));
  t.push_back(key("training", "lr_wsd_decay_style", E, false, "\"exponential\"", "",
                  "--lr-wsd-decay-style",
                  "WSD's anneal from lr to min_lr over its last lr_wsd_decay_iters "
                  "iterations: \"exponential\" (2 * 0.5^r - 1), \"linear\", \"cosine\" or "
                  "\"minus_sqrt\" (1 - sqrt(r)), r going from 0 to 1. Needs lr_decay_style = "
                  "\"WSD\".",
                  none(), {"exponential", "linear", "cosine", "minus_sqrt"}));
  t.push_back(key("training", "lr_wsd_decay_iters", I, false, "not set", "iterations",
                  "--lr-wsd-decay-iters",
                  "Length of WSD's anneal, which ends at lr_decay_iters; at most "
                  "lr_decay_iters - lr_warmup_iters. Required with lr_decay_style = \"WSD\".",
                  atLeast(1)));
  t.push_back(key("training", "lr_wsd_decay_samples", I, false, "not set", "samples",
                  "--lr-wsd-decay-samples",
                  "lr_wsd_decay_iters of sample-based training: the anneal's length in "
                  "samples, at most lr_decay_samples - lr_warmup_samples. Required with "
                  "lr_decay_style = \"WSD\" and train_samples.",
                  atLeast(1)));
  t.push_back(key("training", "optimizer", E, false, "\"adam\"", "", "--optimizer",
                  "\"adam\": AdamW (decoupled weight decay, bias-corrected moments; two "
                  "f32 state tensors per parameter). \"sgd\": SGD with momentum as "
                  "torch.optim.SGD (weight decay added to the gradient, no dampening, no "
                  "Nesterov; one f32 momentum buffer per parameter).",
                  none(), {"adam", "sgd"}));
  t.push_back(key("training", "weight_decay", F, false, "0.01", "", "--weight-decay",
                  "Weight decay: decoupled with adam, added to the gradient with sgd; "
                  "biases and one-dimensional weights get none.",
                  atLeast(0)));
  t.push_back(key("training", "sgd_momentum", F, false, "0.9", "", "--sgd-momentum",
                  "SGD's momentum factor; only with optimizer = \"sgd\".", atLeast(0)));
  t.push_back(key("training", "adam_beta1", F, false, "0.9", "", "--adam-beta1",
                  "Adam first-moment decay.", unitOpen()));
  t.push_back(key("training", "adam_beta2", F, false, "0.999", "", "--adam-beta2",
                  "Adam second-moment decay.", unitOpen()));
  t.push_back(key("training", "adam_eps", F, false, "1e-8", "", "--adam-eps",
                  "Adam denominator epsilon.", above(0)));
  t.push_back(key("training", "clip_grad", F, false, "1.0", "", "--clip-grad",
                  "Gradient clipping by global L2 norm; 0 turns it off.", atLeast(0)));
  t.push_back(key("training", "calculate_per_token_loss", B, false, "false", "",
                  "--calculate-per-token-loss",
                  "Normalize the loss by the tokens of the whole global batch (all "
                  "micro-batches and data-parallel ranks) instead of averaging each "
                  "micro-batch's mean, as Megatron's flag. mt has no loss mask (every label "
                  "counts), so each micro-batch holds micro_batch_size * seq_length tokens "
                  "and both give the same gradients and lm loss; the backward's seed is "
                  "derived from the token counts (docs/training.md)."));
  t.push_back(key("training", "precision", E, false, "\"fp32\"", "", "--fp16 / --bf16",
                  "Parameter and compute precision; Megatron's --fp16 and --bf16 flags "
                  "select the two half formats.",
                  none(), {"fp32", "fp16", "bf16"}));
  t.push_back(key("training", "grad_reduce_in_bf16", B, false, "false", "",
                  "--grad-reduce-in-bf16",
                  "Keep the gradients in bf16 instead of fp32: accumulated over micro-batches "
                  "and reduced (all-reduce or reduce-scatter) over data parallelism in bf16, "
                  "rounded to nearest even after each addition, then widened to fp32 by the "
                  "optimizer. Halves the gradient buffer (2 bytes a parameter instead of 4); "
                  "only with precision = \"bf16\", as Megatron's flag."));
  t.push_back(key("training", "initial_loss_scale", F, false, "4294967296 (2^32)", "",
                  "--initial-loss-scale",
                  "Starting dynamic loss scale; only with precision = \"fp16\".", above(0)));
  t.push_back(key("training", "min_loss_scale", F, false, "1.0", "", "--min-loss-scale",
                  "Lower bound of the dynamic loss scale; only with precision = \"fp16\".",
                  above(0)));
  t.push_back(key("training", "loss_scale_window", I, false, "1000", "iterations",
                  "--loss-scale-window",
                  "Overflow-free iterations before the loss scale grows; only with "
                  "precision = \"fp16\".",
                  atLeast(1)));
  t.push_back(key("training", "hysteresis", I, false, "2", "iterations", "--hysteresis",
                  "Overflows tolerated before the loss scale shrinks; only with "
                  "precision = \"fp16\".",
                  atLeast(1)));
  t.push_back(key("training", "seed", I, false, "1234", "", "--seed",
                  "Random seed for init, dropout and data order.", atLeast(0)));
  t.push_back(key("training", "log_interval", I, false, "100", "iterations", "--log-interval",
                  "Iterations between log lines.", atLeast(1)));
  t.push_back(key("training", "log_throughput", B, false, "false", "", "--log-throughput",
                  "Add the model's TFLOP/s per GPU (Megatron's FLOP count over the measured "
                  "iteration time) to the iteration line."));
  t.push_back(key("training", "log_params_norm", B, false, "false", "", "--log-params-norm",
                  "Add the L2 norm of all parameters (each tensor once; the fp32 masters "
                  "with bf16) to the iteration line."));
  t.push_back(key("training", "log_num_zeros_in_grad", B, false, "false", "",
                  "--log-num-zeros-in-grad",
                  "Add the number of zero gradient elements (after unscaling and clipping) "
                  "to the iteration line."));
  t.push_back(key("training", "timing_log_level", I, false, "0", "", "--timing-log-level",
                  "Timers printed after each iteration line: 0 none (the iteration time "
                  "only), 1 forward-backward and the optimizer's phases, 2 also the batch "
                  "generator.",
                  {0, 2, false, false}));
  t.push_back(key("training", "timing_log_option", E, false, "\"minmax\"", "",
                  "--timing-log-option",
                  "How timers are reduced over ranks: \"max\", \"minmax\" or \"all\" "
                  "(every rank's).",
                  none(), {"max", "minmax", "all"}));
  t.push_back(key("training", "log_memory_to_tensorboard", B, false, "false", "",
                  "--log-memory-to-tensorboard",
                  "Write the memory figures (mem-reserved-bytes, mem-allocated-bytes, "
                  "mem-max-allocated-bytes, mem-allocated-count) to TensorBoard."));
  t.push_back(key("training", "power_log", S, false, "not set", "path", "",
                  "mtrun samples each rank's GPU through NVML (power, clocks, temperature, "
                  "utilisation, memory) into this CSV, with a mark at each phase of each "
                  "iteration (mtrun --power-log; several ranks: FILE.rankN.csv, or %r in "
                  "the name)."));
  t.push_back(key("training", "power_log_interval_ms", I, false, "100", "ms", "",
                  "The power log's sampling period (mtrun --power-log-interval).",
                  {1, 60000, false, false}));
  t.push_back(key("training", "check_for_nan_in_loss_and_grad", B, false,
                  "true (false with fp16)", "", "--no-check-for-nan-in-loss-and-grad",
                  "Stop the run, without saving, when a loss or the gradients hold a NaN or "
                  "Inf. Off with fp16, whose dynamic loss scaling skips those steps; "
                  "cannot be true there."));
  t.push_back(key("training", "eval_interval", I, false, "1000", "iterations", "--eval-interval",
                  "Iterations between evaluations.", atLeast(1)));
  t.push_back(key("training", "eval_iters", I, false, "100", "iterations", "--eval-iters",
                  "Batches per evaluation; 0 skips evaluation.", atLeast(0)));
  t.push_back(key("training", "save_interval", I, false, "0", "iterations", "--save-interval",
                  "Iterations between checkpoints; 0 saves only at the end (when save is "
                  "set).",
                  atLeast(0)));
  t.push_back(key("training", "save", S, false, "not set", "path", "--save",
                  "Checkpoint directory to write."));
  t.push_back(key("training", "load", S, false, "not set", "path", "--load",
                  "Checkpoint directory to resume from."));
  t.push_back(key("training", "ckpt_step", I, false, "not set", "iterations", "--ckpt-step",
                  "Load this iteration of load instead of the latest its tracker names "
                  "(mtrun --ckpt-step overrides it).",
                  atLeast(0)));
  t.push_back(key("training", "finetune", B, false, "false", "", "--finetune",
                  "Load only the weights of load: train from iteration 0 and the first "
                  "sample, with a fresh optimizer, learning-rate schedule, loss scale and "
                  "random state (mtrun --finetune)."));
  t.push_back(key("training", "load_optim", B, false, "true", "", "--no-load-optim",
                  "Resume the optimizer state (master weights, moments, step count), the "
                  "learning-rate schedule and the loss scale from load; false starts them "
                  "fresh and keeps the iteration and data position (mtrun --no-load-optim)."));
  t.push_back(key("training", "load_rng", B, false, "true", "", "--no-load-rng",
                  "Resume the random state (dropout's seed and draws) from load; false draws "
                  "afresh from seed (mtrun --no-load-rng)."));
  t.push_back(key("training", "save_optim", B, false, "true", "", "--no-save-optim",
                  "Save the optimizer state in checkpoints; false saves the weights alone, "
                  "which load with load_optim = false or finetune (mtrun --no-save-optim)."));
  t.push_back(key("training", "save_rng", B, false, "true", "", "--no-save-rng",
                  "Save the random state in checkpoints; false leaves it out, and such "
                  "checkpoints load with load_rng = false or finetune (mtrun --no-save-rng)."));

  // [data]
  t.push_back(key("data", "data_path", KeyType::DataPath, false, "not set", "path", "--data-path",
                  "Dataset prefix (\"corpus_text_document\"), or a blend [w1, \"p1\", w2, "
                  "\"p2\", ...] with weights > 0 (numbers or numeric strings). May be "
                  "absent at compile time."));
  t.push_back(key("data", "split", S, false, "\"969,30,1\"", "", "--split",
                  "Train, validation and test proportions: 1 to 3 non-negative numbers "
                  "separated by \",\" (or \"/\"), not all zero."));
  t.push_back(key("data", "tokenizer_type", E, false, "\"GPT2BPETokenizer\"", "",
                  "--tokenizer-type",
                  "Megatron's tokenizer, with its files in the keys below. When mtc can "
                  "read them (NullTokenizer needs none), model.vocab_size and the "
                  "end-of-document id follow the tokenizer, as in Megatron; see "
                  "docs/data.md.",
                  none(),
                  {"GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer",
                   "GPTSentencePieceTokenizer", "Llama2Tokenizer", "TikTokenizer",
                   "NullTokenizer"}));
  t.push_back(key("data", "vocab_file", S, false, "not set", "path", "--vocab-file",
                  "GPT2BPETokenizer's vocab.json."));
  t.push_back(key("data", "merge_file", S, false, "not set", "path", "--merge-file",
                  "GPT2BPETokenizer's merges.txt."));
  t.push_back(key("data", "tokenizer_model", S, false, "not set", "path", "--tokenizer-model",
                  "The tokenizer file or directory of HuggingFaceTokenizer (tokenizer.json), "
                  "the SentencePiece types (.model) and TikTokenizer. One mtc cannot read "
                  "(a hub name) leaves model.vocab_size to the spec."));
  t.push_back(key("data", "tokenizer_special_tokens", KeyType::StringList, false, "not set", "",
                  "--tokenizer-special-tokens",
                  "Special tokens added to the tokenizer's vocabulary."));
  t.push_back(key("data", "tiktoken_pattern", E, false, "not set", "", "--tiktoken-pattern",
                  "TikTokenizer's pre-tokenisation pattern.", none(), {"v1", "v2"}));
  t.push_back(key("data", "tiktoken_num_special_tokens", I, false, "1000", "tokens",
                  "--tiktoken-num-special-tokens",
                  "Ids TikTokenizer reserves for special tokens, before the vocabulary.",
                  atLeast(0)));
  t.push_back(key("data", "tiktoken_special_tokens", KeyType::StringList, false, "not set", "",
                  "--tiktoken-special-tokens", "TikTokenizer's special tokens, in id order."));
  t.push_back(key("data", "tokenizer_sentencepiece_legacy", B, false, "false", "",
                  "--tokenizer-sentencepiece-legacy",
                  "SentencePiece's legacy handling of special tokens."));
  t.push_back(key("data", "tokenizer_hf_include_special_tokens", B, false, "true", "",
                  "--tokenizer-hf-include-special-tokens",
                  "HuggingFaceTokenizer adds its special tokens (BOS) when encoding, as "
                  "Megatron-Core 0.17 and later do by default; false is their "
                  "--tokenizer-hf-no-include-special-tokens."));
  t.push_back(key("data", "legacy_tokenizer", B, false, "false", "", "--legacy-tokenizer",
                  "The tokenizer classes of megatron/training/tokenizer (core 0.14 to "
                  "0.16) instead of megatron/core/tokenizers; for NullTokenizer, "
                  "vocab_size is then --vocab-size + 1."));
  t.push_back(key("data", "mock_data", B, false, "false", "", "--mock-data",
                  "Train on synthetic tokens; excludes data_path."));

  // [cluster]
  t.push_back(key("cluster", "device_memory", KeyType::DeviceMemory, false, "\"H100-80GB\"", "GiB",
                  "",
                  "Memory of one GPU: a preset (\"H100-80GB\", \"H200-141GB\", "
                  "\"A100-80GB\", \"A100-40GB\", \"RTX5080-16GB\") or a number of GiB.",
                  {0, 1048576, true, false}));
  t.push_back(key("cluster", "gpus_per_node", I, false, "tp * pp * dp / nodes", "GPUs", "",
                  "GPUs per node (torchrun --nproc-per-node); nodes * gpus_per_node must "
                  "equal tp * pp * dp.",
                  atLeast(1)));
  t.push_back(key("cluster", "nodes", I, false, "1", "nodes", "",
                  "Number of nodes (torchrun --nnodes).", atLeast(1)));
  return t;
}

const char *sectionDoc(const std::string &section) {
  if (section == "model")
    return "The network: a GPT decoder in Megatron-LM's layout.";
  if (section == "parallel")
    return "How the model is split over GPUs: world size = tp * pp * dp.";
  if (section == "training")
    return "Batch, optimizer, learning-rate schedule, precision, logging and checkpoints.";
  if (section == "data")
    return "Where tokens come from. No data source is needed to compile.";
  return "What the job runs on.";
}

std::string lower(const std::string &s) {
  std::string r = s;
  for (char &c : r)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const char *typeName(KeyType t) {
  switch (t) {
  case KeyType::Int:
    return "int";
  case KeyType::Float:
    return "float";
  case KeyType::Bool:
    return "bool";
  case KeyType::String:
    return "string";
  case KeyType::Enum:
    return "enum";
  case KeyType::DataPath:
    return "string or array";
  case KeyType::DeviceMemory:
    return "string or number";
  case KeyType::IntList:
    return "array of ints";
  case KeyType::StringList:
    return "array of strings";
  case KeyType::LayerPattern:
    return "int, string or array";
  }
  return "";
}

std::string cell(const std::string &s) { return s.empty() ? " " : s; }

} // namespace

const std::vector<KeyInfo> &specKeys() {
  static const std::vector<KeyInfo> table = buildTable();
  return table;
}

const std::vector<std::string> &specSections() {
  static const std::vector<std::string> sections = {"model", "parallel", "training", "data",
                                                    "cluster"};
  return sections;
}

const KeyInfo *findKey(const std::string &section, const std::string &name) {
  for (const KeyInfo &k : specKeys())
    if (section == k.section && name == k.name)
      return &k;
  return nullptr;
}

std::string didYouMean(const std::string &word, const std::vector<std::string> &candidates) {
  // Case-insensitive, so "rmsnorm" finds "RMSNorm". A candidate that shares
  // nothing with the word (distance = the longer length) is no hint at all.
  std::string w = lower(word);
  size_t limit = std::max<size_t>(2, word.size() / 3);
  std::string best;
  size_t bestDist = std::numeric_limits<size_t>::max();
  for (const std::string &c : candidates) {
    size_t d = editDistance(w, lower(c));
    if (d <= limit && d < std::max(w.size(), c.size()) && d < bestDist) {
      best = c;
      bestDist = d;
    }
  }
  return best;
}

std::string formatNumber(double v) {
  // Docs and messages show 1e-05, not 1.0000000000000001e-05.
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return v > 0 ? "inf" : "-inf";
  char buf[64];
  // Whole numbers below 2^53 in full: a range [1, 10000], not [1, 1e+04].
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0 && std::fabs(v) >= 1e4) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v)
      break;
  }
  return buf;
}

std::string rangeText(const KeyInfo &k) {
  bool hasMin = std::isfinite(k.min), hasMax = std::isfinite(k.max);
  if (hasMin && hasMax)
    return std::string("in ") + (k.minExclusive ? "(" : "[") + formatNumber(k.min) + ", " +
           formatNumber(k.max) + (k.maxExclusive ? ")" : "]");
  if (hasMin)
    return std::string(k.minExclusive ? "> " : ">= ") + formatNumber(k.min);
  if (hasMax)
    return std::string(k.maxExclusive ? "< " : "<= ") + formatNumber(k.max);
  return "";
}

std::string renderKeyReferenceMarkdown() {
  std::ostringstream os;
  bool first = true;
  for (const std::string &section : specSections()) {
    if (!first)
      os << "\n";
    first = false;
    os << "### [" << section << "]\n\n" << sectionDoc(section) << "\n\n";
    os << "| key | type | default | unit | Megatron flag | meaning |\n";
    os << "|---|---|---|---|---|---|\n";
    for (const KeyInfo &k : specKeys()) {
      if (section != k.section)
        continue;
      std::string def = k.required ? "required" : k.defaultText;
      std::string flag = *k.megatronFlag ? std::string("`") + k.megatronFlag + "`" : "";
      std::string meaning = k.doc;
      if (!k.choices.empty()) {
        meaning += " Allowed: ";
        for (size_t i = 0; i < k.choices.size(); ++i)
          meaning += (i ? ", `\"" : "`\"") + k.choices[i] + "\"`";
        meaning += ".";
      }
      std::string range = rangeText(k);
      if (!range.empty() && k.type != KeyType::Bool)
        meaning += " Range: " + range + ".";
      os << "| `" << k.name << "` | " << typeName(k.type) << " | " << cell(def) << " | "
         << cell(k.unit) << " | " << cell(flag) << " | " << meaning << " |\n";
    }
  }
  return os.str();
}

} // namespace mt::spec
