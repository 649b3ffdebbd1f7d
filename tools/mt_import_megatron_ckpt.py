#!/usr/bin/env python3
"""Converts a Megatron-Core checkpoint (GPT, Llama and MoE models) into an mt checkpoint.

    python3 tools/mt_import_megatron_ckpt.py MEGATRON_CKPT --plan PLAN -o OUT
    mtrun PLAN --load OUT

MEGATRON_CKPT is Megatron-LM's --save directory (the iteration in its
latest_checkpointed_iteration.txt, or --iteration N) or one iter_XXXXXXX
directory, in either of Megatron's formats:
  torch_dist  iter_XXXXXXX/.metadata, *.distcp, common.pt (--ckpt-format torch_dist,
              the default): every tensor is stored whole, whatever tp and pp saved it;
  torch       iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt (--ckpt-format torch):
              one pickle per tensor- and pipeline-parallel rank, merged here.
PLAN is compiled (mtc compile) from the spec the run continues with; the
checkpoint's args are checked against its [model] (sizes, heads, groups,
norm, activation, positions, tied embeddings, biases, experts and routing), and
OUT is laid out for PLAN's tensor, pipeline and data parallelism by `mtc reshard`.

Mixture-of-experts layers: the router (mlp.router.weight) and the experts in
each of Megatron-Core's namings, stacked into mt's [num_experts, ...] tensors
(expert e's slice is Megatron's expert e):
  torch_dist   mlp.experts.experts.linear_fc1.weight, whole [E, 2F, H] for
               every experts class (SequentialMLP, GroupedMLP and TEGroupedMLP
               save the same sharded keys);
  torch        SequentialMLP's mlp.experts.local_experts.{e}.linear_fc1.weight,
               TEGroupedMLP's mlp.experts.linear_fc1.weight{e}, or GroupedMLP's
               mlp.experts.weight1 [H, E x 2F] and weight2 [E x F, H] (expert
               e's views [H, 2F] and [F, H], transposed).

Carried over: the weights always; Adam's moments (exp_avg, exp_avg_sq) and the
fp32 main parameters where the checkpoint holds them per parameter (torch_dist;
torch without the distributed optimizer); the iteration, consumed samples, the
optimizer's step count and the learning-rate scheduler's position. Where the
optimizer state does not map (the torch format's distrib_optim.pt, a virtual
pipeline, more parameter groups than Megatron's default two, or
--no-save-optim), the tool says so on stderr and OUT starts Adam afresh (zero
moments, step 0), as Megatron's --no-load-optim does.

Needs PyTorch (torch.load and torch.distributed.checkpoint read Megatron's
files); megatron-core need not be installed. Nothing in the files is executed:
pickles are read with an unpickler that only builds torch's and Python's
plain types (argparse.Namespace, OrderedDict, ...); any other class, such as
Megatron's enums in args, becomes an inert placeholder.

Exit status 0; 1 with one line on stderr naming the file, tensor or argument
and what to do; 2 on a usage error. OUT is written whole or not at all.
"""
import argparse
import json
import math
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mt_checkpoint  # noqa: E402  (the mt format's CRC32C and names)

PROG = "mt_import_megatron_ckpt.py"
TRACKER = "latest_checkpointed_iteration.txt"


class ImportError_(Exception):
    """One line: the file, tensor or argument, what is wrong, what to do."""


def fail(msg):
    raise ImportError_(msg)


# --- Pickles, read without running them -------------------------------------

class Placeholder:
    """Stands in for a class the unpickler does not build (Megatron's enums...)."""

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.state = state

    def __reduce__(self):
        return (Placeholder, ())

    def __repr__(self):
        return "<%s>" % getattr(type(self), "qualname", "object")


def _placeholder(module, name):
    return type(name, (Placeholder,), {"qualname": module + "." + name})


_ALLOWED = {
    ("collections", "OrderedDict"), ("collections", "defaultdict"), ("argparse", "Namespace"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    ("builtins", "bytearray"), ("builtins", "range"), ("datetime", "datetime"),
    ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"), ("pathlib", "PosixPath"),
}


def _rebuild_without_attributes(func, _type, args, _state):
    """torch._tensor._rebuild_from_type_v2, keeping neither the subclass nor the
    attributes; func is what the unpickler below resolved (a tensor rebuild or a
    placeholder)."""
    return func(*args)


def _safe_pickle_module():
    """A pickle module for torch.load whose Unpickler builds only safe types."""
    import torch

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in _ALLOWED:
                return super().find_class(module, name)
            if module.startswith("numpy") and name.endswith("DType"):
                return super().find_class(module, name)
            if module == "torch" and (name.endswith("Storage") or name in ("Size", "device",
                                                                          "dtype")):
                return getattr(torch, name)
            if module == "torch" and hasattr(torch, name) and isinstance(getattr(torch, name),
                                                                        torch.dtype):
                return getattr(torch, name)
            if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor",
                                                     "_rebuild_parameter",
                                                     "_rebuild_parameter_with_state"):
                return super().find_class(module, name)
            if module in ("torch._tensor", "torch._utils") and name == "_rebuild_from_type_v2":
                # A tensor with Python attributes (Megatron's fp32 main params carry
                # tensor_model_parallel, partition_dim...): the tensor, without them.
                return _rebuild_without_attributes
            if module == "torch.storage" and name == "UntypedStorage":
                return torch.UntypedStorage
            if module == "torch.serialization" and name == "_get_layout":
                return super().find_class(module, name)
            if module == "torch" and name == "strided":
                return torch.strided
            return _placeholder(module, name)

    class Module:
        pass

    mod = Module()
    mod.Unpickler = Unpickler
    mod.load = pickle.load
    mod.__name__ = "mt_safe_pickle"
    return mod


def need_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        fail("error: needs PyTorch to read Megatron's files (PyTorch pickles and distributed "
             "checkpoints); install it with 'pip install torch'")


