//! Costs of the sample order at scale: building an epoch of 10^5 shards / 10^8 samples,
//! answering `sample_at`, walking a rank's stream, and planning prefetch.
//!
//! `cargo bench -p shardstream-streamer --bench order`

#![allow(clippy::unwrap_used)] // a bench has nobody to return an error to

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use shardstream_streamer::order::{
    DatasetShape, EpochOrder, OrderConfig, Rank, Remainder, Sampling, StreamShape, Weight, World,
};

const SHARDS: usize = 100_000;
const PER_SHARD: u64 = 1_000;

fn config(shuffle: bool) -> OrderConfig {
    OrderConfig {
        seed: 9176,
        shuffle,
        window: 16,
        lanes: 64,
        remainder: Remainder::Pad,
        ramp: true,
        sample_ramp: true,
    }
}

fn big_shape() -> DatasetShape {
    // Sizes vary a little, as MDS shards cut by bytes do.
    let sizes = (0..SHARDS as u64).map(|i| PER_SHARD - i % 7).collect();
    DatasetShape::single(sizes).unwrap()
}

fn build(c: &mut Criterion) {
    let shape = big_shape();
    let mixed = DatasetShape::mixed(
        vec![
            (
                StreamShape::new(vec![PER_SHARD; SHARDS / 2]).unwrap(),
                Weight::Proportion(3.0),
            ),
            (
                StreamShape::new(vec![PER_SHARD; SHARDS / 2]).unwrap(),
                Weight::Proportion(1.0),
            ),
        ],
        None,
        Sampling::Balanced,
    )
    .unwrap();
    let mut g = c.benchmark_group("build");
    g.sample_size(20);
    g.bench_function("epoch_order_1e5_shards_1e8_samples", |b| {
        b.iter(|| EpochOrder::new(black_box(&shape), &config(true), 3).unwrap())
    });
    // Same shard count, 10x the samples: the same cost. 10x the shards: 10x the cost.
    let huge = DatasetShape::single(vec![10_000; SHARDS]).unwrap();
    g.bench_function("epoch_order_1e5_shards_1e9_samples", |b| {
        b.iter(|| EpochOrder::new(black_box(&huge), &config(true), 3).unwrap())
    });
    let many = DatasetShape::single(vec![100; SHARDS * 10]).unwrap();
    g.bench_function("epoch_order_1e6_shards_1e8_samples", |b| {
        b.iter(|| EpochOrder::new(black_box(&many), &config(true), 3).unwrap())
    });
    g.bench_function("epoch_order_mixed_2_streams_3to1", |b| {
        b.iter(|| EpochOrder::new(black_box(&mixed), &config(true), 3).unwrap())
    });
    g.finish();
}

fn lookup(c: &mut Criterion) {
    let shape = big_shape();
    let mut g = c.benchmark_group("sample_at");
    for shuffle in [true, false] {
        let order = EpochOrder::new(&shape, &config(shuffle), 3).unwrap();
        let n = order.global_len();
        let name = if shuffle {
            "shuffled_random_pos"
        } else {
            "unshuffled_random_pos"
        };
        g.throughput(Throughput::Elements(1024));
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    (0..1024u64)
                        .map(|i| (i * 0x9e37_79b9_7f4a_7c15) % n)
                        .collect::<Vec<_>>()
                },
                |positions| {
                    for p in positions {
                        black_box(order.sample_at(p));
                    }
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn rank_stream(c: &mut Criterion) {
    let shape = big_shape();
    let order = EpochOrder::new(&shape, &config(true), 3).unwrap();
    // 8 nodes x 8 GPUs x 4 workers, batches of 32.
    let world = World::new(8, 8, 4, 32).unwrap();
    let rank = Rank {
        node: 5,
        local_process: 3,
        worker: 2,
    };
    let mut g = c.benchmark_group("rank_iter");
    g.throughput(Throughput::Elements(100_000));
    g.bench_function("next_100k", |b| {
        b.iter(|| {
            let it = order.rank_iter(world, rank, 1_234_567).unwrap();
            for s in it.take(100_000) {
                black_box(s);
            }
        })
    });
    g.finish();
    let partition = order.partition(world, 0);
    let mut g = c.benchmark_group("plan");
    g.bench_function("shards_needed_10k_items", |b| {
        b.iter(|| {
            black_box(
                order
                    .shards_needed(&partition, rank, 50_000..60_000)
                    .unwrap(),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, build, lookup, rank_stream);
criterion_main!(benches);
