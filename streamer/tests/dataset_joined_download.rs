//! Processes of one node share a shard's download while it arrives, against a real moto S3
//! server. The first process to miss a shard downloads it; another that wants the same shard
//! reads the bytes already written to the download's temp file instead of waiting for the
//! commit, and finishes the download itself if the first process dies (of the same version of
//! the object: one replaced in between is an error, not a mix). Stalled servers make
//! every step a condition, not a timing: the joiner's first samples must arrive while the
//! writer's body is held back, and without a request of its own.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use crate::common;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::child::{self, ChildSpec};
use common::outage::StallProxy;
use common::{
    check_sample, moto_with, node_config, payload, runtime, s3_location, write_dataset, Spec,
};
use shardstream_sharding::Value;
use shardstream_storage::testing::GateStore;
use shardstream_streamer::order::OrderConfig;
use shardstream_streamer::{StreamPlan, StreamedSample, StreamingConfig, StreamingDataset};

/// Long enough for a loaded machine; the waits end as soon as their condition holds.
const DEADLINE: Duration = Duration::from_secs(120);
const SAMPLE_BYTES: usize = 8 << 10;
const SAMPLES: u64 = 1000;

fn config(cache: &Path) -> StreamingConfig {
    StreamingConfig {
        memory_limit: Some(4 << 20),
        ..node_config(cache)
    }
}

fn one_shard() -> Spec {
    Spec {
        samples: SAMPLES,
        sample_bytes: SAMPLE_BYTES,
        shard_limit: 64 << 20,
        compression: None,
        hashes: false,
    }
}

fn in_order() -> StreamPlan {
    StreamPlan::single_process(OrderConfig::default(), 0)
}

/// Streams the epoch on a thread, sending each sample as it comes.
fn consume(ds: StreamingDataset) -> mpsc::Receiver<StreamedSample> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for item in ds.stream(in_order()).unwrap() {
            if tx.send(item.unwrap()).is_err() {
                return;
            }
        }
    });
    rx
}

/// Receives `n` samples (failing with `why` if they do not come).
fn take(rx: &mpsc::Receiver<StreamedSample>, n: usize, why: &str) -> Vec<StreamedSample> {
    (0..n)
        .map(|_| rx.recv_timeout(DEADLINE).expect(why))
        .collect()
}

fn check_all(got: &[StreamedSample]) {
    assert_eq!(got.len() as u64, SAMPLES);
    for (i, item) in got.iter().enumerate() {
        assert_eq!(item.index, i as u64);
        check_sample(item.index, &item.sample.decode().unwrap(), SAMPLE_BYTES);
    }
}

#[test]
fn a_second_process_reads_a_download_while_it_arrives() {
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_dataset(data.path(), &one_shard());
    let server = moto_with(data.path(), &rt);

    // The writer's GET of the shard is held back after its first 2 MiB.
    let plain = s3_location(&server.endpoint(), "ds");
    let gate = GateStore::new(Arc::clone(plain.store()), "shard.00000.mds", 2 << 20);
    let gated = {
        let gate = gate.clone();
        plain.clone().map_store(move |_| Arc::new(gate))
    };
    // Two datasets in one process have their own engines and cache handles: to the cache
    // they are two processes, coordinated only by its file locks.
    let writer = StreamingDataset::open_at(config(cache.path()), gated).unwrap();
    assert_eq!(writer.num_shards(), 1, "the test needs one large shard");
    let writer_rx = consume(writer.clone());
    let mut writer_got = take(&writer_rx, 100, "the writer's first samples");
    rt.block_on(async {
        tokio::time::timeout(DEADLINE, gate.wait_held(1))
            .await
            .expect("the download never reached the stalled part of the shard")
    });

    let joiner = StreamingDataset::open_at(config(cache.path()), plain).unwrap();
    let joiner_rx = consume(joiner.clone());
    let mut joiner_got = take(
        &joiner_rx,
        100,
        "a second process did not read the download while it arrived",
    );
    // Served from the writer's temp file: the writer's body is still held back, and the joiner
    // sent no request of its own.
    assert_eq!(gate.counts().released, 0);
    let m = joiner.metrics();
    assert_eq!(m.shards_joined, 1);
    assert_eq!(m.fetch_requests, 0, "the joiner fetched the shard itself");
    assert_eq!(
        writer.metrics().shards_fetched,
        0,
        "nothing is committed yet"
    );

    gate.open();
    writer_got.extend(take(&writer_rx, 900, "the writer's last samples"));
    joiner_got.extend(take(&joiner_rx, 900, "the joiner's last samples"));
    // The last sample can come before the download's commit; each stream's end waits for it.
    for rx in [&writer_rx, &joiner_rx] {
        assert!(
            matches!(
                rx.recv_timeout(DEADLINE),
                Err(mpsc::RecvTimeoutError::Disconnected)
            ),
            "the stream never ended"
        );
    }
    check_all(&writer_got);
    check_all(&joiner_got);
    let m = joiner.metrics();
    assert_eq!(m.fetch_requests, 0);
    assert_eq!(m.fetch_bytes, 0);
    assert_eq!(writer.metrics().shards_fetched, 1);
    // The streams' ends waited for the joined download: the writer committed it, and the
    // joiner's handle holds the committed file (no progress record left on it).
    let handle = joiner.shard(0).unwrap();
    assert!(handle.is_complete());
    assert_eq!(
        std::fs::metadata(handle.path()).unwrap().len(),
        handle.len()
    );
}

