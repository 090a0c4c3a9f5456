//! `shardstream mount` as a real process with a real FUSE mount: the background daemon and its
//! ready file, SIGTERM, EROFS for every change, an ImageFolder tree walked through the mount as
//! torchvision's ImageFolder walks it, `kill -9` then `fusermount3 -u` and a new mount served
//! from the existing cache with the server gone (with and without FUSE passthrough), and peak RSS and cache usage within the
//! budgets while 8 readers read shards sequentially.
// The helpers are part of the tests: a failed set-up step panics with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use shardstream_storage::testing::MotoServer;

const READY_WAIT: Duration = Duration::from_secs(120);

/// Deterministic, incompressible bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub(crate) fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let want = path.to_str().unwrap();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(want))
}

pub(crate) fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// A foreground `shardstream mount` process; stopped (SIGTERM, then a lazy unmount) on drop.
pub(crate) struct Daemon {
    pub(crate) child: Option<Child>,
    mountpoint: PathBuf,
    pub(crate) ready: PathBuf,
}

impl Daemon {
    pub(crate) fn start(
        dataset: &str,
        mountpoint: &Path,
        cache: &Path,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Daemon {
        // A dead mount there (ENOTCONN) fails `create_dir_all` with EEXIST: the folder is there,
        // and `mount` clears the dead mount itself (mount_pod.rs).
        if let Err(e) = std::fs::create_dir_all(mountpoint) {
            assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        }
        let ready = mountpoint.with_extension("ready");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardstream"));
        cmd.args([
            "mount",
            dataset,
            s(mountpoint),
            "--foreground",
            "--ready-file",
            s(&ready),
        ])
        .args(["--cache-dir", s(cache)])
        .args(extra)
        .stdin(Stdio::null());
        for (k, _) in std::env::vars() {
            if k.starts_with("AWS_") || k.starts_with("SHARDSTREAM_CACHE") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().unwrap();
        let started = Instant::now();
        while !ready.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("mount exited before it was ready: {status}");
            }
            assert!(started.elapsed() < READY_WAIT, "mount not ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(is_mounted(mountpoint));
        Daemon {
            child: Some(child),
            mountpoint: mountpoint.to_path_buf(),
            ready,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGTERM; returns whether the process exited 0.
    pub(crate) fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        signal(child.id(), "-TERM");
        child.wait().unwrap().success()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
        if is_mounted(&self.mountpoint) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mountpoint)
                .status();
        }
    }
}

/// path -> bytes of every file below `root`.
fn tree_bytes(root: &Path) -> BTreeMap<String, Vec<u8>> {
    listing(root)
        .into_iter()
        .map(|rel| {
            let data = std::fs::read(root.join(&rel)).unwrap();
            (rel, data)
        })
        .collect()
}

/// torchvision's ImageFolder walk (find_classes + make_dataset), in plain Python: classes,
/// then (relative path, class index, sha256) for every image.
const IMAGEFOLDER_PY: &str = r#"
import hashlib, json, os, sys
IMG = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
def walk(root):
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for idx, c in enumerate(classes):
        for d, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for n in sorted(names):
                p = os.path.join(d, n)
                if n.lower().endswith(IMG):
                    with open(p, 'rb') as f:
                        digest = hashlib.sha256(f.read()).hexdigest()
                    out.append([os.path.relpath(p, root), idx, digest])
    return {'classes': classes, 'samples': out}
print(json.dumps([walk(sys.argv[1]), walk(sys.argv[2])]))
"#;

#[test]
fn imagefolder_tree_mounted_in_the_background_walks_like_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("train");
    let classes = ["cat", "dog", "fish"];
    for (c, class) in classes.iter().enumerate() {
        for i in 0..25 {
            let mut data = vec![0xFF, 0xD8, 0xFF, 0xE0];
            data.extend(noise((c * 100 + i) as u64, 500 + i * 97));
            let rel = if i % 5 == 0 {
                format!("{class}/nested/{i:04}.jpg")
            } else {
                format!("{class}/{i:04}.jpg")
            };
            write(&tree, &rel, &data);
        }
    }
    let dataset = dir.path().join("ds");
    run(&[
        "shard",
        s(&tree),
        s(&dataset),
        "--input-format",
        "imagefolder",
        "--shard-size",
        "16kb",
    ])
    .ok();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let ready = dir.path().join("mount.ready");
    // Background mode: returns once mounted, printing the daemon's pid.
    let out = run(&[
        "mount",
        s(&dataset),
        s(&mnt),
        "--cache-dir",
        s(&dir.path().join("cache")),
        "--ready-file",
        s(&ready),
    ])
    .ok();
    let pid: u32 = out.stdout.trim().parse().unwrap();
    let mut daemon = Daemon {
        child: None,
        mountpoint: mnt.clone(),
        ready: ready.clone(),
    };
    assert!(ready.exists() && is_mounted(&mnt));

