//! Writing WebDataset shards: [`TarWriter`] (one tar stream) and [`ShardWriter`] (a numbered series
//! of shards, split on sample count and payload size as `webdataset.ShardWriter` splits them).

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;

use super::reader::WdsSample;
use crate::error::{FormatError, Result};
use crate::safe_path::check_relative;

/// Modification time written on every member unless [`TarWriter::with_mtime`] says otherwise:
/// the Unix epoch, so that the same samples always give byte-identical shards. (WebDataset writes
/// the current time unless given `mtime`, which makes its shards differ run to run.)
pub const DEFAULT_MTIME: u64 = 0;
/// Owner and group names WebDataset's `TarWriter` writes.
pub const OWNER: &str = "bigdata";
/// Member mode WebDataset's `TarWriter` writes (read-only for all).
pub const MODE: u32 = 0o444;

/// Writes WebDataset samples into one tar stream: for each sample, one member `key.ext` per field,
/// in sorted extension order, mode `0o444`, owner and group `bigdata`, uid and gid 0, ustar headers
/// (a GNU long-name entry for paths beyond ustar's 255 bytes).
pub struct TarWriter<W: Write> {
    builder: tar::Builder<W>,
    mtime: u64,
}

impl<W: Write> TarWriter<W> {
    /// A writer into `sink`; the members' mtime is [`DEFAULT_MTIME`].
    pub fn new(sink: W) -> Self {
        TarWriter {
            builder: tar::Builder::new(sink),
            mtime: DEFAULT_MTIME,
        }
    }

    /// Sets the mtime (seconds since the epoch) of the members written from now on.
    pub fn with_mtime(mut self, mtime: u64) -> Self {
        self.mtime = mtime;
        self
    }

    /// Writes one sample; returns its payload bytes (the sum of its fields' sizes), which is what
    /// WebDataset's `maxsize` counts.
    pub fn write(&mut self, sample: &WdsSample) -> Result<u64> {
        self.write_fields(&sample.key, &sample.fields)
    }

    /// Writes one sample given as its key and `(extension, bytes)` fields.
    ///
    /// The key must be a relative path whose last component has no dot (a dot would move the key/
    /// extension split on reading); extensions must be unique and contain no `/`. Extensions are
    /// written as given, but readers lowercase them.
    pub fn write_fields(&mut self, key: &str, fields: &[(String, Vec<u8>)]) -> Result<u64> {
        validate_key(key)?;
        let mut order: Vec<&(String, Vec<u8>)> = fields.iter().collect();
        order.sort_by(|a, b| a.0.cmp(&b.0));
        for pair in order.windows(2) {
            if pair[0].0 == pair[1].0 {
                return Err(invalid(format!(
                    "sample {key:?} has the extension {:?} twice",
                    pair[0].0
                )));
            }
        }
        let mut total = 0u64;
        for (ext, data) in order {
            if ext.contains('/') || ext.contains('\0') {
                return Err(invalid(format!(
                    "sample {key:?}: extension {ext:?} may not contain '/' or NUL"
                )));
            }
            let name = format!("{key}.{ext}");
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(MODE);
            header.set_mtime(self.mtime);
            header.set_uid(0);
            header.set_gid(0);
            header.set_entry_type(tar::EntryType::Regular);
            header
                .set_username(OWNER)
                .and_then(|()| header.set_groupname(OWNER))
                .map_err(|e| io_err(&name, e))?;
            self.builder
                .append_data(&mut header, &name, data.as_slice())
                .map_err(|e| io_err(&name, e))?;
            total += data.len() as u64;
        }
        Ok(total)
    }

    /// Writes the end-of-archive blocks and returns the sink.
    pub fn finish(self) -> Result<W> {
        self.builder
            .into_inner()
            .map_err(|e| io_err("end of archive", e))
    }
}

fn invalid(reason: String) -> FormatError {
    FormatError::InvalidArgument(reason)
}

