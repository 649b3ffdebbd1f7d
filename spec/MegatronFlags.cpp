// The table of every Megatron-LM flag (spec/MegatronFlags.h), the key-table
// lookups `mtc import-megatron` translates with, and the table's markdown.
#include "spec/MegatronFlags.h"
#include "spec/MegatronImportImpl.h"

#include "spec/SpecKeys.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

namespace mt::spec {

//===----------------------------------------------------------------------===//
// The table
//===----------------------------------------------------------------------===//

namespace {

constexpr FlagArity S = FlagArity::Switch, V = FlagArity::Value, VS = FlagArity::Values;

MegatronFlag row(const char *flag, FlagArity arity, FlagStatus status, const char *text) {
  MegatronFlag f;
  f.flag = flag;
  f.arity = arity;
  f.status = status;
  f.text = text;
  return f;
}
// A translation rule in MegatronImport.cpp handles it; `what` is what it sets.
MegatronFlag impl(const char *flag, FlagArity arity, const char *what) {
  return row(flag, arity, FlagStatus::Implemented, what);
}
MegatronFlag mtrun(const char *flag, FlagArity arity, const char *mtrunFlag) {
  return row(flag, arity, FlagStatus::Mtrun, mtrunFlag);
}
MegatronFlag na(const char *flag, FlagArity arity, const char *why) {
  return row(flag, arity, FlagStatus::NotApplicable, why);
}
MegatronFlag refuse(const char *flag, FlagArity arity, const char *why) {
  return row(flag, arity, FlagStatus::Refused, why);
}
// Accepted as `flag value` (mt's own behaviour, for `onlyWhy`), else refused.
MegatronFlag only(const char *flag, const char *value, const char *onlyWhy, const char *why,
                  FlagArity arity = V) {
  MegatronFlag f = row(flag, arity, FlagStatus::Refused, why);
  f.onlyValue = value;
  f.onlyWhy = onlyWhy;
  return f;
}
MegatronFlag post(MegatronFlag f) {
  f.source = "post-training";
  return f;
}

// Reasons shared by families of flags.
constexpr char kKernels[] =
    "mt generates its own kernels; this picks among Megatron's implementations of the "
    "same computation";
constexpr char kFusion[] = "mt generates and fuses its own kernels";
constexpr char kComm[] =
    "mt plans and schedules its own communication; this tunes Megatron's";
constexpr char kCudaGraph[] =
    "mtrun captures each program of the step as a CUDA graph itself (mtrun "
    "--no-cuda-graph turns that off)";
constexpr char kCkpt[] =
    "mt writes and reads its own checkpoint format (docs/training.md); this configures "
    "Megatron's";
constexpr char kAllocator[] =
    "mt plans memory at compile time; this tunes PyTorch's allocator or Python's garbage "
    "collector";
constexpr char kInference[] = "used by Megatron's inference and text generation, not by training";
constexpr char kRl[] =
    "used only with --perform-rl-step (reinforcement learning), which mt refuses";
constexpr char kOtherModels[] =
    "used by Megatron's BERT, T5, retrieval or vision scripts, not by GPT pretraining";
constexpr char kTooling[] =
    "configures Megatron's job tooling (fault tolerance, in-process restarts, straggler "
    "detection, telemetry), which mtrun does not have";
constexpr char kProfile[] =
    "marks the steps Megatron profiles for nsys; mtrun makes no such marks, so profile "
    "it with nsys without a capture range";
constexpr char kLoader[] =
    "tunes Megatron's PyTorch data loader; mt reads the same samples in the same order "
    "without one";
constexpr char kTokenizer[] =
    "mt reads the tokenizer's files itself (data.tokenizer_type and its keys): no "
    "Python tokenizer classes or remote code";
constexpr char kDeprecatedIgnored[] = "Megatron-LM ignores it (deprecated)";
constexpr char kFp8[] =
    "fp8 training is not implemented in mt; remove the fp8 flags, or pass --fp8-as-bf16 "
    "to mtc import-megatron to plan the model in bf16 instead";
constexpr char kFp4[] = "fp4 training is not implemented in mt; remove the fp4 flags";
constexpr char kQuant[] =
    "quantized training (Megatron's kitchen and Transformer Engine precision recipes) is "
    "not implemented in mt; remove it";
constexpr char kFlex[] =
    "the flex token dispatcher (DeepEP, HybridEP) is not implemented in mt; use "
    "--moe-token-dispatcher-type alltoall or allgather";
constexpr char kOnlyWithFlex[] =
    "used only with --moe-token-dispatcher-type flex, which mt refuses";
constexpr char kFsdp[] =
    "Megatron FSDP and PyTorch FSDP2 are not implemented in mt; use "
    "--use-distributed-optimizer (optimizer state sharded over data parallelism) and "
    "check the memory plan";
constexpr char kCp[] =
    "context parallelism is not implemented in mt; use --context-parallel-size 1";
constexpr char kOnlyWithCp[] =
    "used only with --context-parallel-size > 1, which mt refuses";
constexpr char kSlidingWindow[] =
    "sliding-window attention (gpt-oss has it on every other layer) is not implemented in "
    "mt: its attention is causal over the whole sequence; remove it";
constexpr char kNotYet[] = "not implemented in mt yet; remove it";
constexpr char kMla[] = "multi-latent attention is not implemented in mt; remove it";
constexpr char kOnlyWithMla[] =
    "used only with --multi-latent-attention, which mt refuses";
constexpr char kMamba[] =
    "hybrid Mamba models are not implemented in mt; remove it";
constexpr char kOnlyWithMamba[] =
    "used only by Mamba layers (hybrid models, pretrain_mamba.py), which mt refuses";
constexpr char kLinearAttention[] =
    "used only with --experimental-attention-variant, which mt refuses";
constexpr char kMtp[] = "used only with --mtp-num-layers, which mt refuses";
constexpr char kRlStep[] = "used only with --perform-rl-step, which mt refuses";
constexpr char kFim[] = "used only with --fim-data, which mt refuses";
constexpr char kMuon[] = "used only with --optimizer muon, which mt refuses";
constexpr char kCpuOffload[] =
    "used only with --optimizer-cpu-offload, which mt refuses";
constexpr char kActivationOffload[] =
    "used only with --fine-grained-activation-offloading, which mt refuses";
constexpr char kNonPersistent[] =
    "non-persistent checkpoints are not implemented in mt; remove it (--save and "
    "--save-interval write mt's checkpoints)";
constexpr char kResume[] =
    "mtrun resumes everything a checkpoint holds (weights, optimizer, scheduler, random "
    "state, data position), or what training.finetune, load_optim and load_rng "
    "(--finetune, --no-load-optim, --no-load-rng) leave of it; this changes what Megatron "
    "loads in another way, which mt does not implement: remove it";
constexpr char kNoLogOutput[] =
    "mt does not produce this output; remove it (mtrun writes Megatron's iteration lines "
    "and, with --tensorboard-dir, its TensorBoard scalars)";
constexpr char kDataSource[] =
    "mt reads one dataset (or blend) split by --split; give it with --data-path";
constexpr char kStaleFlag[] =
    "Megatron-LM 0.16 refuses it as well";

std::vector<MegatronFlag> explicitRows() {
  std::vector<MegatronFlag> t = {
      //===--- Model shape: the translation rules (MegatronImport.cpp) ---===//
      impl("--bf16", S, "training.precision = \"bf16\""),
      impl("--fp16", S, "training.precision = \"fp16\""),
      impl("--group-query-attention", S,
           "with --num-query-groups: model.num_query_groups (without it the groups are "
           "num_attention_heads, as Megatron)"),
      impl("--use-rotary-position-embeddings", S,
           "model.position_embedding_type = \"rope\""),
      impl("--no-position-embedding", S,
           "accepted with rope positions (no learned table); refused otherwise, as "
           "Megatron does"),
      impl("--encoder-seq-length", V, "model.seq_length (Megatron's other name for it)"),
      impl("--encoder-num-layers", V, "model.num_layers (Megatron's other name for it)"),
      impl("--num-layers-per-virtual-pipeline-stage", V,
           "parallel.virtual_pipeline_model_parallel_size = num_layers / (pp x L)"),
      impl("--recompute-activations", S, "parallel.recompute_granularity = \"selective\""),
      impl("--persistent-save-interval", V,
           "training.save_interval (Megatron's other name for --save-interval)"),

      //===--- Accepted for the value that is mt's behaviour ---===//
      only("--context-parallel-size", "1", "1 is mt's only context-parallel size", kCp),
      only("--rotary-percent", "1.0",
           "1.0 is what mt does: rotary embeddings cover the whole head",
           "partial rotary embeddings are not implemented in mt; use --rotary-percent 1.0"),
      only("--softmax-type", "vanilla", "vanilla is mt's softmax",
           "attention sinks (the off-by-one softmax, or gpt-oss's learnable offset per "
           "head) are not implemented in mt; remove it"),
      only("--glu-linear-offset", "0", "0 is mt's gated MLP (no offset)",
           "an offset on the linear half of a gated MLP (gpt-oss's act(gate) * (linear + "
           "1)) is not implemented in mt; remove it"),
      only("--dataloader-type", "single",
           "single is mt's data order (Megatron's default for pretraining)",
           "mt reads samples in Megatron's single-pass order only; use --dataloader-type "
           "single or remove it"),
      only("--vocab-extra-ids", "0", "0: no extra tokens",
           "extra vocabulary ids (T5 sentinels) are not implemented in mt; add them to "
           "--vocab-size instead"),
      only("--lr-warmup-init", "0", "0 is where mt's warmup starts",
           "mt's warmup starts at 0; a warmup from another learning rate is not "
           "implemented: remove it"),
      only("--head-lr-mult", "1", "1: the output layer trains at the learning rate",
           "per-layer learning-rate multipliers are not implemented in mt; remove it"),
      only("--weight-decay-incr-style", "constant", "constant is mt's weight decay",
           "weight-decay schedules are not implemented in mt; use a constant "
           "--weight-decay"),
      only("--num-distributed-optimizer-instances", "1",
           "1: the distributed optimizer shards over the whole data-parallel group, as mt's",
           "several distributed-optimizer instances are not implemented in mt; remove it"),
      only("--recompute-modules", "core_attn",
           "core_attn is what mt's selective recomputation recomputes",
           "mt's selective recomputation recomputes the attention core only; use "
           "--recompute-modules core_attn or remove it",
           VS),
      only("--cpu-offloading-num-layers", "0", "0: no activation offloading",
           "offloading activations to the CPU is not implemented in mt; remove it"),
      only("--exit-signal", "SIGTERM", "mtrun saves and exits on SIGTERM",
           "mtrun saves and exits on SIGTERM only; remove it"),
      only("--rerun-mode", "disabled", "mt has no re-run engine",
           "mt has no re-run engine to validate results with; use --rerun-mode disabled "
           "or remove it"),
      only("--error-injection-rate", "0", "0: no injected errors",
           "mt has no re-run engine to inject errors into; remove it"),
      only("--mid-level-dataset-surplus", "0.005",
           "0.005 is the surplus mt builds blends with, as Megatron's default",
           "mt builds blended datasets with Megatron's default surplus 0.005; remove it"),
      only("--exp-avg-dtype", "fp32", "mt keeps Adam's moments in fp32",
           "mt keeps Adam's moments in fp32; lower-precision optimizer state is not "
           "implemented: remove it"),
      only("--exp-avg-sq-dtype", "fp32", "mt keeps Adam's moments in fp32",
           "mt keeps Adam's moments in fp32; lower-precision optimizer state is not "
           "implemented: remove it"),
      only("--main-grads-dtype", "fp32", "mt keeps gradients in fp32",
           "mt keeps gradients in fp32; remove it"),
      only("--main-params-dtype", "fp32", "mt keeps master weights in fp32",
           "mt keeps master weights in fp32; remove it"),

      //===--- mtrun's flags ---===//
      mtrun("--distributed-timeout-minutes", V, "--distributed-timeout-minutes"),
      mtrun("--exit-interval", V, "--exit-interval"),
      mtrun("--exit-duration-in-mins", V, "--exit-duration-in-mins"),
      mtrun("--skip-train", S, "--skip-train"),
      mtrun("--tensorboard-dir", V, "--tensorboard-dir"),
      mtrun("--tensorboard-log-interval", V, "--tensorboard-log-interval"),
      mtrun("--log-timers-to-tensorboard", S, "--log-timers-to-tensorboard"),
      mtrun("--log-validation-ppl-to-tensorboard", S, "--log-validation-ppl-to-tensorboard"),
      mtrun("--log-world-size-to-tensorboard", S, "--log-world-size-to-tensorboard"),
      mtrun("--no-log-loss-scale-to-tensorboard", S, "--no-log-loss-scale-to-tensorboard"),
      mtrun("--disable-log-loss-scale-to-tensorboard", S,
            "--no-log-loss-scale-to-tensorboard"),

      //===--- Refused until implemented (issue 22) ---===//
      refuse("--no-barrier-with-level-1-timing", S, kNotYet),

      //===--- fp8, fp4 and quantization ---===//
      refuse("--fp8-format", V, kFp8),
      refuse("--fp8-recipe", V, kFp8),
      refuse("--fp8-margin", V, kFp8),
      refuse("--fp8-interval", V, kFp8),
      refuse("--fp8-amax-history-len", V, kFp8),
      refuse("--fp8-amax-compute-algo", V, kFp8),
      refuse("--fp8-param-gather", S, kFp8),
      refuse("--fp8-quantizer-factory", V, kFp8),
      refuse("--no-fp8-wgrad", S, kFp8),
      refuse("--disable-fp8-wgrad", S, kFp8),
      refuse("--first-last-layers-bf16", S, kFp8),
      refuse("--num-layers-at-start-in-bf16", V, kFp8),
      refuse("--num-layers-at-end-in-bf16", V, kFp8),
      refuse("--keep-fp8-transpose-cache", S, kFp8),
      refuse("--reuse-grad-buf-for-mxfp8-param-ag", S, kFp8),
      refuse("--fp4-format", V, kFp4),
      refuse("--fp4-recipe", V, kFp4),
      refuse("--fp4-param-gather", S, kFp4),
      refuse("--fp4-quantizer-factory", V, kFp4),
      refuse("--te-precision-config-file", V, kQuant),
      refuse("--kitchen-config-file", V, kQuant),
      refuse("--kitchen-recipe-number", V, kQuant),
      refuse("--use-kitchen-attention", S, kQuant),
      refuse("--kitchen-attention-backend", V, kQuant),

      //===--- Megatron FSDP ---===//
      refuse("--use-megatron-fsdp", S, kFsdp),
      refuse("--use-torch-fsdp2", S, kFsdp),
      refuse("--data-parallel-sharding-strategy", V, kFsdp),
      refuse("--outer-dp-sharding-strategy", V, kFsdp),
      refuse("--enable-full-sharding-in-hsdp", S, kFsdp),
      refuse("--fsdp-double-buffer", S, kFsdp),
      refuse("--fsdp-manual-registration", S, kFsdp),
      refuse("--torch-fsdp2-no-reshard-after-forward", S, kFsdp),
      refuse("--init-model-with-meta-device", S, kFsdp),
      refuse("--suggested-communication-unit-size", V, kFsdp),
      refuse("--no-strict-fsdp-dtensor-load", S, kFsdp),
      refuse("--disable-strict-fsdp-dtensor-load", S, kFsdp),

      //===--- Context parallelism ---===//
      refuse("--hybrid-context-parallel", S, kCp),
      refuse("--max-seqlen-per-dp-cp-rank", V, kCp),
      na("--cp-comm-type", VS, kOnlyWithCp),
      na("--hierarchical-context-parallel-sizes", VS, kOnlyWithCp),

      //===--- gpt-oss ---===//
      refuse("--quick-geglu", S,
             "gpt-oss's activation, quick GeGLU (gate * sigmoid(1.702 * gate) times the "
             "linear half), is not implemented in mt (its gated MLP is SwiGLU, --swiglu); "
             "remove it"),
      refuse("--window-size", V, kSlidingWindow),
      refuse("--window-attn-skip-freq", V, kSlidingWindow),
      refuse("--activation-func-clamp-value", V,
             "clamping the MLP's activations (gpt-oss's clamp at 7) is not implemented in mt; "
             "remove it"),
      post(refuse("--enable-gpt-oss", S,
                  "gpt-oss's YaRN rotary embeddings (scaling factor 32 over 131072 original "
                  "positions) are not implemented in mt; remove it")),

      //===--- Mixture of experts (the key table has the ones mt implements) ---===//
      refuse("--moe-apply-probs-on-input", S,
             "applying the routing weights to the experts' input instead of their output "
             "is not implemented in mt; remove it"),
      post(refuse("--export-moe-apply-probs-on-input", S,
                  "applying the routing weights to the experts' input instead of their "
                  "output is not implemented in mt; remove it")),
      refuse("--moe-enable-deepep", S, kFlex),
      na("--moe-flex-dispatcher-backend", V, kOnlyWithFlex),
      na("--moe-deepep-num-sms", V, kOnlyWithFlex),
      na("--moe-hybridep-num-sms", V, kOnlyWithFlex),
      refuse("--moe-enable-routing-replay", S,
             "replaying recorded routing decisions is not implemented in mt; remove it"),
      na("--moe-extended-tp", S,
         "Megatron-LM ignores it (deprecated; --expert-tensor-parallel-size replaces it)"),
      refuse("--moe-input-jitter-eps", V,
             "jitter noise on the router's input is not implemented in mt; remove it"),
      refuse("--moe-latent-size", V,
             "latent projections around the experts are not implemented in mt; remove it"),
      refuse("--moe-layer-recompute", S,
             "recomputing mixture-of-experts layers is not implemented in mt (Megatron "
             "deprecates it for --recompute-modules moe); remove it"),
      na("--moe-pad-experts-for-cuda-graph-inference", S, kInference),
      refuse("--moe-per-layer-logging", S,
             "mt logs load_balancing_loss and z_loss summed over the MoE layers (Megatron's "
             "default); per-layer logging is not implemented: remove it"),
      na("--moe-permute-fusion", S, kFusion),
      na("--moe-router-fusion", S, kFusion),
      na("--moe-use-legacy-grouped-gemm", S, kKernels),
      refuse("--moe-router-enable-expert-bias", S,
             "aux-loss-free load balancing (a per-expert routing bias) is not implemented "
             "in mt; remove it"),
      na("--moe-router-bias-update-rate", V,
         "used only with --moe-router-enable-expert-bias, which mt refuses"),
      refuse("--moe-router-force-load-balancing", S,
             "routing on random logits (a benchmarking aid) is not implemented in mt; remove "
             "it"),
      refuse("--moe-router-num-groups", V,
             "group-limited routing (device- or node-limited top-k) is not implemented in "
             "mt; remove it"),
      refuse("--moe-router-group-topk", V,
             "group-limited routing (device- or node-limited top-k) is not implemented in "
             "mt; remove it"),
      refuse("--moe-router-padding-for-fp8", S, kFp8),
      refuse("--moe-router-padding-for-quantization", S,
             "pads the routing for fp8 or fp4 GEMMs, which mt does not have; remove it"),
      refuse("--moe-shared-expert-gate", S,
             "a gated shared expert is not implemented in mt; remove it"),
      na("--moe-shared-expert-overlap", S, kComm),
      refuse("--moe-use-upcycling", S,
             "turning a dense checkpoint into a mixture of experts (upcycling) is not "
             "implemented in mt; remove it"),
      na("--moe-upcycling-granularity", V,
         "used only with --moe-use-upcycling, which mt refuses"),
      na("--overlap-moe-expert-parallel-comm", S, kComm),
      na("--ep-overlap-early-attn-memory-release", S, kComm),
      refuse("--use-fused-weighted-squared-relu", S,
             "the squared-ReLU MLP is not implemented in mt; remove it"),

      //===--- Other architectures and layer variants ---===//
      refuse("--multi-latent-attention", S, kMla),
      na("--q-lora-rank", V, kOnlyWithMla),
      na("--kv-lora-rank", V, kOnlyWithMla),
      na("--qk-head-dim", V, kOnlyWithMla),
      na("--qk-pos-emb-head-dim", V, kOnlyWithMla),
      na("--v-head-dim", V, kOnlyWithMla),
      na("--rope-type", V, kOnlyWithMla),
      na("--mscale", V, kOnlyWithMla),
      na("--mscale-all-dim", V, kOnlyWithMla),
      na("--rotary-scaling-factor", V, kOnlyWithMla),
      refuse("--qk-clip", S, "clipping query and key weights (qk-clip) is not implemented in "
                             "mt; remove it"),
      na("--qk-clip-alpha", V, "used only with --qk-clip, which mt refuses"),
      na("--qk-clip-threshold", V, "used only with --qk-clip, which mt refuses"),
      refuse("--is-hybrid-model", S, kMamba),
      refuse("--hybrid-attention-ratio", V, kMamba),
      refuse("--hybrid-mlp-ratio", V, kMamba),
      refuse("--hybrid-override-pattern", V, kMamba),
      na("--mamba-head-dim", V, kOnlyWithMamba),
      na("--mamba-num-groups", V, kOnlyWithMamba),
      na("--mamba-num-heads", V, kOnlyWithMamba),
      na("--mamba-state-dim", V, kOnlyWithMamba),
      na("--disable-mamba-mem-eff-path", S, kOnlyWithMamba),
      refuse("--experimental-attention-variant", V,
             "linear and sparse attention variants (gated delta net, DSA) are not "
             "implemented in mt; remove it"),
      na("--linear-attention-freq", V, kLinearAttention),
      na("--linear-conv-kernel-dim", V, kLinearAttention),
      na("--linear-key-head-dim", V, kLinearAttention),
      na("--linear-num-key-heads", V, kLinearAttention),
      na("--linear-num-value-heads", V, kLinearAttention),
      na("--linear-value-head-dim", V, kLinearAttention),
      na("--dsa-indexer-head-dim", V, kLinearAttention),
      na("--dsa-indexer-loss-coeff", V, kLinearAttention),
      na("--dsa-indexer-n-heads", V, kLinearAttention),
      na("--dsa-indexer-topk", V, kLinearAttention),
      na("--dsa-indexer-use-sparse-loss", S, kLinearAttention),
      refuse("--mtp-num-layers", V,
             "multi-token prediction is not implemented in mt; remove it"),
      na("--mtp-loss-scaling-factor", V, kMtp),
      na("--mtp-standalone", S, kMtp),
      refuse("--heterogeneous-layers-config-path", V,
             "heterogeneous layers are not implemented in mt: every layer has the same "
             "shape; remove it"),
      refuse("--heterogeneous-layers-config-encoded-json", V,
             "heterogeneous layers are not implemented in mt: every layer has the same "
             "shape; remove it"),
      refuse("--spec", VS,
             "mt builds Megatron-Core's GPT layer itself; custom layer specs are not "
             "implemented: remove it"),
      refuse("--yaml-cfg", V,
             "mt reads Megatron's flags, not its YAML configs; pass the flags instead"),
      refuse("--use-legacy-models", S,
             "mt implements Megatron-Core's GPT model, not the legacy one; remove it"),
      na("--use-mcore-models", S, "Megatron-Core's GPT model is the one mt implements"),
      refuse("--add-qkv-bias", S,
             "a bias on the QKV projection alone is not implemented in mt; remove it (or "
             "drop --disable-bias-linear for biases everywhere)"),
      refuse("--apply-residual-connection-post-layernorm", S,
             "the post-norm residual (original BERT) is not implemented in mt; remove it"),
      refuse("--attention-output-gate", S,
             "gated attention output is not implemented in mt; remove it"),
      refuse("--qk-layernorm", S,
             "normalization of queries and keys is not implemented in mt; remove it"),
      refuse("--qk-l2-norm", S,
             "L2 normalization of queries and keys is not implemented in mt; remove it"),
      na("--apply-wd-to-qk-layernorm", S, "used only with --qk-layernorm, which mt refuses"),
      na("--no-weight-decay-cond-type", V, "used only with --qk-layernorm, which mt refuses"),
      refuse("--squared-relu", S, "the squared-ReLU MLP is not implemented in mt; remove it"),
      refuse("--openai-gelu", S,
             "mt's GELU is Megatron's default one; OpenAI's approximation is not "
             "implemented: remove it"),
      refuse("--apply-query-key-layer-scaling", S,
             "scaling query-key products by the layer number is not implemented in mt; "
             "remove it"),
      refuse("--rotary-interleaved", S,
             "interleaved rotary pairs (RoFormer style) are not implemented in mt; mt "
             "rotates first and second halves, Megatron's default: remove it"),
      refuse("--rotary-seq-len-interpolation-factor", V,
             "rotary sequence-length interpolation is not implemented in mt; remove it"),
      refuse("--no-rope-freq", V,
             "skipping rotary embeddings on some layers is not implemented in mt; remove it"),
      refuse("--mrope-section", VS,
             "multimodal rotary embeddings are not implemented in mt; remove it"),
      na("--relative-attention-num-buckets", V,
         "used only with --position-embedding-type relative, which mt refuses"),
      na("--relative-attention-max-distance", V,
         "used only with --position-embedding-type relative, which mt refuses"),
      refuse("--padded-vocab-size", V,
             "mt pads the vocabulary itself, to a multiple of "
             "--make-vocab-size-divisible-by x tensor parallel size; give "
             "--make-vocab-size-divisible-by instead"),
      refuse("--embedding-init-method-std", V,
             "a separate initialization for the embedding is not implemented in mt; remove "
             "it (--init-method-std applies to it)"),
      refuse("--init-method-xavier-uniform", S,
             "Xavier initialization is not implemented in mt; remove it "
             "(--init-method-std sets mt's normal initialization)"),
      refuse("--data-parallel-random-init", S,
             "mt initializes the same weights on every data-parallel rank; remove it"),
      refuse("--fp16-lm-cross-entropy", S,
             "mt computes the loss in fp32; remove it"),
      refuse("--fp32-residual-connection", S,
             "an fp32 residual stream is not implemented in mt; remove it"),
      refuse("--disable-bf16-reduced-precision-matmul", S,
             "mt does not set cuBLAS's reduced-precision reduction; remove it"),
      refuse("--batch-invariant-mode", S,
             "batch-invariant kernels are not implemented in mt; remove it"),
      refuse("--deterministic-mode", S,
             "mt has no deterministic mode to switch on; remove it"),
      refuse("--loss-scale", V,
             "static loss scaling is not implemented in mt: --fp16 uses dynamic loss "
             "scaling (--initial-loss-scale, --loss-scale-window, ...); remove it"),
      refuse("--microbatch-group-size-per-virtual-pipeline-stage", V,
             "mt's interleaved schedule groups pipeline_model_parallel_size micro-batches "
             "per virtual stage (Megatron's default); remove it"),
      refuse("--pipeline-model-parallel-layout", V,
             "custom pipeline layouts are not implemented in mt; use "
             "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers"),
      refuse("--account-for-embedding-in-pipeline-split", S,
             "mt splits transformer layers only; use --decoder-first-pipeline-num-layers "
             "to give the first stage fewer"),
      refuse("--account-for-loss-in-pipeline-split", S,
             "mt splits transformer layers only; use --decoder-last-pipeline-num-layers to "
             "give the last stage fewer"),
      refuse("--use-tp-pp-dp-mapping", S,
             "mt places ranks in its own order (docs/launch.md); remove it"),
      refuse("--distribute-saved-activations", S,
             "distributing recomputed activations over tensor parallelism is not "
             "implemented in mt; remove it"),
      refuse("--fine-grained-activation-offloading", S,
             "offloading activations to the CPU is not implemented in mt; remove it"),
      na("--offload-modules", VS, kActivationOffload),
      na("--min-offloaded-tensor-size", V, kActivationOffload),
      refuse("--use-precision-aware-optimizer", S,
             "lower-precision optimizer state is not implemented in mt; remove it"),
      refuse("--optimizer-cpu-offload", S,
             "offloading the optimizer to the CPU is not implemented in mt; remove it"),
      na("--optimizer-offload-fraction", V, kCpuOffload),
      na("--overlap-cpu-optimizer-d2h-h2d", S, kCpuOffload),
      na("--use-torch-optimizer-for-cpu-offload", S, kCpuOffload),
      na("--no-pin-cpu-grads", S, kCpuOffload),
      na("--no-pin-cpu-params", S, kCpuOffload),
      refuse("--ddp-num-buckets", V,
             "mt sizes gradient buckets by elements; give --ddp-bucket-size instead"),
      refuse("--start-weight-decay", V,
             "weight-decay schedules are not implemented in mt; use a constant "
             "--weight-decay"),
      refuse("--end-weight-decay", V,
             "weight-decay schedules are not implemented in mt; use a constant "
             "--weight-decay"),
      na("--muon-extra-scale-factor", V, kMuon),
      na("--muon-fp32-matmul-prec", V, kMuon),
      na("--muon-momentum", V, kMuon),
      na("--muon-no-split-qkv", S, kMuon),
      na("--muon-num-ns-steps", V, kMuon),
      na("--muon-scale-mode", V, kMuon),
      na("--muon-tp-mode", V, kMuon),
      na("--muon-use-nesterov", S, kMuon),
      refuse("--dump-param-to-param-group-map", V,
             "parameter groups are not implemented in mt; remove it"),

      //===--- Flags Megatron-LM 0.16 itself refuses ---===//
      refuse("--batch-size", V, "Megatron-LM 0.16 refuses it as well; use --micro-batch-size"),
      refuse("--warmup", V,
             "Megatron-LM 0.16 refuses it as well; use --lr-warmup-iters or "
             "--lr-warmup-fraction"),
      refuse("--model-parallel-size", V,
             "Megatron-LM 0.16 refuses it as well; use --tensor-model-parallel-size"),
      refuse("--checkpoint-activations", S,
             "Megatron-LM 0.16 exits on it; use --recompute-activations, or "
             "--recompute-granularity full --recompute-method uniform "
             "--recompute-num-layers 1"),

      //===--- Training loop, data and checks ---===//
      refuse("--decrease-batch-size-if-needed", S,
             "mt keeps the global batch size; make it a multiple of micro batch x data "
             "parallel size"),
      refuse("--phase-transition-iterations", V,
             "training phases are not implemented in mt; remove it"),
      refuse("--iterations-to-skip", VS,
             "skipping iterations is not implemented in mt; remove it"),
      refuse("--result-rejected-tracker-filename", V,
             "mt has no re-run engine to track rejected results; remove it"),
      na("--error-injection-type", V, "used only with --error-injection-rate > 0, which mt refuses"),
      refuse("--check-for-spiky-loss", S,
             "mt does not check for loss spikes; remove it"),
      refuse("--check-for-large-grads", S,
             "mt does not check for unexpectedly large gradients; remove it"),
      refuse("--check-weight-hash-across-dp-replicas-interval", V,
             "mt does not compare weight hashes across data-parallel replicas; remove it"),
      refuse("--test-mode", S, "mt has no real-time test mode; remove it"),
      refuse("--full-validation", S,
             "mt evaluates --eval-iters batches; validation over the whole split is not "
             "implemented: remove it"),
      refuse("--multiple-validation-sets", S,
             "mt evaluates one validation split; remove it"),
      refuse("--eod-mask-loss", S,
             "masking the loss at end-of-document tokens is not implemented in mt; remove it"),
      refuse("--reset-position-ids", S,
             "resetting position ids at document ends is not implemented in mt; remove it"),
      refuse("--reset-attention-mask", S,
             "resetting the attention mask at document ends is not implemented in mt; "
             "remove it"),
      refuse("--allow-ambiguous-pad-tokens", S,
             "mt does not treat pad tokens specially; remove it"),
      refuse("--data-args-path", V, kDataSource),
      refuse("--per-split-data-args-path", V, kDataSource),
      refuse("--train-data-path", VS, kDataSource),
      refuse("--valid-data-path", VS, kDataSource),
      refuse("--test-data-path", VS, kDataSource),
      refuse("--sft", S, "supervised fine-tuning data is not implemented in mt; remove it"),
      na("--sft-tokenizer-prompt-format", V, "used only with --sft, which mt refuses"),
      refuse("--fim-data", S,
             "fill-in-the-middle data is not implemented in mt; remove it"),
      na("--fim-eod-token", V, kFim),
      na("--fim-fragment-rate", V, kFim),
      na("--fim-middle-token", V, kFim),
      na("--fim-no-prefix", V, kFim),
      na("--fim-pad-token", V, kFim),
      na("--fim-prefix-token", V, kFim),
      na("--fim-rate", V, kFim),
      na("--fim-split-sample", V, kFim),
      na("--fim-spm-rate", V, kFim),
      na("--fim-suffix-token", V, kFim),
      refuse("--perform-rl-step", S,
             "reinforcement learning is not implemented in mt; remove it"),
      refuse("--enable-experimental", S,
             "Megatron's experimental features are not implemented in mt; remove it"),
      refuse("--fake-process-group", S,
             "mtc compile reports the memory plan without running anything; remove it"),
      refuse("--lazy-mpu-init", V,
             "an external data-parallel manager is not implemented in mt; remove it"),
      refuse("--onnx-safe", V, "mt does not export to ONNX; remove it"),

      //===--- Checkpoints ---===//
      refuse("--pretrained-checkpoint", V, kResume),
      refuse("--load-main-params-from-ckpt", S, kResume),
      refuse("--use-checkpoint-args", S,
             "mt takes the model from the spec; a checkpoint's own arguments do not "
             "override it: remove it"),
      refuse("--use-mp-args-from-checkpoint-args", S,
             "mt takes the layout from the spec (mtc reshard converts a checkpoint to "
             "another layout); remove it"),
      refuse("--use-checkpoint-opt-param-scheduler", S, kResume),
      refuse("--use-checkpoint-opt_param-scheduler", S, kResume),
      refuse("--override-opt-param-scheduler", S, kResume),
      refuse("--override-opt_param-scheduler", S, kResume),
      refuse("--exit-on-missing-checkpoint", S,
             "mtrun starts from scratch when --load holds no checkpoint, as Megatron's "
             "default; remove it"),
      refuse("--save-retain-interval", V,
             "mt keeps every checkpoint it saves; remove it"),
      refuse("--save-wgrads-interval", V, "mt does not save gradients; remove it"),
      refuse("--save-dgrads-interval", V, "mt does not save gradients; remove it"),
      refuse("--ckpt-convert-format", V,
             "mt converts checkpoints with `mtc reshard`, not during training; remove it"),
      refuse("--ckpt-convert-save", V,
             "mt converts checkpoints with `mtc reshard`, not during training; remove it"),
      refuse("--non-persistent-ckpt-type", V, kNonPersistent),
      refuse("--non-persistent-global-ckpt-dir", V, kNonPersistent),
      refuse("--non-persistent-local-ckpt-algo", V, kNonPersistent),
      refuse("--non-persistent-local-ckpt-dir", V, kNonPersistent),
      refuse("--non-persistent-save-interval", V, kNonPersistent),
      na("--replication", S,
         "used only with --non-persistent-ckpt-type local, which mt refuses"),
      na("--replication-factor", V,
         "used only with --non-persistent-ckpt-type local, which mt refuses"),
      na("--replication-jump", V,
         "used only with --non-persistent-ckpt-type local, which mt refuses"),
      na("--ckpt-format", V, kCkpt),
      na("--use-dist-ckpt", S, kCkpt),
      na("--dist-ckpt-format", V, kCkpt),
      na("--async-save", S, kCkpt),
      na("--use-persistent-ckpt-worker", S, kCkpt),
      na("--ckpt-fully-parallel-save", S, kCkpt),
      na("--no-ckpt-fully-parallel-save", S, kCkpt),
      na("--disable-ckpt-fully-parallel-save", S, kCkpt),
      na("--ckpt-fully-parallel-load", S, kCkpt),
      na("--ckpt-assume-constant-structure", S, kCkpt),
      na("--auto-detect-ckpt-format", S, kCkpt),
      na("--dist-ckpt-strictness", V, kCkpt),
      na("--dist-ckpt-optim-fully-reshardable", S, kCkpt),
      na("--dist-ckpt-save-pre-mcore-014", S, kCkpt),
      na("--distrib-optim-fully-reshardable-mem-efficient", S, kCkpt),
      na("--ckpt-convert-update-legacy-dist-opt-format", S, kCkpt),
      na("--no-use-tokenizer-model-from-checkpoint-args", S, kTokenizer),
      na("--disable-use-tokenizer-model-from-checkpoint-args", S, kTokenizer),

      //===--- Logging ---===//
      refuse("--wandb-project", V,
             "mt does not log to Weights & Biases; remove the --wandb-* flags (mtrun "
             "--tensorboard-dir writes Megatron's TensorBoard scalars)"),
      refuse("--wandb-exp-name", V,
             "mt does not log to Weights & Biases; remove the --wandb-* flags"),
      refuse("--wandb-save-dir", V,
             "mt does not log to Weights & Biases; remove the --wandb-* flags"),
      refuse("--wandb-entity", V,
             "mt does not log to Weights & Biases; remove the --wandb-* flags"),
      refuse("--log-progress", S, kNoLogOutput),
      refuse("--log-energy", S, kNoLogOutput),
      refuse("--log-device-memory-used", S, kNoLogOutput),
      refuse("--log-max-attention-logit", S, kNoLogOutput),
      refuse("--log-memory-interval", V, kNoLogOutput),
      refuse("--log-straggler", S, kNoLogOutput),
      refuse("--config-logger-dir", V, kNoLogOutput),
      refuse("--use-pytorch-profiler", S, kNoLogOutput),
      refuse("--record-memory-history", S, kNoLogOutput),
      na("--memory-snapshot-path", V, "used only with --record-memory-history, which mt refuses"),
      na("--tensorboard-queue-size", V,
         "sizes the queue of Megatron's TensorBoard writer; mtrun writes its events "
         "without one"),
      na("--logging-level", V, "sets the level of Megatron's Python loggers"),
      na("--profile", S, kProfile),
      na("--profile-step-start", V, kProfile),
      na("--profile-step-end", V, kProfile),
      na("--profile-ranks", VS, kProfile),

      //===--- Kernels, fusion and communication ---===//
      na("--transformer-impl", V, kKernels),
      na("--attention-backend", V, kKernels),
      na("--use-flash-attn", S, kKernels),
      na("--use-te-activation-func", S, kKernels),
      na("--cross-entropy-fusion-impl", V, kKernels),
      na("--cross-entropy-loss-fusion", S, kFusion),
      na("--no-masked-softmax-fusion", S, kFusion),
      na("--no-bias-dropout-fusion", S, kFusion),
      na("--no-bias-gelu-fusion", S, kFusion),
      na("--no-bias-swiglu-fusion", S, kFusion),
      na("--no-rope-fusion", S, kFusion),
      na("--no-persist-layer-norm", S, kFusion),
      na("--no-gradient-accumulation-fusion", S, kFusion),
      na("--no-gradient-reduce-div-fusion", S, kFusion),
      na("--disable-jit-fuser", S, kFusion),
      na("--attention-softmax-in-fp32", S,
         "mt computes the attention softmax in fp32 always"),
      na("--accumulate-allreduce-grads-in-fp32", S,
         "mt keeps and reduces gradients in fp32 (Megatron's behaviour with --bf16) unless "
         "--grad-reduce-in-bf16 is given, which overrides this flag in Megatron too"),
      na("--ddp-reduce-scatter-with-fp32-accumulation", S,
         "mt keeps and reduces gradients in fp32 unless --grad-reduce-in-bf16 is given; "
         "with it and --use-distributed-optimizer, the import refuses this flag (mt adds "
         "bf16 gradients in bf16)"),
      na("--ddp-average-in-collective", S, kComm),
      na("--ddp-pad-buckets-for-high-nccl-busbw", S, kComm),
      na("--no-align-grad-reduce", S, kComm),
      na("--no-align-param-gather", S, kComm),
      na("--overlap-param-gather-with-optimizer-step", S, kComm),
      na("--no-overlap-p2p-communication", S, kComm),
      na("--overlap-p2p-communication-warmup-flush", S, kComm),
      na("--no-scatter-gather-tensors-in-pipeline", S, kComm),
      na("--use-ring-exchange-p2p", S, kComm),
      na("--defer-embedding-wgrad-compute", S, kComm),
      na("--wgrad-deferral-limit", V, kComm),
      na("--delay-wgrad-compute", S, kComm),
      na("--tp-comm-overlap", S, kComm),
      na("--tp-comm-overlap-cfg", V, kComm),
      na("--tp-comm-overlap-rs-dgrad", S, kComm),
      na("--tp-comm-bootstrap-backend", V, kComm),
      na("--no-tp-comm-bulk-dgrad", S, kComm),
      na("--no-tp-comm-bulk-wgrad", S, kComm),
      na("--no-tp-comm-overlap-ag", S, kComm),
      na("--no-tp-comm-overlap-rs", S, kComm),
      na("--no-tp-comm-split-ag", S, kComm),
      na("--no-tp-comm-split-rs", S, kComm),
      na("--disable-tp-comm-bulk-dgrad", S, kComm),
      na("--disable-tp-comm-bulk-wgrad", S, kComm),
      na("--disable-tp-comm-overlap-ag", S, kComm),
      na("--disable-tp-comm-overlap-rs", S, kComm),
      na("--disable-tp-comm-split-ag", S, kComm),
      na("--disable-tp-comm-split-rs", S, kComm),
      na("--no-async-tensor-model-parallel-allreduce", S, kDeprecatedIgnored),
      na("--disable-async-tensor-model-parallel-allreduce", S, kDeprecatedIgnored),
      na("--symmetric-ar-type", V, kComm),
      na("--pipeline-model-parallel-comm-backend", V, kComm),
      na("--nccl-communicator-config-path", V, kComm),
      na("--use-sharp", S, kComm),
      na("--sharp-enabled-group", V, kComm),
      na("--high-priority-stream-groups", VS, kComm),
      na("--create-all-gather-group", S, kComm),
      na("--use-nccl-ub", S, kComm),
      na("--disable-symmetric-registration", S, kComm),
      na("--disable-gloo-process-groups", S, kComm),
      na("--distributed-backend", V, "mt picks NCCL (GPUs) or Gloo (CPU) itself"),
      na("--distributed-timeout-seconds-after-init", V,
         "mtrun has one timeout for the start and every collective after it "
         "(--distributed-timeout-minutes or --timeout)"),
      na("--local-rank", V, "set by PyTorch's launcher; mtrun finds its rank itself"),
      na("--cuda-graph-impl", V, kCudaGraph),
      na("--cuda-graph-scope", VS, kCudaGraph),
      na("--cuda-graph-warmup-steps", V, kCudaGraph),
      na("--enable-cuda-graph", S, kCudaGraph),
      na("--external-cuda-graph", S, kCudaGraph),
      na("--no-clone-scatter-output-in-embedding", S, kAllocator),
      na("--disable-clone-scatter-output-in-embedding", S, kAllocator),
      na("--empty-unused-memory-level", V, kAllocator),
      na("--manual-gc", S, kAllocator),
      na("--manual-gc-interval", V, kAllocator),
      na("--no-manual-gc-eval", S, kAllocator),
      na("--disable-manual-gc-eval", S, kAllocator),
      na("--train-sync-interval", V,
         "paces Megatron's Python host against the GPU; mtrun's host runs the plan"),
      na("--use-cpu-initialization", S,
         "mt initializes every weight on the host, the same at every tensor-parallel "
         "size, which is what this gives Megatron"),
      na("--no-initialization", S,
         "skips Megatron's initialization to start faster before loading a checkpoint; "
         "mt's initialization does not change a loaded run"),
      na("--te-rng-tracker", S,
         "picks Transformer Engine's random-number tracker; mt has its own random streams"),
      na("--inference-rng-tracker", S, kInference),
      na("--exit-signal-handler", S, "mtrun always saves and exits on SIGTERM"),
      na("--exit-signal-handler-for-dataloader", S, kLoader),

      //===--- Data loading and tokenizers ---===//
      na("--num-workers", V, kLoader),
      na("--no-mmap-bin-files", S, kLoader),
      na("--data-cache-path", V,
         "mt caches its index files next to the data, as Megatron does without this flag"),
      na("--dataloader-fast-cache-load", S, kLoader),
      na("--dataloader-defer-npy-index-mmap", S, kLoader),
      na("--num-dataset-builder-threads", V, kLoader),
      na("--per-dataset-sequences-path", V,
         "a cache that speeds up Megatron's dataset building; mt reads the .idx files"),
      na("--object-storage-cache-path", V,
         "used with object-storage data paths; mt reads local files"),
      na("--disable-msc", S,
         "switches off Megatron's object-storage client; mt reads local files"),
      na("--no-create-attention-mask-in-dataloader", S,
         "mt's attention is causal without a mask tensor"),
      na("--tokenizer-metadata", V, kTokenizer),
      na("--tokenizer-hf-use-fast", S,
         "mt reads tokenizer.json itself; the fast tokenizer is the one it matches"),
      na("--trust-remote-code", S, kTokenizer),

      //===--- Job tooling ---===//
      na("--adlr-autoresume", S, kTooling),
      na("--adlr-autoresume-interval", V, kTooling),
      na("--enable-ft-package", S, kTooling),
      na("--calc-ft-timeouts", S, kTooling),
      na("--ft-num-warmup-iters", V, kTooling),
      na("--inprocess-restart", S, kTooling),
      na("--inprocess-active-world-size", V, kTooling),
      na("--inprocess-barrier-timeout", V, kTooling),
      na("--inprocess-completion-timeout", V, kTooling),
      na("--inprocess-empty-cuda-cache", S, kTooling),
      na("--inprocess-granularity", V, kTooling),
      na("--inprocess-hard-timeout", V, kTooling),
      na("--inprocess-heartbeat-interval", V, kTooling),
      na("--inprocess-heartbeat-timeout", V, kTooling),
      na("--inprocess-last-call-wait", V, kTooling),
      na("--inprocess-max-iterations", V, kTooling),
      na("--inprocess-monitor-process-interval", V, kTooling),
      na("--inprocess-monitor-thread-interval", V, kTooling),
      na("--inprocess-progress-watchdog-interval", V, kTooling),
      na("--inprocess-soft-timeout", V, kTooling),
      na("--inprocess-termination-grace-time", V, kTooling),
      na("--disable-straggler-on-startup", S, kTooling),
      na("--straggler-ctrlr-port", V, kTooling),
      na("--straggler-minmax-count", V, kTooling),
      na("--run-workload-inspector-server", S, kTooling),
      na("--no-one-logger", S, kTooling),
      na("--one-logger-async", S, kTooling),
      na("--one-logger-project", V, kTooling),
      na("--one-logger-run-name", V, kTooling),
      na("--app-tag-run-name", V, kTooling),
      na("--app-tag-run-version", V, kTooling),

      //===--- Inference ---===//
      na("--inference-batch-times-seqlen-threshold", V, kInference),
      na("--inference-coordinator-port", V, kInference),
      na("--inference-dynamic-batching", S, kInference),
      na("--inference-dynamic-batching-block-size", V, kInference),
      na("--inference-dynamic-batching-buffer-size-gb", V, kInference),
      na("--inference-dynamic-batching-cuda-graph-max-tokens", V, kInference),
      na("--inference-dynamic-batching-cuda-graph-mixed-prefill-count", V, kInference),
      na("--inference-dynamic-batching-max-requests", V, kInference),
      na("--inference-dynamic-batching-max-tokens", V, kInference),
      na("--inference-dynamic-batching-num-cuda-graphs", V, kInference),
      na("--inference-dynamic-batching-paused-buffer-size-gb", V, kInference),
      na("--inference-dynamic-batching-track-paused-request-events", S, kInference),
      na("--inference-dynamic-batching-unified-memory-level", V, kInference),
      na("--inference-fuse-tp-communication", S, kInference),
      na("--inference-logging-step-interval", V, kInference),
      na("--inference-max-batch-size", V, kInference),
      na("--inference-max-requests", V, kInference),
      na("--inference-max-seq-length", V, kInference),
      na("--inference-wandb-logging", S, kInference),
      na("--no-inference-wandb-logging", S, kInference),
      na("--flash-decode", S, kInference),
      na("--max-tokens-to-oom", V, kInference),
      na("--mlp-chunks-for-prefill", V, kInference),
      na("--enable-chunked-prefill", S, kInference),
      na("--disable-chunked-prefill", S, kInference),
      na("--nccl-all-reduce-for-prefill", S, kInference),
      na("--cache-mla-latents", S, kInference),
      na("--decode-only-cuda-graphs", S, kInference),
      na("--use-legacy-static-engine", S, kInference),

      //===--- Reinforcement learning ---===//
      na("--grpo-clamp-eps-lower", V, kRl),
      na("--grpo-clamp-eps-upper", V, kRl),
      na("--grpo-entropy-term-weight", V, kRl),
      na("--grpo-filter-groups-with-same-reward", S, kRl),
      na("--grpo-group-size", V, kRl),
      na("--grpo-iterations", V, kRl),
      na("--grpo-kl-beta", V, kRl),
      na("--grpo-prompts-per-step", V, kRl),
      na("--langrl-env-config", V, kRl),
      na("--langrl-external-server", S, kRl),
      na("--no-langrl-external-server", S, kRl),
      na("--langrl-inference-server-conversation-template", V, kRl),
      na("--langrl-inference-server-type", V, kRl),
      na("--refit-method", V, kRl),
      na("--rl-default-temperature", V, kRlStep),
      na("--rl-default-top-k", V, kRlStep),
      na("--rl-default-top-p", V, kRlStep),
      na("--rl-importance-sampling-truncation-coef", V, kRlStep),
      na("--rl-inference-expert-model-parallel-size", V, kRlStep),
      na("--rl-inference-expert-tensor-model-parallel-size", V, kRlStep),
      na("--rl-inference-logprobs-is-correction", S, kRlStep),
      na("--no-rl-inference-logprobs-is-correction", S, kRlStep),
      na("--rl-inference-model-unified-memory-level", V, kRlStep),
      na("--rl-inference-pipeline-model-parallel-size", V, kRlStep),
      na("--rl-inference-tensor-model-parallel-size", V, kRlStep),
      na("--rl-offload-inference-model-weights-when-idle", S, kRlStep),
      na("--no-rl-offload-inference-model-weights-when-idle", S, kRlStep),
      na("--rl-offload-kv-cache-during-training", S, kRlStep),
      na("--no-rl-offload-kv-cache-during-training", S, kRlStep),
      na("--rl-offload-optimizer-during-inference", S, kRlStep),
      na("--rl-parallel-generation-tasks", V, kRlStep),
      na("--rl-partial-rollouts", S, kRlStep),
      na("--no-rl-partial-rollouts", S, kRlStep),
      na("--rl-prompts-per-eval", V, kRlStep),
      na("--rl-remove-kv-cache-during-training", S, kRlStep),
      na("--no-rl-remove-kv-cache-during-training", S, kRlStep),
      na("--rl-reset-cuda-graphs", S, kRlStep),
      na("--no-rl-reset-cuda-graphs", S, kRlStep),
      na("--rl-sequence-packing-algo", V, kRlStep),
      na("--rl-sequence-packing-max-sequences-per-bin", V, kRlStep),
      na("--rl-skip-bos-token", S, kRlStep),
      na("--no-rl-skip-bos-token", S, kRlStep),
      na("--rl-training-cuda-graphs", S, kRlStep),
      na("--no-rl-training-cuda-graphs", S, kRlStep),
      na("--rl-use-sequence-packing", S, kRlStep),
      na("--no-rl-use-sequence-packing", S, kRlStep),
      na("--rl-verify-model-weights-swap", S, kRlStep),
      na("--no-rl-verify-model-weights-swap", S, kRlStep),

      //===--- Other models' scripts ---===//
      na("--decoder-num-layers", V, kOtherModels),
      na("--decoder-seq-length", V, kOtherModels),
      na("--bert-embedder-type", V, kOtherModels),
      na("--bert-load", V, kOtherModels),
      na("--bert-no-binary-head", S, kOtherModels),
      na("--biencoder-projection-dim", V, kOtherModels),
      na("--biencoder-shared-query-context-model", S, kOtherModels),
      na("--block-data-path", V, kOtherModels),
      na("--classes-fraction", V, kOtherModels),
      na("--data-per-class-fraction", V, kOtherModels),
      na("--dino-bottleneck-size", V, kOtherModels),
      na("--dino-freeze-last-layer", V, kOtherModels),
      na("--dino-head-hidden-size", V, kOtherModels),
      na("--dino-local-crops-number", V, kOtherModels),
      na("--dino-local-img-size", V, kOtherModels),
      na("--dino-norm-last-layer", S, kOtherModels),
      na("--dino-teacher-temp", V, kOtherModels),
      na("--dino-warmup-teacher-temp", V, kOtherModels),
      na("--dino-warmup-teacher-temp-epochs", V, kOtherModels),
      na("--embedding-path", V, kOtherModels),
      na("--evidence-data-path", V, kOtherModels),
      na("--ict-head-size", V, kOtherModels),
      na("--ict-load", V, kOtherModels),
      na("--img-h", V, kOtherModels),
      na("--img-w", V, kOtherModels),
      na("--indexer-batch-size", V, kOtherModels),
      na("--indexer-log-interval", V, kOtherModels),
      na("--iter-per-epoch", V, kOtherModels),
      na("--mask-factor", V, kOtherModels),
      na("--mask-prob", V, kOtherModels),
      na("--mask-type", V, kOtherModels),
      na("--no-data-sharding", S, kOtherModels),
      na("--num-channels", V, kOtherModels),
      na("--num-classes", V, kOtherModels),
      na("--output-bert-embeddings", S, kOtherModels),
      na("--patch-dim", V, kOtherModels),
      na("--query-in-block-prob", V, kOtherModels),
      na("--retriever-report-topk-accuracies", VS, kOtherModels),
      na("--retriever-score-scaling", S, kOtherModels),
      na("--sample-rate", V, kOtherModels),
      na("--short-seq-prob", V, kOtherModels),
      na("--swin-backbone-type", V, kOtherModels),
      na("--titles-data-path", V, kOtherModels),
      na("--use-one-sent-docs", S, kOtherModels),
      na("--vision-backbone-type", V, kOtherModels),
      na("--vision-pretraining", S, kOtherModels),
      na("--vision-pretraining-type", V, kOtherModels),

      //===--- Post-training (ModelOpt) scripts ---===//
      post(refuse("--export-model-type", V,
                  "a ModelOpt post-training flag; mt imports pretraining command lines: "
                  "remove it")),
      post(refuse("--export-legacy-megatron", S,
                  "a ModelOpt export flag; mt imports pretraining command lines: remove it")),
      post(refuse("--export-te-mcore-model", S,
                  "a ModelOpt export flag; mt imports pretraining command lines: remove it")),
      post(na("--export-force-local-attention", S, kKernels)),
      post(refuse("--export-kv-cache-quant", V, kQuant)),
      post(refuse("--export-real-quant-cfg", V, kQuant)),
      post(refuse("--export-quant-cfg", V, kQuant)),
      post(refuse("--export-kd-teacher-load", V,
                  "knowledge distillation is not implemented in mt; remove it")),
      post(refuse("--export-kd-teacher-model-config", V,
                  "knowledge distillation is not implemented in mt; remove it")),
      post(refuse("--export-kd-teacher-ckpt-format", V,
                  "knowledge distillation is not implemented in mt; remove it")),
      post(refuse("--export-kd-cfg", V,
                  "knowledge distillation is not implemented in mt; remove it")),
      post(refuse("--finetune-hf-dataset", V,
                  "mt reads Megatron's .bin/.idx datasets, not Hugging Face datasets; "
                  "give --data-path")),
      post(refuse("--finetune-data-split", V,
                  "mt reads Megatron's .bin/.idx datasets, not Hugging Face datasets; "
                  "give --data-path and --split")),
      post(refuse("--export-qk-l2-norm", S,
                  "L2 normalization of queries and keys is not implemented in mt; "
                  "remove it")),
      post(refuse("--export-offline-model", S,
                  "a model without decoder layers (speculative decoding) is not "
                  "implemented in mt; remove it")),
      post(refuse("--modelopt-enabled", S,
                  "ModelOpt checkpoints are not implemented in mt; remove it")),
  };
  for (MegatronFlag &f : t)
    if (f.text == kFp8)
      f.family = FlagFamily::Fp8;
  return t;
}

// The key table's flag for a key when it is a plain `--name`.
bool plainFlag(const char *flag) {
  if (!flag || flag[0] != '-' || flag[1] != '-')
    return false;
  for (const char *p = flag + 2; *p; ++p)
    if (!std::islower(static_cast<unsigned char>(*p)) &&
        !std::isdigit(static_cast<unsigned char>(*p)) && *p != '-')
      return false;
  return true;
}

std::vector<MegatronFlag> buildTable() {
  std::vector<MegatronFlag> t = explicitRows();
  for (const KeyInfo &k : specKeys()) {
    if (!plainFlag(k.megatronFlag))
      continue;
    MegatronFlag f;
    f.flag = k.megatronFlag;
    f.arity = k.type == KeyType::Bool                                   ? FlagArity::Switch
              : k.type == KeyType::DataPath || k.type == KeyType::IntList ||
                      k.type == KeyType::StringList
                  ? FlagArity::Values
                  : FlagArity::Value;
    // argparse's nargs='+' for a key holding one value: the translation
    // takes one word and refuses more (MegatronImport.cpp).
    if (f.flag == "--moe-router-load-balancing-type" || f.flag == "--moe-aux-loss-coeff")
      f.arity = FlagArity::Values;
    f.status = FlagStatus::Implemented;
    f.text = std::string(k.section) + "." + k.name;
    f.fromKeyTable = true;
    t.push_back(f);
  }
  // Duplicates stay (adjacent) so that the test can name both rows.
  std::stable_sort(t.begin(), t.end(), [](const MegatronFlag &a, const MegatronFlag &b) {
    return a.flag < b.flag;
  });
  return t;
}

std::optional<double> number(const std::string &s) {
  if (s.empty())
    return std::nullopt;
  errno = 0;
  char *end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v))
    return std::nullopt;
  return v;
}

} // namespace

