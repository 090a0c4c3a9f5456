//! JSON Lines: one JSON object per line, from a file or a folder of `.jsonl`/`.ndjson` files (sorted
//! by relative path). Blank lines are skipped; records are counted by a first streaming pass that
//! keeps the byte offset of every [`CHECKPOINT_EVERY`]-th record, so any range can be read without
//! rescanning and no file is ever held in memory whole.
//!
//! Columns come from the first record (see [`super::json_value`] for the inference rules); every
//! later record must then hold exactly those keys. With explicit columns, records must hold the
//! named keys and other keys are ignored. Errors name `file:LINE`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use super::json_value::{check_encoding, infer_encoding, json_to_value};
use super::walk::walk_files;
use super::{clamp, Columns, Input, InputFormat, SampleIter};
use crate::error::{FormatError, Result};
use crate::value::Sample;

/// A record offset is kept for every this many records.
pub const CHECKPOINT_EVERY: u64 = 1024;

/// The longest line read (a guard against a file without newlines filling memory).
pub const MAX_LINE_BYTES: u64 = 1 << 30;

const BUF_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, Copy)]
struct Checkpoint {
    offset: u64,
    line: u64,
}

#[derive(Debug)]
struct JsonlFile {
    path: PathBuf,
    first: u64,
    records: u64,
    checkpoints: Vec<Checkpoint>,
}

/// JSON Lines as an [`Input`].
#[derive(Debug)]
pub struct JsonlInput {
    files: Vec<JsonlFile>,
    columns: Columns,
    explicit: bool,
    total: u64,
}

