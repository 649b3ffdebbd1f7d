#!/usr/bin/env bash
# Carries mt to a GPU machine that has the NVIDIA driver, the CUDA libraries
# and Python with PyTorch, but neither the Debian packages mt builds with
# (LLVM/MLIR, abseil, TOML++, OpenBLAS, Gloo) nor a network to fetch them.
#
#   tools/device-kit.sh pack [DIR]      here, after ./setup.sh: builds mt and
#                                       writes DIR/kit.tar.xz (DIR: .devkit)
#   tools/device-kit.sh run STEP... [--kit DIR]
#                                       there, in a copy of this checkout with
#                                       DIR beside it: unpacks the kit and runs
#                                       the steps in order; each step's log goes
#                                       to $OUT (or DIR/out) as STEP.log
#
# .devkit is git-ignored, and the device tool copies only tracked files,
# untracked ones that are not ignored, and the ignored paths its `carry`
# argument names: run the kit there with carry: [".devkit"] (or DIR).
# Without the kit, `run` stops at once and says so. MT_KIT_UNPACKED=KITDIR
# runs the steps with a kit already unpacked there instead (the kit's own
# test, test/devkit, points it at stand-ins).
#
# Steps (docs/building.md, "On a GPU machine without the build packages").
# The device tool stops a command after 10 minutes; each step ends well
# inside that, but give each bench step a command of its own:
#   probe       the GPU, the driver, and where the CUDA libraries mt opens are
#   unit        the GoogleTest suites that run on a real GPU (mt-cuda-tests,
#               and every *OnGpu* test: kernels and whole training steps
#               against the CPU); a skip fails it, but for NoGpu* tests
#   lit         the lit tests that need a GPU (test/mtrun/cuda*.test), but
#               for cuda-gpt25m.test; on 2+ GPUs these include NCCL between
#               ranks (cuda-parallel.test) and a hung rank named by the
#               survivor's watchdog over its GPU collectives
#               (cuda-hung-rank.test: rank 1 stops itself before its first
#               GPU collective; rank 0 names it within 3 s and exits 1)
#   lit-gpt25m  test/mtrun/cuda-gpt25m.test alone: gpt-25m in bf16 on the
#               GPU against its fp32 CPU run of 60 iterations, most of the
#               step (about 600 CPU-seconds: a minute or two on 16 cores)
#   bench-125m  bench/gpu_compare.py --record --only gpt-125m (mt against
#               PyTorch) in at most 7.5 minutes; the rows go to the logs'
#               gpu-train-speed.md after each run, so a time-out keeps them
#   bench-125m-fill
#               the same for gpt-125m at the micro-batch that fills the GPU
#   bench-1.3b  the same for gpt-1.3b
#   bench       bench-125m bench-125m-fill bench-1.3b
#   bench-flash bench/flash_compare.py --record: mt's flash attention
#               (mt-flash-bench) against PyTorch's FlashAttention-2, forward
#               and backward, head dim 64 and 128, seq 1024 to 8192, causal,
#               with and without dropout, both backward variants (kv64, the
#               default, and kv128) timed side by side (about 4 minutes);
#               its rows go to the logs' gpu-flash-attention.md as each
#               finishes, with the line saying which backward was faster
#   bench-moe   mt-moe-bench: a Mixtral-sized MoE layer's generated kernels
#               (router, permute, grouped GEMMs, unpermute; forward and
#               backward) against a dense SwiGLU MLP of equal active FLOPs,
#               without and with a capacity factor of 1 (a minute or two);
#               its JSON rows go to the log
#   profile     Nsight Compute over two steps of gpt-125m: ncu's CSV (its
#               --log-file, apart from mtrun's output) and the kernels by
#               total time (tools/ncu_summary.py)
#   all         probe unit lit lit-gpt25m bench-125m bench-125m-fill bench-1.3b
#               bench-flash bench-moe profile
#
# The kit holds mtc, mtrun, the GPU test binaries, lit with FileCheck, not
# and count, and every shared library they need other than glibc's, each
# program started through a wrapper in bin/ that puts the kit's lib/ first. The CUDA libraries are not
# carried: the machine's own are found (the system's, /usr/local/cuda, or
# the pip packages beside PyTorch) and named by `probe`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

die() { echo "device-kit: error: $*" >&2; exit 1; }

