#!/usr/bin/env python3
"""Reads the TensorBoard event files of a directory and checks their scalars
against mtrun's log lines.

usage: check_tfevents.py DIR MTRUN.out [--tensorboard] [--interval N] [--flops F --world W]
                         [--absent TAG ...]

--tensorboard: TensorBoard's own reader (EventAccumulator, from the
  tensorboard package) must see the same scalars as this decoder;
--interval N: the iteration scalars are written every N iterations;
--flops F --world W: F a number or a call such as "megatron_flops(...)" of
  bench/flops.py; "throughput" (TFLOP/s/GPU) times "iteration-time" (s)
  must be F / (1e12 W) at every step that has both (Megatron's throughput
  of an iteration of F floating-point operations on W GPUs);
--absent TAG: TAG must not be in the files (left out by a flag).

"params-norm" and "num-zeros" must hold the log lines' params norm and num
zeros where the lines have them.

The files are decoded here from the formats' definitions (TFRecord framing
with masked CRC-32C, computed bit by bit; the protobuf wire format of
tensorflow.Event), independently of mtrun's writer. Prints one line per
tag: its steps and the first and last values.
"""
import math
import os
import re
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            sys.exit(f"unexpected wire type {wire}")
        yield field, wire, v


def records(path):
    data = open(path, "rb").read()
    i = 0
    while i < len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        (lcrc,) = struct.unpack_from("<I", data, i + 8)
        if lcrc != masked(crc32c(data[i:i + 8])):
            sys.exit(f"{path}: bad length CRC at byte {i}")
        body = data[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, i + 12 + n)
        if dcrc != masked(crc32c(body)):
            sys.exit(f"{path}: bad data CRC at byte {i}")
        yield body
        i += 12 + n + 4


def scalars(directory):
    """{tag: [(step, value)]} over every events file, files in the order
    they were started (their first record's wall time), records in order."""
    out = {}
    files = []
    for name in os.listdir(directory):
        if not name.startswith("events.out.tfevents."):
            continue
        events = [{f: v for f, _, v in fields(body)}
                  for body in records(os.path.join(directory, name))]
        if not events or events[0].get(3) != b"brain.Event:2":
            sys.exit(f"{name}: the first record is not the file version")
        (started,) = struct.unpack("<d", events[0][1])
        files.append((started, name, events[1:]))
    if not files:
        sys.exit(f"no events file in {directory}")
    for _, name, events in sorted(files):
        for event in events:
            step = event.get(2, 0)
            for f, _, value in fields(event[5]):
                if f != 1:
                    continue
                v = {f: x for f, _, x in fields(value)}
                out.setdefault(v[1].decode(), []).append((step, struct.unpack("<f", v[2])[0]))
    return out


extras = {}  # params-norm, num-zeros: [(iteration, consumed samples, value)]


def log_lines(path):
    its, vals = {}, []
    for line in open(path):
        m = re.search(r"iteration\s+(\d+)/\s*\d+ \| consumed samples:\s+(\d+) .*learning rate: "
                      r"([0-9.E+-]+) \|.*lm loss: ([0-9.E+-]+) \| loss scale: ([0-9.]+) \|"
                      r"(?: grad norm: ([0-9.]+) \|)?", line)
        if m:
            its[int(m.group(1))] = (int(m.group(2)), float(m.group(3)), float(m.group(4)),
                                    float(m.group(5)), m.group(6) and float(m.group(6)))
            for name, tag in (("params norm", "params-norm"), ("num zeros", "num-zeros")):
                x = re.search(name + r": ([0-9.]+) \|", line)
                if x:
                    extras.setdefault(tag, []).append((int(m.group(1)), int(m.group(2)),
                                                       float(x.group(1))))
        # In-training validations and the final evaluations (validation and
        # test set), in the order they ran: Megatron writes all of them to
        # "lm loss validation".
        m = re.search(r"validation loss at iteration (\d+)(?: on \w+ set)? \| lm loss value: "
                      r"([0-9.E+-]+)", line)
        if m:
            vals.append((int(m.group(1)), float(m.group(2))))
    return its, vals


def close(a, b, rel):
    return abs(a - b) <= rel * abs(b) + 1e-30


