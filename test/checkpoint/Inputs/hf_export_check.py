#!/usr/bin/env python3
"""Checks `mt-checkpoint to-hf` against transformers: the exported model,
loaded with AutoModelForCausalLM.from_pretrained, gives mt's loss on the
same batch (fp32, relative error < 1e-5).

usage: hf_export_check.py WORKDIR SRC_ROOT MODEL...

MODEL is gpt, llama, llama31 (llama with Llama 3.1's RoPE scaling) or
mixtral (llama's attention, 4 experts of 24 in every layer, top-2, the
aux loss on: MixtralForCausalLM), or from-mixtral (below),
optionally with a layout: llama:2x2 trains on tensor 2 x pipeline 2 ranks
(Gloo on the CPU). For each, mtrun trains a tiny model
3 iterations and saves; a second run loads that checkpoint and trains
iteration 4, whose logged lm loss is the checkpoint's loss on batch 4 (mean
cross-entropy over the padded vocabulary, as Megatron computes it). The
batch is read back with `mt-dataset samples`. The export with
--keep-padded-vocab must give that loss; the default export (the vocabulary
cut to the tokenizer's) must give the same logits over the real vocabulary;
a bf16 export in shards must load and agree to bf16's precision.
`gpt`: LayerNorm, tanh GeLU, biases, tied embeddings, learned positions
(GPT2LMHeadModel); `llama`: RMSNorm, SwiGLU, RoPE, grouped-query attention,
no biases, an untied output layer (LlamaForCausalLM).
`from-mixtral`: the other direction. transformers' own MixtralForCausalLM
(random weights, save_pretrained) goes through `mtc import-hf` and
`mt-checkpoint from-hf`; mtrun's loss on its first batch must be the
model's (the logits over the padded vocabulary: Megatron's padding repeats
the last row), and `to-hf` of that checkpoint gives the saved tensors back
bit for bit.
"""
import json
import os
import re
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

WORK, SRC = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SRC, "test", "dataset", "Inputs"))
import make_dataset  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, PADDED = 2, 32, 4, 16, 100, 128
MBS, GBS, SEED, ITERS = 2, 4, 1234, 4
LLAMA_KEYS = """
num_query_groups = 2
ffn_hidden_size = 48
normalization = "RMSNorm"
norm_epsilon = 1e-6
swiglu = true
position_embedding_type = "rope"
rotary_base = 500000
untie_embeddings_and_output_weights = true
add_bias_linear = false
"""


MOE_KEYS = """
num_experts = 4
moe_ffn_hidden_size = 24
moe_router_topk = 2
moe_aux_loss_coeff = 0.01
"""


def spec(work, llama, tp, pp, scaling, moe=False):
    scaled = "use_rope_scaling = true\nrope_scaling_factor = 8.0" if scaling else ""
    scaled += MOE_KEYS if moe else ""
    return f"""
[model]
num_layers = {LAYERS}
hidden_size = {HIDDEN}
num_attention_heads = {HEADS}
seq_length = {SEQ}
vocab_size = {VOCAB}
make_vocab_size_divisible_by = {PADDED // tp}
hidden_dropout = 0.0
attention_dropout = 0.0
{LLAMA_KEYS if llama else ""}
{scaled}
[parallel]
tensor_model_parallel_size = {tp}
pipeline_model_parallel_size = {pp}

[training]
micro_batch_size = {MBS}
global_batch_size = {GBS}
train_iters = {ITERS}
lr = 1e-2
lr_decay_style = "constant"
seed = {SEED}
eval_iters = 0
log_interval = 1

[data]
data_path = "{work}/data"
split = "100,0,0"

[cluster]
gpus_per_node = {tp * pp}
"""


