#!/usr/bin/env python3
"""Reads mt training checkpoints (format: runtime/ckpt/checkpoint.h) with numpy alone.

    from mt_checkpoint import load
    meta, tensors = load("SAVE")        # the latest checkpoint in SAVE
    meta, tensors = load("SAVE", iteration=100)
    meta, tensors = load("SAVE/iter_0000100/mp_rank_00.mtckpt")

meta is the file's metadata (iteration, consumed_train_samples, spec_toml,
rng_state, loss_scale, values, ...) plus "tensors": {name: {"dtype", "shape"}}.
tensors maps names to numpy arrays; bf16 has no numpy dtype and comes back as
uint16 bit patterns (torch.from_numpy(a).view(torch.bfloat16) restores it), or
as float32 with bf16_as_float32=True.

    python3 tools/mt_checkpoint.py inspect SAVE [--iteration N]

prints the metadata and the tensor table after verifying every checksum.
"""
import argparse
import json
import os
import signal
import struct
import sys

import numpy as np

MAGIC = b"MTCKPT\0\0"
VERSION = 1
TRACKER = "latest_checkpointed_iteration.txt"
DTYPES = {
    1: ("f32", "<f4"), 2: ("bf16", "<u2"), 3: ("f16", "<f2"), 4: ("i32", "<i4"),
    5: ("i64", "<i8"), 6: ("u64", "<u8"), 7: ("u8", "u1"),
}
OTHER = "load an earlier iteration instead, or start from scratch"
DAMAGED = "; the file was damaged after it was written: " + OTHER


class CheckpointError(Exception):
    """One line: the file, what is wrong, what to do."""


# --- CRC32C (Castagnoli, reflected 0x82F63B78; RFC 3720 B.4) ----------------

def _crc_tables():
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        t0.append(c)
    tables = [np.array(t0, dtype=np.uint32)]
    # tables[k][i]: byte i followed by k zero bytes (slicing by 4).
    for _ in range(3):
        p = tables[-1]
        tables.append((p >> 8) ^ tables[0][p & 0xFF])
    return tables, t0


_TABLES, _T0 = _crc_tables()


