//! The compression algorithms MDS shards can be written with, named as mosaicml-streaming names
//! them (`base/compression.py`): `zstd`, `zstd:7`, `gz`, `gz:5`, `bz2`, `br`, `snappy`.
//!
//! The index keeps the user's string verbatim (`"zstd"` and `"zstd:3"` are different strings for
//! the same output), so a [`Compression`] remembers whether a level was given. The file extension
//! is the family only (`shard.00000.mds.zstd`, never `.zstd:7`).
//!
//! Framing follows the Python packages Mosaic calls: `zstd.compress` writes one standard zstd frame
//! (made byte-identical here, see [`Compression::compress`]),
//! `gzip.compress` one gzip member, `bz2.compress` one bzip2 stream, `brotli.compress` one brotli
//! stream, and python-snappy's `snappy.compress` the *raw* snappy block format (no stream framing).
//!
//! Decompression is bounded: every call takes a `max_size` and fails with
//! [`FormatError::Decompress`] instead of allocating past it, so a corrupt or hostile frame cannot
//! exhaust memory. Pass the raw size recorded in the index when there is one.
//!
//! ```
//! use shardstream_sharding::compression::Compression;
//! let c = Compression::parse("zstd:7").unwrap();
//! assert_eq!(c.to_string(), "zstd:7");
//! assert_eq!(c.extension(), "zstd");
//! let packed = c.compress(b"hello hello hello").unwrap();
//! assert_eq!(c.decompress(&packed, "x.zstd", 1 << 20).unwrap(), b"hello hello hello");
//! ```

use std::fmt;
use std::io::{Read, Write};

use crate::error::{FormatError, Result};

/// A compression family (what the file extension names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Brotli (`br`), levels 0..=11, default 11.
    Brotli,
    /// Bzip2 (`bz2`), levels 1..=9, default 9.
    Bzip2,
    /// Gzip (`gz`), levels 0..=9, default 9.
    Gzip,
    /// Raw snappy blocks (`snappy`), no levels.
    Snappy,
    /// Zstandard (`zstd`), levels 1..=22, default 3.
    Zstd,
}

impl Algorithm {
    /// Every family, in Mosaic's order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Brotli,
        Algorithm::Bzip2,
        Algorithm::Gzip,
        Algorithm::Snappy,
        Algorithm::Zstd,
    ];

    /// The name and file extension (`zstd`, `gz`, ...).
    pub fn extension(self) -> &'static str {
        match self {
            Algorithm::Brotli => "br",
            Algorithm::Bzip2 => "bz2",
            Algorithm::Gzip => "gz",
            Algorithm::Snappy => "snappy",
            Algorithm::Zstd => "zstd",
        }
    }

    /// The valid levels (inclusive range), or `None` for a family without levels.
    pub fn levels(self) -> Option<(u32, u32)> {
        match self {
            Algorithm::Brotli => Some((0, 11)),
            Algorithm::Bzip2 => Some((1, 9)),
            Algorithm::Gzip => Some((0, 9)),
            Algorithm::Snappy => None,
            Algorithm::Zstd => Some((1, 22)),
        }
    }

    /// The level used when none is given (Mosaic's defaults).
    pub fn default_level(self) -> Option<u32> {
        match self {
            Algorithm::Brotli => Some(11),
            Algorithm::Bzip2 => Some(9),
            Algorithm::Gzip => Some(9),
            Algorithm::Snappy => None,
            Algorithm::Zstd => Some(3),
        }
    }

    fn from_extension(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.extension() == name)
    }
}

/// A compression setting as Mosaic spells it: a family and, optionally, an explicit level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Compression {
    algorithm: Algorithm,
    level: Option<u32>,
}

impl Compression {
    /// Parses `ext` or `ext:level` exactly as Mosaic accepts them (`zstd`, `zstd:22`, `gz:0`,
    /// `snappy`); anything else is [`FormatError::Unknown`].
    pub fn parse(text: &str) -> Result<Compression> {
        let unknown = || FormatError::Unknown {
            kind: "compression",
            name: text.to_string(),
        };
        let (family, level) = match text.split_once(':') {
            None => (text, None),
            Some((family, level)) => (family, Some(level)),
        };
        let algorithm = Algorithm::from_extension(family).ok_or_else(unknown)?;
        let level = match level {
            None => None,
            Some(level) => {
                let (lo, hi) = algorithm.levels().ok_or_else(unknown)?;
                let value: u32 = level.parse().map_err(|_| unknown())?;
                // Mosaic's keys are f'{ext}:{level}', so only the canonical spelling exists.
                if value.to_string() != level || value < lo || value > hi {
                    return Err(unknown());
                }
                Some(value)
            }
        };
        Ok(Compression { algorithm, level })
    }

