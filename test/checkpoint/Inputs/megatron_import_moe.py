#!/usr/bin/env python3
"""Checks tools/mt_import_megatron_ckpt.py's mixture-of-experts layers against
a model built by the real megatron-core (0.16) on the CPU.

usage: megatron_import_moe.py WORKDIR SRC_ROOT

megatron-core builds a tiny GPTModel with MoE layers (its local layer spec:
SequentialMLP experts; 4 experts of 24, top-2, SwiGLU, the aux loss on,
RMSNorm, RoPE, grouped-query attention, untied output) and saves it as
Megatron-LM does, without optimizer state, in four ways:
  torch_dist         dist_checkpointing.save of the model's sharded state dict
                     (mlp.experts.linear_fc1.weight, the experts whole);
  torch              iter_0000000/mp_rank_00/model_optim_rng.pt with
                     SequentialMLP's names (mlp.experts.local_experts.{e}...);
  torch-te-grouped   the same file in TEGroupedMLP's names
                     (mlp.experts.linear_fc1.weight{e});
  torch-grouped      the same file in GroupedMLP's names (mlp.experts.weight1
                     [H, E x 2F] and weight2 [E x F, H], the views its forward
                     takes of them: weight1.view(E, H, -1)[e] is expert e's fc1
                     transposed).
TransformerEngine (TEGroupedMLP) and the grouped_gemm package (GroupedMLP) are
not installed here, so those two are the SequentialMLP weights written in
their classes' names and layouts (megatron/core/transformer/moe/experts.py).
Each is converted for a plan of the same model, and
  (a) every weight of the mt checkpoint equals Megatron's exactly, expert e
      of the stacked [E, ...] tensors being Megatron's expert e;
  (b) mtrun --load's loss on its first batch equals megatron-core's forward
      on the same tokens (fp32, relative error < 1e-5).

megatron-core's CPU path needs the shims of megatron_import_check.py, and one
more: its router's gating GEMM tests a TransformerEngine name that is not
bound without TransformerEngine (moe_utils.te_general_gemm), set to None,
which selects its plain torch GEMM.
"""
import argparse
import contextlib
import io
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
import mt_import_megatron_ckpt as tool  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, VOCAB = 2, 32, 4, 16, 128
EXPERTS, MOE_FFN, TOPK = 4, 24, 2
MBS, GBS, SEED = 2, 4, 1234

SPEC = """
[model]
num_layers = {LAYERS}
hidden_size = {HIDDEN}
num_attention_heads = {HEADS}
num_query_groups = 2
ffn_hidden_size = 48
seq_length = {SEQ}
max_position_embeddings = {SEQ}
vocab_size = {VOCAB}
normalization = "RMSNorm"
norm_epsilon = 1e-5
swiglu = true
position_embedding_type = "rope"
untie_embeddings_and_output_weights = true
add_bias_linear = false
hidden_dropout = 0.0
attention_dropout = 0.0
num_experts = {EXPERTS}
moe_ffn_hidden_size = {MOE_FFN}
moe_router_topk = {TOPK}
moe_aux_loss_coeff = 0.01

[training]
micro_batch_size = {MBS}
global_batch_size = {GBS}
train_iters = 1
lr = 1e-2
lr_decay_style = "constant"
seed = {SEED}
eval_iters = 0
log_interval = 1

[data]
data_path = "{work}/data"
split = "100,0,0"
"""


def run(*cmd, both=False):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr if both else r.stdout


