//! Raw inputs turned into samples, for `shardstream shard`.
//!
//! An [`Input`] is a dataset-to-be: a fixed number of items in a deterministic order, a column spec
//! (column name to MDS encoding name) and random access by item range, so that `--part I/N` can
//! convert the contiguous I-th of N ranges ([`part_range`]) and the merged parts hold exactly the
//! samples, in exactly the order, of a single-process run.
//!
//! | format | what it reads | columns |
//! |---|---|---|
//! | [`files`] | every regular file under a folder, sorted by relative path | `path: str`, `data: bytes` |
//! | [`imagefolder`] | torchvision's `ImageFolder` tree (`ROOT/<class>/.../<image>`) | `image: jpeg\|png\|bytes`, `label: int`, `path: str` |
//! | [`jsonl`] | JSON Lines, one object per line (a file, or a folder of `.jsonl` files) | inferred from the first record, or given |
//! | [`wds`](mod@wds) | WebDataset tars (a `.tar`, a brace pattern, a folder of `.tar`) | `__key__: str` + one `bytes` column per extension |
//! | [`mds`](mod@mds) | an MDS dataset (a folder with an `index.json` holding `"shards"`) | the dataset's own |
//! | [`litdata`](mod@litdata) | a LitData dataset (a folder with an `index.json` holding `"chunks"`) | the dataset's own |
//!
//! ```no_run
//! use shardstream_sharding::input::{open, part_range, InputFormat, InputOptions};
//! let input = open("data/train.jsonl", InputFormat::Auto, &InputOptions::default())?;
//! let range = part_range(input.len(), 1, 3); // the 2nd of 3 parts
//! for sample in input.read(range)? {
//!     let sample = sample?;
//!     println!("{} columns", sample.len());
//! }
//! # Ok::<(), shardstream_sharding::FormatError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;

use crate::error::{FormatError, Result};
use crate::value::Sample;

mod blocks;
pub mod columns;
pub mod detect;
pub mod files;
pub mod imagefolder;
pub mod json_value;
pub mod jsonl;
pub mod litdata;
pub mod mds;
mod walk;
pub mod wds;

pub use columns::{parse_columns, Columns};

/// Samples read from an input, in input order.
pub type SampleIter<'a> = Box<dyn Iterator<Item = Result<Sample>> + Send + 'a>;

/// A raw input: a deterministic, countable sequence of samples with a column spec.
pub trait Input: Send + Sync + fmt::Debug {
    /// What kind of input this is.
    fn format(&self) -> InputFormat;

    /// Column name to MDS encoding name (`str`, `bytes`, `int`, `jpeg`, `ndarray:float32`, ...).
    fn columns(&self) -> &Columns;

    /// Number of items (samples).
    fn len(&self) -> u64;

    /// Whether the input holds no item.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the items in `range` (clamped to `0..len()`), in order. Items can be read from several
    /// threads at once, each with its own range.
    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>>;

    /// The end of the block of items that holds `start` and is cheap to read on its own (a tar, a
    /// shard, a chunk, a run of lines between two offsets kept by the scan), so that parallel
    /// readers cut their work there instead of re-reading a block's beginning.
    fn block_end(&self, start: u64) -> u64 {
        start.saturating_add(DEFAULT_BLOCK).min(self.len())
    }
}

/// Items per block for inputs whose items are independent (files, images).
pub const DEFAULT_BLOCK: u64 = 64;

/// The input formats `shardstream shard --input-format` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputFormat {
    /// Guess from the path (see [`detect::detect`]).
    #[default]
    Auto,
    /// A folder of files.
    Files,
    /// An ImageFolder tree.
    ImageFolder,
    /// JSON Lines.
    Jsonl,
    /// WebDataset tars.
    Wds,
    /// An MDS dataset.
    Mds,
    /// A LitData dataset.
    LitData,
}

impl InputFormat {
    /// Every format, in the order `--help` lists them.
    pub const ALL: [InputFormat; 7] = [
        InputFormat::Auto,
        InputFormat::Files,
        InputFormat::ImageFolder,
        InputFormat::Jsonl,
        InputFormat::Wds,
        InputFormat::Mds,
        InputFormat::LitData,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            InputFormat::Auto => "auto",
            InputFormat::Files => "files",
            InputFormat::ImageFolder => "imagefolder",
            InputFormat::Jsonl => "jsonl",
            InputFormat::Wds => "wds",
            InputFormat::Mds => "mds",
            InputFormat::LitData => "litdata",
        }
    }
}