    /// A setting with an explicit level, checked against the family's range.
    pub fn with_level(algorithm: Algorithm, level: u32) -> Result<Compression> {
        Compression::parse(&format!("{}:{level}", algorithm.extension()))
    }

    /// The family's default setting (written as the bare family name).
    pub fn new(algorithm: Algorithm) -> Compression {
        Compression {
            algorithm,
            level: None,
        }
    }

    /// The family.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The level that will be used (explicit or the family default); `None` for snappy.
    pub fn level(&self) -> Option<u32> {
        self.level.or(self.algorithm.default_level())
    }

    /// The file extension appended to a compressed shard's name (`zstd`, no dot, no level).
    pub fn extension(&self) -> &'static str {
        self.algorithm.extension()
    }

    /// Compresses `data` as Mosaic's writer would.
    pub fn compress(&self, data: &[u8]) -> Result<Vec<u8>> {
        let fail = |e: std::io::Error| {
            FormatError::InvalidArgument(format!("{self} compression failed: {e}"))
        };
        let level = self.level().unwrap_or(0);
        match self.algorithm {
            Algorithm::Zstd => {
                // python-zstd always compresses in zstd's multi-threaded mode, whose frames
                // differ from single-threaded ones once the input spans several jobs; any worker
                // count >= 1 gives the same bytes, so one worker reproduces Mosaic's shards.
                let mut c = zstd::bulk::Compressor::new(level as i32).map_err(fail)?;
                c.set_parameter(zstd::zstd_safe::CParameter::NbWorkers(1))
                    .map_err(fail)?;
                c.compress(data).map_err(fail)
            }
            Algorithm::Gzip => {
                // mtime 0 keeps our output reproducible; Python writes the current time, which
                // readers ignore.
                let mut enc = flate2::GzBuilder::new()
                    .mtime(0)
                    .write(Vec::new(), flate2::Compression::new(level));
                enc.write_all(data).map_err(fail)?;
                enc.finish().map_err(fail)
            }
            Algorithm::Bzip2 => {
                let mut enc =
                    bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::new(level));
                enc.write_all(data).map_err(fail)?;
                enc.finish().map_err(fail)
            }
            Algorithm::Brotli => {
                let mut out = Vec::new();
                {
                    // lgwin 22 is python brotli's default window.
                    let mut enc = brotli::CompressorWriter::new(&mut out, 1 << 16, level, 22);
                    enc.write_all(data).map_err(fail)?;
                    enc.flush().map_err(fail)?;
                }
                Ok(out)
            }
            Algorithm::Snappy => snap::raw::Encoder::new()
                .compress_vec(data)
                .map_err(|e| fail(std::io::Error::other(e))),
        }
    }

    /// Decompresses `data` (read from `path`, named in errors), refusing to produce more than
    /// `max_size` bytes.
    pub fn decompress(&self, data: &[u8], path: &str, max_size: u64) -> Result<Vec<u8>> {
        decompress(self.algorithm, data, path, max_size)
    }
}

impl fmt::Display for Compression {
    /// Mosaic's spelling: the family, then `:level` if one was given explicitly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.level {
            None => f.write_str(self.algorithm.extension()),
            Some(level) => write!(f, "{}:{level}", self.algorithm.extension()),
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self> {
        Compression::parse(s)
    }
}

/// Largest buffer reserved up front; beyond it the output grows as bytes actually arrive, so a
/// lying size field costs nothing.
const MAX_PREALLOC: u64 = 64 << 20;

