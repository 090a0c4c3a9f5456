//! The node's throttle signal: when one process of a node is throttled on a prefix, the node's
//! other processes learn of it and decrease their rate for that prefix too, so that the node
//! backs off as one limiter (see the module docs of [`crate::shaping`], "Node signal").
//!
//! A signal holds, per prefix, the last time a process of the node decreased its rate for it.
//! [`MemorySignal`] keeps it in memory (processes that share an address space: tests and the
//! scale simulator, whose simulated processes of one node share one); [`FileSignal`] keeps it
//! in a small file per prefix in the node's folder, which every process of a node shares.
//!
//! A signal never fails a request: a file that cannot be written or read, or that holds
//! anything but a timestamp, is logged and reads as "no signal", and the process then runs on
//! its own 503s as it would without one.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Sub-folder of the node's folder that holds the signal files.
pub const SIGNAL_DIR: &str = "shaping";

/// The last throttling of each prefix seen by any process of a node.
pub trait NodeSignal: Send + Sync + fmt::Debug {
    /// Records that a process of the node decreased its rate for `prefix` at `at`.
    fn publish(&self, prefix: &str, at: Instant);
    /// The last time a process of the node decreased its rate for `prefix`, if any is known.
    fn last(&self, prefix: &str) -> Option<Instant>;
}

/// A signal in memory, shared by the holders of one `Arc` (the simulated processes of one
/// node, tests).
#[derive(Debug, Default)]
pub struct MemorySignal {
    last: Mutex<HashMap<String, Instant>>,
}

impl MemorySignal {
    /// A signal with nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }
}

impl NodeSignal for MemorySignal {
    fn publish(&self, prefix: &str, at: Instant) {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = last.entry(prefix.to_string()).or_insert(at);
        *slot = (*slot).max(at);
    }

    fn last(&self, prefix: &str) -> Option<Instant> {
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(prefix)
            .copied()
    }
}

/// What went wrong with a signal file (logged, never returned to a request).
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// The file or its folder could not be read or written.
    #[error("throttle signal {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file holds something other than a timestamp.
    #[error("throttle signal {path}: not a timestamp ({found:?})")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Its first bytes.
        found: String,
    },
}

/// A signal in files: `<node folder>/shaping/<hash of the prefix>`, each holding the last
/// throttle time of its prefix as decimal nanoseconds since the UNIX epoch (the node's clock,
/// which all its processes share), replaced atomically (write to a temporary file, rename).
#[derive(Debug)]
pub struct FileSignal {
    dir: PathBuf,
    /// This process's `Instant` and wall clock at one moment, to convert between them.
    anchor: (Instant, SystemTime),
    /// Temporary files of this process are numbered, so that two threads never share one.
    written: AtomicU64,
    /// Whether a write failure was logged as a warning already (later ones are debug).
    warned: AtomicBool,
}

