//! An MDS dataset as an input (re-sharding, or conversion to WebDataset): the dataset's own columns
//! and samples, in index order. Blocks are shards; each shard is checked against its recorded
//! size and hashes when it is loaded.

use std::ops::Range;
use std::path::Path;

use super::blocks::BlockStarts;
use super::{Columns, Input, InputFormat, SampleIter};
use crate::error::{FormatError, Result};
use crate::mds::{DatasetOptions, MdsDataset};

/// A local MDS dataset as an [`Input`].
#[derive(Debug)]
pub struct MdsInput {
    dataset: MdsDataset,
    /// Where each shard starts.
    starts: BlockStarts,
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
        }
        let starts = BlockStarts::from_counts(shards.iter().map(|shard| shard.samples));
        Ok(MdsInput {
            dataset,
            starts,
            columns,
        })
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
        self.starts.len()
    }

    fn block_end(&self, start: u64) -> u64 {
        self.starts.block_end(start)
    }

    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>> {
        let dataset = &self.dataset;
        Ok(self.starts.read(
            range,
            move |shard| dataset.open_shard(shard),
            |loaded, i| loaded.decode_sample(i),
        ))
    }
}
