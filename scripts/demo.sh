#!/usr/bin/env bash
# The main job, end to end, on a built-in default: a local folder (.demo/bucket) stands in for the
# bucket, so no credentials are needed. Set DEMO_BUCKET to an s3:// URL to use a real one.
#   1. generate a small ImageFolder tree and a JSONL file (stdlib Python only)
#   2. shard both into MDS (zstd, xxh64+sha1) in the "bucket", in parallel
#   3. inspect and verify the datasets, and print a few samples
#   4. shard the ImageFolder again as 3 parts (as 3 pods of an Indexed Job would) and merge them
#   5. convert the MDS dataset to WebDataset tars and read them back
set -euo pipefail
cd "$(dirname "$0")/.."
work=.demo
bucket=${DEMO_BUCKET:-$work/bucket}
rm -rf "$work"
mkdir -p "$work"

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
echo "demo finished: datasets are under $bucket"
