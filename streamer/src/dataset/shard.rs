//! A decompressed shard on disk ([`ShardHandle`]) and one sample's bytes ([`RawSample`]).
//!
//! A shard is never loaded whole: the handle keeps the file open and its offset table (4 bytes
//! per sample), and reads samples with positioned reads (`pread`), so a 1 GiB shard costs a
//! file descriptor and its table, not 1 GiB of RAM. The handle holds the cache lease, which pins
//! the file on the node while any clone of the handle lives. A handle on a shard this process is
//! still downloading reads its temp file, each read waiting for its bytes (`growing`), and takes
//! over the lease when the download commits.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shardstream_sharding::mds::Columns;
use shardstream_sharding::value::Value;
use shardstream_sharding::Sample;

use super::format::{locate_all, LitFields, SampleSchema, ShardSchema, WdsTable};

use super::growing::{Growing, Landing};
use crate::buffers::{PooledBuffer, ReadAlloc};
use crate::cache::ShardLease;
use crate::error::{Result, StreamerError};

/// An open, pinned, decompressed shard. Cheap to clone; the file stays pinned (never evicted)
/// until the last clone is dropped.
#[derive(Debug, Clone)]
pub struct ShardHandle {
    inner: Arc<HandleInner>,
}

#[derive(Debug)]
struct HandleInner {
    shard: usize,
    /// The shard's URL or source path, for error messages.
    name: Arc<str>,
    file: File,
    len: u64,
    /// Where each sample lies.
    layout: Layout,
    /// Global sample id of the shard's first sample.
    first_sample: u64,
    /// The file's path (the cache's temp name while the shard is still growing).
    path: PathBuf,
    /// The cache pin; `None` only while being dropped.
    pin: Option<Pin>,
    /// Set while (and after) the shard downloads in this process: reads wait for its prefix.
    growing: Option<Growing>,
    pid: u32,
}

/// Where a shard's samples lie in its file.
#[derive(Debug)]
enum Layout {
    /// MDS: `offsets[i]..offsets[i + 1]` is sample `i` (`offsets.len() == samples + 1`), whose
    /// columns `columns` splits.
    Mds {
        offsets: Vec<u32>,
        columns: Arc<Columns>,
    },
    /// LitData: the same header and offset table; each item's leaves.
    LitData {
        offsets: Vec<u32>,
        fields: Arc<LitFields>,
    },
    /// A tar: each sample's members, located when the shard was opened.
    Wds(WdsTable),
}

/// What keeps the file pinned in the cache.
#[derive(Debug)]
enum Pin {
    /// A complete file's lease (held for its drop, which unpins).
    Lease(#[allow(dead_code)] ShardLease),
    /// A growing file's: the lease arrives when its writer commits.
    Landing(Arc<Landing>),
}

impl Drop for HandleInner {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // Inherited through fork: the lock descriptor is shared with the parent, and
            // dropping it here would unpin the parent's shard. Leak it instead.
            std::mem::forget(self.pin.take());
        }
    }
}

impl ShardHandle {
    /// Opens the decompressed file behind `lease`, checking its header against the index: the
    /// sample count, and offsets that rise from past the table to exactly the end of the file.
    pub(crate) fn open(
        shard: usize,
        name: Arc<str>,
        lease: ShardLease,
        schema: ShardSchema,
        samples: u64,
        first_sample: u64,
    ) -> Result<ShardHandle> {
        let path = lease.path().to_path_buf();
        let file = File::open(&path).map_err(|source| StreamerError::Io {
            op: "open shard",
            path: path.clone(),
            source,
        })?;
        let len = file
            .metadata()
            .map_err(|source| StreamerError::Io {
                op: "stat shard",
                path: path.clone(),
                source,
            })?
            .len();
        let opened = Opened {
            shard,
            name,
            file,
            path,
            len,
            pin: Pin::Lease(lease),
            growing: None,
        };
        opened.check(schema, samples, first_sample)
    }

