//! Samples a stream hands over unread (`SampleStream::defer_on_demand`): the consumer asks for
//! one by setting a flag, reads it on a thread of its own, and must get exactly what the stream
//! would have read, in the same order, from a folder read in place and from a real moto S3
//! server while the shards are still arriving; a damaged shard fails the read with its name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{check_sample, node_config, served, write_dataset, Spec};
use shardstream_streamer::order::{OrderConfig, Rank, World};
use shardstream_streamer::{
    RawSample, SampleStream, StreamItem, StreamPlan, StreamingConfig, StreamingDataset,
};

/// 600 kB samples, three to a shard: large enough to be left to the consumer at 512 KiB.
fn large(samples: u64) -> Spec {
    Spec {
        samples,
        sample_bytes: 600_000,
        shard_limit: 2_000_000,
        compression: None,
        hashes: false,
    }
}

const MIN_BYTES: u64 = 512 << 10;

fn in_place(dir: &Path, cache_root: &Path) -> StreamingConfig {
    StreamingConfig {
        remote: dir.display().to_string(),
        cache_root: Some(cache_root.to_path_buf()),
        run_id: Some("run".into()),
        node_rank: Some(0),
        memory_limit: Some(16 << 20),
        ..StreamingConfig::default()
    }
}

fn plan(shuffle: bool) -> StreamPlan {
    StreamPlan::single_process(
        OrderConfig {
            seed: 7,
            shuffle,
            window: 2,
            lanes: 1,
            ..OrderConfig::default()
        },
        0,
    )
}

/// What one stream yielded in order, and how many of its samples the consumer read itself.
struct Yielded {
    samples: Vec<Item>,
    deferred: usize,
    /// The numbers (from 0) of the items that were deferred.
    deferred_at: Vec<usize>,
}

/// A yielded sample: global index, position, whether it is padding, its bytes.
type Item = (u64, u64, bool, Vec<u8>);

/// Drains `stream`, setting the request flag before the items `ask` picks (by their number) and
/// reading every deferred sample on a thread of its own, as the Python binding's consumer does;
/// checks each sample's columns against what the writer wrote (`len` bytes of data).
fn drain(
    mut stream: SampleStream,
    wanted: &AtomicBool,
    len: usize,
    min_bytes: u64,
    ask: impl Fn(usize) -> bool,
) -> Yielded {
    let mut out = Yielded {
        samples: Vec::new(),
        deferred: 0,
        deferred_at: Vec::new(),
    };
    let mut n = 0;
    loop {
        if ask(n) {
            wanted.store(true, Ordering::Release);
        }
        let Some(item) = stream.next_item() else {
            break;
        };
        n += 1;
        let (index, position, padding, raw): (u64, u64, bool, RawSample) = match item.unwrap() {
            StreamItem::Read(s) => (s.index, s.position, s.padding, s.sample),
            StreamItem::Deferred(d) => {
                assert!(
                    !wanted.load(Ordering::Acquire),
                    "a deferred sample answers one request"
                );
                assert!(d.len() >= min_bytes, "only large samples are deferred");
                out.deferred += 1;
                out.deferred_at.push(n - 1);
                let (index, position, padding) = (d.index, d.position, d.padding);
                let raw = std::thread::spawn(move || d.read())
                    .join()
                    .unwrap()
                    .unwrap();
                (index, position, padding, raw)
            }
        };
        assert_eq!(raw.index(), index);
        check_sample(index, &raw.decode().unwrap(), len);
        out.samples
            .push((index, position, padding, raw.bytes().to_vec()));
    }
    out
}

/// The same plan read by the plain iterator: the reference.
fn reference(ds: &StreamingDataset, plan: StreamPlan) -> Vec<Item> {
    ds.stream(plan)
        .unwrap()
        .map(|s| {
            let s = s.unwrap();
            (s.index, s.position, s.padding, s.sample.bytes().to_vec())
        })
        .collect()
}

#[test]
fn deferred_samples_are_the_streams_own_in_order_and_shuffled() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let spec = large(24);
    write_dataset(dir.path(), &spec);
    let ds = StreamingDataset::open(in_place(dir.path(), cache.path())).unwrap();

    for shuffle in [false, true] {
        let expected = reference(&ds, plan(shuffle));
        assert_eq!(expected.len() as u64, spec.samples);

        // Every other sample asked for: both kinds interleave, in the stream's order.
        let before = ds.metrics().deferred_reads;
        let wanted = Arc::new(AtomicBool::new(false));
        let mut stream = ds.stream(plan(shuffle)).unwrap();
        stream.defer_on_demand(Arc::clone(&wanted), MIN_BYTES);
        let got = drain(stream, &wanted, spec.sample_bytes, MIN_BYTES, |n| {
            n % 2 == 0
        });
        assert_eq!(got.samples, expected, "shuffle={shuffle}");
        assert!(
            got.deferred >= 8 && got.deferred < expected.len(),
            "shuffle={shuffle}: {} of {} deferred",
            got.deferred,
            expected.len()
        );
        assert_eq!(
            ds.metrics().deferred_reads - before,
            got.deferred as u64,
            "each deferred read is counted"
        );

        // Never asked: the stream reads everything itself.
        let wanted = Arc::new(AtomicBool::new(false));
        let mut stream = ds.stream(plan(shuffle)).unwrap();
        stream.defer_on_demand(Arc::clone(&wanted), MIN_BYTES);
        let got = drain(stream, &wanted, spec.sample_bytes, MIN_BYTES, |_| false);
        assert_eq!((got.samples, got.deferred), (expected.clone(), 0));

        // Asked every time, but the samples are below the size: none deferred, the request
        // stays up for a large one.
        let wanted = Arc::new(AtomicBool::new(false));
        let mut stream = ds.stream(plan(shuffle)).unwrap();
        stream.defer_on_demand(Arc::clone(&wanted), 1 << 20);
        let got = drain(stream, &wanted, spec.sample_bytes, 1 << 20, |_| true);
        assert_eq!((got.samples, got.deferred), (expected, 0));
        assert!(wanted.load(Ordering::Acquire));
    }
    assert_eq!(ds.metrics().memory_in_use, 0, "the budget is given back");
}

