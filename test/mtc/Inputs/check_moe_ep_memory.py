"""Checks the memory plan of an expert-parallel run against the same model at
ep 1, from the model's sizes alone: the rank holds num_experts / ep of each
MoE layer's stacked experts, each split over etp (weights, gradients, Adam's
two moments), and the all-to-all volume is the rows it sends in a step's
exchanges among the S = etp x ep ranks, as the runtime sends them. The
optional arguments after the sizes: etp (default 1), then a
moe_dispatch_buffer_factor and the unbounded plan's json: the rows a rank
receives are then bounded at factor x the balanced load (S x tokens x topk /
ep) instead of the worst case, the volume and the activations shrink with
them, the rest stays."""
import json
import math
import sys

one, ep_run = (json.load(open(p)) for p in sys.argv[1:3])
layers, experts, hidden, ffn, topk, tokens, ep, micro = (int(a) for a in sys.argv[3:11])
etp = int(sys.argv[11]) if len(sys.argv) > 11 else 1
sources = etp * ep
fc1 = 2 * ffn  # SwiGLU
expert_params = layers * experts * (fc1 * hidden + hidden * ffn)
held_away = expert_params - expert_params // (ep * etp)
r1, r2 = one["memory"]["ranks"][0], ep_run["memory"]["ranks"][0]
f32 = 4
assert r1["weights"] - r2["weights"] == held_away * f32, (r1, r2)
assert r1["grads"] - r2["grads"] == held_away * f32, (r1, r2)
assert r1["optimizer_moments"] - r2["optimizer_moments"] == 2 * held_away * f32, (r1, r2)
assert ep_run["parameters"]["total"] == one["parameters"]["total"], "total counts every expert"
assert one["memory"]["all_to_all"] is None
a2a = ep_run["memory"]["all_to_all"]
factor = float(sys.argv[12]) if len(sys.argv) > 12 else None
# The rows a rank receives in one layer's exchange: every source's tokens x
# min(topk, experts / ep) at worst; bounded, factor x the balanced load.
worst = sources * tokens * min(topk, experts // ep)
received = min(worst, math.ceil(factor * sources * tokens * topk / ep)) if factor else worst
# Per MoE layer and micro-batch: the forward's dispatch and combine and the
# backward's (each the other's VJP), every row to another rank (worst case):
# a dispatch sends the rank's tokens x topk rows to the etp ranks of each
# row's expert. A combine holds the R received rows: with etp > 1 it
# reduce-scatters them over the etp ranks holding the same rows, each keeping
# the rows of its own etp rank's sources (a ring sends (etp - 1) / etp of
# them), then returns the rows of the ep - 1 other sources of its own etp
# rank, R / S from each.
rows_out = etp * tokens * topk
rows_back = (ep - 1) * received // sources + (etp - 1) * received // etp
per_layer = 2 * (rows_out + rows_back) * hidden * f32
expected = layers * micro * per_layer
want = {"bytes_per_step": expected, "dispatcher": "alltoall", "expert_model_parallel": ep,
        "expert_tensor_parallel": etp, "worst_case": factor is None,
        "receive_rows": received, "worst_case_receive_rows": worst,
        "moe_dispatch_buffer_factor": factor}
assert a2a == want, (a2a, want)
if factor:
    unbounded = json.load(open(sys.argv[13]))
    for b, u in zip(ep_run["memory"]["ranks"], unbounded["memory"]["ranks"]):
        assert b["activations"] < u["activations"], (b, u)
        for k in ("weights", "grads", "optimizer_moments"):
            assert b[k] == u[k], (k, b, u)
print("ok", r1["weights"] - r2["weights"], expected, received)