def torch_load(path):
    need_torch()
    import torch
    try:
        return torch.load(path, map_location="cpu", pickle_module=_safe_pickle_module(),
                          weights_only=False)
    except FileNotFoundError:
        fail("%s: error: no such file" % path)
    except Exception as e:  # a damaged or foreign file
        fail("%s: error: cannot be read as a PyTorch file (%s: %s); the save was cut short or "
             "this is not a Megatron checkpoint" % (path, type(e).__name__, str(e)[:200]))


# --- The Megatron checkpoint ---------------------------------------------------

def iteration_dir(path, iteration):
    """The iter_XXXXXXX (or release) directory of a save directory or of itself."""
    if not os.path.isdir(path):
        fail("%s: error: no such directory; pass Megatron's --save directory or one of its "
             "iter_XXXXXXX directories" % path)
    if os.path.isfile(os.path.join(path, ".metadata")) or any(
            n.startswith("mp_rank_") for n in os.listdir(path)):
        return path
    if iteration is None:
        tracker = os.path.join(path, TRACKER)
        if not os.path.isfile(tracker):
            fail("%s: error: holds neither %s nor a checkpoint's files (.metadata, "
                 "mp_rank_*); pass Megatron's --save directory or an iter_XXXXXXX directory"
                 % (path, TRACKER))
        text = open(tracker).read().strip()
        if text == "release":
            return os.path.join(path, "release")
        if not text.isdigit():
            fail("%s: error: expected an iteration number or 'release', found '%s'"
                 % (tracker, text[:40]))
        iteration = int(text)
    d = os.path.join(path, "iter_%07d" % iteration)
    if not os.path.isdir(d):
        fail("%s: error: has no iter_%07d; pass --iteration with one it holds (%s)"
             % (path, iteration, ", ".join(sorted(n for n in os.listdir(path)
                                                 if n.startswith("iter_"))) or "none"))
    return d


class Source:
    """What a Megatron checkpoint holds, in Megatron's whole (unsharded) layout."""

    def __init__(self):
        self.format = ""
        self.args = None
        self.iteration = 0
        self.scheduler = None
        self.weights = {}       # Megatron name (per-layer) -> float32 numpy array
        self.state = {}         # kind (exp_avg, exp_avg_sq, fp32_param) -> {name: array}
        self.optimizer_steps = None
        self.no_optim = ""      # why the optimizer state is not carried over
        self.grad_scaler = None  # Megatron's DynamicGradScaler.state_dict(), fp16


def layer_split(name):
    """("decoder.layers.", "self_attention...") for a stacked torch_dist key."""
    p = "decoder.layers."
    return name[len(p):] if name.startswith(p) else None