fn io_err(what: &str, e: io::Error) -> FormatError {
    FormatError::Io {
        path: what.to_string(),
        source: e,
    }
}

fn validate_key(key: &str) -> Result<()> {
    check_relative("sample key", key)?;
    let base = key.rsplit('/').next().unwrap_or(key);
    if base.contains('.') {
        return Err(invalid(format!(
            "sample key {key:?}: its last component may not contain '.', or readers would split \
             the key and extension elsewhere"
        )));
    }
    Ok(())
}

/// Where a [`ShardWriter`] puts its shards.
pub trait ShardSink {
    /// The writer for one shard.
    type Shard: Write;
    /// Starts shard `name` (the formatted pattern, e.g. `out-000003.tar`).
    fn create(&mut self, name: &str) -> Result<Self::Shard>;
    /// Completes shard `name` once all its bytes are written: make it visible.
    fn commit(&mut self, name: &str, shard: Self::Shard) -> Result<()>;
}

/// Writes shards under a local folder, each to a temporary name in the same folder first, then
/// flushed, fsynced and renamed, so a shard is either complete or absent. A shard dropped before
/// it is committed (an error mid-way) has its temporary file removed.
#[derive(Debug, Clone)]
pub struct DirSink {
    root: PathBuf,
}

impl DirSink {
    /// Shards go under `root` (created if missing; a pattern may name subfolders).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirSink { root: root.into() }
    }
}

/// A shard being written by [`DirSink`].
pub struct DirShard {
    file: Option<BufWriter<File>>,
    tmp: PathBuf,
}

