#!/usr/bin/env bash
# Builds mt's libFuzzer targets (fuzz/, docs/fuzzing.md) with clang, ASan
# and UBSan in build-fuzz/, makes their seed corpora from the normal
# build's tools (fuzz/make_seeds.sh), and runs them:
#   tools/fuzz.sh [--time SECONDS | --runs N] [--timeout SECONDS] [TARGET...]
# TARGET is spec, plan, checkpoint, tracker, idx, bin or index_cache (all
# when none is given). --time bounds each target's run (default 30 s),
# --runs its number of cases instead; --timeout is how long one case may
# take before it counts as a hang (default 10 s). Each target runs once,
# on one core; what it learns is kept in build-fuzz/corpus/TARGET for the
# next run. A crash, hang, out-of-memory or leak stops that target, and the
# input that caused it is written to build-fuzz/findings/TARGET/; replay it
# with build-fuzz/bin/fuzz_TARGET FILE (the run prints the command). Exits
# non-zero when any target found something.
# Needs the normal build in build/ (for the seeds) and clang-19 with
# libclang-rt-19-dev (setup.sh installs them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
all=(spec plan checkpoint tracker idx bin index_cache)
limit=(-max_total_time=30)
timeout=10
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) limit=(-max_total_time="${2:?--time needs seconds}"); shift 2 ;;
    --runs) limit=(-runs="${2:?--runs needs a number}"); shift 2 ;;
    --timeout) timeout=${2:?--timeout needs seconds}; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: error: unknown option '$1'; see tools/fuzz.sh --help" >&2; exit 2 ;;
    *) case " ${all[*]} " in
         *" $1 "*) targets+=("$1") ;;
         *) echo "fuzz.sh: error: no target '$1'; the targets are: ${all[*]}" >&2; exit 2 ;;
       esac
       shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

for tool in clang-19 clang++-19; do
  command -v $tool > /dev/null || { echo "fuzz.sh: error: $tool is missing; install clang-19 and libclang-rt-19-dev (setup.sh does)" >&2; exit 1; }
done
out=$root/build-fuzz
export CCACHE_BASEDIR=$root
# The fuzz build has debug info (-g), for which ccache also hashes the build
# folder's path unless told not to; without it a clean clone elsewhere (CI's)
# would recompile everything.
export CCACHE_NOHASHDIR=true
start=$(date +%s)
if [ ! -f "$out/build.ninja" ]; then
  cmake -G Ninja -S . -B "$out" -DMT_FUZZ=ON -DCMAKE_C_COMPILER=clang-19 \
    -DCMAKE_CXX_COMPILER=clang++-19 > /dev/null
fi
mkdir -p "$out/logs"
if ! ninja -C "$out" mt-fuzz-targets > "$out/logs/build.log" 2>&1; then
  tail -30 "$out/logs/build.log" >&2
  echo "fuzz.sh: error: the fuzz build failed; its log is $out/logs/build.log" >&2
  exit 1
fi
built=$(date +%s)
echo "fuzz.sh: fuzz targets built in $((built - start)) s"
fuzz/make_seeds.sh "$out/seeds" "$root/build"

export MT_FUZZ_SEEDS=$out/seeds
# UBSan's reports stop the run (the build also says so), with a stack.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
failed=0
summary=()
for t in "${targets[@]}"; do
  corpus=$out/corpus/$t findings=$out/findings/$t tmp=$out/tmp/$t
  mkdir -p "$corpus" "$findings" "$tmp"
  rm -rf "${tmp:?}"/*
  log=$out/logs/$t.log
  set +e
  TMPDIR=$tmp "$out/bin/fuzz_$t" "$corpus" "$MT_FUZZ_SEEDS/corpus/$t" "${limit[@]}" \
    -timeout="$timeout" -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$findings/" > "$log" 2>&1
  rc=$?
  set -e
  cases=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cases=${cases:-?}
  found=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    result="ok"
  else
    failed=1
    kind=crash
    grep -q 'ERROR: libFuzzer: timeout' "$log" && kind=hang
    grep -q 'ERROR: libFuzzer: out-of-memory' "$log" && kind=out-of-memory
    grep -q 'ERROR: LeakSanitizer' "$log" && kind=leak
    result="$kind: ${found:-no reproducer written, see $log}"
    echo "fuzz.sh: $t: $kind; the log's report:" >&2
    grep -m1 -A12 -E '^==[0-9]+==ERROR|runtime error:|ERROR: libFuzzer|fuzz_[a-z_]+: |fuzz harness: ' "$log" >&2 || tail -20 "$log" >&2
    [ -n "$found" ] && echo "fuzz.sh: replay it: MT_FUZZ_SEEDS=$MT_FUZZ_SEEDS $out/bin/fuzz_$t $found" >&2
  fi
  summary+=("$(printf '%-12s %10s cases  %s' "$t" "$cases" "$result")")
done
echo "fuzz.sh: $(date -u +%F) $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(( $(date +%s) - built )) s of fuzzing:"
printf '  %s\n' "${summary[@]}"
exit $failed
