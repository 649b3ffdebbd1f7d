// mt-checkpoint: look into training checkpoints, export them to Hugging
// Face transformers and start them from it (runtime/ckpt/checkpoint_tool.h).
// The spec's parser (spec/, no MLIR or LLVM) reads the model a checkpoint
// or plan records, and its Hugging Face import reads config.json.
#include "runtime/ckpt/checkpoint_tool.h"
#include "spec/HfImport.h"
#include "spec/Spec.h"

#include <fstream>
#include <sstream>

#include <string>
#include <vector>

namespace {

std::string read_model(const std::string &toml, const std::string &source,
                       mt::rt::HfModelSpec *out) {
  absl::StatusOr<mt::spec::Spec> spec = mt::spec::parseSpecString(toml, source);
  if (!spec.ok())
    return std::string(spec.status().message());
  const mt::spec::ModelConfig &m = spec->model;
  mt::rt::HfModelSpec &h = *out;
  h.num_layers = m.num_layers;
  h.hidden_size = m.hidden_size;
  h.ffn_hidden_size = m.ffn_hidden_size;
  h.num_attention_heads = m.num_attention_heads;
  h.num_query_groups = m.num_query_groups;
  h.kv_channels = m.kv_channels;
  h.max_position_embeddings = m.max_position_embeddings;
  h.vocab_size = m.vocab_size;
  h.padded_vocab_size = spec->paddedVocabSize();
  h.rope = m.position_embedding_type == mt::spec::PositionEmbedding::Rope;
  h.rotary_base = m.rotary_base;
  h.use_rope_scaling = m.use_rope_scaling;
  h.rope_scaling_factor = m.rope_scaling_factor;
  h.rmsnorm = m.normalization == mt::spec::Normalization::RMSNorm;
  h.norm_epsilon = m.norm_epsilon;
  h.apply_layernorm_1p = m.apply_layernorm_1p;
  h.swiglu = m.swiglu;
  h.num_experts = m.num_experts;
  h.moe_ffn_hidden_size = m.moe_ffn_hidden_size;
  h.moe_router_topk = m.moe_router_topk;
  h.moe_router_load_balancing_type = mt::spec::toString(m.moe_router_load_balancing_type);
  h.moe_aux_loss_coeff = m.moe_aux_loss_coeff;
  h.moe_z_loss_coeff = m.moe_z_loss_coeff;
  h.moe_router_score_function = mt::spec::toString(m.moe_router_score_function);
  h.moe_router_pre_softmax = m.moe_router_pre_softmax;
  h.moe_router_topk_scaling_factor = m.moe_router_topk_scaling_factor;
  h.moe_expert_capacity_factor = m.moe_expert_capacity_factor;
  h.moe_layers = m.moe_layers;
  h.moe_shared_expert_intermediate_size = m.moe_shared_expert_intermediate_size;
  h.untie_embeddings_and_output_weights = m.untie_embeddings_and_output_weights;
  h.add_bias_linear = m.add_bias_linear;
  h.hidden_dropout = m.hidden_dropout;
  h.attention_dropout = m.attention_dropout;
  h.init_method_std = m.init_method_std;
  h.eod_id = spec->data.eod_id;
  h.tokenizer_type = spec->data.tokenizer_type;
  h.vocab_file = spec->data.vocab_file;
  h.merge_file = spec->data.merge_file;
  h.tokenizer_model = spec->data.tokenizer_model;
  return "";
}

// config.json through `mtc import-hf`'s reader, then the spec's parser.
std::string read_config(const std::string &dir, mt::rt::HfModelSpec *out) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return path + ": error: cannot read it; a Hugging Face model folder holds config.json";
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<mt::spec::HfImportResult> r = mt::spec::importHfConfig(text.str(), path, dir);
  if (!r.ok())
    return std::string(r.status().message());
  return read_model(r->toml, path + " (imported)", out);
}

} // namespace

int main(int argc, char **argv) {
  return mt::rt::run_mt_checkpoint(std::vector<std::string>(argv + 1, argv + argc), read_model,
                                   read_config);
}
