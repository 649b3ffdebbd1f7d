// The mixture-of-experts keys: defaults, moe_layer_freq in each of Megatron's
// forms (checked against the lists Python's eval gives for the same
// expressions), the rules, the import's translation and the echo round trip.
#include <gtest/gtest.h>

#include <algorithm>

#include "spec/MegatronImport.h"
#include "spec/Spec.h"
#include "spec/SpecKeys.h"

namespace mt::spec {
namespace {

std::string moeSpec(const std::string &extraModel, int layers = 12,
                    const std::string &extraParallel = "") {
  return "[model]\nnum_layers = " + std::to_string(layers) +
         "\nhidden_size = 64\nnum_attention_heads = 4\nseq_length = 32\n"
         "vocab_size = 100\nswiglu = true\nadd_bias_linear = false\nnum_experts = 4\n" +
         extraModel + "\n[training]\nmicro_batch_size = 2\ntrain_iters = 10\nlr = 1e-3\n" +
         (extraParallel.empty() ? "" : "\n[parallel]\n" + extraParallel);
}

Spec parseOk(const std::string &text) {
  auto s = parseSpecString(text, "spec.toml");
  EXPECT_TRUE(s.ok()) << s.status() << "\n" << text;
  return s.ok() ? *s : Spec{};
}

std::string parseError(const std::string &text) {
  auto s = parseSpecString(text, "spec.toml");
  EXPECT_FALSE(s.ok()) << text;
  return s.ok() ? "" : std::string(s.status().message());
}

// "101..." for the resolved MoE layers.
std::string layers(const Spec &s) {
  std::string r;
  for (bool b : s.model.moe_layers)
    r += b ? '1' : '0';
  return r;
}

TEST(SpecMoe, DenseByDefault) {
  Spec s = parseOk(R"([model]
num_layers = 2
hidden_size = 64
num_attention_heads = 4
seq_length = 32
vocab_size = 100
[training]
micro_batch_size = 2
train_iters = 10
lr = 1e-3
)");
  EXPECT_EQ(s.model.num_experts, 0);
  EXPECT_TRUE(s.model.moe_layers.empty());
  EXPECT_FALSE(s.model.isMoeLayer(0));
  EXPECT_EQ(s.model.numMoeLayers(), 0);
  EXPECT_EQ(s.parallel.expert_model_parallel_size, 1);
  EXPECT_EQ(s.parallel.expert_tensor_parallel_size, 1); // tp
}

TEST(SpecMoe, MegatronDefaults) {
  Spec s = parseOk(moeSpec(""));
  const ModelConfig &m = s.model;
  EXPECT_EQ(m.num_experts, 4);
  // swiglu's default FFN (int(4 * 64 * 2 / 3 / 64) * 64 = 128), Megatron's
  // moe_ffn_hidden_size default.
  EXPECT_EQ(m.ffn_hidden_size, 128);
  EXPECT_EQ(m.moe_ffn_hidden_size, 128);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_router_load_balancing_type, MoeLoadBalancing::AuxLoss);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.0);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.0);
  EXPECT_EQ(m.moe_router_score_function, MoeScoreFunction::Softmax);
  EXPECT_FALSE(m.moe_router_pre_softmax);
  EXPECT_EQ(m.moe_router_topk_scaling_factor, 0.0);
  EXPECT_EQ(m.moe_expert_capacity_factor, 0.0);
  EXPECT_FALSE(m.moe_pad_expert_input_to_capacity);
  EXPECT_EQ(m.moe_token_drop_policy, MoeTokenDropPolicy::Probs);
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 0);
  EXPECT_FALSE(m.moe_grouped_gemm);
  EXPECT_EQ(m.moe_router_dtype, MoeRouterDtype::None);
  EXPECT_EQ(layers(s), "111111111111"); // moe_layer_freq = 1
  EXPECT_EQ(m.numMoeLayers(), 12);
  EXPECT_TRUE(m.isMoeLayer(11));
  EXPECT_FALSE(m.isMoeLayer(12));
  EXPECT_EQ(s.parallel.expert_model_parallel_size, 1);
  EXPECT_EQ(s.parallel.expert_tensor_parallel_size, 1);
  EXPECT_EQ(s.parallel.moe_token_dispatcher_type, MoeTokenDispatcher::AllGather);
}