    /// Opens a decompressed shard that this process is still writing (`file` is its temp
    /// file, `len` its size when complete). Waits only for the header and offset table; each
    /// read then waits for the bytes it needs. The pin is taken over from `landing` once the
    /// writer commits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_growing(
        shard: usize,
        name: Arc<str>,
        (file, path, len): (File, PathBuf, u64),
        growing: Growing,
        landing: Arc<Landing>,
        schema: ShardSchema,
        samples: u64,
        first_sample: u64,
    ) -> Result<ShardHandle> {
        let opened = Opened {
            shard,
            name,
            file,
            path,
            len,
            pin: Pin::Landing(landing),
            growing: Some(growing),
        };
        opened.check(schema, samples, first_sample)
    }

    /// The shard's number in the index.
    pub fn shard(&self) -> usize {
        self.inner.shard
    }

    /// The size of the decompressed shard in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether the decompressed shard is empty (never, for a valid MDS shard).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The decompressed file (in the cache, or the source itself when read in place).
    pub fn path(&self) -> &Path {
        match &self.inner.pin {
            Some(Pin::Landing(landing)) => landing.path().unwrap_or(&self.inner.path),
            _ => &self.inner.path,
        }
    }

    /// Samples in the shard.
    pub fn num_samples(&self) -> u64 {
        match &self.inner.layout {
            Layout::Mds { offsets, .. } | Layout::LitData { offsets, .. } => {
                (offsets.len() - 1) as u64
            }
            Layout::Wds(table) => table.len(),
        }
    }

    /// Reads decompressed bytes at `offset` (as `pread`): returns how many were read, 0 at the
    /// end of the shard.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if offset >= self.inner.len {
            return Ok(0);
        }
        let want = buf.len().min((self.inner.len - offset) as usize);
        self.wait_for(offset + want as u64)?;
        read_exact_at(&self.inner.file, &self.inner.path, &mut buf[..want], offset)?;
        Ok(want)
    }

    /// The byte range of sample `i` in the file.
    pub(crate) fn sample_range(&self, i: u64) -> Result<Range<u64>> {
        let n = self.num_samples();
        if i >= n {
            return Err(StreamerError::OutOfRange {
                what: "sample",
                index: i,
                len: n,
            });
        }
        let i = i as usize;
        Ok(match &self.inner.layout {
            Layout::Mds { offsets, .. } | Layout::LitData { offsets, .. } => {
                u64::from(offsets[i])..u64::from(offsets[i + 1])
            }
            Layout::Wds(table) => table.span(i),
        })
    }

    /// Reads sample `i` (its own buffer).
    pub fn sample(&self, i: u64) -> Result<RawSample> {
        let range = self.sample_range(i)?;
        self.wait_for(range.end)?;
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        read_exact_at(&self.inner.file, &self.inner.path, &mut buf, range.start)?;
        let len = buf.len();
        self.raw_sample(i, Arc::new(PooledBuffer::unpooled(buf)), 0..len)
    }

    /// Reads samples `first..last` into `buf` (one `pread`), reusing its allocation; returns
    /// the file offset of `buf[0]`.
    pub(crate) fn read_run(&self, first: u64, last: u64, buf: &mut ReadAlloc) -> Result<u64> {
        let start = self.sample_range(first)?.start;
        let end = self.sample_range(last - 1)?.end;
        self.wait_for(end)?;
        // Only growth is zeroed: a recycled buffer of the same size costs no page faults.
        buf.set_len((end - start) as usize);
        read_exact_at(
            &self.inner.file,
            &self.inner.path,
            buf.as_mut_slice(),
            start,
        )?;
        Ok(start)
    }

    /// Waits until the first `end` bytes of a shard still downloading are written (at once for
    /// a complete shard). Errors if its download failed.
    pub(crate) fn wait_for(&self, end: u64) -> Result<()> {
        match &self.inner.growing {
            Some(g) => g.wait_blocking(end).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Bytes from the start that can be read now without waiting.
    pub(crate) fn readable(&self) -> u64 {
        match &self.inner.growing {
            Some(g) => g.readable().min(self.inner.len),
            None => self.inner.len,
        }
    }

    /// Waits until the shard is complete and committed to the cache (at once for a complete
    /// shard). Errors if its download failed.
    pub(crate) async fn complete(&self) -> Result<()> {
        match &self.inner.growing {
            Some(g) => g.wait(u64::MAX).await.map(|_| ()),
            None => Ok(()),
        }
    }

    /// Whether the file is a local source read where it is (it takes no room in the cache).
    pub(crate) fn in_place(&self) -> bool {
        matches!(&self.inner.pin, Some(Pin::Lease(l)) if l.origin() == crate::cache::LeaseOrigin::InPlace)
    }

    /// Whether every byte of the shard is on disk (false while it downloads).
    pub fn is_complete(&self) -> bool {
        self.inner.growing.as_ref().is_none_or(Growing::is_done)
    }

    /// A sample whose bytes are `buf[range]`: splits its columns (bounds-checked).
    pub(crate) fn raw_sample(
        &self,
        i: u64,
        buf: Arc<PooledBuffer>,
        range: Range<usize>,
    ) -> Result<RawSample> {
        let bytes = buf
            .get(range.clone())
            .ok_or_else(|| StreamerError::Corrupt {
                what: self.inner.name.to_string(),
                reason: format!("sample {i} lies outside its read"),
            })?;
        let (cols, schema, key) = match &self.inner.layout {
            Layout::Mds { columns, .. } => {
                let mut cols = columns
                    .split_ranges(&self.inner.name, i, bytes)
                    .map_err(StreamerError::from)?;
                for col in &mut cols {
                    *col = col.start + range.start..col.end + range.start;
                }
                (cols, SampleSchema::Mds(Arc::clone(columns)), None)
            }
            Layout::LitData { fields, .. } => {
                let mut cols = fields.split(&self.inner.name, i, bytes)?;
                for col in &mut cols {
                    *col = col.start + range.start..col.end + range.start;
                }
                (cols, SampleSchema::LitData(Arc::clone(fields)), None)
            }
            Layout::Wds(table) => {
                let at = i as usize;
                let base = table.span(at).start;
                let cols = table
                    .fields(at)
                    .iter()
                    .map(|f| {
                        let start = (f.start - base) as usize + range.start;
                        start..start + (f.end - f.start) as usize
                    })
                    .collect::<Vec<_>>();
                if cols.last().is_some_and(|c| c.end > range.end) {
                    return Err(StreamerError::Corrupt {
                        what: self.inner.name.to_string(),
                        reason: format!("sample {i} lies outside its read"),
                    });
                }
                let key = Some(Arc::clone(table.key(at)));
                (cols, table.schema(at).clone(), key)
            }
        };
        Ok(RawSample {
            buf,
            range,
            cols,
            schema,
            key,
            name: Arc::clone(&self.inner.name),
            shard: self.inner.shard,
            in_shard: i,
            index: self.inner.first_sample + i,
        })
    }

    /// Global sample id of the shard's first sample.
    pub fn first_sample(&self) -> u64 {
        self.inner.first_sample
    }
}

/// A shard file opened but not yet checked.
struct Opened {
    shard: usize,
    name: Arc<str>,
    file: File,
    path: PathBuf,
    len: u64,
    pin: Pin,
    growing: Option<Growing>,
}

impl Opened {
    /// Reads and checks the header and offset table (waiting for them if the file grows).
    fn check(self, schema: ShardSchema, samples: u64, first_sample: u64) -> Result<ShardHandle> {
        let Opened {
            shard,
            name,
            file,
            path,
            len,
            pin,
            growing,
        } = self;
        let wait = |end: u64| match &growing {
            Some(g) => g.wait_blocking(end.min(len)).map(|_| ()),
            None => Ok(()),
        };
        let corrupt = |reason: String| StreamerError::Corrupt {
            what: name.to_string(),
            reason,
        };
        let columns = match schema {
            ShardSchema::Mds(columns) => Ok(columns),
            ShardSchema::LitData(fields) => Err(fields),
            ShardSchema::Wds => {
                // A tar's samples are found by reading its member headers: the whole file.
                wait(len)?;
                let reader = std::io::BufReader::with_capacity(1 << 20, ReadFrom::start(&file));
                let (located, read) = locate_all(&name, reader)?;
                if read != len {
                    return Err(corrupt(format!("{read} bytes read of {len}")));
                }
                if located.len() as u64 != samples {
                    return Err(corrupt(format!(
                        "the tar holds {} samples, {samples} when it was counted",
                        located.len()
                    )));
                }
                let table = WdsTable::new(&name, located, len)?;
                return Ok(ShardHandle {
                    inner: Arc::new(HandleInner {
                        shard,
                        name,
                        file,
                        len,
                        layout: Layout::Wds(table),
                        first_sample,
                        path,
                        pin: Some(pin),
                        growing,
                        pid: std::process::id(),
                    }),
                });
            }
        };
        let mut head = [0u8; 4];
        wait(4)?;
        read_exact_at(&file, &path, &mut head, 0)
            .map_err(|_| corrupt(format!("{len} bytes, too short for a header")))?;
        let n = u64::from(u32::from_le_bytes(head));
        if n != samples {
            return Err(corrupt(format!(
                "header holds {n} samples, the index says {samples}"
            )));
        }
        let table_end = 4 + 4 * (n + 1);
        if table_end > len {
            return Err(corrupt(format!(
                "offset table of {n} samples needs {table_end} bytes, the file has {len}"
            )));
        }
        wait(table_end)?;
        let mut raw = vec![0u8; (4 * (n + 1)) as usize];
        read_exact_at(&file, &path, &mut raw, 4)?;
        let offsets: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut prev = table_end;
        for (i, &off) in offsets.iter().enumerate() {
            let off = u64::from(off);
            if off < prev {
                return Err(corrupt(format!(
                    "offset {i} ({off}) is below the previous one or inside the offset table"
                )));
            }
            prev = off;
        }
        if prev != len {
            return Err(corrupt(format!(
                "the last offset is {prev}, the file has {len} bytes"
            )));
        }
        Ok(ShardHandle {
            inner: Arc::new(HandleInner {
                shard,
                name,
                file,
                len,
                layout: match columns {
                    Ok(columns) => Layout::Mds { offsets, columns },
                    Err(fields) => Layout::LitData { offsets, fields },
                },
                first_sample,
                path,
                pin: Some(pin),
                growing,
                pid: std::process::id(),
            }),
        })
    }
}

fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
    file.read_exact_at(buf, offset)
        .map_err(|source| StreamerError::Io {
            op: "read shard",
            path: PathBuf::from(path),
            source,
        })
}

