"""Model FLOPs per training iteration, counted as Megatron-LM counts them.

This is the transformer branch of `num_floating_point_operations` in
Megatron-LM's megatron/training/training.py (its `transformer_flops()`, the
version with separate query/key/value projection sizes and the causal
halving of the core attention; no MTP or multi-latent attention, which
mt's specs do not have). Per token of the global batch:

    L * 6 * ( h * (q + 2 kv)        QKV projection
            + q * s                 QK^T and (QK^T)V over the causal half
            + q * h )               attention output projection
  + (L - M) * 6 * h * f * (3 if SwiGLU else 2)          dense MLPs
  + M * 6 * h * (f_e * k + f_s) * (3 if SwiGLU else 2)  MoE layers
  + 6 * h * V                               logits (output layer)

where M of the L layers are mixture-of-experts layers: a token goes through
k = moe_router_topk routed experts of width f_e = moe_ffn_hidden_size and
the shared expert of width f_s (0 without one). Megatron's formula counts
no router GEMM (h x num_experts per token, small beside the experts), and
neither does this one; Spec::flopsPerIteration, whose figure mtrun logs,
counts the same.

with L layers, hidden size h, q = kv_channels x heads, kv = kv_channels x
query groups (GQA), MLP width f, sequence length s and the padded
vocabulary V. The 6 is 3 GEMMs (forward, data gradient, weight gradient)
times 2 FLOPs per multiply-add. Only matrix multiplications count: norms,
softmax, GeLU, dropout, the optimizer and recomputation add nothing, so
MFU is comparable between frameworks that recompute differently.

For a GPT with q = kv = h and f = 4h this is

    72 B s L h^2 (1 + s / (12 h)) + 6 B s h V

Megatron's older formula (before the causal halving, and in Narayanan et al.
2021, appendix "Floating-point operations") counts the whole s x s score
matrix: 72 B s L h^2 (1 + s / (6 h) + V / (12 L h)). `causal=False` gives
that one, for comparison with numbers published against it.
"""


def megatron_flops(batch, seq, layers, hidden, ffn_hidden, heads, padded_vocab,
                   kv_channels=None, query_groups=None, swiglu=False, causal=True,
                   moe_layers=0, moe_ffn_hidden=None, moe_topk=2, shared_expert_ffn=0):
    """FLOPs of one iteration over `batch` sequences (the global batch).

    moe_layers of the layers are mixture-of-experts layers (moe_ffn_hidden
    defaults to ffn_hidden, as Megatron's --moe-ffn-hidden-size does)."""
    kv_channels = kv_channels or hidden // heads
    query_groups = query_groups or heads
    q = kv_channels * heads
    kv = kv_channels * query_groups
    # With causal=False the s x s scores count whole, as the older formula does.
    core = q * seq if causal else 2 * q * seq
    attention = 6 * (hidden * (q + 2 * kv) + core + q * hidden)
    expansion = 3 if swiglu else 2
    moe_ffn_hidden = ffn_hidden if moe_ffn_hidden is None else moe_ffn_hidden
    mlp = 6 * hidden * expansion * (ffn_hidden * (layers - moe_layers)
                                    + (moe_ffn_hidden * moe_topk + shared_expert_ffn) * moe_layers)
    logits = 6 * hidden * padded_vocab
    return batch * seq * (layers * attention + mlp + logits)


def model_flops(cfg, batch=None):
    """megatron_flops for a gpt_spec.ModelConfig; batch defaults to its global batch."""
    return megatron_flops(batch if batch is not None else cfg.global_batch, cfg.seq,
                          cfg.layers, cfg.hidden, cfg.ffn_hidden, cfg.heads, cfg.padded_vocab,
                          cfg.kv_channels, cfg.query_groups, cfg.swiglu,
                          moe_layers=cfg.moe_layers, moe_ffn_hidden=cfg.moe_ffn_hidden,
                          moe_topk=cfg.moe_topk, shared_expert_ffn=cfg.shared_expert_ffn)


# Dense BF16 tensor-core peak (TFLOP/s, without sparsity) by the name
# nvidia-smi prints. H100 SXM and H200 share the same GH100 compute: 989.
PEAK_BF16_TFLOPS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),   # "NVIDIA H100 80GB HBM3" is the SXM part
    ("H200", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
]


def peak_tflops_for(gpu_name):
    """The dense bf16 peak for an nvidia-smi GPU name, or None if not known."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in gpu_name:
            return tflops
    return None
