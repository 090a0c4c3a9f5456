//! A test double for [`DatasetSource`]: an MDS dataset written by the real writer into memory,
//! with fault injection and a count of shard opens.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod peers;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use shardstream_fuse::{DatasetSource, MemoryShard, ShardData, SourceError, SourceErrorKind};
use shardstream_sharding::mds::{Index, MdsWriter, MdsWriterOptions, ShardSink};
use shardstream_sharding::{Sample, Value};

#[derive(Default)]
struct MemSink(Mutex<HashMap<String, Vec<u8>>>);

impl ShardSink for MemSink {
    fn put(&self, name: &str, data: Vec<u8>) -> shardstream_sharding::Result<()> {
        self.0.lock().unwrap().insert(name.to_string(), data);
        Ok(())
    }
}

/// The dataset in memory.
pub struct MemDataset {
    pub index_json: Vec<u8>,
    pub index: Index,
    /// Raw (decompressed) bytes of each shard.
    pub shards: Vec<Arc<Vec<u8>>>,
    pub fail: AtomicBool,
    pub opens: AtomicUsize,
    pub opened: Mutex<Vec<usize>>,
    pub budget: Option<u64>,
}

/// Writes `samples` with `columns` into shards of at most `shard_size` bytes.
pub fn write(columns: &[(&str, &str)], samples: &[Sample], shard_size: u64) -> MemDataset {
    let sink = Arc::new(MemSink::default());
    let cols: Vec<(String, String)> = columns
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let options = MdsWriterOptions {
        size_limit: Some(shard_size),
        threads: 0,
        ..MdsWriterOptions::default()
    };
    let mut writer = MdsWriter::new(&cols, options, sink.clone()).unwrap();
    for s in samples {
        writer.write(s).unwrap();
    }
    let index = writer.finish().unwrap();
    let files = sink.0.lock().unwrap();
    let shards = index
        .shards
        .iter()
        .map(|s| Arc::new(files[&s.raw_data.basename].clone()))
        .collect();
    MemDataset {
        index_json: index.to_json().into_bytes(),
        index,
        shards,
        fail: AtomicBool::new(false),
        opens: AtomicUsize::new(0),
        opened: Mutex::new(Vec::new()),
        budget: None,
    }
}

/// `n` samples of columns `id` (int), `text` (str, variable) and `blob` (bytes, variable).
pub fn mixed(n: usize, shard_size: u64) -> MemDataset {
    let samples: Vec<Sample> = (0..n)
        .map(|i| {
            let mut s = Sample::new();
            s.insert("id".into(), Value::Int(i as i64));
            s.insert("text".into(), Value::Str(format!("sample number {i}")));
            s.insert(
                "blob".into(),
                Value::Bytes((0..(i * 37 % 500)).map(|j| (i * 7 + j) as u8).collect()),
            );
            s
        })
        .collect();
    write(
        &[("id", "int"), ("text", "str"), ("blob", "bytes")],
        &samples,
        shard_size,
    )
}

/// A folder-of-files dataset: `(path, bytes)`.
pub fn files(entries: &[(String, Vec<u8>)], shard_size: u64) -> MemDataset {
    let samples: Vec<Sample> = entries
        .iter()
        .map(|(p, d)| {
            let mut s = Sample::new();
            s.insert("path".into(), Value::Str(p.clone()));
            s.insert("data".into(), Value::Bytes(d.clone()));
            s
        })
        .collect();
    write(&[("path", "str"), ("data", "bytes")], &samples, shard_size)
}

impl DatasetSource for MemDataset {
    fn index_json(&self) -> &[u8] {
        &self.index_json
    }

    fn open_shard(&self, shard: usize) -> Result<Arc<dyn ShardData>, SourceError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(SourceError::new(
                SourceErrorKind::Unavailable,
                shard,
                "injected outage",
            ));
        }
        self.opens.fetch_add(1, Ordering::SeqCst);
        self.opened.lock().unwrap().push(shard);
        let data = self
            .shards
            .get(shard)
            .ok_or_else(|| SourceError::new(SourceErrorKind::Invalid, shard, "no such shard"))?;
        Ok(Arc::new(MemoryShard(Arc::clone(data))))
    }

    fn readahead_budget(&self) -> Option<u64> {
        self.budget
    }
}
