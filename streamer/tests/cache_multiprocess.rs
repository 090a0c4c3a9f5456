//! The cache across real processes: each test re-runs this test binary as child processes (the
//! child role is picked by an environment variable), which share one cache folder the way the
//! ranks and DataLoader workers of a node do.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers and child roles outside #[test] fns

use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardstream_streamer::cache::{Cache, CacheConfig, CacheError, LeaseOrigin, ShardSpec};

const ROLE: &str = "SHARDSTREAM_CACHE_TEST_ROLE";
const DIR: &str = "SHARDSTREAM_CACHE_TEST_DIR";
const LIMIT: &str = "SHARDSTREAM_CACHE_TEST_LIMIT";
const READY: &str = "CHILD-READY";
const SHARD: u64 = 256 * 1024;

fn body(key: &str) -> Vec<u8> {
    let seed = key
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..SHARD)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

fn spec(key: &str) -> ShardSpec {
    ShardSpec::new(key, SHARD)
}

/// A fetch that logs one line per call to `<counts>/<key>` (O_APPEND: lines from many
/// processes never interleave) and writes the shard.
fn counted_fetch<'a>(
    counts: &'a Path,
    key: &'a str,
) -> impl FnOnce(&Path) -> std::io::Result<u64> + 'a {
    move |tmp| {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(counts.join(key))?;
        writeln!(log, "{}", std::process::id())?;
        fs::write(tmp, body(key))?;
        Ok(SHARD)
    }
}

