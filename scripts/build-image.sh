#!/usr/bin/env bash
# Builds the shardstream images (deploy/Dockerfile's `runtime` and `trainer` targets) without a
# Docker engine or a registry, and smoke-tests them: buildah with `--isolation chroot`, on a
# minimal Debian bookworm made by debootstrap from the host's Debian mirror, with the artifacts
# built on this host. Run as root. Not part of CI (several minutes, and gigabytes for torch).
#
#   scripts/build-image.sh [runtime|trainer|both|base]      (default: both; base: only the base)
#
# Artifacts (built here unless given):
#   SHARDSTREAM_BIN  the CLI binary        (default: `cargo build --profile dist -p shardstream-cli`)
#   SHARDSTREAM_WHEEL the Python wheel      (default: `maturin build --profile dist`; an abi3 wheel
#                    from scripts/build-wheel.sh where that exists)
# Caches outside the repository (IMAGE_CACHE, default /var/cache/shardstream-image): the
# debootstrap tarball and the base image `localhost/shardstream-debian:bookworm` are kept; the
# images are smoke-tested in their working containers and committed (as
# localhost/shardstream-{runtime,trainer}:dev) only with KEEP_IMAGES=1: a commit copies the
# trainer's 6 GB once more, and disk is shared. Working containers are removed on any exit. TORCH_SPEC
# (default: torch==<the version tests/requirements.txt pins>) is what the trainer installs
# from PyPI inside the image (about 4 GB with its CUDA libraries); TORCH_FROM_VENV=DIR copies
# torch and its requirements from that venv instead (same Python minor version: 3.11).
#
# Each stage is timed; each image's size and the smoke output are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
which=${1:-both}
cache=${IMAGE_CACHE:-/var/cache/shardstream-image}
base_image=localhost/shardstream-debian:bookworm
mkdir -p "$cache"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

# --- tools --------------------------------------------------------------------------------------
if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  stamp "installing buildah and debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq buildah debootstrap >/dev/null
fi
bah() { local cmd=$1; shift; case $cmd in from|copy|commit) buildah "$cmd" --quiet "$@" ;; *) buildah "$cmd" "$@" ;; esac; }
run_in() { local ctr=$1; shift; buildah run --isolation chroot "$ctr" -- "$@"; }
# Downloads inside the build (pip) trust what the host trusts (a TLS-inspecting proxy's CA, say):
# the host's CA bundle is mounted for those steps only, never copied into the image.
host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
fetch_in() { local ctr=$1; shift; buildah run --isolation chroot -v "$host_ca:/etc/ssl/host-ca.crt:ro" \
  --env PIP_CERT=/etc/ssl/host-ca.crt --env SSL_CERT_FILE=/etc/ssl/host-ca.crt "$ctr" -- "$@"; }

# --- artifacts ----------------------------------------------------------------------------------
art=$(mktemp -d "$cache/artifacts.XXXXXX")
containers=()
cleanup() {
  for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
  rm -rf "$art"
}
trap cleanup EXIT
mkdir -p "$art/bin" "$art/wheels"

# --- the base: minimal Debian with Python 3.11 in a venv (what python:3.11-slim gives) ----------
if ! buildah inspect --type image "$base_image" >/dev/null 2>&1; then
  tarball=$cache/debian-bookworm-minbase.tar
  if [ ! -f "$tarball" ]; then
    # The host's own Debian mirror (the first URI of its apt sources).
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    mirror=${mirror:-$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)}
    stamp "debootstrap bookworm (minbase) from $mirror"
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror" >"$cache/debootstrap.log"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  stamp "importing the base image"
  ctr=$(bah from scratch); containers+=("$ctr")
  mnt=$(buildah mount "$ctr")
  tar -C "$mnt" -xf "$tarball"
  cp /etc/apt/sources.list.d/debian.sources "$mnt/etc/apt/sources.list.d/" 2>/dev/null || true
  buildah umount "$ctr" >/dev/null
  run_in "$ctr" python3 -m venv /opt/python
  bah config --env PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  bah commit --rm "$ctr" "$base_image" >/dev/null
  containers=("${containers[@]/$ctr}")
