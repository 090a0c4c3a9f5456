//! The filesystem logic without a mount, over an in-memory MDS dataset written by the real
//! writer: names, sizes and bytes of both views, directory offsets, errors and their errno,
//! recovery after a source outage, and read-ahead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shardstream_fuse::fs::{Kind, ROOT_INO, SAMPLES_INO, SHARDS_INO};
use shardstream_fuse::names::Naming;
use shardstream_fuse::{DatasetFs, FsConfig};
use shardstream_sharding::mds::{Columns, ShardReader};
use support::MemDataset;

fn fs_over(data: MemDataset, config: FsConfig) -> (Arc<MemDataset>, DatasetFs) {
    let data = Arc::new(data);
    let fs = DatasetFs::new(data.clone(), config).unwrap();
    (data, fs)
}

/// Every entry of directory `ino`, listed `batch` entries per call as the kernel does.
fn list(fs: &DatasetFs, ino: u64, batch: usize) -> Vec<(u64, Kind, String)> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let mut got = Vec::new();
        fs.readdir(ino, offset, |child, next, kind, name| {
            got.push((child, next, kind, name.to_string()));
            got.len() >= batch
        })
        .unwrap();
        if got.is_empty() {
            break;
        }
        offset = got.last().unwrap().1;
        out.extend(got.into_iter().map(|(c, _, k, n)| (c, k, n)));
    }
    out.into_iter()
        .filter(|(_, _, n)| n != "." && n != "..")
        .collect()
}

fn read_all(fs: &DatasetFs, ino: u64, chunk: u32) -> Vec<u8> {
    let fh = fs.open(ino, false).unwrap();
    let mut out = Vec::new();
    loop {
        let part = fs.read(fh, out.len() as u64, chunk).unwrap();
        if part.is_empty() {
            break;
        }
        out.extend(part);
    }
    fs.release(fh);
    out
}

