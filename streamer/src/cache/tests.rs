//! In-process tests of the cache; the multi-process ones are in `tests/cache_*.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

const SHARD: u64 = 100;

fn config(limit: u64) -> CacheConfig {
    CacheConfig {
        space_wait: Duration::from_millis(50),
        ..CacheConfig::new(limit)
    }
}

fn body(key: &str) -> Vec<u8> {
    let seed = key
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..SHARD).map(|i| seed.wrapping_add(i as u8)).collect()
}

fn put(key: &str) -> impl FnOnce(&Path) -> std::io::Result<u64> + '_ {
    move |tmp| fs::write(tmp, body(key)).map(|()| SHARD)
}

fn spec(key: &str) -> ShardSpec {
    ShardSpec::new(key, SHARD)
}

#[test]
fn threads_of_one_process_fetch_a_shard_once() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    let fetches = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (cache, fetches) = (cache.clone(), fetches.clone());
            std::thread::spawn(move || {
                let lease = cache
                    .acquire(&spec("k"), |tmp| {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        put("k")(tmp)
                    })
                    .unwrap();
                assert_eq!(fs::read(lease.path()).unwrap(), body("k"));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    let m = cache.metrics().snapshot();
    assert_eq!((m.misses, m.hits, m.fetched_bytes), (1, 7, SHARD));
}

#[test]
fn eviction_takes_the_least_recently_used_shard() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), config(3 * SHARD)).unwrap();
    let mut paths = Vec::new();
    for key in ["a", "b", "c"] {
        paths.push(
            cache
                .acquire(&spec(key), put(key))
                .unwrap()
                .path()
                .to_path_buf(),
        );
    }
    let again = cache.acquire(&spec("a"), put("a")).unwrap();
    assert_eq!(again.origin(), LeaseOrigin::Hit);
    drop(again);
    cache.acquire(&spec("d"), put("d")).unwrap();
    assert!(paths[0].exists(), "a was used last-but-one");
    assert!(!paths[1].exists(), "b was the least recently used");
    assert!(paths[2].exists());
    assert_eq!(cache.usage().unwrap(), 3 * SHARD);
    assert_eq!(cache.metrics().snapshot().evictions, 1);
}

#[test]
fn pinned_shards_stay_and_a_full_cache_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), config(2 * SHARD)).unwrap();
    let a = cache.acquire(&spec("a"), put("a")).unwrap();
    let b = cache.acquire(&spec("b"), put("b")).unwrap();
    let start = Instant::now();
    let err = cache.acquire(&spec("c"), put("c")).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    match err {
        CacheError::LimitTooSmall {
            need,
            limit,
            pinned,
        } => assert_eq!((need, limit, pinned), (SHARD, 2 * SHARD, 2 * SHARD)),
        other => panic!("unexpected {other}"),
    }
    assert!(a.path().exists() && b.path().exists());
    drop(a);
    let c = cache.acquire(&spec("c"), put("c")).unwrap();
    assert!(b.path().exists() && c.path().exists());
    assert_eq!(cache.usage().unwrap(), 2 * SHARD);
}

#[test]
fn a_shard_or_window_larger_than_the_limit_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), CacheConfig::new(SHARD)).unwrap();
    let err = cache
        .acquire(&ShardSpec::new("big", SHARD + 1), put("big"))
        .unwrap_err();
    assert!(matches!(err, CacheError::LimitTooSmall { need, .. } if need == SHARD + 1));
    assert!(cache.check_fits(SHARD, 1).is_ok());
    let err = cache.check_fits(SHARD, 4).unwrap_err();
    assert!(
        err.to_string()
            .contains("need 400 bytes, limit is 100 bytes"),
        "{err}"
    );
}

