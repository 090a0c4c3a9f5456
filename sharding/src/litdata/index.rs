//! LitData's `index.json`: the chunk list, the writer's config, and the pytree spec that names
//! each leaf (`streaming/writer.py:get_config`, `utilities/_pytree.py:treespec_dumps`).

use serde_json::Value as Json;

use super::serializers::LeafFormat;
use crate::error::{FormatError, Result};
use crate::safe_path::check_relative;

/// One chunk file as the index lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkInfo {
    /// File name relative to the dataset folder (`chunk-0-3.bin`, `chunk-0-3.zstd.bin`).
    pub filename: String,
    /// Items in the chunk.
    pub chunk_size: u64,
    /// Bytes of the chunk before whole-file compression (the file size otherwise), when recorded.
    pub chunk_bytes: Option<u64>,
    /// Tokens in the chunk (`TokensLoader`), when recorded.
    pub dim: Option<u64>,
}

/// Where zstd is applied (`config.compression_level`; absent means whole-file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressionLevel {
    /// The whole chunk file is one zstd stream (`chunk-R-I.zstd.bin`).
    Chunk,
    /// Items are zstd-compressed in frames of `compression_batch_size` inside a framed `.bin`.
    Batch,
    /// Each item is its own zstd frame inside a classic `.bin`.
    Sample,
}

/// Which item loader wrote the chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemLoader {
    /// `PyTreeLoader`: each item has a u32 size per leaf, then the leaves.
    PyTree,
    /// `TokensLoader`: each item is raw token bytes.
    Tokens,
    /// Another loader (`ParquetLoader`, `TemporalArrayLoader`, ...): not readable here.
    Other(String),
}

/// The shape of a sample as `torch.utils._pytree` describes it.
#[derive(Debug, Clone, PartialEq)]
pub enum TreeSpec {
    /// One leaf (one entry of `data_format`).
    Leaf,
    /// A `dict` / `OrderedDict` / `defaultdict`: children keyed by name.
    Dict(Vec<(String, TreeSpec)>),
    /// A `tuple` / `list` / `namedtuple` / `deque` (or any other node): children by position.
    Seq(Vec<TreeSpec>),
}

impl TreeSpec {
    /// Parses `config.data_spec`, the JSON string `[1, {"type", "context", "children_spec"}]`.
    pub fn parse(text: &str) -> std::result::Result<TreeSpec, String> {
        let json: Json = serde_json::from_str(text).map_err(|e| format!("data_spec: {e}"))?;
        match json.as_array().map(Vec::as_slice) {
            Some([protocol, node]) if protocol.as_u64() == Some(1) => Self::node(node, 0),
            Some([protocol, _]) => Err(format!("data_spec: unknown pytree protocol {protocol}")),
            _ => Err("data_spec is not [protocol, spec]".into()),
        }
    }

    fn node(node: &Json, depth: usize) -> std::result::Result<TreeSpec, String> {
        if depth > 64 {
            return Err("data_spec nests deeper than 64 levels".into());
        }
        let ty = node.get("type").ok_or("data_spec node without \"type\"")?;
        let context = node.get("context").unwrap_or(&Json::Null);
        let children = node
            .get("children_spec")
            .and_then(Json::as_array)
            .ok_or("data_spec node without \"children_spec\"")?;
        if ty.is_null() {
            return if children.is_empty() {
                Ok(TreeSpec::Leaf)
            } else {
                Err("data_spec leaf with children".into())
            };
        }
        let ty = ty.as_str().ok_or("data_spec \"type\" is not a string")?;
        let children = children
            .iter()
            .map(|c| Self::node(c, depth + 1))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        match ty {
            "builtins.dict" | "collections.OrderedDict" | "collections.defaultdict" => {
                let keys = dict_keys(context)?;
                if keys.len() != children.len() {
                    return Err(format!(
                        "data_spec dict has {} keys but {} children",
                        keys.len(),
                        children.len()
                    ));
                }
                Ok(TreeSpec::Dict(keys.into_iter().zip(children).collect()))
            }
            _ => Ok(TreeSpec::Seq(children)),
        }
    }

    /// Leaf names in flattening order: dict keys, positions (`0`, `1`, ...) for sequences and for a
    /// lone leaf, nested levels joined with `.` (`{"meta": {"id": 1}}` gives `meta.id`).
    pub fn leaf_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect(None, &mut out);
        out
    }

    fn collect(&self, prefix: Option<&str>, out: &mut Vec<String>) {
        let join = |name: &str| match prefix {
            Some(p) => format!("{p}.{name}"),
            None => name.to_string(),
        };
        match self {
            TreeSpec::Leaf => out.push(prefix.map_or_else(|| "0".to_string(), str::to_string)),
            TreeSpec::Dict(children) => {
                for (key, child) in children {
                    child.collect(Some(&join(key)), out);
                }
            }
            TreeSpec::Seq(children) => {
                for (i, child) in children.iter().enumerate() {
                    child.collect(Some(&join(&i.to_string())), out);
                }
            }
        }
    }
}

