//! Reading a local MDS dataset folder (`index.json` plus shards, raw or compressed, optionally
//! under a `split` subfolder), and the pure steps it is made of, which also work on bytes fetched
//! from elsewhere: [`verify_file`] (size and every recorded hash) and [`decode_stored_shard`]
//! (verify, decompress within the recorded raw size, verify again).
//!
//! As Mosaic does, a shard is read from its raw file when that exists locally, else from its
//! compressed file.
//!
//! ```no_run
//! use shardstream_sharding::mds::{DatasetOptions, MdsDataset};
//! let dataset = MdsDataset::open("/data/my-mds", DatasetOptions { split: Some("train".into()), ..Default::default() })?;
//! dataset.verify()?;
//! for sample in dataset.iter() {
//!     println!("{:?}", sample?.keys().collect::<Vec<_>>());
//! }
//! # Ok::<(), shardstream_sharding::FormatError>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{FormatError, Result};
use crate::hashing::{verify_hash, HashAlgorithm, Hasher};
use crate::index_file::read_index_file;
use crate::mds::index::{FileInfo, Index, ShardInfo};
use crate::mds::shard::{check_shard_header, shard_header_len, Columns, ShardReader};
use crate::mds::writer::INDEX_BASENAME;
use crate::safe_path::check_relative;
use crate::value::Sample;

/// How to open a dataset.
#[derive(Debug, Clone, Default)]
pub struct DatasetOptions {
    /// Subfolder holding the split's `index.json` and shards.
    pub split: Option<String>,
    /// Read `pkl` columns (pickle can run code when the Python side loads it).
    pub allow_unsafe_types: bool,
    /// Skip hash checks when opening shards (sizes are always checked).
    pub skip_hash_check: bool,
}

/// Checks `data` (the bytes of `path`) against a file record: its size and every hash it lists.
pub fn verify_file(path: &str, data: &[u8], info: &FileInfo) -> Result<()> {
    verify_size(path, data, info)?;
    for (name, expected) in &info.hashes {
        verify_hash(path, HashAlgorithm::parse(name)?, data, expected)?;
    }
    Ok(())
}

fn verify_size(path: &str, data: &[u8], info: &FileInfo) -> Result<()> {
    if data.len() as u64 != info.bytes {
        return Err(FormatError::SizeMismatch {
            path: path.to_string(),
            expected: info.bytes,
            actual: data.len() as u64,
        });
    }
    Ok(())
}

/// Checks a shard's raw (uncompressed) file on local disk against its index entry: its size,
/// every hash the index records and its header (what [`verify_file`] plus [`ShardReader::new`]
/// check on bytes in memory), reading the file in pieces. Memory stays at one read buffer
/// whatever the shard's size, and no page is copied twice. `name` names the file in errors.
pub fn verify_raw_shard_file(file: &Path, name: &str, info: &ShardInfo) -> Result<()> {
    use std::io::Read;
    const READ_SIZE: u64 = 4 << 20;
    let io = |e| FormatError::io(file, e);
    let mut reader = std::fs::File::open(file).map_err(io)?;
    let len = reader.metadata().map_err(io)?.len();
    if len != info.raw_data.bytes {
        return Err(FormatError::SizeMismatch {
            path: name.to_string(),
            expected: info.raw_data.bytes,
            actual: len,
        });
    }
    let mut hashers = info
        .raw_data
        .hashes
        .iter()
        .map(|(algorithm, hex)| {
            let algorithm = HashAlgorithm::parse(algorithm)?;
            Ok((algorithm, algorithm.hasher(), hex.as_str()))
        })
        .collect::<Result<Vec<(HashAlgorithm, Hasher, &str)>>>()?;
    // The header is 4 bytes of sample count, then the offset table its count sizes.
    let mut head = Vec::new();
    let mut head_wanted = 4u64.min(len);
    let mut buf = vec![0u8; READ_SIZE.min(len).max(1) as usize];
    let mut seen = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        let mut chunk = &buf[..n];
        for (_, hasher, _) in &mut hashers {
            hasher.update(chunk);
        }
        while (head.len() as u64) < head_wanted && !chunk.is_empty() {
            let take = (head_wanted - head.len() as u64).min(chunk.len() as u64) as usize;
            head.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if head_wanted == 4 {
                if let Ok(first_four) = <[u8; 4]>::try_from(&head[..]) {
                    head_wanted = shard_header_len(first_four).min(len);
                }
            }
        }
        seen += n as u64;
    }
    if seen != len {
        // The file changed size while it was read.
        return Err(FormatError::SizeMismatch {
            path: name.to_string(),
            expected: len,
            actual: seen,
        });
    }
    for (algorithm, hasher, expected) in hashers {
        let actual = hasher.finish_hex();
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(FormatError::HashMismatch {
                path: name.to_string(),
                algorithm: algorithm.name().to_string(),
                expected: expected.to_string(),
                actual,
            });
        }
    }
    check_shard_header(name, &head, len, Some(info.samples))?;
    Ok(())
}