    let samples = mnt.join("samples");
    assert_eq!(tree_bytes(&samples), tree_bytes(&tree));
    let walked: serde_json::Value =
        serde_json::from_str(&run_python(IMAGEFOLDER_PY, &[s(&tree), s(&samples)])).unwrap();
    assert_eq!(walked[0]["classes"], serde_json::json!(classes));
    assert_eq!(walked[0]["samples"].as_array().unwrap().len(), 75);
    assert_eq!(walked[0], walked[1]);

    // SIGTERM: the daemon unmounts, removes its ready file and exits.
    signal(pid, "-TERM");
    let started = Instant::now();
    while is_mounted(&mnt) || ready.exists() {
        assert!(
            started.elapsed() < READY_WAIT,
            "still mounted after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(daemon.stop());
}

#[test]
fn writes_renames_and_deletes_fail_with_erofs() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    files_tree(&input, 20, 300);
    let dataset = dir.path().join("ds");
    run(&["shard", s(&input), s(&dataset), "--shard-size", "2kb"]).ok();
    let mnt = dir.path().join("mnt");
    let mut daemon = Daemon::start(s(&dataset), &mnt, &dir.path().join("cache"), &[], &[]);
    let file = mnt.join("samples/f0001.bin");
    let shard = mnt.join("shards/index.json");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        std::fs::read(input.join("f0001.bin")).unwrap()
    );
    let erofs = |what: &str, r: std::io::Result<()>| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc_erofs()), "{what}: {e}");
    };
    erofs(
        "create",
        std::fs::File::create(mnt.join("samples/new")).map(drop),
    );
    erofs(
        "open for write",
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .map(drop),
    );
    erofs(
        "append",
        std::fs::OpenOptions::new()
            .append(true)
            .open(&shard)
            .map(drop),
    );
    erofs("rename", std::fs::rename(&file, mnt.join("samples/g.bin")));
    erofs(
        "rename across views",
        std::fs::rename(&file, mnt.join("shards/g.bin")),
    );
    erofs("unlink", std::fs::remove_file(&file));
    erofs("mkdir", std::fs::create_dir(mnt.join("samples/d")));
    erofs("rmdir", std::fs::remove_dir(mnt.join("samples/sub")));
    erofs("remove tree", std::fs::remove_dir_all(mnt.join("shards")));
    erofs("chmod", {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))
    });
    erofs(
        "symlink",
        std::os::unix::fs::symlink(&file, mnt.join("samples/l")),
    );
    erofs(
        "hard link",
        std::fs::hard_link(&file, mnt.join("samples/h")),
    );
    // Nothing changed.
    assert_eq!(tree_bytes(&mnt.join("samples")), tree_bytes(&input));
    assert!(daemon.stop());
}

fn libc_erofs() -> i32 {
    // EROFS is 30 on every Linux architecture.
    std::io::Error::from(std::io::ErrorKind::ReadOnlyFilesystem)
        .raw_os_error()
        .unwrap_or(30)
}

struct S3 {
    runtime: tokio::runtime::Runtime,
    server: Option<MotoServer>,
}