TEST(SpecMoe, EveryKeyIsRead) {
  Spec s = parseOk(moeSpec(R"(moe_ffn_hidden_size = 96
moe_router_topk = 3
moe_router_load_balancing_type = "seq_aux_loss"
moe_aux_loss_coeff = 0.01
moe_z_loss_coeff = 0.001
moe_router_score_function = "sigmoid"
moe_router_topk_scaling_factor = 2.5
moe_expert_capacity_factor = 1.25
moe_pad_expert_input_to_capacity = true
moe_token_drop_policy = "position"
moe_shared_expert_intermediate_size = 32
moe_grouped_gemm = true
moe_router_dtype = "fp64"
)",
                           12, "data_parallel_size = 2\nmoe_token_dispatcher_type = \"alltoall\"\n"));
  const ModelConfig &m = s.model;
  EXPECT_EQ(m.moe_ffn_hidden_size, 96);
  EXPECT_EQ(m.moe_router_topk, 3);
  EXPECT_EQ(m.moe_router_load_balancing_type, MoeLoadBalancing::SeqAuxLoss);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.001);
  EXPECT_EQ(m.moe_router_score_function, MoeScoreFunction::Sigmoid);
  EXPECT_EQ(m.moe_router_topk_scaling_factor, 2.5);
  EXPECT_EQ(m.moe_expert_capacity_factor, 1.25);
  EXPECT_TRUE(m.moe_pad_expert_input_to_capacity);
  EXPECT_EQ(m.moe_token_drop_policy, MoeTokenDropPolicy::Position);
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 32);
  EXPECT_TRUE(m.moe_grouped_gemm);
  EXPECT_EQ(m.moe_router_dtype, MoeRouterDtype::FP64);
  EXPECT_EQ(s.parallel.moe_token_dispatcher_type, MoeTokenDispatcher::AllToAll);
  // The echo holds every value and reads back as the same spec.
  std::string echo = toToml(s);
  auto again = parseSpecString(echo, "spec.toml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << echo;
  EXPECT_EQ(toToml(*again), echo);
  EXPECT_NE(echo.find("moe_router_dtype = \"fp64\""), std::string::npos) << echo;
  EXPECT_NE(echo.find("moe_token_drop_policy = \"position\""), std::string::npos) << echo;
}

// The expected lists are what Python's eval gives for Megatron's examples.
TEST(SpecMoe, LayerFreqForms) {
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = 2\n"))), "101010101010");
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = 5\n"))), "100001000010");
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = 100\n"))), "100000000000");
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = \"3\"\n"))), "100100100100");
  // eval("([1]*3+[0]*1)*3") == [1,1,1,0,1,1,1,0,1,1,1,0]
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = \"([1]*3+[0]*1)*3\"\n"))),
            "111011101110");
  // eval("([1]*3+[0]*2)*2") == [1,1,1,0,0,1,1,1,0,0]
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = \"([1]*3+[0]*2)*2\"\n", 10))),
            "1110011100");
  // eval("[0]+[1]*23"): one dense layer, then 23 MoE layers.
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = \"[0]+[1]*23\"\n", 24))),
            "0" + std::string(23, '1'));
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = \"([0]+[1]*23)\"\n", 24))),
            "0" + std::string(23, '1'));
  // Integer arithmetic, repetition from the left, commas and a trailing one.
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = \"2*[1,0]+[0,1]*(2+2)\"\n"))),
            "101001010101");
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = \"[1,0,1,0,]+[0]*0+[1]*8\"\n"))),
            "101011111111");
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = \" [1] * 12 \"\n"))), "111111111111");
  EXPECT_EQ(layers(parseOk(moeSpec("moe_layer_freq = [0, 1, 1, 0]\n", 4))), "0110");
}

