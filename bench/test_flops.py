"""Checks bench/flops.py against numbers worked out by hand.

Run: python3 -m unittest discover -s bench -p 'test_*.py'
"""
import os
import unittest

from flops import megatron_flops, model_flops, peak_tflops_for
from gpt_spec import ONE_GPU, load_spec, model_config, parse_set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# GPT-2 124M as models/gpt-125m.toml has it: 12 layers, hidden 768, 12 heads,
# MLP 3072, sequence 1024, vocabulary 50257 padded to 50304.
L, H, F, A, S, V = 12, 768, 3072, 12, 1024, 50304


class GptFlops(unittest.TestCase):
    def test_gpt2_124m_by_hand(self):
        # Per token and layer: QKV 6*768*2304 = 10,616,832; causal core
        # attention 6*768*1024 = 4,718,592; output projection 6*768*768 =
        # 3,538,944; MLP 6*768*3072*2 = 28,311,552. Logits 6*768*50304 =
        # 231,800,832. Per token 12*47,185,920 + 231,800,832 = 798,031,872.
        self.assertEqual(megatron_flops(1, S, L, H, F, A, V), 798_031_872 * S)
        self.assertEqual(megatron_flops(128, S, L, H, F, A, V), 128 * 798_031_872 * S)

    def test_six_n_plus_attention(self):
        # 6 FLOPs per weight-matrix parameter per token (the embedding counted
        # once, as the tied output layer's GEMM) plus the attention scores.
        matrices = L * (4 * H * H + 2 * H * F) + V * H
        attention = L * 6 * H * S
        self.assertEqual(megatron_flops(1, S, L, H, F, A, V), S * (6 * matrices + attention))

    def test_closed_forms(self):
        b = 8
        # The current formula for a GPT: 72 B s L h^2 (1 + s / (12 h)) + 6 B s h V.
        self.assertAlmostEqual(megatron_flops(b, S, L, H, F, A, V),
                               72 * b * S * L * H**2 * (1 + S / (12 * H)) + 6 * b * S * H * V,
                               delta=1)
        # Without the causal halving: 72 B s L h^2 (1 + s / (6 h) + V / (12 L h)).
        self.assertAlmostEqual(megatron_flops(b, S, L, H, F, A, V, causal=False),
                               72 * b * S * L * H**2 * (1 + S / (6 * H) + V / (12 * L * H)),
                               delta=1)

    def test_gqa_and_swiglu(self):
        # Llama-3-8B's shape: 32 query heads of 128 over 8 key/value groups,
        # SwiGLU MLP of 14336, vocabulary 128256, sequence 2048.
        h, f, s, v = 4096, 14336, 2048, 128256
        per_layer = 6 * (h * (4096 + 2 * 1024) + 4096 * s + 4096 * h) + 6 * h * f * 3
        self.assertEqual(megatron_flops(1, s, 32, h, f, 32, v, query_groups=8, swiglu=True),
                         s * (32 * per_layer + 6 * h * v))

    def test_spec_presets(self):
        cfg = model_config(load_spec(os.path.join(ROOT, "models", "gpt-125m.toml")))
        self.assertEqual((cfg.padded_vocab, cfg.ffn_hidden, cfg.global_batch), (V, F, 128))
        self.assertEqual(model_flops(cfg), 128 * 798_031_872 * S)
        cfg = model_config(load_spec(os.path.join(ROOT, "models", "gpt-1.3b.toml"),
                                     ONE_GPU + ["training.global_batch_size=64"]))
        self.assertEqual((cfg.data_parallel, cfg.micro_batches, cfg.seq), (1, 32, 2048))

    def test_mixtral_8x7b(self):
        # models/mixtral-8x7b.toml: 32 MoE layers of 8 SwiGLU experts of
        # 14336, top-2, hidden 4096, 32 heads over 8 groups of 128, sequence
        # 4096, vocabulary 32000 (padded to 32000), global batch 256. Per
        # token and layer: QKV 6*4096*(4096+2*1024) = 150,994,944; causal core
        # 6*4096*4096 = 100,663,296; output 6*4096*4096 = 100,663,296; the two
        # experts a token goes through 6*4096*14336*3*2 = 2,113,929,216.
        # Logits 6*4096*32000 = 786,432,000. Per token 32*2,466,250,752 +
        # 786,432,000 = 79,706,456,064 (mtc's summary logs the same:
        # spec/SpecMoeTest.cpp).
        cfg = model_config(load_spec(os.path.join(ROOT, "models", "mixtral-8x7b.toml")))
        self.assertEqual((cfg.num_experts, cfg.moe_layers, cfg.moe_ffn_hidden, cfg.moe_topk),
                         (8, 32, 14336, 2))
        self.assertEqual(model_flops(cfg), 256 * 4096 * 79_706_456_064)

    def test_moe_layers_and_shared_expert(self):
        # Every other layer of 4 an MoE layer ("([1]*1+[0]*1)*2", Megatron's
        # list expression): 2 dense MLPs of 128, 2 MoE layers with top-2 of
        # experts of 64 and a shared expert of 32, GeLU MLPs (2 GEMMs).
        h, s, v = 32, 16, 128
        attention = 6 * (h * 3 * h + h * s + h * h)
        mlp = 6 * h * 2 * (2 * 128 + 2 * (64 * 2 + 32))
        spec = {"model": {"num_layers": 4, "hidden_size": h, "num_attention_heads": 4,
                          "seq_length": s, "vocab_size": v, "ffn_hidden_size": 128,
                          "num_experts": 4, "moe_ffn_hidden_size": 64,
                          "moe_layer_freq": "([1]*1+[0]*1)*2",
                          "moe_shared_expert_intermediate_size": 32},
                "training": {"micro_batch_size": 1, "train_iters": 1, "lr": 1e-3}}
        cfg = model_config(spec)
        self.assertEqual(cfg.moe_layers, 2)
        self.assertEqual(model_flops(cfg), s * (4 * attention + mlp + 6 * h * v))
        # The same layers as a list, and as every second layer (an integer).
        for freq in ([1, 0, 1, 0], 2, "2"):
            spec["model"]["moe_layer_freq"] = freq
            self.assertEqual(model_flops(model_config(spec)), s * (4 * attention + mlp + 6 * h * v))
        # A dense model is unchanged: no MoE fields, the dense MLP only.
        self.assertEqual(megatron_flops(1, s, 4, h, 128, 4, v),
                         s * (4 * attention + 4 * 6 * h * 2 * 128 + 6 * h * v))
        spec["model"]["moe_layer_freq"] = "__import__('os')"
        with self.assertRaises(ValueError):
            model_config(spec)

    def test_parse_set(self):
        self.assertEqual(parse_set("model.seq_length=2048"), ("model", "seq_length", 2048))
        self.assertEqual(parse_set('training.precision="bf16"'), ("training", "precision", "bf16"))
        with self.assertRaises(ValueError):
            parse_set("training.precision=bf16")

    def test_peaks(self):
        self.assertEqual(peak_tflops_for("NVIDIA H100 80GB HBM3"), 989.0)
        self.assertEqual(peak_tflops_for("NVIDIA H200"), 989.0)
        self.assertEqual(peak_tflops_for("NVIDIA H100 PCIe"), 756.0)
        self.assertIsNone(peak_tflops_for("NVIDIA GeForce RTX 5080"))


if __name__ == "__main__":
    unittest.main()