impl JsonlInput {
    /// Scans `path` (a file, or a folder of `.jsonl`/`.ndjson` files). `columns` are the explicit
    /// columns, or `None` to infer them from the first record.
    pub fn open(path: &Path, columns: Option<Columns>) -> Result<Self> {
        let paths = if path.is_dir() {
            let found: Vec<PathBuf> = walk_files(path)?
                .into_iter()
                .filter(|e| e.rel.ends_with(".jsonl") || e.rel.ends_with(".ndjson"))
                .map(|e| e.path)
                .collect();
            if found.is_empty() {
                return Err(FormatError::InvalidInput {
                    path: path.display().to_string(),
                    reason: "no .jsonl or .ndjson file in the folder".into(),
                });
            }
            found
        } else {
            vec![path.to_path_buf()]
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut total = 0u64;
        for path in paths {
            let (records, checkpoints) = scan(&path)?;
            files.push(JsonlFile {
                path,
                first: total,
                records,
                checkpoints,
            });
            total += records;
        }
        let explicit = columns.is_some();
        let columns = match columns {
            Some(columns) => {
                for (name, encoding) in &columns {
                    check_encoding(encoding).map_err(|reason| {
                        FormatError::InvalidArgument(format!("column {name:?}: {reason}"))
                    })?;
                }
                columns
            }
            None => infer_columns(&files)?,
        };
        tracing::info!(
            path = %path.display(),
            files = files.len(),
            records = total,
            columns = %super::columns::format_columns(&columns),
            "scanned JSONL"
        );
        Ok(JsonlInput {
            files,
            columns,
            explicit,
            total,
        })
    }

    fn record_to_sample(&self, file: &Path, line: u64, text: &[u8]) -> Result<Sample> {
        let at = |reason: String| FormatError::InvalidInput {
            path: format!("{}:{line}", file.display()),
            reason,
        };
        let object = parse_object(text).map_err(at)?;
        if !self.explicit {
            if let Some(extra) = object.keys().find(|k| !self.columns.contains_key(*k)) {
                return Err(at(format!(
                    "key {extra:?} is not among the columns inferred from the first record ({}); give the columns explicitly",
                    self.columns.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        let mut sample = Sample::new();
        for (name, encoding) in &self.columns {
            let value = object
                .get(name)
                .ok_or_else(|| at(format!("missing key {name:?}")))?;
            let value = json_to_value(value, encoding)
                .map_err(|reason| at(format!("column {name:?}: {reason}")))?;
            sample.insert(name.clone(), value);
        }
        Ok(sample)
    }
}

impl Input for JsonlInput {
    fn format(&self) -> InputFormat {
        InputFormat::Jsonl
    }

    fn columns(&self) -> &Columns {
        &self.columns
    }

    fn len(&self) -> u64 {
        self.total
    }

    fn block_end(&self, start: u64) -> u64 {
        // Blocks end at the next kept offset of the file holding `start`, or at the file's end.
        let file = self.files.partition_point(|f| f.first + f.records <= start);
        let Some(f) = self.files.get(file) else {
            return self.total;
        };
        let local = start.saturating_sub(f.first);
        let next = (local / CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY;
        f.first + next.min(f.records)
    }

    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>> {
        let range = clamp(range, self.total);
        let mut records = Records {
            input: self,
            file: self
                .files
                .partition_point(|f| f.first + f.records <= range.start),
            reader: None,
            line: 0,
            next: range.start,
            end: range.end,
        };
        if records.next < records.end {
            records.open_at(range.start)?;
        }
        Ok(Box::new(records.map(|r| {
            let (input, path, line, text) = r?;
            input.record_to_sample(&path, line, &text)
        })))
    }
}

/// Walks the raw record lines of a range.
struct Records<'a> {
    input: &'a JsonlInput,
    file: usize,
    reader: Option<BufReader<File>>,
    /// Line number of the last line read.
    line: u64,
    next: u64,
    end: u64,
}

type RawRecord<'a> = (&'a JsonlInput, PathBuf, u64, Vec<u8>);

impl<'a> Records<'a> {
    /// Opens the current file positioned just before global record `at`.
    fn open_at(&mut self, at: u64) -> Result<()> {
        let Some(file) = self.input.files.get(self.file) else {
            return Ok(());
        };
        let local = at.saturating_sub(file.first);
        let index = (local / CHECKPOINT_EVERY) as usize;
        let checkpoint = file
            .checkpoints
            .get(index)
            .copied()
            .unwrap_or(Checkpoint { offset: 0, line: 1 });
        let mut handle = File::open(&file.path).map_err(|e| FormatError::io(&file.path, e))?;
        handle
            .seek(SeekFrom::Start(checkpoint.offset))
            .map_err(|e| FormatError::io(&file.path, e))?;
        self.reader = Some(BufReader::with_capacity(BUF_BYTES, handle));
        self.line = checkpoint.line - 1;
        for _ in (index as u64 * CHECKPOINT_EVERY)..local {
            self.next_line()?;
        }
        Ok(())
    }

    /// The next non-blank line of the current file.
    fn next_line(&mut self) -> Result<Option<Vec<u8>>> {
        let Some(file) = self.input.files.get(self.file) else {
            return Ok(None);
        };
        let Some(reader) = self.reader.as_mut() else {
            return Ok(None);
        };
        loop {
            let mut line = Vec::new();
            let n = reader
                .by_ref()
                .take(MAX_LINE_BYTES + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| FormatError::io(&file.path, e))?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            if n as u64 > MAX_LINE_BYTES {
                return Err(line_too_long(&file.path, self.line));
            }
            if !is_blank(&line) {
                return Ok(Some(line));
            }
        }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<RawRecord<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.next < self.end {
            match self.next_line() {
                Err(e) => {
                    self.next = self.end;
                    return Some(Err(e));
                }
                Ok(Some(text)) => {
                    self.next += 1;
                    let path = self.input.files.get(self.file)?.path.clone();
                    return Some(Ok((self.input, path, self.line, text)));
                }
                Ok(None) => {
                    // The scan counted this file's records; a shorter file changed under us.
                    let file = self.input.files.get(self.file)?;
                    if self.next < file.first + file.records {
                        self.next = self.end;
                        return Some(Err(FormatError::InvalidInput {
                            path: file.path.display().to_string(),
                            reason: "file shrank while it was being read".into(),
                        }));
                    }
                    self.file += 1;
                    if let Err(e) = self.open_at(self.next) {
                        self.next = self.end;
                        return Some(Err(e));
                    }
                }
            }
        }
        None
    }
}

fn is_blank(line: &[u8]) -> bool {
    line.iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

fn line_too_long(path: &Path, line: u64) -> FormatError {
    FormatError::InvalidInput {
        path: format!("{}:{line}", path.display()),
        reason: format!("line longer than {MAX_LINE_BYTES} bytes"),
    }
}

fn parse_object(text: &[u8]) -> std::result::Result<Map<String, Json>, String> {
    match serde_json::from_slice::<Json>(text) {
        Ok(Json::Object(map)) => Ok(map),
        Ok(other) => Err(format!(
            "expected a JSON object, found {}",
            match other {
                Json::Array(_) => "an array",
                Json::String(_) => "a string",
                Json::Number(_) => "a number",
                Json::Bool(_) => "a bool",
                _ => "null",
            }
        )),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

/// Counts a file's non-blank lines, keeping the offset and line number of every
/// [`CHECKPOINT_EVERY`]-th one.
fn scan(path: &Path) -> Result<(u64, Vec<Checkpoint>)> {
    let io = |e| FormatError::io(path, e);
    let mut reader = BufReader::with_capacity(BUF_BYTES, File::open(path).map_err(io)?);
    let (mut records, mut checkpoints) = (0u64, Vec::new());
    let (mut offset, mut line, mut line_start, mut has_content) = (0u64, 1u64, 0u64, false);
    let mut end_line = |records: &mut u64, line_start: u64, line: u64, has_content: bool| {
        if has_content {
            if (*records).is_multiple_of(CHECKPOINT_EVERY) {
                checkpoints.push(Checkpoint {
                    offset: line_start,
                    line,
                });
            }
            *records += 1;
        }
    };
    loop {
        let buf = reader.fill_buf().map_err(io)?;
        if buf.is_empty() {
            break;
        }
        let n = buf.len();
        for (i, &b) in buf.iter().enumerate() {
            if b == b'\n' {
                end_line(&mut records, line_start, line, has_content);
                line += 1;
                line_start = offset + i as u64 + 1;
                has_content = false;
            } else if !has_content && !matches!(b, b' ' | b'\t' | b'\r') {
                has_content = true;
            }
        }
        offset += n as u64;
        if offset - line_start > MAX_LINE_BYTES {
            return Err(line_too_long(path, line));
        }
        reader.consume(n);
    }
    end_line(&mut records, line_start, line, has_content);
    Ok((records, checkpoints))
}

/// Columns inferred from the first record of the first non-empty file.
fn infer_columns(files: &[JsonlFile]) -> Result<Columns> {
    let Some(file) = files.iter().find(|f| f.records > 0) else {
        return Err(FormatError::InvalidInput {
            path: files
                .first()
                .map(|f| f.path.display().to_string())
                .unwrap_or_default(),
            reason: "no record to infer the columns from; give the columns explicitly".into(),
        });
    };
    let first = file
        .checkpoints
        .first()
        .copied()
        .unwrap_or(Checkpoint { offset: 0, line: 1 });
    let mut handle = File::open(&file.path).map_err(|e| FormatError::io(&file.path, e))?;
    handle
        .seek(SeekFrom::Start(first.offset))
        .map_err(|e| FormatError::io(&file.path, e))?;
    let mut text = Vec::new();
    BufReader::new(handle)
        .take(MAX_LINE_BYTES + 1)
        .read_until(b'\n', &mut text)
        .map_err(|e| FormatError::io(&file.path, e))?;
    let object = parse_object(&text).map_err(|reason| FormatError::InvalidInput {
        path: format!("{}:{}", file.path.display(), first.line),
        reason,
    })?;
    if object.is_empty() {
        return Err(FormatError::InvalidInput {
            path: format!("{}:{}", file.path.display(), first.line),
            reason: "the first record has no key to make a column of".into(),
        });
    }
    Ok(object
        .iter()
        .map(|(k, v)| (k.clone(), infer_encoding(v).to_string()))
        .collect())
}