fi

[ "$which" = base ] && exit 0

# --- artifacts ----------------------------------------------------------------------------------
if [ -z "${SHARDSTREAM_BIN:-}" ]; then
  stamp "building the CLI (dist profile)"
  cargo build --profile dist --locked -q -p shardstream-cli
  SHARDSTREAM_BIN=${CARGO_TARGET_DIR:-target}/dist/shardstream
fi
if [ -z "${SHARDSTREAM_WHEEL:-}" ]; then
  if [ -x scripts/build-wheel.sh ]; then
    stamp "building the wheel (scripts/build-wheel.sh)"
    bash scripts/build-wheel.sh "$art/wheels"
  else
    stamp "building the wheel (maturin, dist profile)"
    maturin build --profile dist --locked -m pyo3-bindings/Cargo.toml -o "$art/wheels"
  fi
else
  cp "$SHARDSTREAM_WHEEL" "$art/wheels/"
fi
cp "$SHARDSTREAM_BIN" "$art/bin/shardstream"
echo "binary: $(du -h "$art/bin/shardstream" | cut -f1); wheel: $(ls "$art/wheels")"

# --- the images ---------------------------------------------------------------------------------
torch_spec=${TORCH_SPEC:-$(grep -m1 '^torch==' tests/requirements.txt || echo torch)}
build() {  # build VARIANT: leaves its working container in $work_ctr
  local variant=$1 ctr
  ctr=$(bah from "$base_image"); containers+=("$ctr")
  bah copy "$ctr" "$art" /tmp/shardstream
  bah copy "$ctr" deploy/image/install.sh /tmp/install.sh
  fetch_in "$ctr" sh /tmp/install.sh /tmp/shardstream >"$cache/install-$variant.log" 2>&1 \
    || { tail -20 "$cache/install-$variant.log"; return 1; }
  if [ "$variant" = trainer ] && [ -n "${TORCH_FROM_VENV:-}" ]; then
    # torch and every distribution it requires, copied from a host venv of the same Python
    # minor version (what a PyTorch BASE brings; no 4 GB download).
    local site mnt
    site=$("$TORCH_FROM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$TORCH_FROM_VENV/bin/python" - >"$art/torch-files" <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
seen, todo, tops = set(), ["torch"], set()
while todo:
    name = canon(todo.pop())
    if name in seen:
        continue
    seen.add(name)
    dist = md.distribution(name)
    for r in dist.requires or []:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(req.name)
    tops.update(f.parts[0] for f in dist.files or [] if f.parts[0] != "..")
print("\n".join(sorted(tops)))
PY
    mnt=$(buildah mount "$ctr")
    tar -C "$site" -cf - -T "$art/torch-files" | tar -C "$mnt/opt/python/lib/python3.11/site-packages" -xf -
    buildah umount "$ctr" >/dev/null
    # Their console scripts (torchrun), as pip would write them.
    run_in "$ctr" python - <<'PY'
import importlib.metadata as md, os, sys
for dist in md.distributions():
    for ep in dist.entry_points:
        path = os.path.join(sys.prefix, "bin", ep.name)
        if ep.group == "console_scripts" and not os.path.exists(path):
            mod, _, fn = ep.value.partition(":")
            with open(path, "w") as f:
                f.write(f"#!{sys.executable}\nimport sys\nfrom {mod} import {fn}\nsys.exit({fn}())\n")
            os.chmod(path, 0o755)
PY
    echo "torch copied from $TORCH_FROM_VENV ($(wc -l <"$art/torch-files") top-level entries)"
  elif [ "$variant" = trainer ]; then
    # torch from PyPI (its CUDA wheels also run on CPU), as the Dockerfile does on a BASE
    # without torch.
    fetch_in "$ctr" sh -c "python -c 'import torch' 2>/dev/null || python -m pip install --no-cache-dir -q '$torch_spec'" \
      >>"$cache/install-$variant.log" 2>&1 || { tail -20 "$cache/install-$variant.log"; return 1; }
  fi
  run_in "$ctr" rm -rf /tmp/shardstream /tmp/install.sh
  bah config --user 1000 --workingdir /workspace --entrypoint '["/usr/bin/tini", "--"]' --cmd '["shardstream", "--help"]' "$ctr"
  mnt=$(buildah mount "$ctr")
  echo "$variant: $(du -sxh "$mnt" | cut -f1) (the image's files, uncompressed)"
  buildah umount "$ctr" >/dev/null
  # Committing copies the files once more (6 GB for the trainer): only when asked to keep the
  # image. The smoke test runs in this working container, as the image would (uid 1000).
  if [ "${KEEP_IMAGES:-0}" = 1 ]; then
    bah commit "$ctr" "localhost/shardstream-$variant:dev" >/dev/null
  fi
  work_ctr=$ctr
}

smoke() {  # smoke VARIANT (in the working container build left)
  local variant=$1 ctr=$work_ctr
  bah copy --chown 1000:1000 "$ctr" scripts/demo_data.py /workspace/
  bah copy --chown 1000:1000 "$ctr" deploy/base/train.py /workspace/
  echo "--- $variant: shardstream --version"
  run_in "$ctr" shardstream --version
  echo "--- $variant: fuse.conf, tini, uid"
  run_in "$ctr" sh -c 'grep -x user_allow_other /etc/fuse.conf && tini --version && id'
  if [ "$variant" = trainer ]; then
    echo "--- trainer: import shardstream, torch"
    run_in "$ctr" python -c "import shardstream, torch; print('shardstream', shardstream.__file__, 'torch', torch.__version__)"
    # The overlays' own command and script (deploy/base/train.py at /workspace/train.py), on
    # one node with two workers, as uid 1000 (tini -s: not PID 1 under `buildah run`).
    echo "--- trainer: shard -> stream -> train (torchrun, 2 workers) -> checkpoint, as uid 1000"
    run_in "$ctr" sh -ec '
      cd /workspace
      mkdir -p raw
      python demo_data.py raw --images 0 --records 2000
      shardstream shard raw/records.jsonl bucket/records --shard-size 64KiB
      shardstream verify bucket/records
      export SHARDSTREAM_CACHE_ROOT=/workspace/cache SHARDSTREAM_RUN_ID=smoke SHARDSTREAM_NODE_RANK=0
      export SHARDSTREAM_DATASET=/workspace/bucket/records CHECKPOINT_ROOT=/workspace/bucket/ckpt STEPS=20
      shardstream stream bucket/records --memory-limit 64MiB
      # --local-addr: the chroot has no /etc/hosts entry for the host name that torchrun
      # would advertise to its workers (a pod has one).
      tini -s -- shardstream run -- torchrun --nnodes=1 --nproc-per-node=2 --local-addr=127.0.0.1 /workspace/train.py
      shardstream ckpt ls bucket/ckpt
      shardstream ckpt verify bucket/ckpt'
  else
    run_in "$ctr" python -c "import shardstream; print('shardstream', shardstream.__file__)"
  fi
  buildah rm "$ctr" >/dev/null
  containers=("${containers[@]/$ctr}")
}

variants=(runtime trainer)
[ "$which" = both ] || variants=("$which")
for v in "${variants[@]}"; do
  stamp "building $v"
  build "$v"
  stamp "smoke-testing $v"
  smoke "$v"
done
stamp "done"
if [ "${KEEP_IMAGES:-0}" = 1 ]; then
  buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E 'shardstream-(debian|runtime|trainer)' || true
fi
echo "the base stays cached as $base_image"