impl fmt::Display for InputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for InputFormat {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self> {
        InputFormat::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| FormatError::Unknown {
                kind: "input format",
                name: s.to_string(),
            })
    }
}

/// Options that apply to some input formats.
#[derive(Debug, Clone, Default)]
pub struct InputOptions {
    /// Explicit columns (`--columns`). JSONL only: the records' values are converted to these
    /// encodings, and keys not named here are ignored. Other formats refuse it.
    pub columns: Option<Columns>,
    /// Read `pkl` columns of MDS inputs and `pickle` leaves of LitData inputs (`--allow-unsafe-types`).
    pub allow_unsafe_types: bool,
}

/// Opens `path` as an input of `format` (detected when [`InputFormat::Auto`]).
pub fn open(
    path: impl AsRef<Path>,
    format: InputFormat,
    options: &InputOptions,
) -> Result<Box<dyn Input>> {
    let path = path.as_ref();
    let format = match format {
        InputFormat::Auto => detect::detect(path)?,
        f => f,
    };
    tracing::debug!(path = %path.display(), %format, "opening input");
    if options.columns.is_some() && format != InputFormat::Jsonl {
        return Err(FormatError::InvalidArgument(format!(
            "explicit columns apply to jsonl inputs only; {} is a {format} input",
            path.display()
        )));
    }
    Ok(match format {
        InputFormat::Auto | InputFormat::Files => Box::new(files::FilesInput::open(path)?),
        InputFormat::ImageFolder => Box::new(imagefolder::ImageFolderInput::open(path)?),
        InputFormat::Jsonl => Box::new(jsonl::JsonlInput::open(path, options.columns.clone())?),
        InputFormat::Wds => Box::new(wds::WdsInput::open(path)?),
        InputFormat::Mds => Box::new(mds::MdsInput::open(path, options.allow_unsafe_types)?),
        InputFormat::LitData => Box::new(litdata::LitDataInput::open(
            path,
            options.allow_unsafe_types,
        )?),
    })
}

/// The contiguous `index`-th of `count` ranges over `0..total`: the parts cover every item once, in
/// order, and differ in size by at most one item.
///
/// # Panics
/// Never: a `count` of 0 is treated as 1 and an `index` past the end gives an empty range.
pub fn part_range(total: u64, index: u64, count: u64) -> Range<u64> {
    let count = u128::from(count.max(1));
    let bound = |i: u64| -> u64 {
        let i = u128::from(i).min(count);
        // total * i / count fits in u64 because i <= count.
        u64::try_from(u128::from(total) * i / count).unwrap_or(total)
    };
    bound(index)..bound(index.saturating_add(1))
}

/// Clamps `range` to `0..len`.
pub(crate) fn clamp(range: Range<u64>, len: u64) -> Range<u64> {
    let end = range.end.min(len);
    range.start.min(end)..end
}

/// A column map built from `(name, encoding)` pairs.
pub(crate) fn columns_of(pairs: &[(&str, &str)]) -> Columns {
    pairs
        .iter()
        .map(|(n, e)| ((*n).to_string(), (*e).to_string()))
        .collect::<BTreeMap<_, _>>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_everything_in_order() {
        for total in [0u64, 1, 2, 7, 10, 1000] {
            for count in 1..8u64 {
                let mut next = 0;
                for i in 0..count {
                    let r = part_range(total, i, count);
                    assert_eq!(r.start, next);
                    assert!(r.end - r.start <= total / count + 1);
                    next = r.end;
                }
                assert_eq!(next, total);
            }
        }
        assert_eq!(part_range(u64::MAX, 1, 2).end, u64::MAX);
        assert!(part_range(10, 5, 3).is_empty());
    }

    #[test]
    fn input_format_names_round_trip() {
        for f in InputFormat::ALL {
            assert_eq!(f.name().parse::<InputFormat>().unwrap(), f);
        }
        assert!("tfrecord".parse::<InputFormat>().is_err());
    }
}