def read_torch_dist(d, src, want_optim):
    need_torch()
    import torch
    try:
        from torch.distributed.checkpoint import FileSystemReader, load as dcp_load
    except ImportError as e:
        fail("%s: error: this PyTorch has no torch.distributed.checkpoint (%s); install "
             "PyTorch 2.3 or later" % (d, e))
    common = torch_load(os.path.join(d, "common.pt"))
    if not isinstance(common, dict):
        fail("%s: error: holds no dictionary; this is not a Megatron checkpoint"
             % os.path.join(d, "common.pt"))
    src.args = common.get("args")
    src.iteration = int(common.get("iteration", 0))
    src.scheduler = common.get("opt_param_scheduler")
    try:
        md = FileSystemReader(d).read_metadata()
    except Exception as e:
        fail("%s: error: cannot be read (%s: %s); the save was cut short: load another "
             "iteration" % (os.path.join(d, ".metadata"), type(e).__name__, str(e)[:200]))
    tensors = {k: v for k, v in md.state_dict_metadata.items() if hasattr(v, "size")
               and hasattr(v, "properties")}
    model_keys = [k for k in tensors if not k.startswith("optimizer.") and "_extra_state" not in k]
    optim = common.get("optimizer")
    kinds = {}
    for k in tensors:
        for kind in ("exp_avg", "exp_avg_sq", "fp32_param"):
            pre = "optimizer.state.%s." % kind
            if k.startswith(pre):
                kinds.setdefault(kind, []).append(k[len(pre):])
    if not want_optim:
        src.no_optim = "--no-optim"
    elif optim is None:
        src.no_optim = "the checkpoint holds no optimizer state (saved with --no-save-optim)"
    elif "exp_avg" not in kinds:
        other = sorted({k.split(".")[1] if k.startswith("optimizer.") else k
                        for k in tensors if k.startswith("optimizer.")})
        src.no_optim = ("its optimizer state is not stored per parameter (%s; Megatron's "
                        "distributed optimizer without --dist-ckpt-optim-fully-reshardable "
                        "stores flat buffers)" % (", ".join(other[:4]) or "no tensors"))
    want = {k: torch.empty(tuple(tensors[k].size), dtype=tensors[k].properties.dtype)
            for k in model_keys}
    if not src.no_optim:
        for kind, names in kinds.items():
            for n in names:
                k = "optimizer.state.%s.%s" % (kind, n)
                want[k] = torch.empty(tuple(tensors[k].size), dtype=tensors[k].properties.dtype)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore")
            dcp_load(want, storage_reader=FileSystemReader(d), no_dist=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # torch's CheckpointException is a BaseException
        inner = next(iter(getattr(e, "failures", {}).values()), e)
        if isinstance(inner, tuple):  # (exception, traceback) in some versions
            inner = inner[0]
        text = str(inner).strip().splitlines()
        fail("%s: error: its tensors cannot be read (%s%s); the save was cut short or a "
             ".distcp file is missing: load another iteration"
             % (d, type(inner).__name__, ": " + text[0][:200] if text else ""))

    def unstack(key, t, out):
        rest = layer_split(key)
        if rest is None:
            out[key] = t
            return
        for i in range(t.shape[0]):
            out["decoder.layers.%d.%s" % (i, rest)] = t[i]

    for k in model_keys:
        unstack(k, want[k], src.weights)
    if not src.no_optim:
        for kind, names in kinds.items():
            got = {}
            for n in names:
                unstack(n, want["optimizer.state.%s.%s" % (kind, n)], got)
            src.state[kind] = got
        if isinstance(optim, dict):
            src.grad_scaler = optim.get("grad_scaler")
        # FP32Optimizer's state is torch's optimizer state dict itself;
        # Float16OptimizerWithFloat16Params nests it under "optimizer", beside
        # "grad_scaler" and "fp32_from_fp16_params".
        inner = optim.get("optimizer") if isinstance(optim, dict) else None
        if isinstance(inner, dict) and "state" in inner:
            optim = inner
        step = optim.get("state", {}).get("common_step") if isinstance(optim, dict) else None
        src.optimizer_steps = int(step) if step is not None else None


# Tensor-parallel split of each Megatron-Core weight (megatron/core/tensor_parallel
# layers: ColumnParallelLinear splits its output rows, RowParallelLinear its input
# columns, VocabParallelEmbedding the vocabulary rows; norms are replicated).
def tp_axis(name, gated):
    if name.endswith("_extra_state"):
        return None
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return 0, 1
    if ".linear_qkv." in name and (name.endswith(".weight") or name.endswith(".bias")):
        return 0, 1
    if ".linear_fc1." in name and (name.endswith(".weight") or name.endswith(".bias")):
        # SwiGLU: each rank holds [gate shard; up shard].
        return 0, (2 if gated else 1)
    if (".linear_proj." in name or ".linear_fc2." in name) and name.endswith(".weight"):
        return 1, 1
    return -1, 1


def merge_tp(shards, axis, blocks):
    if axis < 0:
        return shards[0]
    parts = [np.split(s, blocks, axis=axis) for s in shards]
    return np.concatenate([parts[r][b] for b in range(blocks) for r in range(len(shards))],
                          axis=axis)


def to_numpy(t):
    import torch
    if not isinstance(t, torch.Tensor):
        return None
    return t.detach().to(torch.float32).contiguous().numpy()


def legacy_order(model_sd):
    """Parameter names in named_parameters() order (the model's state dict order,
    without _extra_state)."""
    return [n for n in model_sd if not n.endswith("_extra_state")]


def legacy_optimizer(opt, names, shapes, path):
    """{kind: {name: tensor}} and the step count of one rank's optimizer state, or a
    string saying why it does not map."""
    fp32_from = None
    if isinstance(opt, dict) and "optimizer" in opt and isinstance(opt["optimizer"], dict) and \
            "state" in opt["optimizer"]:
        fp32_from = opt.get("fp32_from_fp16_params")
        opt = opt["optimizer"]
    if not (isinstance(opt, dict) and "state" in opt and "param_groups" in opt):
        return "%s holds the optimizer state in a form without per-parameter moments " \
               "(the distributed optimizer keeps them in distrib_optim.pt)" % path
    groups = opt["param_groups"]
    no_wd = [n for n in names if n.endswith(".bias") or len(shapes[n]) == 1]
    wd = [n for n in names if n not in no_wd]
    order, group_names = [], []
    for g in groups:
        if "params" not in g:
            return "%s: a parameter group without 'params'" % path
        gn = no_wd if float(g.get("wd_mult", 1.0)) == 0.0 else wd
        if len(gn) != len(g["params"]) or gn in group_names:
            return ("%s has %d parameter groups of %s parameters, not Megatron's default two "
                    "(weight decay and none)" % (path, len(groups),
                                                 "/".join(str(len(x["params"])) for x in groups)))
        group_names.append(gn)
        order += list(zip(g["params"], gn))
    out, steps = {}, None
    for idx, name in order:
        st = opt["state"].get(idx)
        if st is None:
            return "%s has no optimizer state for %s (the run had taken no step)" % (path, name)
        for kind in ("exp_avg", "exp_avg_sq"):
            a = to_numpy(st.get(kind))
            if a is None or tuple(a.shape) != tuple(shapes[name]):
                return "%s: the optimizer's %s of parameter %d is %s, but %s is %s" % (
                    path, kind, idx, None if a is None else list(a.shape), name,
                    list(shapes[name]))
            out.setdefault(kind, {})[name] = a
        if "step" in st:
            steps = int(st["step"])
    if fp32_from is not None:
        flat = [t for g in fp32_from for t in g]
        if len(flat) != len(order):
            return "%s: fp32_from_fp16_params has %d tensors for %d parameters" % (
                path, len(flat), len(order))
        for (_, name), t in zip(order, flat):
            a = to_numpy(t)
            if a is None or tuple(a.shape) != tuple(shapes[name]):
                return "%s: fp32_from_fp16_params holds %s for %s, which is %s" % (
                    path, "no tensor" if a is None else list(a.shape), name,
                    list(shapes[name]))
            out.setdefault("fp32_param", {})[name] = a
    return out, steps


def read_legacy(d, src, want_optim):
    ranks = {}
    for n in sorted(os.listdir(d)):
        if not n.startswith("mp_rank_"):
            continue
        parts = n[len("mp_rank_"):].split("_")
        if not all(p.isdigit() for p in parts) or len(parts) > 2:
            fail("%s: error: %s has an expert-parallel rank or an unknown name; only tensor "
                 "and pipeline parallelism (mp_rank_TT or mp_rank_TT_PPP) are read"
                 % (d, n))
        ranks[(int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)] = n
    tp = 1 + max(t for t, _ in ranks)
    pp = 1 + max(p for _, p in ranks)
    for t in range(tp):
        for p in range(pp):
            if (t, p) not in ranks:
                fail("%s: error: has no %s; the checkpoint is incomplete: load another iteration"
                     % (d, "mp_rank_%02d" % t + ("_%03d" % p if pp > 1 else "")))
    layer_offset = 0
    optim_parts = []
    for p in range(pp):
        stage = []
        for t in range(tp):
            path = os.path.join(d, ranks[(t, p)], "model_optim_rng.pt")
            sd = torch_load(path)
            if not isinstance(sd, dict) or "model" not in sd:
                if isinstance(sd, dict) and "model0" in sd:
                    fail("%s: error: holds a virtual pipeline (model0, model1, ...); save it "
                         "with --ckpt-format torch_dist, which stores the layers whole"
                         % path)
                fail("%s: error: holds no 'model'; this is not a Megatron checkpoint" % path)
            if src.args is None:
                src.args = sd.get("args")
                src.iteration = int(sd.get("iteration", 0))
                src.scheduler = sd.get("opt_param_scheduler")
            stage.append((path, sd))
        gated = bool(getattr(src.args, "swiglu", False))
        if tp > 1 and arg(src.args, "num_experts"):
            fail("%s: error: a mixture of experts saved in the torch format by %d tensor-parallel "
                 "ranks, whose experts are split by --expert-tensor-parallel-size; save it with "
                 "--ckpt-format torch_dist, which stores every expert whole" % (d, tp))
        if want_optim and not src.no_optim and arg(src.args, "num_experts"):
            src.no_optim = ("the torch format keeps a mixture of experts' optimizer state in "
                            "parameter groups of their own (expert and dense parameters apart); "
                            "--ckpt-format torch_dist stores it per parameter")
        model0 = stage[0][1]["model"]
        layers = set()
        shapes = {}
        for name in legacy_order(model0):
            spec = tp_axis(name, gated)
            if spec is None:
                continue
            axis, blocks = spec
            shards = []
            for path, sd in stage:
                a = to_numpy(sd["model"].get(name))
                if a is None:
                    fail("%s: error: has no tensor %s, which %s holds; the files are of "
                         "different saves" % (path, name, stage[0][0]))
                shards.append(a)
            shapes[name] = shards[0].shape
            whole = merge_tp(shards, axis, blocks)
            rest = layer_split(name)
            if rest is not None:
                i, rest = rest.split(".", 1)
                layers.add(int(i))
                gname = "decoder.layers.%d.%s" % (int(i) + layer_offset, rest)
            else:
                gname = name
            if gname == "output_layer.weight" and gname in src.weights:
                continue
            if gname == "embedding.word_embeddings.weight" and gname in src.weights:
                continue  # the last stage's tied copy
            src.weights[gname] = whole
        if want_optim and not src.no_optim:
            for t, (path, sd) in enumerate(stage):
                opt = sd.get("optimizer")
                if opt is None:
                    src.no_optim = "%s holds no optimizer state (saved with --no-save-optim)" \
                        % path
                    break
                if os.path.isfile(os.path.join(os.path.dirname(path), "distrib_optim.pt")):
                    src.no_optim = ("%s was saved with the distributed optimizer, whose "
                                    "distrib_optim.pt holds flat per-bucket buffers" % path)
                    break
                names = [n for n in legacy_order(sd["model"]) if tp_axis(n, gated) is not None]
                sh = {n: tuple(sd["model"][n].shape) for n in names}
                if isinstance(opt, dict) and isinstance(opt.get("grad_scaler"), dict):
                    src.grad_scaler = opt["grad_scaler"]
                got = legacy_optimizer(opt, names, sh, path)
                if isinstance(got, str):
                    src.no_optim = got
                    break
                optim_parts.append((p, t, got, layer_offset, gated))
        layer_offset += len(layers)
    if not want_optim:
        src.no_optim = "--no-optim"
    if not src.no_optim:
        by_name = {}
        for p, t, (state, steps), off, gated in optim_parts:
            if steps is not None:
                src.optimizer_steps = steps
            for kind, named in state.items():
                for name, a in named.items():
                    by_name.setdefault((kind, name, off), {})[t] = a
        for (kind, name, off), shards in by_name.items():
            axis, blocks = tp_axis(name, gated)
            whole = merge_tp([shards[t] for t in range(tp)], axis, blocks)
            rest = layer_split(name)
            if rest is not None:
                i, rest = rest.split(".", 1)
                name = "decoder.layers.%d.%s" % (int(i) + off, rest)
            src.state.setdefault(kind, {}).setdefault(name, whole)
    src.tp, src.pp = tp, pp


# --- Megatron's names to mt's ---------------------------------------------------

# The TransformerEngine layer specs fuse the norms into the next linear layer;
# the local specs (and mt) keep them apart. megatron-core's torch_dist files use
# the fused names for both.
FUSED_NORMS = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}


