//! WebDataset samples out of one tar stream, grouped as `webdataset`'s `tarfile_to_samples` groups
//! them (`tariterators.py`): consecutive members with the same key form a sample.

use std::fs::File;
use std::io::{BufReader, Chain, Cursor, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::tar_read::TarStream;
use crate::error::{FormatError, Result};
use crate::safe_path::check_relative;
use crate::value::{Sample, Value};

/// Default cap on one member's size (and on a `.gz` member's inflated size): 1 GiB.
pub const DEFAULT_MAX_MEMBER_SIZE: u64 = 1 << 30;

/// How a tar shard is read.
#[derive(Debug, Clone)]
pub struct WdsReadOptions {
    /// A member larger than this (per its header) is an error rather than an allocation.
    pub max_member_size: u64,
    /// Inflate members whose extension ends in `.gz` and drop the `.gz` (`x.json.gz` gives field
    /// `json`), as WebDataset's decoder does; off by default (the field keeps the gzip bytes).
    pub gunzip_members: bool,
}

impl Default for WdsReadOptions {
    fn default() -> Self {
        WdsReadOptions {
            max_member_size: DEFAULT_MAX_MEMBER_SIZE,
            gunzip_members: false,
        }
    }
}

/// One WebDataset sample: its key, the shard it came from, and one field per member extension.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WdsSample {
    /// The member path up to the first dot of its basename (`a/b/000123` for `a/b/000123.seg.png`).
    pub key: String,
    /// The shard the sample was read from (WebDataset's `__url__`).
    pub url: String,
    /// `(extension, bytes)` in archive order; extensions are lowercased (`seg.png`, `jpg`).
    pub fields: Vec<(String, Vec<u8>)>,
}

impl WdsSample {
    /// The bytes of field `ext`, if present.
    pub fn get(&self, ext: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(e, _)| e == ext)
            .map(|(_, v)| v.as_slice())
    }

    /// The sample as a [`Sample`]: `__key__` as [`Value::Str`] and each field as [`Value::Bytes`]
    /// (`__url__` is left out: it names where the sample was read, not what it holds).
    pub fn to_sample(&self) -> Sample {
        self.clone().into_sample()
    }

    /// [`WdsSample::to_sample`] without copying the field bytes.
    pub fn into_sample(self) -> Sample {
        let mut sample = Sample::new();
        sample.insert("__key__".into(), Value::Str(self.key));
        for (ext, bytes) in self.fields {
            sample.insert(ext, Value::Bytes(bytes));
        }
        sample
    }

    /// Builds a sample to write from a [`Sample`]: `__key__` (a string) is required; columns whose
    /// name starts with `_` are metadata and are skipped, as WebDataset's `TarWriter` skips them.
    /// Bytes and encoded images are written as they are, text as UTF-8, integers as decimal text
    /// (as WebDataset writes `cls`), JSON values as compact JSON. Other values have no single
    /// WebDataset encoding and are an [`FormatError::Encode`] error: convert them first.
    pub fn from_sample(sample: &Sample) -> Result<WdsSample> {
        let key = match sample.get("__key__") {
            Some(Value::Str(k)) => k.clone(),
            _ => {
                return Err(FormatError::Encode {
                    column: "__key__".into(),
                    encoding: "str".into(),
                    reason: "a WebDataset sample needs a string __key__".into(),
                })
            }
        };
        let mut fields = Vec::new();
        for (name, value) in sample {
            if name.starts_with('_') {
                continue;
            }
            let bytes = match value {
                Value::Bytes(b) | Value::Image(_, b) => b.clone(),
                Value::Str(s) | Value::StrInt(s) | Value::StrDecimal(s) => s.clone().into_bytes(),
                Value::Int(i) => i.to_string().into_bytes(),
                Value::Json(j) => serde_json::to_vec(j).map_err(|e| FormatError::Encode {
                    column: name.clone(),
                    encoding: "json".into(),
                    reason: e.to_string(),
                })?,
                other => {
                    let kind = other
                        .to_canonical_json()
                        .get("$type")
                        .and_then(|t| t.as_str().map(str::to_string))
                        .unwrap_or_else(|| "float or bool".to_string());
                    return Err(FormatError::Encode {
                        column: name.clone(),
                        encoding: "wds".into(),
                        reason: format!("no WebDataset byte encoding for a {kind} value"),
                    });
                }
            };
            fields.push((name.clone(), bytes));
        }
        Ok(WdsSample {
            key,
            url: String::new(),
            fields,
        })
    }
}

