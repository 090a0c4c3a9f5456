#!/usr/bin/env bash
# Installs the Debian packages the tests need when they are missing (CI runs on a fresh machine as
# root). Nothing is installed when everything is already there.
set -euo pipefail
need=()
command -v python3 >/dev/null || need+=(python3 python3-venv)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# FUSE mounts in the tests (fusermount3, /etc/fuse.conf for allow_other).
command -v fusermount3 >/dev/null || need+=(fuse3)
# The FUSE peers the benchmark compares against (benches/run.py, also its CI smoke run), and curl,
# which WebDataset reads URLs through.
command -v rclone >/dev/null || need+=(rclone)
command -v s3fs >/dev/null || need+=(s3fs)
command -v curl >/dev/null || need+=(curl)
# A real Prometheus scrapes `shardstream run` in tests/python/test_node_metrics.py.
command -v prometheus >/dev/null || need+=(prometheus)
# Azurite (the Azure Blob emulator, scripts/setup-servers.sh) is a Node program.
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
