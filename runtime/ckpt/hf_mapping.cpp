// The table between mt's and transformers' tensors (see hf_mapping.h).
#include "runtime/ckpt/hf_mapping.h"

#include <cstdio>
#include <cstring>

namespace mt::rt {

// ---------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------

uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it one, quiet
    return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

uint16_t f32_to_f16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u)
    return sign | 0x7e00u; // NaN
  if (abs >= 0x477ff000u)  // rounds to 65520 or more: infinity
    return sign | 0x7c00u;
  const int exp = int(abs >> 23) - 127;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  if (exp < -25) // below half the smallest subnormal
    return sign;
  // Shift the 24-bit significand to the 10 bits (plus the implicit one) of a
  // normal half, or fewer for a subnormal; round to nearest even.
  const int shift = exp >= -14 ? 13 : 13 + (-14 - exp);
  const uint32_t rest = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  uint32_t m = mant >> shift;
  if (rest > halfway || (rest == halfway && (m & 1u)))
    ++m;
  if (exp >= -14) // normal: the carry of m into bit 11 bumps the exponent
    return uint16_t(sign | ((uint32_t(exp + 15) << 10) + (m - 0x400u)));
  return uint16_t(sign | m); // subnormal (m may round up into the smallest normal)
}

float bf16_to_f32(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13); // infinity or NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else { // subnormal: mant x 2^-24, exact in f32
    float x = float(mant) * (1.0f / 16777216.0f);
    std::memcpy(&u, &x, 4);
    u |= sign;
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

namespace {

// ---------------------------------------------------------------------------
// Architecture
// ---------------------------------------------------------------------------

std::string refuse(const std::string &key, const std::string &why, const std::string &cls) {
  return "model." + key + " = " + why + ", which " + cls +
         " cannot express";
}

} // namespace

std::string hf_class_name(const std::string &arch) {
  return arch == "gpt2" ? "GPT2LMHeadModel" : arch == "mixtral" ? "MixtralForCausalLM"
                                                                 : "LlamaForCausalLM";
}

namespace {

std::string num_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// What MixtralForCausalLM cannot express, by the spec key (transformers'
// MixtralSparseMoeBlock: every layer a softmax router over all experts, its
// top-k weights renormalized to sum to one, no token dropped, SwiGLU experts
// without biases, no shared expert).
std::string mixtral_refusal(const HfModelSpec &m) {
  const char *cls = "MixtralForCausalLM (the class for mixtures of experts)";
  if (!m.rope)
    return refuse("position_embedding_type", "\"learned_absolute\"", cls);
  if (!m.rmsnorm)
    return refuse("normalization", "\"LayerNorm\"", cls);
  if (!m.swiglu)
    return refuse("swiglu", "false (GeLU experts)", cls);
  if (m.add_bias_linear)
    return refuse("add_bias_linear", "true", cls);
  if (m.kv_channels % 2 != 0)
    return refuse("kv_channels",
                  std::to_string(m.kv_channels) + ", odd (RoPE leaves the last element unrotated)",
                  cls);
  if (m.num_attention_heads % m.num_query_groups != 0)
    return refuse("num_query_groups",
                  std::to_string(m.num_query_groups) + ", not a divisor of num_attention_heads",
                  cls);
  for (size_t i = 0; i < m.moe_layers.size(); ++i)
    if (!m.moe_layers[i])
      return refuse("moe_layer_freq",
                    "a dense MLP in layer " + std::to_string(i) + " (Mixtral's every layer is MoE)",
                    cls);
  if (m.moe_shared_expert_intermediate_size > 0)
    return refuse("moe_shared_expert_intermediate_size",
                  std::to_string(m.moe_shared_expert_intermediate_size) + " (a shared expert)",
                  cls);
  if (m.moe_router_score_function != "softmax")
    return refuse("moe_router_score_function", "\"" + m.moe_router_score_function + "\"", cls);
  if (m.moe_router_pre_softmax)
    return refuse("moe_router_pre_softmax",
                  "true (the top-k of a softmax over all experts, not renormalized; Mixtral "
                  "renormalizes the top-k weights to sum to 1)",
                  cls);
  if (m.moe_router_topk_scaling_factor != 0.0 && m.moe_router_topk_scaling_factor != 1.0)
    return refuse("moe_router_topk_scaling_factor",
                  num_text(m.moe_router_topk_scaling_factor) + " (routing weights scaled)", cls);
  if (m.moe_expert_capacity_factor > 0.0)
    return refuse("moe_expert_capacity_factor",
                  num_text(m.moe_expert_capacity_factor) +
                      " (tokens past an expert's capacity dropped; Mixtral drops none)",
                  cls);
  return "";
}

} // namespace

