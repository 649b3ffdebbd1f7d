#!/usr/bin/env python3
"""Checks torch_moe.py, the PyTorch MoE reference, against hand-worked cases:
capacity drops of both policies in Megatron's token order (the cases of
test/unit/runtime/exec/CpuKernelsMoeTest.cpp), padding, the aux and z losses,
and the layer against a token-by-token loop."""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_moe  # noqa: E402

torch.set_default_dtype(torch.float64)
failures = []


def expect(what, got, want):
    ok = got == want if not isinstance(want, float) else abs(got - want) < 1e-12
    print(f"{what}: {'ok' if ok else f'got {got}, want {want}'}")
    if not ok:
        failures.append(what)


def experts_of(routing_map):
    return [[e for e in range(routing_map.shape[1]) if routing_map[r, e]]
            for r in range(routing_map.shape[0])]


# Two sequences of two tokens: mt's t0, t1 (sequence 0), t2, t3; Megatron's
# rows t0, t2, t1, t3. Logits t0 [0, 1], t1 [3, 0], t2 [1, 0], t3 [0, 2].
rows = torch.tensor([[0.0, 1.0], [1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])   # t0, t2, t1, t3

# Top-2 of 2 with capacity 2 (factor 0.5): by weight, expert 0 keeps t1
# (0.953) and t2 (0.731), expert 1 t3 (0.881) and t0 (0.731); by position,
# both keep Megatron's first rows, t0 and t2.
probs, m, _, _ = torch_moe.route(rows, torch_moe.Config(2, 2, 0.5, "probs"))
expect("probs policy", experts_of(m), [[1], [0], [0], [1]])
expect("probs policy weight of t1", round(probs[2, 0].item(), 12),
       round(1 / (1 + math.exp(-3)), 12))
_, m, _, _ = torch_moe.route(rows, torch_moe.Config(2, 2, 0.5, "position"))
expect("position policy", experts_of(m), [[0, 1], [0, 1], [], []])
# Top-1, capacity 3 (factor 1.5), padded: expert 0 has t2, t1 and takes t0
# (row 0); expert 1 has t0, t3 and takes t2 (row 1), with weight 0.
probs, m, _, _ = torch_moe.route(rows, torch_moe.Config(2, 1, 1.5, "position", pad=True))
expect("padded", experts_of(m), [[0, 1], [0, 1], [0], [1]])
expect("padding weight", probs[0, 0].item(), 0.0)
# aux = E / (k T^2) sum_e tokens_e P_e: scores [.5, .5] and [.75, .25], both
# to expert 0: 2 / 4 * (1.25 * 2) = 1.25; z = mean(logsumexp^2).
_, _, aux, z = torch_moe.route(torch.tensor([[0.0, 0.0], [math.log(3), 0.0]]),
                               torch_moe.Config(2, 1))
expect("aux loss", aux.item(), 1.25)
expect("z loss", z.item(), (math.log(2) ** 2 + math.log(4) ** 2) / 2)

# The layer against a loop over mt's tokens (no capacity: each token's
# top-2 experts, softmax over their logits).
torch.manual_seed(0)
b, s, hidden, experts, ffn = 2, 3, 5, 4, 3
h = torch.randn(b, s, hidden)
router, fc1, fc2 = torch.randn(experts, hidden), torch.randn(experts, 2 * ffn, hidden), \
    torch.randn(experts, hidden, ffn)
out, _, _ = torch_moe.moe_mlp(h, router, fc1, fc2, torch_moe.Config(experts, 2))
worst = 0.0
for i in range(b):
    for j in range(s):
        x = h[i, j]
        logits = router @ x
        top = sorted(range(experts), key=lambda e: -logits[e].item())[:2]
        w = torch.softmax(logits[top], dim=0)
        want = torch.zeros(hidden)
        for k, e in enumerate(top):
            gate, up = (fc1[e] @ x).chunk(2)
            want += w[k] * (fc2[e] @ (torch.nn.functional.silu(gate) * up))
        worst = max(worst, (out[i, j] - want).abs().max().item())
expect("layer against a token loop", worst < 1e-12, True)
if failures:
    sys.exit("mismatch: " + ", ".join(failures))
print("all match")
