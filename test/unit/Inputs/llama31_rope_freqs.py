#!/usr/bin/env python3
"""RoPE inverse frequencies with Llama 3.1's scaling, in plain Python floats.

Written from the Llama 3.1 rule (Hugging Face's `llama3` rope_type, which
Megatron-LM's RotaryEmbedding._apply_scaling follows): with low and high
frequency factors 1 and 4 and 8192 original positions, a frequency whose
wavelength exceeds 8192 is divided by the factor, one whose wavelength is
below 2048 is kept, and one in between is interpolated linearly in
8192 / wavelength. Prints one line per (head_dim, base, factor, pair):
the reference that CpuKernelsTest's RopeScaling test reads
(test/unit/Inputs/llama31_rope_freqs.txt; test/mtrun/rope-scaling.test
regenerates it and checks the two agree).
"""
import math

CASES = [(128, 500000.0, 8.0), (64, 10000.0, 32.0), (8, 10000.0, 8.0)]


def llama31(dim, base, factor, low=1.0, high=4.0, old_context=8192.0):
    out = []
    for j in range(0, dim, 2):
        freq = 1.0 / base ** (j / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            out.append(freq)
        elif wavelen > old_context / low:
            out.append(freq / factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


for dim, base, factor in CASES:
    for j, f in enumerate(llama31(dim, base, factor)):
        print("%d %r %r %d %r" % (dim, base, factor, j, f))
