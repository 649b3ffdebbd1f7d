#!/usr/bin/env python3
"""Checks tools/mt_import_megatron_ckpt.py on checkpoints of a bf16 or fp16
megatron-core run (Megatron-Core 0.16, on the CPU).

usage: megatron_import_16bit.py WORKDIR SRC_ROOT bf16|fp16

megatron-core builds the Llama-style tiny model of megatron_import_check.py
as Megatron-LM's --bf16 / --fp16 does (params_dtype, Float16Module), wraps
torch's AdamW (Megatron's two parameter groups) in megatron-core's
Float16OptimizerWithFloat16Params (fp32 main parameters; for fp16 a
DynamicGradScaler), trains ITERS iterations and saves them in both of
Megatron's formats with the optimizer. Each is converted for an mt plan of
the same precision, and
  (a) every weight of the mt checkpoint equals Megatron's 16-bit parameter,
      every fp32 master copy Megatron's main parameter and every Adam moment
      Megatron's, bit for bit; the loss scaler's state is Megatron's (fp16);
  (b) mtrun --load logs, at iteration ITERS+1, the loaded weights' loss,
      compared with megatron-core's forward in the same precision and with
      its fp32 forward of the same 16-bit weights, and at ITERS+2, after
      training ITERS+1 from the converted optimizer state, the loss Megatron
      gets after its own step.
Then the torch_dist checkpoint converts with --no-optim (weights only): the
weights are still Megatron's 16-bit parameters, bit for bit, with master
copies equal to them, and mtrun's loss at ITERS+1 is the same.

The losses are compared within TOL[precision], relative: one rounding of the
loss itself to the precision (2^-9 for bf16's 8-bit significand, 2^-12 for
fp16's 11 bits). The two programs round activations to 16 bits at different
points (megatron-core's local layers keep matmul outputs, norms and the
softmax's input in the model's dtype), but the loss is a mean over
GBS x SEQ tokens, over which those roundings average out: measured 4e-6
(bf16) and 1e-6 (fp16) at ITERS+1, 2e-5 and 6e-6 at ITERS+2. Each is printed
against megatron-core's forward in the precision and, at ITERS+1, against
its fp32 forward of the same 16-bit weights (1e-5 and 3e-7).

Besides megatron_import_check.py's shims, Float16OptimizerWithFloat16Params
needs two while it is built, none touching a value: torch.tensor(...,
device="cuda") makes its flag and scale tensors (found_inf, the overflow
buffer, the unit scale, DynamicGradScaler's scale and factors) on the CPU,
and Tensor.type() answers the CUDA type name ("torch.cuda.BFloat16Tensor")
for its check that parameters are CUDA tensors. Megatron's
DistributedDataParallel (CUDA buffers) is replaced by what it does to
gradients with one data-parallel rank: each micro-batch's gradient is added
into an fp32 main_grad (--accumulate-allreduce-grads-in-fp32, Megatron's
default with --bf16), which the optimizer takes.
"""
import contextlib
import os
import re
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_import_check as base  # noqa: E402  (reads WORKDIR and SRC_ROOT from argv)

WORK, SRC = base.WORK, base.SRC
ITERS, GBS, MBS, LR = base.ITERS, base.GBS, base.MBS, base.LR
TOL = {"bf16": 2.0 ** -9, "fp16": 2.0 ** -12}
LOSS_SCALE = 2.0 ** 12  # fp16's initial scale: 2^32, Megatron's default, overflows at once


@contextlib.contextmanager
def cpu_float16_optimizer():
    """Float16OptimizerWithFloat16Params and DynamicGradScaler built on the CPU."""
    tensor, type_ = torch.tensor, torch.Tensor.type

    def cpu_tensor(*a, **k):
        if str(k.get("device", "")) == "cuda":
            k["device"] = "cpu"
        return tensor(*a, **k)

    def cuda_type(self, *a, **k):
        t = type_(self, *a, **k)
        return t.replace("torch.", "torch.cuda.", 1) if not a and not k else t

    torch.tensor, torch.Tensor.type = cpu_tensor, cuda_type
    try:
        yield
    finally:
        torch.tensor, torch.Tensor.type = tensor, type_