#[test]
fn samples_already_in_a_run_buffer_are_never_deferred_and_padding_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    // 300 kB samples: an in-order run of 1 MiB reads three at a time. 25 samples over two
    // processes: one padding repeat.
    let spec = Spec {
        sample_bytes: 300_000,
        ..large(25)
    };
    write_dataset(dir.path(), &spec);
    let ds = StreamingDataset::open(in_place(dir.path(), cache.path())).unwrap();
    let min_bytes = 256 << 10;

    // In order, asked before items 1, 4, 7, ...: sample 0 is read alone (no run before it),
    // sample 1 is deferred, the stream reads 2-4 as one run, so the ask before item 4 meets a
    // buffered sample and stays up until sample 5, the next the stream would read itself.
    let expected = reference(&ds, plan(false));
    let wanted = Arc::new(AtomicBool::new(false));
    let mut stream = ds.stream(plan(false)).unwrap();
    stream.defer_on_demand(Arc::clone(&wanted), min_bytes);
    let got = drain(stream, &wanted, spec.sample_bytes, min_bytes, |n| {
        n % 3 == 1
    });
    assert_eq!(got.samples, expected);
    assert_eq!(got.deferred_at[..2], [1, 5], "{:?}", got.deferred_at);
    assert!(
        got.deferred <= 9,
        "at most one per ask: {:?}",
        got.deferred_at
    );

    // Two processes, shuffled, every other item asked: each rank's sequence, padding included.
    let world = World::new(1, 2, 1, 1).unwrap();
    let mut padding = 0;
    for local_process in 0..2 {
        let plan = StreamPlan {
            world,
            rank: Rank {
                node: 0,
                local_process,
                worker: 0,
            },
            ..plan(true)
        };
        let expected = reference(&ds, plan);
        let wanted = Arc::new(AtomicBool::new(false));
        let mut stream = ds.stream(plan).unwrap();
        stream.defer_on_demand(Arc::clone(&wanted), min_bytes);
        let got = drain(stream, &wanted, spec.sample_bytes, min_bytes, |n| {
            n % 2 == 0
        });
        assert_eq!(got.samples, expected, "rank {local_process}");
        assert!(got.deferred > 0, "rank {local_process}");
        padding += got.samples.iter().filter(|s| s.2).count();
    }
    assert_eq!(padding, 1, "one padding repeat in the epoch");
}

#[test]
fn deferred_samples_cold_from_moto_while_shards_arrive() {
    let spec = large(30);
    let s = served(&spec);
    let ds = StreamingDataset::open_at(
        StreamingConfig {
            memory_limit: Some(16 << 20),
            ..node_config(s.cache.path())
        },
        s.location.clone(),
    )
    .unwrap();
    for shuffle in [false, true] {
        // Every sample asked for, the first epoch straight from the server.
        let wanted = Arc::new(AtomicBool::new(false));
        let mut stream = ds.stream(plan(shuffle)).unwrap();
        stream.defer_on_demand(Arc::clone(&wanted), MIN_BYTES);
        let got = drain(stream, &wanted, spec.sample_bytes, MIN_BYTES, |_| true);
        assert_eq!(got.samples.len() as u64, spec.samples, "shuffle={shuffle}");
        assert!(got.deferred > 0, "shuffle={shuffle}");
        let mut seen: Vec<u64> = got.samples.iter().map(|(i, ..)| *i).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..spec.samples).collect::<Vec<_>>());
        // The cached epoch, read by the plain iterator, is the same sequence.
        assert_eq!(
            got.samples,
            reference(&ds, plan(shuffle)),
            "shuffle={shuffle}"
        );
    }
    assert!(
        ds.metrics().fetch_bytes > 0,
        "the shards came from the server"
    );
}

#[test]
fn a_deferred_read_of_a_cut_shard_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_dataset(dir.path(), &large(6));
    let ds = StreamingDataset::open(in_place(dir.path(), cache.path())).unwrap();
    let wanted = Arc::new(AtomicBool::new(true));
    let mut stream = ds.stream(plan(false)).unwrap();
    stream.defer_on_demand(Arc::clone(&wanted), MIN_BYTES);
    let deferred = match stream.next_item().unwrap().unwrap() {
        StreamItem::Deferred(d) => d,
        StreamItem::Read(_) => panic!("the first sample was asked for"),
    };
    // The shard loses its end after the stream located the sample.
    let shard = dir.path().join("shard.00000.mds");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len / 8)
        .unwrap();
    let err = deferred.read().unwrap_err().to_string();
    assert!(err.contains("shard.00000.mds"), "{err}");
}