const std::vector<MegatronFlag> &megatronFlags() {
  static const std::vector<MegatronFlag> table = buildTable();
  return table;
}

const MegatronFlag *findMegatronFlag(const std::string &flag) {
  const std::vector<MegatronFlag> &t = megatronFlags();
  auto it = std::lower_bound(t.begin(), t.end(), flag,
                             [](const MegatronFlag &f, const std::string &s) {
                               return f.flag < s;
                             });
  return it != t.end() && it->flag == flag ? &*it : nullptr;
}

bool acceptsOnlyValue(const MegatronFlag &row, const std::string &value) {
  if (row.onlyValue.empty())
    return false;
  std::optional<double> a = number(row.onlyValue), b = number(value);
  if (a && b)
    return *a == *b;
  return row.onlyValue == value;
}

const char *flagStatusName(FlagStatus s) {
  switch (s) {
  case FlagStatus::Implemented:
    return "implemented";
  case FlagStatus::Mtrun:
    return "mtrun's";
  case FlagStatus::NotApplicable:
    return "not applicable";
  case FlagStatus::Refused:
    return "refused";
  }
  return "";
}

const char *flagArityName(FlagArity a) {
  switch (a) {
  case FlagArity::Switch:
    return "switch";
  case FlagArity::Value:
    return "value";
  case FlagArity::Values:
    return "values";
  }
  return "";
}