impl S3 {
    fn start() -> S3 {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let server = runtime.block_on(MotoServer::start()).unwrap();
        runtime.block_on(server.create_bucket("data")).unwrap();
        S3 {
            runtime,
            server: Some(server),
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.server.as_ref().unwrap().endpoint()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }
}

#[test]
fn after_kill_9_fusermount_unmounts_and_a_new_mount_serves_from_the_cache() {
    let mut s3 = S3::start();
    let env = s3.env();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    for i in 0..40 {
        write(
            &input,
            &format!("part{}/{i:03}.bin", i % 4),
            &noise(i, 3000 + i as usize * 211),
        );
    }
    let url = "s3://data/mounted";
    run_env(&["shard", s(&input), url, "--shard-size", "32kb"], &env).ok();
    let cache = dir.path().join("cache");
    let mnt = dir.path().join("mnt");
    let mut first = Daemon::start(url, &mnt, &cache, &[], &env);
    let want = tree_bytes(&input);
    assert_eq!(tree_bytes(&mnt.join("samples")), want);
    let shards_before = tree_bytes(&mnt.join("shards"));

    // kill -9: the mount is left dead (ENOTCONN) until someone unmounts it.
    signal(first.pid(), "-KILL");
    first.child.take().unwrap().wait().unwrap();
    let err = std::fs::read_dir(mnt.join("samples"))
        .map(drop)
        .unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(107),
        "ENOTCONN expected, got {err}"
    );
    let _ = std::fs::remove_file(&first.ready);
    let unmount = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        unmount.status.success(),
        "{}",
        String::from_utf8_lossy(&unmount.stderr)
    );
    assert!(!is_mounted(&mnt));

    // A new mount on the same cache, and one more beside it with `--no-passthrough` (every
    // read through the daemon); then the server goes away, and every byte still reads in both.
    let mut second = Daemon::start(url, &mnt, &cache, &[], &env);
    let mnt2 = dir.path().join("mnt2");
    let mut third = Daemon::start(url, &mnt2, &cache, &["--no-passthrough"], &env);
    drop(s3.server.take());
    for m in [&mnt, &mnt2] {
        assert_eq!(tree_bytes(&m.join("samples")), want);
        assert_eq!(tree_bytes(&m.join("shards")), shards_before);
    }
    assert!(second.stop());
    assert!(third.stop());
    assert!(!is_mounted(&mnt));
    assert!(!is_mounted(&mnt2));
    let _ = &s3.runtime;
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Bytes of the files under `dir`, each inode counted once: a shard renamed from the cache's
/// temp folder into its data folder while the walk runs is seen in both, and counting it
/// twice made the cache look one shard over its limit.
fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| ((m.dev(), m.ino()), m.len()))
        .collect::<std::collections::HashMap<_, _>>()
        .values()
        .sum()
}

#[test]
fn budgets_hold_with_8_concurrent_sequential_readers() {
    let s3 = S3::start();
    let env = s3.env();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    let shard_size: u64 = 1 << 20;
    // 48 files of about half a shard each: 24+ shards of incompressible bytes.
    for i in 0..48u64 {
        write(
            &input,
            &format!("{i:03}.bin"),
            &noise(i, (shard_size / 2) as usize - 4096),
        );
    }
    let url = "s3://data/budget";
    run_env(
        &[
            "shard",
            s(&input),
            url,
            "--shard-size",
            &shard_size.to_string(),
        ],
        &env,
    )
    .ok();
    let memory_limit: u64 = 8 << 20;
    let cache_limit: u64 = 24 << 20;
    let mnt = dir.path().join("mnt");
    let cache = dir.path().join("cache");
    let daemon = Daemon::start(
        url,
        &mnt,
        &cache,
        &[
            "--memory-limit",
            &memory_limit.to_string(),
            "--cache-limit",
            &cache_limit.to_string(),
        ],
        // As the background mode and docs/fuse.md set it: without a cap glibc gives each
        // serving thread its own arena, and freed read buffers stay resident in all of them.
        &[env.clone(), vec![("MALLOC_ARENA_MAX", "2".to_string())]].concat(),
    );
    let pid = daemon.pid();
    let shards: Vec<PathBuf> = listing(&mnt.join("shards"))
        .into_iter()
        .filter(|n| n.ends_with(".mds"))
        .map(|n| mnt.join("shards").join(n))
        .collect();
    assert!(shards.len() >= 16, "{} shards", shards.len());
    // Baseline: after the first fetch started the engine.
    std::fs::read(&shards[0]).unwrap();
    let base_kib = status_kib(pid, "VmRSS:");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let cache = cache.clone();
        std::thread::spawn(move || {
            let (mut peak_rss, mut peak_cache) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                peak_rss = peak_rss.max(status_kib(pid, "VmRSS:"));
                peak_cache = peak_cache.max(dir_bytes(&cache));
                std::thread::sleep(Duration::from_millis(5));
            }
            (peak_rss, peak_cache)
        })
    };
    let readers: Vec<_> = (0..8)
        .map(|r| {
            let shards = shards.clone();
            std::thread::spawn(move || {
                // Each reader goes through every shard from its own starting point, sequentially,
                // in 128 KiB reads.
                use std::io::Read;
                let mut total = 0u64;
                for k in 0..shards.len() {
                    let path = &shards[(r * 3 + k) % shards.len()];
                    let mut f = std::fs::File::open(path).unwrap();
                    let mut buf = vec![0u8; 128 << 10];
                    loop {
                        let n = f.read(&mut buf).unwrap();
                        if n == 0 {
                            break;
                        }
                        total += n as u64;
                    }
                }
                total
            })
        })
        .collect();
    let read: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (peak_rss_kib, peak_cache) = sampler.join().unwrap();
    let hwm_kib = status_kib(pid, "VmHWM:");
    let shard_bytes: u64 = shards
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(read, 8 * shard_bytes);
    // RAM: what the fetch engine's budget covers, plus, per fetch that can run at once (one
    // per FUSE serving thread and per read-ahead worker), one FUSE read buffer (max read 1 MiB)
    // and one streaming-decompression window, which is at most the shard's decompressed size.
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(2, 16) as u64;
    let fetches = threads + shardstream_fuse::readahead::MAX_WORKERS as u64;
    let max_shard = shards
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .max()
        .unwrap();
    let allowed_kib = base_kib + (memory_limit + fetches * ((1 << 20) + max_shard)) / 1024;
    eprintln!(
        "read {read} bytes; RSS base {base_kib} KiB, sampled peak {peak_rss_kib} KiB, VmHWM {hwm_kib} KiB, allowed {allowed_kib} KiB; cache peak {peak_cache} of {cache_limit}"
    );
    assert!(
        peak_rss_kib <= allowed_kib,
        "RSS {peak_rss_kib} KiB > {allowed_kib} KiB"
    );
    assert!(
        hwm_kib <= allowed_kib.max(base_kib),
        "VmHWM {hwm_kib} KiB > {allowed_kib} KiB"
    );
    // Disk: shard files in the cache folder never pass the cache limit (locks and records,
    // a few hundred bytes each, are not counted by the cache and are small here).
    let slack = 64 * 1024;
    assert!(
        peak_cache <= cache_limit + slack,
        "cache {peak_cache} > {cache_limit}"
    );
    drop(daemon);
}