TEST(SpecMoe, LayerFreqErrors) {
  EXPECT_NE(parseError(moeSpec("moe_layer_freq = \"[1]*4\"\n")).find(
                "moe_layer_freq \"[1]*4\" gives 4 layers, but num_layers = 12"),
            std::string::npos);
  EXPECT_NE(parseError(moeSpec("moe_layer_freq = [1, 0]\n")).find(
                "moe_layer_freq (an array) gives 2 layers"),
            std::string::npos);
  for (const char *bad : {"[1]*2+1", "[[1]]*12", "[1]*[2]", "[1]+", "([1]*12", "[1]*12)",
                          "[1][0]", "[1]*-1", "[1]*12.0", "[01]*12", "[1 1]", "[()]", "[1]*x"}) {
    std::string e = parseError(moeSpec(std::string("moe_layer_freq = \"") + bad + "\"\n"));
    EXPECT_NE(e.find("is not a layer pattern"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_NE(parseError(moeSpec("moe_layer_freq = \"[2]*12\"\n"))
                .find("gives 2 for layer 0; each entry is 0 (dense) or 1 (MoE)"),
            std::string::npos);
  EXPECT_NE(parseError(moeSpec("moe_layer_freq = \"x\"\n"))
                .find("is neither a positive integer nor a list expression"),
            std::string::npos);
  EXPECT_NE(parseError(moeSpec("moe_layer_freq = 1.5\n"))
                .find("must be an integer, a list expression string or an array"),
            std::string::npos);
  // A hostile expression is bounded, not evaluated into gigabytes.
  EXPECT_NE(parseError(moeSpec("moe_layer_freq = \"[1]*1000000*1000000\"\n"))
                .find("grows past"),
            std::string::npos);
}

TEST(SpecMoe, ImplementedLayoutsAndRefusals) {
  // Pipeline and data parallelism with experts are fine.
  Spec s = parseOk(moeSpec("", 12,
                           "pipeline_model_parallel_size = 2\ndata_parallel_size = 2\n"
                           "use_distributed_optimizer = true\n"));
  EXPECT_EQ(s.parallel.expert_tensor_parallel_size, 1);
  // Expert parallelism with one expert-tensor-parallel rank is implemented.
  const std::string ep2 = moeSpec("", 12, "data_parallel_size = 2\nexpert_model_parallel_size = 2\n");
  EXPECT_EQ(parseOk(ep2).parallel.expert_model_parallel_size, 2);
  // Tensor parallelism with experts needs sequence parallelism (a Megatron
  // rule) ...
  const std::string tp2 = moeSpec("", 12, "tensor_model_parallel_size = 2\n");
  EXPECT_NE(parseError(tp2).find("needs sequence_parallel = true"), std::string::npos);
  // ... and then takes Megatron's default expert_tensor_parallel_size, the
  // tensor-parallel size; any other size whose product with ep divides
  // tp x dp is fine too.
  const std::string tp2sp = moeSpec("", 12, "tensor_model_parallel_size = 2\nsequence_parallel = true\n");
  EXPECT_EQ(parseOk(tp2sp).parallel.expert_tensor_parallel_size, 2);
  Spec etp2 = parseOk(moeSpec("", 12,
                              "data_parallel_size = 4\nexpert_tensor_parallel_size = 2\n"
                              "expert_model_parallel_size = 2\n"));
  EXPECT_EQ(etp2.parallel.expert_tensor_parallel_size, 2);
  EXPECT_NE(parseError(moeSpec("", 12,
                               "data_parallel_size = 2\nexpert_tensor_parallel_size = 2\n"
                               "expert_model_parallel_size = 2\n"))
                .find("does not divide the 2 GPUs of each pipeline stage"),
            std::string::npos);
  Spec tp2ep2 = parseOk(moeSpec("", 12,
                                "tensor_model_parallel_size = 2\nsequence_parallel = true\n"
                                "expert_tensor_parallel_size = 1\n"
                                "expert_model_parallel_size = 2\n"));
  EXPECT_EQ(tp2ep2.parallel.expert_tensor_parallel_size, 1);
  EXPECT_EQ(tp2ep2.parallel.expert_model_parallel_size, 2);
}

// Megatron's num_floating_point_operations for Mixtral 8x7B, term by term
// (training.py, transformer_flops): per token of the global batch, 6 x each
// layer's attention GEMMs (QKV, the causal half of the scores and their
// product with V, the projection), 6 x 3 (SwiGLU) x h x the top-2 experts'
// width, and 6 x h x V for the logits.
TEST(SpecMoe, MegatronFlopsOfMixtral) {
  Spec s = parseOk(R"([model]
num_layers = 32
hidden_size = 4096
ffn_hidden_size = 14336
num_attention_heads = 32
num_query_groups = 8
seq_length = 4096
max_position_embeddings = 32768
position_embedding_type = "rope"
normalization = "RMSNorm"
swiglu = true
untie_embeddings_and_output_weights = true
add_bias_linear = false
vocab_size = 32000
num_experts = 8
moe_router_topk = 2
[training]
micro_batch_size = 1
global_batch_size = 256
train_iters = 10
lr = 1e-4
[parallel]
data_parallel_size = 256
)");
  const double attention = 6.0 * (4096.0 * 6144 + 4096.0 * 4096 + 4096.0 * 4096);
  const double experts = 6.0 * 3 * 4096 * (2 * 14336.0);
  const double logits = 6.0 * 4096 * 32000;
  EXPECT_EQ(attention * 32 + experts * 32 + logits, 79706456064.0);
  EXPECT_DOUBLE_EQ(s.flopsPerIteration(), 256.0 * 4096 * 79706456064.0);
  // Half the layers dense: those count the dense MLP.
  Spec half = parseOk(R"([model]
num_layers = 4
hidden_size = 64
ffn_hidden_size = 256
num_attention_heads = 4
seq_length = 32
swiglu = true
add_bias_linear = false
vocab_size = 128
num_experts = 4
moe_ffn_hidden_size = 32
moe_shared_expert_intermediate_size = 16
moe_layer_freq = 2
[training]
micro_batch_size = 1
train_iters = 10
lr = 1e-4
)");
  const double perToken = 4 * 6.0 * (64 * 192.0 + 64 * 32 + 64 * 64) +
                          2 * 6.0 * 3 * 64 * 256 + 2 * 6.0 * 3 * 64 * (2 * 32 + 16) +
                          6.0 * 64 * 128;
  EXPECT_DOUBLE_EQ(half.flopsPerIteration(), 32 * perToken);
}

TEST(SpecMoe, ImportTranslatesEveryMoeFlag) {
  std::vector<std::string> args = {
      "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--vocab-size", "100", "--micro-batch-size", "2",
      "--train-iters", "10", "--lr", "1e-3", "--swiglu", "--disable-bias-linear",
      "--num-experts", "4", "--moe-ffn-hidden-size", "96", "--moe-router-topk", "1",
      "--moe-router-pre-softmax", "--moe-router-load-balancing-type", "seq_aux_loss",
      "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3",
      "--moe-router-topk-scaling-factor", "2", "--moe-expert-capacity-factor", "1.5",
      "--moe-pad-expert-input-to-capacity", "--moe-token-drop-policy", "position",
      "--moe-layer-freq", "([1]*1+[0]*1)*2", "--moe-shared-expert-intermediate-size", "64",
      "--moe-grouped-gemm", "--moe-router-dtype", "fp32", "--moe-token-dispatcher-type",
      "alltoall", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1"};
  auto r = importMegatronArgs(args, {});
  ASSERT_TRUE(r.ok()) << r.status();
  Spec s = parseOk(r->toml);
  const ModelConfig &m = s.model;
  EXPECT_EQ(m.num_experts, 4);
  EXPECT_EQ(m.moe_ffn_hidden_size, 96);
  EXPECT_EQ(m.moe_router_topk, 1);
  EXPECT_TRUE(m.moe_router_pre_softmax);
  EXPECT_EQ(m.moe_router_load_balancing_type, MoeLoadBalancing::SeqAuxLoss);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.001);
  EXPECT_EQ(m.moe_router_topk_scaling_factor, 2.0);
  EXPECT_EQ(m.moe_expert_capacity_factor, 1.5);
  EXPECT_TRUE(m.moe_pad_expert_input_to_capacity);
  EXPECT_EQ(m.moe_token_drop_policy, MoeTokenDropPolicy::Position);
  EXPECT_EQ(layers(s), "1010");
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 64);
  EXPECT_TRUE(m.moe_grouped_gemm);
  EXPECT_EQ(m.moe_router_dtype, MoeRouterDtype::FP32);
  EXPECT_EQ(s.parallel.moe_token_dispatcher_type, MoeTokenDispatcher::AllToAll);
  EXPECT_TRUE(r->notes.empty() || r->notes[0].find("compile refuses") == std::string::npos);

  // An integer --moe-layer-freq stays an integer.
  auto freq = std::find(args.begin(), args.end(), "--moe-layer-freq");
  ASSERT_NE(freq, args.end());
  *(freq + 1) = "2";
  auto r2 = importMegatronArgs(args, {});
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_NE(r2->toml.find("moe_layer_freq = 2\n"), std::string::npos) << r2->toml;
}

} // namespace
} // namespace mt::spec