/// The decompressed byte stream of a shard: the compression is sniffed from its first bytes, as
/// `tarfile.open(mode="r|*")` does.
enum Source<R: Read> {
    Plain(Sniffed<R>),
    Gzip(MultiGzDecoder<Sniffed<R>>),
    Bzip2(bzip2::read::MultiBzDecoder<Sniffed<R>>),
    Zstd(zstd::stream::read::Decoder<'static, Sniffed<R>>),
}

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Plain(r) => r.read(buf),
            Source::Gzip(r) => r.read(buf),
            Source::Bzip2(r) => r.read(buf),
            Source::Zstd(r) => r.read(buf),
        }
    }
}

/// The shard's first bytes put back in front of the rest.
type Sniffed<R> = BufReader<Chain<Cursor<Vec<u8>>, R>>;

impl<R: Read> Source<R> {
    fn sniff(mut inner: R, path: &str) -> Result<Source<R>> {
        let mut head = Vec::with_capacity(6);
        (&mut inner)
            .take(6)
            .read_to_end(&mut head)
            .map_err(|e| FormatError::Tar {
                path: path.to_string(),
                reason: format!("read error: {e}"),
            })?;
        let magic = head.clone();
        let buf: Sniffed<R> = BufReader::with_capacity(1 << 16, Cursor::new(head).chain(inner));
        Ok(if magic.starts_with(&[0x1f, 0x8b]) {
            Source::Gzip(MultiGzDecoder::new(buf))
        } else if magic.starts_with(b"BZh") {
            Source::Bzip2(bzip2::read::MultiBzDecoder::new(buf))
        } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            let decoder = zstd::stream::read::Decoder::with_buffer(buf).map_err(|e| {
                FormatError::Decompress {
                    path: path.to_string(),
                    algorithm: "zstd".into(),
                    reason: e.to_string(),
                }
            })?;
            Source::Zstd(decoder)
        } else if magic.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            return Err(FormatError::Unsupported {
                path: path.to_string(),
                what: "xz-compressed tar; decompress it or recompress with gzip or zstd".into(),
            });
        } else {
            Source::Plain(buf)
        })
    }
}

/// Reads WebDataset samples from one tar stream (plain, gzip, bzip2 or zstd), strictly
/// sequentially. An iterator of `Result<WdsSample>`; after the first error it ends.
pub struct WdsReader<R: Read> {
    tar: TarStream<Source<R>>,
    url: String,
    options: WdsReadOptions,
    current: Option<WdsSample>,
    done: bool,
}

impl WdsReader<File> {
    /// Opens a local shard; its path is the samples' `url`.
    pub fn open(path: impl AsRef<Path>, options: WdsReadOptions) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        WdsReader::with_options(file, path.display().to_string(), options)
    }
}

impl<R: Read> WdsReader<R> {
    /// Reads `reader`, with default options; `url` names the shard in samples and errors.
    pub fn new(reader: R, url: impl Into<String>) -> Result<Self> {
        WdsReader::with_options(reader, url, WdsReadOptions::default())
    }

    /// Reads `reader` with `options`. Sniffs the compression, so it reads the first bytes.
    pub fn with_options(
        reader: R,
        url: impl Into<String>,
        options: WdsReadOptions,
    ) -> Result<Self> {
        let url = url.into();
        let source = Source::sniff(reader, &url)?;
        Ok(WdsReader {
            tar: TarStream::new(source, url.clone()),
            url,
            options,
            current: None,
            done: false,
        })
    }

    fn tar_err(&self, reason: String) -> FormatError {
        FormatError::Tar {
            path: self.url.clone(),
            reason,
        }
    }

    fn step(&mut self) -> Result<Option<WdsSample>> {
        loop {
            let Some(member) = self.tar.next_member()? else {
                return Ok(self.current.take());
            };
            if !member.regular || is_metadata(&member.name) {
                continue;
            }
            check_member_name(&self.url, &member.name)?;
            let Some((key, ext)) = base_plus_ext(&member.name) else {
                continue;
            };
            let (key, mut ext) = (key.to_string(), ext.to_lowercase());
            let mut data = self.tar.read_data(self.options.max_member_size)?;
            if self.options.gunzip_members && ext.len() > 3 && ext.ends_with(".gz") {
                data = self.gunzip(&member.name, &data)?;
                ext.truncate(ext.len() - 3);
            }
            let finished = match &self.current {
                Some(cur) if cur.key == key => None,
                _ => self.current.take(),
            };
            let current = self.current.get_or_insert_with(|| WdsSample {
                key: key.clone(),
                url: self.url.clone(),
                fields: Vec::new(),
            });
            if current.fields.iter().any(|(e, _)| *e == ext) {
                let reason = format!(
                    "member {:?}: sample {key:?} already has a {ext:?} member (duplicate file name)",
                    member.name
                );
                return Err(self.tar_err(reason));
            }
            current.fields.push((ext, data));
            if finished.is_some() {
                return Ok(finished);
            }
        }
    }

