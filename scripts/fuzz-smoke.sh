#!/usr/bin/env bash
# Builds every cargo-fuzz target and runs each for a short while (FUZZ_SECONDS, default 20).
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
  mkdir -p "corpus/$target"
  echo "fuzzing $target for ${seconds}s"
  cargo fuzz run -s none --release "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 2>&1 | tail -n 3
done
