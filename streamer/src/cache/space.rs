//! Disk accounting and LRU eviction, node-wide, under `space.lock`.
//!
//! The node's usage is the bytes in `data/` plus, for each download in progress in `tmp/`, the
//! larger of its reservation (in its name) and its current length. `tmp/` is small and is
//! counted afresh on every reservation; that count also recognises the temp files of dead
//! downloads (their fetch lock is free) and deletes them, so a crash leaves nothing to repair.
//!
//! `data/` can hold thousands of files, so its total is kept in `space.ledger` and counted in
//! full only when eviction needs the list anyway, when the ledger is from another generation
//! (a restart, or a power cut that lost its last write), and by [`super::Cache::usage`]. Every
//! change to `data/` moves the ledger in the safe direction first: a commit adds its bytes
//! before its rename, an eviction subtracts after its delete, so a process killed in between
//! leaves the ledger too high, never too low, until the next full count. Files only appear in
//! `data/` under the lock, so the figure used for a decision is never too low.

use std::fs::{self, File};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use tracing::{debug, info};

use super::entry::{read_record, RecordState};
use super::error::{io_err, CacheError, Result};
use super::layout::{
    list_names, overwrite_in_place, parse_tmp_name, remove_if_present, KeyId, Layout,
};
use super::lock::{self, LockGuard, Mode};
use super::metrics::CacheMetrics;

/// A complete shard that eviction may consider.
struct Candidate {
    id: KeyId,
    size: u64,
    last_use: SystemTime,
}

/// Takes `space.lock`. It is only ever held for a count, an eviction pass or a rename, so it is
/// waited for without a deadline.
pub(crate) fn space_lock(layout: &Layout) -> Result<LockGuard> {
    let path = layout.space_lock();
    match lock::lock(&path, Mode::Exclusive, None) {
        Ok(Some(g)) => Ok(g),
        Ok(None) => Err(CacheError::LockTimeout {
            path,
            waited: Duration::ZERO,
        }),
        Err(e) => Err(io_err("lock", &path)(e)),
    }
}

/// The ledger's figure for `data/`, if it was written in this generation.
fn read_ledger(layout: &Layout, generation: u64) -> Option<u64> {
    let text = fs::read_to_string(layout.ledger()).ok()?;
    let (g, bytes) = text.trim().split_once(' ')?;
    (g.parse::<u64>().ok()? == generation)
        .then(|| bytes.parse().ok())
        .flatten()
}

/// Caller holds `space.lock`, which every reader of the ledger holds too: so it is written in
/// place at a fixed width, with no temp file and rename (see [`overwrite_in_place`]: a commit
/// updates the ledger under the lock, and a rename cost ~200 µs of waiting on the disk there).
/// Not fsynced: a power cut starts a new generation, which ignores the ledger and counts
/// `data/` again.
fn write_ledger(layout: &Layout, generation: u64, bytes: u64) -> Result<()> {
    overwrite_in_place(
        &layout.ledger(),
        format!("{generation:020} {bytes:020}\n").as_bytes(),
    )
}

/// Adds a commit's bytes to the ledger before its rename (caller holds `space.lock`). A
/// ledger from another generation is left alone: the next reservation recounts anyway.
pub(crate) fn ledger_add(layout: &Layout, generation: u64, bytes: u64) -> Result<()> {
    match read_ledger(layout, generation) {
        Some(old) => write_ledger(layout, generation, old.saturating_add(bytes)),
        None => Ok(()),
    }
}

