// The Hugging Face export's pieces: half-precision rounding against values
// worked out by hand from IEEE 754, the shard-size syntax, the
// architectures refused by spec key, and the weight layouts (Megatron's
// per-group QKV into q/k/v or GPT-2's transposed c_attn, SwiGLU's halves,
// the vocabulary cut, 1 + w norms) on tensors whose every element is its
// own index, so each move is visible.
#include "runtime/ckpt/hf_export.h"
#include "runtime/ckpt/hf_import.h"
#include "runtime/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <unistd.h>
#include <limits>
#include <map>
#include <string>
#include <vector>

using mt::rt::HfModelSpec;
using mt::rt::HfTensor;
using mt::rt::WholeWeight;

namespace {

float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

// A tensor whose element i is i (plus `base`).
WholeWeight iota(std::vector<int64_t> shape, float base = 0) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  WholeWeight w{shape, std::vector<float>(size_t(n))};
  for (int64_t i = 0; i < n; ++i)
    w.data[size_t(i)] = base + float(i);
  return w;
}

// heads 4, groups 2, head width 2, hidden 8, ffn 3, vocabulary 5 padded to 8.
HfModelSpec llama() {
  HfModelSpec m;
  m.num_layers = 1;
  m.hidden_size = 8;
  m.ffn_hidden_size = 3;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.kv_channels = 2;
  m.max_position_embeddings = 16;
  m.vocab_size = 5;
  m.padded_vocab_size = 8;
  m.rope = true;
  m.rmsnorm = true;
  m.swiglu = true;
  m.untie_embeddings_and_output_weights = true;
  m.add_bias_linear = false;
  return m;
}

HfModelSpec gpt2() {
  HfModelSpec m = llama();
  m.num_query_groups = 4;
  m.rope = m.rmsnorm = m.swiglu = m.untie_embeddings_and_output_weights = false;
  m.add_bias_linear = true;
  return m;
}

std::map<std::string, WholeWeight> weights_of(const HfModelSpec &m) {
  const int64_t h = m.hidden_size, f = m.ffn_hidden_size, d = m.kv_channels;
  const int64_t qkv = (m.num_attention_heads + 2 * m.num_query_groups) * d;
  const std::string p = "decoder.layers.0.";
  std::map<std::string, WholeWeight> w = {
      {"embedding.word_embeddings.weight", iota({m.padded_vocab_size, h})},
      {p + "input_layernorm.weight", iota({h})},
      {p + "pre_mlp_layernorm.weight", iota({h}, 100)},
      {p + "self_attention.linear_qkv.weight", iota({qkv, h})},
      {p + "self_attention.linear_proj.weight", iota({h, m.num_attention_heads * d})},
      {p + "mlp.linear_fc1.weight", iota({m.swiglu ? 2 * f : f, h})},
      {p + "mlp.linear_fc2.weight", iota({h, f})},
      {"decoder.final_layernorm.weight", iota({h}, 200)},
  };
  if (m.untie_embeddings_and_output_weights)
    w["output_layer.weight"] = iota({m.padded_vocab_size, h}, 1000);
  if (!m.rope)
    w["embedding.position_embeddings.weight"] = iota({m.max_position_embeddings, h});
  if (!m.rmsnorm)
    for (const char *n : {"input_layernorm.bias", "pre_mlp_layernorm.bias"})
      w[p + n] = iota({h});
  if (!m.rmsnorm)
    w["decoder.final_layernorm.bias"] = iota({h});
  if (m.add_bias_linear) {
    w[p + "self_attention.linear_qkv.bias"] = iota({qkv});
    w[p + "self_attention.linear_proj.bias"] = iota({h});
    w[p + "mlp.linear_fc1.bias"] = iota({m.swiglu ? 2 * f : f});
    w[p + "mlp.linear_fc2.bias"] = iota({h});
  }
  return w;
}

const HfTensor &get(const std::vector<HfTensor> &t, const std::string &name) {
  for (const HfTensor &x : t)
    if (x.name == name)
      return x;
  static HfTensor none;
  ADD_FAILURE() << "no tensor " << name;
  return none;
}

