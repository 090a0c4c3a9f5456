//! Names from hostile indexes, driven through [`DatasetFs`] without a mount.

use std::sync::Arc;

use super::*;
use crate::error::SourceError;
use crate::source::MemoryShard;

/// A source with only an index: the tests here never read a shard.
struct IndexOnly(Vec<u8>);

impl DatasetSource for IndexOnly {
    fn index_json(&self) -> &[u8] {
        &self.0
    }
    fn open_shard(&self, _: usize) -> std::result::Result<Arc<dyn ShardData>, SourceError> {
        Ok(Arc::new(MemoryShard(Arc::new(Vec::new()))))
    }
    fn readahead_budget(&self) -> Option<u64> {
        None
    }
}

/// An index of one shard of 3 samples whose `int` columns are named `names` (JSON strings).
fn index_with_columns(names: &[&str]) -> Vec<u8> {
    let n = names.len();
    let repeat = |item: &str| vec![item; n].join(", ");
    let names = names.join(", ");
    let raw = 4 + 4 * 4 + 3 * 8 * n;
    format!(
        r#"{{"shards": [{{"column_encodings": [{}], "column_names": [{names}],
        "column_sizes": [{}], "compression": null, "format": "mds", "hashes": [],
        "raw_data": {{"basename": "shard.00000.mds", "bytes": {raw}, "hashes": {{}}}},
        "samples": 3, "size_limit": null, "version": 2, "zip_data": null}}], "version": 2}}"#,
        repeat(r#""int""#),
        repeat("8"),
    )
    .into_bytes()
}

fn list(fs: &DatasetFs, ino: u64) -> Vec<String> {
    let mut names = Vec::new();
    fs.readdir(ino, 0, |_, _, _, name| {
        names.push(name.to_string());
        false
    })
    .unwrap();
    names
}

/// Issue 40, row 11: a column named with `/` or NUL put those bytes in directory entries, and
/// the kernel failed the whole `ls samples/` with EIO. They are escaped now (a column that
/// cannot be named is left out), every entry is a valid file name, and each one looks up.
#[test]
fn a_column_name_with_a_slash_or_nul_does_not_break_the_listing() {
    let long = format!("\"{}\"", "x".repeat(300));
    let index = index_with_columns(&[r#""a/b""#, r#""id""#, r#""n\u0000ul""#, &long]);
    let fs = DatasetFs::new(Arc::new(IndexOnly(index)), FsConfig::default()).unwrap();
    let names = list(&fs, SAMPLES_INO);
    let files: Vec<&str> = names[2..].iter().map(String::as_str).collect();
    assert_eq!(
        files,
        [
            "0.a%2Fb.int",
            "0.id.int",
            "0.n%00ul.int",
            "1.a%2Fb.int",
            "1.id.int",
            "1.n%00ul.int",
            "2.a%2Fb.int",
            "2.id.int",
            "2.n%00ul.int",
        ]
    );
    for name in files {
        assert!(!name.contains(['/', '\0']) && name.len() <= crate::names::NAME_MAX);
        let attr = fs.lookup(SAMPLES_INO, OsStr::new(name)).unwrap();
        assert_eq!((attr.kind, attr.size), (Kind::File, 8), "{name}");
    }
    assert!(fs.lookup(SAMPLES_INO, OsStr::new("0.a/b.int")).is_err());
}

/// A shard basename with a part longer than a file name may be is left out of `shards/`; the
/// listing still works and names every other shard.
#[test]
fn a_shard_name_too_long_for_a_directory_entry_is_left_out() {
    let long = "y".repeat(300);
    let text = String::from_utf8(index_with_columns(&[r#""id""#])).unwrap();
    let shard = text
        .split_once("[{")
        .and_then(|(_, rest)| rest.rsplit_once("}]"))
        .map(|(shard, _)| format!("{{{shard}}}"))
        .unwrap();
    let second = shard.replace("shard.00000.mds", &format!("{long}/shard.00001.mds"));
    let index = format!(r#"{{"shards": [{shard}, {second}], "version": 2}}"#);
    let fs = DatasetFs::new(Arc::new(IndexOnly(index.into_bytes())), FsConfig::default()).unwrap();
    assert_eq!(
        list(&fs, SHARDS_INO)[2..],
        ["index.json", "shard.00000.mds"]
    );
    assert_eq!(fs.num_samples(), 6);
}