#[test]
fn a_bad_download_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    let short = cache.acquire(&spec("k"), |tmp| fs::write(tmp, b"short").map(|()| 5));
    assert!(matches!(
        short,
        Err(CacheError::SizeMismatch { actual: 5, .. })
    ));
    let failed = cache.acquire(&spec("k"), |_| Err(std::io::Error::other("network down")));
    assert!(matches!(failed, Err(CacheError::Fetch { .. })));
    let hashed = spec("k").with_hash(
        shardstream_sharding::hashing::HashAlgorithm::Xxh64,
        "0000000000000000",
    );
    let wrong = cache.acquire(&hashed, put("k"));
    assert!(matches!(wrong, Err(CacheError::HashMismatch { .. })));
    assert!(list_names(&cache.inner.layout.tmp_dir())
        .unwrap()
        .is_empty());
    assert!(list_names(&cache.inner.layout.data_dir())
        .unwrap()
        .is_empty());
    let lease = cache.acquire(&spec("k"), put("k")).unwrap();
    assert_eq!(lease.origin(), LeaseOrigin::Fetched);
    assert_eq!(fs::read(lease.path()).unwrap(), body("k"));
}

#[test]
fn leftovers_of_a_crash_are_cleaned_and_the_shard_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(fs::canonicalize(dir.path()).unwrap());
    layout.create().unwrap();
    // A dead download (no process holds its fetch lock) and a record whose data an eviction
    // had already removed.
    let a = KeyId::of("a");
    fs::write(layout.tmp(&a, SHARD), b"half").unwrap();
    let b = KeyId::of("b");
    entry::write_record(&layout, &b, &entry::Record::new(&spec("b"), 1)).unwrap();
    let cache = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    assert!(list_names(&layout.tmp_dir()).unwrap().is_empty());
    assert!(!layout.record(&b).exists());
    let lease = cache.acquire(&spec("a"), put("a")).unwrap();
    assert_eq!(lease.origin(), LeaseOrigin::Fetched);
    assert_eq!(fs::read(lease.path()).unwrap(), body("a"));
}

#[test]
fn only_the_first_opener_draws_a_generation_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let first = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    let generation = first.generation();
    assert_ne!(generation, 0);
    // Leftovers that appear while the folder is open (a process that died under its other
    // users) are not a later opener's business: it neither walks the folder nor starts a
    // generation of its own, which would send every verified shard back to the hasher.
    let layout = first.inner.layout.clone();
    let dead = KeyId::of("dead");
    fs::write(layout.record_tmp(&dead), b"{").unwrap();
    let second = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    assert_eq!(second.generation(), generation);
    assert!(layout.record_tmp(&dead).exists());
    drop((first, second));
    // With nobody holding the folder, the next open is a restart: a new generation, and the
    // leftovers are gone before it returns.
    let third = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    assert_ne!(third.generation(), generation);
    assert_ne!(third.generation(), 0);
    assert!(!layout.record_tmp(&dead).exists());
}

#[test]
fn a_file_the_cache_did_not_write_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    let squatter = cache.inner.layout.data(&KeyId::of("k"));
    fs::write(&squatter, body("k")).unwrap();
    let err = cache.acquire(&spec("k"), put("k")).unwrap_err();
    assert!(matches!(err, CacheError::Foreign { ref path } if *path == squatter));
    assert_eq!(fs::read(&squatter).unwrap(), body("k"));
}

#[test]
fn local_sources_are_read_in_place_or_copied() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("shard.00000.mds");
    fs::write(&src, body("local")).unwrap();
    let cache = Cache::open(dir.path().join("cache"), config(10 * SHARD)).unwrap();
    let lease = cache.acquire_local(&src, SHARD, None).unwrap();
    assert_eq!(
        (lease.path(), lease.origin()),
        (src.as_path(), LeaseOrigin::InPlace)
    );
    assert_eq!(cache.usage().unwrap(), 0);
    assert!(matches!(
        cache.acquire_local(&src, SHARD + 1, None),
        Err(CacheError::SizeMismatch { .. })
    ));

    let copy = Cache::open(
        dir.path().join("copy"),
        CacheConfig {
            local_sources: LocalSources::Copy,
            ..config(10 * SHARD)
        },
    )
    .unwrap();
    let lease = copy.acquire_local(&src, SHARD, None).unwrap();
    assert_eq!(lease.origin(), LeaseOrigin::Fetched);
    assert!(lease.path().starts_with(copy.dir()));
    assert_eq!(fs::read(lease.path()).unwrap(), body("local"));
    assert_eq!(copy.usage().unwrap(), SHARD);
}