#[test]
fn allow_other_reaches_the_kernel_mount_options() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    files_tree(&input, 5, 100);
    let dataset = dir.path().join("ds");
    run(&["shard", s(&input), s(&dataset)]).ok();
    let options = |mnt: &Path| -> Vec<String> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let line = mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == mnt.to_str())
            .unwrap()
            .to_string();
        line.split(' ')
            .nth(3)
            .unwrap()
            .split(',')
            .map(str::to_string)
            .collect()
    };
    let private = dir.path().join("private");
    let mut a = Daemon::start(s(&dataset), &private, &dir.path().join("c1"), &[], &[]);
    let shared = dir.path().join("shared");
    let mut b = Daemon::start(
        s(&dataset),
        &shared,
        &dir.path().join("c2"),
        &["--allow-other"],
        &[],
    );
    assert!(options(&private).contains(&"ro".to_string()));
    assert!(!options(&private).contains(&"allow_other".to_string()));
    assert!(
        options(&shared).contains(&"allow_other".to_string()),
        "{:?}",
        options(&shared)
    );
    assert!(a.stop() && b.stop());
}

#[test]
fn a_mount_run_alone_serves_its_own_metrics() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("files");
    for i in 0..20 {
        write(&tree, &format!("{i:03}.bin"), &noise(i, 3000));
    }
    let dataset = dir.path().join("ds");
    run(&["shard", s(&tree), s(&dataset), "--shard-size", "16kb"]).ok();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mnt = dir.path().join("mnt");
    let _daemon = Daemon::start(
        s(&dataset),
        &mnt,
        &dir.path().join("cache"),
        &["--metrics-addr", &addr],
        &[],
    );
    // Reading through the mount moves its counters.
    let walked = tree_bytes(&mnt.join("samples"));
    assert_eq!(walked, tree_bytes(&tree));
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    let value = |name: &str| -> f64 {
        reply
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {reply}"))
            .parse()
            .unwrap()
    };
    // Every shard the walk opened was a hit or a miss of the node cache.
    let opened = value("shardstream_cache_hits_total") + value("shardstream_cache_misses_total");
    assert!(opened > 0.0, "{reply}");
}