impl Write for DirShard {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.file {
            Some(f) => f.write(buf),
            None => Err(io::Error::other("shard already committed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for DirShard {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Not committed: leave no partial file behind.
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

impl ShardSink for DirSink {
    type Shard = DirShard;

    fn create(&mut self, name: &str) -> Result<DirShard> {
        check_relative("shard pattern", name)?;
        let dest = self.root.join(name);
        let dir = dest.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| FormatError::io(&dir, e))?;
        let base = dest
            .file_name()
            .map(|b| b.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{base}.tmp.{}", std::process::id()));
        let file = File::create(&tmp).map_err(|e| FormatError::io(&tmp, e))?;
        Ok(DirShard {
            file: Some(BufWriter::new(file)),
            tmp,
        })
    }

    fn commit(&mut self, name: &str, mut shard: DirShard) -> Result<()> {
        let dest = self.root.join(name);
        let tmp = shard.tmp.clone();
        let Some(writer) = shard.file.take() else {
            return Err(FormatError::io(
                &dest,
                io::Error::other("shard committed twice"),
            ));
        };
        let result = (|| {
            let file = writer.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            fs::rename(&tmp, &dest)?;
            if let Some(dir) = dest.parent() {
                // Make the rename itself durable; not every filesystem lets a folder be fsynced.
                if let Ok(d) = File::open(dir) {
                    let _ = d.sync_all();
                }
            }
            Ok(())
        })();
        result.map_err(|e: io::Error| {
            let _ = fs::remove_file(&tmp);
            FormatError::io(&dest, e)
        })
    }
}

/// How a [`ShardWriter`] splits and writes shards.
#[derive(Debug, Clone)]
pub struct ShardWriterOptions {
    /// Samples per shard at most (WebDataset's `maxcount`, default 100000).
    pub maxcount: u64,
    /// A new shard starts once the current one's payload reaches this many bytes (WebDataset's
    /// `maxsize`, default 3e9). Payload = the fields' bytes, not tar headers and padding.
    pub maxsize: u64,
    /// Number of the first shard (WebDataset's `start_shard`).
    pub start_shard: u64,
    /// Member mtime ([`DEFAULT_MTIME`] by default).
    pub mtime: u64,
    /// Gzip each shard (name it `.tar.gz` in the pattern).
    pub gzip: bool,
}

impl Default for ShardWriterOptions {
    fn default() -> Self {
        ShardWriterOptions {
            maxcount: 100_000,
            maxsize: 3_000_000_000,
            start_shard: 0,
            mtime: DEFAULT_MTIME,
            gzip: false,
        }
    }
}

/// What one finished shard holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard's name (the formatted pattern).
    pub name: String,
    /// Samples in it.
    pub samples: u64,
    /// Payload bytes (the fields' sizes).
    pub payload_bytes: u64,
    /// Bytes written to the sink (the tar, or the gzip of it).
    pub file_bytes: u64,
}

/// Counts the bytes that reach the sink.
struct Counting<W> {
    inner: W,
    count: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

enum ShardOut<W: Write> {
    Plain(Counting<W>),
    Gzip(GzEncoder<Counting<W>>),
}

impl<W: Write> Write for ShardOut<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ShardOut::Plain(w) => w.write(buf),
            ShardOut::Gzip(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            ShardOut::Plain(w) => w.flush(),
            ShardOut::Gzip(w) => w.flush(),
        }
    }
}

struct OpenShard<W: Write> {
    name: String,
    tar: TarWriter<ShardOut<W>>,
    samples: u64,
    payload: u64,
}

/// Writes samples into shards named by a printf pattern (`out-%06d.tar`), starting a new shard
/// before a sample when the current one has `maxcount` samples or `maxsize` payload bytes, as
/// WebDataset's `ShardWriter` does. Unlike it, no empty shard is written when there are no samples.
pub struct ShardWriter<S: ShardSink> {
    sink: S,
    pattern: String,
    options: ShardWriterOptions,
    next_shard: u64,
    current: Option<OpenShard<S::Shard>>,
    done: Vec<ShardInfo>,
}

impl ShardWriter<DirSink> {
    /// Writes shards under the local folder `dir` (see [`DirSink`]).
    pub fn to_dir(
        dir: impl AsRef<Path>,
        pattern: &str,
        options: ShardWriterOptions,
    ) -> Result<Self> {
        ShardWriter::new(DirSink::new(dir.as_ref()), pattern, options)
    }
}

impl<S: ShardSink> ShardWriter<S> {
    /// Writes shards through `sink`; `pattern` holds one `%d`-style conversion (`%06d`, `%d`, `%5d`;
    /// `%%` is a literal `%`).
    pub fn new(sink: S, pattern: &str, options: ShardWriterOptions) -> Result<Self> {
        format_pattern(pattern, 0)?;
        if options.maxcount == 0 {
            return Err(invalid("maxcount must be at least 1".into()));
        }
        Ok(ShardWriter {
            sink,
            pattern: pattern.to_string(),
            next_shard: options.start_shard,
            options,
            current: None,
            done: Vec::new(),
        })
    }

    /// Writes one sample, starting a new shard first when the current one is full.
    pub fn write(&mut self, sample: &WdsSample) -> Result<()> {
        let full = self.current.as_ref().is_some_and(|c| {
            c.samples >= self.options.maxcount || c.payload >= self.options.maxsize
        });
        if full {
            self.close_current()?;
        }
        if self.current.is_none() {
            self.open_next()?;
        }
        if let Some(cur) = self.current.as_mut() {
            cur.payload += cur.tar.write(sample)?;
            cur.samples += 1;
        }
        Ok(())
    }

    fn open_next(&mut self) -> Result<()> {
        let name = format_pattern(&self.pattern, self.next_shard)?;
        self.next_shard += 1;
        let counting = Counting {
            inner: self.sink.create(&name)?,
            count: 0,
        };
        let out = if self.options.gzip {
            ShardOut::Gzip(GzEncoder::new(counting, flate2::Compression::default()))
        } else {
            ShardOut::Plain(counting)
        };
        tracing::debug!(shard = %name, "writing WebDataset shard");
        self.current = Some(OpenShard {
            name,
            tar: TarWriter::new(out).with_mtime(self.options.mtime),
            samples: 0,
            payload: 0,
        });
        Ok(())
    }

