//! [`MdsWriter`]: Mosaic's `MDSWriter`, producing the same shard files and `index.json` bytes.
//!
//! Samples are encoded on the caller's thread. When a shard closes, its bytes go to a bounded pool
//! of worker threads that hash the raw file, compress it, hash the compressed file and hand it to
//! the [`ShardSink`]; the caller meanwhile keeps encoding. The index lists shards in order whatever
//! order the workers finish in, and is written last (Mosaic writes it once, in `finish`).
//!
//! Shard closing follows `base/writer.py:write` exactly: a shard's size starts at
//! `4 + 4 + len(config)`, each sample adds `len + 4`, and the shard is flushed *before* adding a
//! sample when `size_limit < size + len + 4`, even if it holds no sample yet (so a first sample
//! larger than the limit yields an empty shard, then an oversized one). Without a limit the writer
//! still closes shards at the format's 4 GiB ceiling rather than write unreadable offsets.
//!
//! ```
//! use std::sync::Arc;
//! use shardstream_sharding::mds::{LocalDirSink, MdsWriter, MdsWriterOptions, MdsDataset, DatasetOptions};
//! use shardstream_sharding::{Sample, Value};
//! let dir = tempfile::tempdir().unwrap();
//! let columns = vec![("id".to_string(), "int".to_string()), ("txt".to_string(), "str".to_string())];
//! let options = MdsWriterOptions { compression: Some("zstd".parse().unwrap()), ..Default::default() };
//! let mut writer = MdsWriter::new(&columns, options, Arc::new(LocalDirSink::new(dir.path()).unwrap())).unwrap();
//! for i in 0..10 {
//!     let mut s = Sample::new();
//!     s.insert("id".into(), Value::Int(i));
//!     s.insert("txt".into(), Value::Str(format!("sample {i}")));
//!     writer.write(&s).unwrap();
//! }
//! let index = writer.finish().unwrap();
//! assert_eq!(index.shards[0].zip_data.as_ref().unwrap().basename, "shard.00000.mds.zstd");
//! let dataset = MdsDataset::open(dir.path(), DatasetOptions::default()).unwrap();
//! assert_eq!(dataset.iter().count(), 10);
//! ```

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::compression::Compression;
use crate::error::{FormatError, Result};
use crate::hashing::{hash_hex, HashAlgorithm};
use crate::mds::index::{FileInfo, Index, ShardInfo, MAX_SHARD_BYTES};
use crate::mds::pyjson;
use crate::mds::shard::{encode_shard, Columns};
use crate::mds::sink::ShardSink;
use crate::value::Sample;

/// Mosaic's default shard size limit (64 MiB).
pub const DEFAULT_SIZE_LIMIT: u64 = 1 << 26;

/// The name of the index file.
pub const INDEX_BASENAME: &str = "index.json";

/// Writer settings, mirroring `MDSWriter`'s arguments.
#[derive(Debug, Clone)]
pub struct MdsWriterOptions {
    /// Compression of shard files (`None` writes them raw).
    pub compression: Option<Compression>,
    /// Hashes recorded for each file; must be sorted by name and unique, as Mosaic requires.
    pub hashes: Vec<HashAlgorithm>,
    /// Shard size limit in bytes; `None` (or 0, as in Mosaic) for no limit. Must be `< 2^32`.
    pub size_limit: Option<u64>,
    /// Worker threads that compress, hash and store finished shards; 0 does it on the caller's
    /// thread.
    pub threads: usize,
}

impl Default for MdsWriterOptions {
    fn default() -> Self {
        MdsWriterOptions {
            compression: None,
            hashes: Vec::new(),
            size_limit: Some(DEFAULT_SIZE_LIMIT),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
        }
    }
}

/// A closed shard on its way to the sink.
struct Job {
    seq: usize,
    raw_name: String,
    raw: Vec<u8>,
    samples: u64,
}

/// What every job needs besides its bytes.
struct Shared {
    template: ShardInfo,
    compression: Option<Compression>,
    hashes: Vec<HashAlgorithm>,
    sink: Arc<dyn ShardSink>,
}

impl Shared {
    fn process(&self, job: Job) -> Result<ShardInfo> {
        let file_info = |basename: String, data: &[u8]| FileInfo {
            basename,
            bytes: data.len() as u64,
            hashes: self
                .hashes
                .iter()
                .map(|&a| (a.name().to_string(), hash_hex(a, data)))
                .collect::<BTreeMap<_, _>>(),
        };
        let mut info = self.template.clone();
        info.samples = job.samples;
        info.raw_data = file_info(job.raw_name.clone(), &job.raw);
        match &self.compression {
            None => self.sink.put(&job.raw_name, job.raw)?,
            Some(c) => {
                let zip_name = format!("{}.{}", job.raw_name, c.extension());
                let zip = c.compress(&job.raw)?;
                drop(job.raw);
                info.zip_data = Some(file_info(zip_name.clone(), &zip));
                self.sink.put(&zip_name, zip)?;
            }
        }
        Ok(info)
    }
}