std::string hf_architecture(const HfModelSpec &m, std::string *error) {
  if (m.num_experts > 0) {
    *error = mixtral_refusal(m);
    return error->empty() ? "mixtral" : "";
  }
  if (m.rope) {
    const char *cls = "LlamaForCausalLM (the class for RoPE models)";
    if (!m.rmsnorm)
      *error = refuse("normalization", "\"LayerNorm\" with RoPE", cls);
    else if (!m.swiglu)
      *error = refuse("swiglu", "false (a GeLU MLP) with RoPE", cls);
    else if (m.kv_channels % 2 != 0)
      *error = refuse("kv_channels", std::to_string(m.kv_channels) +
                                         ", odd (RoPE leaves the last element unrotated)",
                      cls);
    else if (m.num_attention_heads % m.num_query_groups != 0)
      *error = refuse("num_query_groups", std::to_string(m.num_query_groups) +
                                              ", not a divisor of num_attention_heads",
                      cls);
    return error->empty() ? "llama" : "";
  }
  const char *cls = "GPT2LMHeadModel (the class for learned absolute positions)";
  if (m.rmsnorm)
    *error = refuse("normalization", "\"RMSNorm\" with learned_absolute positions", cls);
  else if (m.swiglu)
    *error = refuse("swiglu", "true with learned_absolute positions", cls);
  else if (m.num_query_groups != m.num_attention_heads)
    *error = refuse("num_query_groups",
                    std::to_string(m.num_query_groups) + " (grouped-query attention) with "
                                                         "learned_absolute positions",
                    cls);
  else if (m.kv_channels * m.num_attention_heads != m.hidden_size)
    *error = refuse("kv_channels",
                    std::to_string(m.kv_channels) + " (heads x kv_channels != hidden_size) with "
                                                    "learned_absolute positions",
                    cls);
  return error->empty() ? "gpt2" : "";
}

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

int64_t HfPiece::row_count() const {
  int64_t n = 0;
  for (const auto &[b, e] : rows)
    n += e - b;
  return n;
}

std::string hf_base_prefix(const std::string &arch) {
  return arch == "gpt2" ? "transformer." : "model.";
}

namespace {

using Rows = std::vector<std::pair<int64_t, int64_t>>;

std::string key(const char *name, int64_t v) {
  return std::string("model.") + name + " = " + std::to_string(v);
}

struct Table {
  std::vector<HfMapEntry> &out;

  // An entry with one piece of all its rows.
  HfMapEntry &whole(const std::string &mt, std::vector<int64_t> shape, const std::string &hf,
                    std::vector<std::string> keys, bool transpose = false) {
    HfPiece p{hf, {{0, shape[0]}}, transpose, {}, std::move(keys)};
    HfMapEntry e{mt, std::move(shape), false, false, {}};
    e.pieces.push_back(std::move(p));
    out.push_back(std::move(e));
    finish(out.back());
    return out.back();
  }
  // The pieces' shapes, from their rows.
  static void finish(HfMapEntry &e) {
    for (HfPiece &p : e.pieces) {
      const int64_t n = p.row_count();
      if (e.mt_shape.size() == 1)
        p.shape = {n};
      else // [rows, cols], or a stacked [E, rows, cols]'s rows of one expert
        p.shape = p.transpose ? std::vector<int64_t>{e.mt_shape.back(), n}
                              : std::vector<int64_t>{n, e.mt_shape.back()};
    }
  }
};

} // namespace

