#!/usr/bin/env python3
"""Writes a tiny Hugging Face model folder (config.json, model.safetensors)
as transformers' save_pretrained lays it out, with numpy alone, optionally
damaged in one way; and compares two folders' tensors.

usage: hf_folder.py write DIR gpt|llama|mixtral [--damage KIND] [--dtype F32|BF16|F16] [--bf16-values]
       hf_folder.py compare DIR_A DIR_B [TOLERANCE]   (equal to the last bit, or within
                                                      an absolute TOLERANCE)

gpt: GPT2LMHeadModel, 2 layers, n_embd 32, 4 heads, 32 positions, 100 tokens,
tied. llama: LlamaForCausalLM, 2 layers, hidden 32, 48 intermediate, 4
heads in 2 key/value groups, 100 tokens, untied, no biases. mixtral:
MixtralForCausalLM, llama's attention with 4 experts of intermediate size
24 in every layer, top-2. The safetensors
file is written as the format describes (an 8-byte little-endian header
length, the JSON header padded with spaces to 8 bytes, the data).

--bf16-values rounds the values to bf16's (to nearest even) before they
are stored, so that a BF16 file and an F32 one hold the same numbers.
--damage: shape (a tensor of another shape than config.json makes it),
missing (a tensor left out), extra (a tensor the class does not have),
header (a header that is not JSON), truncated (the file cut short), dtype
(a tensor stored as I32), arch (config.json names MistralForCausalLM),
vocab (200 tokens, more than a spec for 100 pads to), eps (config.json's
norm epsilon 1e-3, another than the spec's), sharded (the weights in two
shards with model.safetensors.index.json), shard-missing (the index names
a shard that is not there), base (GPT-2 as GPT2Model saves it: names
without "transformer.", with the causal-mask buffers and the tied
lm_head.weight stored too), lmhead (a tied GPT-2 whose stored lm_head.weight
is not the embedding).
"""
import json
import os
import struct
import sys

import numpy as np

H, LAYERS, HEADS, VOCAB, POS, EXPERTS = 32, 2, 4, 100, 32, 4


def tensors(kind, vocab):
    rng = np.random.default_rng(3)
    t = {}

    def put(name, *shape):
        t[name] = rng.normal(0.0, 0.3, shape).astype(np.float32)

    if kind == "gpt":
        put("transformer.wte.weight", vocab, H)
        put("transformer.wpe.weight", POS, H)
        for i in range(LAYERS):
            p = f"transformer.h.{i}."
            for ln in ("ln_1", "ln_2"):
                put(p + ln + ".weight", H)
                put(p + ln + ".bias", H)
            put(p + "attn.c_attn.weight", H, 3 * H)
            put(p + "attn.c_attn.bias", 3 * H)
            put(p + "attn.c_proj.weight", H, H)
            put(p + "attn.c_proj.bias", H)
            put(p + "mlp.c_fc.weight", H, 4 * H)
            put(p + "mlp.c_fc.bias", 4 * H)
            put(p + "mlp.c_proj.weight", 4 * H, H)
            put(p + "mlp.c_proj.bias", H)
        put("transformer.ln_f.weight", H)
        put("transformer.ln_f.bias", H)
    else:
        put("model.embed_tokens.weight", vocab, H)
        for i in range(LAYERS):
            p = f"model.layers.{i}."
            put(p + "input_layernorm.weight", H)
            put(p + "post_attention_layernorm.weight", H)
            put(p + "self_attn.q_proj.weight", H, H)
            put(p + "self_attn.k_proj.weight", 16, H)
            put(p + "self_attn.v_proj.weight", 16, H)
            put(p + "self_attn.o_proj.weight", H, H)
            if kind == "mixtral":
                put(p + "block_sparse_moe.gate.weight", EXPERTS, H)
                for e in range(EXPERTS):
                    q = p + f"block_sparse_moe.experts.{e}."
                    put(q + "w1.weight", 24, H)
                    put(q + "w2.weight", H, 24)
                    put(q + "w3.weight", 24, H)
            else:
                put(p + "mlp.gate_proj.weight", 48, H)
                put(p + "mlp.up_proj.weight", 48, H)
                put(p + "mlp.down_proj.weight", H, 48)
        put("model.norm.weight", H)
        put("lm_head.weight", vocab, H)
    return t


def config(kind, vocab):
    if kind == "gpt":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "activation_function": "gelu_new", "n_embd": H, "n_head": HEADS,
                "n_layer": LAYERS, "n_positions": POS, "n_inner": None, "vocab_size": vocab,
                "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                "attn_pdrop": 0.0, "tie_word_embeddings": True, "initializer_range": 0.02,
                "scale_attn_weights": True, "torch_dtype": "float32"}
    if kind == "mixtral":
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_act": "silu", "hidden_size": H, "intermediate_size": 24,
                "num_attention_heads": HEADS, "num_key_value_heads": 2, "num_hidden_layers": LAYERS,
                "head_dim": 8, "max_position_embeddings": 64, "vocab_size": vocab,
                "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None,
                "num_local_experts": EXPERTS, "num_experts_per_tok": 2,
                "output_router_logits": False, "router_aux_loss_coef": 0.02,
                "router_jitter_noise": 0.0, "tie_word_embeddings": False,
                "torch_dtype": "float32"}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": H, "intermediate_size": 48, "num_attention_heads": HEADS,
            "num_key_value_heads": 2, "num_hidden_layers": LAYERS, "head_dim": 8,
            "max_position_embeddings": 64, "vocab_size": vocab, "rms_norm_eps": 1e-6,
            "rope_theta": 500000.0, "rope_scaling": None, "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32"}


