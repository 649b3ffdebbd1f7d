#!/usr/bin/env bash
# Makes the fuzz targets' seed corpora from real files, written by the
# normal build's tools (build/bin: mtc, mtrun, mt-preprocess, mt-dataset):
#   fuzz/make_seeds.sh SEEDS [BUILD]
# SEEDS/ then holds the files the targets read beside their input
# ($MT_FUZZ_SEEDS: plan.bin, ckpt/, data/) and corpus/<target>/ the seeds:
#   spec         the presets of models/ and the test specs
#   plan         plan.bin of fuzz/seeds/micro.toml, and with tensor,
#                pipeline and data parallelism and the distributed optimizer
#   checkpoint   the rank file mtrun saves after one iteration of that plan
#   tracker      its latest_checkpointed_iteration.txt
#   idx, bin     a small NullTokenizer dataset mt-preprocess writes (bin:
#                u32 .idx size, .idx, .bin; fuzz/fuzz_bin.cpp)
#   index_cache  the train split's index cache mt-dataset writes for it
# Nothing here is kept in git; the files are a few KB each.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: fuzz/make_seeds.sh SEEDS [BUILD]}
build=${2:-$root/build}
bin=$build/bin
for t in mtc mtrun mt-preprocess mt-dataset; do
  [ -x "$bin/$t" ] || { echo "make_seeds.sh: error: $bin/$t is missing; build mt first (cmake -B build && ninja -C build)" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out"/data "$out"/corpus/{spec,plan,checkpoint,tracker,idx,bin,index_cache}
out=$(cd "$out" && pwd)
spec=$root/fuzz/seeds/micro.toml

"$bin/mtc" compile "$spec" -o "$out/plan.bin" > /dev/null
( cd "$out" && "$bin/mtrun" plan.bin --train-iters 1 --save ckpt > /dev/null )
cp "$out/plan.bin" "$out/corpus/plan/micro.plan"
variants=(
  "tp2 parallel.tensor_model_parallel_size=2"
  "pp2 parallel.pipeline_model_parallel_size=2 model.num_layers=2"
  "dp2 parallel.data_parallel_size=2 parallel.use_distributed_optimizer=true"
)
for v in "${variants[@]}"; do
  read -r name sets <<< "$v"
  args=()
  for s in $sets; do args+=(--set "$s"); done
  "$bin/mtc" compile "$spec" "${args[@]}" -o "$out/corpus/plan/micro-$name.plan" > /dev/null
done

cp "$out/ckpt/iter_0000001/mp_rank_00.mtckpt" "$out/corpus/checkpoint/"
cp "$out/ckpt/latest_checkpointed_iteration.txt" "$out/corpus/tracker/tracker.txt"

cp "$spec" "$root"/models/*.toml "$out/corpus/spec/"
for f in "$root"/test/mtrun/Inputs/*.toml; do cp "$f" "$out/corpus/spec/test-$(basename "$f")"; done

# 40 documents of 1 to 30 token ids below 127; NullTokenizer's end-of-document
# id is its vocabulary size (127), so the dataset's vocabulary is 128.
python3 - "$out/data/ids.jsonl" <<'PY'
import json, random, sys
r = random.Random(24)
with open(sys.argv[1], "w") as f:
    for _ in range(40):
        ids = [str(r.randrange(127)) for _ in range(r.randint(1, 30))]
        f.write(json.dumps({"text": " ".join(ids)}) + "\n")
PY
"$bin/mt-preprocess" --input "$out/data/ids.jsonl" --output-prefix "$out/data/micro" \
  --tokenizer-type NullTokenizer --vocab-size 127 --append-eod --quiet
prefix=$out/data/micro_text_document
cp "$prefix.idx" "$out/corpus/idx/"
python3 - "$prefix" "$out/corpus/bin/micro.joined" <<'PY'
import struct, sys
idx = open(sys.argv[1] + ".idx", "rb").read()
data = open(sys.argv[1] + ".bin", "rb").read()
open(sys.argv[2], "wb").write(struct.pack("<I", len(idx)) + idx + data)
PY
# The configuration of fuzz/dataset_common.h.
"$bin/mt-dataset" samples "$prefix" --seq-length 8 --num-samples 16 --vocab-size 128 \
  --cache-dir "$out/cache" > /dev/null 2>&1
cp "$out"/cache/*-GPTDataset-train.mtidx "$out/corpus/index_cache/"
echo "make_seeds.sh: seeds in $out/corpus ($(find "$out/corpus" -type f | wc -l) files)"