BINARIES=(build/bin/mtc build/bin/mtrun
          build/test/unit/mt-cuda-tests build/test/unit/mt-gpu-executor-tests
          build/test/unit/mt-flash-tests build/test/unit/mt-opkernel-tests
          build/bin/mt-flash-bench build/bin/mt-moe-bench)
LLVM_TOOLS=(FileCheck not count)
LLVM_BIN=/usr/lib/llvm-19/bin
LIT_DIR=/usr/lib/llvm-19/build/utils/lit
# The kit and the checkout travel together under the device tool's 64 MiB.
MAX_KIT_BYTES=$((52 * 1024 * 1024))
# glibc's own libraries: the machine's (as new or newer: the kit is built on
# Debian 12), never carried.
GLIBC='/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux-x86-64)\.so'

# --- pack ------------------------------------------------------------------
STAGE=""
pack() {
  local dir=${1:-.devkit}
  [ -d build ] || die "no build/ here; run ./setup.sh first"
  export CCACHE_BASEDIR="$ROOT"
  cmake -S . -B build -DMT_STATIC_LLVM=ON > /dev/null
  ninja -C build mtc mtrun mt-cuda-tests mt-gpu-executor-tests mt-flash-tests mt-opkernel-tests \
    mt-flash-bench mt-moe-bench
  for b in "${BINARIES[@]}"; do [ -x "$b" ] || die "$b was not built"; done

  STAGE=$(mktemp -d)
  trap 'rm -rf "$STAGE"' EXIT
  local stage=$STAGE
  mkdir -p "$stage/bin" "$stage/libexec" "$stage/lib"
  cp "${BINARIES[@]}" "$stage/libexec/"
  for t in "${LLVM_TOOLS[@]}"; do cp "$LLVM_BIN/$t" "$stage/libexec/"; done
  cp -r "$LIT_DIR" "$stage/lit"
  find "$stage/lit" -name __pycache__ -prune -exec rm -rf {} +

  # Every library the binaries load, transitively, except glibc's own.
  local deps missing
  deps=$(for f in "$stage"/libexec/*; do ldd "$f"; done)
  missing=$(grep 'not found' <<< "$deps" | sort -u | head -1 || true)
  [ -z "$missing" ] || die "a library of the kit's binaries is missing here: $missing"
  for l in $(awk '/=>/ && $3 ~ /^\// {print $3}' <<< "$deps" | grep -v -E "$GLIBC" | sort -u); do
    cp -L "$l" "$stage/lib/"
  done
  strip --strip-unneeded "$stage"/libexec/* "$stage"/lib/* 2> /dev/null || true
  # bin/ holds a wrapper per program that puts lib/ first in its library
  # path, so the kit's libraries win over the machine's only in its own
  # processes (and their children: mtrun's ranks).
  for f in "$stage"/libexec/*; do
    local name
    name=$(basename "$f")
    cat > "$stage/bin/$name" << EOF
#!/bin/sh
kit=\$(dirname "\$(dirname "\$(readlink -f "\$0")")")
LD_LIBRARY_PATH="\$kit/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$kit/libexec/$name" "\$@"
EOF
    chmod +x "$stage/bin/$name"
  done
  # The kit must not resolve anything outside itself but glibc.
  local leak
  leak=$(for f in "$stage"/libexec/* "$stage"/lib/*; do LD_LIBRARY_PATH="$stage/lib" ldd "$f" 2> /dev/null; done |
         awk '/=>/ {print $3}' | grep -v "^$stage/lib/" | grep -v -E "$GLIBC" | sort -u || true)
  [ -z "$leak" ] || die "the kit would load these from outside itself: $leak"

  { git rev-parse HEAD 2> /dev/null || echo unknown; } > "$stage/COMMIT"
  mkdir -p "$dir"
  local tmp="$dir/kit.tar.xz.tmp"
  tar -C "$stage" -cf - . | xz -T2 -6 > "$tmp"
  local bytes
  bytes=$(stat -c %s "$tmp")
  if [ "$bytes" -gt "$MAX_KIT_BYTES" ]; then
    rm -f "$tmp"
    die "the kit is $((bytes / 1048576)) MiB; with the checkout it must stay under the device tool's 64 MiB"
  fi
  mv "$tmp" "$dir/kit.tar.xz"
  echo "device-kit: $dir/kit.tar.xz ($((bytes / 1048576)) MiB, commit $(cat "$stage/COMMIT" | cut -c1-12)):" \
       "$(ls "$stage/bin" | wc -l) programs, $(ls "$stage/lib" | wc -l) libraries"
}

# --- run (on the GPU machine) ------------------------------------------------
STEPS=(probe unit lit lit-gpt25m bench-125m bench-125m-fill bench-1.3b bench-flash bench-moe profile)
KIT=""
LOGS=""

# The kit is git-ignored: it reaches the GPU machine only when carried.
need_kit() {
  local dir=$1
  [ -f "$dir/kit.tar.xz" ] ||
    die "$dir/kit.tar.xz is missing: $dir is git-ignored, so the device tool copies it only when its carry names it; run with carry: [\"$dir\"] (after 'tools/device-kit.sh pack' on the machine with the build packages)"
}

unpack() {
  local dir=$1
  if [ -n "${MT_KIT_UNPACKED:-}" ]; then
    # The kit's own test (test/devkit) runs the steps against stand-ins.
    KIT=$MT_KIT_UNPACKED
  else
    KIT=/tmp/mt-kit
    # Python's tarfile rather than tar + xz: the machine is only sure to have Python.
    rm -rf "$KIT" && mkdir -p "$KIT"
    python3 - "$dir/kit.tar.xz" "$KIT" << 'EOF'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2])
EOF
  fi
  export PATH="$KIT/bin:$PATH"
  local head
  head=$(git -C "$ROOT" rev-parse HEAD 2> /dev/null || echo unknown)
  [ "$(cat "$KIT/COMMIT")" = "$head" ] ||
    echo "device-kit: warning: the kit was built at $(cut -c1-12 "$KIT/COMMIT"), this checkout is at ${head:0:12}; pack again if the sources changed"
}

# Where the loader's cache has a library, from `ldconfig -p`, whose lines
# are tab-indented: "\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1".
# Only x86-64 entries: the kit's programs could not load a 32-bit one.
system_library() {
  { ldconfig -p 2> /dev/null || /sbin/ldconfig -p 2> /dev/null || true; } |
    awk -v l="$1" '$1 == l && /x86-64/ {print $NF; exit}'
}

# The CUDA libraries mtrun opens (runtime/exec/cuda/cuda_api.cpp): the system's first,
# then /usr/local/cuda/lib64; where neither has one, the pip packages beside
# PyTorch (nvidia/*/lib) are added to LD_LIBRARY_PATH.
CUDA_LIBRARIES=""
find_cuda_libraries() {
  local sites
  sites=$(python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2> /dev/null || true)
  for lib in libcuda.so.1 libnvrtc.so.13 libcublasLt.so.13 libnccl.so.2; do
    local where="" system
    system=$(system_library "$lib")
    if [ -n "$system" ]; then
      where="system: $system"
    elif [ -e "/usr/local/cuda/lib64/$lib" ]; then
      where="/usr/local/cuda/lib64/$lib"
    else
      local found=""
      for s in $sites; do
        [ -d "$s/nvidia" ] || continue
        found=$(find "$s/nvidia" -name "$lib" 2> /dev/null | head -1)
        [ -n "$found" ] && break
      done
      if [ -n "$found" ]; then
        export LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        where="$found (added to LD_LIBRARY_PATH)"
      fi
    fi
    CUDA_LIBRARIES+=$(printf '  %-20s %s' "$lib" "${where:-NOT FOUND}")$'\n'
  done
}

# lit's site configuration for this checkout and the kit's tools.
lit_site() {
  local obj=${TMPDIR:-/tmp}/mt-obj
  rm -rf "$obj" && mkdir -p "$obj/test"
  # %mt_obj_root/bin: the programs themselves (cuda.test runs ldd on mtrun).
  ln -s "$KIT/libexec" "$obj/bin"
  cat > "$obj/test/lit.site.cfg.py" << EOF
config.mt_src_root = r"$ROOT"
config.mt_obj_root = r"$obj"
config.mt_tools_dir = r"$KIT/bin"
config.llvm_tools_dir = r"$KIT/bin"
lit_config.load_config(config, r"$ROOT/test/lit.cfg.py")
EOF
  echo "$obj"
}

step_probe() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  nvcc --version 2> /dev/null | tail -1 || true
  python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda)' 2> /dev/null || true
  command -v ncu > /dev/null && ncu --version | tail -1
  echo "CUDA libraries:"
  printf '%s' "$CUDA_LIBRARIES"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  echo "kit: $(cut -c1-12 "$KIT/COMMIT"), $(ls "$KIT/bin" | tr '\n' ' ')"
  LD_LIBRARY_PATH="$KIT/lib" ldd "$KIT/libexec/mtrun" | grep -E 'not found' && return 1
  mtrun --help > /dev/null
}