/// The bytes of one sample: a shared buffer and ranges into it. Cloning is cheap (an `Arc` and
/// a few ranges); the bytes are never copied again after the read from the shard file.
#[derive(Debug, Clone)]
pub struct RawSample {
    buf: Arc<PooledBuffer>,
    range: Range<usize>,
    cols: Vec<Range<usize>>,
    schema: SampleSchema,
    /// A WebDataset sample's key.
    key: Option<Arc<str>>,
    name: Arc<str>,
    shard: usize,
    in_shard: u64,
    index: u64,
}

impl RawSample {
    /// The global sample id.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The shard it comes from.
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// Its index inside its shard.
    pub fn index_in_shard(&self) -> u64 {
        self.in_shard
    }

    /// The raw bytes of each column, in the index's column order (zero copy).
    pub fn columns(&self) -> Vec<&[u8]> {
        self.cols.iter().map(|r| &self.buf[r.clone()]).collect()
    }

    /// The raw bytes of column `c` (in the index's column order), or `None` past the last
    /// column; no allocation, unlike [`RawSample::columns`].
    pub fn column(&self, c: usize) -> Option<&[u8]> {
        self.cols.get(c).and_then(|r| self.buf.get(r.clone()))
    }

    /// How many columns it has.
    pub fn num_columns(&self) -> usize {
        self.cols.len()
    }

