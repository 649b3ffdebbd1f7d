"""Sets one entry of an .mtidx index cache's arrays (runtime/data/gpt_dataset.h
gives the layout), to test that damage is noticed.

  mtidx_patch.py FILE ARRAY ENTRY VALUE [--fix-checksums]

ARRAY is doc, sample or shuffle (a GPT index) or dataset, dataset_sample (a
blend's); ENTRY counts elements of that array (a sample index row is two);
VALUE is a number, @K for the value of the array's entry K, or +D for the
entry's own value plus D.
Without --fix-checksums only the entry's bytes change, as damage would; with
it the arrays' CRC-32C and the header's FNV-1a are recomputed, as a crafted
file would be, so only the checks of the entries themselves can catch it.
"""
import struct
import sys


def crc32c(data, crc=0):
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def fnv1a(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def pad8(n):
    return (n + 7) & ~7


def main():
    args = [a for a in sys.argv[1:] if a != "--fix-checksums"]
    fix = "--fix-checksums" in sys.argv
    path, array, entry, value = args[0], args[1], int(args[2]), args[3]
    data = bytearray(open(path, "rb").read())
    assert data[:8] == b"MTGPTIDX", "not an .mtidx file"
    version, kind, dlen = struct.unpack_from("<IIQ", data, 8)
    assert version == 2, version
    counts = struct.unpack_from("<QQQ", data, 24)
    w0, w1 = data[48], data[49]
    signed = {1: "b", 2: "h", 4: "i", 8: "q"}
    if kind == 1:
        arrays = [("doc", counts[0], "i", 4), ("sample", 2 * counts[1], signed[w0], w0),
                  ("shuffle", counts[2], "I" if w1 == 4 else "q", w1)]
    else:
        arrays = [("dataset", counts[0], "h", 2), ("dataset_sample", counts[0], "q", 8)]
    start = 80 + pad8(dlen)
    at = start
    for name, n, fmt, width in arrays:
        if name == array:
            assert 0 <= entry < n, f"{array} has {n} entries"
            own = struct.unpack_from("<" + fmt, data, at + entry * width)[0]
            if value.startswith("@"):
                value = struct.unpack_from("<" + fmt, data, at + int(value[1:]) * width)[0]
            elif value.startswith("+"):
                value = own + int(value[1:])
            else:
                value = int(value)
            struct.pack_into("<" + fmt, data, at + entry * width, value)
            break
        at += pad8(n * width)
    else:
        sys.exit(f"no array {array}")
    if fix:
        struct.pack_into("<I", data, 52, crc32c(data[start:]))
        header = fnv1a(bytes(data[80:80 + dlen]), fnv1a(bytes(data[:72])))
        struct.pack_into("<Q", data, 72, header)
    open(path, "wb").write(data)


if __name__ == "__main__":
    main()