def megatron_args():
    """The args Megatron-LM's training loop saves (megatron/training/arguments.py)."""
    from megatron.core.transformer.enums import AttnBackend
    return argparse.Namespace(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=48,
        kv_channels=HIDDEN // HEADS, group_query_attention=True, num_query_groups=2,
        normalization="RMSNorm", norm_epsilon=1e-5, swiglu=True, position_embedding_type="rope",
        rotary_base=10000, rotary_percent=1.0, use_rope_scaling=False,
        max_position_embeddings=SEQ, seq_length=SEQ, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, add_qkv_bias=False, apply_layernorm_1p=False,
        num_experts=EXPERTS, moe_ffn_hidden_size=MOE_FFN, moe_router_topk=TOPK,
        moe_layer_freq=1, moe_shared_expert_intermediate_size=None,
        moe_router_score_function="softmax", moe_router_pre_softmax=False,
        moe_router_topk_scaling_factor=None, moe_expert_capacity_factor=None,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01,
        moe_router_enable_expert_bias=False, moe_use_shared_expert_gate=False,
        moe_router_num_groups=None, moe_grouped_gemm=False, expert_model_parallel_size=1,
        qk_layernorm=False, squared_relu=False, multi_latent_attention=False, vocab_size=None,
        padded_vocab_size=VOCAB, make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        consumed_train_samples=0, consumed_valid_samples=0, micro_batch_size=MBS,
        global_batch_size=GBS, lr=1e-2, bf16=False, fp16=False, optimizer="adam",
        use_distributed_optimizer=False, ckpt_format="torch_dist",
        attention_backend=AttnBackend.auto)


def build():
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    torch.manual_seed(SEED)
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=2,
        ffn_hidden_size=48, use_cpu_initialization=True, normalization="RMSNorm",
        layernorm_epsilon=1e-5, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        bias_activation_fusion=False, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, init_method_std=0.1, num_moe_experts=EXPERTS,
        moe_ffn_hidden_size=MOE_FFN, moe_router_topk=TOPK, moe_aux_loss_coeff=0.01,
        moe_router_load_balancing_type="aux_loss", moe_token_dispatcher_type="allgather")
    spec = get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False,
                                    normalization="RMSNorm")
    return GPTModel(cfg, spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                    position_embedding_type="rope", share_embeddings_and_output_weights=False)


def renamed(sd, kind):
    """SequentialMLP's state dict in TEGroupedMLP's or GroupedMLP's names."""
    out, fc = {}, {}
    for name, t in sd.items():
        hit = re.match(r"(decoder\.layers\.\d+\.mlp\.experts\.)local_experts\.(\d+)\.(linear_fc[12])"
                       r"\.weight$", name)
        if not hit:
            if "local_experts" not in name:  # their _extra_state goes
                out[name] = t
            continue
        prefix, e, lin = hit.group(1), int(hit.group(2)), hit.group(3)
        if kind == "te-grouped":
            out[f"{prefix}{lin}.weight{e}"] = t
        else:
            fc.setdefault((prefix, lin), {})[e] = t
    for (prefix, lin), per in fc.items():  # [E, H, F1] viewed as [H, E x F1]; [E, F, H] as [E x F, H]
        stacked = torch.stack([per[e].t() for e in range(EXPERTS)]).contiguous()
        out[prefix + ("weight1" if lin == "linear_fc1" else "weight2")] = (
            stacked.reshape(HIDDEN, -1) if lin == "linear_fc1" else stacked.reshape(-1, HIDDEN))
    return out


