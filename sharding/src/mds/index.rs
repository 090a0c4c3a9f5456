//! `index.json` (version 2): types, validated parsing, byte-exact serialisation and merging.
//!
//! Mosaic writes the index with `json.dump({"version": 2, "shards": [...]}, sort_keys=True)`;
//! [`Index::to_json`] reproduces those bytes. `merge_index` (for datasets written in parts) writes
//! `{"version": 2, "shards": [...]}` *without* sorting the top level and prefixes each basename
//! with the part's folder name; [`merge_indexes`] and [`Index::to_merged_json`] reproduce that.
//!
//! Parsing checks what a reader relies on, and names the file in every error: valid JSON,
//! version 2 at both levels, format `mds`, column lists of equal length with known encodings and
//! the sizes those encodings imply, a known compression with `zip_data` present exactly when it is
//! set, basenames that stay inside the dataset folder and are unique, raw sizes that can hold
//! the shard header and fit the format's u32 offsets, and compressed sizes no larger than their
//! raw size can compress to ([`max_compressed_bytes`]). Counts and sizes are untrusted: they are
//! checked with checked arithmetic, so the checks hold with or without overflow checks.
//!
//! ```
//! use shardstream_sharding::mds::Index;
//! let text = br#"{"shards": [], "version": 2}"#;
//! let index = Index::from_json("index.json", text).unwrap();
//! assert_eq!(index.to_json(), std::str::from_utf8(text).unwrap());
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};

use crate::compression::Compression;
use crate::error::{FormatError, Result};
use crate::mds::encoding::Encoding;
use crate::mds::pyjson;
use crate::safe_path::check_relative;

/// The whole index: a version and the shards in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    /// Always 2.
    #[serde(deserialize_with = "de_version")]
    pub version: u64,
    /// The shards, in sample order.
    pub shards: Vec<ShardInfo>,
}

/// One shard's entry (`MDSWriter.get_config()` plus the file records and sample count).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// Encodings, in column-name order.
    pub column_encodings: Vec<String>,
    /// Column names, sorted.
    pub column_names: Vec<String>,
    /// Fixed size per column, `None` for variable-size columns.
    pub column_sizes: Vec<Option<u64>>,
    /// The compression string as the writer was given it (`"zstd:7"`), or `None`.
    pub compression: Option<String>,
    /// Always `"mds"` for shards this crate reads.
    pub format: String,
    /// Hash algorithms recorded for each file.
    pub hashes: Vec<String>,
    /// The uncompressed shard file.
    pub raw_data: FileInfo,
    /// Number of samples (may be 0, see the writer's empty-shard quirk).
    pub samples: u64,
    /// The size limit the writer used, `None` for unlimited.
    pub size_limit: Option<u64>,
    /// Always 2.
    #[serde(deserialize_with = "de_version")]
    pub version: u64,
    /// The compressed shard file, present exactly when `compression` is set.
    pub zip_data: Option<FileInfo>,
}

/// A file record: name relative to the dataset folder, size and hex digests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Path relative to the dataset (or split) folder; may contain `/` in merged indexes.
    pub basename: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Algorithm name to hex digest.
    pub hashes: BTreeMap<String, String>,
}

/// The largest shard the format can address (offsets are u32).
pub const MAX_SHARD_BYTES: u64 = u32::MAX as u64;

/// The most bytes a compressed file of `raw` bytes can take: every algorithm MDS names
/// expands incompressible data by less than a quarter (snappy, the worst, by a sixth) plus a
/// frame header. Bounding `zip_data.bytes` by it keeps an index from declaring a file (and making
/// a reader reserve room for one) far larger than any real shard.
pub fn max_compressed_bytes(raw: u64) -> u64 {
    raw.saturating_add(raw / 4).saturating_add(4096)
}

/// The shard header's size for `samples` samples (`u32` count and `samples + 1` offsets), `None`
/// past `u64`.
fn header_bytes(samples: u64) -> Option<u64> {
    samples.checked_add(1)?.checked_mul(4)?.checked_add(4)
}

