"""Prints what tools/mt_checkpoint.load() returns for the sample checkpoint,
or with --flip NAME flips one byte of that tensor's data in the file."""
import sys

sys.path.insert(0, sys.argv[1])
import mt_checkpoint  # noqa: E402

path = sys.argv[2]
if len(sys.argv) > 3 and sys.argv[3] == "--flip":
    file = mt_checkpoint.resolve(path)
    _, table, _ = mt_checkpoint.read_file(file)
    (entry,) = [t for t in table if t["name"] == sys.argv[4]]
    with open(file, "r+b") as f:
        f.seek(entry["offset"] + entry["bytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    sys.exit(0)

meta, tensors = mt_checkpoint.load(path)
print("iteration", meta["iteration"], "rng", meta["rng_state"])
for name, a in tensors.items():
    if name == "blob":
        print(name, a.dtype, a.shape, "sum", int(a.sum(dtype="u8")))
    elif meta["tensors"][name]["dtype"] == "bf16":
        print(name, a.dtype, a.shape, a.tolist(), "as float32",
              mt_checkpoint.bf16_to_float32(a).tolist())
    else:  # flattened: FileCheck reads "[[" as a variable
        print(name, a.dtype, a.shape, a.ravel().tolist() if a.ndim else a.tolist())