std::vector<HfMapEntry> hf_mapping(const HfModelSpec &m, const std::string &arch,
                                   int64_t vocab_rows) {
  std::vector<HfMapEntry> out;
  Table t{out};
  const bool gpt2 = arch == "gpt2", bias = m.add_bias_linear;
  const int64_t h = m.hidden_size, f = m.ffn_hidden_size, d = m.kv_channels;
  const int64_t heads = m.num_attention_heads, groups = m.num_query_groups;
  const int64_t per = heads / groups, vp = m.padded_vocab_size;
  const std::string kh = key("hidden_size", h), kf = key("ffn_hidden_size", f);
  const std::string kvocab = key("vocab_size", m.vocab_size) +
                             " (padded to " + std::to_string(vp) + ")";
  const std::string kq = key("num_attention_heads", heads) + " x " + key("kv_channels", d);
  const std::string kqkv = kq + ", " + key("num_query_groups", groups);
  const std::string kkv = key("num_query_groups", groups) + " x " + key("kv_channels", d);

  // Megatron's fused QKV: per query group, `per` query heads, a key head, a value head.
  auto qkv_rows = [&](int part) {
    Rows rows;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = g * (per + 2) * d;
      const int64_t from = part == 0 ? 0 : part == 1 ? per : per + 1;
      const int64_t n = part == 0 ? per : 1;
      rows.push_back({base + from * d, base + (from + n) * d});
    }
    return rows;
  };
  // A bias GPT-2 has and mt does not: zero in Hugging Face's.
  auto zero = [&](const std::string &hf, int64_t n, const std::string &k) {
    HfMapEntry e{"", {n}, false, false, {}};
    e.pieces.push_back({hf, {{0, n}}, false, {n}, {k}});
    out.push_back(std::move(e));
  };
  auto norm = [&](const std::string &mt, const std::string &hf) {
    t.whole(mt + "weight", {h}, hf + "weight", {kh}).one_plus = m.apply_layernorm_1p;
    if (!m.rmsnorm)
      t.whole(mt + "bias", {h}, hf + "bias", {kh});
  };

  HfMapEntry &emb = t.whole("embedding.word_embeddings.weight", {vp, h},
                            gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight",
                            {kvocab, kh});
  emb.vocab = true;
  emb.pieces[0].rows = {{0, vocab_rows}};
  Table::finish(emb);
  if (gpt2)
    t.whole("embedding.position_embeddings.weight", {m.max_position_embeddings, h},
            "transformer.wpe.weight", {key("max_position_embeddings", m.max_position_embeddings), kh});
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = "decoder.layers." + std::to_string(i) + ".";
    const std::string q = gpt2 ? "transformer.h." + std::to_string(i) + "."
                               : "model.layers." + std::to_string(i) + ".";
    const int64_t qkv = (heads + 2 * groups) * d;
    norm(p + "input_layernorm.", q + (gpt2 ? "ln_1." : "input_layernorm."));
    if (gpt2) {
      // c_attn: a Conv1D [in, out] with out = [q | k | v].
      Rows rows;
      for (int part = 0; part < 3; ++part)
        for (const auto &r : qkv_rows(part))
          rows.push_back(r);
      HfMapEntry w{p + "self_attention.linear_qkv.weight", {qkv, h}, false, false, {}};
      w.pieces.push_back({q + "attn.c_attn.weight", rows, true, {}, {"3 x " + kq, kh}});
      Table::finish(w);
      out.push_back(std::move(w));
      if (bias) {
        HfMapEntry b{p + "self_attention.linear_qkv.bias", {qkv}, false, false, {}};
        b.pieces.push_back({q + "attn.c_attn.bias", rows, false, {}, {"3 x " + kq}});
        Table::finish(b);
        out.push_back(std::move(b));
      } else {
        zero(q + "attn.c_attn.bias", 3 * heads * d, "3 x " + kq);
      }
      t.whole(p + "self_attention.linear_proj.weight", {h, heads * d}, q + "attn.c_proj.weight",
              {kh, kq}, true);
      if (bias)
        t.whole(p + "self_attention.linear_proj.bias", {h}, q + "attn.c_proj.bias", {kh});
      else
        zero(q + "attn.c_proj.bias", h, kh);
    } else {
      HfMapEntry w{p + "self_attention.linear_qkv.weight", {qkv, h}, false, false, {}};
      HfMapEntry b{p + "self_attention.linear_qkv.bias", {qkv}, false, false, {}};
      const char *proj[3] = {"self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."};
      for (int part = 0; part < 3; ++part) {
        const std::string k = part == 0 ? kq : kkv;
        w.pieces.push_back({q + proj[part] + "weight", qkv_rows(part), false, {}, {k, kh}});
        b.pieces.push_back({q + proj[part] + "bias", qkv_rows(part), false, {}, {k}});
      }
      Table::finish(w);
      out.push_back(std::move(w));
      if (bias) {
        Table::finish(b);
        out.push_back(std::move(b));
      }
      t.whole(p + "self_attention.linear_proj.weight", {h, heads * d},
              q + "self_attn.o_proj.weight", {kh, kq});
      if (bias)
        t.whole(p + "self_attention.linear_proj.bias", {h}, q + "self_attn.o_proj.bias", {kh});
    }
    norm(p + "pre_mlp_layernorm.", q + (gpt2 ? "ln_2." : "post_attention_layernorm."));
    if (gpt2) {
      t.whole(p + "mlp.linear_fc1.weight", {f, h}, q + "mlp.c_fc.weight", {kf, kh}, true);
      if (bias)
        t.whole(p + "mlp.linear_fc1.bias", {f}, q + "mlp.c_fc.bias", {kf});
      else
        zero(q + "mlp.c_fc.bias", f, kf);
      t.whole(p + "mlp.linear_fc2.weight", {h, f}, q + "mlp.c_proj.weight", {kh, kf}, true);
      if (bias)
        t.whole(p + "mlp.linear_fc2.bias", {h}, q + "mlp.c_proj.bias", {kh});
      else
        zero(q + "mlp.c_proj.bias", h, kh);
      continue;
    }
    if (arch == "mixtral") {
      // The router and the stacked experts: expert e's fc1 rows [e 2F, e 2F + F)
      // are its gate (w1), [e 2F + F, (e + 1) 2F) its up projection (w3); its
      // fc2 rows [e H, (e + 1) H) are w2.
      const int64_t ne = m.num_experts, mf = m.moe_ffn_hidden_size;
      const std::string ke = key("num_experts", ne), kmf = key("moe_ffn_hidden_size", mf);
      const std::string moe = q + "block_sparse_moe.";
      t.whole(p + "mlp.router.weight", {ne, h}, moe + "gate.weight", {ke, kh});
      HfMapEntry fc1{p + "mlp.experts.linear_fc1.weight", {ne, 2 * mf, h}, false, false, {}};
      HfMapEntry fc2{p + "mlp.experts.linear_fc2.weight", {ne, h, mf}, false, false, {}};
      for (int64_t x = 0; x < ne; ++x) {
        const std::string ex = moe + "experts." + std::to_string(x) + ".";
        fc1.pieces.push_back({ex + "w1.weight", {{x * 2 * mf, x * 2 * mf + mf}}, false, {}, {kmf, kh}});
        fc1.pieces.push_back(
            {ex + "w3.weight", {{x * 2 * mf + mf, (x + 1) * 2 * mf}}, false, {}, {kmf, kh}});
        fc2.pieces.push_back({ex + "w2.weight", {{x * h, (x + 1) * h}}, false, {}, {kh, kmf}});
      }
      Table::finish(fc1);
      Table::finish(fc2);
      out.push_back(std::move(fc1));
      out.push_back(std::move(fc2));
      continue;
    }
    // SwiGLU's fc1: rows [0, ffn) are the gate, [ffn, 2 ffn) the up projection.
    HfMapEntry w{p + "mlp.linear_fc1.weight", {2 * f, h}, false, false, {}};
    w.pieces.push_back({q + "mlp.gate_proj.weight", {{0, f}}, false, {}, {kf, kh}});
    w.pieces.push_back({q + "mlp.up_proj.weight", {{f, 2 * f}}, false, {}, {kf, kh}});
    Table::finish(w);
    out.push_back(std::move(w));
    if (bias) {
      HfMapEntry b{p + "mlp.linear_fc1.bias", {2 * f}, false, false, {}};
      b.pieces.push_back({q + "mlp.gate_proj.bias", {{0, f}}, false, {}, {kf}});
      b.pieces.push_back({q + "mlp.up_proj.bias", {{f, 2 * f}}, false, {}, {kf}});
      Table::finish(b);
      out.push_back(std::move(b));
    }
    t.whole(p + "mlp.linear_fc2.weight", {h, f}, q + "mlp.down_proj.weight", {kh, kf});
    if (bias)
      t.whole(p + "mlp.linear_fc2.bias", {h}, q + "mlp.down_proj.bias", {kh});
  }
  norm("decoder.final_layernorm.", gpt2 ? "transformer.ln_f." : "model.norm.");
  if (m.untie_embeddings_and_output_weights) {
    HfMapEntry &o = t.whole("output_layer.weight", {vp, h}, "lm_head.weight", {kvocab, kh});
    o.vocab = true;
    o.pieces[0].rows = {{0, vocab_rows}};
    Table::finish(o);
  }
  return out;
}

} // namespace mt::rt