def to_bytes(a, dtype):
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    if dtype == "BF16":  # round to nearest even
        u = a.astype("<f4").view("<u4").astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
        return u.tobytes()
    if dtype == "I32":
        return a.astype("<i4").tobytes()
    raise ValueError(dtype)


def safetensors(path, named):  # named: {name: (dtype, shape, bytes)}
    header, data, at = {}, b"", 0
    for name in sorted(named, key=lambda n: (-len(named[n][2]) // max(1, np.prod(named[n][1])), n)):
        dtype, shape, raw = named[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def bf16_values(a):
    u = a.astype("<f4").view("<u4").astype(np.uint64)
    u = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype("<u4")
    return u.view("<f4")


def write(folder, kind, damage, dtype, round_bf16=False):
    vocab = 200 if damage == "vocab" else VOCAB
    t = tensors(kind, vocab)
    if round_bf16:
        t = {n: bf16_values(a) for n, a in t.items()}
    cfg = config(kind, vocab)
    first = next(n for n in t if ".0." in n and ("c_fc.weight" in n or "gate_proj" in n or "w1.weight" in n))
    if damage == "shape":
        t[first] = t[first][..., :-16] if kind == "gpt" else t[first][:-16]
    if damage == "missing":
        del t["transformer.h.1.attn.c_proj.weight" if kind == "gpt" else
              "model.layers.1.self_attn.k_proj.weight"]
    if damage == "extra":
        t["transformer.h.0.attn.q_norm.weight" if kind == "gpt" else
          "model.layers.0.self_attn.q_norm.weight"] = np.ones(8, np.float32)
    if damage == "base":
        t = {n.replace("transformer.", ""): a for n, a in t.items()}
        for i in range(LAYERS):
            t[f"h.{i}.attn.bias"] = np.tril(np.ones((POS, POS), np.float32))[None, None]
        t["lm_head.weight"] = t["wte.weight"].copy()
    if damage == "lmhead":
        t["lm_head.weight"] = t["transformer.wte.weight"] + 1.0
    if damage == "arch":
        cfg["architectures"] = ["MistralForCausalLM"]
    if damage == "eps":
        cfg["layer_norm_epsilon" if kind == "gpt" else "rms_norm_eps"] = 1e-3
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    named = {n: ("I32" if damage == "dtype" and n == first else dtype, a.shape,
                 to_bytes(a, "I32" if damage == "dtype" and n == first else dtype))
             for n, a in t.items()}
    if damage in ("sharded", "shard-missing"):
        names = sorted(named)
        half = {n: named[n] for n in names[: len(names) // 2]}
        rest = {n: named[n] for n in names[len(names) // 2:]}
        files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        safetensors(os.path.join(folder, files[0]), half)
        if damage == "sharded":
            safetensors(os.path.join(folder, files[1]), rest)
        index = {"metadata": {"total_size": sum(len(v[2]) for v in named.values())},
                 "weight_map": {**{n: files[0] for n in half}, **{n: files[1] for n in rest}}}
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
        return
    path = os.path.join(folder, "model.safetensors")
    safetensors(path, named)
    if damage == "header":
        raw = bytearray(open(path, "rb").read())
        raw[8:12] = b"{oops"[:4]
        open(path, "wb").write(bytes(raw))
    if damage == "truncated":
        raw = open(path, "rb").read()
        open(path, "wb").write(raw[: len(raw) - 100])


def read(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        raw = open(os.path.join(folder, name), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        for k, v in header.items():
            if k == "__metadata__":
                continue
            b, e = v["data_offsets"]
            assert v["dtype"] == "F32", (k, v["dtype"])
            out[k] = np.frombuffer(raw[8 + n + b:8 + n + e], "<f4").reshape(v["shape"])
    return out


def compare(a, b, tol=0.0):
    ta, tb = read(a), read(b)
    if sorted(ta) != sorted(tb):
        sys.exit(f"the tensors differ: {sorted(set(ta) ^ set(tb))}")
    if any(ta[n].shape != tb[n].shape for n in ta):
        sys.exit("the shapes differ: " + ", ".join(n for n in ta if ta[n].shape != tb[n].shape))
    worst = max(float(np.abs(ta[n] - tb[n]).max()) for n in ta)
    if tol == 0.0:
        print(f"{len(ta)} tensors, largest difference {worst:g}")
    else:
        print(f"{len(ta)} tensors, largest difference within {tol:g}")
    if worst > tol:
        sys.exit(f"not equal: largest difference {worst:g}")


if __name__ == "__main__":
    if sys.argv[1] == "write":
        args = sys.argv[2:]
        damage = args[args.index("--damage") + 1] if "--damage" in args else ""
        dtype = args[args.index("--dtype") + 1] if "--dtype" in args else "F32"
        write(args[0], args[1], damage, dtype, "--bf16-values" in args)
    else:
        compare(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
