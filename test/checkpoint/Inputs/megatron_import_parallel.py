#!/usr/bin/env python3
"""Checks tools/mt_import_megatron_ckpt.py on checkpoints megatron-core wrote
from tensor 2 x pipeline 2 ranks (four Gloo processes on the CPU).

usage: megatron_import_parallel.py WORKDIR SRC_ROOT

A Llama-style model (4 layers: two per stage; SwiGLU, so linear_fc1's shards
are [gate; up] each; GQA; untied) is built on each of the four ranks with
megatron-core's local layer spec, its AdamW state made non-zero by one step
on fixed gradients, and saved as Megatron-LM saves it in both formats: the
torch format (mp_rank_TT_PPP/model_optim_rng.pt, a stage's layers numbered
from 0) and torch_dist (dist_checkpointing.save from all four ranks).
The reference is megatron-core's own resharding: one process builds the
same model at tensor 1 x pipeline 1 and loads the torch_dist checkpoint
into it with dist_checkpointing.load. Both conversions must give its
weights exactly, the torch format's moments must equal torch_dist's (where
megatron-core placed every shard by its own sharding metadata), and mtrun's
loss must equal that model's forward on the same batch (fp32, relative
error < 1e-5). The CPU shims are those of megatron_import_check.py.
"""
import argparse
import contextlib
import os
import re
import subprocess
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_import_check as base  # noqa: E402

TP, PP, LAYERS, ITER = 2, 2, 4, 1


def shims():
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a: None


def build(pre, post):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=base.HIDDEN, num_attention_heads=base.HEADS,
        num_query_groups=2, ffn_hidden_size=48, use_cpu_initialization=True,
        normalization="RMSNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, init_method_std=0.02,
        tensor_model_parallel_size=torch.distributed.get_world_size() // PP
        if torch.distributed.get_world_size() > 1 else 1,
        pipeline_model_parallel_size=PP if torch.distributed.get_world_size() > 1 else 1,
        pipeline_dtype=torch.float32)
    return GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"),
                    vocab_size=base.VOCAB, max_sequence_length=base.SEQ,
                    position_embedding_type="rope", share_embeddings_and_output_weights=False,
                    pre_process=pre, post_process=post)


def args_ns():
    a = base.megatron_args(True, base.GBS * ITER)
    a.num_layers = LAYERS
    a.tensor_model_parallel_size, a.pipeline_model_parallel_size = TP, PP
    return a