/// A dict node's keys: `context` is a JSON string of the key list (`defaultdict`: an object whose
/// `dict_context` is the list). Keys that are not strings are named by their JSON text.
fn dict_keys(context: &Json) -> std::result::Result<Vec<String>, String> {
    let parsed;
    let list = match context {
        Json::String(s) => {
            parsed = serde_json::from_str::<Json>(s).map_err(|e| format!("dict context: {e}"))?;
            &parsed
        }
        Json::Object(o) => o
            .get("dict_context")
            .ok_or("defaultdict context without dict_context")?,
        other => other,
    };
    let list = list
        .as_array()
        .ok_or("dict context is not a list of keys")?;
    Ok(list
        .iter()
        .map(|k| match k {
            Json::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect())
}

/// `index.json` of a LitData dataset.
#[derive(Debug, Clone)]
pub struct LitDataIndex {
    /// Where the index was read from (for errors), e.g. `/data/ds/index.json`.
    pub path: String,
    /// Chunks in dataset order (the order litdata's merge wrote them).
    pub chunks: Vec<ChunkInfo>,
    /// `config.compression`: `None`, `zstd` or `zstd:N`.
    pub compression: Option<String>,
    /// `config.compression_level`.
    pub compression_level: CompressionLevel,
    /// `config.data_format`: one serializer name per leaf.
    pub data_format: Vec<String>,
    /// The parsed `data_format`.
    pub leaf_formats: Vec<LeafFormat>,
    /// `config.data_spec`, parsed (absent for some loaders).
    pub data_spec: Option<TreeSpec>,
    /// One column name per leaf (see [`TreeSpec::leaf_names`]).
    pub columns: Vec<String>,
    /// `config.item_loader`.
    pub item_loader: ItemLoader,
    /// `config.encryption` when the dataset is encrypted (not readable here).
    pub encryption: Option<Json>,
    /// `config.format` when litdata indexes another format (`mds`).
    pub foreign_format: Option<String>,
    /// `updated_at`, which keys litdata's cache folder.
    pub updated_at: Option<String>,
}

impl LitDataIndex {
    /// Parses the bytes of an `index.json`; `path` names it in errors.
    pub fn parse(path: &str, bytes: &[u8]) -> Result<LitDataIndex> {
        let bad = |reason: String| FormatError::invalid_index(path, reason);
        let json: Json =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
        let chunks_json = json
            .get("chunks")
            .and_then(Json::as_array)
            .ok_or_else(|| bad("missing \"chunks\" list".into()))?;
        let config = json
            .get("config")
            .and_then(Json::as_object)
            .ok_or_else(|| bad("missing \"config\" object".into()))?;
        let mut chunks = Vec::with_capacity(chunks_json.len());
        for (i, c) in chunks_json.iter().enumerate() {
            let filename = c
                .get("filename")
                .and_then(Json::as_str)
                .ok_or_else(|| bad(format!("chunk {i}: missing \"filename\"")))?;
            check_relative(path, filename)?;
            let chunk_size = c
                .get("chunk_size")
                .and_then(Json::as_u64)
                .ok_or_else(|| bad(format!("chunk {i} ({filename}): missing \"chunk_size\"")))?;
            // A chunk counts its items in a u32; a larger count is hostile, and would let the
            // total wrap.
            if chunk_size > u64::from(u32::MAX) {
                return Err(bad(format!(
                    "chunk {i} ({filename}): chunk_size {chunk_size} is more than a chunk holds \
                     (2^32 - 1 items)"
                )));
            }
            chunks.push(ChunkInfo {
                filename: filename.to_string(),
                chunk_size,
                chunk_bytes: c.get("chunk_bytes").and_then(Json::as_u64),
                dim: c.get("dim").and_then(Json::as_u64),
            });
        }
        let compression = match config.get("compression") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(parse_compression(s).map_err(bad)?),
            Some(other) => return Err(bad(format!("compression {other} is not a string"))),
        };
        let compression_level = match config.get("compression_level").and_then(Json::as_str) {
            None | Some("" | "chunk") => CompressionLevel::Chunk,
            Some("batch") => CompressionLevel::Batch,
            Some("sample") => CompressionLevel::Sample,
            Some(other) => return Err(bad(format!("unknown compression_level {other:?}"))),
        };
        let data_format: Vec<String> = match config.get("data_format") {
            Some(Json::Array(items)) => items
                .iter()
                .map(|f| f.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("data_format holds a non-string".into()))?,
            None | Some(Json::Null) => Vec::new(),
            Some(other) => return Err(bad(format!("data_format {other} is not a list"))),
        };
        let leaf_formats = data_format
            .iter()
            .map(|f| LeafFormat::parse(f))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(bad)?;
        let data_spec = match config.get("data_spec") {
            Some(Json::String(s)) => Some(TreeSpec::parse(s).map_err(bad)?),
            _ => None,
        };
        let columns = match &data_spec {
            Some(spec) => spec.leaf_names(),
            None => (0..data_format.len()).map(|i| i.to_string()).collect(),
        };
        if columns.len() != data_format.len() {
            return Err(bad(format!(
                "data_spec has {} leaves but data_format has {} entries",
                columns.len(),
                data_format.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = columns.iter().find(|c| !seen.insert(c.as_str())) {
            return Err(bad(format!(
                "two leaves flatten to the column name {dup:?}"
            )));
        }
        let item_loader = match config.get("item_loader").and_then(Json::as_str) {
            None | Some("PyTreeLoader") => ItemLoader::PyTree,
            Some("TokensLoader") => ItemLoader::Tokens,
            Some(other) => ItemLoader::Other(other.to_string()),
        };
        let encryption = config.get("encryption").filter(|e| !e.is_null()).cloned();
        let foreign_format = config
            .get("format")
            .and_then(Json::as_str)
            .map(str::to_string);
        let updated_at = match json.get("updated_at") {
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        Ok(LitDataIndex {
            path: path.to_string(),
            chunks,
            compression,
            compression_level,
            data_format,
            leaf_formats,
            data_spec,
            columns,
            item_loader,
            encryption,
            foreign_format,
            updated_at,
        })
    }

    /// Total items over all chunks.
    pub fn num_samples(&self) -> u64 {
        // Saturating: each count is under 2^32, so only an absurd number of chunks could reach
        // the top, and that must not wrap or panic.
        self.chunks
            .iter()
            .fold(0u64, |total, c| total.saturating_add(c.chunk_size))
    }

    /// Whether chunk files are whole-file zstd streams to inflate before reading.
    pub fn whole_file_zstd(&self) -> bool {
        self.compression.is_some() && self.compression_level == CompressionLevel::Chunk
    }
}

/// Accepts `zstd` and `zstd:N` (N in 1..=22), the compressors litdata registers.
fn parse_compression(s: &str) -> std::result::Result<String, String> {
    let ok = match s.split_once(':') {
        None => s == "zstd",
        Some(("zstd", level)) => level.parse::<u32>().is_ok_and(|l| (1..=22).contains(&l)),
        Some(_) => false,
    };
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "unknown compression {s:?} (litdata writes zstd or zstd:N)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_leaves_of_nested_specs() {
        let leaf = r#"{"type": null, "context": null, "children_spec": []}"#;
        let inner = format!(
            r#"{{"type": "builtins.dict", "context": "[\"a\", \"b\"]", "children_spec": [{leaf}, {leaf}]}}"#
        );
        let tuple = format!(
            r#"{{"type": "builtins.tuple", "context": "null", "children_spec": [{leaf}, {inner}]}}"#
        );
        let spec = format!(
            r#"[1, {{"type": "builtins.dict", "context": "[\"x\", \"n\", 3]", "children_spec": [{leaf}, {inner}, {tuple}]}}]"#
        );
        let spec = TreeSpec::parse(&spec).unwrap();
        assert_eq!(
            spec.leaf_names(),
            ["x", "n.a", "n.b", "3.0", "3.1.a", "3.1.b"]
        );
        assert_eq!(
            TreeSpec::parse(&format!("[1, {leaf}]"))
                .unwrap()
                .leaf_names(),
            ["0"]
        );
        assert!(TreeSpec::parse(&format!("[2, {leaf}]")).is_err());
    }

    /// A LitData chunk count near 2^64 is refused at parse (the total would wrap otherwise).
    #[test]
    fn a_chunk_size_past_u32_is_refused() {
        let index = |n: u64| {
            format!(
                r#"{{"chunks": [{{"filename": "a.bin", "chunk_size": {n}}},
                {{"filename": "b.bin", "chunk_size": {n}}}], "config": {{"data_format": ["int"]}}}}"#
            )
        };
        let err = LitDataIndex::parse("ds/index.json", index(u64::MAX).as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("ds/index.json: invalid index: chunk 0 (a.bin)"),
            "{err}"
        );
        let ok = LitDataIndex::parse("ds/index.json", index(u64::from(u32::MAX)).as_bytes());
        assert_eq!(ok.unwrap().num_samples(), 2 * u64::from(u32::MAX));
    }

    #[test]
    fn compression_names() {
        assert!(parse_compression("zstd").is_ok());
        assert!(parse_compression("zstd:9").is_ok());
        assert!(parse_compression("zstd:99").is_err());
        assert!(parse_compression("gzip").is_err());
    }
}