#[test]
fn begin_and_commit_let_a_caller_write_the_file_itself() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    let Begin::Fetch(guard) = cache.begin(&spec("k")).unwrap() else {
        panic!("empty cache cannot hit");
    };
    // The reservation counts before a byte is written.
    assert_eq!(cache.usage().unwrap(), SHARD);
    fs::write(guard.tmp_path(), body("k")).unwrap();
    let lease = guard.commit().unwrap();
    assert_eq!(fs::read(lease.path()).unwrap(), body("k"));
    assert!(matches!(cache.begin(&spec("k")).unwrap(), Begin::Hit(_)));
}

#[test]
fn a_damaged_copy_under_a_lease_is_replaced_without_waiting_for_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let always = CacheConfig {
        verify: VerifyMode::Always,
        ..config(10 * SHARD)
    };
    let cache = Cache::open(dir.path(), always).unwrap();
    let hashed = spec("a").with_hash(
        shardstream_sharding::hashing::HashAlgorithm::Xxh3_64,
        shardstream_sharding::hashing::hash_hex(
            shardstream_sharding::hashing::HashAlgorithm::Xxh3_64,
            &body("a"),
        ),
    );
    let held = cache.acquire(&hashed, put("a")).unwrap();
    let mut bad = body("a");
    bad[3] ^= 1;
    fs::write(held.path(), &bad).unwrap();
    // This thread holds a lease on the bad copy; waiting for it to go would never end.
    let fresh = cache.acquire(&hashed, put("a")).unwrap();
    assert_eq!(fresh.origin(), LeaseOrigin::Fetched);
    assert_eq!(fresh.path(), held.path());
    assert_eq!(fs::read(held.path()).unwrap(), body("a"));
    assert_eq!(cache.metrics().snapshot().corrupt, 1);
}

#[test]
fn a_ledger_left_too_high_by_a_crash_is_recounted_not_obeyed() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), config(3 * SHARD)).unwrap();
    cache.acquire(&spec("a"), put("a")).unwrap();
    // As if a process died between adding a commit to the ledger and its rename.
    let layout = &cache.inner.layout;
    fs::write(
        layout.ledger(),
        format!("{} {}\n", cache.generation(), 3 * SHARD),
    )
    .unwrap();
    cache.acquire(&spec("b"), put("b")).unwrap();
    assert_eq!(cache.metrics().snapshot().evictions, 0);
    assert_eq!(cache.usage().unwrap(), 2 * SHARD);
    // A ledger from an older generation is not trusted either.
    fs::write(layout.ledger(), "0 0\n").unwrap();
    cache.acquire(&spec("c"), put("c")).unwrap();
    cache.acquire(&spec("d"), put("d")).unwrap();
    assert_eq!(cache.usage().unwrap(), 3 * SHARD);
    assert_eq!(cache.metrics().snapshot().evictions, 1);
}

#[test]
fn a_shard_evicted_by_name_goes_unless_it_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path(), config(10 * SHARD)).unwrap();
    assert_eq!(cache.evict("a").unwrap(), Some(0)); // not in the folder
    let lease = cache.acquire(&spec("a"), put("a")).unwrap();
    assert!(cache.last_use("a").is_some());
    assert_eq!(cache.evict("a").unwrap(), None); // pinned by the lease
    assert_eq!(cache.usage().unwrap(), SHARD);
    drop(lease);
    assert_eq!(cache.evict("a").unwrap(), Some(SHARD));
    assert_eq!(cache.usage().unwrap(), 0);
    assert!(cache.last_use("a").is_none());
    assert_eq!(cache.metrics().snapshot().evictions, 1);
    // Fetched again on the next acquire.
    let again = cache.acquire(&spec("a"), put("a")).unwrap();
    assert_eq!(fs::read(again.path()).unwrap(), body("a"));
}
