//! Where a writer's finished files go. The writer hands each shard (and, last, `index.json`) to a
//! [`ShardSink`] as soon as it is complete, so a sink that uploads can overlap with encoding.
//!
//! ```
//! use shardstream_sharding::mds::{LocalDirSink, ShardSink};
//! let dir = tempfile::tempdir().unwrap();
//! let sink = LocalDirSink::new(dir.path()).unwrap();
//! sink.put("shard.00000.mds", b"abc".to_vec()).unwrap();
//! assert_eq!(std::fs::read(dir.path().join("shard.00000.mds")).unwrap(), b"abc");
//! assert!(sink.put("../escape", vec![]).is_err());
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{FormatError, Result};
use crate::safe_path::check_relative;

/// Receives finished files by name (relative, `/`-separated). Called from the writer's worker
/// threads, possibly several at once, in any order; `index.json` comes after every shard.
pub trait ShardSink: Send + Sync {
    /// Stores `data` under `name`, replacing any file of that name.
    fn put(&self, name: &str, data: Vec<u8>) -> Result<()>;
}

/// Writes files into a local folder atomically: a temporary file in the same folder, `fsync`,
/// then `rename`, so a reader never sees a half-written shard or index.
#[derive(Debug)]
pub struct LocalDirSink {
    root: PathBuf,
    counter: AtomicU64,
}

impl LocalDirSink {
    /// A sink writing under `root`, which is created if missing.
    pub fn new(root: impl AsRef<Path>) -> Result<LocalDirSink> {
        let root = root.as_ref().to_path_buf();
        fs::create_dir_all(&root).map_err(|e| FormatError::io(&root, e))?;
        Ok(LocalDirSink {
            root,
            counter: AtomicU64::new(0),
        })
    }

    /// The folder written to.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl ShardSink for LocalDirSink {
    fn put(&self, name: &str, data: Vec<u8>) -> Result<()> {
        check_relative(&self.root.display().to_string(), name)?;
        let path = self.root.join(name);
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| FormatError::io(&dir, e))?;
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(
            ".{file_name}.tmp.{}.{}",
            std::process::id(),
            self.counter.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            file.write_all(&data)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)?;
            // Persist the rename itself.
            File::open(&dir)?.sync_all()
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(FormatError::io(&path, e));
        }
        tracing::debug!(path = %path.display(), bytes = data.len(), "wrote file");
        Ok(())
    }
}