/// A child process part-way through the download of the dataset's one shard, alive and holding
/// its fetch lock: every connection of its stalls after 2 MiB of response.
struct StalledWriter {
    writer: std::process::Child,
    proxy: StallProxy,
    server: shardstream_storage::testing::MotoServer,
    cache: tempfile::TempDir,
    data: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

/// Starts a [`StalledWriter`] as the child of test `test`; returns once it has written part of
/// the shard.
fn stalled_writer(test: &str) -> StalledWriter {
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_dataset(data.path(), &one_shard());
    let server = moto_with(data.path(), &rt);
    let proxy = rt.block_on(StallProxy::start(server.addr(), 2 << 20));
    let spec = ChildSpec {
        endpoint: proxy.endpoint(),
        prefix: "ds".into(),
        cache_root: cache.path().to_path_buf(),
        processes: 1,
        rank: 0,
        memory_limit: 4 << 20,
        cache_limit: None,
        shuffle: false,
        sample_bytes: SAMPLE_BYTES,
        out: data.path().join("child.json"),
    };
    let mut writer = child::spawn(test, &spec);
    // Wait until the child has written part of the shard (its temp file is the only file in
    // tmp/, and grows past its first write).
    let tmp = cache.path().join("run").join("0").join("tmp");
    let started = Instant::now();
    loop {
        let written = std::fs::read_dir(&tmp)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .any(|m| m.len() > 0);
        if written {
            break;
        }
        if let Ok(Some(status)) = writer.try_wait() {
            panic!("the child exited ({status}) before its download started");
        }
        assert!(started.elapsed() < DEADLINE, "the child never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    StalledWriter {
        writer,
        proxy,
        server,
        cache,
        data,
        rt,
    }
}

#[test]
fn a_download_abandoned_by_a_killed_process_is_finished_by_the_one_reading_it() {
    if child::run_child() {
        return;
    }
    let mut w = stalled_writer(
        "a_download_abandoned_by_a_killed_process_is_finished_by_the_one_reading_it",
    );
    let joiner = StreamingDataset::open_at(
        config(w.cache.path()),
        s3_location(&w.server.endpoint(), "ds"),
    )
    .unwrap();
    let rx = consume(joiner.clone());
    let mut got = take(
        &rx,
        100,
        "a second process did not read the download while it arrived",
    );
    assert_eq!(joiner.metrics().shards_joined, 1);
    assert_eq!(joiner.metrics().fetch_requests, 0);

    w.writer.kill().unwrap();
    w.writer.wait().unwrap();
    got.extend(take(
        &rx,
        900,
        "the joiner did not finish the abandoned download",
    ));
    check_all(&got);
    // It fetched only what the dead process had not written.
    let m = joiner.metrics();
    assert!(m.fetch_requests >= 1);
    assert!(
        m.fetch_bytes > 0 && m.fetch_bytes < 8_192_000,
        "fetched {} bytes: the download was not resumed where it stopped",
        m.fetch_bytes
    );
    assert_eq!(m.fetch_retries, 1);
    drop(w.proxy);
}

#[test]
fn an_abandoned_download_of_a_since_replaced_object_is_an_error_not_a_mix() {
    if child::run_child() {
        return;
    }
    let mut w =
        stalled_writer("an_abandoned_download_of_a_since_replaced_object_is_an_error_not_a_mix");
    let joiner = StreamingDataset::open_at(
        config(w.cache.path()),
        s3_location(&w.server.endpoint(), "ds"),
    )
    .unwrap();
    let (tx, rx) = mpsc::channel();
    {
        let joiner = joiner.clone();
        std::thread::spawn(move || {
            for item in joiner.stream(in_order()).unwrap() {
                let failed = item.is_err();
                if tx.send(item.map_err(|e| e.to_string())).is_err() || failed {
                    return;
                }
            }
        });
    }
    let recv = |why: &str| rx.recv_timeout(DEADLINE).expect(why);
    for i in 0..100 {
        let item = recv("a second process did not read the download while it arrived").unwrap();
        assert_eq!(item.index, i);
    }
    // The object is replaced by one of the same size whose last sample differs (the writer
    // got 2 MiB of the old one, so the rest must come from the server), then the writer dies.
    let name = "shard.00000.mds";
    let mut bytes = std::fs::read(w.data.path().join(name)).unwrap();
    let near_end = bytes.len() - 100;
    bytes[near_end] ^= 0x5a;
    let location = s3_location(&w.server.endpoint(), "ds");
    w.rt.block_on(location.put(name, bytes.into())).unwrap();
    w.writer.kill().unwrap();
    w.writer.wait().unwrap();
    // Reading on gives the old version's samples while they last, then an error naming the
    // shard: before, the rest came from the new object and the last sample was the new one's.
    let err = loop {
        match recv("the joiner neither finished nor failed") {
            Ok(item) => check_sample(item.index, &item.sample.decode().unwrap(), SAMPLE_BYTES),
            Err(e) => break e,
        }
    };
    assert!(err.contains("changed"), "{err}");
    assert!(err.contains(name), "{err}");
    // The next open fetches the new version whole: every sample but the changed last one is
    // as before.
    let fresh = StreamingDataset::open_at(config(w.cache.path()), location).unwrap();
    let got: Vec<StreamedSample> = fresh
        .stream(in_order())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(got.len() as u64, SAMPLES);
    let (last, rest) = got.split_last().unwrap();
    for item in rest {
        check_sample(item.index, &item.sample.decode().unwrap(), SAMPLE_BYTES);
    }
    let data = last.sample.decode().unwrap().get("data").cloned();
    assert!(
        data != Some(Value::Bytes(payload(SAMPLES - 1, SAMPLE_BYTES))),
        "the last sample is the old object's"
    );
    drop(w.proxy);
}
