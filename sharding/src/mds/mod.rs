//! MosaicML Streaming's MDS format, read and written byte-compatibly with `mosaicml-streaming`.
//!
//! A dataset folder holds `index.json` (version 2, see [`Index`]) and shards named
//! `shard.{i:05}.mds`, or `shard.{i:05}.mds.{ext}` when compressed ([`crate::compression`]).
//! Each shard is `u32 N | u32 offsets[N+1] | config JSON | samples` ([`shard`]); each sample holds
//! a u32 size per variable-size column then every column's bytes ([`Encoding`]).
//!
//! - Writing: [`MdsWriter`] with [`MdsWriterOptions`] (Mosaic's `columns`, `compression`, `hashes`,
//!   `size_limit`), storing files through a [`ShardSink`] such as [`LocalDirSink`].
//! - Reading: [`MdsDataset`] for a local folder; for bytes from anywhere,
//!   [`Index::from_json`], [`decode_stored_shard`] (verify + bounded decompress) and
//!   [`ShardReader`] (zero-copy sample access, checked offsets).
//! - [`index_bin`]: `index.ssx`, a compact binary form of `index.json` written beside it.
//! - Merging the indexes of parts: [`merge_indexes`] and [`Index::to_merged_json`].
//! - [`pyjson`]: Python's `json.dumps` and float `repr`, which every JSON byte MDS stores follows.
//!
//! ```
//! use std::sync::Arc;
//! use shardstream_sharding::mds::{DatasetOptions, LocalDirSink, MdsDataset, MdsWriter, MdsWriterOptions};
//! use shardstream_sharding::{Sample, Value};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let columns = [("label".to_string(), "int".to_string()), ("text".to_string(), "str".to_string())];
//! let sink = Arc::new(LocalDirSink::new(dir.path()).unwrap());
//! let mut writer = MdsWriter::new(&columns, MdsWriterOptions::default(), sink).unwrap();
//! let mut sample = Sample::new();
//! sample.insert("label".into(), Value::Int(3));
//! sample.insert("text".into(), Value::Str("hello".into()));
//! writer.write(&sample).unwrap();
//! writer.finish().unwrap();
//!
//! let dataset = MdsDataset::open(dir.path(), DatasetOptions::default()).unwrap();
//! let read: Vec<Sample> = dataset.iter().collect::<Result<_, _>>().unwrap();
//! assert_eq!(read, vec![sample]);
//! ```

mod codec;
pub mod dataset;
pub mod encoding;
pub mod index;
pub mod index_bin;
mod ndarray;
pub mod pyjson;
mod pytext;
pub mod shard;
pub mod sink;
pub mod writer;

pub use dataset::{
    decode_stored_shard, verify_file, verify_raw_shard_file, DatasetOptions, MdsDataset,
};
pub use encoding::Encoding;
pub use index::{max_compressed_bytes, merge_indexes, FileInfo, Index, ShardInfo, MAX_SHARD_BYTES};
pub use shard::{check_shard_header, encode_shard, shard_header_len, Columns, ShardReader};
pub use sink::{LocalDirSink, ShardSink};
pub use writer::{MdsWriter, MdsWriterOptions, DEFAULT_SIZE_LIMIT, INDEX_BASENAME};
