//! Command-line value types: byte sizes (`64MiB`) and parts (`2/8`).

use std::fmt;
use std::str::FromStr;

/// A byte count typed as `123`, `64MiB`, `64MB`, `1.5g`... Every unit is a power of 1024, as in
/// Mosaic's `size_limit="64mb"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        shardstream_streamer::settings::parse_byte_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

/// `--part I/N`: the I-th (from 0) of N parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Which part, `0..count`.
    pub index: u64,
    /// How many parts.
    pub count: u64,
}

impl Part {
    /// The part's folder name: the index, zero-padded to the width of `count - 1` so that a sorted
    /// listing (Mosaic's `merge_index`) keeps the parts in order.
    pub fn folder(&self) -> String {
        let width = (self.count.saturating_sub(1)).to_string().len();
        format!("{:0width$}", self.index)
    }
}

impl FromStr for Part {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not I/N (e.g. 0/4)"))?;
        let index: u64 = i
            .trim()
            .parse()
            .map_err(|_| format!("{s:?}: {i:?} is not a number"))?;
        let count: u64 = n
            .trim()
            .parse()
            .map_err(|_| format!("{s:?}: {n:?} is not a number"))?;
        if count == 0 || index >= count {
            return Err(format!("{s:?}: need 0 <= I < N"));
        }
        Ok(Part { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary() {
        assert_eq!("64MiB".parse::<ByteSize>().unwrap().0, 64 << 20);
        assert_eq!("64mb".parse::<ByteSize>().unwrap().0, 64 << 20);
        assert_eq!("100kb".parse::<ByteSize>().unwrap().0, 102_400);
        assert_eq!("1.5g".parse::<ByteSize>().unwrap().0, 3 << 29);
        assert_eq!("2t".parse::<ByteSize>().unwrap().0, 2 << 40);
        assert_eq!("123".parse::<ByteSize>().unwrap().0, 123);
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert!("MiB".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(64 << 20).to_string(), "64.0 MiB");
    }

    #[test]
    fn parts_parse_and_pad() {
        let p: Part = "3/12".parse().unwrap();
        assert_eq!((p.index, p.count), (3, 12));
        assert_eq!(p.folder(), "03");
        assert_eq!("1/3".parse::<Part>().unwrap().folder(), "1");
        assert!("3/3".parse::<Part>().is_err());
        assert!("1/0".parse::<Part>().is_err());
        assert!("x".parse::<Part>().is_err());
    }
}