/// Turns the bytes of a shard's stored file into its raw bytes. `stored` is the compressed file
/// when `from_zip`, else the raw file; `path` names it in errors. Sizes are always checked, hashes
/// when `check_hashes`; decompression never produces more than the recorded raw size.
pub fn decode_stored_shard(
    path: &str,
    info: &ShardInfo,
    stored: Vec<u8>,
    from_zip: bool,
    check_hashes: bool,
) -> Result<Vec<u8>> {
    let check = |data: &[u8], file: &FileInfo| {
        if check_hashes {
            verify_file(path, data, file)
        } else {
            verify_size(path, data, file)
        }
    };
    if !from_zip {
        check(&stored, &info.raw_data)?;
        return Ok(stored);
    }
    let (Some(zip), Some(compression)) = (&info.zip_data, info.compression()?) else {
        return Err(FormatError::invalid_index(
            path,
            "shard has no compressed file",
        ));
    };
    check(&stored, zip)?;
    let raw = compression.decompress(&stored, path, info.raw_data.bytes)?;
    check(&raw, &info.raw_data)?;
    Ok(raw)
}

/// A local MDS dataset.
#[derive(Debug)]
pub struct MdsDataset {
    dir: PathBuf,
    index: Index,
    columns: Vec<Arc<Columns>>,
    options: DatasetOptions,
}

impl MdsDataset {
    /// Opens `root` (or `root/split`): reads and validates `index.json` and every shard's columns.
    pub fn open(root: impl AsRef<Path>, options: DatasetOptions) -> Result<MdsDataset> {
        let mut dir = root.as_ref().to_path_buf();
        if let Some(split) = &options.split {
            check_relative(&root.as_ref().display().to_string(), split)?;
            dir.push(split);
        }
        let index_path = dir.join(INDEX_BASENAME);
        let index_name = index_path.display().to_string();
        let bytes = read_index_file(&index_path)?;
        let index = Index::from_json(&index_name, &bytes)?;
        let mut columns: Vec<Arc<Columns>> = Vec::with_capacity(index.shards.len());
        for shard in &index.shards {
            let c = Columns::from_shard_info(&index_name, shard, options.allow_unsafe_types)?;
            // Shards almost always share one layout; share its allocation too.
            match columns.last() {
                Some(prev) if **prev == c => columns.push(Arc::clone(prev)),
                _ => columns.push(Arc::new(c)),
            }
        }
        Ok(MdsDataset {
            dir,
            index,
            columns,
            options,
        })
    }

    /// The folder holding `index.json` and the shards.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Samples over all shards.
    pub fn num_samples(&self) -> u64 {
        self.index.num_samples()
    }

    fn shard(&self, i: usize) -> Result<&ShardInfo> {
        self.index.shards.get(i).ok_or_else(|| {
            FormatError::InvalidArgument(format!(
                "shard {i} out of range ({} shards)",
                self.index.shards.len()
            ))
        })
    }