    fn gunzip(&self, member: &str, data: &[u8]) -> Result<Vec<u8>> {
        let limit = self.options.max_member_size;
        let mut out = Vec::new();
        MultiGzDecoder::new(data)
            .take(limit.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| FormatError::Decompress {
                path: format!("{}:{member}", self.url),
                algorithm: "gzip".into(),
                reason: e.to_string(),
            })?;
        if out.len() as u64 > limit {
            return Err(self.tar_err(format!(
                "member {member:?} inflates to more than the limit of {limit} bytes"
            )));
        }
        Ok(out)
    }
}

impl<R: Read> Iterator for WdsReader<R> {
    type Item = Result<WdsSample>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(s)) => Some(Ok(s)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// WebDataset's metadata members, skipped: a root-level `__*__` file, or anything under a first
/// component `__*__` (`tar_file_iterator`'s `skip_meta`).
pub(crate) fn is_metadata(name: &str) -> bool {
    let first = name.split('/').next().unwrap_or(name);
    let root_level = !name.contains('/') && name.starts_with("__") && name.ends_with("__");
    let meta_dir = first.len() >= 4 && first.starts_with("__") && first.ends_with("__");
    root_level || meta_dir
}

/// Refuses names that would escape a folder if the sample were written out as files. A leading
/// `./` (what `tar -cf x.tar .` writes) is allowed and kept in the key, as WebDataset keeps it.
pub(crate) fn check_member_name(url: &str, name: &str) -> Result<()> {
    let mut rest = name;
    while let Some(r) = rest.strip_prefix("./") {
        rest = r;
    }
    check_relative(url, rest).map_err(|e| match e {
        FormatError::UnsafePath { path, reason, .. } => FormatError::UnsafePath {
            path,
            name: name.to_string(),
            reason,
        },
        other => other,
    })?;
    Ok(())
}

/// `base_plus_ext`: the regex `^((?:.*/|)[^.]+)[.]([^/]*)$`. The key runs to the first dot of the
/// basename; `None` (member skipped) when the basename has no dot.
pub fn base_plus_ext(path: &str) -> Option<(&str, &str)> {
    let dir_len = path.rfind('/').map_or(0, |i| i + 1);
    let base = &path[dir_len..];
    let dot = base.find('.')?;
    if dot > 0 {
        return Some((&path[..dir_len + dot], &base[dot + 1..]));
    }
    // A basename starting with a dot: the regex can still match by letting `[^.]+` take the last
    // directory component with its slash, when that component has no dot.
    if dir_len == 0 {
        return None;
    }
    let dir = &path[..dir_len - 1];
    let last = &dir[dir.rfind('/').map_or(0, |i| i + 1)..];
    (!last.contains('.')).then(|| (&path[..dir_len], &base[1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_the_webdataset_regex() {
        assert_eq!(
            base_plus_ext("a/b/000123.seg.png"),
            Some(("a/b/000123", "seg.png"))
        );
        assert_eq!(base_plus_ext("x.y/z.txt"), Some(("x.y/z", "txt")));
        assert_eq!(base_plus_ext("k."), Some(("k", "")));
        assert_eq!(base_plus_ext("noext"), None);
        assert_eq!(base_plus_ext(".hidden"), None);
        assert_eq!(base_plus_ext("a/.x"), Some(("a/", "x")));
        assert_eq!(base_plus_ext("a.b/.x"), None);
    }

    #[test]
    fn from_sample_encodes_plain_values_and_refuses_others() {
        let mut s = Sample::new();
        s.insert("__key__".into(), Value::Str("k1".into()));
        s.insert("__url__".into(), Value::Str("skipped".into()));
        s.insert("cls".into(), Value::Int(3));
        s.insert("txt".into(), Value::Str("hi".into()));
        let w = WdsSample::from_sample(&s).unwrap();
        assert_eq!(w.key, "k1");
        assert_eq!(
            w.fields,
            [
                ("cls".into(), b"3".to_vec()),
                ("txt".into(), b"hi".to_vec())
            ]
        );
        assert_eq!(w.to_sample()["cls"], Value::Bytes(b"3".to_vec()));
        s.insert("f".into(), Value::Float(0.5));
        assert!(WdsSample::from_sample(&s).is_err());
        s.remove("__key__");
        assert!(WdsSample::from_sample(&s).is_err());
    }

    #[test]
    fn metadata_names() {
        assert!(is_metadata("__meta__"));
        assert!(is_metadata("__"));
        assert!(is_metadata("__info__/x.json"));
        assert!(!is_metadata("__a.txt"));
        assert!(!is_metadata("d/__meta__"));
    }
}