fn fetch_count(counts: &Path, key: &str) -> usize {
    fs::read_to_string(counts.join(key))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn open_env() -> (PathBuf, Cache) {
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let limit = std::env::var(LIMIT).unwrap().parse().unwrap();
    let config = CacheConfig {
        space_wait: Duration::from_secs(20),
        ..CacheConfig::new(limit)
    };
    let cache = Cache::open(dir.join("cache"), config).unwrap();
    (dir, cache)
}

fn ready() {
    println!("{READY}");
    std::io::stdout().flush().unwrap();
}

/// Runs the child role named in the environment, if any; returns whether this is a child.
fn child_role() -> bool {
    let Ok(role) = std::env::var(ROLE) else {
        return false;
    };
    let (dir, cache) = open_env();
    let counts = dir.join("counts");
    let arg = |name: &str| std::env::var(name).unwrap();
    match role.as_str() {
        // Threads acquire every key, each starting at another offset, and check the bytes.
        "acquire-all" => {
            let keys: usize = arg("KEYS").parse().unwrap();
            let offset: usize = arg("OFFSET").parse().unwrap();
            std::thread::scope(|s| {
                for t in 0..4 {
                    let (cache, counts) = (&cache, &counts);
                    s.spawn(move || {
                        for i in 0..keys {
                            let key = format!("shard-{:03}", (i + offset + t * 3) % keys);
                            let lease = cache
                                .acquire(&spec(&key), counted_fetch(counts, &key))
                                .unwrap();
                            assert_eq!(fs::read(lease.path()).unwrap(), body(&key));
                        }
                    });
                }
            });
        }
        // Writes half the shard, says so, and hangs inside the fetch until killed.
        "hang-in-fetch" => {
            let key = arg("KEY");
            let _ = cache.acquire(&spec(&key), |tmp| -> std::io::Result<u64> {
                let mut log = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(counts.join(&key))?;
                writeln!(log, "{}", std::process::id())?;
                fs::write(tmp, &body(&key)[..(SHARD / 2) as usize])?;
                ready();
                loop {
                    std::thread::park();
                }
            });
            unreachable!("the parent kills this process inside the fetch");
        }
        // Acquires one key (waiting for whoever fetches it) and checks the bytes.
        "acquire-one" => {
            let key = arg("KEY");
            let lease = cache
                .acquire(&spec(&key), counted_fetch(&counts, &key))
                .unwrap();
            assert_eq!(fs::read(lease.path()).unwrap(), body(&key));
            println!("origin={:?}", lease.origin());
        }
        // Holds leases on the given keys until killed.
        "hold" => {
            let _leases: Vec<_> = arg("KEYS")
                .split(',')
                .map(|k| cache.acquire(&spec(k), counted_fetch(&counts, k)).unwrap())
                .collect();
            ready();
            loop {
                std::thread::park();
            }
        }
        other => panic!("unknown child role {other}"),
    }
    true
}

/// Starts this test binary as a child running `test` in `role`.
fn spawn(test: &str, role: &str, dir: &Path, limit: u64, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .env(DIR, dir)
        .env(LIMIT, limit.to_string())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Reads the child's stdout up to its ready line (an event, not a timer).
fn wait_ready(child: &mut Child) {
    let out = child.stdout.as_mut().unwrap();
    let mut lines = BufReader::new(out).lines();
    loop {
        let line = lines
            .next()
            .expect("child exited before it was ready")
            .unwrap();
        // libtest prints "test NAME ... " without a newline before the test's own output.
        if line.ends_with(READY) {
            return;
        }
    }
}

fn finish(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child failed: {text}");
    text
}

/// Waits until `pid` is blocked on an `flock` (a `->` line in /proc/locks).
fn wait_blocked_on_lock(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let locks = fs::read_to_string("/proc/locks").unwrap();
        let blocked = locks.lines().any(|l| {
            let mut f = l.split_whitespace().skip(1);
            f.next() == Some("->") && f.nth(3) == Some(&pid.to_string())
        });
        if blocked {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} never blocked on the fetch lock"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("counts")).unwrap();
    dir
}

#[test]
fn each_shard_is_fetched_once_per_node_by_8_processes_of_4_threads() {
    if child_role() {
        return;
    }
    let dir = setup();
    let keys = 16;
    let children: Vec<_> = (0..8)
        .map(|p| {
            spawn(
                "each_shard_is_fetched_once_per_node_by_8_processes_of_4_threads",
                "acquire-all",
                dir.path(),
                1 << 30,
                &[("KEYS", keys.to_string()), ("OFFSET", (p * 5).to_string())],
            )
        })
        .collect();
    for c in children {
        finish(c);
    }
    for i in 0..keys {
        let key = format!("shard-{i:03}");
        assert_eq!(fetch_count(&dir.path().join("counts"), &key), 1, "{key}");
    }
}

#[test]
fn kill_9_mid_download_serves_no_partial_file_and_leaves_no_stale_lock() {
    const TEST: &str = "kill_9_mid_download_serves_no_partial_file_and_leaves_no_stale_lock";
    if child_role() {
        return;
    }
    let dir = setup();
    let counts = dir.path().join("counts");
    let key = || vec![("KEY", "k".to_string())];
    let limit = 1 << 30;

    // A process dies mid-fetch while another waits for the same shard: the waiter gets the
    // lock from the kernel and fetches it again, whole.
    let mut hanger = spawn(TEST, "hang-in-fetch", dir.path(), limit, &key());
    wait_ready(&mut hanger);
    let waiter = spawn(TEST, "acquire-one", dir.path(), limit, &key());
    wait_blocked_on_lock(waiter.id());
    hanger.kill().unwrap();
    hanger.wait().unwrap();
    assert!(finish(waiter).contains("origin=Fetched"));
    assert_eq!(fetch_count(&counts, "k"), 2);

    // A process dies mid-fetch with nobody waiting; a restart on the same folder finds no
    // partial file and no stale lock (a bounded lock wait proves it), and fetches once more.
    let mut hanger = spawn(
        TEST,
        "hang-in-fetch",
        dir.path(),
        limit,
        &[("KEY", "j".into())],
    );
    wait_ready(&mut hanger);
    hanger.kill().unwrap();
    hanger.wait().unwrap();
    let config = CacheConfig {
        lock_wait: Some(Duration::from_secs(5)),
        ..CacheConfig::new(limit)
    };
    let cache = Cache::open(dir.path().join("cache"), config).unwrap();
    assert!(
        fs::read_dir(cache.dir().join("tmp"))
            .unwrap()
            .next()
            .is_none(),
        "the dead download's temp file is removed at open"
    );
    let lease = cache
        .acquire(&spec("j"), counted_fetch(&counts, "j"))
        .unwrap();
    assert_eq!(lease.origin(), LeaseOrigin::Fetched);
    assert_eq!(fs::read(lease.path()).unwrap(), body("j"));
    assert_eq!(fetch_count(&counts, "j"), 2);
    let lease = cache
        .acquire(&spec("k"), counted_fetch(&counts, "k"))
        .unwrap();
    assert_eq!(lease.origin(), LeaseOrigin::Hit);
    assert_eq!(fetch_count(&counts, "k"), 2);
}

#[test]
fn disk_use_sampled_during_a_run_never_exceeds_the_limit() {
    const TEST: &str = "disk_use_sampled_during_a_run_never_exceeds_the_limit";
    if child_role() {
        return;
    }
    let dir = setup();
    let keys = 24;
    // Room for every process's 4 leases and 4 downloads at once, but not for the dataset.
    let limit = 12 * SHARD;
    let mut children: Vec<_> = (0..3)
        .map(|p| {
            spawn(
                TEST,
                "acquire-all",
                dir.path(),
                limit,
                &[("KEYS", keys.to_string()), ("OFFSET", (p * 7).to_string())],
            )
        })
        .collect();
    let cache = Cache::open(dir.path().join("cache"), CacheConfig::new(limit)).unwrap();
    let (mut samples, mut peak) = (0, 0);
    while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        let used = cache.usage().unwrap();
        assert!(used <= limit, "cache holds {used} bytes, limit {limit}");
        peak = peak.max(used);
        samples += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    for c in children {
        finish(c);
    }
    let fetched: usize = (0..keys)
        .map(|i| fetch_count(&dir.path().join("counts"), &format!("shard-{i:03}")))
        .sum();
    assert!(
        fetched > keys,
        "eviction must have forced refetches ({fetched} fetches)"
    );
    assert!(
        samples > 10 && peak > limit / 2,
        "{samples} samples, peak {peak}"
    );
    eprintln!(
        "{samples} samples, peak {peak} of {limit} bytes, {fetched} fetches of {keys} shards"
    );
}

#[test]
fn a_full_cache_is_a_clear_error_and_frees_when_the_holder_dies() {
    const TEST: &str = "a_full_cache_is_a_clear_error_and_frees_when_the_holder_dies";
    if child_role() {
        return;
    }
    let dir = setup();
    let limit = 2 * SHARD;
    let mut holder = spawn(TEST, "hold", dir.path(), limit, &[("KEYS", "a,b".into())]);
    wait_ready(&mut holder);
    let config = CacheConfig {
        space_wait: Duration::from_millis(300),
        ..CacheConfig::new(limit)
    };
    let cache = Cache::open(dir.path().join("cache"), config).unwrap();
    let counts = dir.path().join("counts");
    let start = Instant::now();
    let err = cache
        .acquire(&spec("c"), counted_fetch(&counts, "c"))
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        matches!(err, CacheError::LimitTooSmall { need: SHARD, limit: l, pinned } if l == limit && pinned == 2 * SHARD),
        "{err}"
    );
    assert!(err.to_string().contains("raise cache_limit"), "{err}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    // The kernel dropped the dead holder's pins: its shards are evictable now.
    let lease = cache
        .acquire(&spec("c"), counted_fetch(&counts, "c"))
        .unwrap();
    assert_eq!(fs::read(lease.path()).unwrap(), body("c"));
    assert_eq!(cache.metrics().snapshot().evictions, 1);
}
