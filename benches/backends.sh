#!/usr/bin/env bash
# Issue 39 "Numbers": cold-epoch throughput ÷ raw parallel GET (8 in flight) of the same shards,
# per object-store server of the conformance suite (moto, s3s-fs, fake-gcs-server, Azurite),
# each on 127.0.0.1, the median of 3 runs, on two datasets: 29 MB (3,000 samples of 10 KB in 1 MiB
# shards), whose ~0.1 s epoch is mostly start-up, and 256 MB (100 KB samples in 16 MiB shards;
# SHARDSTREAM_COLD_BENCH_MB sets it, 0 skips it) where the steady state shows;
# SHARDSTREAM_COLD_BENCH_SERVERS=moto,s3s-fs picks servers; SHARDSTREAM_COLD_BENCH_CACHE=/dev/shm
# puts the node cache on another file system (what the cache disk's writes and fsyncs cost).
# Beside each ratio: the client's CPU seconds in each, and the stream's end wait for its last
# commits. Then checkpoint save and load ÷ raw PUT and GET, per server. Prints Markdown tables.
# The servers come from scripts/setup-servers.sh.
#
#     bash benches/backends.sh
#
# Release build of the streamer's integration-test binary only. Client and server share the
# machine's cores, so the ratio says how close the streamer gets to what the server can serve
# here, not a cloud figure.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p shardstream-streamer --test it \
  conformance::throughput_cold_epoch_vs_raw_get -- --ignored --nocapture --test-threads 1
# Checkpoints: save and load (4 ranks x 32 MiB) ÷ raw PUT and GET of the same bytes.
exec cargo test --release -p shardstream-checkpoint --test it \
  conformance::throughput_save_load_vs_raw_put_get -- --ignored --nocapture --test-threads 1
