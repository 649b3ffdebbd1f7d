// The analytic parameter count against published model sizes and a case
// worked by hand.
#include <gtest/gtest.h>

#include "spec/Spec.h"

namespace mt::spec {
namespace {

ModelConfig gpt2Small() {
  ModelConfig m;
  m.num_layers = 12;
  m.hidden_size = 768;
  m.ffn_hidden_size = 3072;
  m.num_attention_heads = 12;
  m.num_query_groups = 12;
  m.kv_channels = 64;
  m.seq_length = 1024;
  m.max_position_embeddings = 1024;
  m.vocab_size = 50257;
  m.make_vocab_size_divisible_by = 1;
  return m;
}

TEST(ParamCount, Gpt2SmallMatchesPublishedSize) {
  ParamCount c = countParameters(gpt2Small(), 50257);
  EXPECT_EQ(c.word_embeddings, 50257 * 768);
  EXPECT_EQ(c.position_embeddings, 1024 * 768);
  // QKV 768x2304 + 2304, projection 768x768 + 768.
  EXPECT_EQ(c.per_layer_attention, 768 * 2304 + 2304 + 768 * 768 + 768);
  // FC1 768x3072 + 3072, FC2 3072x768 + 768.
  EXPECT_EQ(c.per_layer_mlp, 768 * 3072 + 3072 + 3072 * 768 + 768);
  EXPECT_EQ(c.per_layer_norms, 2 * 2 * 768);
  EXPECT_EQ(c.final_norm, 2 * 768);
  EXPECT_EQ(c.output_layer, 0);
  EXPECT_EQ(c.total(12), 124439808);
}

TEST(ParamCount, Gpt2SmallFromSpecFile) {
  auto s = parseSpecString("[model]\nnum_layers = 12\nhidden_size = 768\n"
                           "num_attention_heads = 12\nseq_length = 1024\n"
                           "vocab_size = 50257\nmake_vocab_size_divisible_by = 1\n"
                           "[training]\nmicro_batch_size = 1\ntrain_iters = 1\nlr = 6e-4\n",
                           "gpt2.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(countParameters(s->model, s->paddedVocabSize()).total(12), 124439808);
  // Megatron's default padding to 128 adds (50304 - 50257) * 768.
  s->model.make_vocab_size_divisible_by = 128;
  EXPECT_EQ(countParameters(s->model, s->paddedVocabSize()).total(12),
            124439808 + (50304 - 50257) * 768);
}

TEST(ParamCount, Llama3_8B) {
  ModelConfig m;
  m.num_layers = 32;
  m.hidden_size = 4096;
  m.ffn_hidden_size = 14336;
  m.num_attention_heads = 32;
  m.num_query_groups = 8;
  m.kv_channels = 128;
  m.seq_length = 8192;
  m.max_position_embeddings = 8192;
  m.vocab_size = 128256;
  m.position_embedding_type = PositionEmbedding::Rope;
  m.normalization = Normalization::RMSNorm;
  m.swiglu = true;
  m.untie_embeddings_and_output_weights = true;
  m.add_bias_linear = false;
  ParamCount c = countParameters(m, 128256);
  EXPECT_EQ(c.position_embeddings, 0);
  EXPECT_EQ(c.per_layer_attention, 4096 * (4096 + 2 * 8 * 128) + 4096 * 4096);
  EXPECT_EQ(c.per_layer_mlp, 4096 * 14336 * 2 + 14336 * 4096);
  EXPECT_EQ(c.per_layer_norms, 2 * 4096);
  EXPECT_EQ(c.final_norm, 4096);
  EXPECT_EQ(c.output_layer, 128256 * 4096);
  EXPECT_EQ(c.total(32), 8030261248LL);
}

// Mixtral 8x7B (Megatron's examples/mixtral: Llama-2's 32000 tokens, h 4096,
// 32 layers of 8 SwiGLU experts of 14336, top-2, untied, RMSNorm, no biases):
// 46,702,792,704 parameters as Hugging Face's MixtralForCausalLM counts them,
// 12.88B of them used per token.
TEST(ParamCount, Mixtral8x7B) {
  ModelConfig m;
  m.num_layers = 32;
  m.hidden_size = 4096;
  m.ffn_hidden_size = 14336;
  m.num_attention_heads = 32;
  m.num_query_groups = 8;
  m.kv_channels = 128;
  m.position_embedding_type = PositionEmbedding::Rope;
  m.normalization = Normalization::RMSNorm;
  m.swiglu = true;
  m.untie_embeddings_and_output_weights = true;
  m.add_bias_linear = false;
  m.num_experts = 8;
  m.moe_ffn_hidden_size = 14336;
  m.moe_router_topk = 2;
  m.moe_layers.assign(32, true);
  ParamCount c = countParameters(m, 32000);
  const int64_t expert = 3LL * 4096 * 14336; // gate, up and down projections
  EXPECT_EQ(c.moe_layers, 32);
  EXPECT_EQ(c.per_moe_layer_router, 8 * 4096);
  EXPECT_EQ(c.per_moe_layer_experts, 8 * expert);
  EXPECT_EQ(c.per_moe_layer_active_experts, 2 * expert);
  EXPECT_EQ(c.per_moe_layer_shared, 0);
  EXPECT_EQ(c.total(32), 46702792704LL);
  // By hand: embeddings and output 2 * 32000 * 4096, final norm 4096, and per
  // layer attention 4096 * 6144 + 4096 * 4096, norms 2 * 4096, router 8 * 4096.
  const int64_t outside = 2LL * 32000 * 4096 + 4096 +
                          32LL * (4096LL * 6144 + 4096LL * 4096 + 2 * 4096 + 8 * 4096);
  EXPECT_EQ(c.total(32), outside + 32 * 8 * expert);
  EXPECT_EQ(c.active(32), outside + 32 * 2 * expert);
  EXPECT_EQ(c.active(32), 12879925248LL);
  // Every other layer dense: those hold the dense MLP of ffn_hidden_size.
  m.moe_layers.assign(32, false);
  for (size_t i = 0; i < 32; i += 2)
    m.moe_layers[i] = true;
  ParamCount half = countParameters(m, 32000);
  EXPECT_EQ(half.total(32), outside + 16 * 8 * expert + 16 * (expert - 8 * 4096));
  // A shared expert counts in both.
  m.moe_shared_expert_intermediate_size = 1024;
  ParamCount shared = countParameters(m, 32000);
  EXPECT_EQ(shared.total(32) - half.total(32), 16LL * 3 * 4096 * 1024);
  EXPECT_EQ(shared.active(32) - half.active(32), 16LL * 3 * 4096 * 1024);
  // A dense model's active count is its total.
  ModelConfig dense = m;
  dense.num_experts = 0;
  dense.moe_layers.clear();
  ParamCount d = countParameters(dense, 32000);
  EXPECT_EQ(d.active(32), d.total(32));
}

// h 64, 8 heads of 8 channels, 2 query groups, SwiGLU ffn 128, vocab 1000
// padded to 1024, RoPE, RMSNorm, untied, 2 layers:
//   embeddings 1024*64 = 65536, output 65536
//   attention  64*(64 + 2*2*8) + 64*64 = 6144 + 4096 = 10240
//   mlp        64*(2*128) + 128*64 = 16384 + 8192 = 24576
//   norms      2*64 = 128; final 64
//   total      65536 + 2*(10240 + 24576 + 128) + 64 + 65536 = 201024
ModelConfig smallGqaSwiglu() {
  ModelConfig m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.ffn_hidden_size = 128;
  m.num_attention_heads = 8;
  m.num_query_groups = 2;
  m.kv_channels = 8;
  m.seq_length = 32;
  m.max_position_embeddings = 32;
  m.vocab_size = 1000;
  m.position_embedding_type = PositionEmbedding::Rope;
  m.normalization = Normalization::RMSNorm;
  m.swiglu = true;
  m.untie_embeddings_and_output_weights = true;
  m.add_bias_linear = false;
  return m;
}

TEST(ParamCount, SmallGqaSwigluByHand) {
  ParamCount c = countParameters(smallGqaSwiglu(), 1024);
  EXPECT_EQ(c.word_embeddings, 65536);
  EXPECT_EQ(c.per_layer_attention, 10240);
  EXPECT_EQ(c.per_layer_mlp, 24576);
  EXPECT_EQ(c.per_layer_norms, 128);
  EXPECT_EQ(c.final_norm, 64);
  EXPECT_EQ(c.output_layer, 65536);
  EXPECT_EQ(c.perLayer(), 34944);
  EXPECT_EQ(c.total(2), 201024);
}

TEST(ParamCount, BiasesAndLayerNorm) {
  ModelConfig m = smallGqaSwiglu();
  m.add_bias_linear = true;
  m.normalization = Normalization::LayerNorm;
  ParamCount c = countParameters(m, 1024);
  // Biases: QKV 96, projection 64, FC1 2*128, FC2 64.
  EXPECT_EQ(c.per_layer_attention, 10240 + 96 + 64);
  EXPECT_EQ(c.per_layer_mlp, 24576 + 256 + 64);
  // LayerNorm has a weight and a bias.
  EXPECT_EQ(c.per_layer_norms, 2 * 2 * 64);
  EXPECT_EQ(c.final_norm, 2 * 64);
}

TEST(ParamCount, LearnedPositionsAndTying) {
  ModelConfig m = smallGqaSwiglu();
  m.position_embedding_type = PositionEmbedding::LearnedAbsolute;
  m.max_position_embeddings = 48;
  m.untie_embeddings_and_output_weights = false;
  ParamCount c = countParameters(m, 1024);
  EXPECT_EQ(c.position_embeddings, 48 * 64);
  EXPECT_EQ(c.output_layer, 0);
  EXPECT_EQ(c.total(2), 65536 + 48 * 64 + 2 * 34944 + 64);
}

} // namespace
} // namespace mt::spec
