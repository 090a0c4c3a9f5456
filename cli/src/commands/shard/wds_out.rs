//! WebDataset output: tars named `shard-%06d.tar` (`.tar.gz` with `--compression gz`), cut at
//! `--shard-size` payload bytes (WebDataset's `maxsize`) or 100 000 samples (its `maxcount`).
//!
//! A sample's key is its `__key__` column when it has one, else its index in the input, zero-
//! padded. Values become member bytes as WebDataset writes them: bytes and images as they are,
//! text as UTF-8, integers and numpy scalars as decimal text, JSON as JSON; arrays, raw-pixel
//! images and lists have no single WebDataset encoding and are refused.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use bytes::Bytes;
use indicatif::ProgressBar;
use shardstream_sharding::input::Input;
use shardstream_sharding::mds::pyjson::float_repr;
use shardstream_sharding::value::Value;
use shardstream_sharding::wds::{self, DirSink, ShardWriter, ShardWriterOptions, WdsSample};
use shardstream_sharding::{FormatError, Sample};
use shardstream_storage::Location;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::pipeline::run_ordered;

/// Collects a shard in memory, then uploads it in the background (at most `permits` at once).
struct StoreSink {
    location: Location,
    runtime: tokio::runtime::Handle,
    permits: Arc<Semaphore>,
    uploads: Arc<Mutex<Vec<Upload>>>,
}

type Upload = JoinHandle<anyhow::Result<()>>;

impl wds::ShardSink for StoreSink {
    type Shard = Vec<u8>;

    fn create(&mut self, _name: &str) -> Result<Vec<u8>, FormatError> {
        Ok(Vec::new())
    }

    fn commit(&mut self, name: &str, shard: Vec<u8>) -> Result<(), FormatError> {
        let permit = self
            .runtime
            .block_on(Arc::clone(&self.permits).acquire_owned())
            .map_err(|e| FormatError::io(name, std::io::Error::other(e)))?;
        let (location, name) = (self.location.clone(), name.to_string());
        let upload = self.runtime.spawn(async move {
            let url = location.url_of(&name);
            location
                .put(&name, Bytes::from(shard))
                .await
                .with_context(|| format!("cannot upload {url}"))?;
            drop(permit);
            Ok(())
        });
        if let Ok(mut uploads) = self.uploads.lock() {
            uploads.push(upload);
        }
        Ok(())
    }
}

/// Writes `range` of `input` as WebDataset tars at `output`; returns the shards written.
pub fn write(
    input: &dyn Input,
    range: Range<u64>,
    output: &Location,
    runtime: &tokio::runtime::Runtime,
    workers: usize,
    options: ShardWriterOptions,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<wds::ShardInfo>> {
    let pattern = if options.gzip {
        "shard-%06d.tar.gz"
    } else {
        "shard-%06d.tar"
    };
    let width = key_width(input.len());
    if let Some(dir) = output.local_root() {
        let mut writer = ShardWriter::new(DirSink::new(dir), pattern, options)?;
        feed(input, range, workers, width, &mut writer, bar)?;
        return Ok(writer.finish()?);
    }
    let uploads = Arc::new(Mutex::new(Vec::new()));
    let sink = StoreSink {
        location: output.clone(),
        runtime: runtime.handle().clone(),
        permits: Arc::new(Semaphore::new(workers.max(1))),
        uploads: Arc::clone(&uploads),
    };
    let mut writer = ShardWriter::new(sink, pattern, options)?;
    let written =
        feed(input, range, workers, width, &mut writer, bar).and_then(|()| Ok(writer.finish()?));
    // Wait for every upload already started, even after an error, so none is left running.
    let started: Vec<Upload> = uploads
        .lock()
        .map(|mut u| u.drain(..).collect())
        .unwrap_or_default();
    let mut first_error = None;
    for upload in started {
        let outcome = runtime
            .block_on(upload)
            .map_err(anyhow::Error::from)
            .and_then(|r| r);
        if let Err(e) = outcome {
            first_error.get_or_insert(e);
        }
    }
    let shards = written?;
    match first_error {
        Some(e) => Err(e),
        None => Ok(shards),
    }
}

fn feed<S: wds::ShardSink>(
    input: &dyn Input,
    range: Range<u64>,
    workers: usize,
    width: usize,
    writer: &mut ShardWriter<S>,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    run_ordered(
        input,
        range,
        workers,
        workers * 2 + 2,
        |first, samples| {
            samples
                .enumerate()
                .map(|(i, sample)| {
                    let index = first + i as u64;
                    to_wds(sample?, index, width).with_context(|| format!("sample {index}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        },
        |samples| {
            let n = samples.len() as u64;
            for sample in &samples {
                writer.write(sample)?;
            }
            bar.inc(n);
            Ok(())
        },
    )
}

/// Digits of a key: enough for every index of the input, at least 6.
fn key_width(total: u64) -> usize {
    total.saturating_sub(1).to_string().len().max(6)
}

/// A WebDataset sample for `sample` (see the module doc).
pub fn to_wds(mut sample: Sample, index: u64, width: usize) -> anyhow::Result<WdsSample> {
    if !matches!(sample.get("__key__"), Some(Value::Str(_))) {
        sample.insert("__key__".into(), Value::Str(format!("{index:0width$}")));
    }
    for (name, value) in sample.iter_mut() {
        let text = match &*value {
            Value::Scalar(s) => s
                .dtype
                .elements_to_json(&s.bytes)
                .first()
                .map(|j| j.to_string())
                .unwrap_or_default(),
            Value::Float(f) | Value::StrFloat(f) => float_repr(*f),
            Value::Bool(b) => if *b { "True" } else { "False" }.to_string(),
            Value::NdArray(_) | Value::Pil(_) | Value::List(_) | Value::Pickle(_) => {
                bail!("column {name:?} holds a value with no WebDataset encoding; convert it to MDS instead")
            }
            _ => continue,
        };
        *value = Value::Str(text);
    }
    Ok(WdsSample::from_sample(&sample)?)
}