def mt_name(name):
    rest = layer_split(name)
    if rest is not None:
        i, rest = rest.split(".", 1)
        return "decoder.layers.%s.%s" % (i, FUSED_NORMS.get(rest, rest))
    return name


# --- The plan and its spec --------------------------------------------------------

def plan_spec(path):
    """The spec TOML that PLAN was compiled from (plan.fbs: Plan.spec_toml)."""
    try:
        b = open(path, "rb").read()
    except OSError as e:
        fail("%s: error: cannot read the plan (%s); pass the file written by `mtc compile -o`"
             % (path, e.strerror))
    if b[:8] != b"MTPLAN\0\0" or len(b) < 40:
        fail("%s: error: not an mt plan (the file does not start with MTPLAN); pass the file "
             "written by `mtc compile -o`" % path)
    p = memoryview(b)[32:]
    try:
        root = struct.unpack_from("<I", p, 0)[0]
        vt = root - struct.unpack_from("<i", p, root)[0]
        vsize = struct.unpack_from("<H", p, vt)[0]
        off = struct.unpack_from("<H", p, vt + 8)[0] if vsize > 8 else 0
        if not off:
            raise struct.error("no spec_toml")
        f = root + off
        s = f + struct.unpack_from("<I", p, f)[0]
        n = struct.unpack_from("<I", p, s)[0]
        text = bytes(p[s + 4:s + 4 + n]).decode("utf-8")
    except (struct.error, UnicodeDecodeError):
        fail("%s: error: the plan is damaged (its spec cannot be read); recompile it with "
             "`mtc compile`" % path)
    import tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        fail("%s: error: the plan's spec is not TOML (%s); recompile it with `mtc compile`"
             % (path, e))


