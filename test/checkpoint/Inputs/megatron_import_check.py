#!/usr/bin/env python3
"""Checks tools/mt_import_megatron_ckpt.py against checkpoints written by the real
megatron-core (0.16) on the CPU.

usage: megatron_import_check.py WORKDIR SRC_ROOT MODEL...

MODEL is llama (RMSNorm, SwiGLU, RoPE, grouped-query attention, untied output
layer, no biases) or gpt (LayerNorm, GeLU, learned positions, tied embeddings,
biases). For each, megatron-core builds a tiny GPTModel with its local (non
TransformerEngine) layer spec, trains it ITERS steps with torch's AdamW in
Megatron's two parameter groups (megatron.core.optimizer._get_param_groups)
wrapped in megatron-core's FP32Optimizer, and saves it as Megatron-LM's
training loop does (megatron/training/checkpointing.py: args, iteration, model,
optimizer, opt_param_scheduler) in both formats: torch_dist through
megatron.core.dist_checkpointing.save with the model's and the optimizer's
sharded state dicts, and torch as iter_XXXXXXX/mp_rank_00/model_optim_rng.pt.
Each is converted for a plan of the same model, and
  (a) every weight and Adam moment of the mt checkpoint equals Megatron's exactly;
  (b) mtrun --load trains iterations ITERS+1 and ITERS+2; the first's logged
      loss is the loaded weights' loss on its batch (read with `mt-dataset
      samples`) and equals megatron-core's forward on the same tokens, and the
      second's equals Megatron's after it too trained iteration ITERS+1 from its
      state (AdamW's moments and step count, the scheduler's position): fp32,
      relative error < 1e-5.

megatron-core's CPU path needs three shims, none of which touches the numbers:
torch.cuda.current_device returns "cpu" (RoPE moves its frequencies there),
torch.cuda.synchronize does nothing, and the model-parallel RNG tracker's fork
is a no-op (dropout is 0). (The torch_dist writer's memory probe needs psutil,
which megatron-core's wheel does not require: test/reference-packages.txt pins
it.) FP32Optimizer
is built without its __init__, which allocates a CUDA tensor for its loss
scale; its state_dict and sharded_state_dict are megatron-core's own.
"""
import argparse
import contextlib
import os
import re
import subprocess
import sys

import numpy as np
import torch

WORK, SRC = sys.argv[1], sys.argv[2]
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(SRC, "test", "dataset", "Inputs"))
sys.path.insert(0, os.path.join(SRC, "tools"))
import make_dataset  # noqa: E402
import mt_checkpoint  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, VOCAB = 2, 32, 4, 16, 128
MBS, GBS, SEED, ITERS, LR = 2, 4, 1234, 2, 1e-2


def run(*cmd, both=False):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr if both else r.stdout


def spec(work, llama):
    model = """num_query_groups = 2
ffn_hidden_size = 48
normalization = "RMSNorm"
norm_epsilon = 1e-5
swiglu = true
position_embedding_type = "rope"
untie_embeddings_and_output_weights = true
add_bias_linear = false""" if llama else "ffn_hidden_size = 128"
    return f"""
[model]
num_layers = {LAYERS}
hidden_size = {HIDDEN}
num_attention_heads = {HEADS}
seq_length = {SEQ}
max_position_embeddings = {SEQ}
vocab_size = {VOCAB}
hidden_dropout = 0.0
attention_dropout = 0.0
{model}

[training]
micro_batch_size = {MBS}
global_batch_size = {GBS}
train_iters = {ITERS + 2}
clip_grad = 0.0
weight_decay = 0.01
lr = {LR}
lr_decay_style = "constant"
seed = {SEED}
eval_iters = 0
log_interval = 1

[data]
data_path = "{work}/data"
split = "100,0,0"
"""


