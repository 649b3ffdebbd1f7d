#!/usr/bin/env python3
"""Rewrites fields of a compiled plan.bin in place and fixes its checksum.

A test tool for the plan reader's checks: the result is a plan that passes
the header checksum and the FlatBuffers verifier, with one field changed.

  plan_patch.py IN OUT EDIT...

EDIT is PATH=VALUE. PATH walks tables from the root Plan by field name (the
field numbers come from runtime/plan/plan.fbs, declaration order), vector
elements by index, or, for a vector of tables, by the element's `name`:

  training.micro_batch_size=0
  kernels.*.cpu_scratch_bytes=9223372036854775807    (every kernel that has it)
  ranks.0.programs.train_step.input_names.0=tokenz   (same length only)
  spec_toml@5=0xff                                    (one byte of a string)

`plan_patch.py --io PLAN` lists every program's named inputs and outputs.

A scalar must be present in the file (FlatBuffers omits default values);
a string is replaced only by one of the same length, so no offset moves.
"""
import os
import re
import struct
import sys

SCALARS = {
    "bool": "<B", "byte": "<b", "ubyte": "<B", "short": "<h", "ushort": "<H",
    "int": "<i", "uint": "<I", "long": "<q", "ulong": "<Q", "float": "<f",
    "double": "<d",
}
HEADER = 32


def parse_schema(path):
    """{table: [(field, type)]} in declaration order; enums map to their base."""
    text = re.sub(r"//[^\n]*", "", open(path).read())
    enums = {m.group(1): m.group(2)
             for m in re.finditer(r"enum\s+(\w+)\s*:\s*(\w+)", text)}
    tables = {}
    for m in re.finditer(r"table\s+(\w+)\s*\{([^}]*)\}", text):
        fields = []
        for f in m.group(2).split(";"):
            f = f.strip()
            if not f:
                continue
            name, typ = [s.strip() for s in f.split(":", 1)]
            typ = typ.split("=")[0].strip()
            fields.append((name, enums.get(typ, typ)))
        tables[m.group(1)] = fields
    return tables


class Buf:
    def __init__(self, data):
        self.b = data

    def u32(self, at):
        return struct.unpack_from("<I", self.b, at)[0]

    def field(self, table, index):
        """Position of field `index` in the table at `table`, or None."""
        vt = table - struct.unpack_from("<i", self.b, table)[0]
        vsize = struct.unpack_from("<H", self.b, vt)[0]
        if 4 + 2 * index >= vsize:
            return None
        off = struct.unpack_from("<H", self.b, vt + 4 + 2 * index)[0]
        return table + off if off else None

    def deref(self, at):
        return at + self.u32(at)


class Absent(Exception):
    pass


def fail(msg):
    sys.exit("plan_patch.py: " + msg)


def apply(buf, tables, edit):
    path, value = edit.split("=", 1)
    byte = None
    if "@" in path:
        path, byte = path.split("@")
        byte = int(byte)
    parts = path.split(".")
    table, ttype = buf.deref(0), "Plan"
    i = 0
    while True:
        name = parts[i]
        fields = tables[ttype]
        idx = [k for k, (n, _) in enumerate(fields) if n == name]
        if not idx:
            fail("table %s has no field %s" % (ttype, name))
        ftype = fields[idx[0]][1]
        pos = buf.field(table, idx[0])
        if pos is None:
            raise Absent("%s is absent in this plan (a default value)" % ".".join(parts[:i + 1]))
        i += 1
        if ftype in SCALARS:
            if i != len(parts):
                fail("%s is a scalar" % name)
            v = float(value) if ftype in ("float", "double") else int(value, 0)
            struct.pack_into(SCALARS[ftype], buf.b, pos, v)
            return
        if ftype == "string":
            return set_string(buf, buf.deref(pos), value, byte)
        if ftype.startswith("["):
            elem = ftype[1:-1]
            vec = buf.deref(pos)
            n = buf.u32(vec)
            sel = parts[i]
            i += 1
            if sel == "*":  # every element where the rest of the path is present
                done = 0
                for k in range(n):
                    rest = parts[:i - 1] + [str(k)] + parts[i:]
                    try:
                        apply(buf, tables, ".".join(rest) + ("@%d" % byte if byte is not None
                                                             else "") + "=" + value)
                        done += 1
                    except Absent:
                        pass
                if not done:
                    raise Absent("%s is absent in every element" % path)
                return
            if sel.isdigit():
                k = int(sel)
            else:  # a table by its name
                k = next((k for k in range(n)
                          if read_string(buf, buf.deref(vec + 4 + 4 * k), tables, elem) == sel),
                         None)
                if k is None:
                    fail("no element of %s is named %s" % (name, sel))
            if k >= n:
                fail("%s has %d elements" % (name, n))
            at = vec + 4 + 4 * k
            if elem == "string":
                return set_string(buf, buf.deref(at), value, byte)
            if elem in SCALARS:
                at = vec + 4 + struct.calcsize(SCALARS[elem]) * k
                struct.pack_into(SCALARS[elem], buf.b, at, int(value, 0))
                return
            table, ttype = buf.deref(at), elem
            continue
        table, ttype = buf.deref(pos), ftype


