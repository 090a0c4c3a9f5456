#!/usr/bin/env bash
# Builds every cargo-fuzz target and runs each for a short while (FUZZ_SECONDS, default 20),
# starting from the seed corpus in fuzz/seeds/<target>/ (tiny files written by the real peers:
# Mosaic's MDSWriter, webdataset's TarWriter, litdata's BinaryWriter, and shardstream's own DCP
# writer), with fuzz/json.dict for the JSON parsers, so that structured inputs (indexes,
# manifests) are reached in seconds instead of never. Longer runs: FUZZ_SECONDS=600 bash
# scripts/fuzz-smoke.sh (docs/security.md). A crash stops the script with its input saved under
# fuzz/artifacts/<target>/: make it a regression test.
# The machine has only the stable toolchain: RUSTC_BOOTSTRAP lets cargo-fuzz pass its -Z flags,
# and no sanitizer is used (`-s none`), so coverage-guided fuzzing works without nightly.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-20}
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
cargo fuzz build -s none --release
for target in $(cargo fuzz list); do
  # The working corpus (ignored by git) starts from the committed seeds.
  mkdir -p "corpus/$target"
  if [ -d "seeds/$target" ]; then
    cp -n seeds/"$target"/* "corpus/$target/" 2>/dev/null || true
  fi
  dict=()
  case "$target" in
    *_index|*_manifest) dict=(-dict=json.dict) ;;
  esac
  echo "fuzzing $target for ${seconds}s ($(ls "corpus/$target" | wc -l) inputs to start from)"
  cargo fuzz run -s none --release "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 "${dict[@]}" 2>&1 | tail -n 3
done