def megatron_args(llama, consumed):
    """The args namespace Megatron-LM's training loop saves (names of
    megatron/training/arguments.py), for this model."""
    from megatron.core.transformer.enums import AttnBackend
    return argparse.Namespace(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
        ffn_hidden_size=48 if llama else 128, kv_channels=HIDDEN // HEADS,
        group_query_attention=llama, num_query_groups=2 if llama else 1,
        normalization="RMSNorm" if llama else "LayerNorm", norm_epsilon=1e-5,
        swiglu=llama, position_embedding_type="rope" if llama else "learned_absolute",
        rotary_base=10000, rotary_percent=1.0, use_rope_scaling=False,
        max_position_embeddings=SEQ, seq_length=SEQ,
        untie_embeddings_and_output_weights=llama, add_bias_linear=not llama,
        add_qkv_bias=False, apply_layernorm_1p=False, num_experts=None, qk_layernorm=False,
        squared_relu=False, multi_latent_attention=False, vocab_size=None,
        padded_vocab_size=VOCAB, make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        consumed_train_samples=consumed, consumed_valid_samples=0,
        micro_batch_size=MBS, global_batch_size=GBS, lr=LR, bf16=False, fp16=False,
        optimizer="adam", use_distributed_optimizer=False, ckpt_format="torch_dist",
        attention_backend=AttnBackend.auto)