    /// The column names, in the same order as [`RawSample::columns`] (a WebDataset sample's
    /// member extensions).
    pub fn column_names(&self) -> &[String] {
        self.schema.names()
    }

    /// What its columns are and how they decode: its shard's MDS columns, or a WebDataset
    /// sample's fields. Samples of one shard share it (compare with `Arc::ptr_eq`).
    pub fn schema(&self) -> &SampleSchema {
        &self.schema
    }

    /// A WebDataset sample's key (`__key__`); `None` for MDS.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The sample's encoded bytes as stored in the shard (column sizes and column bytes).
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.range.clone()]
    }

    /// Decodes every column (as mosaicml-streaming decodes them). A WebDataset sample gives
    /// `__key__`, `__url__` and each member's bytes, undecoded.
    pub fn decode(&self) -> Result<Sample> {
        match &self.schema {
            SampleSchema::Mds(columns) => {
                Ok(columns.decode_sample(&self.name, self.in_shard, self.bytes())?)
            }
            SampleSchema::Wds(fields) => {
                let mut sample = Sample::new();
                let key = self.key.as_deref().unwrap_or_default();
                sample.insert("__key__".into(), Value::Str(key.into()));
                sample.insert("__url__".into(), Value::Str(fields.url.to_string()));
                for (name, col) in fields.names.iter().zip(self.columns()) {
                    sample.insert(name.clone(), Value::Bytes(col.to_vec()));
                }
                Ok(sample)
            }
            SampleSchema::LitData(fields) => {
                let values = fields
                    .decoder
                    .decode(&self.name, self.in_shard, self.bytes())?;
                Ok(fields.decoder.columns.iter().cloned().zip(values).collect())
            }
        }
    }
}

