#!/usr/bin/env python3
"""Gives a compiled dense plan the router-loss outputs of an MoE model, to
test mtrun's log of them apart from the MoE lowering.

usage: router_loss_plan.py SCHEMA IN OUT MOE_LAYERS BALANCING Z_COEFF NAME...

The plan goes through flatc's JSON form (flatc and SCHEMA, plan.fbs) and
back. The training table gets moe_layers, moe_load_balancing_type and
moe_z_loss_coeff; every train_step program that outputs "loss" also
outputs it as each NAME (load_balancing_loss, seq_load_balancing_loss,
z_loss), as a stage would output the sums of its MoE layers' router
losses. The logged value of NAME is then Megatron's tracker value of that
output: the loss summed over the pipeline group, averaged over micro-
batches, divided by MOE_LAYERS (and averaged over data parallelism except
for z_loss). The header is rewritten (payload size, FNV-1a checksum).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

schema, src, dst, layers, balancing, z_coeff = sys.argv[1:7]
names = sys.argv[7:]
data = open(src, "rb").read()
header, payload = data[:32], data[32:]
tmp = tempfile.mkdtemp()
try:
    open(os.path.join(tmp, "plan.bin"), "wb").write(payload)
    subprocess.run(["flatc", "--json", "--strict-json", "--raw-binary", "-o", tmp, schema, "--",
                    os.path.join(tmp, "plan.bin")], check=True)
    plan = json.load(open(os.path.join(tmp, "plan.json")))
    plan["training"]["moe_layers"] = int(layers)
    plan["training"]["moe_load_balancing_type"] = balancing
    plan["training"]["moe_z_loss_coeff"] = float(z_coeff)
    for rank in plan["ranks"]:
        for prog in rank["programs"]:
            if not prog["name"].startswith("train_step") or "loss" not in prog.get("output_names", []):
                continue
            loss = prog["outputs"][prog["output_names"].index("loss")]
            for name in names:
                prog["outputs"].append(loss)
                prog["output_names"].append(name)
    json.dump(plan, open(os.path.join(tmp, "plan.json"), "w"))
    subprocess.run(["flatc", "--binary", "-o", tmp, schema, os.path.join(tmp, "plan.json")],
                   check=True)
    payload = open(os.path.join(tmp, "plan.bin"), "rb").read()
finally:
    shutil.rmtree(tmp)

fnv = 0xcbf29ce484222325
for b in payload:
    fnv = ((fnv ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
out = bytearray(header)
out[16:24] = len(payload).to_bytes(8, "little")
out[24:32] = fnv.to_bytes(8, "little")
open(dst, "wb").write(bytes(out) + payload)
