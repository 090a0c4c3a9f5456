#!/usr/bin/env bash
# Creates the venv that tests/deploy/test_airflow_dag.py imports the Airflow example with:
# the real apache-airflow and apache-airflow-providers-cncf-kubernetes from PyPI, apart from the
# main venv (their dependency pins conflict with it). About 8 minutes and 700 MB on a fresh
# machine (mostly downloads), so scripts/test.sh runs it in the background while Rust builds; the
# test fails without the venv under CI=true and is skipped elsewhere.
#   tests/deploy/setup-airflow-venv.sh            # -> $AIRFLOW_TEST_VENV or ~/.cache/shardstream/airflow-venv
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${AIRFLOW_TEST_VENV:-$HOME/.cache/shardstream/airflow-venv}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import airflow.providers.cncf.kubernetes" 2>/dev/null; then
  echo "$venv: ready"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
start=$(date +%s)
"$venv/bin/pip" install -q -r "$here/airflow-requirements.txt"
echo "$venv: installed in $(( $(date +%s) - start )) s"