std::string renderMegatronFlagsMarkdown() {
  const std::vector<MegatronFlag> &t = megatronFlags();
  std::map<std::string, int> count;
  for (const MegatronFlag &f : t)
    ++count[f.status == FlagStatus::Refused && !f.onlyValue.empty()
                ? "refused except for one value"
                : flagStatusName(f.status)];
  std::ostringstream os;
  os << t.size() << " flags of Megatron-LM " << kMegatronRelease << ": ";
  const char *order[] = {"implemented", "mtrun's", "not applicable",
                         "refused except for one value", "refused"};
  for (size_t i = 0; i < 5; ++i)
    os << (i ? ", " : "") << count[order[i]] << " " << order[i];
  os << ".\n\n";
  os << "| flag | status | what mt does |\n";
  os << "|---|---|---|\n";
  for (const MegatronFlag &f : t) {
    std::string name = "`" + f.flag + "`";
    if (f.arity != FlagArity::Switch)
      name += f.arity == FlagArity::Value ? " X" : " X...";
    std::string status = flagStatusName(f.status), what;
    switch (f.status) {
    case FlagStatus::Implemented:
      what = f.fromKeyTable ? "sets `" + f.text + "`" : f.text;
      break;
    case FlagStatus::Mtrun:
      what = "give `mtrun " + f.text + "`; import prints the mtrun command line and "
             "writes it at the top of the spec";
      break;
    case FlagStatus::NotApplicable:
      what = f.text;
      break;
    case FlagStatus::Refused:
      if (!f.onlyValue.empty()) {
        status = "refused except `" + f.onlyValue + "`";
        what = "`" + f.flag + " " + f.onlyValue + "` is accepted: " + f.onlyWhy +
               ". Other values: " + f.text;
      } else {
        what = f.text;
      }
      break;
    }
    if (f.source == "post-training")
      what += " (a flag of Megatron's post-training scripts)";
    // Table cells: a `|` would split the cell.
    for (size_t p = what.find('|'); p != std::string::npos; p = what.find('|', p + 2))
      what.replace(p, 1, "\\|");
    os << "| " << name << " | " << status << " | " << what << " |\n";
  }
  return os.str();
}

