"""Checks the memory plan of an expert-parallel run against the same model at
ep 1, from the model's sizes alone: the rank holds num_experts / ep of each
MoE layer's stacked experts (weights, gradients, Adam's two moments), and
the all-to-all volume is the rows it sends in a step's exchanges."""
import json
import sys

one, ep_run = (json.load(open(p)) for p in sys.argv[1:3])
layers, experts, hidden, ffn, topk, tokens, ep, micro = (int(a) for a in sys.argv[3:11])
fc1 = 2 * ffn  # SwiGLU
expert_params = layers * experts * (fc1 * hidden + hidden * ffn)
held_away = expert_params - expert_params // ep
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
# a dispatch sends the rank's tokens x topk rows, a combine the rows it got
# from its ep - 1 peers, tokens x min(topk, experts / ep) from each.
rows_out = tokens * topk
rows_back = (ep - 1) * tokens * min(topk, experts // ep)
per_layer = 2 * (rows_out + rows_back) * hidden * f32
expected = layers * micro * per_layer
assert a2a == {"bytes_per_step": expected, "dispatcher": "alltoall",
               "expert_model_parallel": ep, "worst_case": True}, (a2a, expected)
print("ok", r1["weights"] - r2["weights"], expected)
