//! The disk limit a cache gets when none is given: a real limit, never "unlimited" (which on a
//! shared volume meant "until ENOSPC" for every run on it). It is what the node's folder already
//! holds plus [`FREE_SHARE_PERCENT`] of the free space of the file system it is on, measured when
//! the dataset is opened, and at least [`MIN_DEFAULT_LIMIT`] where the disk has that much.
//! `cache_limit` (or `--cache-limit`, `SHARDSTREAM_CACHE_LIMIT`) replaces it.

use std::fs;
use std::io;
use std::path::Path;

use tracing::info;

use super::error::{io_err, Result};

/// The share of the free space a default limit takes: room is left for logs, checkpoints staged
/// on the same disk and other tenants of a shared volume.
pub const FREE_SHARE_PERCENT: u64 = 80;
/// The floor of a default limit (where the disk has that much free).
pub const MIN_DEFAULT_LIMIT: u64 = 1 << 30;

/// The default disk limit for a cache folder at `dir` (which may not exist yet).
pub fn default_limit(dir: &Path) -> Result<u64> {
    let (probe, free) = free_space(dir)?;
    let held = held_bytes(dir)?;
    let share = free / 100 * FREE_SHARE_PERCENT;
    let limit = held.saturating_add(share.max(MIN_DEFAULT_LIMIT.min(free)));
    info!(
        dir = %dir.display(), file_system = %probe.display(), free, held, limit,
        "no cache_limit given: the limit is the folder's shards plus {FREE_SHARE_PERCENT}% of the free space"
    );
    Ok(limit)
}

/// Bytes the file system holding `dir` (or its nearest existing ancestor) has free for this
/// user, and the folder that was measured.
fn free_space(dir: &Path) -> Result<(&Path, u64)> {
    let mut probe = dir;
    loop {
        match rustix::fs::statvfs(probe) {
            Ok(st) => return Ok((probe, st.f_bavail.saturating_mul(st.f_frsize))),
            Err(e) if e == rustix::io::Errno::NOENT => match probe.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => probe = parent,
                _ => return Ok((probe, 0)),
            },
            Err(e) => return Err(io_err("measure free space of", probe)(io::Error::from(e))),
        }
    }
}

/// Bytes of complete shards the folder holds already (`data/`): a restart of a run whose cache
/// filled most of the disk keeps what it has.
fn held_bytes(dir: &Path) -> Result<u64> {
    let data = dir.join("data");
    let entries = match fs::read_dir(&data) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("list", &data)(e)),
    };
    let mut held = 0u64;
    for entry in entries {
        let entry = entry.map_err(io_err("list", &data))?;
        if let Ok(meta) = entry.metadata() {
            held = held.saturating_add(meta.len());
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_limit_is_a_share_of_the_free_space_plus_what_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let (_, free) = free_space(dir.path()).unwrap();
        let empty = default_limit(&dir.path().join("not-yet").join("0")).unwrap();
        assert!(
            empty > 0 && empty <= free.max(MIN_DEFAULT_LIMIT),
            "{empty} of {free}"
        );
        assert!(empty < u64::MAX / 4, "a real limit, not unlimited: {empty}");
        fs::create_dir_all(dir.path().join("data")).unwrap();
        fs::write(dir.path().join("data").join("a"), vec![0u8; 4096]).unwrap();
        let held = default_limit(dir.path()).unwrap();
        // What the folder holds counts on top of the share (the share itself moves a little
        // with the disk, so compare with slack).
        assert!(held + (1 << 20) >= empty + 4096, "{held} vs {empty}");
    }
}