def arg(args, name, default=None):
    return getattr(args, name, default) if args is not None else default


def check_args(args, spec, ckpt, plan):
    """The checkpoint's model against the plan's [model]: one line per mismatch, the first."""
    m = spec.get("model", {})
    if args is None:
        fail("%s: error: holds no 'args'; the model cannot be checked against the plan: "
             "this is not a checkpoint of Megatron-LM's training loop" % ckpt)

    def mismatch(key, have, want, flag=None):
        fail("%s: error: the checkpoint's --%s is %s but %s has model.%s = %s; compile the "
             "plan with --set model.%s=%s" % (
                 ckpt, (flag or key).replace("_", "-"), fmt(have), plan, key, fmt(want), key,
                 fmt(have)))

    def fmt(v):
        return json.dumps(v) if isinstance(v, str) else ("true" if v is True else "false"
                                                          if v is False else str(v))

    for unsupported, why in (("moe_router_enable_expert_bias", "an expert bias in the router"),
                             ("moe_use_shared_expert_gate", "a gate on the shared expert"),
                             ("moe_router_num_groups", "group-limited routing"),
                             ("multi_latent_attention", "multi-latent attention"),
                             ("qk_layernorm", "QK layer norm"),
                             ("squared_relu", "squared ReLU"),
                             ("add_qkv_bias", "a QKV bias without --add-bias-linear")):
        v = arg(args, unsupported)
        if v and not (unsupported == "add_qkv_bias" and arg(args, "add_bias_linear", True)):
            fail("%s: error: the checkpoint's model uses %s (--%s), which mt does not train"
                 % (ckpt, why, unsupported.replace("_", "-")))
    groups = arg(args, "num_query_groups") if arg(args, "group_query_attention") else None
    heads = arg(args, "num_attention_heads")
    kv = arg(args, "kv_channels") or (arg(args, "hidden_size") // heads if heads else None)
    pos = arg(args, "position_embedding_type", "learned_absolute")
    checks = [
        ("num_layers", arg(args, "num_layers")),
        ("hidden_size", arg(args, "hidden_size")),
        ("ffn_hidden_size", arg(args, "ffn_hidden_size")),
        ("num_attention_heads", heads),
        ("num_query_groups", groups or heads),
        ("kv_channels", kv),
        ("normalization", arg(args, "normalization", "LayerNorm")),
        ("swiglu", bool(arg(args, "swiglu", False))),
        ("position_embedding_type", pos),
        ("untie_embeddings_and_output_weights",
         bool(arg(args, "untie_embeddings_and_output_weights", False))),
        ("add_bias_linear", bool(arg(args, "add_bias_linear", True))),
        ("apply_layernorm_1p", bool(arg(args, "apply_layernorm_1p", False))),
    ]
    if pos == "rope":
        checks += [("rotary_base", arg(args, "rotary_base")),
                   ("use_rope_scaling", bool(arg(args, "use_rope_scaling", False)))]
        if arg(args, "use_rope_scaling"):
            checks.append(("rope_scaling_factor", arg(args, "rope_scaling_factor")))
        if arg(args, "rotary_percent", 1.0) not in (None, 1.0):
            fail("%s: error: the checkpoint's --rotary-percent is %s; mt rotates whole heads "
                 "(1.0)" % (ckpt, arg(args, "rotary_percent")))
    else:
        checks.append(("max_position_embeddings", arg(args, "max_position_embeddings")))
    if arg(args, "vocab_size") is not None:
        checks.append(("vocab_size", arg(args, "vocab_size")))
    experts = arg(args, "num_experts") or 0
    if experts or m.get("num_experts", 0):
        if arg(args, "expert_model_parallel_size", 1) > 1 and arg(args, "ckpt_format") == "torch":
            fail("%s: error: the checkpoint's --expert-model-parallel-size is %d in the torch "
                 "format, whose rank files hold their experts only; save it with --ckpt-format "
                 "torch_dist, which stores every expert whole" % (
                     ckpt, arg(args, "expert_model_parallel_size")))
        topk_scale = arg(args, "moe_router_topk_scaling_factor") or 0.0
        capacity = arg(args, "moe_expert_capacity_factor") or 0.0
        checks_moe = [
            ("num_experts", experts, 0),
            ("moe_ffn_hidden_size", arg(args, "moe_ffn_hidden_size") or arg(args, "ffn_hidden_size"),
             m.get("ffn_hidden_size")),
            ("moe_router_topk", arg(args, "moe_router_topk", 2), 2),
            ("moe_shared_expert_intermediate_size",
             arg(args, "moe_shared_expert_intermediate_size") or 0, 0),
            ("moe_router_score_function", arg(args, "moe_router_score_function", "softmax"),
             "softmax"),
            ("moe_router_pre_softmax", bool(arg(args, "moe_router_pre_softmax", False)), False),
            ("moe_router_topk_scaling_factor", float(topk_scale), 0.0),
            ("moe_expert_capacity_factor", float(capacity), 0.0),
        ]
        for key, have, default in checks_moe:
            want = m.get(key, default)
            if isinstance(have, float) or isinstance(want, float):
                same = math.isclose(float(have or 0), float(want or 0), rel_tol=1e-12)
            else:
                same = have == want
            if not same:
                mismatch(key, have, want)
        layers = arg(args, "num_layers")
        have_freq = moe_layers(arg(args, "moe_layer_freq", 1), layers)
        want_freq = moe_layers(m.get("moe_layer_freq", 1), layers)
        if have_freq is not None and want_freq is not None and have_freq != want_freq:
            mismatch("moe_layer_freq", have_freq, want_freq)
    for key, have in checks:
        if have is None or key not in m:
            continue
        want = m[key]
        if isinstance(want, float) or isinstance(have, float):
            if not math.isclose(float(have), float(want), rel_tol=1e-12):
                mismatch(key, have, want)
        elif have != want:
            mismatch(key, have, want)
    eps = arg(args, "norm_epsilon")
    if eps is not None and "norm_epsilon" in m and not math.isclose(eps, m["norm_epsilon"],
                                                                  rel_tol=1e-9):
        mismatch("norm_epsilon", eps, m["norm_epsilon"])


def moe_layers(freq, layers):
    """Megatron's --moe-layer-freq (an int N: every Nth layer from the first; a
    list: per layer) as a list of 0/1, or None when it cannot be read."""
    if isinstance(freq, int) and layers and freq > 0:
        return [1 if i % freq == 0 else 0 for i in range(layers)]
    if isinstance(freq, (list, tuple)) and all(isinstance(x, int) for x in freq):
        return [1 if x else 0 for x in freq]
    return None


# --- Experts: Megatron's per-expert tensors stacked as mt's [E, ...] ------------

_EXPERT_PATTERNS = (
    # torch_dist: every experts class saves mlp.experts.experts.linear_fcN.weight
    # whole, [E, ...] per layer (Megatron's sharded keys).
    (re.compile(r"^decoder\.layers\.(\d+)\.mlp\.experts\.experts\.(linear_fc[12])\."
                r"(weight|bias)$"), "stacked"),
    # SequentialMLP (local and TransformerEngine specs) in the torch format.
    (re.compile(r"^decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\."
                r"(linear_fc[12])\.(weight|bias)$"), "sequential"),
    # TEGroupedMLP in the torch format: one weight per expert.
    (re.compile(r"^decoder\.layers\.(\d+)\.mlp\.experts\.(linear_fc[12])\.(weight|bias)(\d+)$"),
     "te_grouped"),
    # GroupedMLP in the torch format: all experts in one matrix per linear.
    (re.compile(r"^decoder\.layers\.(\d+)\.mlp\.experts\.weight([12])$"), "grouped"),
)


def stack_experts(named, num_experts, where):
    """named: {Megatron name: array}; returns it with every layer's experts in
    mt's stacked names (decoder.layers.i.mlp.experts.linear_fc1.weight [E, 2F, H],
    linear_fc2.weight [E, H, F])."""
    out, parts = {}, {}
    for name, a in named.items():
        for pattern, kind in _EXPERT_PATTERNS:
            hit = pattern.match(name)
            if not hit:
                continue
            if kind == "stacked":
                layer, lin, what, e = hit.group(1), hit.group(2), hit.group(3), "all"
            elif kind == "sequential":
                layer, e, lin, what = hit.group(1), int(hit.group(2)), hit.group(3), hit.group(4)
            elif kind == "te_grouped":
                layer, lin, what, e = hit.group(1), hit.group(2), hit.group(3), int(hit.group(4))
            else:
                layer, lin, what, e = hit.group(1), "linear_fc" + hit.group(2), "weight", None
            if what == "bias":
                fail("%s: error: holds %s, an expert bias; mt's experts have none (MoE with "
                     "--add-bias-linear is not trained by mt)" % (where, name))
            key = "decoder.layers.%s.mlp.experts.%s.weight" % (layer, lin)
            if e == "all":
                a = np.asarray(a)
                if a.ndim != 3 or a.shape[0] != num_experts:
                    fail("%s: error: %s is %s, not [%d, ...] (--num-experts); the checkpoint is "
                         "of another model" % (where, name, list(a.shape), num_experts))
                if key in out or key in parts:
                    fail("%s: error: holds %s twice; the files are of different saves"
                         % (where, key))
                out[key] = np.ascontiguousarray(a, np.float32)
            elif e is None:  # GroupedMLP: [H, E x F1] viewed as [E, H, F1]; [E x F, H] as [E, F, H]
                a = np.asarray(a)
                if a.size % num_experts:
                    fail("%s: error: %s %s does not split into %d experts; the checkpoint's "
                         "--num-experts is not the model's" % (where, name, list(a.shape),
                                                             num_experts))
                if lin == "linear_fc1":
                    per = a.reshape(num_experts, a.shape[0], -1).transpose(0, 2, 1)
                else:
                    per = a.reshape(num_experts, -1, a.shape[1]).transpose(0, 2, 1)
                for i in range(num_experts):
                    parts.setdefault(key, {})[i] = per[i]
            else:
                parts.setdefault(key, {})[e] = a
            break
        else:
            out[name] = a
    for key, by_expert in parts.items():
        if sorted(by_expert) != list(range(num_experts)):
            missing = sorted(set(range(num_experts)) - set(by_expert))
            fail("%s: error: %s has %s for experts %s but --num-experts is %d%s; the checkpoint "
                 "is incomplete or of another model" % (
                     where, key.rsplit(".experts.", 1)[0], key.rsplit(".", 2)[1],
                     ", ".join(map(str, sorted(by_expert))), num_experts,
                     " (no expert %s)" % ", ".join(map(str, missing)) if missing else ""))
        if key in out:
            fail("%s: error: holds %s both whole and per expert; the files are of different "
                 "saves" % (where, key))
        out[key] = np.ascontiguousarray(np.stack([np.asarray(by_expert[i], np.float32)
                                                  for i in range(num_experts)]))
    return out


def padded_vocab(spec):
    m, p = spec["model"], spec.get("parallel", {})
    mult = m.get("make_vocab_size_divisible_by", 128) * p.get("tensor_model_parallel_size", 1)
    return -(-m["vocab_size"] // mult) * mult


# --- The mt checkpoint -------------------------------------------------------------

def write_rank_file(path, meta, tensors):
    """One mt rank file (runtime/ckpt/checkpoint.h, format version 1)."""
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode("utf-8")
    table = bytearray()
    at = 64 + len(meta_bytes)
    entries = []
    for name, a in tensors:
        nb = name.encode("utf-8")
        entries.append((nb, a))
        table += struct.pack("<H", len(nb)) + nb + struct.pack("<BB", 1, a.ndim)
        table += struct.pack("<%dq" % a.ndim, *a.shape)
        table += b"\0" * 20  # offset, bytes, crc: filled below
    data_at = at + len(table)
    offsets, off = [], (data_at + 63) // 64 * 64
    for _, a in entries:
        offsets.append(off)
        off = (off + a.nbytes + 63) // 64 * 64
    size = offsets[-1] + entries[-1][1].nbytes if entries else data_at
    t = 0
    for (nb, a), o in zip(entries, offsets):
        t += 2 + len(nb) + 2 + 8 * a.ndim
        struct.pack_into("<QQI", table, t, o, a.nbytes, mt_checkpoint.crc32c(a))
        t += 20
    header = struct.pack("<6Q", size, 64, len(meta_bytes), at, len(table), len(entries))
    crc = mt_checkpoint.crc32c(header)
    crc = mt_checkpoint.crc32c(meta_bytes, crc)
    crc = mt_checkpoint.crc32c(bytes(table), crc)
    with open(path, "wb") as f:
        f.write(mt_checkpoint.MAGIC + struct.pack("<II", mt_checkpoint.VERSION, crc) + header)
        f.write(meta_bytes)
        f.write(table)
        pos = data_at
        for (_, a), o in zip(entries, offsets):
            f.write(b"\0" * (o - pos))
            f.write(a.tobytes())
            pos = o + a.nbytes
        f.flush()
        os.fsync(f.fileno())


def round_bf16(a):
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def convert(args):
    out = os.path.abspath(args.output)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        fail("%s: error: exists and is not an empty directory; pass a new directory to -o"
             % args.output)
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        fail("%s: error: no such directory (the parent of -o)" % parent)
    spec = plan_spec(args.plan)
    d = iteration_dir(args.megatron, args.iteration)
    src = Source()
    if os.path.isfile(os.path.join(d, ".metadata")):
        src.format = "torch_dist"
        read_torch_dist(d, src, not args.no_optim)
    elif any(n.startswith("mp_rank_") for n in os.listdir(d)):
        src.format = "torch"
        read_legacy(d, src, not args.no_optim)
    else:
        fail("%s: error: holds neither a torch_dist checkpoint (.metadata) nor torch-format "
             "rank directories (mp_rank_*)" % d)
    check_args(src.args, spec, d, args.plan)
    experts = int(arg(src.args, "num_experts") or 0)
    if experts:
        src.weights = stack_experts({n: (a if isinstance(a, np.ndarray) else to_numpy(a))
                                     for n, a in src.weights.items()}, experts, d)
        for kind in list(src.state):
            src.state[kind] = stack_experts(
                {n: (a if isinstance(a, np.ndarray) else to_numpy(a))
                 for n, a in src.state[kind].items()}, experts, d)

    m = spec["model"]
    vocab = padded_vocab(spec)
    precision = spec.get("training", {}).get("precision", "fp32")
    notes = []
    weights = {}
    for name, a in src.weights.items():
        n = mt_name(name)
        if name == "output_layer.weight" and not m.get("untie_embeddings_and_output_weights"):
            continue  # tied: the embedding is the output layer
        weights[n] = np.ascontiguousarray(a if isinstance(a, np.ndarray) else to_numpy(a))
    state = {}
    for kind, named in src.state.items():
        state[kind] = {mt_name(n): np.ascontiguousarray(to_numpy(a) if not isinstance(
            a, np.ndarray) else a) for n, a in named.items()}

    # Megatron pads the vocabulary for its tensor parallelism, mt for the plan's.
    for n in ("embedding.word_embeddings.weight", "output_layer.weight"):
        if n not in weights or weights[n].shape[0] == vocab:
            continue
        have = weights[n].shape[0]

        def fit(a):
            if a.shape[0] >= vocab:
                return np.ascontiguousarray(a[:vocab])
            return np.concatenate([a, np.zeros((vocab - a.shape[0],) + a.shape[1:], a.dtype)])
        weights[n] = fit(weights[n])
        for kind in state:
            if n in state[kind]:
                state[kind][n] = fit(state[kind][n])
        notes.append("%s: %d padded rows in Megatron, %d in the plan (%s); the padding rows "
                     "differ, so the loss over the padded vocabulary differs slightly"
                     % (n, have, vocab, "cut" if have > vocab else "zero rows added"))

    optim_ok = not src.no_optim
    if optim_ok:
        for n in weights:
            for kind in ("exp_avg", "exp_avg_sq"):
                if n not in state.get(kind, {}):
                    src.no_optim = "the optimizer state has no %s for %s" % (kind, n)
                    optim_ok = False
                    break
            if not optim_ok:
                break
    tensors = []
    for n in sorted(weights):
        w = weights[n].astype(np.float32)
        if precision == "fp32" and optim_ok and n in state.get("fp32_param", {}):
            w = state["fp32_param"][n].astype(np.float32)  # a bf16/fp16 run's main params
        master = None
        if precision != "fp32":
            master = state.get("fp32_param", {}).get(n) if optim_ok else None
            master = (w if master is None else master).astype(np.float32)
            w = round_bf16(master) if precision == "bf16" else \
                master.astype(np.float16).astype(np.float32)
        tensors.append((n, np.ascontiguousarray(w)))
        if master is not None:
            tensors.append((n + ".master", np.ascontiguousarray(master)))
        for kind in ("exp_avg", "exp_avg_sq"):
            s = state[kind][n] if optim_ok else np.zeros_like(w)
            if s.shape != w.shape:
                fail("%s: error: the optimizer's %s of %s is %s but the weight is %s; the "
                     "checkpoint is damaged" % (d, kind, n, list(s.shape), list(w.shape)))
            tensors.append((n + "." + kind, np.ascontiguousarray(s.astype(np.float32))))
    if precision != "fp32" and optim_ok and not state.get("fp32_param"):
        notes.append("the checkpoint has no fp32 main parameters (it trained in fp32): the "
                     "master copies are its weights")

    iteration = src.iteration
    steps = src.optimizer_steps if optim_ok and src.optimizer_steps is not None else 0
    if not optim_ok:
        steps = 0
    consumed = int(arg(src.args, "consumed_train_samples", 0) or 0)
    values = {"optimizer": "adam", "optimizer_steps": str(steps),
              "skipped_iterations": str(max(0, iteration - steps) if optim_ok else 0),
              "imported_from": "megatron %s %s" % (src.format, os.path.abspath(d))}
    sched = src.scheduler
    if isinstance(sched, dict) and "num_steps" in sched:
        values["lr_scheduler_samples"] = str(int(sched["num_steps"]))
    if not optim_ok:
        values["skipped_iterations"] = "0"
    # The loss scaler (fp16): Megatron's DynamicGradScaler state where the
    # optimizer kept it, else the plan's initial scale.
    scale, growth, hysteresis = 1.0, 0, 0
    if precision == "fp16":
        t = spec.get("training", {})
        scale = float(t.get("initial_loss_scale", 2.0 ** 32))
        hysteresis = int(t.get("hysteresis", 2))
        gs = src.grad_scaler if optim_ok else None
        if isinstance(gs, dict) and "scale" in gs:
            scale = float(gs["scale"])
            growth = int(gs.get("growth_tracker", 0))
            hysteresis = int(gs.get("hysteresis_tracker", hysteresis))
    meta = {"format": "mt-checkpoint", "iteration": iteration,
            "consumed_train_samples": consumed,
            "consumed_valid_samples": int(arg(src.args, "consumed_valid_samples", 0) or 0),
            "model_fingerprint": "imported from Megatron-Core", "spec_toml": "",
            "rng_state": [], "loss_scale": scale, "loss_scale_growth_tracker": growth,
            "loss_scale_hysteresis_tracker": hysteresis, "tp_rank": 0, "pp_rank": 0, "pp_size": 1,
            "values": values}

    whole = tempfile.mkdtemp(prefix=".tmp.megatron.", dir=parent)
    staging = whole + ".out"
    try:
        it_dir = os.path.join(whole, "iter_%07d" % iteration)
        os.mkdir(it_dir)
        write_rank_file(os.path.join(it_dir, "mp_rank_00.mtckpt"), meta, tensors)
        with open(os.path.join(whole, TRACKER), "w") as f:
            f.write(str(iteration))
        r = subprocess.run([args.mtc, "reshard", "--load", whole, "--plan", args.plan,
                            "--save", staging], capture_output=True, text=True)
        if r.returncode != 0:
            lines = (r.stderr or r.stdout).strip().splitlines() or ["exit status %d"
                                                                   % r.returncode]
            fail(lines[-1].replace(whole, d))
        if os.path.isdir(out):
            os.rmdir(out)
        os.rename(staging, out)
    except OSError as e:
        fail("%s: error: %s; nothing was written" % (e.filename or args.output, e.strerror))
    finally:
        shutil.rmtree(whole, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)

    tp = getattr(src, "tp", None) or arg(src.args, "tensor_model_parallel_size", 1)
    pp = getattr(src, "pp", None) or arg(src.args, "pipeline_model_parallel_size", 1)
    print("%s: Megatron-Core %s checkpoint (saved by tensor %s x pipeline %s), iteration %d, "
          "%d consumed samples" % (d, src.format, tp, pp, iteration, consumed))
    print("weights: %d tensors" % len(weights))
    if optim_ok:
        print("optimizer: Adam's exp_avg and exp_avg_sq%s, step count %d" % (
            ", fp32 main parameters" if precision != "fp32" and state.get("fp32_param") else "",
            steps))
    else:
        print("optimizer: not carried over (%s): Adam starts from zero moments, as with "
              "--no-load-optim" % src.no_optim, file=sys.stderr)
    for n in notes:
        print("note: " + n, file=sys.stderr)
    print("wrote %s for %s" % (args.output, args.plan))


def default_mtc():
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(os.path.dirname(here), "build", "bin", "mtc")
    return shutil.which("mtc") or built


def main(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Converts a Megatron-Core checkpoint "
                                "(torch_dist or torch format) into an mt checkpoint.")
    p.add_argument("megatron", help="Megatron's --save directory or an iter_XXXXXXX directory")
    p.add_argument("--plan", required=True, help="the plan (mtc compile -o) the run continues with")
    p.add_argument("-o", "--output", required=True, help="the mt checkpoint directory to write")
    p.add_argument("--iteration", type=int, default=None, help="this iteration, not the latest")
    p.add_argument("--no-optim", action="store_true",
                   help="carry over the weights only (Adam starts afresh)")
    p.add_argument("--mtc", default=default_mtc(), help="the mtc that lays out the checkpoint "
                   "for the plan (default: mtc on PATH, else build/bin/mtc)")
    args = p.parse_args(argv)
    try:
        convert(args)
    except ImportError_ as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