/// The bytes of each column of each sample, from the real shard reader.
fn columns_of(data: &MemDataset) -> Vec<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for (info, raw) in data.index.shards.iter().zip(&data.shards) {
        let cols = Arc::new(Columns::from_shard_info("index.json", info, false).unwrap());
        let reader = ShardReader::new("s", raw.as_slice(), cols, Some(info.samples)).unwrap();
        for i in 0..reader.len() {
            out.push(
                reader
                    .sample_columns(i)
                    .unwrap()
                    .into_iter()
                    .map(<[u8]>::to_vec)
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn shards_view_lists_the_index_and_every_shard_with_their_bytes() {
    let (data, fs) = fs_over(support::mixed(300, 4096), FsConfig::default());
    assert!(data.index.shards.len() > 4, "want several shards");
    let root = list(&fs, ROOT_INO, 1);
    assert_eq!(
        root,
        vec![
            (SHARDS_INO, Kind::Dir, "shards".to_string()),
            (SAMPLES_INO, Kind::Dir, "samples".to_string())
        ]
    );
    let shards = list(&fs, SHARDS_INO, 3);
    let names: Vec<&str> = shards.iter().map(|(_, _, n)| n.as_str()).collect();
    let mut expected: Vec<&str> = data
        .index
        .shards
        .iter()
        .map(|s| s.raw_data.basename.as_str())
        .collect();
    expected.push("index.json");
    expected.sort_unstable();
    assert_eq!(names, expected);
    for (ino, _, name) in &shards {
        let attr = fs.lookup(SHARDS_INO, OsStr::new(name)).unwrap();
        assert_eq!(attr.ino, *ino);
        let bytes = read_all(&fs, *ino, 777);
        assert_eq!(attr.size, bytes.len() as u64, "{name}");
        if name == "index.json" {
            assert_eq!(bytes, data.index_json);
        } else {
            let i = data
                .index
                .shards
                .iter()
                .position(|s| &s.raw_data.basename == name)
                .unwrap();
            assert_eq!(&bytes, data.shards[i].as_ref(), "{name}");
        }
    }
}

#[test]
fn samples_view_has_one_file_per_sample_and_column_with_its_bytes() {
    let (data, fs) = fs_over(support::mixed(250, 4096), FsConfig::default());
    assert_eq!(fs.naming(), &Naming::ByIndex { width: 3 });
    let expected = columns_of(&data);
    let entries = list(&fs, SAMPLES_INO, 64);
    assert_eq!(entries.len(), 250 * 3);
    // The writer orders columns by name: blob, id, text.
    assert_eq!(entries[0].2, "000.blob.bin");
    assert_eq!(entries[1].2, "000.id.int");
    assert_eq!(entries[2].2, "000.text.txt");
    for (k, (ino, kind, name)) in entries.iter().enumerate() {
        assert_eq!(*kind, Kind::File);
        let attr = fs.lookup(SAMPLES_INO, OsStr::new(name)).unwrap();
        assert_eq!(attr.ino, *ino, "{name}");
        let want = &expected[k / 3][k % 3];
        assert_eq!(attr.size, want.len() as u64, "{name}");
        assert_eq!(&read_all(&fs, *ino, 100), want, "{name}");
    }
}

#[test]
fn fixed_size_columns_are_sized_from_the_index_without_a_fetch() {
    let (data, fs) = fs_over(support::mixed(100, 4096), FsConfig::default());
    let attr = fs.lookup(SAMPLES_INO, OsStr::new("99.id.int")).unwrap();
    assert_eq!(attr.size, 8);
    assert_eq!(data.opens.load(Ordering::SeqCst), 0);
    // A variable-size column needs its shard's layout: one fetch, then none for its neighbours.
    fs.lookup(SAMPLES_INO, OsStr::new("99.text.txt")).unwrap();
    let after_one = data.opens.load(Ordering::SeqCst);
    assert!(after_one >= 1);
    fs.lookup(SAMPLES_INO, OsStr::new("98.text.txt")).unwrap();
    fs.lookup(SAMPLES_INO, OsStr::new("97.blob.bin")).unwrap();
    assert_eq!(data.opens.load(Ordering::SeqCst), after_one);
}

#[test]
fn folder_datasets_are_named_by_their_original_paths() {
    let entries: Vec<(String, Vec<u8>)> = (0..120)
        .map(|i| {
            let class = ["cat", "dog", "bird/small"][i % 3];
            (
                format!("train/{class}/{i:04}.jpg"),
                vec![i as u8; 50 + i * 13],
            )
        })
        .collect();
    let (_, fs) = fs_over(support::files(&entries, 2048), FsConfig::default());
    assert!(matches!(fs.naming(), Naming::ByPath { .. }));
    // Walk the tree from samples/ and collect path -> bytes.
    let mut found = BTreeMap::new();
    let mut stack = vec![(SAMPLES_INO, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        for (ino, kind, name) in list(&fs, dir, 7) {
            let path = format!("{prefix}{name}");
            assert_eq!(fs.lookup(dir, OsStr::new(&name)).unwrap().ino, ino);
            match kind {
                Kind::Dir => stack.push((ino, format!("{path}/"))),
                Kind::File => {
                    let bytes = read_all(&fs, ino, 64);
                    assert_eq!(fs.getattr(ino).unwrap().size, bytes.len() as u64);
                    found.insert(path, bytes);
                }
            }
        }
    }
    let want: BTreeMap<String, Vec<u8>> = entries.into_iter().collect();
    assert_eq!(found, want);
}

#[test]
fn errors_map_to_errno() {
    let (data, fs) = fs_over(support::mixed(50, 2048), FsConfig::default());
    let missing = fs.lookup(SAMPLES_INO, OsStr::new("50.id.int")).unwrap_err();
    assert_eq!(missing.errno(), libc::ENOENT);
    let bad_col = fs.lookup(SAMPLES_INO, OsStr::new("1.id.txt")).unwrap_err();
    assert_eq!(bad_col.errno(), libc::ENOENT);
    let shard = fs
        .lookup(
            SHARDS_INO,
            OsStr::new(&data.index.shards[0].raw_data.basename),
        )
        .unwrap();
    assert_eq!(fs.open(shard.ino, true).unwrap_err().errno(), libc::EROFS);
    assert_eq!(
        fs.open(SHARDS_INO, false).unwrap_err().errno(),
        libc::EISDIR
    );
    assert_eq!(
        fs.lookup(shard.ino, OsStr::new("x")).unwrap_err().errno(),
        libc::ENOTDIR
    );
    assert_eq!(fs.getattr(12345).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(fs.read(999, 0, 10).unwrap_err().errno(), libc::EBADF);
    assert_eq!(fs.refuse("rename").errno(), libc::EROFS);
}

#[test]
fn an_outage_gives_eio_and_reads_work_again_after_it() {
    let config = FsConfig {
        keep_open_shards: 0,
        max_readahead_shards: 0,
        ..FsConfig::default()
    };
    let (data, fs) = fs_over(support::mixed(200, 4096), config);
    let name = &data.index.shards[1].raw_data.basename;
    let ino = fs.lookup(SHARDS_INO, OsStr::new(name)).unwrap().ino;
    data.fail.store(true, Ordering::SeqCst);
    let fh = fs.open(ino, false).unwrap();
    assert_eq!(fs.read(fh, 0, 100).unwrap_err().errno(), libc::EIO);
    data.fail.store(false, Ordering::SeqCst);
    assert_eq!(fs.read(fh, 0, 100).unwrap(), data.shards[1][..100].to_vec());
}

#[test]
fn sequential_readers_fetch_ahead_with_a_growing_window_capped_by_the_budget() {
    let mut data = support::mixed(2000, 4096);
    let n = data.index.shards.len();
    assert!(n > 20, "{n} shards");
    let max_shard = data
        .index
        .shards
        .iter()
        .map(|s| s.raw_data.bytes)
        .max()
        .unwrap();
    // Room for 3 shards of read-ahead (half the budget goes to it).
    data.budget = Some(max_shard * 6);
    let config = FsConfig {
        keep_open_shards: 0,
        max_readahead_shards: 16,
        ..FsConfig::default()
    };
    let (data, fs) = fs_over(data, config);
    for i in 0..8 {
        let name = &data.index.shards[i].raw_data.basename;
        let ino = fs.lookup(SHARDS_INO, OsStr::new(name)).unwrap().ino;
        read_all(&fs, ino, 4096);
    }
    // Wait for the background fetches up to shard 10 (a batch is fetched in order, so an
    // over-reaching window would have asked for 11 right after it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !data.opened.lock().unwrap().contains(&10) {
        assert!(
            std::time::Instant::now() < deadline,
            "read-ahead never reached shard 10: {:?}",
            data.opened.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let opened = data.opened.lock().unwrap().clone();
    let max_ahead = opened.iter().max().copied().unwrap();
    // Read 0..=7; with a window capped at 3, read-ahead reached shard 10 but never shard 11+.
    assert_eq!(max_ahead, 10, "{opened:?}");
}
