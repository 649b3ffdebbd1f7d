"""Megatron-Core 0.16's mixture-of-experts layer in PyTorch (fp32 or fp64),
written from megatron/core/transformer/moe/router.py and moe_utils.py, as the
independent reference of test/mtrun's MoE checks.

Tokens are in Megatron's order: hidden states [s, b, h] flattened to
[s * b, h] (row j * b + i is sequence i's position j). Ties in a top-k go
to the lower index (a stable sort), where torch.topk makes no promise.
"""
import math

import torch


class Config:
    def __init__(self, experts, topk, capacity_factor=None, drop_policy="probs", pad=False):
        self.experts, self.topk = experts, topk
        self.capacity_factor, self.drop_policy, self.pad = capacity_factor, drop_policy, pad


def topk_indices(scores, k, dim):
    """torch.topk's indices along dim, ties to the lower index."""
    return torch.sort(scores, dim=dim, descending=True, stable=True)[1].narrow(dim, 0, k)


def route(logits, cfg):
    """TopKRouter.routing on logits [T, E] (softmax over the chosen logits):
    probs and routing map after the capacity, and the switch load-balancing
    loss and the z-loss without their coefficients."""
    tokens, experts = logits.shape
    z = torch.logsumexp(logits, dim=-1).square().mean()                 # z_loss_func
    top = topk_indices(logits, cfg.topk, 1)
    chosen = torch.gather(logits, 1, top)
    probs = torch.zeros_like(logits).scatter(1, top, torch.softmax(chosen, dim=-1))
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top, True)
    if cfg.capacity_factor is not None:
        # apply_router_token_dropping: get_capacity(T * k, E, factor); each
        # expert keeps its top-`capacity` tokens by weight (probs) or by
        # being routed (position); padding makes that set the routing map.
        capacity = math.ceil(tokens * cfg.topk / experts * cfg.capacity_factor)
        if capacity <= tokens:
            key = routing_map.int() if cfg.drop_policy == "position" else probs.detach()
            keep = torch.zeros_like(routing_map).scatter(0, topk_indices(key, capacity, 0), True)
            routing_map = keep if cfg.pad else routing_map & keep
            probs = probs * routing_map
    # compute_routing_scores_for_aux_loss + switch_load_balancing_loss_func.
    scores = torch.softmax(logits, dim=-1)
    aux_map = torch.zeros_like(logits).scatter(1, topk_indices(scores, cfg.topk, 1), 1.0)
    aux = (scores.sum(0) * aux_map.sum(0)).sum() * experts / (cfg.topk * tokens * tokens)
    return probs, routing_map, aux, z


def experts_swiglu(x, probs, routing_map, fc1, fc2):
    """Each expert's SwiGLU MLP (fc1 [E, 2F, H], fc2 [E, H, F]) over its
    tokens, combined with the routing weights."""
    out = torch.zeros_like(x)
    for e in range(fc1.shape[0]):
        rows = routing_map[:, e].nonzero().squeeze(1)
        gate, up = torch.chunk(x[rows] @ fc1[e].T, 2, dim=-1)
        y = (torch.nn.functional.silu(gate) * up) @ fc2[e].T
        out = out.index_add(0, rows, y * probs[rows, e:e + 1])
    return out


def moe_mlp(h, router, fc1, fc2, cfg):
    """The MoE MLP on h [b, s, H] (mt's layout): out [b, s, H], aux, z."""
    b, s, hidden = h.shape
    x = h.transpose(0, 1).reshape(s * b, hidden)
    probs, routing_map, aux, z = route(x @ router.T, cfg)
    out = experts_swiglu(x, probs, routing_map, fc1, fc2)
    return out.view(s, b, hidden).transpose(0, 1), aux, z