/// Counts `data/` in full: its bytes (files of any name, since they all use the disk) and the
/// shards eviction may consider (names the cache creates).
fn scan_data(layout: &Layout) -> Result<(u64, Vec<Candidate>)> {
    let (mut bytes, mut candidates) = (0u64, Vec::new());
    let dir = layout.data_dir();
    for name in list_names(&dir)? {
        let path = dir.join(&name);
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() => m,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("stat", &path)(e)),
        };
        bytes += meta.len();
        if let Some(id) = KeyId::parse(&name) {
            candidates.push(Candidate {
                id,
                size: meta.len(),
                last_use: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
    }
    Ok((bytes, candidates))
}

/// Counts `tmp/` (caller holds `space.lock`): returns the bytes charged for downloads in
/// progress, deleting temp files whose writer is gone. Names the cache does not create are
/// counted but never touched.
fn scan_tmp(layout: &Layout) -> Result<u64> {
    let mut bytes = 0u64;
    let dir = layout.tmp_dir();
    for name in list_names(&dir)? {
        let path = dir.join(&name);
        let len = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() => m.len(),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("stat", &path)(e)),
        };
        let Some((id, reserved)) = parse_tmp_name(&name) else {
            bytes += len;
            continue;
        };
        let fetch = layout.fetch_lock(&id);
        match lock::try_exclusive(&fetch).map_err(io_err("lock", &fetch))? {
            Some(_writer_gone) => {
                info!(path = %path.display(), "removing a download left by a process that died");
                remove_if_present(&path)?;
            }
            None => bytes += len.max(reserved),
        }
    }
    Ok(bytes)
}

/// Counts the whole folder now (caller holds `space.lock`) and resets the ledger to match.
pub(crate) fn count(layout: &Layout, generation: u64) -> Result<u64> {
    let in_flight = scan_tmp(layout)?;
    let (data, _) = scan_data(layout)?;
    write_ledger(layout, generation, data)?;
    Ok(data + in_flight)
}

enum Evicted {
    Yes,
    InUse,
    NotOurs,
}

/// Deletes one shard if nobody reads, fetches or checks it (caller holds `space.lock`).
fn evict_one(layout: &Layout, id: &KeyId) -> Result<Evicted> {
    let fetch = layout.fetch_lock(id);
    let Some(_fetch) = lock::try_exclusive(&fetch).map_err(io_err("lock", &fetch))? else {
        return Ok(Evicted::InUse);
    };
    let pin = layout.pin_lock(id);
    let Some(_pin) = lock::try_exclusive(&pin).map_err(io_err("lock", &pin))? else {
        return Ok(Evicted::InUse);
    };
    if let RecordState::Absent = read_record(&layout.record(id))? {
        return Ok(Evicted::NotOurs);
    }
    // Data first, record last: a crash in between leaves a record without data, which reads
    // as a miss, never a data file without a record, which would read as someone else's.
    remove_if_present(&layout.data(id))?;
    remove_if_present(&layout.record(id))?;
    Ok(Evicted::Yes)
}

/// What [`reserve`] needs.
pub(crate) struct Reserve<'a> {
    pub(crate) layout: &'a Layout,
    pub(crate) metrics: &'a CacheMetrics,
    pub(crate) generation: u64,
    pub(crate) limit: u64,
    pub(crate) space_wait: Duration,
}