// Row r of a [rows, cols] tensor.
std::vector<float> row(const HfTensor &t, int64_t r) {
  const int64_t cols = t.shape[1];
  return std::vector<float>(t.data.begin() + r * cols, t.data.begin() + (r + 1) * cols);
}

} // namespace

TEST(HfExport, HalfPrecisionRoundsToNearestEven) {
  using mt::rt::f32_to_bf16;
  using mt::rt::f32_to_f16;
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(bits(0x3f808000u)), 0x3f80); // tie: even stays
  EXPECT_EQ(f32_to_bf16(bits(0x3f818000u)), 0x3f82); // tie: odd rounds up
  EXPECT_EQ(f32_to_bf16(bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE((f32_to_bf16(std::nanf("")) & 0x7f80) == 0x7f80 && (f32_to_bf16(std::nanf("")) & 0x7f));

  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(0.1f), 0x2e66);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);   // the largest half
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);   // rounds down
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);   // ties to even: infinity
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400); // the smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001); // the smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000); // half of it: ties to even 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -24)), 0x0003);
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400); // rounds into the normals
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00); // tie at 1: even
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02); // tie: odd rounds up
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::nanf("")) & 0x7e00, 0x7e00);
}

TEST(HfExport, ShardSizes) {
  uint64_t b = 0;
  EXPECT_TRUE(mt::rt::parse_shard_size("5GB", &b));
  EXPECT_EQ(b, 5000000000u);
  EXPECT_TRUE(mt::rt::parse_shard_size("500mb", &b));
  EXPECT_EQ(b, 500000000u);
  EXPECT_TRUE(mt::rt::parse_shard_size("2GiB", &b));
  EXPECT_EQ(b, 2u << 30);
  EXPECT_TRUE(mt::rt::parse_shard_size("1000", &b));
  EXPECT_EQ(b, 1000u);
  for (const char *bad : {"0", "", "GB", "5XB", "-5GB", "5 GB", "99999999999TB"})
    EXPECT_FALSE(mt::rt::parse_shard_size(bad, &b)) << bad;
}

TEST(HfExport, ArchitecturesAndRefusals) {
  std::string err;
  EXPECT_EQ(mt::rt::hf_architecture(llama(), &err), "llama");
  EXPECT_EQ(mt::rt::hf_architecture(gpt2(), &err), "gpt2");
  struct Case {
    void (*edit)(HfModelSpec &);
    bool from_llama;
    const char *key;
  } cases[] = {
      {[](HfModelSpec &m) { m.rmsnorm = false; }, true, "model.normalization = \"LayerNorm\""},
      {[](HfModelSpec &m) { m.swiglu = false; }, true, "model.swiglu = false"},
      {[](HfModelSpec &m) { m.kv_channels = 3; }, true, "model.kv_channels = 3, odd"},
      {[](HfModelSpec &m) { m.rmsnorm = true; }, false, "model.normalization = \"RMSNorm\""},
      {[](HfModelSpec &m) { m.swiglu = true; }, false, "model.swiglu = true"},
      {[](HfModelSpec &m) { m.num_query_groups = 2; }, false, "model.num_query_groups = 2"},
      {[](HfModelSpec &m) { m.kv_channels = 4; }, false, "model.kv_channels = 4"},
  };
  for (const Case &c : cases) {
    HfModelSpec m = c.from_llama ? llama() : gpt2();
    c.edit(m);
    err.clear();
    EXPECT_EQ(mt::rt::hf_architecture(m, &err), "");
    EXPECT_TRUE(contains(err, c.key)) << err;
    EXPECT_TRUE(contains(err, "cannot express")) << err;
  }
}

// llama()'s attention with 3 experts of 2 (top-2) in its one layer.
HfModelSpec mixtral() {
  HfModelSpec m = llama();
  m.num_experts = 3;
  m.moe_ffn_hidden_size = 2;
  m.moe_layers = {true};
  return m;
}

