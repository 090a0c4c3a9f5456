//! WebDataset tars as an input: a `.tar` file, a brace pattern of local tars
//! (`data-{000..009}.tar`), or a folder of `.tar`/`.tar.gz`/`.tgz` files (sorted by relative path).
//!
//! Columns: `__key__` (`str`) plus one `bytes` column per member extension found in any sample. A
//! first pass reads every tar (in parallel) to count samples and collect the extensions; a sample
//! missing one of them is an error naming the tar and the key, since an MDS sample must hold every
//! column. Blocks are whole tars: a range that starts inside a tar skips its first samples.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::walk::walk_files;
use super::{clamp, Columns, Input, InputFormat, SampleIter};
use crate::error::{FormatError, Result};
use crate::value::Sample;
use crate::wds::{expand_urls, WdsReadOptions, WdsReader};

#[derive(Debug)]
struct Tar {
    path: PathBuf,
    first: u64,
    samples: u64,
}

/// WebDataset tars as an [`Input`].
#[derive(Debug)]
pub struct WdsInput {
    tars: Vec<Tar>,
    columns: Columns,
    total: u64,
}

/// Whether a file name is a WebDataset shard.
pub fn is_tar_name(name: &str) -> bool {
    let lower = name.to_lowercase();
    lower.ends_with(".tar") || lower.ends_with(".tar.gz") || lower.ends_with(".tgz")
}

/// The local tar files `spec` names: a file, a folder of tars, or a brace pattern.
pub fn tar_paths(spec: &Path) -> Result<Vec<PathBuf>> {
    if spec.is_dir() {
        let tars: Vec<PathBuf> = walk_files(spec)?
            .into_iter()
            .filter(|e| is_tar_name(&e.rel))
            .map(|e| e.path)
            .collect();
        if tars.is_empty() {
            return Err(FormatError::InvalidInput {
                path: spec.display().to_string(),
                reason: "no .tar file in the folder".into(),
            });
        }
        return Ok(tars);
    }
    if spec.exists() {
        return Ok(vec![spec.to_path_buf()]);
    }
    let text = spec.to_str().ok_or_else(|| FormatError::InvalidInput {
        path: spec.display().to_string(),
        reason: "path is not valid UTF-8".into(),
    })?;
    let urls = expand_urls(text)?;
    urls.into_iter()
        .map(|u| match u.strip_prefix("file://") {
            Some(p) => Ok(PathBuf::from(p)),
            None if u.contains("://") => Err(FormatError::InvalidInput {
                path: u,
                reason: "remote tars cannot be read in place; download them first".into(),
            }),
            None => Ok(PathBuf::from(u)),
        })
        .collect()
}

impl WdsInput {
    /// Finds the tars of `spec` and scans them.
    pub fn open(spec: &Path) -> Result<Self> {
        let paths = tar_paths(spec)?;
        let scans = scan_all(&paths)?;
        let mut extensions = BTreeSet::new();
        let mut tars = Vec::with_capacity(paths.len());
        let mut total = 0u64;
        for (path, (samples, exts)) in paths.into_iter().zip(scans) {
            extensions.extend(exts);
            tars.push(Tar {
                path,
                first: total,
                samples,
            });
            total += samples;
        }
        let mut columns = Columns::new();
        columns.insert("__key__".into(), "str".into());
        for ext in extensions {
            columns.insert(ext, "bytes".into());
        }
        tracing::info!(spec = %spec.display(), tars = tars.len(), samples = total, "scanned WebDataset tars");
        Ok(WdsInput {
            tars,
            columns,
            total,
        })
    }

    fn tar_of(&self, item: u64) -> usize {
        self.tars.partition_point(|t| t.first + t.samples <= item)
    }
}

/// A tar's sample count and extensions.
type Scan = (u64, BTreeSet<String>);

