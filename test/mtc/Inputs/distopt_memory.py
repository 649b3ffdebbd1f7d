# Checks `mtc compile --report=json` figures against the distributed
# optimizer's bytes per parameter (Megatron-LM's formula): bf16/fp16
# 2 + 4 + (4 + 4 + 4) / dp, fp32 4 + 4 + (4 + 4) / dp. mt pads the flat
# buffers (each tensor starts at a multiple of 256 bytes of its type, each
# bucket is a multiple of dp * that), so the formula holds exactly for the
# padded element count F, and F exceeds the parameter count by at most
# (align - 1) per tensor plus dp * align per bucket.
# usage: distopt_memory.py REPORT.json DP PRECISION [BUCKETS]
import json
import sys

report, dp, precision = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
buckets = int(sys.argv[4]) if len(sys.argv) > 4 else 1
rank = report["memory"]["ranks"][0]
params, tensors = report["parameters"]["total"], report["parameters"]["tensors"]
half = precision != "fp32"
elem = 2 if half else 4
align = 256 // elem
F = rank["weights"] // elem
assert rank["weights"] == elem * F, rank
assert rank["grads"] == 4 * F, (rank["grads"], F)
assert rank["master_weights"] == (4 * F // dp if half else 0), (rank["master_weights"], F)
assert rank["optimizer_moments"] == 8 * F // dp, (rank["optimizer_moments"], F)
assert params <= F <= params + tensors * (align - 1) + buckets * dp * align, (params, F)
assert report["memory"]["note"] == "", report["memory"]["note"]
state = rank["weights"] + rank["grads"] + rank["master_weights"] + rank["optimizer_moments"]
per = (6 + 12 / dp) if half else (8 + 8 / dp)
assert state == per * F, (state, per, F)
print(f"{state} bytes = {per:g} bytes x {F} elements ({params} parameters + {F - params} padding)")