    fn close_current(&mut self) -> Result<()> {
        let Some(cur) = self.current.take() else {
            return Ok(());
        };
        let out = cur.tar.finish()?;
        let counting = match out {
            ShardOut::Plain(c) => c,
            ShardOut::Gzip(g) => g.finish().map_err(|e| io_err(&cur.name, e))?,
        };
        let file_bytes = counting.count;
        self.sink.commit(&cur.name, counting.inner)?;
        self.done.push(ShardInfo {
            name: cur.name,
            samples: cur.samples,
            payload_bytes: cur.payload,
            file_bytes,
        });
        Ok(())
    }

    /// Finishes the last shard and returns every shard written, in order.
    pub fn finish(mut self) -> Result<Vec<ShardInfo>> {
        self.close_current()?;
        Ok(std::mem::take(&mut self.done))
    }
}

/// Python's `pattern % n` for one integer conversion (`%d`, `%i`, `%u`, with flags `0`/`-`/` `/`+`
/// and a width) and `%%`.
pub fn format_pattern(pattern: &str, n: u64) -> Result<String> {
    let bad = |why: &str| invalid(format!("shard pattern {pattern:?}: {why}"));
    let mut out = String::new();
    let mut conversions = 0;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        let mut flags = String::new();
        while let Some(&f) = chars.peek() {
            if matches!(f, '0' | '-' | ' ' | '+') {
                flags.push(f);
                chars.next();
            } else {
                break;
            }
        }
        let mut width = String::new();
        while let Some(&d) = chars.peek() {
            if d.is_ascii_digit() {
                width.push(d);
                chars.next();
            } else {
                break;
            }
        }
        match chars.next() {
            Some('d' | 'i' | 'u') => {}
            _ => return Err(bad("only one %d conversion (e.g. %06d) is supported")),
        }
        let width: usize = if width.is_empty() {
            0
        } else {
            width.parse().map_err(|_| bad("bad width"))?
        };
        let sign = if flags.contains('+') {
            "+"
        } else if flags.contains(' ') {
            " "
        } else {
            ""
        };
        let digits = format!("{sign}{n}");
        let text = if flags.contains('-') {
            format!("{digits:<width$}")
        } else if flags.contains('0') {
            format!("{sign}{n:0>w$}", w = width.saturating_sub(sign.len()))
        } else {
            format!("{digits:>width$}")
        };
        out.push_str(&text);
        conversions += 1;
    }
    if conversions != 1 {
        return Err(bad("needs exactly one %d conversion (e.g. out-%06d.tar)"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_patterns_like_python() {
        assert_eq!(format_pattern("out-%06d.tar", 3).unwrap(), "out-000003.tar");
        assert_eq!(format_pattern("s%d.tar", 12).unwrap(), "s12.tar");
        assert_eq!(format_pattern("%%-%3d", 7).unwrap(), "%-  7");
        assert_eq!(format_pattern("%-3d|", 7).unwrap(), "7  |");
        assert!(format_pattern("out.tar", 0).is_err());
        assert!(format_pattern("%d-%d", 0).is_err());
        assert!(format_pattern("%s", 0).is_err());
    }

    #[test]
    fn keys_with_dots_or_escapes_are_refused() {
        let mut w = TarWriter::new(Vec::new());
        let f = vec![("txt".to_string(), b"x".to_vec())];
        assert!(w.write_fields("a.b", &f).is_err());
        assert!(w.write_fields("../a", &f).is_err());
        assert!(w.write_fields("/a", &f).is_err());
        assert!(w
            .write_fields("k", &[("a".into(), vec![]), ("a".into(), vec![])])
            .is_err());
        assert_eq!(w.write_fields("dir.v1/k", &f).unwrap(), 1);
    }
}
