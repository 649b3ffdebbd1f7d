#!/usr/bin/env bash
# Sets mt up on a fresh Debian 12 machine, then runs the demo or every test:
#   ./setup.sh          install what is missing, build, compile a preset and show its
#                       plan, then train the tiny preset on the CPU
#   ./setup.sh test     install what is missing, build, run every test
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-demo}
case "$mode" in
  demo|test) ;;
  *) echo "setup.sh: error: unknown mode '$mode'; use './setup.sh' or './setup.sh test'" >&2; exit 2 ;;
esac

# Debian packages only (docs/building.md says why each is needed).
packages=(cmake ninja-build g++ ccache python3
          llvm-19-dev llvm-19-tools libmlir-19-dev mlir-19-tools
          libtomlplusplus-dev libabsl-dev libflatbuffers-dev flatbuffers-compiler
          libgtest-dev libpcre2-dev libsimdjson-dev libopenblas-dev python3-numpy
          libgloo-dev slurmd slurmctld slurm-client munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup.sh: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ccache keys on paths relative to the checkout, so clean clones reuse it.
export CCACHE_BASEDIR="$PWD"
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build

if [ "$mode" = demo ]; then
  build/bin/mtc compile models/gpt-125m.toml
  echo
  build/bin/mtc compile models/tiny.toml -o build/tiny.plan > /dev/null
  build/bin/mtrun build/tiny.plan --device cpu
else
  ninja -C build check-mt
fi