def check(precision):
    from megatron.core import dist_checkpointing
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.module import Float16Module
    work = os.path.join(WORK, precision)
    os.makedirs(work)
    rng = torch.Generator().manual_seed(5)
    docs = [[torch.randint(0, base.VOCAB - 1, (int(torch.randint(5, 60, (1,), generator=rng)),),
                           generator=rng).tolist()] for _ in range(40)]
    base.make_dataset.write(os.path.join(work, "data"), "uint16", docs)
    spec = base.spec(work, True).replace("[training]", '[training]\nprecision = "%s"%s' % (
        precision, "\ninitial_loss_scale = %r" % LOSS_SCALE if precision == "fp16" else ""))
    open(os.path.join(work, "spec.toml"), "w").write(spec)
    plan = os.path.join(work, "plan")
    base.run("mtc", "compile", os.path.join(work, "spec.toml"), "-o", plan)
    n = GBS * (ITERS + 2)
    samples = base.run("mt-dataset", "samples", os.path.join(work, "data"), "--seq-length",
                       str(base.SEQ), "--num-samples", str(n), "--split", "100,0,0", "--seed",
                       str(base.SEED), "--show", str(n))
    rows = torch.tensor([[int(t) for t in l.split()] for l in samples.splitlines()])

    inner = base.build(True, precision)
    model = Float16Module(inner.config, inner)
    ocfg = OptimizerConfig(optimizer="adam", lr=LR, weight_decay=0.01, clip_grad=0.0,
                           bf16=precision == "bf16", fp16=precision == "fp16",
                           params_dtype=inner.config.params_dtype)
    adam = torch.optim.AdamW(_get_param_groups([model], ocfg, None), lr=LR, weight_decay=0.01)
    with cpu_float16_optimizer():
        scaler = DynamicGradScaler(initial_scale=LOSS_SCALE, min_scale=1.0, growth_factor=2.0,
                                   backoff_factor=0.5, growth_interval=1000,
                                   hysteresis=2) if precision == "fp16" else None
        opt = Float16OptimizerWithFloat16Params(adam, ocfg, scaler, lambda *a: None)
    sched = OptimizerParamScheduler(
        opt, init_lr=LR, max_lr=LR, min_lr=0.0, lr_warmup_steps=0, lr_decay_steps=n,
        lr_decay_style="constant", start_wd=0.01, end_wd=0.01, wd_incr_steps=n,
        wd_incr_style="constant")
    params = [p for p in model.parameters()]

    def train(it):
        opt.zero_grad()
        for p in params:
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
        for mb in range(GBS // MBS):
            b = rows[it * GBS + mb * MBS: it * GBS + (mb + 1) * MBS]
            (base.loss_of(model, b) / (GBS // MBS) * opt.get_loss_scale()).backward()
            for p in params:
                p.main_grad += p.grad.float()
                p.grad = None
        ok, _, _ = opt.step()
        if not ok:
            sys.exit(f"{precision}: Megatron's step {it + 1} overflowed; lower LOSS_SCALE")
        sched.step(GBS)

    def loss_on(m, it):
        with torch.no_grad():
            return base.loss_of(m, rows[it * GBS:(it + 1) * GBS]).item()

    for it in range(ITERS):
        train(it)
    want = loss_on(model, ITERS)
    fp32 = base.build(True)
    fp32.load_state_dict({k: v.float() for k, v in inner.state_dict().items()
                          if not k.endswith("_extra_state")}, strict=False)
    want32 = loss_on(fp32, ITERS)

    args = base.megatron_args(True, ITERS * GBS)
    args.bf16, args.fp16 = precision == "bf16", precision == "fp16"
    args.params_dtype = inner.config.params_dtype
    common = {"args": args, "checkpoint_version": 3.0, "iteration": ITERS,
              "opt_param_scheduler": sched.state_dict(),
              "num_floating_point_operations_so_far": 0}
    saves = {}
    d = os.path.join(work, "megatron-torch_dist")
    os.makedirs(os.path.join(d, "iter_%07d" % ITERS))
    sd = dict(common, model=model.sharded_state_dict())
    sd["optimizer"] = opt.sharded_state_dict(sd["model"])
    dist_checkpointing.save(sd, os.path.join(d, "iter_%07d" % ITERS))
    open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w").write(str(ITERS))
    saves["torch_dist"] = d
    d = os.path.join(work, "megatron-torch")
    os.makedirs(os.path.join(d, "iter_%07d" % ITERS, "mp_rank_00"))
    args.ckpt_format = "torch"
    torch.save(dict(common, model=model.state_dict_for_save_checkpoint(),
                    optimizer=opt.state_dict(), rng_state=[{"random_rng_state": None}]),
               os.path.join(d, "iter_%07d" % ITERS, "mp_rank_00", "model_optim_rng.pt"))
    open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w").write(str(ITERS))
    saves["torch"] = d

    names = {id(p): n.removeprefix("module.") for n, p in model.named_parameters()}
    ref = {names[id(p)]: p.detach().float().numpy().copy() for p in params}
    mains = {names[id(p)]: p.main_param.detach().numpy().copy() for p in params}
    by_main = {id(p.main_param): names[id(p)] for p in params}
    moments = {(by_main[id(p)], k): v.numpy().copy() for p, st in adam.state.items()
               for k, v in st.items() if k != "step"}
    gs = scaler.state_dict() if scaler is not None else None
    scale = None if gs is None else (float(gs["scale"]), int(gs["growth_tracker"]),
                                     int(gs["hysteresis_tracker"]))
    assert all(a.dtype == np.float32 for a in mains.values())
    train(ITERS)
    want_next = loss_on(model, ITERS + 1)
    print(f"{precision}: megatron-core loss on batch {ITERS + 1}: {want:.7g} ({precision}), "
          f"{want32:.7g} (fp32 forward of the {precision} weights); after training it, on "
          f"batch {ITERS + 2}: {want_next:.7g}")

    failures = []

    def compare(fmt, out, optim):
        meta, t = base.mt_checkpoint.load(out)
        diff = [n for n, a in ref.items() if not np.array_equal(t[n], a)]
        masters = mains if optim else ref
        diff += [n + ".master" for n, a in masters.items()
                 if not np.array_equal(t[n + ".master"], a)]
        if optim:
            diff += [f"{n}.{k}" for (n, k), a in moments.items()
                     if not np.array_equal(t[f"{n}.{k}"], a)]
            if scale is not None:
                got = (meta["loss_scale"], meta["loss_scale_growth_tracker"],
                       meta["loss_scale_hysteresis_tracker"])
                diff += [f"loss scale {got} (Megatron's {scale})"] if got != scale else []
        else:
            diff += [n for n in meta["tensors"] if n.endswith(".exp_avg") or
                     n.endswith(".exp_avg_sq") if np.any(t[n])]
        print(f"{fmt}: {len(ref)} weights, {len(masters)} master copies"
              + (f", {len(moments)} moments" if optim else "") + f", differing: {diff or 'none'}")
        failures.extend([f"{fmt} tensors"] if diff else [])
        mt = base.run("mtrun", plan, "--load", out)
        for it, w in ((ITERS + 1, want), (ITERS + 2, want_next)) if optim else (
                (ITERS + 1, want),):
            line = next(l for l in mt.splitlines() if re.search(rf"iteration +{it}/", l))
            got = float(re.search(r"lm loss: ([0-9.E+-]+)", line).group(1))
            rel = abs(got - w) / abs(w)
            extra = f", against the fp32 forward {abs(got - want32) / want32:.1e}" \
                if it == ITERS + 1 else ""
            print(f"{fmt}: mtrun loss at iteration {it} {got:.7g}, rel {rel:.1e}{extra}")
            failures.extend([f"{fmt} loss {it}"] if rel > TOL[precision] else [])

    tool = os.path.join(SRC, "tools", "mt_import_megatron_ckpt.py")
    for fmt, d in saves.items():
        out = os.path.join(work, "mt-" + fmt)
        log = base.run(sys.executable, tool, d, "--plan", plan, "-o", out, both=True)
        print(log.strip().replace(WORK, "WORK"))
        compare(fmt, out, True)
    out = os.path.join(work, "mt-weights")
    log = base.run(sys.executable, tool, saves["torch_dist"], "--plan", plan, "-o", out,
                   "--no-optim", both=True)
    print(log.strip().replace(WORK, "WORK"))
    compare("weights only", out, False)
    print(f"{precision}: " + ("all match" if not failures else "FAILED: " + ", ".join(failures)))
    return not failures


def main():
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a: None
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + os.path.join(WORK, "rendezvous"), rank=0, world_size=1)
    from megatron.core import parallel_state, tensor_parallel
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    ok = all([check(p) for p in sys.argv[3:]])
    torch.distributed.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":  # dist_checkpointing's writer starts processes that import this
    main()