TEST(HfExport, MixtralRefusals) {
  std::string err;
  EXPECT_EQ(mt::rt::hf_architecture(mixtral(), &err), "mixtral") << err;
  struct Case {
    void (*edit)(HfModelSpec &);
    const char *key;
  } cases[] = {
      {[](HfModelSpec &m) { m.moe_shared_expert_intermediate_size = 4; },
       "model.moe_shared_expert_intermediate_size = 4 (a shared expert)"},
      {[](HfModelSpec &m) { m.moe_router_score_function = "sigmoid"; },
       "model.moe_router_score_function = \"sigmoid\""},
      {[](HfModelSpec &m) { m.moe_router_pre_softmax = true; }, "model.moe_router_pre_softmax = true"},
      {[](HfModelSpec &m) { m.moe_router_topk_scaling_factor = 2.5; },
       "model.moe_router_topk_scaling_factor = 2.5"},
      {[](HfModelSpec &m) { m.moe_expert_capacity_factor = 1.5; },
       "model.moe_expert_capacity_factor = 1.5"},
      {[](HfModelSpec &m) {
         m.num_layers = 2;
         m.moe_layers = {true, false};
       },
       "model.moe_layer_freq = a dense MLP in layer 1"},
      {[](HfModelSpec &m) { m.swiglu = false; }, "model.swiglu = false"},
      {[](HfModelSpec &m) { m.add_bias_linear = true; }, "model.add_bias_linear = true"},
      {[](HfModelSpec &m) { m.rope = false; }, "model.position_embedding_type"},
  };
  for (const Case &c : cases) {
    HfModelSpec m = mixtral();
    c.edit(m);
    err.clear();
    EXPECT_EQ(mt::rt::hf_architecture(m, &err), "");
    EXPECT_TRUE(contains(err, c.key)) << err;
    EXPECT_TRUE(contains(err, "MixtralForCausalLM")) << err;
  }
  // A scaling factor of 1 scales nothing.
  HfModelSpec one = mixtral();
  one.moe_router_topk_scaling_factor = 1.0;
  EXPECT_EQ(mt::rt::hf_architecture(one, &err), "mixtral");
}

TEST(HfExport, MixtralLayouts) {
  const HfModelSpec m = mixtral();
  std::map<std::string, WholeWeight> w = weights_of(m);
  const std::string p = "decoder.layers.0.mlp.";
  w.erase(p + "linear_fc1.weight");
  w.erase(p + "linear_fc2.weight");
  w[p + "router.weight"] = iota({3, 8}, 500);
  w[p + "experts.linear_fc1.weight"] = iota({3, 4, 8}); // [E, 2 ffn, H]
  w[p + "experts.linear_fc2.weight"] = iota({3, 8, 2}, 2000); // [E, H, ffn]
  std::vector<HfTensor> t;
  ASSERT_EQ(mt::rt::hf_tensors(m, "mixtral", w, false, &t), "");
  const std::string q = "model.layers.0.block_sparse_moe.";
  EXPECT_EQ(get(t, q + "gate.weight").data, iota({3, 8}, 500).data);
  for (int e = 0; e < 3; ++e) {
    const std::string x = q + "experts." + std::to_string(e) + ".";
    const HfTensor &w1 = get(t, x + "w1.weight"), &w3 = get(t, x + "w3.weight");
    const HfTensor &w2 = get(t, x + "w2.weight");
    EXPECT_EQ(w1.shape, (std::vector<int64_t>{2, 8}));
    EXPECT_EQ(w2.shape, (std::vector<int64_t>{8, 2}));
    // Expert e's fc1 is elements [e 32, e 32 + 32): the gate its first 16.
    EXPECT_EQ(w1.data, iota({2, 8}, float(e * 32)).data) << e;
    EXPECT_EQ(w3.data, iota({2, 8}, float(e * 32 + 16)).data) << e;
    EXPECT_EQ(w2.data, iota({8, 2}, float(2000 + e * 16)).data) << e;
  }
  EXPECT_EQ(t.size(), 9u + 1 + 9); // llama()'s 12 less its MLP's 3, the router, 3 x 3 experts
  const std::string config = mt::rt::hf_config_json(m, "mixtral", {});
  for (const char *k : {"\"MixtralForCausalLM\"", "\"num_local_experts\": 3",
                        "\"num_experts_per_tok\": 2", "\"intermediate_size\": 2",
                        "\"output_router_logits\": false"})
    EXPECT_TRUE(contains(config, k)) << k << "\n" << config;

  // And back: the import puts every element where it was.
  char tmpl[] = "/tmp/mt-hf-mixtral-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<mt::rt::SafetensorsTensor> st;
  for (const HfTensor &x : t)
    st.push_back({x.name, "F32", x.shape, x.data.data(), x.data.size() * 4});
  ASSERT_EQ(mt::rt::write_safetensors(dir + "/model.safetensors", st, {}), "");
  std::map<std::string, WholeWeight> back;
  int64_t rows = 0;
  ASSERT_EQ(mt::rt::read_hf_weights(dir, m, "mixtral", &back, &rows), "");
  for (const char *n : {"router.weight", "experts.linear_fc1.weight", "experts.linear_fc2.weight"}) {
    EXPECT_EQ(back.at(p + n).shape, w.at(p + n).shape) << n;
    EXPECT_EQ(back.at(p + n).data, w.at(p + n).data) << n;
  }
  ::unlink((dir + "/model.safetensors").c_str());
  ::rmdir(dir.c_str());
}

