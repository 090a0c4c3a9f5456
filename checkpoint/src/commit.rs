//! The coordinator's commit: check that every reported file is in the store with its size, then
//! create the manifest with a create-if-absent put. That put is the commit point: before it the
//! checkpoint does not exist for any reader, after it the checkpoint is complete. Root aliases
//! (DCP's `.metadata`) are copied in afterwards, so torch's own reader never sees an
//! uncommitted checkpoint either.

use crate::error::{CheckpointError, Result};
use crate::layout::{join, now_unix_ms, step_from_id, validate_relative_path};
use crate::manifest::{Alias, FileRecord, Manifest, FORMAT_NAME, FORMAT_VERSION};
use crate::metrics::add;
use crate::rank::SaveAttempt;
use crate::CheckpointRoot;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutMode, PutOptions};
use std::collections::HashSet;
use std::time::{Duration, UNIX_EPOCH};
use tracing::{info, info_span, warn, Instrument};

/// HEAD requests in flight while checking the files before commit.
const HEAD_CONCURRENCY: usize = 64;

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
    /// Commits a save: HEADs every file (size must match), then creates the manifest if absent,
    /// then publishes the aliases. Returns the manifest written.
    ///
    /// Errors: [`CheckpointError::MissingObject`] / [`CheckpointError::SizeMismatch`] naming
    /// the first bad file, [`CheckpointError::AlreadyCommitted`] when another save of the same
    /// id committed first (exactly one of two racing coordinators wins).
    pub async fn commit(&self, attempt: &SaveAttempt, req: CommitRequest) -> Result<Manifest> {
        let span =
            info_span!("checkpoint.commit", id = %attempt.id(), attempt = %attempt.attempt());
        self.commit_inner(attempt, req).instrument(span).await
    }

    async fn commit_inner(&self, attempt: &SaveAttempt, req: CommitRequest) -> Result<Manifest> {
        let manifest = build_manifest(attempt, req)?;
        let dir = self.checkpoint_dir(attempt.id());
        let store = self.store();
        futures::stream::iter(manifest.files.iter())
            .map(|f| {
                let path = join(&dir, &f.path);
                async move {
                    let meta = store
                        .head(&path)
                        .await
                        .map_err(|e| CheckpointError::store("head", &path, e))?;
                    if meta.size != f.size {
                        return Err(CheckpointError::SizeMismatch {
                            path,
                            expected: f.size,
                            actual: meta.size,
                        });
                    }
                    Ok(())
                }
            })
            .buffer_unordered(HEAD_CONCURRENCY)
            .try_collect::<()>()
            .await?;

        let body = manifest.to_json()?;
        let mpath = self.manifest_path(attempt.id());
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
        add(&self.metrics().commits, 1);
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
