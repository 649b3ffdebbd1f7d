// The one table of how mt's tensors (Megatron-Core's names and layouts)
// correspond to transformers' GPT2LMHeadModel, LlamaForCausalLM and
// MixtralForCausalLM: the
// export (`mt-checkpoint to-hf`, hf_export.h) reads it one way, the import
// (`mt-checkpoint from-hf`, hf_import.h) the other. docs/checkpoints.md,
// "Weight layouts", has it as a table.
//
// Each mt tensor is one entry; each of its Hugging Face tensors is a piece
// made of row ranges of the mt tensor (dimension 0), in Hugging Face's
// order, optionally transposed (GPT-2's Conv1D layers store [in, out]):
//   linear_qkv   per query group g: its heads/groups query heads, one key
//                head, one value head (each kv_channels rows); Llama:
//                q_proj, k_proj, v_proj (heads in order); GPT-2: c_attn,
//                [q | k | v] along its output, transposed
//   linear_fc1   SwiGLU: rows [0, ffn) the gate (SiLU'd), [ffn, 2 ffn) the
//                up projection: gate_proj, up_proj; GPT-2: c_fc transposed
//   linear_proj, linear_fc2   o_proj, down_proj; GPT-2: c_proj transposed
//   mixture of experts (Mixtral): router -> block_sparse_moe.gate; the
//                stacked experts.linear_fc1 [E, 2 ffn, H] taken as E x 2 ffn
//                rows: expert e's gate rows are w1, its up rows w3; the
//                stacked experts.linear_fc2 [E, H, ffn] as E x H rows:
//                expert e's are w2
//   norms        apply_layernorm_1p's w is 1 + w in Hugging Face's
//   embeddings   the first rows of the padded vocabulary (the padding is
//                mt's alone)
// GPT-2 has biases in every layer: with add_bias_linear = false they are
// entries without an mt tensor, zero in Hugging Face's.
// RoPE needs no permutation: mt rotates (x[j], x[j + d/2]) pairs, the
// rotate_half form of HF's Llama.
#ifndef MT_RUNTIME_HF_MAPPING_H
#define MT_RUNTIME_HF_MAPPING_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mt::rt {

// The architecture, from the spec's [model] (names as its keys).
struct HfModelSpec {
  int64_t num_layers = 0, hidden_size = 0, ffn_hidden_size = 0;
  int64_t num_attention_heads = 0, num_query_groups = 0, kv_channels = 0;
  int64_t max_position_embeddings = 0;
  int64_t vocab_size = 0;        // the tokenizer's
  int64_t padded_vocab_size = 0; // the embedding's rows
  bool rope = false;             // position_embedding_type = "rope"
  int64_t rotary_base = 10000;
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  bool rmsnorm = false; // normalization = "RMSNorm"
  double norm_epsilon = 1e-5;
  bool apply_layernorm_1p = false;
  bool swiglu = false;
  // A mixture of experts (num_experts > 0; MixtralForCausalLM), names as
  // the spec's keys; the ones Mixtral cannot express are refused.
  int64_t num_experts = 0;
  int64_t moe_ffn_hidden_size = 0; // resolved
  int64_t moe_router_topk = 2;
  std::string moe_router_load_balancing_type = "aux_loss";
  double moe_aux_loss_coeff = 0.0, moe_z_loss_coeff = 0.0;
  std::string moe_router_score_function = "softmax";
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = 0.0;
  double moe_expert_capacity_factor = 0.0;
  std::vector<bool> moe_layers; // resolved moe_layer_freq: true = an MoE layer
  int64_t moe_shared_expert_intermediate_size = 0;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;
  double hidden_dropout = 0.0, attention_dropout = 0.0;
  double init_method_std = 0.02;
  int64_t eod_id = -1; // the tokenizer's end of document: bos and eos
  // The tokenizer, as the spec's [data] names it (paths as written there).
  std::string tokenizer_type;  // "GPT2BPETokenizer", "HuggingFaceTokenizer", ...
  std::string vocab_file, merge_file, tokenizer_model;
};

// "gpt2", "llama" or "mixtral" for `m`, or "" with *error naming the spec
// key that no Hugging Face class here can express.
std::string hf_architecture(const HfModelSpec &m, std::string *error);

// The transformers class of hf_architecture's name: "GPT2LMHeadModel",
// "LlamaForCausalLM", "MixtralForCausalLM".
std::string hf_class_name(const std::string &arch);

// One Hugging Face tensor: rows of its entry's mt tensor.
struct HfPiece {
  std::string name;                                 // "model.layers.0.self_attn.q_proj.weight"
  std::vector<std::pair<int64_t, int64_t>> rows;    // [begin, end) of mt's rows, in HF's order
  bool transpose = false;                           // a Conv1D: HF holds [cols, rows]
  std::vector<int64_t> shape;                       // HF's shape
  // What makes each dimension, in mt's order (rows, then columns), for
  // errors: "model.hidden_size = 32".
  std::vector<std::string> dim_keys;
  int64_t row_count() const;
};

struct HfMapEntry {
  std::string mt_name;           // "" for GPT-2's biases mt does not have (zero in HF's)
  // Whole (the embedding: the padded vocabulary). A stacked expert tensor
  // [E, rows, cols]: its pieces' rows count through the experts (e x rows + r).
  std::vector<int64_t> mt_shape;
  bool one_plus = false;         // apply_layernorm_1p: HF holds 1 + w
  bool vocab = false;            // rows past the pieces' are the vocabulary's padding
  std::vector<HfPiece> pieces;
};

// The table for `m` as `arch` (hf_architecture's).
// vocab_rows: the rows of Hugging Face's embedding (and output layer), at
// most m.padded_vocab_size.
std::vector<HfMapEntry> hf_mapping(const HfModelSpec &m, const std::string &arch,
                                   int64_t vocab_rows);

// The module prefix transformers drops when a checkpoint holds the base
// model alone (GPT2Model's "h.0...", LlamaModel's "layers.0..."):
// "transformer." or "model.".
std::string hf_base_prefix(const std::string &arch);

// f32 to bf16 / f16 bits, rounding to nearest even (NaN stays NaN; fp16
// overflow gives infinity).
uint16_t f32_to_bf16(float x);
uint16_t f32_to_f16(float x);
// bf16 / f16 bits to f32 (exact).
float bf16_to_f32(uint16_t bits);
float f16_to_f32(uint16_t bits);

} // namespace mt::rt

#endif // MT_RUNTIME_HF_MAPPING_H