impl Index {
    /// Parses and validates index bytes read from `path` (used in error messages).
    ///
    /// The bytes are deserialised straight into [`Index`]: going through a `serde_json::Value`
    /// tree first cost 1 s and 400 MiB for an index of 10^5 shards (10^8 samples), against the
    /// goal of opening such a dataset in under 1 s with flat memory. Only when that fails are
    /// the bytes parsed again the slow way, so that errors (and the rare index the typed parse
    /// refuses but the tree accepts, such as one with a repeated key) read as they always did.
    pub fn from_json(path: &str, bytes: &[u8]) -> Result<Index> {
        match serde_json::from_slice::<Index>(bytes) {
            Ok(index) => {
                index.validate(path)?;
                Ok(index)
            }
            Err(_) => Self::from_json_tree(path, bytes),
        }
    }

    /// The reference parse: a JSON tree, the top-level version checked first, then the fields.
    fn from_json_tree(path: &str, bytes: &[u8]) -> Result<Index> {
        let raw: Json = serde_json::from_slice(bytes)
            .map_err(|e| FormatError::invalid_index(path, format!("invalid JSON: {e}")))?;
        check_version(path, raw.get("version"))?;
        let index: Index = serde_json::from_value(raw)
            .map_err(|e| FormatError::invalid_index(path, e.to_string()))?;
        index.validate(path)?;
        Ok(index)
    }

    /// Checks the invariants listed in the module docs.
    pub fn validate(&self, path: &str) -> Result<()> {
        if self.version != 2 {
            return Err(unsupported(path, &self.version.to_string()));
        }
        let repeat = self.first_repeated_basename();
        for (i, shard) in self.shards.iter().enumerate() {
            shard.validate(path, i)?;
            if let Some((_, name)) = repeat.filter(|(at, _)| *at == i) {
                return Err(FormatError::invalid_index(
                    path,
                    format!("shard {i}: basename {name:?} appears twice"),
                ));
            }
        }
        Ok(())
    }

    /// The first shard (in index order) that names a file an earlier file record already named,
    /// with that name. Sorting the names finds it without hashing each one: a `HashSet` of 10^5
    /// basenames was the costliest part of checking a large index (SipHash).
    fn first_repeated_basename(&self) -> Option<(usize, &str)> {
        let mut names: Vec<(&str, usize)> = self
            .shards
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                std::iter::once(&s.raw_data)
                    .chain(&s.zip_data)
                    .map(move |f| (f.basename.as_str(), i))
            })
            .collect();
        names.sort_unstable();
        // In a run of equal names sorted by shard, the second entry is where the name repeats.
        names
            .windows(2)
            .filter(|w| w[0].0 == w[1].0)
            .map(|w| (w[1].1, w[1].0))
            .min()
    }

    /// Total samples over all shards. A validated index cannot overflow it (each shard holds
    /// under 2^30 samples); saturating keeps an unvalidated one from panicking or wrapping.
    pub fn num_samples(&self) -> u64 {
        self.shards
            .iter()
            .fold(0u64, |total, s| total.saturating_add(s.samples))
    }

    /// The index as Mosaic's writer writes it: `json.dump(obj, sort_keys=True)`.
    pub fn to_json(&self) -> String {
        let shards: Vec<Json> = self.shards.iter().map(ShardInfo::to_json_value).collect();
        pyjson::dumps(&json!({"version": self.version, "shards": shards}), true)
    }

    /// The index as Mosaic's `merge_index` writes it: `{"version": 2, "shards": [...]}` in that
    /// key order, each shard's keys in the (sorted) order of the part indexes it came from.
    pub fn to_merged_json(&self) -> String {
        let mut out = format!("{{\"version\": {}, \"shards\": [", self.version);
        for (i, shard) in self.shards.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            pyjson::write_value(&mut out, &shard.to_json_value(), true);
        }
        out.push_str("]}");
        out
    }
}

