#!/usr/bin/env bash
# The project's test command (README line 2; .ci/run calls it). Installs what it needs, then runs:
# formatting and lint checks, every Rust test (unit, property, integration against a real moto S3
# server on 127.0.0.1, interop against the real mosaicml-streaming / webdataset / litdata), the
# Python tests, and a short run of each fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# Each step says when it starts (seconds since the script did), so a slow CI run shows where.
step() { printf '\n=== %s (%s free on disk, at %s s)\n' "$*" "$(df -h --output=avail . | tail -n 1 | tr -d ' ')" "$SECONDS"; }

# CI builds once from scratch: incremental state would only take disk.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi

step "system packages"
bash scripts/setup-system.sh

step "python venv"
bash scripts/setup-venv.sh
export SHARDSTREAM_PYTHON="$root/.venv/bin/python"
export SHARDSTREAM_MOTO_SERVER="$root/.venv/bin/moto_server"

# The Airflow DAG test's own venv (apache-airflow + the cncf.kubernetes provider, apart from .venv:
# their pins conflict with it) is mostly downloads: made in the background while Rust compiles.
airflow_log="$root/target/airflow-venv.log"
mkdir -p "$root/target"
bash tests/deploy/setup-airflow-venv.sh > "$airflow_log" 2>&1 &
airflow_pid=$!

step "object-store servers (s3s-fs, Azurite, fake-gcs-server) for the conformance suite"
bash scripts/setup-servers.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

# Before cargo test: some Rust integration tests (cli/tests/run_restart.rs) run Python training
# scripts that import the binding.
step "python binding (maturin develop into .venv)"
(cd pyo3-bindings && "$root/.venv/bin/maturin" develop --profile dev --quiet)

step "cargo test"
cargo test --workspace --locked --no-fail-fast

step "airflow venv (started in the background)"
if ! wait "$airflow_pid"; then
  cat "$airflow_log" >&2
  echo "tests/deploy/setup-airflow-venv.sh failed" >&2
  exit 1
fi
cat "$airflow_log"

step "pytest"
export SHARDSTREAM_BIN="$root/target/debug/shardstream"
"$root/.venv/bin/python" -m pytest -q tests/python tests/deploy

step "fuzz smoke"
bash scripts/fuzz-smoke.sh
step "done"
