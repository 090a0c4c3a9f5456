//! An MDS dataset as an input (re-sharding, or conversion to WebDataset): the dataset's own columns
//! and samples, in index order. Blocks are shards; each shard is checked against its recorded
//! size and hashes when it is loaded.

use std::ops::Range;
use std::path::Path;

use super::{clamp, Columns, Input, InputFormat, SampleIter};
use crate::error::{FormatError, Result};
use crate::mds::{DatasetOptions, MdsDataset};

/// A local MDS dataset as an [`Input`].
#[derive(Debug)]
pub struct MdsInput {
    dataset: MdsDataset,
    /// Index of the first sample of each shard, then the total.
    starts: Vec<u64>,
    columns: Columns,
}

impl MdsInput {
    /// Opens the dataset in `dir`. Its shards must all have the same columns.
    pub fn open(dir: &Path, allow_unsafe_types: bool) -> Result<Self> {
        let options = DatasetOptions {
            allow_unsafe_types,
            ..DatasetOptions::default()
        };
        let dataset = MdsDataset::open(dir, options)?;
        let index_path = dir.join("index.json").display().to_string();
        let shards = &dataset.index().shards;
        let Some(first) = shards.first() else {
            return Err(FormatError::invalid_index(
                index_path,
                "the dataset has no shard",
            ));
        };
        let columns: Columns = first
            .column_names
            .iter()
            .cloned()
            .zip(first.column_encodings.iter().cloned())
            .collect();
        let mut starts = Vec::with_capacity(shards.len() + 1);
        let mut total = 0u64;
        for (i, shard) in shards.iter().enumerate() {
            if shard.column_names != first.column_names
                || shard.column_encodings != first.column_encodings
            {
                return Err(FormatError::invalid_index(
                    index_path,
                    format!(
                        "shard {i} has other columns than shard 0; convert the parts separately"
                    ),
                ));
            }
            starts.push(total);
            total += shard.samples;
        }
        starts.push(total);
        Ok(MdsInput {
            dataset,
            starts,
            columns,
        })
    }

    fn shard_of(&self, item: u64) -> usize {
        // The last shard whose first sample is <= item (empty shards are skipped over).
        self.starts
            .partition_point(|&s| s <= item)
            .saturating_sub(1)
    }
}

impl Input for MdsInput {
    fn format(&self) -> InputFormat {
        InputFormat::Mds
    }

    fn columns(&self) -> &Columns {
        &self.columns
    }

    fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    fn block_end(&self, start: u64) -> u64 {
        self.starts
            .get(self.shard_of(start) + 1)
            .copied()
            .unwrap_or_else(|| self.len())
    }

    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>> {
        let range = clamp(range, self.len());
        let shards = self.starts.len().saturating_sub(1);
        let mut parts: Vec<SampleIter<'_>> = Vec::new();
        for shard in self.shard_of(range.start)..shards {
            let (first, end) = (self.starts[shard], self.starts[shard + 1]);
            if first >= range.end {
                break;
            }
            if first == end {
                continue;
            }
            let from = (range.start.max(first) - first) as usize;
            let to = (range.end.min(end) - first) as usize;
            let mut reader = None;
            let mut next = from;
            let mut failed = false;
            parts.push(Box::new(std::iter::from_fn(move || {
                if failed || next >= to {
                    return None;
                }
                if reader.is_none() {
                    match self.dataset.open_shard(shard) {
                        Ok(r) => reader = Some(r),
                        Err(e) => {
                            failed = true;
                            return Some(Err(e));
                        }
                    }
                }
                let sample = reader.as_ref()?.decode_sample(next);
                next += 1;
                failed = sample.is_err();
                Some(sample)
            })));
        }
        Ok(Box::new(parts.into_iter().flatten()))
    }
}