impl ShardInfo {
    /// Checks one shard entry (`i` is its position, for messages).
    pub fn validate(&self, path: &str, i: usize) -> Result<()> {
        let bad = |reason: String| FormatError::invalid_index(path, format!("shard {i}: {reason}"));
        if self.version != 2 {
            return Err(unsupported(path, &self.version.to_string()));
        }
        if self.format != "mds" {
            return Err(bad(format!(
                "format {:?} is not supported (only \"mds\")",
                self.format
            )));
        }
        let n = self.column_names.len();
        if self.column_encodings.len() != n || self.column_sizes.len() != n {
            return Err(bad(format!(
                "{n} column names, {} encodings, {} sizes",
                self.column_encodings.len(),
                self.column_sizes.len()
            )));
        }
        for ((name, enc), size) in self
            .column_names
            .iter()
            .zip(&self.column_encodings)
            .zip(&self.column_sizes)
        {
            let parsed = Encoding::parse(enc).map_err(|e| bad(format!("column {name:?}: {e}")))?;
            if parsed.fixed_size() != *size {
                return Err(bad(format!(
                    "column {name:?} ({enc}) has size {size:?}, the encoding implies {:?}",
                    parsed.fixed_size()
                )));
            }
        }
        match (&self.compression, &self.zip_data) {
            (Some(c), Some(_)) => {
                Compression::parse(c).map_err(|e| bad(e.to_string()))?;
            }
            (None, None) => {}
            (Some(c), None) => return Err(bad(format!("compression {c:?} but no zip_data"))),
            (None, Some(_)) => return Err(bad("zip_data without a compression".into())),
        }
        for file in std::iter::once(&self.raw_data).chain(&self.zip_data) {
            check_relative(path, &file.basename)?;
        }
        // Checked: a count near 2^64 must not wrap to a small header in a release build.
        let header = header_bytes(self.samples);
        if header.is_none_or(|h| self.raw_data.bytes < h) || self.raw_data.bytes > MAX_SHARD_BYTES {
            let header = header.map_or_else(|| "over 2^64".to_string(), |h| h.to_string());
            return Err(bad(format!(
                "raw size {} cannot hold {} samples (header {header} bytes, limit {MAX_SHARD_BYTES})",
                self.raw_data.bytes, self.samples
            )));
        }
        if let Some(zip) = &self.zip_data {
            let most = max_compressed_bytes(self.raw_data.bytes);
            if zip.bytes > most {
                return Err(bad(format!(
                    "compressed size {} is more than {most} bytes, the most {} raw bytes take \
                     compressed",
                    zip.bytes, self.raw_data.bytes
                )));
            }
        }
        Ok(())
    }

    /// The parsed compression, if any (validated at parse time).
    pub fn compression(&self) -> Result<Option<Compression>> {
        self.compression
            .as_deref()
            .map(Compression::parse)
            .transpose()
    }

    /// The parsed column encodings (validated at parse time).
    pub fn encodings(&self) -> Result<Vec<Encoding>> {
        self.column_encodings
            .iter()
            .map(|e| Encoding::parse(e))
            .collect()
    }

    /// The file a reader fetches: the compressed one when there is one.
    pub fn stored_file(&self) -> &FileInfo {
        self.zip_data.as_ref().unwrap_or(&self.raw_data)
    }

    /// The shard's writer config (`get_config()`), in Python's insertion order.
    pub fn config_json_value(&self) -> Json {
        json!({
            "version": self.version,
            "format": self.format,
            "compression": self.compression,
            "hashes": self.hashes,
            "size_limit": self.size_limit,
            "column_names": self.column_names,
            "column_encodings": self.column_encodings,
            "column_sizes": self.column_sizes,
        })
    }

    fn to_json_value(&self) -> Json {
        let mut obj = json!({
            "samples": self.samples,
            "raw_data": file_json(&self.raw_data),
            "zip_data": self.zip_data.as_ref().map(file_json),
        });
        if let (Json::Object(map), Json::Object(config)) = (&mut obj, self.config_json_value()) {
            map.extend(config);
        }
        obj
    }
}

fn file_json(f: &FileInfo) -> Json {
    json!({"basename": f.basename, "bytes": f.bytes, "hashes": f.hashes})
}

fn unsupported(path: &str, version: &str) -> FormatError {
    FormatError::UnsupportedVersion {
        path: path.to_string(),
        version: version.to_string(),
    }
}

/// Reads a version number; an integral float (`2.0`) counts as its integer, as in Python.
fn de_version<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let v = Json::deserialize(d)?;
    match (v.as_u64(), v.as_f64()) {
        (Some(u), _) => Ok(u),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..1e15).contains(&f) => Ok(f as u64),
        _ => Err(serde::de::Error::custom(format!("unsupported version {v}"))),
    }
}