/// A sample's schema, its key (WebDataset) and its fields' byte ranges in the shard file.
pub type SampleFields = (SampleSchema, Option<Arc<str>>, Vec<Range<u64>>);

impl ShardHandle {
    /// Sample `i`'s fields where they lie in the file: its schema, its key (WebDataset), and
    /// each field's absolute byte range, in the schema's order (a per-item zstd LitData item:
    /// one range, the frame). A tar's ranges come from its table without a read; an MDS or
    /// LitData sample is read to split it. For listings (the FUSE `samples/` view).
    pub fn sample_fields(&self, i: u64) -> Result<SampleFields> {
        if let Layout::Wds(table) = &self.inner.layout {
            self.sample_range(i)?;
            let at = i as usize;
            let ranges = table.fields(at).to_vec();
            return Ok((
                table.schema(at).clone(),
                Some(Arc::clone(table.key(at))),
                ranges,
            ));
        }
        let base = self.sample_range(i)?.start;
        let sample = self.sample(i)?;
        let ranges = sample
            .cols
            .iter()
            .map(|c| base + c.start as u64..base + c.end as u64)
            .collect();
        Ok((sample.schema, None, ranges))
    }
}

/// Reads a file from its start with positioned reads, whatever its cursor: a cached tar's file
/// may be shared with an earlier open that read it to its end.
struct ReadFrom<'a> {
    file: &'a File,
    pos: u64,
}

impl<'a> ReadFrom<'a> {
    fn start(file: &'a File) -> Self {
        ReadFrom { file, pos: 0 }
    }
}

impl std::io::Read for ReadFrom<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}