def _crc_bytes(reg, data):
    t = _T0
    for b in data:
        reg = t[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


def _crc_words(regs, words):
    """Feeds one little-endian u32 per lane into the lane registers."""
    t0, t1, t2, t3 = _TABLES
    x = regs ^ words
    return t3[x & 0xFF] ^ t2[(x >> 8) & 0xFF] ^ t1[(x >> 16) & 0xFF] ^ t0[x >> 24]


def crc32c(data, crc=0):
    """CRC32C of a bytes-like object or array, continuing from crc."""
    a = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    reg = crc ^ 0xFFFFFFFF
    n = a.size
    lanes = min(16384, n // 4096)
    if lanes < 16:
        return _crc_bytes(reg, a.tobytes()) ^ 0xFFFFFFFF
    # Split the body into equal lanes run side by side; lane 0 continues reg,
    # the others start from 0. CRC is linear, so
    # crc(A + B) = shift(crc(A), len(B)) ^ crc_from_0(B) joins them after.
    m = (n // lanes) & ~3
    body = a[: lanes * m].reshape(lanes, m).view("<u4")
    regs = np.zeros(lanes, dtype=np.uint32)
    regs[0] = reg
    step = 64
    for k in range(0, m // 4, step):
        block = np.ascontiguousarray(body[:, k:k + step].T)
        for row in block:
            regs = _crc_words(regs, row)
    # shift(x, m): x followed by m zero bytes, as four byte tables.
    basis = np.concatenate([np.arange(256, dtype=np.uint32) << np.uint32(8 * k)
                            for k in range(4)])
    zero = np.uint32(0)
    for _ in range(m // 4):
        basis = _crc_words(basis, zero)
    s0, s1, s2, s3 = (basis[256 * k:256 * (k + 1)].tolist() for k in range(4))
    reg = 0
    for r in regs.tolist():
        reg = s0[reg & 0xFF] ^ s1[(reg >> 8) & 0xFF] ^ s2[(reg >> 16) & 0xFF] ^ s3[reg >> 24] ^ r
    reg = _crc_bytes(reg, a[lanes * m:].tobytes())
    return reg ^ 0xFFFFFFFF


# --- Paths --------------------------------------------------------------------

def rank_name(tp_rank=0, pp_rank=0, pp_size=1, ep_rank=0, ep_size=1):
    """Megatron's names: mp_rank_00, or mp_rank_00_000 with pipeline
    parallelism; with expert parallelism the ep rank after them
    (mp_rank_00_001, mp_rank_00_000_001)."""
    name = "mp_rank_%02d" % tp_rank if pp_size == 1 else "mp_rank_%02d_%03d" % (tp_rank, pp_rank)
    return name + ("_%03d" % ep_rank if ep_size > 1 else "")


def rank_file_in(directory, tp_rank, pp_rank, pp_size, ep_rank=0, ep_size=None):
    """The rank file's name; with pp_size or ep_size None, whichever of
    Megatron's spellings the directory holds (mp_rank_00, mp_rank_00_000 or
    mp_rank_00_000_000)."""
    # Any size > 1 spells the name alike; a rank > 0 needs one.
    pp_sizes = [pp_size] if pp_size is not None else [2] if pp_rank > 0 else [1, 2]
    ep_sizes = [ep_size] if ep_size is not None else [2] if ep_rank > 0 else [1, 2]
    for pps in pp_sizes:
        for eps in ep_sizes:
            name = rank_name(tp_rank, pp_rank, pps, ep_rank, eps) + ".mtckpt"
            if os.path.isfile(os.path.join(directory, name)):
                return name
    return rank_name(tp_rank, pp_rank, pp_sizes[0], ep_rank, ep_sizes[0]) + ".mtckpt"


def resolve(path, iteration=None, tp_rank=0, pp_rank=0, pp_size=None, ep_rank=0, ep_size=None):
    """The rank file for a save directory, an iteration directory or a file.
    pp_size / ep_size None: recognised by the file names."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise CheckpointError("no checkpoint at %s (no such file or directory)" % path)
    name = rank_file_in(path, tp_rank, pp_rank, pp_size, ep_rank, ep_size)
    if iteration is None and os.path.isfile(os.path.join(path, name)):
        return os.path.join(path, name)  # an iteration directory
    if iteration is None:
        tracker = os.path.join(path, TRACKER)
        if not os.path.isfile(tracker):
            raise CheckpointError("no checkpoint in %s (%s is missing)" % (path, TRACKER))
        with open(tracker) as f:
            text = f.read().strip()
        if text == "release":
            raise CheckpointError(
                "%s: error: says 'release': this is a converted Megatron-LM checkpoint, "
                "which mt cannot read" % tracker)
        if not text.isdigit():
            raise CheckpointError("%s: error: expected an iteration number, found '%s'"
                                  % (tracker, text[:40]))
        iteration = int(text)
    iter_dir = os.path.join(path, "iter_%07d" % iteration)
    if not os.path.isdir(iter_dir):
        raise CheckpointError("no checkpoint for iteration %d in %s (%s does not exist)"
                              % (iteration, path, os.path.basename(iter_dir)))
    name = rank_file_in(iter_dir, tp_rank, pp_rank, pp_size, ep_rank, ep_size)
    file = os.path.join(iter_dir, name)
    if not os.path.isfile(file):
        have = sorted(n for n in os.listdir(iter_dir) if n.endswith(".mtckpt"))
        raise CheckpointError("%s: error: has no %s (it has %s)"
                              % (iter_dir, name, ", ".join(have) or "no mt checkpoint files"))
    return file


# --- Reading ------------------------------------------------------------------

def read_file(path, verify=True):
    """(meta, table, buffer): the validated file; table rows are dicts with
    name, dtype, shape, offset, bytes, crc32c."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        f.readinto(buf)
    where = path + ": error: "
    trunc = "; the save was cut short or the file was copied incompletely: " + OTHER
    if size < 8 and MAGIC.startswith(bytes(buf)):
        raise CheckpointError(where + "truncated: %d bytes, shorter than the 64-byte header%s"
                              % (size, trunc))
    if bytes(buf[:8]) != MAGIC:
        if bytes(buf[:4]) == b"PK\x03\x04":
            raise CheckpointError(where + "this is a PyTorch file (torch.save), not an mt "
                                  "checkpoint")
        raise CheckpointError(where + 'not an mt checkpoint (it does not start with "MTCKPT")')
    if size < 12:
        raise CheckpointError(where + "truncated: %d bytes, shorter than the 64-byte header%s"
                              % (size, trunc))
    (version,) = struct.unpack_from("<I", buf, 8)
    if version != VERSION:
        raise CheckpointError(where + "format version %d; this reader reads version %d"
                              % (version, VERSION))
    if size < 64:
        raise CheckpointError(where + "truncated: %d bytes, shorter than the 64-byte header%s"
                              % (size, trunc))
    (header_crc, file_size, meta_off, meta_size, table_off, table_size,
     count) = struct.unpack_from("<I6Q", buf, 12)
    if size != file_size:
        what = "truncated: " if size < file_size else ""
        raise CheckpointError(where + "%sthe file has %d bytes but its header says %d%s"
                              % (what, size, file_size, trunc if what else DAMAGED))
    if (meta_off != 64 or meta_off + meta_size > size or table_off != meta_off + meta_size
            or table_off + table_size > size):
        raise CheckpointError(where + "the header's metadata and table bounds lie outside the "
                              "file" + DAMAGED)
    crc = crc32c(buf[16:64])
    crc = crc32c(buf[meta_off:meta_off + meta_size], crc)
    crc = crc32c(buf[table_off:table_off + table_size], crc)
    if crc != header_crc:
        raise CheckpointError(where + "the header, metadata or tensor table is corrupt (CRC32C "
                              "0x%08x, recorded 0x%08x)%s" % (crc, header_crc, DAMAGED))
    meta = json.loads(bytes(buf[meta_off:meta_off + meta_size]).decode("utf-8"))
    if meta.get("format") != "mt-checkpoint":
        raise CheckpointError(where + 'the metadata does not say "format": "mt-checkpoint"')

    table, at, end = [], table_off, table_off + table_size
    try:
        for i in range(count):
            (name_size,) = struct.unpack_from("<H", buf, at)
            name = bytes(buf[at + 2:at + 2 + name_size]).decode("utf-8")
            at += 2 + name_size
            code, rank = struct.unpack_from("<BB", buf, at)
            shape = list(struct.unpack_from("<%dq" % rank, buf, at + 2))
            offset, nbytes, tcrc = struct.unpack_from("<QQI", buf, at + 2 + 8 * rank)
            at += 2 + 8 * rank + 20
            if code not in DTYPES:
                raise CheckpointError(where + "tensor table entry %d ('%s') has unknown dtype "
                                      "code %d%s" % (i, name, code, DAMAGED))
            dtype, np_dtype = DTYPES[code]
            if (int(np.prod(shape, dtype=np.int64)) * np.dtype(np_dtype).itemsize != nbytes
                    or offset % 64 or offset + nbytes > size or offset < end):
                raise CheckpointError(where + "tensor table entry %d ('%s') is inconsistent%s"
                                      % (i, name, DAMAGED))
            table.append({"name": name, "dtype": dtype, "shape": shape, "offset": offset,
                          "bytes": nbytes, "crc32c": tcrc})
    except struct.error:
        raise CheckpointError(where + "the tensor table runs past its end" + DAMAGED)
    if at != end:
        raise CheckpointError(where + "the tensor table has trailing bytes" + DAMAGED)
    if verify:
        for t in table:
            c = crc32c(memoryview(buf)[t["offset"]:t["offset"] + t["bytes"]])
            if c != t["crc32c"]:
                raise CheckpointError(where + "tensor '%s' is corrupt (CRC32C 0x%08x, recorded "
                                      "0x%08x)%s" % (t["name"], c, t["crc32c"], DAMAGED))
    return meta, table, buf


def bf16_to_float32(bits):
    """bf16 bit patterns (uint16) to float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def load(path, iteration=None, tp_rank=0, pp_rank=0, pp_size=None, verify=True,
         bf16_as_float32=False, ep_rank=0, ep_size=None):
    """(meta, {name: numpy array}) of one rank's checkpoint; see the module doc."""
    file = resolve(path, iteration, tp_rank, pp_rank, pp_size, ep_rank, ep_size)
    meta, table, buf = read_file(file, verify)
    tensors = {}
    for t in table:
        np_dtype = dict(DTYPES.values())[t["dtype"]]
        count = t["bytes"] // np.dtype(np_dtype).itemsize
        a = np.frombuffer(buf, dtype=np_dtype, count=count, offset=t["offset"])
        a = a.reshape(t["shape"])
        if t["dtype"] == "bf16" and bf16_as_float32:
            a = bf16_to_float32(a)
        tensors[t["name"]] = a
    meta["tensors"] = {t["name"]: {"dtype": t["dtype"], "shape": t["shape"]} for t in table}
    return meta, tensors


# --- CLI ----------------------------------------------------------------------

def inspect(args):
    file = resolve(args.path, args.iteration, args.tp_rank, args.pp_rank, args.pp_size,
                   args.ep_rank, args.ep_size)
    meta, table, _ = read_file(file, verify=True)
    out = ["checkpoint: %s" % file]
    for key in ("iteration", "consumed_train_samples", "consumed_valid_samples",
                "model_fingerprint"):
        out.append("%s: %s" % (key, meta[key]))
    ep_rank, ep_size = meta.get("ep_rank", 0), meta.get("ep_size", 1)
    out.append("rank: %s (pipeline size %d%s)"
               % (rank_name(meta["tp_rank"], meta["pp_rank"], meta["pp_size"], ep_rank, ep_size),
                  meta["pp_size"],
                  ", expert-parallel size %d" % ep_size if ep_size > 1 else ""))
    out.append("loss_scale: %r (growth tracker %d, hysteresis tracker %d)"
               % (float(meta["loss_scale"]), meta["loss_scale_growth_tracker"],
                  meta["loss_scale_hysteresis_tracker"]))
    # mtrun --no-save-optim / --no-save-rng record what they left out.
    values = meta["values"]
    out.append("rng_state: %d words%s" % (
        len(meta["rng_state"]),
        " (not saved: --no-save-rng)" if values.get("no_save_rng") == "true" else ""))
    if values.get("no_save_optim") == "true":
        out.append("optimizer state: not saved (--no-save-optim): the weights alone")
    out.append("spec_toml: %d bytes" % len(meta["spec_toml"].encode("utf-8")))
    for k, v in sorted(meta["values"].items()):
        out.append("value %s = %s" % (json.dumps(k), json.dumps(v)))
    total = sum(t["bytes"] for t in table)
    out.append("tensors: %d, %d bytes, checksums verified" % (len(table), total))
    rows = [("name", "dtype", "shape", "offset", "bytes", "crc32c")]
    for t in table:
        rows.append((t["name"], t["dtype"], "[%s]" % ", ".join(map(str, t["shape"])),
                     str(t["offset"]), str(t["bytes"]), "0x%08x" % t["crc32c"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print("\n".join(out))


def main(argv):
    parser = argparse.ArgumentParser(prog="mt_checkpoint.py",
                                     description="Reads mt training checkpoints.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="print the metadata and tensor table")
    p.add_argument("path", help="a --save directory, an iter_XXXXXXX directory or a file")
    p.add_argument("--iteration", type=int, default=None,
                   help="this iteration instead of the latest")
    p.add_argument("--tp-rank", type=int, default=0,
                   help="the TT of mp_rank_TT: the tensor-parallel rank (the "
                        "expert-tensor-parallel rank of an expert writer when etp > tp)")
    p.add_argument("--pp-rank", type=int, default=0)
    p.add_argument("--pp-size", type=int, default=None,
                   help="the pipeline size (default: recognised from the file names)")
    p.add_argument("--ep-rank", type=int, default=0, help="the expert-parallel rank")
    p.add_argument("--ep-size", type=int, default=None,
                   help="the expert-parallel size (default: recognised from the file names)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    try:
        inspect(args)
    except CheckpointError as e:
        print("mt_checkpoint.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
