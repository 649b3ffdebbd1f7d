#!/usr/bin/env bash
# Runs tools/device-kit.sh as on a GPU machine, for device-kit.test, with
# stand-ins: nvidia-smi, ldconfig and ncu (bin/) first on PATH, a kit
# (MT_KIT_UNPACKED) whose GoogleTest binaries are fake-gtest, whose
# mt-flash-bench and mt-moe-bench print fixed rows and whose lit is
# fake-lit.py, and a copy of the checkout's bench scripts whose two runners
# are bench-runner.py.
#   fake-gpu.sh SRC_ROOT WORK ARGS...    ARGS: the kit's, e.g. `run unit`
set -euo pipefail
src=$1 work=$2
shift 2
inputs=$(cd "$(dirname "$0")" && pwd)
root=$work/root kit=$work/kit
if [ ! -d "$root" ]; then
  mkdir -p "$root/tools" "$root/bench/results" "$kit/bin" "$kit/libexec" "$work/tmp"
  cp "$src/tools/device-kit.sh" "$src/tools/ncu_summary.py" "$root/tools/"
  cp "$src"/bench/*.py "$root/bench/"
  cp "$inputs/bench-runner.py" "$root/bench/gpu_train_speed.py"
  cp "$inputs/bench-runner.py" "$root/bench/pytorch_gpt_reference.py"
  printf '# Training speed and memory on one GPU\n\n## an earlier run\n\n' \
    > "$root/bench/results/gpu-train-speed.md"
  for b in mt-cuda-tests mt-gpu-executor-tests mt-flash-tests mt-opkernel-tests; do
    ln -s "$inputs/fake-gtest" "$kit/bin/$b"
  done
  for b in mtc mtrun; do
    printf '#!/bin/sh\n' > "$kit/libexec/$b"
    chmod +x "$kit/libexec/$b"
    ln -s "../libexec/$b" "$kit/bin/$b"
  done
  # mtrun's first lines of a run, commas and all (the profile step's CSV
  # must not take them for its header).
  cat >> "$kit/libexec/mtrun" << 'EOF2'
echo "mock data (end of document 50256): train documents [0, 33,333) of 100,000 (split '1,1,1')"
echo "training: 2 iterations, global batch 4 (1 micro-batch of 4), sequence 1024"
EOF2
  # mtc's verdict for gpu_compare.py's fill search: fits up to micro-batch 64.
  cat >> "$kit/libexec/mtc" << 'EOF'
for a; do case $a in training.micro_batch_size=*) mb=${a#*=} ;; esac; done
[ -n "${mb:-}" ] || exit 0
if [ "$mb" -le 64 ]; then echo "verdict: fits"; else echo "verdict: does NOT fit"; fi
EOF
  # mt-flash-bench: one configuration's JSON line per --seq value, with a
  # backward time for each variant of --backward (kv64 2.5 ms, kv128 2 ms;
  # none without the flag).
  cat > "$kit/bin/mt-flash-bench" << 'FLASH'
#!/bin/sh
seqs=1024 variants=
while [ $# -gt 0 ]; do case $1 in --seq) seqs=$2; shift ;; --backward) variants=$2; shift ;; esac; shift; done
for s in $(echo "$seqs" | tr ',' ' '); do
  fields= best=kv64 ms=2.5 tf=250.0
  for v in $(echo "$variants" | tr ',' ' '); do
    case $v in kv64) vms=2.5 vtf=250.0 ;; kv128) vms=2.0 vtf=312.5 best=kv128 ms=2.0 tf=312.5 ;; esac
    fields="$fields\"bwd_${v}_ms\": $vms, \"bwd_${v}_tflops\": $vtf, "
  done
  echo "{\"seq\": $s, \"head_dim\": 64, \"batch\": 16, \"heads\": 32, \"causal\": true, \"dropout\": 0, \"dtype\": \"bf16\", \"fwd_ms\": 1.0, \"bwd_ms\": $ms, \"fwd_tflops\": 300.0, \"bwd_tflops\": $tf, \"bwd_best\": \"$best\", $fields\"device\": \"gpu\"}"
done
FLASH
  chmod +x "$kit/bin/mt-flash-bench"
  # mt-moe-bench: one JSON line naming its arguments.
  cat > "$kit/bin/mt-moe-bench" << 'MOE'
#!/bin/sh
echo "{\"args\": \"$*\", \"moe_over_dense_time\": 1.25}"
MOE
  chmod +x "$kit/bin/mt-moe-bench"
  echo stand-in > "$kit/COMMIT"
  # lit, which passes every test it is given, and the GPU lit tests' names.
  mkdir -p "$kit/lit" "$root/test/mtrun"
  cp "$inputs/fake-lit.py" "$kit/lit/lit.py"
  touch "$root/test/mtrun/cuda.test" "$root/test/mtrun/cuda-gpt25m.test" \
        "$root/test/mtrun/cuda-train.test"
fi
export PATH="$inputs/bin:$PATH" MT_KIT_UNPACKED=$kit OUT=$work/logs TMPDIR=$work/tmp
# Not exec'd: bench-runner.py kills the kit as a time-out would, and this
# script then says so.
rc=0
bash "$root/tools/device-kit.sh" "$@" || rc=$?
[ $rc -lt 128 ] || echo "fake-gpu: the kit was killed (exit status $rc)"
exit $rc