def run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def check(model):
    kind, _, layout = model.partition(":")
    llama = kind in ("llama", "llama31", "mixtral")
    tp, pp = (int(n) for n in layout.split("x")) if layout else (1, 1)
    work = os.path.join(WORK, model.replace(":", "-"))
    os.makedirs(work)
    rng = torch.Generator().manual_seed(5)
    docs = [[torch.randint(0, VOCAB, (int(torch.randint(5, 60, (1,), generator=rng)),),
                           generator=rng).tolist()] for _ in range(40)]
    make_dataset.write(os.path.join(work, "data"), "uint16", docs)
    open(os.path.join(work, "spec.toml"), "w").write(spec(work, llama, tp, pp, kind == "llama31",
                                                         kind == "mixtral"))
    plan, ckpt = os.path.join(work, "plan"), os.path.join(work, "ckpt")
    nproc = ["--nproc", str(tp * pp)] if tp * pp > 1 else []
    run("mtc", "compile", os.path.join(work, "spec.toml"), "-o", plan)
    run("mtrun", plan, *nproc, "--train-iters", str(ITERS - 1), "--save", ckpt)
    out = run("mtrun", plan, *nproc, "--load", ckpt)
    line = next(l for l in out.splitlines() if re.search(rf"iteration +{ITERS}/", l))
    mt_loss = float(re.search(r"lm loss: ([0-9.E+-]+)", line).group(1))

    samples = run("mt-dataset", "samples", os.path.join(work, "data"), "--seq-length", str(SEQ),
                  "--num-samples", str(GBS * ITERS), "--split", "100,0,0", "--seed", str(SEED),
                  "--show", str(GBS * ITERS))
    rows = [[int(t) for t in l.split()] for l in samples.splitlines()]
    batch = torch.tensor(rows[GBS * (ITERS - 1):])
    assert batch.shape == (GBS, SEQ + 1), batch.shape
    tokens, labels = batch[:, :-1], batch[:, 1:]

    def export(name, *flags):
        d = os.path.join(work, name)
        print(run("mt-checkpoint", "to-hf", ckpt, "-o", d, *flags).strip().replace(WORK, "WORK"))
        return d

    def logits_of(d, dtype=torch.float32):
        m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
        with torch.no_grad():
            return type(m).__name__, m(input_ids=tokens).logits.float()

    print(f"{model}:")
    cls, lp = logits_of(export("hf-padded", "--keep-padded-vocab"))
    loss = torch.nn.functional.cross_entropy(lp.reshape(-1, PADDED), labels.reshape(-1)).item()
    rel = abs(loss - mt_loss) / abs(mt_loss)
    print(f"{cls}: loss mt {mt_loss:.7g}, transformers {loss:.7g}, rel {rel:.1e}")
    failures = ["loss"] if rel > 1e-5 else []

    trimmed = export("hf")
    config = json.load(open(os.path.join(trimmed, "config.json")))
    _, lt = logits_of(trimmed)
    diff = float((lt - lp[..., :VOCAB]).abs().max())
    print(f"vocabulary {config['vocab_size']}: logits differ from the padded export's by {diff:.1e}")
    if config["vocab_size"] != VOCAB or lt.shape[-1] != VOCAB or diff > 1e-5:
        failures.append("trimmed vocabulary")
    if llama and (config["num_key_value_heads"] != 2 or config["tie_word_embeddings"]):
        failures.append("config")
    if (config.get("rope_scaling") or {}).get("rope_type") != ("llama3" if kind == "llama31" else None):
        failures.append("rope scaling")
    if kind == "mixtral" and (cls != "MixtralForCausalLM" or config["num_local_experts"] != 4 or
                              config["num_experts_per_tok"] != 2 or
                              config["intermediate_size"] != 24 or
                              config["router_aux_loss_coef"] != 0.01 or
                              config["output_router_logits"]):
        failures.append("mixtral config")

    half = export("hf-bf16", "--dtype", "bf16", "--max-shard-size", "20KB")
    shards = sorted(f for f in os.listdir(half) if f.endswith(".safetensors"))
    index = json.load(open(os.path.join(half, "model.safetensors.index.json")))
    _, lb = logits_of(half, torch.bfloat16)
    err = float((lb - lt).norm() / lt.norm())
    print(f"bf16 in {len(shards)} shards: logits within {err:.1e} of fp32's")
    if len(shards) < 2 or set(index["weight_map"].values()) != set(shards) or err > 2e-2:
        failures.append("bf16 shards")
    if failures:
        sys.exit(f"{model}: mismatch: " + ", ".join(failures))
    print(f"{model}: all match")


