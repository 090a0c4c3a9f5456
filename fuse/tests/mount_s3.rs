//! Real FUSE mounts (in this process, read through the kernel with `std::fs`) of an MDS dataset
//! on a moto S3 server on 127.0.0.1: every byte of both views equals the source (whole files,
//! random offsets, reads crossing a shard's end, concurrent readers), and a server outage gives
//! EIO after the storage layer's bounded retries, then reads work again; a cached shard is read
//! by the kernel itself (FUSE passthrough, no read reaches the daemon), and with passthrough off
//! every read goes through the daemon and gives the same bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shardstream_fuse::{DatasetFs, FsConfig, Mount, MountOptions, StreamingSource};
use shardstream_sharding::compression::Compression;
use shardstream_sharding::mds::{
    decode_stored_shard, Index, LocalDirSink, MdsWriter, MdsWriterOptions,
};
use shardstream_sharding::{Sample, Value};
use shardstream_storage::testing::{options_for, test_env, FaultProxy, MotoServer};
use shardstream_storage::Location;
use shardstream_streamer::dataset::{StreamingConfig, StreamingDataset};

const URL: &str = "s3://data/sets/files";

/// A small deterministic generator (xorshift64*), so failures replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Source {
    /// Relative path -> bytes, as the folder held them.
    files: BTreeMap<String, Vec<u8>>,
    index: Index,
    /// Decompressed bytes of each shard.
    raw: Vec<Vec<u8>>,
}

/// Writes a folder-style dataset (`path`, `data`) with zstd shards into `dir`.
fn write_dataset(dir: &Path, n: usize, shard_size: u64) -> Source {
    let mut rng = Rng(0x5eed_1234);
    let mut files = BTreeMap::new();
    for i in 0..n {
        let class = ["a", "b/c", "d"][i % 3];
        let len = 1 + rng.below(20_000) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        files.insert(format!("{class}/{i:05}.bin"), data);
    }
    let options = MdsWriterOptions {
        compression: Some(Compression::parse("zstd").unwrap()),
        size_limit: Some(shard_size),
        threads: 0,
        ..MdsWriterOptions::default()
    };
    let cols = [
        ("path".to_string(), "str".to_string()),
        ("data".into(), "bytes".into()),
    ];
    let mut writer =
        MdsWriter::new(&cols, options, Arc::new(LocalDirSink::new(dir).unwrap())).unwrap();
    for (p, d) in &files {
        let mut s = Sample::new();
        s.insert("path".into(), Value::Str(p.clone()));
        s.insert("data".into(), Value::Bytes(d.clone()));
        writer.write(&s).unwrap();
    }
    let index = writer.finish().unwrap();
    let raw = index
        .shards
        .iter()
        .map(|info| {
            let zip = info.zip_data.as_ref().unwrap();
            let stored = std::fs::read(dir.join(&zip.basename)).unwrap();
            decode_stored_shard(&zip.basename, info, stored, true, true).unwrap()
        })
        .collect();
    Source { files, index, raw }
}

struct Fixture {
    // Field order is drop order: unmount before the server and the folders go.
    mount: Option<Mount>,
    proxy: FaultProxy,
    _server: MotoServer,
    rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    source: Source,
}

impl Fixture {
    /// Uploads a dataset to moto; the mount will reach it through a fault proxy.
    fn start(n: usize, shard_size: u64) -> Fixture {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = rt.block_on(MotoServer::start()).unwrap();
        rt.block_on(server.create_bucket("data")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("local");
        let source = write_dataset(&local, n, shard_size);
        let location = server.open(URL).unwrap();
        for entry in std::fs::read_dir(&local).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let bytes = Bytes::from(std::fs::read(entry.path()).unwrap());
            rt.block_on(location.put(&name, bytes)).unwrap();
        }
        let proxy = rt.block_on(FaultProxy::start(server.addr())).unwrap();
        Fixture {
            mount: None,
            proxy,
            _server: server,
            rt,
            dir,
            source,
        }
    }