/// Decompresses `data` of family `algorithm`, producing at most `max_size` bytes.
pub fn decompress(algorithm: Algorithm, data: &[u8], path: &str, max_size: u64) -> Result<Vec<u8>> {
    let fail = |reason: String| FormatError::Decompress {
        path: path.to_string(),
        algorithm: algorithm.extension().to_string(),
        reason,
    };
    match algorithm {
        Algorithm::Snappy => {
            let declared = snap::raw::decompress_len(data).map_err(|e| fail(e.to_string()))?;
            if declared as u64 > max_size {
                return Err(fail(format!(
                    "declared size {declared} exceeds the limit of {max_size} bytes"
                )));
            }
            snap::raw::Decoder::new()
                .decompress_vec(data)
                .map_err(|e| fail(e.to_string()))
        }
        Algorithm::Zstd => {
            let hint = zstd::zstd_safe::get_frame_content_size(data)
                .ok()
                .flatten()
                .unwrap_or(0);
            if hint > max_size {
                return Err(fail(format!(
                    "frame declares {hint} bytes, more than the limit of {max_size}"
                )));
            }
            let reader = zstd::stream::read::Decoder::new(data).map_err(|e| fail(e.to_string()))?;
            read_bounded(reader, max_size, hint, &fail)
        }
        Algorithm::Gzip => {
            read_bounded(flate2::read::MultiGzDecoder::new(data), max_size, 0, &fail)
        }
        Algorithm::Bzip2 => {
            read_bounded(bzip2::read::MultiBzDecoder::new(data), max_size, 0, &fail)
        }
        Algorithm::Brotli => {
            read_bounded(brotli::Decompressor::new(data, 1 << 16), max_size, 0, &fail)
        }
    }
}

fn read_bounded<R: Read>(
    reader: R,
    max_size: u64,
    hint: u64,
    fail: &dyn Fn(String) -> FormatError,
) -> Result<Vec<u8>> {
    let reserve = hint.min(max_size).min(MAX_PREALLOC);
    let mut out = Vec::with_capacity(usize::try_from(reserve).unwrap_or(0));
    reader
        .take(max_size.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| fail(e.to_string()))?;
    if out.len() as u64 > max_size {
        return Err(fail(format!(
            "output exceeds the limit of {max_size} bytes"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mosaic_spellings() {
        for good in [
            "zstd", "zstd:1", "zstd:22", "gz", "gz:0", "gz:9", "bz2:1", "br:0", "br:11", "snappy",
        ] {
            assert_eq!(Compression::parse(good).unwrap().to_string(), good);
        }
        for bad in [
            "", "zstd:0", "zstd:23", "zstd:03", "gz:10", "bz2:0", "snappy:1", "lz4", "zstd:",
            "ZSTD", "zstd:-1",
        ] {
            assert!(Compression::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(Compression::parse("zstd").unwrap().level(), Some(3));
        assert_eq!(Compression::parse("br").unwrap().level(), Some(11));
        assert_eq!(Compression::parse("gz").unwrap().level(), Some(9));
        assert_eq!(Compression::parse("bz2").unwrap().level(), Some(9));
        assert_eq!(Compression::parse("snappy").unwrap().level(), None);
        assert_eq!(Compression::parse("zstd:7").unwrap().extension(), "zstd");
    }

    #[test]
    fn round_trips_every_algorithm() {
        let data: Vec<u8> = (0..100_000u32)
            .map(|i| (i % 251) as u8 ^ (i / 1000) as u8)
            .collect();
        for algorithm in Algorithm::ALL {
            let c = Compression::new(algorithm);
            let packed = c.compress(&data).unwrap();
            assert!(packed.len() < data.len(), "{c} did not compress");
            assert_eq!(
                c.decompress(&packed, "f", data.len() as u64).unwrap(),
                data,
                "{c}"
            );
            let err = c
                .decompress(&packed, "f", data.len() as u64 - 1)
                .unwrap_err();
            assert!(err.to_string().contains("limit"), "{c}: {err}");
        }
    }

    #[test]
    fn corrupt_frames_are_errors_naming_the_file() {
        for algorithm in Algorithm::ALL {
            let c = Compression::new(algorithm);
            let mut packed = c.compress(&[7u8; 5000]).unwrap();
            packed.truncate(packed.len() / 2);
            let err = c
                .decompress(&packed, "shard.00000.mds.x", 1 << 20)
                .unwrap_err();
            assert!(
                err.to_string().starts_with("shard.00000.mds.x: "),
                "{c}: {err}"
            );
        }
    }

    #[test]
    fn empty_input_round_trips() {
        for algorithm in Algorithm::ALL {
            let c = Compression::new(algorithm);
            let packed = c.compress(b"").unwrap();
            assert_eq!(c.decompress(&packed, "f", 0).unwrap(), b"");
        }
    }
}
