#!/usr/bin/env bash
# Creates (or refreshes) the project's Python venv at .venv with the pinned test packages:
# torch, the peer libraries (mosaicml-streaming, webdataset, litdata) and moto's S3 server.
# Idempotent: a venv whose requirements stamp matches is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
stamp=.venv/.requirements.sha
want=$(sha256sum tests/requirements.txt | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "setting up .venv (torch, mosaicml-streaming, webdataset, litdata, moto) ..." >&2
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -r tests/requirements.txt
echo "$want" > "$stamp"
