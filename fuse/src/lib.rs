//! A dataset as a read-only FUSE filesystem (`shardstream mount DATASET MOUNTPOINT`).
//!
//! Two views of one dataset: `shards/` (`index.json` and every shard, decompressed) and
//! `samples/` (one file per sample and column, or the original relative paths for datasets made
//! from a folder of files or an ImageFolder tree; for WebDataset and LitData, one file per tar
//! member or leaf). Shards are fetched lazily through the streamer's node cache and budget;
//! names and sizes come from the index or the streamer's shard listing, never from a LIST.
//!
//! The logic is the plain type [`DatasetFs`] over a [`DatasetSource`], tested without a mount;
//! [`adapter`] translates it for `fuser`; [`mount()`] runs a session with an owner that unmounts;
//! [`mountpoint`] decides, without a mount, what is at a mount point (live, dead, nothing) and
//! whether `allow_other` may be asked for.
//!
//! ```
//! use std::sync::Arc;
//! use shardstream_fuse::{DatasetFs, DatasetSource, FsConfig, MemoryShard, ShardData, SourceError};
//!
//! struct Empty(Vec<u8>);
//! impl DatasetSource for Empty {
//!     fn index_json(&self) -> &[u8] { &self.0 }
//!     fn open_shard(&self, _: usize) -> Result<Arc<dyn ShardData>, SourceError> {
//!         Ok(Arc::new(MemoryShard(Arc::new(Vec::new()))))
//!     }
//!     fn readahead_budget(&self) -> Option<u64> { None }
//! }
//! let fs = DatasetFs::new(Arc::new(Empty(br#"{"version": 2, "shards": []}"#.to_vec())), FsConfig::default())?;
//! let root = fs.getattr(shardstream_fuse::fs::ROOT_INO)?;
//! assert_eq!(root.kind, shardstream_fuse::fs::Kind::Dir);
//! # Ok::<(), shardstream_fuse::FsError>(())
//! ```

pub mod adapter;
pub mod error;
pub mod fs;
pub mod layout;
pub mod mount;
pub mod mountpoint;
pub mod names;
pub mod passthrough;
pub mod readahead;
pub mod source;
pub mod streaming;
pub mod tree;

pub use adapter::MountStats;
pub use error::{FsError, SourceError, SourceErrorKind};
pub use fs::{DatasetFs, FsConfig};
pub use mount::{mount, Mount, MountError, MountOptions};
pub use source::{DatasetSource, MemoryShard, ShardData};
pub use streaming::StreamingSource;