type Outcome = (usize, Result<ShardInfo>);

/// The worker pool; dropping it lets queued jobs finish and joins the threads.
struct Pool {
    jobs: Option<SyncSender<Job>>,
    results: Receiver<Outcome>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    fn new(threads: usize, shared: Arc<Shared>) -> Result<Pool> {
        // One queued shard per worker keeps memory at about (2 * threads + 1) shards.
        let (job_tx, job_rx) = mpsc::sync_channel::<Job>(threads);
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (result_tx, results) = mpsc::channel();
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let job_rx = Arc::clone(&job_rx);
            let result_tx = result_tx.clone();
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("mds-writer-{i}"))
                .spawn(move || loop {
                    let job = match job_rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let seq = job.seq;
                    if result_tx.send((seq, shared.process(job))).is_err() {
                        return;
                    }
                })
                .map_err(|e| FormatError::io("<mds writer thread>", e))?;
            workers.push(handle);
        }
        Ok(Pool {
            jobs: Some(job_tx),
            results,
            workers,
        })
    }

    fn shutdown(&mut self) {
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Writes an MDS dataset through a [`ShardSink`]. Call [`MdsWriter::finish`] at the end; dropping
/// the writer without it stores the shards already closed but no index.
pub struct MdsWriter {
    columns: Arc<Columns>,
    config: Vec<u8>,
    size_limit: Option<u64>,
    extra_bytes_per_shard: u64,
    shared: Arc<Shared>,
    pool: Option<Pool>,
    body: Vec<u8>,
    sizes: Vec<u32>,
    shard_size: u64,
    next_seq: usize,
    done: BTreeMap<usize, ShardInfo>,
    failure: Option<FormatError>,
    failed: bool,
    scratch: Vec<u8>,
    samples_written: u64,
    prefixes: u32,
}

/// The folder of shard `seq` among `prefixes` hashed ones (`p00` .. `p{n-1}` in hex), so that
/// consecutive shards land under different key prefixes of an object store.
pub fn shard_prefix(seq: usize, prefixes: u32) -> String {
    let width = format!("{:x}", prefixes.saturating_sub(1).max(1))
        .len()
        .max(2);
    let slot =
        xxhash_rust::xxh64::xxh64(&(seq as u64).to_le_bytes(), 0) % u64::from(prefixes.max(1));
    format!("p{slot:0width$x}")
}

impl MdsWriter {
    /// Writes shards under `prefixes` hashed folders (`p07/shard.00012.mds`) instead of the
    /// dataset's top folder; 0 or 1 keeps them at the top. The index's basenames carry the
    /// folder, as those of Mosaic's `merge_index` do, so Mosaic reads the dataset unchanged.
    pub fn spread_over_prefixes(&mut self, prefixes: u32) {
        self.prefixes = prefixes;
    }

    /// A writer for `columns` (name to encoding string, any order) with `options`, storing files
    /// through `sink`.
    pub fn new(
        columns: &[(String, String)],
        options: MdsWriterOptions,
        sink: Arc<dyn ShardSink>,
    ) -> Result<MdsWriter> {
        if columns.is_empty() {
            return Err(FormatError::InvalidArgument("no columns given".into()));
        }
        let columns = Arc::new(Columns::new(columns)?);
        if options.hashes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(FormatError::InvalidArgument(
                "hashes must be unique and in sorted order".into(),
            ));
        }
        let size_limit = options.size_limit.filter(|&l| l > 0);
        if let Some(limit) = size_limit {
            if limit > MAX_SHARD_BYTES {
                return Err(FormatError::InvalidArgument(format!(
                    "size_limit must be less than 2**32, got {limit}: sample offsets are u32"
                )));
            }
        }
        let hash_names: Vec<String> = options
            .hashes
            .iter()
            .map(|h| h.name().to_string())
            .collect();
        let template = ShardInfo {
            column_encodings: columns.encoding_names().to_vec(),
            column_names: columns.names().to_vec(),
            column_sizes: columns.sizes().to_vec(),
            compression: options.compression.map(|c| c.to_string()),
            format: "mds".into(),
            hashes: hash_names,
            raw_data: FileInfo {
                basename: String::new(),
                bytes: 0,
                hashes: BTreeMap::new(),
            },
            samples: 0,
            size_limit,
            version: 2,
            zip_data: None,
        };
        let config = pyjson::dumps(&template.config_json_value(), true).into_bytes();
        let extra_bytes_per_shard = 4 + 4 + config.len() as u64;
        let shared = Arc::new(Shared {
            template,
            compression: options.compression,
            hashes: options.hashes,
            sink,
        });
        let pool = match options.threads {
            0 => None,
            n => Some(Pool::new(n, Arc::clone(&shared))?),
        };
        Ok(MdsWriter {
            columns,
            config,
            size_limit,
            extra_bytes_per_shard,
            shared,
            pool,
            body: Vec::new(),
            sizes: Vec::new(),
            shard_size: extra_bytes_per_shard,
            next_seq: 0,
            done: BTreeMap::new(),
            failure: None,
            failed: false,
            scratch: Vec::new(),
            samples_written: 0,
            prefixes: 0,
        })
    }

    /// The column layout (sorted by name), for callers that encode samples themselves.
    pub fn columns(&self) -> &Arc<Columns> {
        &self.columns
    }

    /// The config JSON written at the head of every shard.
    pub fn config_json(&self) -> &[u8] {
        &self.config
    }

    /// Samples accepted so far.
    pub fn samples_written(&self) -> u64 {
        self.samples_written
    }

    /// Shards closed so far (including any still being compressed or stored).
    pub fn shards_closed(&self) -> usize {
        self.next_seq
    }

    /// Encodes and adds one sample, closing the current shard first if the sample would not fit.
    pub fn write(&mut self, sample: &Sample) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let result = self
            .columns
            .encode_sample(sample, &mut scratch)
            .and_then(|()| self.write_encoded(&scratch));
        self.scratch = scratch;
        result
    }

    /// Adds one sample already encoded with [`Columns::encode_sample`] for this writer's columns.
    pub fn write_encoded(&mut self, encoded: &[u8]) -> Result<()> {
        self.check_failure()?;
        let sample_size = encoded.len() as u64 + 4;
        if self.extra_bytes_per_shard + sample_size > MAX_SHARD_BYTES {
            return Err(FormatError::ShardTooLarge {
                path: self.raw_name(self.next_seq),
                size: self.extra_bytes_per_shard + sample_size,
                limit: MAX_SHARD_BYTES,
            });
        }
        let limit = self.size_limit.unwrap_or(MAX_SHARD_BYTES);
        if limit < self.shard_size + sample_size {
            self.flush_shard()?;
        }
        self.body.extend_from_slice(encoded);
        self.sizes.push(encoded.len() as u32);
        self.shard_size += sample_size;
        self.samples_written += 1;
        Ok(())
    }

    /// Closes the last shard, waits for every shard to be stored, writes `index.json` and returns
    /// the index.
    pub fn finish(mut self) -> Result<Index> {
        self.check_failure()?;
        if !self.sizes.is_empty() {
            self.flush_shard()?;
        }
        if let Some(mut pool) = self.pool.take() {
            pool.jobs = None;
            while self.done.len() < self.next_seq {
                match pool.results.recv() {
                    Ok((seq, Ok(info))) => {
                        self.done.insert(seq, info);
                    }
                    Ok((_, Err(e))) => return Err(e),
                    Err(_) => {
                        return Err(FormatError::InvalidArgument(
                            "a shard writer thread stopped unexpectedly".into(),
                        ))
                    }
                }
            }
            pool.shutdown();
        }
        let index = Index {
            version: 2,
            shards: std::mem::take(&mut self.done).into_values().collect(),
        };
        self.shared
            .sink
            .put(INDEX_BASENAME, index.to_json().into_bytes())?;
        tracing::info!(
            shards = index.shards.len(),
            samples = self.samples_written,
            "wrote MDS index"
        );
        Ok(index)
    }

    fn raw_name(&self, seq: usize) -> String {
        if self.prefixes > 1 {
            format!("{}/shard.{seq:05}.mds", shard_prefix(seq, self.prefixes))
        } else {
            format!("shard.{seq:05}.mds")
        }
    }

    fn flush_shard(&mut self) -> Result<()> {
        let seq = self.next_seq;
        let raw_name = self.raw_name(seq);
        let raw = encode_shard(&raw_name, &self.config, &self.sizes, &self.body)?;
        let job = Job {
            seq,
            raw_name,
            raw,
            samples: self.sizes.len() as u64,
        };
        self.next_seq += 1;
        self.body.clear();
        self.sizes.clear();
        self.shard_size = self.extra_bytes_per_shard;
        match &self.pool {
            None => match self.shared.process(job) {
                Ok(info) => {
                    self.done.insert(seq, info);
                }
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            },
            Some(pool) => {
                let sent = pool.jobs.as_ref().map(|tx| tx.send(job));
                if !matches!(sent, Some(Ok(()))) {
                    self.collect_results();
                    self.check_failure()?;
                    return Err(FormatError::InvalidArgument(
                        "shard writer threads are gone".into(),
                    ));
                }
                self.collect_results();
            }
        }
        Ok(())
    }

    /// Gathers finished shards without blocking, remembering the first failure.
    fn collect_results(&mut self) {
        let Some(pool) = &self.pool else { return };
        while let Ok((seq, outcome)) = pool.results.try_recv() {
            match outcome {
                Ok(info) => {
                    self.done.insert(seq, info);
                }
                Err(e) => {
                    if self.failure.is_none() && !self.failed {
                        self.failure = Some(e);
                    }
                }
            }
        }
    }

    fn check_failure(&mut self) -> Result<()> {
        self.collect_results();
        if let Some(e) = self.failure.take() {
            self.failed = true;
            return Err(e);
        }
        if self.failed {
            return Err(FormatError::InvalidArgument(
                "the writer failed earlier and cannot continue".into(),
            ));
        }
        Ok(())
    }
}