/// Mosaic compares `obj['version'] != 2` in Python, so `2.0` passes too.
fn check_version(path: &str, version: Option<&Json>) -> Result<()> {
    match version {
        None => Err(FormatError::invalid_index(path, "missing \"version\"")),
        Some(v) if v.as_f64() == Some(2.0) => Ok(()),
        Some(v) => Err(unsupported(path, &v.to_string())),
    }
}

/// Merges part indexes as Mosaic's `merge_index` does: shards concatenated in the order given,
/// each basename prefixed with its part's folder name (`"0/shard.00000.mds"`; no prefix for an
/// empty name). Serialise the result with [`Index::to_merged_json`].
pub fn merge_indexes(parts: &[(String, Index)]) -> Index {
    let mut shards = Vec::new();
    for (subdir, index) in parts {
        for shard in &index.shards {
            let mut shard = shard.clone();
            for file in std::iter::once(&mut shard.raw_data).chain(shard.zip_data.as_mut()) {
                if !subdir.is_empty() {
                    file.basename = format!("{subdir}/{}", file.basename);
                }
            }
            shards.push(shard);
        }
    }
    Index { version: 2, shards }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `from_json` parses typed first and falls back to the tree: both must give one answer.
    #[test]
    fn typed_parse_agrees_with_the_tree_parse() {
        let shard = |version: &str, extra: &str| {
            format!(
                r#"{{"column_encodings": ["bytes", "int"], "column_names": ["data", "id"],
                "column_sizes": [null, 8], "compression": null, "format": "mds", "hashes": [],
                "raw_data": {{"basename": "shard.00000.mds", "bytes": 4096, "hashes": {{}}}},
                "samples": 10, "size_limit": 67108864, "version": {version}, "zip_data": null{extra}}}"#
            )
        };
        let cases = [
            format!(r#"{{"shards": [{}], "version": 2}}"#, shard("2", "")),
            // Python reads 2.0 as 2, at both levels.
            format!(r#"{{"shards": [{}], "version": 2.0}}"#, shard("2.0", "")),
            // Unknown keys are ignored, as Mosaic ignores them.
            format!(
                r#"{{"shards": [{}], "version": 2, "x": 1}}"#,
                shard("2", r#", "y": [1]"#)
            ),
            // A repeated key: the typed parse refuses it, the tree keeps the last value.
            format!(
                r#"{{"shards": [], "version": 2, "shards": [{}]}}"#,
                shard("2", "")
            ),
            format!(r#"{{"shards": [{}], "version": 3}}"#, shard("2", "")),
            format!(r#"{{"shards": [{}], "version": 2}}"#, shard("1", "")),
            r#"{"shards": [{}], "version": 2}"#.to_string(),
            r#"{"version": "2", "shards": []}"#.to_string(),
            r#"{"version": 2, "shards": ["#.to_string(),
        ];
        for text in &cases {
            let typed = Index::from_json("index.json", text.as_bytes());
            let tree = Index::from_json_tree("index.json", text.as_bytes());
            match (&typed, &tree) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{text}"),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{text}"),
                _ => panic!("{text}: typed {typed:?}, tree {tree:?}"),
            }
        }
        let repeated = Index::from_json("index.json", cases[3].as_bytes());
        assert!(repeated.is_ok_and(|i| i.shards.len() == 1));
    }

    /// One shard of `samples` samples, `raw` raw bytes and, when given, `zip` compressed bytes.
    fn one_shard_index(samples: &str, raw: u64, zip: Option<&str>) -> String {
        let (compression, zip_data) = match zip {
            Some(bytes) => (
                r#""zstd""#.to_string(),
                format!(
                    r#"{{"basename": "shard.00000.mds.zstd", "bytes": {bytes}, "hashes": {{}}}}"#
                ),
            ),
            None => ("null".to_string(), "null".to_string()),
        };
        format!(
            r#"{{"shards": [{{"column_encodings": ["int"], "column_names": ["id"],
            "column_sizes": [8], "compression": {compression}, "format": "mds", "hashes": [],
            "raw_data": {{"basename": "shard.00000.mds", "bytes": {raw}, "hashes": {{}}}},
            "samples": {samples}, "size_limit": null, "version": 2, "zip_data": {zip_data}}}],
            "version": 2}}"#
        )
    }

    /// Issue 40, row 3: `samples` of 2^62 - 1 or 2^64 - 1 wrapped the header size to a few
    /// bytes in release builds (and panicked in debug ones), so the index was accepted and
    /// claimed 4.6e18 samples. Refused in both profiles now, naming the file and the count.
    #[test]
    fn a_sample_count_near_2_pow_64_is_refused_not_wrapped() {
        for samples in [(1u64 << 62) - 1, 1 << 62, u64::MAX - 1, u64::MAX] {
            let text = one_shard_index(&samples.to_string(), 4096, None);
            let err = Index::from_json("ds/index.json", text.as_bytes())
                .expect_err("a hostile sample count is refused")
                .to_string();
            assert!(
                err.starts_with("ds/index.json: invalid index: shard 0"),
                "{err}"
            );
            assert!(err.contains(&samples.to_string()), "{err}");
        }
        // The largest count 4096 raw bytes hold still passes.
        let fits = one_shard_index("1022", 4096, None);
        assert!(Index::from_json("ds/index.json", fits.as_bytes()).is_ok());
        let over = one_shard_index("1023", 4096, None);
        assert!(Index::from_json("ds/index.json", over.as_bytes()).is_err());
    }

    /// Issue 40, row 4: `zip_data.bytes` of 2^62 was accepted, and a stream reserved that much
    /// budget for the download before failing. Refused at parse, naming the file and the size.
    #[test]
    fn a_compressed_size_past_what_the_raw_size_allows_is_refused() {
        for bytes in [1u64 << 62, u64::MAX, max_compressed_bytes(4096) + 1] {
            let text = one_shard_index("10", 4096, Some(&bytes.to_string()));
            let err = Index::from_json("ds/index.json", text.as_bytes())
                .expect_err("a hostile compressed size is refused")
                .to_string();
            assert!(
                err.starts_with("ds/index.json: invalid index: shard 0"),
                "{err}"
            );
            assert!(err.contains(&format!("compressed size {bytes}")), "{err}");
        }
        // Incompressible data grows a little when compressed: that stays readable.
        for bytes in ["1", "4096", "4200", &max_compressed_bytes(4096).to_string()] {
            let text = one_shard_index("10", 4096, Some(bytes));
            assert!(
                Index::from_json("ds/index.json", text.as_bytes()).is_ok(),
                "{bytes}"
            );
        }
    }

    /// The sorted search for a repeated basename finds what a set filled in index order finds.
    #[test]
    fn first_repeated_basename_matches_a_set_in_index_order() {
        let naive = |index: &Index| {
            let mut seen = std::collections::HashSet::new();
            for (i, s) in index.shards.iter().enumerate() {
                for f in std::iter::once(&s.raw_data).chain(&s.zip_data) {
                    if !seen.insert(f.basename.clone()) {
                        return Some((i, f.basename.clone()));
                    }
                }
            }
            None
        };
        let file = |name: &str| FileInfo {
            basename: name.to_string(),
            bytes: 4096,
            hashes: BTreeMap::new(),
        };
        let shard = |raw: &str, zip: Option<&str>| ShardInfo {
            column_encodings: vec!["int".into()],
            column_names: vec!["id".into()],
            column_sizes: vec![Some(8)],
            compression: zip.map(|_| "zstd".into()),
            format: "mds".into(),
            hashes: vec![],
            raw_data: file(raw),
            samples: 1,
            size_limit: None,
            version: 2,
            zip_data: zip.map(file),
        };
        let layouts: &[&[(&str, Option<&str>)]] = &[
            &[("a", None), ("b", None), ("c", None)],
            &[("c", None), ("b", None), ("c", None), ("b", None)],
            &[("z", None), ("a", Some("a")), ("z", None)],
            &[("x", Some("y")), ("y", None), ("x", None)],
            &[
                ("b", None),
                ("a", None),
                ("a", None),
                ("b", None),
                ("a", None),
            ],
            &[],
        ];
        for layout in layouts {
            let index = Index {
                version: 2,
                shards: layout.iter().map(|(r, z)| shard(r, *z)).collect(),
            };
            let got = index
                .first_repeated_basename()
                .map(|(i, n)| (i, n.to_string()));
            assert_eq!(got, naive(&index), "{layout:?}");
        }
    }
}