/// Makes room for `need` bytes and creates the temp file that holds the reservation, evicting
/// unpinned shards, least recently used first. The caller holds `id`'s fetch lock.
///
/// An eviction pass frees a twentieth of the limit beyond what this fetch needs, where it can,
/// so that the next fetches fit without another full count of `data/`.
///
/// When what is left is all in use, waits up to `space_wait` for readers to let go (they are
/// other processes' leases, released as training moves on), then fails rather than hang.
pub(crate) fn reserve(r: &Reserve<'_>, id: &KeyId, need: u64) -> Result<PathBuf> {
    if need > r.limit {
        return Err(CacheError::LimitTooSmall {
            need,
            limit: r.limit,
            pinned: 0,
        });
    }
    let deadline = Instant::now() + r.space_wait;
    let mut pause = Duration::from_millis(2);
    loop {
        let space = space_lock(r.layout)?;
        let in_flight = scan_tmp(r.layout)?;
        let fits = |data: u64| data.saturating_add(in_flight).saturating_add(need) <= r.limit;
        let ledger = read_ledger(r.layout, r.generation);
        let (mut data, pinned) = match ledger {
            Some(data) if fits(data) => (data, 0),
            _ => evict(r, id, need + in_flight)?,
        };
        if fits(data) {
            let tmp = r.layout.tmp(id, need);
            File::create(&tmp).map_err(io_err("create", &tmp))?;
            data = data.saturating_add(in_flight).saturating_add(need);
            r.metrics.cache_bytes.store(data, Ordering::Relaxed);
            drop(space);
            return Ok(tmp);
        }
        r.metrics
            .cache_bytes
            .store(data.saturating_add(in_flight), Ordering::Relaxed);
        drop(space);
        let now = Instant::now();
        if now >= deadline {
            return Err(CacheError::LimitTooSmall {
                need,
                limit: r.limit,
                pinned: pinned + in_flight,
            });
        }
        debug!(
            need,
            data, in_flight, pinned, "cache full of shards in use; waiting"
        );
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// One eviction pass (caller holds `space.lock`): counts `data/`, evicts until `others` more
/// bytes fit with some headroom, and records the result in the ledger. Returns the bytes left
/// in `data/` and the bytes that were in use.
fn evict(r: &Reserve<'_>, id: &KeyId, others: u64) -> Result<(u64, u64)> {
    let (mut data, mut candidates) = scan_data(r.layout)?;
    let target = r.limit.saturating_sub(r.limit / 20);
    let mut pinned = 0;
    candidates.sort_by_key(|c| c.last_use);
    for c in &candidates {
        let used = data.saturating_add(others);
        // Evict what the limit requires, then what fits in the headroom without going below it.
        let required = used > r.limit;
        let headroom = used > target && used.saturating_sub(c.size) >= target;
        if !required && !headroom {
            break;
        }
        if &c.id == id {
            continue;
        }
        match evict_one(r.layout, &c.id)? {
            Evicted::Yes => {
                debug!(id = c.id.as_str(), bytes = c.size, "evicted");
                data = data.saturating_sub(c.size);
                CacheMetrics::inc(&r.metrics.evictions, 1);
                CacheMetrics::inc(&r.metrics.evicted_bytes, c.size);
            }
            Evicted::InUse => pinned += c.size,
            Evicted::NotOurs => {}
        }
    }
    write_ledger(r.layout, r.generation, data)?;
    Ok((data, pinned))
}

/// What [`evict_key`] did.
pub(crate) enum Removal {
    /// The shard's file was deleted; its bytes.
    Removed(u64),
    /// A process reads, fetches or checks it: left alone.
    InUse,
    /// It is not in the folder (or not a file the cache made).
    Absent,
}

/// Deletes one named shard now, as an eviction pass would delete it, if nobody reads, fetches
/// or checks it (takes `space.lock`), and moves the ledger down by its size. For a caller that
/// asks for a shard by name (Mosaic's `evict_shard`) rather than for room.
pub(crate) fn evict_key(
    layout: &Layout,
    metrics: &CacheMetrics,
    generation: u64,
    id: &KeyId,
) -> Result<Removal> {
    let _space = space_lock(layout)?;
    let path = layout.data(id);
    let size = match fs::symlink_metadata(&path) {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return Ok(Removal::Absent),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::Absent),
        Err(e) => return Err(io_err("stat", &path)(e)),
    };
    match evict_one(layout, id)? {
        Evicted::Yes => {
            if let Some(old) = read_ledger(layout, generation) {
                write_ledger(layout, generation, old.saturating_sub(size))?;
            }
            debug!(id = id.as_str(), bytes = size, "evicted on request");
            CacheMetrics::inc(&metrics.evictions, 1);
            CacheMetrics::inc(&metrics.evicted_bytes, size);
            Ok(Removal::Removed(size))
        }
        Evicted::InUse => Ok(Removal::InUse),
        Evicted::NotOurs => Ok(Removal::Absent),
    }
}
