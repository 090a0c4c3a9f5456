//! A folder of files: one sample per regular file, `path` (relative, `/`-separated) and `data` (the
//! file's bytes), sorted by relative path.

use std::ops::Range;
use std::path::Path;

use super::walk::{walk_files, Entry};
use super::{clamp, columns_of, Columns, Input, InputFormat, SampleIter};
use crate::error::{FormatError, Result};
use crate::value::{Sample, Value};

/// A folder of files as an [`Input`].
#[derive(Debug)]
pub struct FilesInput {
    entries: Vec<Entry>,
    columns: Columns,
}

impl FilesInput {
    /// Lists every regular file under `root` (see the module doc for the order and the symlink rule).
    pub fn open(root: &Path) -> Result<Self> {
        let entries = walk_files(root)?;
        tracing::info!(root = %root.display(), files = entries.len(), "listed input files");
        Ok(FilesInput {
            entries,
            columns: columns_of(&[("path", "str"), ("data", "bytes")]),
        })
    }

    /// The relative paths, in sample order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.rel.as_str())
    }
}

impl Input for FilesInput {
    fn format(&self) -> InputFormat {
        InputFormat::Files
    }

    fn columns(&self) -> &Columns {
        &self.columns
    }

    fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>> {
        let range = clamp(range, self.len());
        let slice = self
            .entries
            .get(range.start as usize..range.end as usize)
            .unwrap_or_default();
        Ok(Box::new(slice.iter().map(|entry| {
            let data = std::fs::read(&entry.path).map_err(|e| FormatError::io(&entry.path, e))?;
            let mut sample = Sample::new();
            sample.insert("path".into(), Value::Str(entry.rel.clone()));
            sample.insert("data".into(), Value::Bytes(data));
            Ok(sample)
        })))
    }
}
