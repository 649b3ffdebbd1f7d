# Checks `mtc compile --report=json` figures of tensor-parallel plans against
# Megatron-LM's accounting (Korthikanti et al., "Reducing Activation
# Recomputation in Large Transformer Models"), per layer and in bf16 with
# selective recompute:
#   sequence parallel:     34 s b h / t bytes
#   no sequence parallel:  s b h (10 + 24 / t) bytes
# mt's graph stores the same tensors except the two dropout masks (one byte
# per element of the attention output and of the MLP output, 2 s b h), which
# it regenerates from its counter-based RNG: 32 / t and 8 + 24 / t, plus
# the attention's log-sum-exp, f32 [b, a / t, s] (4 b a s / t bytes), which
# the flash backward reads instead of the s x s probabilities. Megatron's
# formula leaves it out as negligible (0.2% of a layer or less here); the
# arena holds it for every layer until the backward, so it is counted
# exactly rather than hoped to fit in a layout hole.
# The per-layer figure is the activation difference of two depths over the
# layers added (the peak is at the same point for both).
# And the persistent state is 18 bytes per parameter held (bf16 weights 2,
# f32 gradients 4, f32 master 4, Adam m and v 8), on each rank's shard, up
# to alignment padding.
# usage: tp_memory.py MODEL.toml   (runs the mtc on PATH)
import json
import subprocess
import sys
import tomllib

model = sys.argv[1]
common = ["--set", 'training.precision="bf16"', "--set",
          'parallel.recompute_granularity="selective"', "--set", "training.global_batch_size=8",
          "--report=json"]


def report(layers, t=1, sp=False):
    args = ["mtc", "compile", model, "--set", f"model.num_layers={layers}"] + common
    if t > 1:
        args += ["--set", f"parallel.tensor_model_parallel_size={t}", "--set",
                 f"parallel.sequence_parallel={'true' if sp else 'false'}", "--set",
                 f"cluster.gpus_per_node={t}"]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


one = report(4)
with open(model, "rb") as f:
    preset = tomllib.load(f)
s, h = preset["model"]["seq_length"], preset["model"]["hidden_size"]
a = preset["model"]["num_attention_heads"]
b = preset["training"]["micro_batch_size"]
for t in (2, 4):
    for sp in (False, True):
        r1, r2 = report(4, t, sp), report(8, t, sp)
        a1 = r1["memory"]["ranks"][0]["activations"]
        a2 = r2["memory"]["ranks"][0]["activations"]
        per_layer = (a2 - a1) / 4
        mt_units = 32 / t if sp else 8 + 24 / t
        megatron_units = 34 / t if sp else 10 + 24 / t
        lse = 4 * b * (a // t) * s
        assert per_layer == s * b * h * mt_units + lse, (t, sp, per_layer,
                                                         s * b * h * mt_units + lse)
        print(f"tp {t} {'with' if sp else 'without'} sequence parallelism: "
              f"{(per_layer - lse) / (s * b * h):g} s*b*h per layer (Megatron {megatron_units:g}, "
              f"less the 2{'/t' if sp else ''} of dropout masks)")
        rank = r1["memory"]["ranks"][0]
        w = rank["weights"]
        # Every tensor starts 256-byte aligned in each kind of state, so the
        # f32 kinds may differ from 2, 2 and 4 times the bf16 weights by less
        # than 256 bytes per tensor.
        pad = 256 * r1["parameters"]["tensors"]
        assert abs(rank["grads"] - 2 * w) < pad and rank["master_weights"] == rank["grads"], rank
        assert rank["optimizer_moments"] == 2 * rank["grads"], rank
        # Each rank holds 1/t of the split tensors and all of the replicated
        # ones (norms, row-parallel biases, position embeddings).
        w1 = one["memory"]["ranks"][0]["weights"]
        assert w1 / t <= w <= w1 / t * 1.1, (w, w1, t)
        print(f"  state 18 bytes per parameter held; weights per rank {w / w1:.4f} of one rank's")