impl FileSignal {
    /// The signal of the node whose folder is `node_dir` (its files go in
    /// `node_dir/shaping/`, created on the first publish; a `node_dir` that does not exist
    /// is not made, and the signal is then off).
    pub fn new(node_dir: &Path) -> Self {
        Self {
            dir: node_dir.join(SIGNAL_DIR),
            anchor: (Instant::now(), SystemTime::now()),
            written: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// The file of `prefix`.
    pub fn path_of(&self, prefix: &str) -> PathBuf {
        // xxh3: every build of every process of a node computes it alike (std's
        // `DefaultHasher` promises no such thing).
        self.dir.join(format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(prefix.as_bytes())
        ))
    }

    fn nanos_of(&self, at: Instant) -> u64 {
        let (instant, wall) = self.anchor;
        let wall = if at >= instant {
            wall.checked_add(at - instant)
        } else {
            wall.checked_sub(instant - at)
        };
        wall.and_then(|w| w.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    fn instant_of(&self, nanos: u64) -> Option<Instant> {
        let (instant, wall) = self.anchor;
        let at = UNIX_EPOCH.checked_add(Duration::from_nanos(nanos))?;
        match at.duration_since(wall) {
            Ok(after) => instant.checked_add(after),
            Err(before) => instant.checked_sub(before.duration()),
        }
    }

    fn write(&self, prefix: &str, at: Instant) -> Result<(), SignalError> {
        let path = self.path_of(prefix);
        let io = |source| SignalError::Io {
            path: path.clone(),
            source,
        };
        // Only the signal's own folder is made: the node folder is its owner's (the cache
        // marks it before anything else goes in; an unmarked folder is refused at a restart).
        match fs::create_dir(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(io(e)),
            _ => {}
        }
        let n = self.written.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("{}.{n}.tmp", std::process::id()));
        let written = fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(format!("{}\n", self.nanos_of(at)).as_bytes()))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = written {
            // Best effort: a temporary file left behind is overwritten by nothing and harmless.
            let _ = fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }

    fn read(&self, prefix: &str) -> Result<Option<Instant>, SignalError> {
        let path = self.path_of(prefix);
        let text = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(SignalError::Io { path, source }),
        };
        let nanos = std::str::from_utf8(&text)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        match nanos {
            Some(n) => Ok(self.instant_of(n)),
            None => Err(SignalError::Corrupt {
                found: String::from_utf8_lossy(&text[..text.len().min(32)]).into_owned(),
                path,
            }),
        }
    }
}

impl NodeSignal for FileSignal {
    fn publish(&self, prefix: &str, at: Instant) {
        if let Err(e) = self.write(prefix, at) {
            if self.warned.swap(true, Ordering::Relaxed) {
                tracing::debug!(error = %e, "node throttle signal not written");
            } else {
                tracing::warn!(
                    error = %e,
                    "node throttle signal not written; this process's throttling is its own"
                );
            }
        }
    }

    fn last(&self, prefix: &str) -> Option<Instant> {
        self.read(prefix).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "node throttle signal ignored");
            None
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_signal_round_trips_and_is_seen_by_another_instance() {
        let dir = tempfile::tempdir().unwrap();
        let a = FileSignal::new(dir.path());
        let b = FileSignal::new(dir.path());
        assert_eq!(a.last("p"), None);
        let t = Instant::now();
        a.publish("p", t);
        let seen = b.last("p").unwrap();
        // Two anchors taken apart: the conversion is exact up to the clocks' drift meanwhile.
        let off = if seen > t { seen - t } else { t - seen };
        assert!(off < Duration::from_millis(50), "{off:?}");
        assert_eq!(b.last("q"), None);
        assert!(a.path_of("p").starts_with(dir.path().join(SIGNAL_DIR)));
        assert_ne!(a.path_of("p"), a.path_of("q"));
    }

    #[test]
    fn a_corrupt_or_unwritable_signal_is_no_signal() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileSignal::new(dir.path());
        fs::create_dir_all(dir.path().join(SIGNAL_DIR)).unwrap();
        fs::write(s.path_of("p"), b"not a time").unwrap();
        assert_eq!(s.last("p"), None);
        assert!(matches!(s.read("p"), Err(SignalError::Corrupt { .. })));
        fs::write(s.path_of("p"), b"").unwrap();
        assert_eq!(s.last("p"), None);
        // A node folder that does not exist is not made.
        let gone = dir.path().join("gone");
        let s = FileSignal::new(&gone);
        s.publish("p", Instant::now());
        assert!(!gone.exists());
        assert_eq!(s.last("p"), None);
        // A node folder that is a file: publishing logs, reading finds nothing.
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        let s = FileSignal::new(&file);
        s.publish("p", Instant::now());
        assert_eq!(s.last("p"), None);
    }

    #[test]
    fn a_memory_signal_keeps_the_latest() {
        let s = MemorySignal::new();
        let t = Instant::now();
        s.publish("p", t + Duration::from_secs(1));
        s.publish("p", t);
        assert_eq!(s.last("p"), Some(t + Duration::from_secs(1)));
        assert_eq!(s.last("q"), None);
    }
}
