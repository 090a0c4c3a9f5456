//! `--input-format auto`: which input format a path holds.
//!
//! - a path with `{...}` braces, or a file ending `.tar`/`.tar.gz`/`.tgz`: `wds`;
//! - a file ending `.jsonl`/`.ndjson`/`.json`: `jsonl`;
//! - a folder with an `index.json`: `mds` when it holds `"shards"`, `litdata` when it holds `"chunks"`;
//! - a folder whose files (names starting with `.` aside) are all tars: `wds`; all `.jsonl`/`.ndjson`: `jsonl`;
//! - a folder holding only sub-folders at its top, with only image files below them: `imagefolder`;
//! - any other folder: `files`.

use std::path::Path;

use super::imagefolder::is_image_name;
use super::walk::walk_files;
use super::InputFormat;
use crate::error::{FormatError, Result};

/// Detects the input format of `path`.
pub fn detect(path: &Path) -> Result<InputFormat> {
    let text = path.to_string_lossy();
    if text.contains('{') && text.contains('}') && !path.exists() {
        return Ok(InputFormat::Wds);
    }
    let meta = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
    if meta.is_file() {
        return by_file_name(&text).ok_or_else(|| FormatError::InvalidInput {
            path: text.to_string(),
            reason: "cannot tell the input format from the file name; give it explicitly".into(),
        });
    }
    let index = path.join("index.json");
    if index.is_file() {
        return index_format(&index);
    }
    let top: Vec<(String, bool)> = std::fs::read_dir(path)
        .map_err(|e| FormatError::io(path, e))?
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.path().is_dir(),
            )
        })
        .filter(|(name, _)| !name.starts_with('.'))
        .collect();
    let files: Vec<&str> = top
        .iter()
        .filter(|(_, d)| !d)
        .map(|(n, _)| n.as_str())
        .collect();
    if !files.is_empty() {
        let all = |f: InputFormat| files.iter().all(|n| by_file_name(n) == Some(f));
        if all(InputFormat::Wds) {
            return Ok(InputFormat::Wds);
        }
        if files
            .iter()
            .all(|n| n.ends_with(".jsonl") || n.ends_with(".ndjson"))
        {
            return Ok(InputFormat::Jsonl);
        }
        return Ok(InputFormat::Files);
    }
    if top.is_empty() {
        return Ok(InputFormat::Files);
    }
    let all_images = walk_files(path)?.iter().all(|e| {
        let name = e.rel.rsplit('/').next().unwrap_or(&e.rel);
        name.starts_with('.') || is_image_name(name)
    });
    Ok(if all_images {
        InputFormat::ImageFolder
    } else {
        InputFormat::Files
    })
}

fn by_file_name(name: &str) -> Option<InputFormat> {
    let lower = name.to_lowercase();
    if lower.ends_with(".tar") || lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
        Some(InputFormat::Wds)
    } else if lower.ends_with(".jsonl") || lower.ends_with(".ndjson") || lower.ends_with(".json") {
        Some(InputFormat::Jsonl)
    } else {
        None
    }
}

/// `mds` or `litdata`, from the keys of an `index.json`.
pub fn index_format(index: &Path) -> Result<InputFormat> {
    let text = crate::index_file::read_index_file(index)?;
    let json: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| FormatError::invalid_index(index.display().to_string(), e.to_string()))?;
    index_format_of(&json).ok_or_else(|| {
        FormatError::invalid_index(
            index.display().to_string(),
            "holds neither \"shards\" (MDS) nor \"chunks\" (LitData)",
        )
    })
}

/// `mds` or `litdata`, from a parsed `index.json`.
pub fn index_format_of(json: &serde_json::Value) -> Option<InputFormat> {
    if json.get("shards").is_some() {
        Some(InputFormat::Mds)
    } else if json.get("chunks").is_some() {
        Some(InputFormat::LitData)
    } else {
        None
    }
}
