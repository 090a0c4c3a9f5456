//! Both views of datasets in the other formats, without a mount: a WebDataset tar set (a plain
//! tar and a `.tar.gz`) written by `webdataset.TarWriter` and a LitData dataset written by
//! litdata's `BinaryWriter`, opened by the real streamer and served by [`DatasetFs`]. Names,
//! sizes and bytes are checked against what the peers' files hold (`tarfile` for the tars).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use shardstream_fuse::fs::{Kind, SAMPLES_INO, SHARDS_INO};
use shardstream_fuse::names::Naming;
use shardstream_fuse::{DatasetFs, FsConfig, StreamingSource};
use shardstream_streamer::{StreamingConfig, StreamingDataset};

use crate::support::peers::{write_litdata, write_wds};

fn open_fs(dataset: &Path, cache: &Path) -> DatasetFs {
    let config = StreamingConfig {
        remote: dataset.to_str().unwrap().to_string(),
        cache_root: Some(cache.to_path_buf()),
        memory_limit: Some(16 << 20),
        run_id: Some("run".into()),
        node_rank: Some(0),
        ..StreamingConfig::default()
    };
    let ds = StreamingDataset::open(config).unwrap();
    DatasetFs::new(
        Arc::new(StreamingSource::new(ds, None).unwrap()),
        FsConfig::default(),
    )
    .unwrap()
}

/// `(ino, name)` of every entry of `ino` but `.` and `..`, in listing order.
fn list(fs: &DatasetFs, ino: u64) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    fs.readdir(ino, 0, |child, _, kind, name| {
        if name != "." && name != ".." {
            assert_eq!(kind, Kind::File, "{name}");
            out.push((child, name.to_string()));
        }
        false
    })
    .unwrap();
    out
}

fn read_all(fs: &DatasetFs, ino: u64) -> Vec<u8> {
    let fh = fs.open(ino, false).unwrap();
    let mut out = Vec::new();
    loop {
        let part = fs.read(fh, out.len() as u64, 1000).unwrap();
        if part.is_empty() {
            break;
        }
        out.extend(part);
    }
    fs.release(fh);
    out
}

/// `shards/` serves each tar under its name, a `.tar.gz` inflated as `.tar`; `samples/` holds
/// one file per member, `<index>.<member name>` (a `/` of the key as `%2F`), whose bytes are
/// exactly the member's.
#[test]
fn wds_tar_set_shows_its_tars_and_every_member() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("wds");
    let tars = write_wds(&data);
    let fs = open_fs(&data, &dir.path().join("cache"));
    assert_eq!(fs.num_samples(), 7);
    assert_eq!(fs.naming(), &Naming::Listed { width: 1 });

    let shards = list(&fs, SHARDS_INO);
    let names: Vec<&str> = shards.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["a-000.tar", "b-001.tar"], "no index.json for tars");
    for ((ino, _), tar) in shards.iter().zip(&tars) {
        assert_eq!(fs.getattr(*ino).unwrap().size, tar.size, "{}", tar.name);
        let bytes = read_all(&fs, *ino);
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            tar.sha256,
            "{}",
            tar.name
        );
    }

    // Members in archive order, 4 per sample; the global index prefixes each.
    let mut want = Vec::new();
    for (i, chunk) in tars
        .iter()
        .flat_map(|t| t.members.iter())
        .collect::<Vec<_>>()
        .chunks(4)
        .enumerate()
    {
        for (name, bytes) in chunk {
            want.push((format!("{i}.{}", name.replace('/', "%2F")), bytes.clone()));
        }
    }
    want.sort();
    let files = list(&fs, SAMPLES_INO);
    let got_names: Vec<&str> = files.iter().map(|(_, n)| n.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(got_names, want_names);
    assert!(got_names.contains(&"4.d%2Fs00004.seg.png"));
    for ((ino, name), (_, bytes)) in files.iter().zip(&want) {
        let attr = fs.lookup(SAMPLES_INO, OsStr::new(name)).unwrap();
        assert_eq!(attr.ino, *ino, "{name}");
        assert_eq!(attr.size * 2, bytes.len() as u64, "{name}");
        assert_eq!(hex::encode(read_all(&fs, *ino)), *bytes, "{name}");
    }
    assert!(fs.lookup(SAMPLES_INO, OsStr::new("7.s00007.jpg")).is_err());
}

/// A LitData dataset: `shards/` holds its `index.json` and chunks, `samples/` one file per
/// leaf, `<index>.<leaf>.<ext>` (the extension from the leaf's serializer), holding the leaf's
/// bytes as litdata serialized them.
#[test]
fn litdata_dataset_shows_its_chunks_and_every_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("lit");
    write_litdata(&data);
    let fs = open_fs(&data, &dir.path().join("cache"));
    assert_eq!(fs.num_samples(), 7);

    let shards = list(&fs, SHARDS_INO);
    let names: Vec<&str> = shards.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "chunk-0-0.bin",
            "chunk-0-1.bin",
            "chunk-0-2.bin",
            "index.json"
        ]
    );
    for (ino, name) in &shards {
        let bytes = std::fs::read(data.join(name)).unwrap();
        assert_eq!(read_all(&fs, *ino), bytes, "{name}");
    }

    let files = list(&fs, SAMPLES_INO);
    let mut want = Vec::new();
    for i in 0..7u8 {
        want.push((format!("{i}.i.int"), i64::from(i).to_le_bytes().to_vec()));
        want.push((format!("{i}.raw.bin"), vec![i; usize::from(i) + 1]));
        want.push((format!("{i}.s.txt"), format!("item {i} é").into_bytes()));
    }
    let got_names: Vec<&str> = files.iter().map(|(_, n)| n.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(got_names, want_names);
    for ((ino, name), (_, bytes)) in files.iter().zip(&want) {
        assert_eq!(fs.lookup(SAMPLES_INO, OsStr::new(name)).unwrap().ino, *ino);
        assert_eq!(read_all(&fs, *ino), *bytes, "{name}");
    }
}