def main():
    directory, log = sys.argv[1], sys.argv[2]
    interval, absent, tensorboard, flops, world = 1, [], False, None, 1
    rest = sys.argv[3:]
    while rest:
        if rest[0] == "--tensorboard":
            tensorboard, rest = True, rest[1:]
        elif rest[0] == "--interval":
            interval, rest = int(rest[1]), rest[2:]
        elif rest[0] == "--flops":
            # A number, or a call of bench/flops.py's (Megatron's formula
            # written from its source, apart from mt's C++ count).
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "..", "..", "..", "bench"))
            import flops as bench_flops
            flops, rest = float(eval(rest[1], vars(bench_flops))), rest[2:]
        elif rest[0] == "--world":
            world, rest = int(rest[1]), rest[2:]
        elif rest[0] == "--absent":
            absent, rest = rest[1:], []
        else:
            sys.exit(f"unknown argument {rest[0]}")
    got = scalars(directory)
    for tag in absent:
        if tag in got or tag + " vs samples" in got:
            sys.exit(f"'{tag}' is in the event files")
    its, vals = log_lines(log)
    samples = {it: v[0] for it, v in its.items()}
    # What each chart must hold, from the log lines (printed to 7 digits).
    want = {}
    for it, (consumed, lr, loss, scale, norm) in its.items():
        if it % interval:
            continue
        for tag, v in (("learning-rate", lr), ("lm loss", loss), ("loss-scale", scale),
                       ("grad-norm", norm)):
            if v is None or tag in absent:
                continue
            want.setdefault(tag, []).append((it, v))
            want.setdefault(tag + " vs samples", []).append((consumed, v))
    for tag, points in extras.items():
        for it, consumed, v in points:
            if it % interval == 0:
                want.setdefault(tag, []).append((it, v))
                want.setdefault(tag + " vs samples", []).append((consumed, v))
    if flops is not None:
        time = dict(got.get("iteration-time", []))
        both = [(s, t, time[s]) for s, t in got.get("throughput", []) if s in time]
        if not both:
            sys.exit("no step has both throughput and iteration-time")
        for step, tput, seconds in both:
            if not close(tput * seconds * 1e12 * world, flops, 1e-5):
                sys.exit(f"step {step}: throughput {tput} x iteration-time {seconds} s x 1e12 x "
                         f"{world} GPUs is not {flops:g} FLOPs")
        print(f"throughput x iteration-time = {flops:g} / (1e12 x {world}) at steps "
              f"{[s for s, _, _ in both]}")
    for it, loss in vals:
        want.setdefault("lm loss validation", []).append((it, loss))
        want.setdefault("lm loss validation vs samples", []).append((samples[it], loss))
    for tag, points in sorted(want.items()):
        if tag not in got:
            sys.exit(f"no '{tag}' in the event files; they have {sorted(got)}")
        have = got[tag]
        if [s for s, _ in have] != [s for s, _ in points]:
            sys.exit(f"'{tag}' has steps {[s for s, _ in have]}, the log {[s for s, _ in points]}")
        for (step, h), (_, v) in zip(have, points):
            # grad norms are printed with 3 decimals, the rest with 7 digits
            ok = (abs(h - v) <= 5e-4 if tag.startswith(("grad-norm", "params-norm"))
                  else close(h, v, 1e-6))
            if not ok:
                sys.exit(f"'{tag}' at step {step}: {h} in the events, {v} in the log")
    if tensorboard:
        from tensorboard.backend.event_processing import event_accumulator
        acc = event_accumulator.EventAccumulator(directory, size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        if sorted(tags) != sorted(got):
            sys.exit(f"tensorboard's reader sees tags {sorted(tags)}, this decoder {sorted(got)}")
        for tag in tags:
            theirs = [(e.step, e.value) for e in acc.Scalars(tag)]
            if theirs != got[tag]:
                sys.exit(f"tensorboard's reader sees '{tag}' as {theirs}, this decoder {got[tag]}")
        print("tensorboard's reader: the same scalars")
    for tag in sorted(got):
        steps = [s for s, _ in got[tag]]
        print(f"{tag}: steps {steps}, {got[tag][0][1]:.6g} .. {got[tag][-1][1]:.6g}")


if __name__ == "__main__":
    main()