/// Counts the samples of each tar and collects their extensions, several tars at a time.
fn scan_all(paths: &[PathBuf]) -> Result<Vec<Scan>> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(paths.len().max(1));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Scan>>>> =
        Mutex::new((0..paths.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = paths.get(i) else { return };
                let outcome = scan(path);
                let failed = outcome.is_err();
                if let Ok(mut slots) = results.lock() {
                    if let Some(slot) = slots.get_mut(i) {
                        *slot = Some(outcome);
                    }
                }
                if failed {
                    // Let the other threads stop early too.
                    next.store(paths.len(), Ordering::Relaxed);
                    return;
                }
            });
        }
    });
    let slots = results
        .into_inner()
        .map_err(|_| FormatError::InvalidArgument("a tar scan thread panicked".into()))?;
    // The first error in tar order wins; an unscanned tar after an error is never reached.
    slots
        .into_iter()
        .zip(paths)
        .map(|(slot, path)| {
            slot.unwrap_or_else(|| {
                Err(FormatError::Tar {
                    path: path.display().to_string(),
                    reason: "not scanned".into(),
                })
            })
        })
        .collect()
}

fn scan(path: &Path) -> Result<Scan> {
    let mut samples = 0u64;
    let mut extensions = BTreeSet::new();
    for sample in WdsReader::open(path, WdsReadOptions::default())? {
        let sample = sample?;
        samples += 1;
        for (ext, _) in &sample.fields {
            if !extensions.contains(ext) {
                extensions.insert(ext.clone());
            }
        }
    }
    Ok((samples, extensions))
}

impl Input for WdsInput {
    fn format(&self) -> InputFormat {
        InputFormat::Wds
    }

    fn columns(&self) -> &Columns {
        &self.columns
    }

    fn len(&self) -> u64 {
        self.total
    }

    fn block_end(&self, start: u64) -> u64 {
        self.tars
            .get(self.tar_of(start))
            .map_or(self.total, |t| t.first + t.samples)
    }

    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>> {
        let range = clamp(range, self.total);
        let first_tar = self.tar_of(range.start);
        let mut out: Vec<SampleIter<'_>> = Vec::new();
        for tar in self.tars.iter().skip(first_tar) {
            if tar.first >= range.end {
                break;
            }
            let skip = range.start.saturating_sub(tar.first);
            let take = range.end.min(tar.first + tar.samples) - tar.first.max(range.start);
            let mut cursor = TarCursor {
                path: &tar.path,
                reader: None,
                skip,
                left: take,
            };
            let columns = &self.columns;
            let samples = std::iter::from_fn(move || cursor.next_sample())
                .map(move |s| complete(s?, columns));
            out.push(Box::new(samples));
        }
        Ok(Box::new(out.into_iter().flatten()))
    }
}

/// Reads `left` samples of one tar after skipping `skip`, opening it on first use so that a long
/// range keeps one tar open at a time. A tar holding fewer samples than the scan counted is an
/// error, not a silent end.
struct TarCursor<'a> {
    path: &'a Path,
    reader: Option<WdsReader<std::fs::File>>,
    skip: u64,
    left: u64,
}

impl TarCursor<'_> {
    fn next_sample(&mut self) -> Option<Result<crate::wds::WdsSample>> {
        if self.left == 0 {
            return None;
        }
        let outcome = self.step();
        if outcome.is_ok() {
            self.left -= 1;
        } else {
            self.left = 0;
        }
        Some(outcome)
    }

    fn step(&mut self) -> Result<crate::wds::WdsSample> {
        if self.reader.is_none() {
            self.reader = Some(WdsReader::open(self.path, WdsReadOptions::default())?);
        }
        let shrank = || FormatError::Tar {
            path: self.path.display().to_string(),
            reason: "holds fewer samples than when it was scanned".into(),
        };
        let reader = self.reader.as_mut().ok_or_else(shrank)?;
        while self.skip > 0 {
            reader.next().ok_or_else(shrank)??;
            self.skip -= 1;
        }
        reader.next().ok_or_else(shrank)?
    }
}

/// The sample as columns, refusing one that lacks an extension other samples have.
fn complete(sample: crate::wds::WdsSample, columns: &Columns) -> Result<Sample> {
    let url = sample.url.clone();
    let key = sample.key.clone();
    let sample = sample.into_sample();
    if let Some(missing) = columns.keys().find(|c| !sample.contains_key(*c)) {
        return Err(FormatError::InvalidInput {
            path: format!("{url}: sample {key:?}"),
            reason: format!("no {missing:?} member, which other samples have"),
        });
    }
    Ok(sample)
}