def from_mixtral():
    from safetensors.torch import load_file
    from transformers import MixtralConfig, MixtralForCausalLM

    work = os.path.join(WORK, "from-mixtral")
    os.makedirs(work)
    rng = torch.Generator().manual_seed(6)
    docs = [[torch.randint(0, VOCAB, (int(torch.randint(5, 60, (1,), generator=rng)),),
                           generator=rng).tolist()] for _ in range(40)]
    make_dataset.write(os.path.join(work, "data"), "uint16", docs)
    torch.manual_seed(7)
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=24,
                           num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                           num_key_value_heads=2, max_position_embeddings=64,
                           num_local_experts=4, num_experts_per_tok=2, initializer_range=0.1)
    model = MixtralForCausalLM(config).eval()
    hf = os.path.join(work, "hf")
    model.save_pretrained(hf)
    toml, plan, ckpt = (os.path.join(work, n) for n in ("spec.toml", "plan", "ckpt"))
    run("mtc", "import-hf", hf, "-o", toml)
    sets = {"model.seq_length": SEQ, "model.make_vocab_size_divisible_by": PADDED,
            "training.micro_batch_size": MBS, "training.global_batch_size": GBS,
            "training.seed": SEED, "training.eval_iters": 0, "training.log_interval": 1,
            "data.mock_data": "false", "data.data_path": f'"{work}/data"',
            "data.split": '"100,0,0"'}
    run("mtc", "compile", toml, "-o", plan, *[a for k, v in sets.items()
                                               for a in ("--set", f"{k}={v}")])
    print(run("mt-checkpoint", "from-hf", hf, "--plan", plan, "-o", ckpt).strip()
          .replace(WORK, "WORK"))
    out = run("mtrun", plan, "--load", ckpt, "--train-iters", "1")
    line = next(l for l in out.splitlines() if re.search(r"iteration +1/", l))
    mt_loss = float(re.search(r"lm loss: ([0-9.E+-]+)", line).group(1))
    samples = run("mt-dataset", "samples", os.path.join(work, "data"), "--seq-length", str(SEQ),
                  "--num-samples", str(GBS), "--split", "100,0,0", "--seed", str(SEED),
                  "--show", str(GBS))
    batch = torch.tensor([[int(t) for t in l.split()] for l in samples.splitlines()])
    with torch.no_grad():
        logits = model(input_ids=batch[:, :-1]).logits.float()
    padded = torch.cat([logits, logits[..., -1:].expand(-1, -1, PADDED - VOCAB)], dim=-1)
    loss = torch.nn.functional.cross_entropy(padded.reshape(-1, PADDED),
                                             batch[:, 1:].reshape(-1)).item()
    rel = abs(loss - mt_loss) / abs(mt_loss)
    print(f"from-mixtral: loss mt {mt_loss:.7g}, transformers {loss:.7g}, rel {rel:.1e}")
    back = os.path.join(work, "back")
    run("mt-checkpoint", "to-hf", ckpt, "-o", back)
    a, b = load_file(os.path.join(hf, "model.safetensors")), load_file(
        os.path.join(back, "model.safetensors"))
    same = sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a)
    print(f"from-mixtral: {len(b)} tensors back from to-hf, {'equal' if same else 'DIFFERENT'}")
    if rel > 1e-5 or not same:
        sys.exit("from-mixtral: mismatch")
    print("from-mixtral: all match")


for m in sys.argv[3:]:
    if m == "from-mixtral":
        from_mixtral()
    else:
        check(m)
