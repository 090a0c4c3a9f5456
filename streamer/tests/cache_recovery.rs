//! The cache after a restart: damaged files are caught and fetched again, and files the cache
//! did not create survive eviction and recovery untouched. A "restart" here is dropping every
//! handle on the folder and opening it again, which starts a new cache generation exactly as a
//! new set of processes does.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers and child roles outside #[test] fns

use std::cell::Cell;
use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use shardstream_sharding::hashing::{hash_hex, HashAlgorithm};
use shardstream_streamer::cache::{Cache, CacheConfig, LeaseOrigin, ShardSpec, VerifyMode};

const SHARD: u64 = 64 * 1024;

fn body(key: &str) -> Vec<u8> {
    let seed = key
        .bytes()
        .fold(3u8, |a, b| a.wrapping_mul(17).wrapping_add(b));
    (0..SHARD)
        .map(|i| seed.wrapping_add((i % 241) as u8))
        .collect()
}

fn hashed(key: &str) -> ShardSpec {
    ShardSpec::new(key, SHARD).with_hash(
        HashAlgorithm::Xxh64,
        hash_hex(HashAlgorithm::Xxh64, &body(key)),
    )
}

fn config(verify: VerifyMode) -> CacheConfig {
    CacheConfig {
        verify,
        space_wait: Duration::from_millis(50),
        ..CacheConfig::new(4 * SHARD)
    }
}

/// Acquires `spec`, counting fetches in `fetches`.
fn get(
    cache: &Cache,
    spec: &ShardSpec,
    fetches: &Cell<usize>,
) -> (LeaseOrigin, std::path::PathBuf) {
    let lease = cache
        .acquire(spec, |tmp| {
            fetches.set(fetches.get() + 1);
            fs::write(tmp, body(&spec.key)).map(|()| SHARD)
        })
        .unwrap();
    assert_eq!(fs::read(lease.path()).unwrap(), body(&spec.key));
    (lease.origin(), lease.path().to_path_buf())
}

fn flip_byte(path: &Path, at: u64) {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut all = fs::read(path).unwrap();
    all[at as usize] ^= 0x40;
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&all[at as usize..=at as usize]).unwrap();
}

#[test]
fn a_flipped_byte_is_caught_after_a_restart_and_the_shard_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let fetches = Cell::new(0);
    let spec = hashed("a");
    let path = {
        let cache = Cache::open(dir.path(), config(VerifyMode::Hash)).unwrap();
        let (origin, path) = get(&cache, &spec, &fetches);
        assert_eq!(origin, LeaseOrigin::Fetched);
        // Within a generation a hit costs no hashing: the file was checked when written.
        let before = cache.metrics().snapshot().hashed_bytes;
        assert_eq!(get(&cache, &spec, &fetches).0, LeaseOrigin::Hit);
        assert_eq!(cache.metrics().snapshot().hashed_bytes, before);
        path
    };
    flip_byte(&path, SHARD / 2);

    let cache = Cache::open(dir.path(), config(VerifyMode::Hash)).unwrap();
    let (origin, again) = get(&cache, &spec, &fetches);
    assert_eq!((origin, again), (LeaseOrigin::Fetched, path));
    assert_eq!(fetches.get(), 2);
    let m = cache.metrics().snapshot();
    assert_eq!(m.corrupt, 1);
    // Once re-checked, later hits of this generation do not hash again.
    assert_eq!(get(&cache, &spec, &fetches).0, LeaseOrigin::Hit);
    assert_eq!(cache.metrics().snapshot().hashed_bytes, m.hashed_bytes);
    assert_eq!(fetches.get(), 2);
}

#[test]
fn a_good_file_is_hashed_once_after_a_restart_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let fetches = Cell::new(0);
    let spec = hashed("a");
    drop(get(
        &Cache::open(dir.path(), config(VerifyMode::Hash)).unwrap(),
        &spec,
        &fetches,
    ));
    let cache = Cache::open(dir.path(), config(VerifyMode::Hash)).unwrap();
    assert_eq!(get(&cache, &spec, &fetches).0, LeaseOrigin::Hit);
    assert_eq!(get(&cache, &spec, &fetches).0, LeaseOrigin::Hit);
    assert_eq!(fetches.get(), 1);
    assert_eq!(cache.metrics().snapshot().hashed_bytes, SHARD);
}

#[test]
fn a_truncated_file_is_caught_by_size_alone() {
    for verify in [VerifyMode::Size, VerifyMode::Hash, VerifyMode::Always] {
        let dir = tempfile::tempdir().unwrap();
        let fetches = Cell::new(0);
        let spec = ShardSpec::new("a", SHARD);
        let (_, path) = get(
            &Cache::open(dir.path(), config(verify)).unwrap(),
            &spec,
            &fetches,
        );
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(SHARD - 1)
            .unwrap();
        let cache = Cache::open(dir.path(), config(verify)).unwrap();
        assert_eq!(
            get(&cache, &spec, &fetches).0,
            LeaseOrigin::Fetched,
            "{verify:?}"
        );
        assert_eq!(fetches.get(), 2);
    }
}

#[test]
fn always_mode_catches_damage_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let fetches = Cell::new(0);
    let spec = hashed("a");
    let cache = Cache::open(dir.path(), config(VerifyMode::Always)).unwrap();
    let (_, path) = get(&cache, &spec, &fetches);
    flip_byte(&path, 0);
    assert_eq!(get(&cache, &spec, &fetches).0, LeaseOrigin::Fetched);
    assert_eq!(fetches.get(), 2);
}

#[test]
fn files_the_cache_did_not_create_survive_eviction_and_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let fetches = Cell::new(0);
    // Create the layout, then drop strangers into every folder of it.
    let cache = Cache::open(root, config(VerifyMode::Hash)).unwrap();
    let strangers = [
        root.join("notes.txt"),
        root.join("data").join("my-shard.mds"),
        root.join("data").join("0123456789abcdef0123456789abcdef"),
        root.join("tmp").join("download.partial"),
        root.join("entries").join("readme"),
        root.join("locks").join("other.lock"),
    ];
    for (i, path) in strangers.iter().enumerate() {
        fs::write(path, format!("stranger {i}")).unwrap();
    }
    let strangers_bytes: u64 = strangers[1..4]
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum();
    // Strangers in data/ and tmp/ count against the limit (the disk is the disk), but only
    // the cache's own shards are evicted.
    assert_eq!(cache.usage().unwrap(), strangers_bytes);
    for round in 0..3 {
        for i in 0..6 {
            get(&cache, &ShardSpec::new(format!("s{i}"), SHARD), &fetches);
        }
        cache.usage().unwrap();
        assert!(cache.metrics().snapshot().evictions > 0, "round {round}");
    }
    drop(cache);
    let cache = Cache::open(root, config(VerifyMode::Hash)).unwrap();
    assert!(cache.usage().unwrap() <= 4 * SHARD);
    for (i, path) in strangers.iter().enumerate() {
        assert_eq!(
            fs::read_to_string(path).unwrap(),
            format!("stranger {i}"),
            "{}",
            path.display()
        );
    }
}