    /// The bytes of `file`, `None` when it is missing. Its size on disk is checked against the
    /// index before reading, so a file that is not what the index says is never read whole.
    fn read(&self, file: &FileInfo) -> Result<Option<(String, Vec<u8>)>> {
        let path = self.dir.join(&file.basename);
        let mut opened = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FormatError::io(&path, e)),
        };
        let name = path.display().to_string();
        let actual = opened
            .metadata()
            .map_err(|e| FormatError::io(&path, e))?
            .len();
        if actual != file.bytes {
            return Err(FormatError::SizeMismatch {
                path: name,
                expected: file.bytes,
                actual,
            });
        }
        // The index's size is bounded at parse time (see `ShardInfo::validate`).
        let mut data = Vec::with_capacity(usize::try_from(actual).unwrap_or(0));
        std::io::Read::read_to_end(&mut opened, &mut data)
            .map_err(|e| FormatError::io(&path, e))?;
        Ok(Some((name, data)))
    }

    fn missing(&self, shard: &ShardInfo) -> FormatError {
        let path = self.dir.join(&shard.stored_file().basename);
        FormatError::io(path, std::io::Error::from(std::io::ErrorKind::NotFound))
    }

    /// Checks shard `i`'s files on disk against the index: every file present (raw and/or
    /// compressed) for size and every hash, and the decompressed bytes against the raw record.
    pub fn verify_shard(&self, i: usize) -> Result<()> {
        let shard = self.shard(i)?;
        let mut found = false;
        if let Some((path, raw)) = self.read(&shard.raw_data)? {
            decode_stored_shard(&path, shard, raw, false, true)?;
            found = true;
        }
        if let Some(zip) = &shard.zip_data {
            if let Some((path, data)) = self.read(zip)? {
                decode_stored_shard(&path, shard, data, true, true)?;
                found = true;
            }
        }
        if found {
            Ok(())
        } else {
            Err(self.missing(shard))
        }
    }

    /// Verifies every shard, stopping at the first problem.
    pub fn verify(&self) -> Result<()> {
        (0..self.index.shards.len()).try_for_each(|i| self.verify_shard(i))
    }

    /// Loads shard `i` (raw file if present, else the compressed one), checks it and returns a
    /// reader over its raw bytes.
    pub fn open_shard(&self, i: usize) -> Result<ShardReader<Vec<u8>>> {
        let shard = self.shard(i)?;
        let check = !self.options.skip_hash_check;
        let (path, raw) = match self.read(&shard.raw_data)? {
            Some((path, data)) => {
                let raw = decode_stored_shard(&path, shard, data, false, check)?;
                (path, raw)
            }
            None => {
                let zip = shard.zip_data.as_ref().ok_or_else(|| self.missing(shard))?;
                let (path, data) = self.read(zip)?.ok_or_else(|| self.missing(shard))?;
                let raw = decode_stored_shard(&path, shard, data, true, check)?;
                (path, raw)
            }
        };
        let columns = self
            .columns
            .get(i)
            .cloned()
            .ok_or_else(|| self.missing(shard))?;
        ShardReader::new(path, raw, columns, Some(shard.samples))
    }

    /// Every sample in order, loading one shard at a time. Stops after the first error.
    pub fn iter(&self) -> impl Iterator<Item = Result<Sample>> + '_ {
        let mut shard = 0usize;
        let mut reader: Option<ShardReader<Vec<u8>>> = None;
        let mut next = 0usize;
        let mut failed = false;
        std::iter::from_fn(move || loop {
            if failed {
                return None;
            }
            if let Some(r) = &reader {
                if next < r.len() {
                    next += 1;
                    let item = r.decode_sample(next - 1);
                    failed = item.is_err();
                    return Some(item);
                }
                reader = None;
            }
            if shard >= self.index.shards.len() {
                return None;
            }
            match self.open_shard(shard) {
                Ok(r) => reader = Some(r),
                Err(e) => {
                    failed = true;
                    return Some(Err(e));
                }
            }
            shard += 1;
            next = 0;
        })
    }
}
