#!/bin/sh
# Installs shardstream into an image: the system packages it needs, the `shardstream` binary and
# the Python wheel, FUSE's `user_allow_other`, and the user the manifests run as (uid 1000).
# Used by deploy/Dockerfile (both stages) and by scripts/build-image.sh, so the image that the
# script proves is the one the Dockerfile builds.
#
#   install.sh ARTIFACTS      # ARTIFACTS/bin/shardstream and ARTIFACTS/wheels/*.whl
#
# `python` on PATH is the interpreter the wheel goes into (python:*-slim's, a PyTorch image's
# conda, or a venv); it must match the wheel's tag (cp311 today, abi3 once the wheel is built so).
set -eu
art=$1

# fuse3: fusermount3 for `shardstream mount` and /etc/fuse.conf; util-linux: `mountpoint`;
# tini: the init that runs `shardstream run` (not a bare PID 1: zombies reaped, signals passed).
if command -v apt-get >/dev/null; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends fuse3 util-linux tini ca-certificates
  rm -rf /var/lib/apt/lists/*
fi

install -D -m 0755 "$art/bin/shardstream" /usr/local/bin/shardstream
python -m pip install --no-cache-dir "$art"/wheels/*.whl

# A mount made by a non-root sidecar with --allow-other must be readable by a trainer of another
# uid (root included): fusermount3 allows the option only with this line.
grep -qx user_allow_other /etc/fuse.conf 2>/dev/null || echo user_allow_other >>/etc/fuse.conf

# The manifests' runAsUser. A base that already has uid 1000 (some PyTorch images) keeps its user.
if ! getent passwd 1000 >/dev/null; then
  useradd --uid 1000 --user-group --create-home trainer
fi
# The training script's documented place (docs/deploy.md, "The image").
mkdir -p /workspace
chown 1000:1000 /workspace
