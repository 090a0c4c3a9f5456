#!/usr/bin/env bash
# Builds the s3s-fs server that `benches/run.py --server s3s-fs` runs, into .bench-work/s3s-fs/bin.
#
# s3s-fs (crates.io) sends a GET body by reading its file through
# `ReaderStream::with_capacity(file, 4096)`: 4 KiB per chunk, a read() and a body frame per 4 KiB,
# which caps it well below what the disk and the clients can do and would make every client look
# the same. The benchmark build changes that one number to 1 MiB (GetObject and CopyObject's
# source read) and nothing else; the conformance tests run the stock build (scripts/setup-servers.sh),
# as its behaviour, not its speed, is what they test. The stock and the 1 MiB build's raw parallel
# GET are both in the closing note of issue 41 (benches/README.md says where to find it).
#
#   bash benches/setup_s3s_fs.sh            # then: export SHARDSTREAM_S3S_FS=$PWD/.bench-work/s3s-fs/bin/s3s-fs
#   S3S_FS_CHUNK=4096 bash benches/setup_s3s_fs.sh   # the stock chunk, for an A/B
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${S3S_FS_VERSION:-0.14.1}
chunk=${S3S_FS_CHUNK:-1048576}
out=${S3S_FS_ROOT:-.bench-work/s3s-fs}
mkdir -p "$out"
out=$(cd "$out" && pwd)

src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/s3s-fs-"$ver" 2>/dev/null | head -n 1 || true)
if [ -z "$src" ]; then
  # Let cargo download the published source: a throwaway package that depends on it.
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src"
  printf '[package]\nname = "fetch-s3s-fs"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\ns3s-fs = "=%s"\n' "$ver" > "$tmp/Cargo.toml"
  echo 'fn main() {}' > "$tmp/src/main.rs"
  cargo fetch --manifest-path "$tmp/Cargo.toml" -q
  src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/s3s-fs-"$ver" | head -n 1)
fi

build="$out/src-$ver-$chunk"
rm -rf "$build"
cp -r "$src" "$build"
chmod -R u+w "$build"
# A package of its own, not a member of this repository's workspace.
printf '\n[workspace]\n' >> "$build/Cargo.toml"
sed -i "s/ReaderStream::with_capacity(\([a-z_]*\), 4096)/ReaderStream::with_capacity(\1, $chunk)/g" "$build/src/s3.rs"
n=$(grep -c "ReaderStream::with_capacity([a-z_]*, $chunk)" "$build/src/s3.rs" || true)
if [ "$n" -lt 1 ]; then
  echo "setup_s3s_fs.sh: s3s-fs $ver no longer reads GET bodies with ReaderStream::with_capacity(_, 4096); look at $build/src/s3.rs" >&2
  exit 1
fi
cargo install --quiet --locked --features binary --path "$build" --root "$out" --force
rm -rf "$build"
echo "built $out/bin/s3s-fs (s3s-fs $ver, GET body chunk $chunk bytes)"
echo "export SHARDSTREAM_S3S_FS=$out/bin/s3s-fs"
