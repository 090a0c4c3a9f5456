//! WebDataset tar shards, read and written as the `webdataset` package (1.0) reads and writes them.
//!
//! - [`expand_urls`]: shard specs such as `data-{000000..000099}.tar::extra-{0..3}.tar`, expanded with
//!   the `braceexpand` package's rules, `${NAME}` taken from `WDS_NAME`.
//! - [`WdsReader`]: samples out of one tar stream read strictly in order (no seeking, so it works on
//!   a download stream). Consecutive members with the same key form a sample; the key is the member
//!   path up to the first dot of its basename and the rest, lowercased, is the field's extension.
//!   Non-regular members and `__*__` metadata are skipped; a repeated extension within a sample is an
//!   error. Gzip, bzip2 and zstd compressed shards are detected from their first bytes; members
//!   ending in `.gz` can be inflated ([`WdsReadOptions::gunzip_members`]).
//! - [`locate_samples`]: the same grouping over member headers only, giving each field's byte
//!   range in the tar (how the streamer reads a tar shard in place).
//! - [`TarWriter`] and [`ShardWriter`]: members `key.ext` in sorted extension order, mode `0o444`,
//!   owner `bigdata`, a fixed mtime ([`DEFAULT_MTIME`]) so output is reproducible; shards split on
//!   `maxcount` / `maxsize` and written atomically to a folder ([`DirSink`]) or any [`ShardSink`].
//!
//! Reading is bounded: a member whose size exceeds [`WdsReadOptions::max_member_size`], a
//! truncated member or header, or a member named with `..` or an absolute path is an error that
//! names the shard and the member; memory never grows with what a header claims, only with the
//! bytes actually read.
//!
//! ```
//! use shardstream_sharding::wds::{TarWriter, WdsReader, WdsSample};
//!
//! let sample = WdsSample {
//!     key: "000001".into(),
//!     url: String::new(),
//!     fields: vec![("txt".into(), b"hello".to_vec()), ("cls".into(), b"3".to_vec())],
//! };
//! let mut writer = TarWriter::new(Vec::new());
//! writer.write(&sample)?;
//! let tar = writer.finish()?;
//!
//! let samples: Vec<WdsSample> = WdsReader::new(&tar[..], "mem.tar")?.collect::<Result<_, _>>()?;
//! assert_eq!(samples[0].key, "000001");
//! assert_eq!(samples[0].get("txt"), Some(&b"hello"[..]));
//! // Members are written in sorted extension order.
//! assert_eq!(samples[0].fields[0].0, "cls");
//!
//! let urls = shardstream_sharding::wds::expand_urls("s3://b/train-{000..002}.tar")?;
//! assert_eq!(urls[2], "s3://b/train-002.tar");
//! # Ok::<(), shardstream_sharding::FormatError>(())
//! ```

mod braces;
mod locate;
mod reader;
mod tar_read;
mod writer;

pub use braces::{braceexpand, expand_urls, expand_urls_with, MAX_EXPANDED_URLS};
pub use locate::{locate_samples, CountingReader, LocatedSample};
pub use reader::{base_plus_ext, WdsReadOptions, WdsReader, WdsSample, DEFAULT_MAX_MEMBER_SIZE};
pub use tar_read::MAX_EXTENSION_SIZE;
pub use writer::{
    format_pattern, DirShard, DirSink, ShardInfo, ShardSink, ShardWriter, ShardWriterOptions,
    TarWriter, DEFAULT_MTIME, MODE, OWNER,
};
