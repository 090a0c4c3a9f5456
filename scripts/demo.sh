#!/usr/bin/env bash
# The main job, end to end, on a built-in default: a local folder (.demo/bucket) stands in for the
# bucket, so no credentials are needed. Set DEMO_BUCKET to an s3:// URL to use a real one.
#   1. generate a small ImageFolder tree and a JSONL file (stdlib Python only)
#   2. shard both into MDS (zstd, xxh64+sha1) in the "bucket", in parallel
#   3. inspect and verify the datasets, and print a few samples
#   4. shard the ImageFolder again as 3 parts (as 3 pods of an Indexed Job would) and merge them
#   5. convert the MDS dataset to WebDataset tars and read them back
#   6. stream an epoch into this node's cache (`shardstream stream`) and print the figures
#   7. train a small torch model on the stream (DataLoader, 2 workers) under `shardstream run`,
#      checkpointing model + optimizer + loader position to the bucket with the DCP backend;
#      the run is killed with SIGKILL at step 25, resumes from the latest complete checkpoint,
#      and its sample sequence is checked against an uninterrupted run
#   8. manage the checkpoints (`ckpt ls/latest/verify`)
#   9. mount the image dataset with FUSE and check the mounted tree against the original
set -euo pipefail
cd "$(dirname "$0")/.."
work=.demo
bucket=${DEMO_BUCKET:-$work/bucket}
rm -rf "$work"
mkdir -p "$work"

echo "== system packages (python3-venv, fuse3) if missing"
bash scripts/setup-system.sh

echo "== build"
cargo build --release -q -p shardstream-cli
ss=target/release/shardstream

echo "== generate the built-in dataset"
python3 scripts/demo_data.py "$work/raw"

echo "== shard: ImageFolder -> MDS and JSONL -> MDS"
$ss shard "$work/raw/images" "$bucket/images" --input-format imagefolder --hashes xxh64,sha1 --shard-size 64KiB
$ss shard "$work/raw/records.jsonl" "$bucket/records" --shard-size 256KiB

echo "== inspect / verify / cat"
$ss inspect "$bucket/images"
$ss verify "$bucket/images"
$ss verify "$bucket/records"
$ss cat "$bucket/records" --limit 2 --json

echo "== shard in 3 parts (an Indexed Job's pods) and merge the index"
for i in 0 1 2; do
  $ss shard "$work/raw/images" "$bucket/images-parts" --input-format imagefolder --part "$i/3" --shard-size 64KiB
done
$ss merge-index "$bucket/images-parts"
$ss verify "$bucket/images-parts"
diff <($ss cat "$bucket/images" --json) <($ss cat "$bucket/images-parts" --json) >/dev/null
echo "parts merged: same samples as the single-process run"

echo "== MDS -> WebDataset and back"
$ss shard "$bucket/records" "$work/wds" --format wds --input-format mds
$ss cat "$work/wds" --limit 1 --json
echo "== python env (torch from PyPI, the shardstream binding)"
bash scripts/setup-venv.sh
(cd pyo3-bindings && ../.venv/bin/maturin develop --profile dev --quiet)
py=$PWD/.venv/bin/python

# The node's cache: <cache-root>/<run-id>/<node-rank>/ (docs/cache.md).
export SHARDSTREAM_CACHE_ROOT=$PWD/$work/cache SHARDSTREAM_RUN_ID=demo SHARDSTREAM_NODE_RANK=0

echo "== stream one shuffled epoch into this node's cache"
$ss stream "$bucket/records" --shuffle --seed 7 --memory-limit 64MiB

echo "== train on the stream, checkpoint, crash at step 25, resume"
train() { $ss run --run-id demo -- "$py" -W ignore scripts/demo_train.py "$bucket/records" "$@"; }
if train "$bucket/ckpt" --steps 60 --crash-after 25 --log "$work/crashed.log"; then
  echo "the training run should have been killed" >&2; exit 1
fi
train "$bucket/ckpt" --steps 60 --log "$work/crashed.log"
train "$work/ckpt-reference" --steps 60 --log "$work/reference.log"
# The killed run logged steps 1-25, the resumed one 21-60 (from the checkpoint of step 20).
diff <(head -n 20 "$work/crashed.log"; tail -n 40 "$work/crashed.log") "$work/reference.log" >/dev/null
echo "resumed run trained on exactly the samples of an uninterrupted run"

echo "== checkpoints"
$ss ckpt ls "$bucket/ckpt"
$ss ckpt latest "$bucket/ckpt"
$ss ckpt verify "$bucket/ckpt"

echo "== mount the image dataset read-only (FUSE)"
if [ -e /dev/fuse ] && command -v fusermount3 >/dev/null; then
  mnt=$work/mnt
  mkdir -p "$mnt"
  $ss mount "$bucket/images" "$mnt"
  trap 'fusermount3 -u "$mnt" 2>/dev/null || true' EXIT
  ls "$mnt" "$mnt/samples"
  diff -r "$work/raw/images" "$mnt/samples"
  echo "the mounted samples/ tree equals the original ImageFolder tree"
  fusermount3 -u "$mnt"
  trap - EXIT
else
  echo "skipped: no /dev/fuse or fusermount3 here (apt-get install fuse3)"
fi
echo "demo finished: datasets and checkpoints are under $bucket"
