#!/usr/bin/env python3
"""An mt checkpoint's tensors as Python float lists, with the standard library
alone (tests run where numpy is missing; tools/mt_checkpoint.py, which
verifies checksums, needs it). Format: runtime/ckpt/checkpoint.h.

    from ckpt_tensors import tensors
    t = tensors("SAVE/iter_0000010/mp_rank_00.mtckpt")   # {name: [float, ...]}
"""
import json
import struct


def tensors(path):
    buf = open(path, "rb").read()
    assert buf[:8] == b"MTCKPT\0\0", path + ": not an mt checkpoint"
    (_, _, meta_off, meta_size, table_off, table_size,
     count) = struct.unpack_from("<I6Q", buf, 12)
    json.loads(buf[meta_off:meta_off + meta_size].decode("utf-8"))
    out, at = {}, table_off
    for _ in range(count):
        (name_size,) = struct.unpack_from("<H", buf, at)
        name = buf[at + 2:at + 2 + name_size].decode("utf-8")
        at += 2 + name_size
        code, rank = struct.unpack_from("<BB", buf, at)
        offset, nbytes, _ = struct.unpack_from("<QQI", buf, at + 2 + 8 * rank)
        at += 2 + 8 * rank + 20
        raw = buf[offset:offset + nbytes]
        if code == 1:  # f32
            out[name] = list(struct.unpack("<%df" % (nbytes // 4), raw))
        elif code == 2:  # bf16: the high half of an f32
            bits = struct.unpack("<%dH" % (nbytes // 2), raw)
            out[name] = list(struct.unpack("<%df" % len(bits),
                                           struct.pack("<%dI" % len(bits),
                                                       *[b << 16 for b in bits])))
    return out
