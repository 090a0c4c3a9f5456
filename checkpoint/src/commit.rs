//! The coordinator's commit: check that every reported file is in the store with its size, then
//! create the manifest with a create-if-absent put. That put is the commit point: before it the
//! checkpoint does not exist for any reader, after it the checkpoint is complete. Root aliases
//! (DCP's `.metadata`) are copied in afterwards, so torch's own reader never sees an
//! uncommitted checkpoint either.
//!
//! Stores that ignore the condition. Some S3-compatible stores accept `If-None-Match: *` and
//! overwrite anyway; two coordinators committing one id would then both "win". Every commit
//! therefore reads the manifest back after its put and checks that it holds this save's
//! attempt (the attempt name carries 64 random bits: it is the commit's token); if not, it
//! fails with [`CheckpointError::ConditionalPutIgnored`]. Once per store and root, the first
//! commit also probes whether the store honours the condition (two create-only puts of one
//! probe key in the attempt directory). Where it does not, a commit reads the manifest before
//! its put (a committed id is never overwritten by a later save).
//!
//! A store can also pass the probe and still not make the condition atomic: moto's and
//! s3s-fs's servers check for the object and then write it, so two puts that both pass the check
//! are both told they created it (the conformance suite measured it: 1 round in 16 on moto, most
//! rounds on s3s-fs). Where the create is known to be atomic (a local directory, Amazon S3's own
//! endpoint: [`CheckpointRoot::create_is_atomic`]) the read-back follows the put at once.
//!
//! Elsewhere a racing commit is looked for before the read-back: one listing of the id's folder
//! (`LIST` with a delimiter) after our put has completed. A rival save writes its files into its
//! own attempt folder before it commits, so if no other attempt folder is listed, every rival's
//! first file landed after our put, and its check (the condition, or the read before an
//! unconditional put) comes later still and sees our manifest: the read-back follows at once.
//! If another attempt folder is listed (a racing save, or the leftovers of a dead one), the
//! commit waits before its read-back — [`ATOMIC_SETTLE`] where the store honours the condition,
//! [`SETTLE`] where it ignores it — so that a racing put issued before ours was visible has
//! landed by then: of racing commits exactly the last writer succeeds, the others get the
//! error. That holds as long as no commit takes longer than the wait from its check to its put's
//! completion; a commit that does warns, since a rival may already have reported success. A
//! listing that fails counts as a rival (the wait is the safe side).

use crate::error::{CheckpointError, Result};
use crate::layout::{is_attempt_name, join, now_unix_ms, step_from_id, validate_relative_path};
use crate::manifest::{Alias, FileRecord, Manifest, FORMAT_NAME, FORMAT_VERSION};
use crate::metrics::add;
use crate::rank::SaveAttempt;
use crate::CheckpointRoot;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use object_store::{ObjectStoreExt, PutMode, PutOptions};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, UNIX_EPOCH};
use tracing::{info, info_span, warn, Instrument};

/// HEAD requests in flight while checking files the attempt's listing did not confirm.
const HEAD_CONCURRENCY: usize = 64;

/// On a store that ignores `If-None-Match`, how long a commit waits between its manifest put
/// and the read-back that decides it (module docs). Commits are rare; seconds are cheap.
pub const SETTLE: Duration = Duration::from_secs(3);

/// On a store that honours `If-None-Match`, the wait before the read-back: a store whose
/// condition is a check followed by a write lets a racing put that passed its check land this
/// soon after ours (module docs). 0.5 s on a rare operation; none where the create is atomic.
pub const ATOMIC_SETTLE: Duration = Duration::from_millis(500);

/// The name, inside the attempt directory, of the object probed with two create-only puts.
const PROBE_NAME: &str = "_shardstream_conditional_put_probe";

/// Whether a store honours create-only puts, per store (by identity) and root, probed once
/// per process. A dropped store's entry is dead (its `Weak` no longer upgrades) and pruned.
type ProbeCache = Vec<(Weak<dyn ObjectStore>, Path, bool)>;
static PROBED: Mutex<ProbeCache> = Mutex::new(Vec::new());

