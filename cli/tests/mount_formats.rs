//! `shardstream mount` of a WebDataset tar set written by `webdataset.TarWriter` (a plain tar
//! and a `.tar.gz`): through a real FUSE mount, `samples/` holds every member of every tar,
//! `<index>.<member name>`, with exactly the member's bytes, and `shards/` the tars (the
//! `.tar.gz` inflated, as `.tar`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use crate::common::s;
use crate::mount::Daemon;

#[path = "../../fuse/tests/support/peers.rs"]
mod peers;

#[test]
fn wds_members_read_through_the_mount_equal_the_tars() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("wds");
    let tars = peers::write_wds(&data);
    let mnt = dir.path().join("mnt");
    let mut daemon = Daemon::start(s(&data), &mnt, &dir.path().join("cache"), &[], &[]);

    let mut want = BTreeMap::new();
    let members: Vec<_> = tars.iter().flat_map(|t| t.members.iter()).collect();
    for (i, sample) in members.chunks(4).enumerate() {
        for (name, hex) in sample {
            let file = format!("{i}.{}", name.replace('/', "%2F"));
            want.insert(file, hex.clone());
        }
    }
    let mut got = BTreeMap::new();
    for entry in std::fs::read_dir(mnt.join("samples")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let bytes = std::fs::read(entry.path()).unwrap();
        assert_eq!(
            entry.metadata().unwrap().len(),
            bytes.len() as u64,
            "{name}"
        );
        got.insert(
            name,
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        );
    }
    assert_eq!(got.len(), 28);
    assert_eq!(got, want);

    let mut shards: Vec<String> = std::fs::read_dir(mnt.join("shards"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    shards.sort();
    assert_eq!(shards, ["a-000.tar", "b-001.tar"]);
    for tar in &tars {
        let len = std::fs::metadata(mnt.join("shards").join(&tar.name))
            .unwrap()
            .len();
        assert_eq!(len, tar.size, "{}", tar.name);
    }
    assert!(daemon.stop());
}