//===----------------------------------------------------------------------===//
// Key-table lookups for the translation
//===----------------------------------------------------------------------===//

namespace megatron {

namespace {

// Keys that need more than the key table to translate.
bool isSpecialKey(const KeyInfo &k) {
  std::string key = std::string(k.section) + "." + k.name;
  return key == "model.add_bias_linear" || key == "training.precision" ||
         key == "parallel.virtual_pipeline_model_parallel_size" ||
         key == "parallel.data_parallel_size" || key == "data.data_path" ||
         key == "model.num_query_groups" || key == "data.tokenizer_type" ||
         key == "data.tokenizer_hf_include_special_tokens";
}

} // namespace

const KeyInfo *keyForFlag(const std::string &flag) {
  for (const KeyInfo &k : specKeys())
    if (plainFlag(k.megatronFlag) && flag == k.megatronFlag && !isSpecialKey(k))
      return &k;
  return nullptr;
}

const KeyInfo &key(const char *section, const char *name) {
  const KeyInfo *k = findKey(section, name);
  if (!k) {
    std::cerr << "mtc: internal error: spec key " << section << "." << name
              << " is missing from the key table\n";
    std::abort();
  }
  return *k;
}

std::string flagOf(const KeyInfo &k) {
  return plainFlag(k.megatronFlag) ? k.megatronFlag : "";
}

const Switch *findSwitch(const std::string &flag) {
  static const Switch switches[] = {
      {"--disable-bias-linear", "model", "add_bias_linear", "false"},
      {"--use-rotary-position-embeddings", "model", "position_embedding_type", "\"rope\""},
      {"--recompute-activations", "parallel", "recompute_granularity", "\"selective\""},
  };
  for (const Switch &sw : switches)
    if (flag == sw.flag)
      return &sw;
  return nullptr;
}

} // namespace megatron

} // namespace mt::spec