def main():
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a: None
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + os.path.join(WORK, "rendezvous"), rank=0, world_size=1)
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    import megatron.core.transformer.moe.moe_utils as moe_utils
    moe_utils.te_general_gemm = getattr(moe_utils, "te_general_gemm", None)
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()

    rng = torch.Generator().manual_seed(5)
    docs = [[torch.randint(0, VOCAB - 1, (int(torch.randint(5, 60, (1,), generator=rng)),),
                           generator=rng).tolist()] for _ in range(40)]
    make_dataset.write(os.path.join(WORK, "data"), "uint16", docs)
    open(os.path.join(WORK, "spec.toml"), "w").write(SPEC.format(work=WORK, **globals()))
    plan = os.path.join(WORK, "plan")
    run("mtc", "compile", os.path.join(WORK, "spec.toml"), "-o", plan)
    samples = run("mt-dataset", "samples", os.path.join(WORK, "data"), "--seq-length", str(SEQ),
                  "--num-samples", str(GBS), "--split", "100,0,0", "--seed", str(SEED),
                  "--show", str(GBS))
    batch = torch.tensor([[int(t) for t in l.split()] for l in samples.splitlines()])

    model = build()
    with torch.no_grad():
        tokens, labels = batch[:, :-1], batch[:, 1:]
        pos = torch.arange(SEQ).unsqueeze(0).expand_as(tokens)
        mask = torch.triu(torch.ones(SEQ, SEQ), 1).bool()[None, None]
        want = model(tokens, pos, mask, labels=labels).float().mean().item()
    print(f"megatron-core loss on batch 1: {want:.7g}")
    # mt's names: the experts stacked, expert e at [e].
    ref, experts = {}, {}
    for n, p in model.named_parameters():
        hit = re.match(r"(.*\.mlp\.experts\.)local_experts\.(\d+)\.(.*)$", n)
        if hit:
            experts.setdefault(hit.group(1) + hit.group(3), {})[int(hit.group(2))] = p
        else:
            ref[n] = p.detach().numpy().copy()
    for n, per in experts.items():
        ref[n] = np.stack([per[e].detach().numpy() for e in range(EXPERTS)])

    base = {"args": megatron_args(), "checkpoint_version": 3.0, "iteration": 0,
            "num_floating_point_operations_so_far": 0}
    saves = {}
    d = os.path.join(WORK, "megatron-torch_dist")
    os.makedirs(os.path.join(d, "iter_0000000"))
    dist_checkpointing.save(dict(base, model=model.sharded_state_dict()),
                            os.path.join(d, "iter_0000000"))
    open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w").write("0")
    saves["torch_dist"] = d
    sd = model.state_dict_for_save_checkpoint()
    for fmt, names in (("torch", sd), ("torch-te-grouped", renamed(sd, "te-grouped")),
                       ("torch-grouped", renamed(sd, "grouped"))):
        d = os.path.join(WORK, "megatron-" + fmt)
        os.makedirs(os.path.join(d, "iter_0000000", "mp_rank_00"))
        args = megatron_args()
        args.ckpt_format = "torch"
        torch.save(dict(base, args=args, model=names, rng_state=[{"random_rng_state": None}]),
                   os.path.join(d, "iter_0000000", "mp_rank_00", "model_optim_rng.pt"))
        open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w").write("0")
        saves[fmt] = d

    failures = []
    for fmt, d in saves.items():
        out = os.path.join(WORK, "mt-" + fmt)
        # The tool in this process (its main, as the command line runs it):
        # torch is imported once.
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            status = tool.main([d, "--plan", plan, "-o", out, "--no-optim"])
        print(text.getvalue().strip().replace(WORK, "WORK"))
        if status != 0:
            sys.exit(f"{fmt}: the conversion failed")
        _, t = mt_checkpoint.load(out)
        diff = [n for n, a in ref.items() if n not in t or not np.array_equal(t[n], a)]
        extra = sorted(n for n in t if n not in ref and not n.endswith((".exp_avg",
                                                                       ".exp_avg_sq")))
        print(f"{fmt}: {len(ref)} weights ({len(experts)} of them stacked experts), "
              f"differing: {diff or 'none'}, unexpected: {extra or 'none'}")
        failures += [f"{fmt} tensors"] if diff or extra else []
        if fmt == "torch_dist":
            mt = run("mtrun", plan, "--load", out)
            line = next(l for l in mt.splitlines() if re.search(r"iteration +1/", l))
            got = float(re.search(r"lm loss: ([0-9.E+-]+)", line).group(1))
            rel = abs(got - want) / abs(want)
            print(f"{fmt}: mtrun loss at iteration 1 {got:.7g}, rel {rel:.1e}")
            failures += [f"{fmt} loss"] if rel > 1e-5 else []
    print("moe: " + ("all match" if not failures else "FAILED: " + ", ".join(failures)))
    torch.distributed.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":  # dist_checkpointing's writer starts processes that import this
    main()
