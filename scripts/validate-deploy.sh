#!/usr/bin/env bash
# Validates deploy/ offline: renders every kustomize overlay (`kubectl kustomize`, where kubectl
# is installed), validates each object with the strict Kubernetes schemas of 1.29 and 1.33
# (kubernetes-validate) or the vendored CRD schemas (deploy/schemas/), lints what schemas cannot
# see, and prints `N passed, N failed`. Then runs the pytest suite that also proves each check
# catches the mistake it is for. No cluster and no network needed. The Airflow example is imported
# with the real Airflow where its venv exists (WITH_AIRFLOW=1 creates it first: about 8 minutes,
# from PyPI; tests/deploy/setup-airflow-venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
if ! "$py" -c "import kubernetes_validate, jsonschema, yaml" 2>/dev/null; then
  bash scripts/setup-venv.sh
fi
if ! command -v kubectl >/dev/null; then
  echo "kubectl not found: overlays are checked as written (patches applied, no kustomize rendering)"
fi
if [ "${WITH_AIRFLOW:-0}" = 1 ]; then
  bash tests/deploy/setup-airflow-venv.sh
fi
"$py" tests/deploy/deploycheck.py
"$py" -m pytest -q tests/deploy
