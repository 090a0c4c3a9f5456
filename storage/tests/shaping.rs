//! Request shaping against a store that throttles per prefix: the fault proxy plays S3's
//! per-prefix request limit (503 SlowDown past `LIMIT` requests per second) in front of moto,
//! and 16 concurrent readers of one prefix hammer it.
//!
//! - With shaping on, after a warm-up the requests that reach the proxy (forwarded and
//!   throttled together) settle near the limit, and almost none are throttled.
//! - With shaping off, the same readers send several times the limit and most of it is
//!   throttled (printed, for the record; not asserted, it depends on the machine's speed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shardstream_storage::shaping::ShapingConfig;
use shardstream_storage::testing::{options_for, test_env, FaultProxy, MotoServer, WindowCount};
use shardstream_storage::Location;

/// Requests per second the proxy forwards per prefix.
const LIMIT: u64 = 25;
const READERS: usize = 16;
const PHASE: Duration = Duration::from_secs(7);
const WARM_UP: u64 = 3;

struct Phase {
    ok: u64,
    failed: u64,
    /// (attempted, throttled) per whole second after the warm-up.
    seconds: Vec<(u64, u64)>,
}

async fn run_phase(proxy: &FaultProxy, shaping: ShapingConfig) -> Phase {
    let options = options_for(&proxy.endpoint()).with_shaping(shaping);
    let loc = Location::open_with("s3://test/root", &options, &test_env()).unwrap();
    let first = proxy.second();
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + PHASE;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let (loc, ok, failed) = (loc.clone(), Arc::clone(&ok), Arc::clone(&failed));
        readers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                match loc.get("obj").await {
                    Ok(b) if b.len() == 1024 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for r in readers {
        r.await.unwrap();
    }
    let last = proxy.second();
    let windows: Vec<WindowCount> = proxy
        .windows()
        .into_iter()
        .filter(|w| w.prefix == "/test/root/")
        .collect();
    let seconds = (first + WARM_UP..last)
        .map(|s| {
            windows
                .iter()
                .find(|w| w.second == s)
                .map_or((0, 0), |w| (w.forwarded + w.throttled, w.throttled))
        })
        .collect();
    Phase {
        ok: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        seconds,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shaping_settles_concurrent_readers_under_a_prefix_limit() {
    let moto = MotoServer::start()
        .await
        .unwrap_or_else(|e| panic!("S3 tests need moto_server: {e}"));
    moto.create_bucket("test").await.unwrap();
    let direct = Location::open_with(
        "s3://test/root",
        &options_for(&moto.endpoint()),
        &test_env(),
    )
    .unwrap();
    direct
        .put("obj", Bytes::from(vec![7u8; 1024]))
        .await
        .unwrap();
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    proxy.set_rate_limit(LIMIT);

    let on = run_phase(
        &proxy,
        ShapingConfig {
            start_rate: 200.0,
            increase: 5.0,
            ..ShapingConfig::default()
        },
    )
    .await;
    let off = run_phase(
        &proxy,
        ShapingConfig {
            enabled: false,
            ..ShapingConfig::default()
        },
    )
    .await;
    eprintln!(
        "limit {LIMIT}/s; (attempted, throttled) per second after {WARM_UP} s:\n  \
         shaping on:  {:?} ok {} failed {}\n  shaping off: {:?} ok {} failed {}",
        on.seconds, on.ok, on.failed, off.seconds, off.ok, off.failed
    );
    assert!(!on.seconds.is_empty());
    let attempted: u64 = on.seconds.iter().map(|s| s.0).sum();
    let throttled: u64 = on.seconds.iter().map(|s| s.1).sum();
    let mean = attempted as f64 / on.seconds.len() as f64;
    assert!(
        mean <= LIMIT as f64 * 1.3,
        "shaped attempts average {mean:.1}/s over a limit of {LIMIT}/s: {:?}",
        on.seconds
    );
    assert!(
        throttled * 5 <= attempted,
        "over a fifth of the shaped attempts throttled: {:?}",
        on.seconds
    );
    // On an idle machine no shaped read gives up; on a loaded one (CI's two cores running other
    // tests) a late timer can still spend a short retry budget now and then, so the bound is a
    // rate: at most 5 % of the shaped reads, where unshaped readers lose most of theirs.
    assert!(on.ok > 0);
    assert!(
        on.failed * 20 <= on.ok,
        "{} of {} shaped reads gave up",
        on.failed,
        on.ok + on.failed
    );
}