def build(llama, precision="fp32"):
    """The model; in bf16 or fp16 as Megatron-LM's --bf16 / --fp16 build it
    (params_dtype, then Float16Module, which casts the inputs and the loss)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    torch.manual_seed(SEED)
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
        num_query_groups=2 if llama else None, ffn_hidden_size=48 if llama else 128,
        use_cpu_initialization=True, normalization="RMSNorm" if llama else "LayerNorm",
        layernorm_epsilon=1e-5, gated_linear_unit=llama,
        activation_func=torch.nn.functional.silu if llama else torch.nn.functional.gelu,
        bias_activation_fusion=not llama, add_bias_linear=not llama,
        hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02,
        bf16=precision == "bf16", fp16=precision == "fp16",
        params_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32))
    return GPTModel(cfg, get_gpt_layer_local_spec(normalization=cfg.normalization),
                    vocab_size=VOCAB, max_sequence_length=SEQ,
                    position_embedding_type="rope" if llama else "learned_absolute",
                    share_embeddings_and_output_weights=not llama)


def loss_of(model, batch):
    tokens, labels = batch[:, :-1], batch[:, 1:]
    pos = torch.arange(SEQ).unsqueeze(0).expand_as(tokens)
    mask = torch.triu(torch.ones(SEQ, SEQ), 1).bool()[None, None]
    return model(tokens, pos, mask, labels=labels).float().mean()


def check(kind):
    from megatron.core import dist_checkpointing
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups
    from megatron.core.optimizer.optimizer import FP32Optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    llama = kind == "llama"
    work = os.path.join(WORK, kind)
    os.makedirs(work)
    rng = torch.Generator().manual_seed(5)
    docs = [[torch.randint(0, VOCAB - 1, (int(torch.randint(5, 60, (1,), generator=rng)),),
                           generator=rng).tolist()] for _ in range(40)]
    make_dataset.write(os.path.join(work, "data"), "uint16", docs)
    open(os.path.join(work, "spec.toml"), "w").write(spec(work, llama))
    plan = os.path.join(work, "plan")
    run("mtc", "compile", os.path.join(work, "spec.toml"), "-o", plan)
    samples = run("mt-dataset", "samples", os.path.join(work, "data"), "--seq-length", str(SEQ),
                  "--num-samples", str(GBS * (ITERS + 2)), "--split", "100,0,0", "--seed",
                  str(SEED), "--show", str(GBS * (ITERS + 2)))
    rows = torch.tensor([[int(t) for t in l.split()] for l in samples.splitlines()])

    # Megatron trains ITERS iterations on mt's first batches.
    model = build(llama)
    ocfg = OptimizerConfig(optimizer="adam", lr=LR, weight_decay=0.01, clip_grad=0.0)
    adam = torch.optim.AdamW(_get_param_groups([model], ocfg, None), lr=LR, weight_decay=0.01)
    opt = FP32Optimizer.__new__(FP32Optimizer)
    opt.optimizer, opt.config, opt.is_stub_optimizer = adam, ocfg, False
    sched = OptimizerParamScheduler(
        opt, init_lr=LR, max_lr=LR, min_lr=0.0, lr_warmup_steps=0, lr_decay_steps=GBS * (ITERS + 2),
        lr_decay_style="constant", start_wd=0.01, end_wd=0.01, wd_incr_steps=GBS * (ITERS + 2),
        wd_incr_style="constant")
    def train(it):
        adam.zero_grad()
        for mb in range(GBS // MBS):
            b = rows[it * GBS + mb * MBS: it * GBS + (mb + 1) * MBS]
            (loss_of(model, b) / (GBS // MBS)).backward()
        adam.step()
        sched.step(GBS)

    def loss_on(it):
        with torch.no_grad():
            return loss_of(model, rows[it * GBS:(it + 1) * GBS]).item()

    for it in range(ITERS):
        train(it)
    want = loss_on(ITERS)
    args = megatron_args(llama, ITERS * GBS)
    base = {"args": args, "checkpoint_version": 3.0, "iteration": ITERS,
            "opt_param_scheduler": sched.state_dict(),
            "num_floating_point_operations_so_far": 0}

    saves = {}
    d = os.path.join(work, "megatron-torch_dist")
    os.makedirs(os.path.join(d, "iter_%07d" % ITERS))
    sd = dict(base, model=model.sharded_state_dict())
    sd["optimizer"] = opt.sharded_state_dict(sd["model"])
    dist_checkpointing.save(sd, os.path.join(d, "iter_%07d" % ITERS))
    open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w").write(str(ITERS))
    saves["torch_dist"] = d
    d = os.path.join(work, "megatron-torch")
    os.makedirs(os.path.join(d, "iter_%07d" % ITERS, "mp_rank_00"))
    args.ckpt_format = "torch"
    torch.save(dict(base, model=model.state_dict_for_save_checkpoint(),
                    optimizer=opt.state_dict(), rng_state=[{"random_rng_state": None}]),
               os.path.join(d, "iter_%07d" % ITERS, "mp_rank_00", "model_optim_rng.pt"))
    open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w").write(str(ITERS))
    saves["torch"] = d

    names = {id(p): n for n, p in model.named_parameters()}
    ref = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    moments = {(names[id(p)], k): v.numpy().copy() for p, st in adam.state.items()
               for k, v in st.items() if k != "step"}
    # Megatron goes on: iteration ITERS + 1 from the saved state, then the loss
    # of the batch after it.
    train(ITERS)
    want_next = loss_on(ITERS + 1)
    failures = []
    print(f"{kind}: megatron-core loss on batch {ITERS + 1}: {want:.7g}, after training "
          f"it, on batch {ITERS + 2}: {want_next:.7g}")
    for fmt, d in saves.items():
        out = os.path.join(work, "mt-" + fmt)
        log = run(sys.executable, os.path.join(SRC, "tools", "mt_import_megatron_ckpt.py"), d,
                  "--plan", plan, "-o", out, both=True)
        print(log.strip().replace(WORK, "WORK"))
        meta, t = mt_checkpoint.load(out)
        diff = [n for n, a in ref.items() if not np.array_equal(t[n], a)]
        diff += [f"{n}.{k}" for (n, k), a in moments.items()
                 if not np.array_equal(t[f"{n}.{k}"], a)]
        extra = sorted(set(meta["tensors"]) - {n for n in ref}
                       - {f"{n}.{k}" for n, k in moments})
        print(f"{fmt}: {len(ref)} weights, {len(moments)} moments, "
              f"differing: {diff or 'none'}, unexpected: {extra or 'none'}")
        failures += [f"{fmt} tensors"] if diff or extra else []
        mt = run("mtrun", plan, "--load", out)
        for it, w in ((ITERS + 1, want), (ITERS + 2, want_next)):
            line = next(l for l in mt.splitlines() if re.search(rf"iteration +{it}/", l))
            got = float(re.search(r"lm loss: ([0-9.E+-]+)", line).group(1))
            rel = abs(got - w) / abs(w)
            print(f"{fmt}: mtrun loss at iteration {it} {got:.7g}, rel {rel:.1e}")
            failures += [f"{fmt} loss {it}"] if rel > 1e-5 else []
    print(f"{kind}: " + ("all match" if not failures else "FAILED: " + ", ".join(failures)))
    return not failures


def main():
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a: None
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + os.path.join(WORK, "rendezvous"), rank=0, world_size=1)
    from megatron.core import parallel_state, tensor_parallel
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    ok = all([check(kind) for kind in sys.argv[3:]])
    torch.distributed.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":  # dist_checkpointing's writer starts processes that import this
    main()