# Tests of what mt does without a usable GPU are named NoGpu* (e.g.
# CudaDevice.NoGpuIsOneLine) and skip where there is one: on this machine
# that is what they should do.
NO_GPU_TESTS='\.NoGpu'

# A suite's tests on this GPU machine. A filter that matched none would
# pass, and any other skip here means the GPU, the driver or NVRTC was not
# usable: both fail the step.
gpu_suite() {
  local bin=$1 filter=$2 log list
  # Listed whole first: `grep -q` on a pipe may end it before the list is
  # written, and pipefail would take the broken pipe for a failure.
  list=$("$bin" --gtest_list_tests --gtest_filter="$filter") ||
    { echo "$bin --gtest_list_tests failed"; return 1; }
  if ! grep -q '^  ' <<< "$list"; then
    echo "$bin has no tests matching $filter"
    return 1
  fi
  log=$(mktemp)
  local rc=0
  "$bin" --gtest_filter="$filter" 2>&1 | tee "$log" || rc=1
  local skipped
  skipped=$(sed -n 's/^\[  SKIPPED \] \([A-Za-z_][^ ]*\).*/\1/p' "$log" | sort -u |
            grep -v -E "$NO_GPU_TESTS" || true)
  if [ -n "$skipped" ]; then
    echo "$bin skipped tests on a GPU machine (the reasons are above): $(paste -sd ' ' <<< "$skipped")"
    rc=1
  fi
  rm -f "$log"
  return $rc
}