/// What the coordinator commits.
#[derive(Debug, Clone, Default)]
pub struct CommitRequest {
    /// The records of every rank's files.
    pub records: Vec<FileRecord>,
    /// Number of ranks that saved.
    pub world_size: u32,
    /// Training step; when `None`, the id's trailing digits are used.
    pub step: Option<u64>,
    /// Free-form user metadata stored in the manifest.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Root-level names to publish as copies of attempt files after the commit, as
    /// `(name at the checkpoint root, file name inside the attempt)`, e.g.
    /// `(".metadata", ".metadata")`.
    pub aliases: Vec<(String, String)>,
}

fn invalid(id: &str, reason: String) -> CheckpointError {
    CheckpointError::InvalidCommit {
        id: id.to_owned(),
        reason,
    }
}

pub(crate) fn build_manifest(attempt: &SaveAttempt, req: CommitRequest) -> Result<Manifest> {
    let id = attempt.id();
    if req.world_size == 0 {
        return Err(invalid(id, "world_size is 0".into()));
    }
    if req.records.is_empty() {
        return Err(invalid(id, "no files to commit".into()));
    }
    let prefix = format!("{}/", attempt.attempt());
    let mut seen = HashSet::new();
    for r in &req.records {
        validate_relative_path(&r.path)?;
        if !r.path.starts_with(&prefix) {
            return Err(invalid(
                id,
                format!("{:?} is not in attempt {}", r.path, attempt.attempt()),
            ));
        }
        if !seen.insert(r.path.as_str()) {
            return Err(invalid(id, format!("{:?} reported twice", r.path)));
        }
    }
    let aliases = req
        .aliases
        .iter()
        .map(|(name, target)| {
            Ok(Alias {
                path: name.clone(),
                target: attempt.relative_path(target)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let created_unix_ms = now_unix_ms();
    let created =
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(created_unix_ms))
            .to_string();
    let mut records = req.records;
    records.sort_by(|a, b| a.path.cmp(&b.path));
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        checkpoint_id: id.to_owned(),
        attempt: attempt.attempt().to_owned(),
        step: req.step.or_else(|| step_from_id(id)),
        world_size: req.world_size,
        created_unix_ms,
        created,
        checksum: "crc32c".into(),
        files: records,
        aliases,
        metadata: req.metadata,
    };
    // Validates every record (ranks, part checksums) before anything touches the store.
    manifest.to_json().map_err(|e| match e {
        CheckpointError::InvalidManifest { reason, .. } => invalid(id, reason),
        other => other,
    })?;
    Ok(manifest)
}

impl CheckpointRoot {
    /// Commits a save: checks every file (listed or HEADed; size must match), then creates the
    /// manifest if absent, then publishes the aliases. Returns the manifest written.
    ///
    /// Errors: [`CheckpointError::MissingObject`] / [`CheckpointError::SizeMismatch`] naming
    /// the first bad file, [`CheckpointError::AlreadyCommitted`] when another save of the same
    /// id committed first (exactly one of two racing coordinators wins), and
    /// [`CheckpointError::ConditionalPutIgnored`] when the store ignored the create-only
    /// condition and another commit's manifest holds the id (module docs).
    pub async fn commit(&self, attempt: &SaveAttempt, req: CommitRequest) -> Result<Manifest> {
        let span =
            info_span!("checkpoint.commit", id = %attempt.id(), attempt = %attempt.attempt());
        let started = Instant::now();
        let manifest = self.commit_inner(attempt, req).instrument(span).await?;
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        add(&self.metrics().commit_nanos, took);
        Ok(manifest)
    }

    async fn commit_inner(&self, attempt: &SaveAttempt, req: CommitRequest) -> Result<Manifest> {
        let manifest = build_manifest(attempt, req)?;
        let dir = self.checkpoint_dir(attempt.id());
        self.check_files(&dir, attempt, &manifest.files).await?;
        let store = self.store();

        let body = manifest.to_json()?;
        let mpath = self.manifest_path(attempt.id());
        let honoured = self.conditional_put_honoured(attempt).await?;
        let checked = Instant::now();
        if !honoured {
            // Without the condition, a put would replace a committed manifest: look first.
            match self.read_manifest(attempt.id()).await {
                Ok(existing) if existing.attempt == manifest.attempt => {}
                Ok(_) | Err(CheckpointError::InvalidManifest { .. }) => {
                    add(&self.metrics().commit_conflicts, 1);
                    return Err(CheckpointError::AlreadyCommitted {
                        id: attempt.id().to_owned(),
                        path: mpath,
                    });
                }
                Err(CheckpointError::NotCommitted { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            match store.put_opts(&mpath, body.clone().into(), opts).await {
                Ok(_) => break,
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => {
                    // Either another save won, or our own put landed and a retry of it was
                    // refused, or (S3 409) a concurrent conditional put was in flight.
                    match self.read_manifest(attempt.id()).await {
                        Ok(existing) if existing.attempt == manifest.attempt => {
                            info!("manifest already written by this attempt");
                            break;
                        }
                        Ok(_) | Err(CheckpointError::InvalidManifest { .. }) => {
                            add(&self.metrics().commit_conflicts, 1);
                            return Err(CheckpointError::AlreadyCommitted {
                                id: attempt.id().to_owned(),
                                path: mpath,
                            });
                        }
                        Err(CheckpointError::NotCommitted { .. }) if tries < 3 => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(CheckpointError::store("put", &mpath, e)),
            }
        }
        let settle = if !honoured {
            Some(SETTLE)
        } else if !self.create_is_atomic() {
            Some(ATOMIC_SETTLE)
        } else {
            None
        };
        if let Some(settle) = settle {
            if self.rival_attempt_listed(attempt).await {
                let took = checked.elapsed();
                if took >= settle {
                    warn!(
                        took_ms = took.as_millis() as u64,
                        settle_ms = settle.as_millis() as u64,
                        "manifest put took longer than the settle window on a store whose \
                         create-only put is not atomic: a racing commit of this id may already \
                         have reported success"
                    );
                }
                info!(
                    settle_ms = settle.as_millis() as u64,
                    "another attempt of this id is in the store: settling before the read-back"
                );
                tokio::time::sleep(settle).await;
            }
        }
        self.verify_manifest(attempt, &manifest, &mpath).await?;
        add(&self.metrics().commits, 1);
        self.write_latest_pointer(&manifest).await;
        info!(
            files = manifest.files.len(),
            bytes = manifest.total_bytes(),
            "committed"
        );

        for alias in &manifest.aliases {
            let from = join(&dir, &alias.target);
            let to = join(&dir, &alias.path);
            if let Err(e) = store.copy(&from, &to).await {
                // The checkpoint is committed; a missing alias only hides it from torch's own
                // reader, and `publish_aliases` repairs it.
                warn!(alias = %to, error = %e, "publishing an alias failed");
                return Err(CheckpointError::store("copy", &to, e));
            }
        }
        Ok(manifest)
    }

    /// Checks that every reported file is in the store with its size. The attempt folder is
    /// listed (one request per 1,000 objects, where a HEAD per file would be 4,096 requests at
    /// 4,096 ranks from one process); a file the listing does not show with its size is
    /// HEADed, so that a listing that lags behind a store's writes, or one that fails, costs
    /// requests, not a wrong verdict. The errors name the file.
    async fn check_files(
        &self,
        dir: &Path,
        attempt: &SaveAttempt,
        files: &[FileRecord],
    ) -> Result<()> {
        let store = self.store();
        let folder = join(dir, attempt.attempt());
        let listed: HashMap<Path, u64> = match store
            .list(Some(&folder))
            .map_ok(|meta| (meta.location, meta.size))
            .try_collect()
            .await
        {
            Ok(listed) => listed,
            Err(e) => {
                warn!(folder = %folder, error = %e, "cannot list the attempt: checking each file with HEAD");
                HashMap::new()
            }
        };
        let unconfirmed: Vec<(Path, u64)> = files
            .iter()
            .map(|f| (join(dir, &f.path), f.size))
            .filter(|(path, size)| listed.get(path) != Some(size))
            .collect();
        futures::stream::iter(unconfirmed)
            .map(|(path, size)| async move {
                let meta = store
                    .head(&path)
                    .await
                    .map_err(|e| CheckpointError::store("head", &path, e))?;
                if meta.size != size {
                    return Err(CheckpointError::SizeMismatch {
                        path,
                        expected: size,
                        actual: meta.size,
                    });
                }
                Ok(())
            })
            .buffer_unordered(HEAD_CONCURRENCY)
            .try_collect::<()>()
            .await
    }

    /// Whether the id's folder holds an attempt folder other than `attempt`'s: a save that may
    /// be racing this commit (module docs). Called after the manifest put has completed. A
    /// listing that fails answers yes, so that the commit waits rather than trusts.
    async fn rival_attempt_listed(&self, attempt: &SaveAttempt) -> bool {
        let dir = self.checkpoint_dir(attempt.id());
        match self.store().list_with_delimiter(Some(&dir)).await {
            Ok(listing) => listing.common_prefixes.iter().any(|folder| {
                folder
                    .filename()
                    .is_some_and(|name| is_attempt_name(name) && name != attempt.attempt())
            }),
            Err(e) => {
                warn!(folder = %dir, error = %e, "cannot list the checkpoint's attempts");
                true
            }
        }
    }

    /// Reads the manifest back: it must be this attempt's. A store that honours create-only
    /// puts never fails this; one that ignores them fails it for every racing commit but the
    /// last writer's.
    async fn verify_manifest(
        &self,
        attempt: &SaveAttempt,
        ours: &Manifest,
        mpath: &Path,
    ) -> Result<()> {
        match self.read_manifest(attempt.id()).await {
            Ok(stored) if stored.attempt == ours.attempt => Ok(()),
            Ok(stored) => {
                add(&self.metrics().commit_conflicts, 1);
                warn!(
                    winner = %stored.attempt,
                    "the store ignored If-None-Match: another commit's manifest replaced ours"
                );
                Err(CheckpointError::ConditionalPutIgnored {
                    id: attempt.id().to_owned(),
                    path: mpath.clone(),
                    winner: stored.attempt,
                })
            }
            Err(CheckpointError::InvalidManifest { .. }) => {
                add(&self.metrics().commit_conflicts, 1);
                Err(CheckpointError::ConditionalPutIgnored {
                    id: attempt.id().to_owned(),
                    path: mpath.clone(),
                    winner: "(a manifest that does not read)".to_owned(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Whether this root's store honours create-only puts (`If-None-Match: *`), probed once per
    /// store and root in this process: two create-only puts of one key in the attempt
    /// directory; the second must be refused.
    pub async fn conditional_put_honoured(&self, attempt: &SaveAttempt) -> Result<bool> {
        if let Some(known) = self.probed() {
            return Ok(known);
        }
        let probe = join(
            &self.checkpoint_dir(attempt.id()),
            &format!("{}/{PROBE_NAME}", attempt.attempt()),
        );
        let create = || PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let store = self.store();
        let first = store
            .put_opts(&probe, bytes::Bytes::from_static(b"1").into(), create())
            .await;
        let honoured = match first {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {
                match store
                    .put_opts(&probe, bytes::Bytes::from_static(b"2").into(), create())
                    .await
                {
                    Ok(_) => false,
                    Err(object_store::Error::AlreadyExists { .. })
                    | Err(object_store::Error::Precondition { .. }) => true,
                    Err(e) => return Err(CheckpointError::store("put", &probe, e)),
                }
            }
            Err(e) => return Err(CheckpointError::store("put", &probe, e)),
        };
        if let Err(e) = store.delete(&probe).await {
            warn!(object = %probe, error = %e, "cannot delete the conditional-put probe");
        }
        if !honoured {
            warn!(
                root = %self.root(),
                settle_ms = SETTLE.as_millis() as u64,
                "this store ignores If-None-Match (create-only puts overwrite): commits check \
                 the manifest before their put and verify it after a settle window"
            );
        }
        if let Ok(mut cache) = PROBED.lock() {
            cache.retain(|(weak, _, _)| weak.strong_count() > 0);
            cache.push((Arc::downgrade(store), self.root().clone(), honoured));
        }
        Ok(honoured)
    }

    fn probed(&self) -> Option<bool> {
        let cache = PROBED.lock().ok()?;
        cache.iter().find_map(|(weak, root, honoured)| {
            let live = weak.upgrade()?;
            (Arc::ptr_eq(&live, self.store()) && root == self.root()).then_some(*honoured)
        })
    }

    /// Copies every alias of a committed checkpoint into place again (repairs a crash between
    /// the manifest put and the alias copies).
    pub async fn publish_aliases(&self, id: &str) -> Result<usize> {
        let manifest = self.read_manifest(id).await?;
        let dir = self.checkpoint_dir(id);
        for alias in &manifest.aliases {
            let to = join(&dir, &alias.path);
            self.store()
                .copy(&join(&dir, &alias.target), &to)
                .await
                .map_err(|e| CheckpointError::store("copy", &to, e))?;
        }
        Ok(manifest.aliases.len())
    }
}
