#!/usr/bin/env bash
# Sets mt up on a fresh Debian 12 machine, then runs the demo or every test:
#   ./setup.sh              install what is missing, build, compile a preset and show its
#                           plan, then train the tiny preset on the CPU
#   ./setup.sh test         install what is missing, build, run every test
#   ./setup.sh test --full  the same, and first install the reference packages the
#                           compatibility tests compare mt with (PyTorch, megatron-core, ...;
#                           test/reference-packages.txt) from PyPI into build/reference-venv;
#                           a test that then does not run for a missing package fails
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-demo}
full=0
case "$*" in
  ""|demo|test) ;;
  "test --full") full=1 ;;
  *) echo "setup.sh: error: unknown arguments '$*'; use './setup.sh', './setup.sh test' or './setup.sh test --full'" >&2
     exit 2 ;;
esac

# Debian packages only (docs/building.md says why each is needed).
packages=(cmake ninja-build g++ ccache python3
          llvm-19-dev llvm-19-tools libmlir-19-dev mlir-19-tools
          libtomlplusplus-dev libabsl-dev libflatbuffers-dev flatbuffers-compiler
          libgtest-dev libpcre2-dev libsentencepiece-dev libsimdjson-dev libicu-dev libopenblas-dev python3-numpy python3-venv
          libgloo-dev slurmd slurmctld slurm-client munge
          clang-19 libclang-rt-19-dev)
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
  if [ "$full" = 1 ]; then
    # The pinned reference packages, in a virtual environment of Debian's
    # python3 under build/, reinstalled only when the pins change. lit's
    # %python is then its python.
    venv=build/reference-venv
    pins=$(sha256sum test/reference-packages.txt | cut -d' ' -f1)
    if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$pins" ]; then
      start=$(date +%s)
      rm -rf "$venv"
      /usr/bin/python3 -m venv "$venv"
      "$venv/bin/pip" install -q --disable-pip-version-check -r test/reference-packages.txt
      echo "$pins" > "$venv/.pins"
      echo "setup.sh: reference packages installed in $venv in $(( $(date +%s) - start )) s"
    fi
    /usr/bin/python3 test/reference_packages.py check "$venv/bin/python"
    export MT_REQUIRE_REFERENCE=1
  fi
  ninja -C build check-mt
fi