step_unit() {
  local rc=0
  gpu_suite mt-cuda-tests '*' || rc=1
  gpu_suite mt-gpu-executor-tests '*OnGpu*' || rc=1
  gpu_suite mt-flash-tests '*OnGpu*' || rc=1
  gpu_suite mt-opkernel-tests '*OnGpu*' || rc=1
  return $rc
}

# The GPU lit tests whose CPU reference trains for a minute or more on the
# GPU machine's cores: each runs in a step of its own (lit-gpt25m), so that
# `lit` stays short and each has the device tool's 10 minutes to itself
# (and lit's other workers do not share the cores with its CPU run).
LONG_LIT_TESTS=(test/mtrun/cuda-gpt25m.test)

# lit over the given tests. On a GPU machine only the no-driver test, and
# the two-GPU tests where there is one GPU, may be unsupported.
run_lit() {
  local obj
  obj=$(lit_site)
  local tests=()
  for t in "$@"; do tests+=("$obj/$t"); done
  local log rc=0
  log=$(mktemp)
  python3 "$KIT/lit/lit.py" -v "${tests[@]}" 2>&1 | tee "$log" || rc=1
  if grep '^UNSUPPORTED:' "$log" | grep -v -E 'cuda-no-driver|cuda-parallel|cuda-hung-rank'; then
    echo "these need a GPU and were unsupported here: lit found no usable libcuda.so.1"
    rc=1
  fi
  rm -f "$log"
  return $rc
}

step_lit() {
  local tests=()
  for t in test/mtrun/cuda*.test; do
    [[ " ${LONG_LIT_TESTS[*]} " == *" $t "* ]] || tests+=("$t")
  done
  run_lit "${tests[@]}"
}

step_lit-gpt25m() {
  run_lit test/mtrun/cuda-gpt25m.test
}

# Both cases of bench/gpu_compare.py in one step came close to the device
# tool's 10 minutes: a step runs one case, and gives up on its runs after
# this many seconds in all (recording a run that did not fit as such).
# MT_BENCH_BUDGET_S sets another (a session with less device time left).
BENCH_BUDGET_S=${MT_BENCH_BUDGET_S:-450}