    fn mountpoint(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn mount(&mut self, config: FsConfig) -> PathBuf {
        self.mount_with(config, &MountOptions::default())
    }

    fn mount_with(&mut self, config: FsConfig, options: &MountOptions) -> PathBuf {
        let location =
            Location::open_with(URL, &options_for(&self.proxy.endpoint()), &test_env()).unwrap();
        let dataset = StreamingDataset::open_at(
            StreamingConfig {
                remote: URL.into(),
                local: Some(self.dir.path().join("cache")),
                ..StreamingConfig::default()
            },
            location,
        )
        .unwrap();
        let fs = DatasetFs::new(
            Arc::new(StreamingSource::new(dataset, None).unwrap()),
            config,
        )
        .unwrap();
        let mnt = self.mountpoint();
        std::fs::create_dir_all(&mnt).unwrap();
        self.mount = Some(shardstream_fuse::mount(fs, &mnt, options).unwrap());
        mnt
    }

    fn stats(&self) -> &shardstream_fuse::MountStats {
        self.mount.as_ref().unwrap().stats()
    }
}

fn walk(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                assert_eq!(
                    entry.metadata().unwrap().len(),
                    std::fs::read(&path).unwrap().len() as u64,
                    "{rel}: stat size and bytes read differ"
                );
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// `n` random positioned reads of `file`, each compared with `want`; some start near the end so
/// that they cross it.
fn random_reads(file: &File, want: &[u8], rng: &mut Rng, n: usize, what: &str) {
    let len = want.len() as u64;
    for _ in 0..n {
        let offset = if rng.below(4) == 0 {
            len.saturating_sub(rng.below(300))
        } else {
            rng.below(len + 1)
        };
        let size = 1 + rng.below(70_000) as usize;
        let mut buf = vec![0u8; size];
        let mut got = 0;
        while got < size {
            let k = file.read_at(&mut buf[got..], offset + got as u64).unwrap();
            if k == 0 {
                break;
            }
            got += k;
        }
        let end = (offset as usize + size).min(want.len());
        assert_eq!(
            &buf[..got],
            &want[offset as usize..end],
            "{what} at {offset}+{size}"
        );
    }
}

#[test]
fn every_byte_through_the_mount_equals_the_source() {
    let mut fx = Fixture::start(300, 256 << 10);
    let shards = fx.source.index.shards.len();
    assert!(shards >= 4, "want several shards, got {shards}");
    let mnt = fx.mount(FsConfig::default());

    // shards/: the index and each shard decompressed, whole and at random offsets.
    let index = std::fs::read(mnt.join("shards/index.json")).unwrap();
    assert_eq!(
        Index::from_json("mounted", &index).unwrap(),
        fx.source.index
    );
    let mut rng = Rng(7);
    for (info, raw) in fx.source.index.shards.iter().zip(&fx.source.raw) {
        let path = mnt.join("shards").join(&info.raw_data.basename);
        assert_eq!(
            &std::fs::read(&path).unwrap(),
            raw,
            "{}",
            info.raw_data.basename
        );
        random_reads(
            &File::open(&path).unwrap(),
            raw,
            &mut rng,
            40,
            &info.raw_data.basename,
        );
    }

    // samples/: the original relative paths with their bytes.
    assert_eq!(walk(&mnt.join("samples")), fx.source.files);

    // Many readers at once, both views, random files and offsets.
    let files: Vec<(PathBuf, Vec<u8>)> = fx
        .source
        .files
        .iter()
        .map(|(p, d)| (mnt.join("samples").join(p), d.clone()))
        .chain(
            fx.source
                .index
                .shards
                .iter()
                .zip(&fx.source.raw)
                .map(|(i, r)| (mnt.join("shards").join(&i.raw_data.basename), r.clone())),
        )
        .collect();
    let files = Arc::new(files);
    let readers: Vec<_> = (0..8)
        .map(|t| {
            let files = Arc::clone(&files);
            std::thread::spawn(move || {
                let mut rng = Rng(1000 + t);
                for _ in 0..60 {
                    let (path, want) = &files[rng.below(files.len() as u64) as usize];
                    let f = File::open(path).unwrap();
                    random_reads(&f, want, &mut rng, 5, &path.display().to_string());
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
}

#[test]
fn an_outage_gives_eio_after_bounded_retries_and_reads_work_again() {
    let mut fx = Fixture::start(60, 128 << 10);
    let timeout = Duration::from_secs(3);
    let mnt = fx.mount(FsConfig {
        max_readahead_shards: 0,
        fetch_timeout: Some(timeout),
        ..FsConfig::default()
    });
    let last = fx.source.index.shards.last().unwrap();
    let path = mnt.join("shards").join(&last.raw_data.basename);
    // The server answers 503 to every request: the fetch keeps retrying, and the reader gets
    // EIO at the mount's fetch deadline instead of hanging.
    fx.proxy.fail_next(usize::MAX / 2);
    let started = Instant::now();
    let err = std::fs::read(&path).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(fx.proxy.failed() > 1, "the fetch was retried");
    assert!(waited >= timeout, "EIO before the deadline: {waited:?}");
    // The kernel may split one read() into several FUSE reads, each waiting on the same fetch.
    assert!(waited < timeout * 4, "EIO took {waited:?}");
    // The server is back: the fetch still retrying in the background (backoff up to 5 s)
    // succeeds, and the same file reads whole.
    fx.proxy.fail_next(0);
    let raw = fx.source.raw.last().unwrap();
    let back = Instant::now();
    let bytes = loop {
        match std::fs::read(&path) {
            Ok(b) => break b,
            Err(e) if e.raw_os_error() == Some(libc::EIO) && back.elapsed() < timeout * 10 => {}
            Err(e) => panic!("no recovery after {:?}: {e}", back.elapsed()),
        }
    };
    assert_eq!(&bytes, raw);
    let _ = &fx.rt;
}

/// Waits (bounded) until the daemon has heard every close: it hears them a moment after
/// `close` returns, and a file's mode is chosen again only once all its opens are closed.
fn wait_all_closed(fx: &Fixture) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fx.stats().open_files() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} files still open",
            fx.stats().open_files()
        );
        std::thread::yield_now();
    }
}

/// Opens `path` until an open of it is a passthrough one (bounded): a shard counts as cached
/// once its download is committed, a moment after its last byte is readable.
fn wait_passthrough(fx: &Fixture, path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        wait_all_closed(fx);
        let before = fx.stats().passthrough_opens();
        drop(File::open(path).unwrap());
        if fx.stats().passthrough_opens() > before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never opened in passthrough",
            path.display()
        );
    }
}

/// Reads `path` whole and at random offsets, checking every byte against `want`.
fn check_file(path: &Path, want: &[u8], seed: u64) {
    assert_eq!(&std::fs::read(path).unwrap(), want, "{}", path.display());
    let mut rng = Rng(seed);
    random_reads(
        &File::open(path).unwrap(),
        want,
        &mut rng,
        20,
        &path.display().to_string(),
    );
}

#[test]
fn a_cached_shard_is_read_by_the_kernel_through_passthrough() {
    let mut fx = Fixture::start(120, 256 << 10);
    let mnt = fx.mount(FsConfig::default());
    // Needs Linux 6.9+ and CAP_SYS_ADMIN, as this test machine has: without them the mount
    // falls back to daemon reads, which the next test covers.
    assert!(fx.stats().passthrough(), "passthrough was not negotiated");
    let shards = fx.source.index.shards.clone();
    // First pass: cold; whichever mode each open gets, the bytes are the source's.
    for (i, (info, raw)) in shards.iter().zip(&fx.source.raw).enumerate() {
        check_file(
            &mnt.join("shards").join(&info.raw_data.basename),
            raw,
            i as u64,
        );
    }
    // Second pass: every shard is cached whole and every file of the first pass closed, so
    // every open is a passthrough one and the daemon sees no read at all.
    for info in &shards {
        wait_passthrough(&fx, &mnt.join("shards").join(&info.raw_data.basename));
    }
    let opens = fx.stats().passthrough_opens();
    let reads = fx.stats().daemon_reads();
    for (i, (info, raw)) in shards.iter().zip(&fx.source.raw).enumerate() {
        check_file(
            &mnt.join("shards").join(&info.raw_data.basename),
            raw,
            100 + i as u64,
        );
    }
    assert_eq!(
        fx.stats().daemon_reads(),
        reads,
        "a warm shard read reached the daemon"
    );
    assert!(
        fx.stats().passthrough_opens() >= opens + 2 * shards.len() as u64,
        "{} passthrough opens after {opens}",
        fx.stats().passthrough_opens()
    );
    // Several readers of one shard at once share its backing file.
    let path = mnt.join("shards").join(&shards[0].raw_data.basename);
    let raw = Arc::new(fx.source.raw[0].clone());
    let readers: Vec<_> = (0..4)
        .map(|t| {
            let (path, raw) = (path.clone(), Arc::clone(&raw));
            std::thread::spawn(move || check_file(&path, &raw, 200 + t))
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(fx.stats().daemon_reads(), reads);
    // samples/ files are parts of shards: they are served by the daemon, and correct.
    assert_eq!(walk(&mnt.join("samples")), fx.source.files);
    assert!(fx.stats().daemon_reads() > reads);
}

#[test]
fn with_passthrough_off_every_read_goes_through_the_daemon() {
    let mut fx = Fixture::start(60, 128 << 10);
    let options = MountOptions {
        passthrough: false,
        ..MountOptions::default()
    };
    let mnt = fx.mount_with(FsConfig::default(), &options);
    assert!(!fx.stats().passthrough());
    let shards = fx.source.index.shards.clone();
    for pass in 0..2u64 {
        for (i, (info, raw)) in shards.iter().zip(&fx.source.raw).enumerate() {
            check_file(
                &mnt.join("shards").join(&info.raw_data.basename),
                raw,
                pass * 10 + i as u64,
            );
        }
    }
    assert_eq!(fx.stats().passthrough_opens(), 0);
    assert!(fx.stats().daemon_reads() > 0);
    assert_eq!(walk(&mnt.join("samples")), fx.source.files);
}

/// Regression: a shard opened while it downloads is read through the daemon; a second open of
/// it once complete, with the first still open, must not ask for passthrough (the kernel keeps
/// one mode per open file and answers such an open with EIO).
#[test]
fn a_shard_open_during_its_download_keeps_the_daemon_mode_until_closed() {
    let mut fx = Fixture::start(40, 256 << 10);
    let mnt = fx.mount(FsConfig {
        max_readahead_shards: 0,
        ..FsConfig::default()
    });
    assert!(fx.stats().passthrough());
    let info = fx.source.index.shards[0].clone();
    let raw = fx.source.raw[0].clone();
    let path = mnt.join("shards").join(&info.raw_data.basename);
    // A slow link: the shard's download outlasts the open, which returns once the header is in.
    fx.proxy.set_bandwidth(128 << 10);
    let first = File::open(&path).unwrap();
    let opens = fx.stats().passthrough_opens();
    assert_eq!(opens, 0, "opened in passthrough before its download ended");
    let mut got = vec![0u8; raw.len()];
    first.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, raw);
    fx.proxy.set_bandwidth(0);
    // Complete now, but `first` is still open: the daemon mode holds, and the open succeeds.
    check_file(&path, &raw, 1);
    assert_eq!(fx.stats().passthrough_opens(), 0);
    drop(first);
    // Every open closed: a later open is a passthrough one, with the same bytes.
    wait_passthrough(&fx, &path);
    let reads = fx.stats().daemon_reads();
    check_file(&path, &raw, 2);
    assert_eq!(fx.stats().daemon_reads(), reads);
}
