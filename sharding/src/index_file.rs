//! The size cap on index files (MDS and LitData `index.json`), and reading a local one under it.
//!
//! An index is read whole and parsed in memory, so its size is what opening a dataset costs
//! before anything else is checked. Real indexes are small next to the cap: Mosaic's for 10^6
//! shards is a few hundred MB. A file larger than [`DEFAULT_MAX_INDEX_BYTES`] (1 GiB) is refused
//! from its size alone, before a byte of it is read; the environment variable
//! `SHARDSTREAM_MAX_INDEX_BYTES` (a byte count) moves the cap for a larger dataset. Readers of
//! remote indexes call [`check_index_size`] with the object's size before fetching it.
//!
//! ```
//! use shardstream_sharding::index_file::{check_index_size_with, DEFAULT_MAX_INDEX_BYTES};
//! assert!(check_index_size_with("index.json", 1 << 20, DEFAULT_MAX_INDEX_BYTES).is_ok());
//! assert!(check_index_size_with("index.json", 1 << 40, DEFAULT_MAX_INDEX_BYTES).is_err());
//! ```

use std::io::Read;
use std::path::Path;

use crate::error::{FormatError, Result};

/// The largest index file read when `SHARDSTREAM_MAX_INDEX_BYTES` is not set: 1 GiB.
pub const DEFAULT_MAX_INDEX_BYTES: u64 = 1 << 30;

/// The environment variable that sets the cap, in bytes.
pub const MAX_INDEX_BYTES_ENV: &str = "SHARDSTREAM_MAX_INDEX_BYTES";

/// The cap in force: `SHARDSTREAM_MAX_INDEX_BYTES` when it holds a byte count, else
/// [`DEFAULT_MAX_INDEX_BYTES`] (a value that is not a number is ignored with a warning, so that
/// a typo cannot lift the cap).
pub fn max_index_bytes() -> u64 {
    let value = std::env::var(MAX_INDEX_BYTES_ENV).ok();
    parse_cap(value.as_deref()).unwrap_or_else(|bad| {
        tracing::warn!(
            variable = MAX_INDEX_BYTES_ENV,
            value = bad,
            default = DEFAULT_MAX_INDEX_BYTES,
            "not a byte count; using the default index size cap"
        );
        DEFAULT_MAX_INDEX_BYTES
    })
}

/// The cap a value of the variable sets; `Err` with the value when it is not a byte count.
fn parse_cap(value: Option<&str>) -> std::result::Result<u64, &str> {
    match value.map(str::trim) {
        None | Some("") => Ok(DEFAULT_MAX_INDEX_BYTES),
        Some(v) => v.parse().map_err(|_| v),
    }
}

/// Fails when an index of `size` bytes at `path` is over the cap in force.
pub fn check_index_size(path: &str, size: u64) -> Result<()> {
    check_index_size_with(path, size, max_index_bytes())
}

/// Fails when an index of `size` bytes at `path` is over `limit`.
pub fn check_index_size_with(path: &str, size: u64, limit: u64) -> Result<()> {
    if size > limit {
        return Err(oversized_index(path, size, limit));
    }
    Ok(())
}

/// The error for an index of `size` bytes at `path`, over the cap `limit` (for a caller that
/// learnt the size itself, from a storage response).
pub fn oversized_index(path: &str, size: u64, limit: u64) -> FormatError {
    too_large(path, &size.to_string(), limit)
}

fn too_large(path: &str, size: &str, limit: u64) -> FormatError {
    FormatError::invalid_index(
        path,
        format!(
            "{size} bytes, more than the {limit} bytes an index may have \
             (set {MAX_INDEX_BYTES_ENV} to raise the cap)"
        ),
    )
}

/// Reads the local index file `path` under the cap in force.
pub fn read_index_file(path: &Path) -> Result<Vec<u8>> {
    read_index_file_with(path, max_index_bytes())
}

/// Reads the local index file `path`, refusing it when it is over `limit` bytes: by its size
/// before reading, and again while reading, for a file that grows in between.
pub fn read_index_file_with(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    let size = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    check_index_size_with(&name, size, limit)?;
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| FormatError::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(&name, &format!("more than {limit}"), limit));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40, row 12: an index of several GB was read whole into memory. A sparse file over
    /// the cap is refused from its size, naming the file and the size, without reading it.
    #[test]
    fn an_index_over_the_cap_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.json");
        let file = std::fs::File::create(&path).unwrap();
        let size = 4 * DEFAULT_MAX_INDEX_BYTES;
        file.set_len(size).unwrap();
        let err = read_index_file_with(&path, DEFAULT_MAX_INDEX_BYTES)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(&size.to_string()), "{err}");
        assert!(err.contains(MAX_INDEX_BYTES_ENV), "{err}");

        std::fs::write(&path, b"{\"version\": 2, \"shards\": []}").unwrap();
        assert_eq!(read_index_file_with(&path, 28).unwrap().len(), 28);
        assert!(read_index_file_with(&path, 27).is_err());
    }

    /// Every local reader of `index.json` goes through the cap: an MDS dataset, a LitData
    /// dataset and format detection all refuse an oversized index by its size.
    #[test]
    fn opening_a_dataset_with_an_oversized_index_names_the_file_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.json");
        let size = DEFAULT_MAX_INDEX_BYTES + 1;
        std::fs::File::create(&path).unwrap().set_len(size).unwrap();
        let errors = [
            crate::mds::MdsDataset::open(dir.path(), Default::default()).map(|_| ()),
            crate::litdata::LitDataReader::open(dir.path(), Default::default()).map(|_| ()),
            crate::input::detect::index_format(&path).map(|_| ()),
        ];
        for err in errors {
            let err = err.unwrap_err().to_string();
            let want = format!("{}: invalid index: {size} bytes", path.display());
            assert!(err.starts_with(&want), "{err}");
        }
    }

    #[test]
    fn the_cap_comes_from_the_variable_when_it_is_a_number() {
        assert_eq!(parse_cap(None), Ok(DEFAULT_MAX_INDEX_BYTES));
        assert_eq!(parse_cap(Some("")), Ok(DEFAULT_MAX_INDEX_BYTES));
        assert_eq!(parse_cap(Some(" 5000000000 ")), Ok(5_000_000_000));
        assert_eq!(parse_cap(Some("1G")), Err("1G"));
    }
}