# One case of bench/gpu_compare.py (gpt-125m, gpt-125m-fill or gpt-1.3b). It records into
# the logs' copy of the results file (the checkout's, plus a section per
# case), rewritten whole after each run, so the rows of the runs that
# finished come back even from a step cut off by a time-out; copy it to
# bench/results/ from there.
step_bench() {
  local results=$LOGS/gpu-train-speed.md
  if [ ! -f "$results" ] && [ -f bench/results/gpu-train-speed.md ]; then
    cp bench/results/gpu-train-speed.md "$results"
  fi
  PYTHONUNBUFFERED=1 python3 bench/gpu_compare.py --only "$1" --record --results "$results" \
      --budget "$BENCH_BUDGET_S" --mtc "$KIT/bin/mtc" --mtrun "$KIT/bin/mtrun"
}

# mt's flash attention against PyTorch's, recorded like step_bench's rows;
# both backward variants in the same run, so one call decides the default.
step_bench_flash() {
  local results=$LOGS/gpu-flash-attention.md
  if [ ! -f "$results" ] && [ -f bench/results/gpu-flash-attention.md ]; then
    cp bench/results/gpu-flash-attention.md "$results"
  fi
  PYTHONUNBUFFERED=1 python3 bench/flash_compare.py --mt-bench "$KIT/bin/mt-flash-bench" --record \
      --backward kv64,kv128 --results "$results"
}

# The MoE layer against a dense MLP of equal active FLOPs (bench/moe_speed.cpp),
# Mixtral 8x7B's layer at 8192 tokens: every token kept, then a capacity
# factor of 1 (tokens dropped, no expert over its capacity).
step_bench_moe() {
  "$KIT/bin/mt-moe-bench" && "$KIT/bin/mt-moe-bench" --capacity-factor 1
}

# Nsight Compute's per-kernel summary of two eager steps of gpt-125m.
# --log-file keeps ncu's CSV apart from mtrun's own output (which has
# commas of its own: "[0, 33,333)"), which goes to this step's log; the
# header is the row with a "Kernel Name" column, whatever ncu writes before
# it. The summary: each kernel's (name, block and grid) total time, mean x
# invocations, largest first, with its share of all kernel time.
step_profile() {
  command -v ncu > /dev/null || { echo "ncu is not on PATH"; return 1; }
  local d csv=$LOGS/ncu-gpt-125m.csv
  d=$(mktemp -d)
  mtc compile models/gpt-125m.toml --set training.train_iters=2 --set training.eval_iters=0 \
      --set training.global_batch_size=4 --set training.lr_warmup_iters=0 -o "$d/p.plan" > /dev/null
  # Eager steps: each kernel is its own launch for ncu.
  rm -f "$csv"
  ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv --log-file "$csv" \
      mtrun "$d/p.plan" --device cuda --no-cuda-graph
  python3 "$ROOT/tools/ncu_summary.py" "$csv"
}

run_step() {
  case $1 in
    bench-flash) step_bench_flash ;;
    bench-moe) step_bench_moe ;;
    bench-*) step_bench "gpt-${1#bench-}" ;;
    *) "step_$1" ;;
  esac
}

run_steps() {
  local dir=.devkit steps=()
  local names="${STEPS[*]}, bench (every bench step) or all"
  while [ $# -gt 0 ]; do
    case "$1" in
      --kit) dir=$2; shift 2 ;;
      all) steps+=("${STEPS[@]}"); shift ;;
      bench) steps+=(bench-125m bench-125m-fill bench-1.3b); shift ;;
      *)
        [[ " ${STEPS[*]} " == *" $1 "* ]] || die "unknown step '$1'; use $names"
        steps+=("$1"); shift ;;
    esac
  done
  [ ${#steps[@]} -gt 0 ] || die "name the steps to run: $names"
  [ -n "${MT_KIT_UNPACKED:-}" ] || need_kit "$dir"
  LOGS=${OUT:-$dir/out}
  mkdir -p "$LOGS"
  unpack "$dir"
  find_cuda_libraries
  local failed=()
  for s in "${steps[@]}"; do
    echo "=== device-kit: $s"
    local start=$SECONDS
    if ! (set -o pipefail; run_step "$s" 2>&1 | tee "$LOGS/$s.log"); then
      failed+=("$s")
    fi
    echo "=== device-kit: $s took $((SECONDS - start)) s"
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "device-kit: failed: ${failed[*]} (logs in $LOGS)"
    return 1
  fi
  echo "device-kit: every step passed (logs in $LOGS)"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run_steps "$@" ;;
  *) echo "usage: tools/device-kit.sh pack [DIR] | run STEP... [--kit DIR]" >&2; exit 2 ;;
esac
