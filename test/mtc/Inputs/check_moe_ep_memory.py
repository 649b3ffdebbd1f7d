"""Checks the memory plan of an expert-parallel run against the same model at
ep 1, from the model's sizes alone: the rank holds num_experts / ep of each
MoE layer's stacked experts, each split over etp (weights, gradients, Adam's
two moments), and the all-to-all volume is the rows it sends in a step's
exchanges among the S = etp x ep ranks, as the runtime sends them. The optional last argument is etp
(default 1)."""
import json
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
# Per MoE layer and micro-batch: the forward's dispatch and combine and the
# backward's (each the other's VJP), every row to another rank (worst case):
# a dispatch sends the rank's tokens x topk rows to the etp ranks of each
# row's expert. A combine holds R = S x tokens x min(topk, experts / ep)
# rows: with etp > 1 it all-reduces them over the etp ranks holding the same
# rows (a ring sends 2 (etp - 1) / etp of them), then returns the rows of
# the ep - 1 other sources of its own etp rank, R / S from each.
rows_out = etp * tokens * topk
received = sources * tokens * min(topk, experts // ep)
rows_back = (ep - 1) * received // sources + 2 * (etp - 1) * received // etp
per_layer = 2 * (rows_out + rows_back) * hidden * f32
expected = layers * micro * per_layer
assert a2a == {"bytes_per_step": expected, "dispatcher": "alltoall",
               "expert_model_parallel": ep, "expert_tensor_parallel": etp,
               "worst_case": True}, (a2a, expected)
print("ok", r1["weights"] - r2["weights"], expected)
