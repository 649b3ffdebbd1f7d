"""Reads an mt spec TOML (with `mtc compile --set` style overrides) into the
figures the GPU benchmarks need: the model's shape, the batch and the
optimizer settings, with the defaults docs/spec.md gives for keys a spec
leaves out."""
import dataclasses
import tomllib


def parse_set(item):
    """'SECTION.KEY=VALUE' (VALUE in TOML syntax, as mtc takes it) -> (section, key, value)."""
    name, sep, text = item.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise ValueError(f"--set needs SECTION.KEY=VALUE, got '{item}'")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--set {name}: '{text}' is not a TOML value ({e}); "
                         f"strings need quotes, e.g. {name}='\"value\"'") from None
    return section, key, value


def load_spec(path, overrides=()):
    """The spec as nested dicts, with each override applied in order."""
    with open(path, "rb") as f:
        spec = tomllib.load(f)
    for item in overrides:
        section, key, value = parse_set(item)
        spec.setdefault(section, {})[key] = value
    return spec


@dataclasses.dataclass
class ModelConfig:
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    query_groups: int
    kv_channels: int
    seq: int
    max_positions: int
    vocab: int
    padded_vocab: int
    position_embedding: str
    normalization: str
    norm_epsilon: float
    swiglu: bool
    tied: bool
    bias: bool
    hidden_dropout: float
    attention_dropout: float
    init_std: float
    micro_batch: int
    global_batch: int
    data_parallel: int
    precision: str
    lr: float
    min_lr: float
    lr_decay_style: str
    lr_warmup_iters: int
    lr_decay_iters: int
    train_iters: int
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float
    seed: int
    # Mixture of experts (num_experts > 0): the MoE layers among `layers`,
    # the routed experts' width and top-k, the shared expert's width.
    num_experts: int = 0
    moe_layers: int = 0
    moe_ffn_hidden: int = 0
    moe_topk: int = 0
    shared_expert_ffn: int = 0

    @property
    def micro_batches(self):
        """Micro-batches per iteration on one data-parallel rank."""
        return self.global_batch // (self.micro_batch * self.data_parallel)


def model_config(spec):
    """ModelConfig of a spec dict from load_spec, defaults as in docs/spec.md."""
    m, t, p = spec.get("model", {}), spec.get("training", {}), spec.get("parallel", {})
    hidden, heads = m["hidden_size"], m["num_attention_heads"]
    swiglu = m.get("swiglu", False)
    ffn_default = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
    tp = p.get("tensor_model_parallel_size", 1)
    dp = p.get("data_parallel_size", 1)
    divisible = m.get("make_vocab_size_divisible_by", 128) * tp
    vocab = m["vocab_size"]
    mbs = t["micro_batch_size"]
    seq = m["seq_length"]
    train_iters = t["train_iters"]
    return ModelConfig(
        layers=m["num_layers"], hidden=hidden,
        ffn_hidden=m.get("ffn_hidden_size", ffn_default),
        heads=heads, query_groups=m.get("num_query_groups", heads),
        kv_channels=m.get("kv_channels", hidden // heads),
        seq=seq, max_positions=m.get("max_position_embeddings", seq),
        vocab=vocab, padded_vocab=-(-vocab // divisible) * divisible,
        position_embedding=m.get("position_embedding_type", "learned_absolute"),
        normalization=m.get("normalization", "LayerNorm"),
        norm_epsilon=m.get("norm_epsilon", 1e-5), swiglu=swiglu,
        tied=not m.get("untie_embeddings_and_output_weights", False),
        bias=m.get("add_bias_linear", True),
        hidden_dropout=m.get("hidden_dropout", 0.1),
        attention_dropout=m.get("attention_dropout", 0.1),
        init_std=m.get("init_method_std", 0.02),
        micro_batch=mbs, global_batch=t.get("global_batch_size", mbs * dp),
        data_parallel=dp, precision=t.get("precision", "fp32"),
        lr=t["lr"], min_lr=t.get("min_lr", 0.0),
        lr_decay_style=t.get("lr_decay_style", "linear"),
        lr_warmup_iters=t.get("lr_warmup_iters", 0),
        lr_decay_iters=t.get("lr_decay_iters", train_iters), train_iters=train_iters,
        weight_decay=t.get("weight_decay", 0.01),
        adam_beta1=t.get("adam_beta1", 0.9), adam_beta2=t.get("adam_beta2", 0.999),
        adam_eps=t.get("adam_eps", 1e-8), clip_grad=t.get("clip_grad", 1.0),
        seed=t.get("seed", 1234), **moe_config(m, m.get("ffn_hidden_size", ffn_default)))


def moe_layer_flags(freq, layers):
    """Which layers are MoE layers for a moe_layer_freq value, as Megatron reads
    --moe-layer-freq: every freq-th layer from the first for an integer, a list
    of 0/1 per layer, or a string of either (Megatron evaluates a list
    expression such as "([1]*3+[0])*2" after allowing only digits and
    "[](),+*"; so does this)."""
    if isinstance(freq, str):
        text = freq.strip()
        if any(c not in "0123456789[](),+* " for c in text):
            raise ValueError(f"moe_layer_freq {freq!r}: only digits and [](),+* are allowed")
        freq = int(text) if text.isdigit() else eval(text, {"__builtins__": {}}, {})
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(layers)]
    if len(freq) != layers:
        raise ValueError(f"moe_layer_freq gives {len(freq)} layers, the model has {layers}")
    return list(freq)


def moe_config(m, ffn):
    """ModelConfig's mixture-of-experts fields from the [model] table (ffn: the
    dense MLP's width, moe_ffn_hidden_size's default)."""
    experts = m.get("num_experts", 0)
    if not experts:
        return {}
    return dict(num_experts=experts,
                moe_layers=sum(moe_layer_flags(m.get("moe_layer_freq", 1), m["num_layers"])),
                moe_ffn_hidden=m.get("moe_ffn_hidden_size", ffn),
                moe_topk=m.get("moe_router_topk", 2),
                shared_expert_ffn=m.get("moe_shared_expert_intermediate_size", 0))


# What every GPU benchmark sets so that a spec runs on the one GPU it measures:
# no model parallelism, one data-parallel rank, one node of one GPU.
ONE_GPU = [
    "parallel.tensor_model_parallel_size=1",
    "parallel.pipeline_model_parallel_size=1",
    "parallel.data_parallel_size=1",
    "parallel.virtual_pipeline_model_parallel_size=1",
    "parallel.sequence_parallel=false",
    "cluster.gpus_per_node=1",
    "cluster.nodes=1",
]
