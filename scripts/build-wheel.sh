#!/usr/bin/env bash
# Builds the release wheel of the `shardstream` Python package: one abi3 wheel for CPython 3.11
# and later, manylinux_2_28 x86_64, linked by zig (no build container), that also installs the
# `shardstream` command.
#
#   bash scripts/build-wheel.sh [OUT_DIR]        (default: target/wheels; prints the wheel's path)
#
# Needs the test venv (.venv, or SHARDSTREAM_PYTHON) with maturin and ziglang
# (tests/requirements.txt). Two release builds (`dist` profile): 29 minutes cold on the shared
# 2-core development VM (the CLI 17, the package 11). A wheel already built from the same sources
# (commit and uncommitted changes) is reused, so a second call costs a few seconds; after a
# change, cargo rebuilds only what changed.
#
# Why these choices:
# - abi3 from 3.11 (pyo3-bindings/Cargo.toml, feature `abi3`): the buffer protocol the package
#   lends bytes through (`shardstream.Buffer`) entered the stable ABI in 3.11.
# - abi3 is switched on here (`--features ...,abi3`), not in pyproject.toml: `maturin develop`
#   and `pip install ./pyo3-bindings` keep building for the interpreter at hand, so a checkout's
#   older `_native.cpython-3XX-*.so` (which Python prefers over `.abi3.so`) never shadows a
#   fresh build.
# - manylinux_2_28 (glibc 2.28, 2018: RHEL 8, Debian 10, Ubuntu 18.10 and later), not 2014: the
#   engine calls `memfd_create` (glibc 2.27) and `getrandom` (2.25); torch's own wheels need
#   glibc 2.28 too.
# - The command is the Rust CLI binary itself, not a Python wrapper: a console script would
#   import the package (numpy, torch) before every command. maturin builds it as a bin wheel
#   (which checks its glibc symbols against manylinux_2_28); the binary is then added to the
#   package's wheel as `<name>.data/scripts/shardstream` (with its RECORD line), which pip
#   installs into the environment's `bin/` as it does any wheel's scripts.
#
# SHARDSTREAM_WHEEL_QUICK=1 builds the same wheel layout from the dev profile, without zig and
# tagged plain `linux_x86_64` (no manylinux symbol check): what CI's wheel test installs, since
# it reuses the debug build the tests already made (a minute, not two release builds).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${1:-$root/target/wheels}
py=${SHARDSTREAM_PYTHON:-$root/.venv/bin/python}
if [ "${SHARDSTREAM_WHEEL_QUICK:-}" = 1 ]; then
  compat=linux
  build_flags=(--profile dev)
else
  compat=manylinux_2_28
  build_flags=(--zig --profile dist)
fi
mkdir -p "$out"
# maturin next to the interpreter (the test venv's), else the one on PATH.
if [ -x "$(dirname "$py")/maturin" ]; then maturin="$(dirname "$py")/maturin"; else maturin=$(command -v maturin); fi

if [ "$compat" != linux ] && ! "$py" -m ziglang version >/dev/null 2>&1; then
  echo "build-wheel.sh: needs ziglang in $py's environment (pip install -r tests/requirements.txt)" >&2
  exit 1
fi

# The cache key: the commit and the uncommitted changes of everything that goes into the wheel.
sources=(Cargo.toml Cargo.lock identity storage sharding streamer checkpoint fuse launcher cli
  pyo3-bindings scripts/build-wheel.sh)
key=$( { echo "$compat"; git rev-parse HEAD; git status --porcelain --untracked-files=all -- "${sources[@]}";
  git diff HEAD -- "${sources[@]}"; } | sha256sum | cut -c1-16)
stamp="$out/.shardstream-wheel-$key"
if [ -f "$stamp" ] && [ -f "$(cat "$stamp")" ]; then
  echo "build-wheel.sh: reusing $(cat "$stamp") (same sources)" >&2
  cat "$stamp"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)

# 1. The CLI, as maturin's bin wheel for manylinux_2_28.
"$maturin" build -b bin -m cli/Cargo.toml --compatibility "$compat" "${build_flags[@]}" \
  -o "$tmp/cli" >&2

# 2. The package: the native module (abi3) and the Python layer.
rm -f "$out"/shardstream-*.whl
"$maturin" build -m pyo3-bindings/Cargo.toml --compatibility "$compat" "${build_flags[@]}" \
  --features pyo3/extension-module,abi3 -o "$out" >&2
wheel=$(ls "$out"/shardstream-*.whl)

# 3. The CLI binary into the package's wheel data, where pip installs it as `shardstream`.
"$py" "$root/scripts/wheel_add_script.py" "$tmp/cli" "$wheel"

rm -f "$out"/.shardstream-wheel-*
echo "$wheel" > "$stamp"
echo "build-wheel.sh: $wheel ($(du -h "$wheel" | cut -f1)) in $(( $(date +%s) - start )) s" >&2
echo "$wheel"