def save_rank(rank, work):
    shims()
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + os.path.join(work, "rendezvous-4"), rank=rank,
        world_size=TP * PP)
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups
    from megatron.core.optimizer.optimizer import FP32Optimizer
    ps.initialize_model_parallel(TP, PP)
    torch.manual_seed(base.SEED + ps.get_pipeline_model_parallel_rank())
    model = build(ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage())
    ocfg = OptimizerConfig(optimizer="adam", lr=base.LR, weight_decay=0.01, clip_grad=0.0)
    adam = torch.optim.AdamW(_get_param_groups([model], ocfg, None), lr=base.LR)
    g = torch.Generator().manual_seed(100 + rank)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    adam.step()
    opt = FP32Optimizer.__new__(FP32Optimizer)
    opt.optimizer, opt.config, opt.is_stub_optimizer = adam, ocfg, False
    common = {"args": args_ns(), "checkpoint_version": 3.0, "iteration": ITER,
              "opt_param_scheduler": {"num_steps": base.GBS * ITER}}
    tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    legacy = os.path.join(work, "megatron-torch", "iter_%07d" % ITER,
                          "mp_rank_%02d_%03d" % (tp, pp))
    os.makedirs(legacy)
    torch.save(dict(common, model=model.state_dict_for_save_checkpoint(),
                    optimizer=opt.state_dict()), os.path.join(legacy, "model_optim_rng.pt"))
    dist = os.path.join(work, "megatron-torch_dist", "iter_%07d" % ITER)
    if rank == 0:
        os.makedirs(dist)
    torch.distributed.barrier()
    sd = dict(common, model=model.sharded_state_dict())
    sd["optimizer"] = opt.sharded_state_dict(sd["model"])
    dist_checkpointing.save(sd, dist)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main():
    work, src = sys.argv[1], sys.argv[2]
    base.make_dataset  # noqa: B018  (the dataset writer)
    rng = torch.Generator().manual_seed(5)
    docs = [[torch.randint(0, base.VOCAB - 1, (int(torch.randint(5, 60, (1,), generator=rng)),),
                           generator=rng).tolist()] for _ in range(40)]
    base.make_dataset.write(os.path.join(work, "data"), "uint16", docs)
    spec = base.spec(work, True).replace("num_layers = 2", "num_layers = %d" % LAYERS)
    spec = spec.replace("train_iters = %d" % (base.ITERS + 2), "train_iters = %d" % (ITER + 1))
    open(os.path.join(work, "spec.toml"), "w").write(spec)
    plan = os.path.join(work, "plan")
    base.run("mtc", "compile", os.path.join(work, "spec.toml"), "-o", plan)
    samples = base.run("mt-dataset", "samples", os.path.join(work, "data"), "--seq-length",
                       str(base.SEQ), "--num-samples", str(base.GBS * (ITER + 1)), "--split",
                       "100,0,0", "--seed", str(base.SEED), "--show", str(base.GBS * (ITER + 1)))
    rows = torch.tensor([[int(t) for t in l.split()] for l in samples.splitlines()])

    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=save_rank, args=(r, work)) for r in range(TP * PP)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        sys.exit("a saving rank failed: exit codes %s" % [p.exitcode for p in procs])
    for fmt in ("torch", "torch_dist"):
        open(os.path.join(work, "megatron-" + fmt, "latest_checkpointed_iteration.txt"),
             "w").write(str(ITER))

    # The reference: megatron-core reshards the torch_dist checkpoint to one rank.
    shims()
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + os.path.join(work, "rendezvous-1"), rank=0,
        world_size=1)
    from megatron.core import dist_checkpointing, parallel_state as ps, tensor_parallel
    ps.initialize_model_parallel(1, 1)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    model = build(True, True)
    # common.pt holds the args namespace (and Megatron's enums in it), which
    # torch.load's weights_only default refuses; Megatron-LM's loader allows
    # them. These files are the test's own.
    load = torch.load
    torch.load = lambda *a, **k: load(*a, **dict(k, weights_only=False))
    loaded = dist_checkpointing.load(model.sharded_state_dict(), os.path.join(
        work, "megatron-torch_dist", "iter_%07d" % ITER))
    torch.load = load
    keys = set(model.state_dict())  # the common state (args, ...) comes back too
    model.load_state_dict({k: v for k, v in loaded.items() if k in keys})
    model.eval()
    with torch.no_grad():
        want = base.loss_of(model, rows[ITER * base.GBS:]).item()
    ref = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    print(f"megatron-core at tensor 1 x pipeline 1, resharded by dist_checkpointing.load: "
          f"loss on batch {ITER + 1}: {want:.7g}")

    failures, moments = [], {}
    for fmt in ("torch", "torch_dist"):
        out = os.path.join(work, "mt-" + fmt)
        log = base.run(sys.executable, os.path.join(src, "tools", "mt_import_megatron_ckpt.py"),
                       os.path.join(work, "megatron-" + fmt), "--plan", plan, "-o", out,
                       both=True)
        print(log.strip().replace(work, "WORK"))
        meta, t = base.mt_checkpoint.load(out)
        diff = [n for n, a in ref.items() if not np.array_equal(t[n], a)]
        moments[fmt] = {n: a for n, a in t.items() if ".exp_avg" in n}
        print(f"{fmt}: {len(ref)} weights, differing from megatron-core's: {diff or 'none'}")
        failures += [f"{fmt} weights"] if diff else []
        mt = base.run("mtrun", plan, "--load", out)
        line = next(l for l in mt.splitlines() if re.search(rf"iteration +{ITER + 1}/", l))
        got = float(re.search(r"lm loss: ([0-9.E+-]+)", line).group(1))
        rel = abs(got - want) / abs(want)
        print(f"{fmt}: mtrun loss at iteration {ITER + 1} {got:.7g}, rel {rel:.1e}")
        failures += [f"{fmt} loss"] if rel > 1e-5 else []
    a, b = moments["torch"], moments["torch_dist"]
    diff = sorted(n for n in set(a) | set(b)
                  if n not in a or n not in b or not np.array_equal(a[n], b[n]))
    nonzero = sum(int(np.any(v != 0)) for v in a.values())
    print(f"moments: {len(a)} ({nonzero} non-zero), torch vs torch_dist differing: "
          f"{diff or 'none'}")
    failures += ["moments"] if diff or nonzero != len(a) else []
    torch.distributed.destroy_process_group()
    print("tp2 x pp2: " + ("all match" if not failures else "FAILED: " + ", ".join(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