TEST(HfExport, LlamaLayouts) {
  const HfModelSpec m = llama();
  std::vector<HfTensor> t;
  ASSERT_EQ(mt::rt::hf_tensors(m, "llama", weights_of(m), false, &t), "");
  const std::string q = "model.layers.0.";
  // Megatron's QKV rows, per group of 2 query heads (4 rows), a key head (2)
  // and a value head (2): group 0 is rows 0-7, group 1 rows 8-15.
  const HfTensor &qp = get(t, q + "self_attn.q_proj.weight");
  const HfTensor &kp = get(t, q + "self_attn.k_proj.weight");
  const HfTensor &vp = get(t, q + "self_attn.v_proj.weight");
  EXPECT_EQ(qp.shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(kp.shape, (std::vector<int64_t>{4, 8}));
  const int64_t qrows[] = {0, 1, 2, 3, 8, 9, 10, 11}, krows[] = {4, 5, 12, 13},
                vrows[] = {6, 7, 14, 15};
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(row(qp, i)[0], float(qrows[i] * 8)) << i;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(row(kp, i)[0], float(krows[i] * 8)) << i;
    EXPECT_EQ(row(vp, i)[0], float(vrows[i] * 8)) << i;
  }
  // SwiGLU: fc1's first 3 rows are the gate, the next 3 the up projection.
  EXPECT_EQ(row(get(t, q + "mlp.gate_proj.weight"), 0)[0], 0.0f);
  EXPECT_EQ(row(get(t, q + "mlp.up_proj.weight"), 0)[0], 24.0f);
  EXPECT_EQ(get(t, q + "mlp.down_proj.weight").data, iota({8, 3}).data);
  EXPECT_EQ(get(t, q + "self_attn.o_proj.weight").data, iota({8, 8}).data);
  EXPECT_EQ(get(t, q + "post_attention_layernorm.weight").data[0], 100.0f);
  EXPECT_EQ(get(t, "model.norm.weight").data[0], 200.0f);
  // The vocabulary cut to 5 rows; the output layer its own.
  EXPECT_EQ(get(t, "model.embed_tokens.weight").shape, (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(get(t, "lm_head.weight").shape, (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(get(t, "lm_head.weight").data[0], 1000.0f);
  EXPECT_EQ(t.size(), 12u);

  // Kept padded, with 1 + w norms and biases.
  HfModelSpec b = m;
  b.apply_layernorm_1p = true;
  b.add_bias_linear = true;
  t.clear();
  ASSERT_EQ(mt::rt::hf_tensors(b, "llama", weights_of(b), true, &t), "");
  EXPECT_EQ(get(t, "model.embed_tokens.weight").shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(get(t, q + "input_layernorm.weight").data[0], 1.0f);
  EXPECT_EQ(get(t, q + "self_attn.k_proj.bias").data, (std::vector<float>{4, 5, 12, 13}));
  EXPECT_EQ(get(t, q + "mlp.up_proj.bias").data, (std::vector<float>{3, 4, 5}));
}

TEST(HfExport, Gpt2Layouts) {
  const HfModelSpec m = gpt2();
  std::vector<HfTensor> t;
  ASSERT_EQ(mt::rt::hf_tensors(m, "gpt2", weights_of(m), false, &t), "");
  const std::string q = "transformer.h.0.";
  // 4 groups of one query, key and value head (2 rows each): c_attn's
  // columns are all queries, then all keys, then all values; a Conv1D
  // stores [in, out], the transpose of mt's [out, in].
  const HfTensor &attn = get(t, q + "attn.c_attn.weight");
  ASSERT_EQ(attn.shape, (std::vector<int64_t>{8, 24}));
  const int64_t order[] = {0, 1, 6, 7, 12, 13, 18, 19, 2, 3, 8, 9, 14, 15, 20, 21,
                           4, 5, 10, 11, 16, 17, 22, 23};
  for (int c = 0; c < 24; ++c)
    for (int in = 0; in < 8; ++in)
      ASSERT_EQ(attn.data[size_t(in * 24 + c)], float(order[c] * 8 + in)) << c << " " << in;
  std::vector<float> bias(order, order + 24);
  EXPECT_EQ(get(t, q + "attn.c_attn.bias").data, bias);
  const HfTensor &fc = get(t, q + "mlp.c_fc.weight");
  EXPECT_EQ(fc.shape, (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(fc.data[1], 8.0f); // [in 0, out 1] = fc1[1][0]
  const HfTensor &proj = get(t, q + "mlp.c_proj.weight");
  EXPECT_EQ(proj.shape, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(proj.data[1], 3.0f); // [in 0, out 1] = fc2[1][0]
  EXPECT_EQ(get(t, "transformer.wpe.weight").shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(get(t, "transformer.ln_f.bias").data, iota({8}).data);
  for (const HfTensor &x : t)
    EXPECT_NE(x.name, "lm_head.weight"); // tied: transformers ties it to wte

  // Without biases, GPT-2's are written as zeros.
  HfModelSpec nb = m;
  nb.add_bias_linear = false;
  t.clear();
  ASSERT_EQ(mt::rt::hf_tensors(nb, "gpt2", weights_of(nb), false, &t), "");
  EXPECT_EQ(get(t, q + "mlp.c_fc.bias").data, std::vector<float>(3, 0.0f));
}

TEST(HfExport, CheckpointAndSpecMustAgree) {
  const HfModelSpec m = llama();
  std::vector<HfTensor> t;
  auto w = weights_of(m);
  w.erase("output_layer.weight");
  EXPECT_TRUE(contains(mt::rt::hf_tensors(m, "llama", w, false, &t),
                       "the checkpoint has no tensor output_layer.weight"));
  w = weights_of(m);
  w["decoder.layers.0.mlp.linear_fc2.weight"] = iota({8, 4});
  t.clear();
  EXPECT_TRUE(contains(mt::rt::hf_tensors(m, "llama", w, false, &t),
                       "decoder.layers.0.mlp.linear_fc2.weight is [8, 4] but the spec's model "
                       "makes it [8, 3]"));
  w = weights_of(m);
  w["decoder.layers.1.mlp.linear_fc2.weight"] = iota({8, 3});
  t.clear();
  EXPECT_TRUE(contains(mt::rt::hf_tensors(m, "llama", w, false, &t),
                       "holds decoder.layers.1.mlp.linear_fc2.weight [8, 3], which the spec's "
                       "model does not have"));
}

TEST(HfExport, TokenizerFilesThatAreNotExported) {
  HfModelSpec m = gpt2();
  std::map<std::string, std::string> files;
  std::string why;
  m.tokenizer_type = "GPT2BPETokenizer";
  EXPECT_EQ(mt::rt::hf_tokenizer_files(m, &files, &why), "");
  EXPECT_TRUE(files.empty());
  EXPECT_EQ(why, "the spec names no data.vocab_file and data.merge_file");
  m.vocab_file = "/nonexistent/vocab.json";
  m.merge_file = "/nonexistent/merges.txt";
  EXPECT_EQ(mt::rt::hf_tokenizer_files(m, &files, &why), "");
  EXPECT_EQ(why, "data.vocab_file \"/nonexistent/vocab.json\" is not here");
  m.tokenizer_type = "HuggingFaceTokenizer";
  m.tokenizer_model = "/nonexistent/tokenizer.json";
  EXPECT_EQ(mt::rt::hf_tokenizer_files(m, &files, &why), "");
  EXPECT_EQ(why, "data.tokenizer_model \"/nonexistent/tokenizer.json\" is not here");
  m.tokenizer_type = "NullTokenizer";
  EXPECT_EQ(mt::rt::hf_tokenizer_files(m, &files, &why), "");
  EXPECT_EQ(why, "NullTokenizer has no files");
  m.tokenizer_type = "TikTokenizer";
  EXPECT_EQ(mt::rt::hf_tokenizer_files(m, &files, &why), "");
  EXPECT_TRUE(contains(why, "TikTokenizer's files are not exported yet"));
  EXPECT_TRUE(files.empty());
}

// The import reads the export's table the other way: every tensor the
// export writes comes back to the same mt tensor, and a vocabulary cut to
// the tokenizer's is padded again with its last row (as Megatron pads).
TEST(HfImport, ReadsBackWhatTheExportWrites) {
  for (bool gpt : {false, true}) {
    HfModelSpec m = gpt ? gpt2() : llama();
    m.apply_layernorm_1p = gpt;
    const std::string arch = gpt ? "gpt2" : "llama";
    const std::map<std::string, WholeWeight> w = weights_of(m);
    for (bool keep : {true, false}) {
      std::vector<HfTensor> t;
      ASSERT_EQ(mt::rt::hf_tensors(m, arch, w, keep, &t), "");
      char tmpl[] = "/tmp/hf-import-test.XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl), nullptr);
      const std::string dir = tmpl;
      std::vector<mt::rt::SafetensorsTensor> st;
      for (const HfTensor &x : t)
        st.push_back({x.name, "F32", x.shape, x.data.data(), x.data.size() * 4});
      ASSERT_EQ(mt::rt::write_safetensors(dir + "/model.safetensors", st, {}), "");
      std::map<std::string, WholeWeight> back;
      int64_t rows = 0;
      ASSERT_EQ(mt::rt::read_hf_weights(dir, m, arch, &back, &rows), "");
      ::unlink((dir + "/model.safetensors").c_str());
      ::rmdir(dir.c_str());
      EXPECT_EQ(rows, keep ? m.padded_vocab_size : m.vocab_size);
      ASSERT_EQ(back.size(), w.size());
      for (const auto &[name, want] : w) {
        const WholeWeight &got = back.at(name);
        ASSERT_EQ(got.shape, want.shape) << name;
        const bool vocab = name == "embedding.word_embeddings.weight" ||
                           name == "output_layer.weight";
        const int64_t cols = want.shape.size() == 2 ? want.shape[1] : 1;
        for (size_t i = 0; i < want.data.size(); ++i) {
          const int64_t row = int64_t(i) / cols;
          const float expect = vocab && !keep && row >= m.vocab_size
                                   ? want.data[size_t((m.vocab_size - 1) * cols) + i % size_t(cols)]
                                   : want.data[i];
          ASSERT_EQ(got.data[i], expect) << name << " element " << i;
        }
      }
    }
  }
}

// bf16 and f16 to f32 and back give every bit pattern but NaN's again.
TEST(HfImport, HalfPrecisionIsExactInF32) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = uint16_t(b);
    if ((h & 0x7f80u) != 0x7f80u || (h & 0x7fu) == 0) {
      ASSERT_EQ(mt::rt::f32_to_bf16(mt::rt::bf16_to_f32(h)), h) << b;
    }
    if ((h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0) {
      ASSERT_EQ(mt::rt::f32_to_f16(mt::rt::f16_to_f32(h)), h) << b;
    }
  }
  EXPECT_EQ(mt::rt::f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(mt::rt::f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(mt::rt::f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(mt::rt::f16_to_f32(0x8400), -std::ldexp(1.0f, -14));
  EXPECT_EQ(mt::rt::bf16_to_f32(0x3f80), 1.0f);
  EXPECT_TRUE(std::isinf(mt::rt::f16_to_f32(0xfc00)));
}
