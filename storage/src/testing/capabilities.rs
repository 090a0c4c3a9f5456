//! [`Capabilities`]: what a store does with each kind of request, found by trying it.
//!
//! The conformance suite probes every server and asserts the result against the table in
//! `docs/storage.md` ("Backends tested"), so a server that gains or loses a feature fails the
//! suite until the table (and the code relying on it) is updated: a missing feature is
//! detected and written down, never skipped silently.

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};

use crate::location::{Location, PutOutcome};

/// What a store did when each feature was tried once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// A plain `put` succeeds.
    pub put: bool,
    /// A multipart upload (two parts of 5 MiB and a tail) completes and reads back whole.
    pub multipart: bool,
    /// A second create-only put (`If-None-Match: *`, GCS `ifGenerationMatch=0`) of an existing
    /// object is refused. When `false`, the store overwrote it (or refused the first one too).
    pub conditional_put: bool,
    /// Racing create-only puts of one key had exactly one winner in every round tried (8
    /// rounds of 6 writers). A store can refuse a second create-only put made after the first
    /// and still let racing ones through (it checks, then writes): `conditional_put` yes,
    /// `atomic_create` no. Only a `false` is certain: a store that races rarely may pass.
    pub atomic_create: bool,
    /// A ranged GET returns exactly the range.
    pub range_get: bool,
    /// A server-side copy succeeds.
    pub copy: bool,
    /// A delete makes the object disappear.
    pub delete: bool,
}

impl std::fmt::Display for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let yes = |b: bool| if b { "yes" } else { "no" };
        write!(
            f,
            "put {} | multipart {} | conditional put {} | atomic create {} | range GET {} | \
             copy {} | delete {}",
            yes(self.put),
            yes(self.multipart),
            yes(self.conditional_put),
            yes(self.atomic_create),
            yes(self.range_get),
            yes(self.copy),
            yes(self.delete)
        )
    }
}

/// Tries each feature once under `loc`'s `_probe/` (which must be empty) and says which
/// worked. `plant` puts an object by other means when the store's own put does not work (it
/// receives the key relative to `loc` and the bytes), so the read-side probes still run.
pub async fn probe<F, Fut>(loc: &Location, plant: F) -> Capabilities
where
    F: Fn(String, Bytes) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut caps = Capabilities::default();
    let body = Bytes::from((0..=255u8).cycle().take(4096).collect::<Vec<u8>>());

    caps.put = loc.put("_probe/plain", body.clone()).await.is_ok();
    if !caps.put {
        plant("_probe/plain".to_string(), body.clone()).await;
    }
    caps.range_get = matches!(
        loc.get_range("_probe/plain", 100..300).await,
        Ok(b) if b == body.slice(100..300)
    );

    let big = Bytes::from(vec![7u8; 11 << 20]);
    caps.multipart = match loc.path("_probe/multipart") {
        Ok(path) => {
            let mut upload = match loc.store().put_multipart(&path).await {
                Ok(u) => Some(u),
                Err(e) => {
                    tracing::info!(error = %e, "multipart upload refused at start");
                    None
                }
            };
            let mut ok = upload.is_some();
            if let Some(up) = upload.as_mut() {
                for part in [
                    big.slice(..5 << 20),
                    big.slice(5 << 20..10 << 20),
                    big.slice(10 << 20..),
                ] {
                    ok &= up.put_part(PutPayload::from(part)).await.is_ok();
                }
                ok &= up.complete().await.is_ok();
            }
            ok && matches!(loc.get("_probe/multipart").await, Ok(b) if b == big)
        }
        Err(_) => false,
    };

    let first = loc.put_if_absent("_probe/create-only", body.clone()).await;
    let second = loc
        .put_if_absent("_probe/create-only", Bytes::from_static(b"other"))
        .await;
    caps.conditional_put = matches!(
        (first, second),
        (Ok(PutOutcome::Created), Ok(PutOutcome::AlreadyExists))
    );

    caps.atomic_create = caps.conditional_put && racing_creates_have_one_winner(loc).await;

    caps.copy = loc.copy("_probe/plain", "_probe/copied").await.is_ok()
        && matches!(loc.get("_probe/copied").await, Ok(b) if b == body);

    caps.delete = loc.delete("_probe/plain").await.is_ok()
        && matches!(loc.exists("_probe/plain").await, Ok(false));

    for key in ["_probe/multipart", "_probe/create-only", "_probe/copied"] {
        let _ = loc.delete(key).await;
    }
    caps
}

/// Rounds of racing create-only puts in [`probe`], and writers in each.
const RACE_ROUNDS: usize = 8;
const RACE_WRITERS: usize = 6;

async fn racing_creates_have_one_winner(loc: &Location) -> bool {
    let mut atomic = true;
    for round in 0..RACE_ROUNDS {
        let key = format!("_probe/race-{round}");
        let puts =
            (0..RACE_WRITERS).map(|i| loc.put_if_absent(&key, Bytes::from(vec![i as u8; 1000])));
        let outcomes = futures::future::join_all(puts).await;
        let created = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(PutOutcome::Created)))
            .count();
        tracing::info!(round, created, "racing create-only puts");
        atomic &= created == 1;
        let _ = loc.delete(&key).await;
    }
    atomic
}
