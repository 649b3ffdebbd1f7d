"""Rewrites an mt rank file's metadata (checkpoint.h has the format) with
valid checksums, so a test reaches the checks behind the CRC.

  edit_meta.py FILE KEY=JSON ...   set a top-level field ("iteration=-1")
  edit_meta.py FILE values.KEY=TEXT ...  set a string of "values" (TEXT may
                                         hold Python escapes: "a\\nb")
  edit_meta.py FILE tensor.NAME=NEW ...  rename a tensor (NEW may hold
                                         Python escapes: "a\\nb")

Pure Python: the CRC32C here is the bytewise table form (RFC 3720, B.4)."""
import json
import struct
import sys


def _table():
    t = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _table()


def crc32c(data, crc=0):
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def main(path, edits):
    buf = open(path, "rb").read()
    (_, file_size, meta_off, meta_size, table_off, table_size,
     count) = struct.unpack_from("<IQQQQQQ", buf, 12)
    meta = json.loads(buf[meta_off:meta_off + meta_size].decode())
    renames = {}
    for e in edits:
        key, _, value = e.partition("=")
        if key.startswith("values."):
            meta["values"][key[7:]] = value.encode().decode("unicode_escape")
        elif key.startswith("tensor."):
            renames[key[7:].encode()] = value.encode().decode("unicode_escape").encode("latin-1")
        else:
            meta[key] = json.loads(value)
    new_meta = json.dumps(meta).encode()
    old_table = buf[table_off:table_off + table_size]
    table, entries, at = bytearray(), [], 0
    for _ in range(count):
        (n,) = struct.unpack_from("<H", old_table, at)
        name = old_table[at + 2:at + 2 + n]
        rank = old_table[at + 2 + n + 1]
        tail = old_table[at + 2 + n:at + 2 + n + 2 + 8 * rank + 20]
        name = renames.get(name, name)
        table += struct.pack("<H", len(name)) + name
        entries.append(len(table) + 2 + 8 * rank)
        table += tail
        at += 2 + n + len(tail)
    old_data = min([struct.unpack_from("<Q", table, p)[0] for p in entries] or [file_size])
    table_at = 64 + len(new_meta)
    new_data = (table_at + len(table) + 63) // 64 * 64 if entries else table_at + len(table)
    for p in entries:
        (off,) = struct.unpack_from("<Q", table, p)
        struct.pack_into("<Q", table, p, off - old_data + new_data)
    body = new_meta + bytes(table)
    out = bytearray(buf[:64]) + body + b"\0" * (new_data - 64 - len(body)) + buf[old_data:]
    struct.pack_into("<QQQQQQ", out, 16, len(out), 64, len(new_meta), table_at, len(table),
                     count)
    crc = crc32c(bytes(out[16:64]))
    crc = crc32c(body, crc)
    struct.pack_into("<I", out, 12, crc)
    open(path, "wb").write(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