def read_string(buf, table, tables, ttype):
    idx = [k for k, (n, _) in enumerate(tables[ttype]) if n == "name"]
    pos = buf.field(table, idx[0]) if idx else None
    if pos is None:
        return None
    s = buf.deref(pos)
    return bytes(buf.b[s + 4:s + 4 + buf.u32(s)]).decode("utf-8", "replace")


def set_string(buf, at, value, byte):
    n = buf.u32(at)
    if byte is not None:
        if byte >= n:
            fail("the string has %d bytes" % n)
        buf.b[at + 4 + byte] = int(value, 0)
        return
    new = value.encode()
    if len(new) != n:
        fail("the new string must have the old one's %d bytes" % n)
    buf.b[at + 4:at + 4 + n] = new


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for c in data:
        h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def table_field(buf, tables, table, ttype, name):
    idx = [k for k, (n, _) in enumerate(tables[ttype]) if n == name][0]
    return buf.field(table, idx)


def table_vector(buf, tables, table, ttype, name):
    pos = table_field(buf, tables, table, ttype, name)
    if pos is None:
        return None, 0
    vec = buf.deref(pos)
    return vec, buf.u32(vec)


def dump_io(buf, tables):
    """Each rank's programs: their named inputs and outputs, shape and dtype."""
    dtypes = ["f32", "bf16", "f16", "i32", "i64"]
    root = buf.deref(0)
    ranks, nr = table_vector(buf, tables, root, "Plan", "ranks")
    for r in range(nr):
        rank = buf.deref(ranks + 4 + 4 * r)
        progs, npg = table_vector(buf, tables, rank, "Rank", "programs")
        for p in range(npg):
            prog = buf.deref(progs + 4 + 4 * p)
            values, _ = table_vector(buf, tables, prog, "Program", "values")
            for kind in ("input", "output"):
                ids, n = table_vector(buf, tables, prog, "Program", kind + "s")
                names, _ = table_vector(buf, tables, prog, "Program", kind + "_names")
                for k in range(n):
                    v = buf.u32(ids + 4 + 4 * k)
                    s = buf.deref(names + 4 + 4 * k)
                    name = bytes(buf.b[s + 4:s + 4 + buf.u32(s)]).decode()
                    val = buf.deref(values + 4 + 4 * v)
                    shp, ns = table_vector(buf, tables, val, "Value", "shape")
                    shape = [struct.unpack_from("<q", buf.b, shp + 4 + 8 * i)[0] for i in range(ns)]
                    dt = table_field(buf, tables, val, "Value", "dtype")
                    print("rank %d %s %s %s %s %s" % (
                        r, read_string(buf, prog, tables, "Program"), kind, name, shape,
                        dtypes[buf.b[dt] if dt is not None else 0]))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--io":
        tables = parse_schema(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           "..", "..", "..", "runtime", "plan", "plan.fbs"))
        return dump_io(Buf(bytearray(open(sys.argv[2], "rb").read())[HEADER:]), tables)
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    schema = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "..", "..", "..", "runtime", "plan", "plan.fbs")
    tables = parse_schema(schema)
    data = bytearray(open(sys.argv[1], "rb").read())
    payload = Buf(data[HEADER:])
    for edit in sys.argv[3:]:
        try:
            apply(payload, tables, edit)
        except Absent as e:
            fail(str(e))
    data[HEADER:] = payload.b
    struct.pack_into("<Q", data, 24, fnv1a64(payload.b))
    open(sys.argv[2], "wb").write(data)


if __name__ == "__main__":
    main()
