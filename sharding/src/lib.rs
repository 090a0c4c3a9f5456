//! Dataset formats for shardstream.
//!
//! - [`mds`]: MosaicML Streaming's MDS format, read and written byte-compatibly with
//!   `mosaicml-streaming` (index.json v2, shard header, every column encoding, compression, hashes).
//! - [`wds`]: WebDataset tar shards, read and written (key grouping, gzip, brace expansion).
//! - [`litdata`]: LitData `optimize()` output, read.
//! - [`input`]: raw inputs (a folder of files, an ImageFolder tree, JSONL) turned into samples.
//! - [`compression`] and [`hashing`]: the algorithms the formats name.
//! - [`index_file`]: the size cap on index files.
//!
//! Every decoder of untrusted bytes is bounds-checked: a size field never makes it read past a
//! buffer or allocate more than the bytes it was given, and errors name the file and the problem.
//!
//! ```
//! use shardstream_sharding::value::{Sample, Value};
//! let mut sample = Sample::new();
//! sample.insert("id".into(), Value::Int(7));
//! assert_eq!(shardstream_sharding::value::sample_to_canonical_json(&sample)["id"], 7);
//! ```

pub mod compression;
pub mod error;
pub mod hashing;
pub mod index_file;
pub mod input;
pub mod litdata;
pub mod mds;
pub mod safe_path;
pub mod value;
pub mod wds;

pub use error::{FormatError, Result};
pub use value::{Sample, Value};
