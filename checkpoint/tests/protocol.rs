//! The save/commit/read protocol, each test body run over an in-memory store and a local
//! directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use bytes::Bytes;
use common::{backends, data, save, small_parts, upload};
use object_store::{ObjectStoreExt, PutPayload};
use shardstream_checkpoint::testing::{FaultAction, FaultStore};
use shardstream_checkpoint::{
    CheckpointError, CheckpointReader, CheckpointRoot, CommitRequest, ReadConfig, UploadConfig,
    UploadSource,
};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn save_commit_read_round_trip() {
    for b in backends() {
        let root = &b.root;
        let attempt = root.begin_save("step_42").await.unwrap();
        let w0 = root.rank_writer(&attempt, 0, &small_parts()).unwrap();
        let w1 = root.rank_writer(&attempt, 1, &small_parts()).unwrap();

        // Sizes around the part size: empty, small, exactly one part, parts + tail, exact parts.
        let sizes = [0usize, 100, 4096, 4096 * 3 + 17, 4096 * 4];
        let mut expected = Vec::new();
        let mut records = Vec::new();
        for (k, &size) in sizes.iter().enumerate() {
            let bytes = data(k as u64, size);
            let name = format!("__0_{k}.distcp");
            records.push(w0.upload_bytes(&name, bytes.clone()).await.unwrap());
            expected.push((format!("{}/{name}", attempt.attempt()), bytes));
        }
        // A local file, streamed.
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let file_bytes = data(99, 4096 * 2 + 5);
        std::fs::write(tmp.path(), &file_bytes).unwrap();
        records.push(w1.upload_file("__1_0.distcp", tmp.path()).await.unwrap());
        expected.push((format!("{}/__1_0.distcp", attempt.attempt()), file_bytes));
        // Push-style writes in odd-sized pieces, mixing copies and zero-copy bytes.
        let push = data(5, 10_000);
        let mut fw = w1.create("__1_1.distcp").unwrap();
        for (i, chunk) in push.chunks(333).enumerate() {
            if i % 2 == 0 {
                fw.write(chunk).await.unwrap();
            } else {
                fw.write_bytes(Bytes::copy_from_slice(chunk)).await.unwrap();
            }
        }
        records.push(fw.finish().await.unwrap());
        expected.push((format!("{}/__1_1.distcp", attempt.attempt()), push));
        records.push(
            w0.upload_bytes(".metadata", Bytes::from_static(b"dcp-metadata"))
                .await
                .unwrap(),
        );

        // Part layout: single PUT up to one part, then parts.
        let by_path = |p: &str| records.iter().find(|r| r.path.ends_with(p)).unwrap();
        assert!(by_path("__0_2.distcp").parts.is_empty(), "{}", b.name);
        assert_eq!(by_path("__0_3.distcp").parts.len(), 4);
        assert_eq!(by_path("__0_4.distcp").parts.len(), 4);
        assert_eq!(by_path("__1_1.distcp").parts.len(), 3);
        assert_eq!(by_path("__0_1.distcp").rank, Some(0));

        let before = b.metrics.snapshot();
        let manifest = root
            .commit(
                &attempt,
                CommitRequest {
                    records,
                    world_size: 2,
                    aliases: vec![(".metadata".into(), ".metadata".into())],
                    metadata: serde_json::json!({"model": "tiny"})
                        .as_object()
                        .cloned()
                        .unwrap(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(manifest.step, Some(42));
        assert_eq!(b.metrics.snapshot().commits, before.commits + 1);
        let total: u64 = expected.iter().map(|(_, d)| d.len() as u64).sum::<u64>() + 12;
        assert_eq!(b.metrics.snapshot().bytes_written, total, "{}", b.name);

        let latest = root.latest().await.unwrap().unwrap();
        assert_eq!((latest.id.as_str(), latest.world_size), ("step_42", 2));
        let reader = root.open("step_42").await.unwrap();
        assert_eq!(reader.manifest().metadata["model"], "tiny");
        for (path, bytes) in &expected {
            assert_eq!(&reader.read_file(path).await.unwrap(), bytes, "{}", b.name);
            let n = bytes.len() as u64;
            for (s, e) in [
                (0, n),
                (n / 3, n / 2),
                (n.saturating_sub(1), n),
                (5.min(n), n),
            ] {
                let got = reader.read_range(path, s..e).await.unwrap();
                assert_eq!(&got[..], &bytes[s as usize..e as usize]);
                let got = reader.read_range_verified(path, s..e).await.unwrap();
                assert_eq!(&got[..], &bytes[s as usize..e as usize]);
            }
        }
        // The alias is published at the root, and readable through the manifest.
        let alias = root
            .store()
            .get(&root.checkpoint_dir("step_42").join(".metadata"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(&alias[..], b"dcp-metadata");
        assert_eq!(
            &reader.read_file(".metadata").await.unwrap()[..],
            b"dcp-metadata"
        );

        let report = root.verify("step_42").await.unwrap();
        assert!(report.is_ok(), "{:?}", report.failures);
        assert_eq!(report.files_checked, 9);
    }
}

/// A reader of `id` whose ranged GETs are at most 1000 bytes, except for a part (or single-PUT
/// file) of up to `whole_part_max` bytes, which is one GET.
async fn small_reads(root: &CheckpointRoot, id: &str, whole_part_max: u64) -> CheckpointReader {
    root.open_with(
        id,
        ReadConfig {
            chunk_size: 1000,
            whole_part_max,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn ranged_reads_fetch_only_what_is_asked() {
    for b in backends() {
        save(&b.root, "step_1", 1, 4096 * 8).await;
        let reader = small_reads(&b.root, "step_1", 0).await;
        let path = reader.manifest().files[0].path.clone();
        let before = b.metrics.snapshot();
        let got = reader.read_range(&path, 4000..4200).await.unwrap();
        assert_eq!(got.len(), 200);
        let after = b.metrics.snapshot();
        assert_eq!(after.bytes_read - before.bytes_read, 200);
        // 4000..4096 in part 0, 4096..4200 in part 1: two ranged GETs.
        assert_eq!(after.get_requests - before.get_requests, 2);
        // A whole part in 1000-byte chunks: five GETs, checked by combining their CRCs.
        let whole = reader.read_range(&path, 4096..8192).await.unwrap();
        assert_eq!(whole.len(), 4096);
        assert_eq!(b.metrics.snapshot().get_requests - after.get_requests, 5);

        // By default a part of a file in a store comes back as one GET, as it went up.
        let whole_parts =
            small_reads(&b.root, "step_1", ReadConfig::default().whole_part_max).await;
        let before = b.metrics.snapshot();
        let two_parts = whole_parts.read_range(&path, 4096..12288).await.unwrap();
        assert_eq!(&two_parts[..4096], &whole[..]);
        assert_eq!(b.metrics.snapshot().get_requests - before.get_requests, 2);

        let err = reader.read_range(&path, 0..4096 * 8 + 1).await.unwrap_err();
        assert!(matches!(err, CheckpointError::RangeOutOfBounds { size, .. } if size == 4096 * 8));
        assert!(reader.read_range(&path, 10..10).await.unwrap().is_empty());
        let err = reader.read_range("nope", 0..1).await.unwrap_err();
        assert!(matches!(err, CheckpointError::UnknownFile { .. }));
    }
}

#[tokio::test]
async fn a_single_put_file_comes_back_in_one_get() {
    for b in backends() {
        // 4000 bytes with 4096-byte parts: each file went up as one PUT.
        save(&b.root, "step_1", 1, 4000).await;
        for (whole_part_max, gets) in [(0, 4), (ReadConfig::default().whole_part_max, 1)] {
            let reader = small_reads(&b.root, "step_1", whole_part_max).await;
            let rec = reader.manifest().files[0].clone();
            assert!(rec.parts.is_empty(), "{}: {rec:?}", b.name);
            let before = b.metrics.snapshot();
            let got = reader.read_range(&rec.path, 0..rec.size).await.unwrap();
            assert_eq!(got, data(7, 4000), "{}", b.name);
            let after = b.metrics.snapshot();
            assert_eq!(after.get_requests - before.get_requests, gets, "{}", b.name);
        }
    }
}

#[tokio::test]
async fn latest_ignores_uncommitted() {
    for b in backends() {
        let root = &b.root;
        save(root, "step_1", 2, 5000).await;
        // A newer save whose files are all up but whose manifest never came.
        let attempt = root.begin_save("step_2").await.unwrap();
        upload(root, &attempt, 2, 2, 5000).await;
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_1");
        let ids: Vec<String> = root
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(ids, vec!["step_1"]);
        let err = root.open("step_2").await.unwrap_err();
        assert!(matches!(err, CheckpointError::NotCommitted { .. }), "{err}");

        // A fresh attempt of the same id commits; the dead attempt's files are not in it.
        let retry = root.begin_save("step_2").await.unwrap();
        assert_ne!(retry.attempt(), attempt.attempt());
        let records = upload(root, &retry, 2, 1, 100).await;
        root.commit(
            &retry,
            CommitRequest {
                records,
                world_size: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let m = root.open("step_2").await.unwrap();
        assert_eq!(m.manifest().files.len(), 2);
        assert!(m
            .manifest()
            .files
            .iter()
            .all(|f| f.path.starts_with(retry.attempt())));
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_2");
    }
}

#[tokio::test]
async fn committed_checkpoint_is_never_overwritten() {
    for b in backends() {
        let root = &b.root;
        // A second coordinator started before the first committed.
        let late = root.begin_save("step_7").await.unwrap();
        let first = save(root, "step_7", 1, 3000).await;
        let err = root.begin_save("step_7").await.unwrap_err();
        assert!(matches!(err, CheckpointError::AlreadyCommitted { ref id, .. } if id == "step_7"));

        let records = upload(root, &late, 1, 2, 3000).await;
        let err = root
            .commit(
                &late,
                CommitRequest {
                    records,
                    world_size: 1,
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, CheckpointError::AlreadyCommitted { .. }),
            "{err}"
        );
        assert_eq!(b.metrics.snapshot().commit_conflicts, 1);
        let reader = root.open("step_7").await.unwrap();
        assert_eq!(reader.manifest().attempt, first.attempt);
        assert!(root.verify("step_7").await.unwrap().is_ok());
    }
}

#[tokio::test]
async fn racing_coordinators_one_wins() {
    for b in backends() {
        for trial in 0..10 {
            let id = format!("step_{trial}");
            let root = &b.root;
            let (a, c) = (
                root.begin_save(&id).await.unwrap(),
                root.begin_save(&id).await.unwrap(),
            );
            let (ra, rc) = (
                upload(root, &a, 2, 1, 3000).await,
                upload(root, &c, 2, 1, 3000).await,
            );
            let req = |records| CommitRequest {
                records,
                world_size: 2,
                ..Default::default()
            };
            let (x, y) = tokio::join!(root.commit(&a, req(ra)), root.commit(&c, req(rc)));
            let winner = match (x, y) {
                (Ok(m), Err(CheckpointError::AlreadyCommitted { .. })) => m,
                (Err(CheckpointError::AlreadyCommitted { .. }), Ok(m)) => m,
                other => panic!("{}: expected exactly one winner, got {other:?}", b.name),
            };
            let reader = root.open(&id).await.unwrap();
            assert_eq!(reader.manifest().attempt, winner.attempt);
            assert!(root.verify(&id).await.unwrap().is_ok());
        }
    }
}

#[tokio::test]
async fn commit_checks_every_file() {
    for b in backends() {
        let root = &b.root;
        let attempt = root.begin_save("step_3").await.unwrap();
        let records = upload(root, &attempt, 1, 2, 5000).await;
        let dir = root.checkpoint_dir("step_3");
        let victim = dir.clone().join(attempt.attempt()).join("__0_1.distcp");

        root.store()
            .put(&victim, PutPayload::from(vec![0u8; 4999]))
            .await
            .unwrap();
        let req = CommitRequest {
            records: records.clone(),
            world_size: 1,
            ..Default::default()
        };
        match root.commit(&attempt, req.clone()).await.unwrap_err() {
            CheckpointError::SizeMismatch {
                path,
                expected,
                actual,
            } => assert_eq!((path, expected, actual), (victim.clone(), 5000, 4999)),
            e => panic!("{e}"),
        }
        root.store().delete(&victim).await.unwrap();
        match root.commit(&attempt, req).await.unwrap_err() {
            CheckpointError::MissingObject { path } => assert_eq!(path, victim),
            e => panic!("{e}"),
        }
        assert!(root.latest().await.unwrap().is_none());

        // Records from another attempt, duplicates, or a bad world size are refused up front.
        let other = root.begin_save("step_3").await.unwrap();
        let bad = |records, world_size| CommitRequest {
            records,
            world_size,
            ..Default::default()
        };
        for (req, needle) in [
            (bad(records.clone(), 1), "is not in attempt"),
            (bad(vec![], 1), "no files"),
        ] {
            let e = root.commit(&other, req).await.unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        let dup = vec![records[0].clone(), records[0].clone()];
        let e = root.commit(&attempt, bad(dup, 1)).await.unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let e = root
            .commit(&attempt, bad(records.clone(), 0))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("world_size"), "{e}");
    }
}

#[tokio::test]
async fn flipped_byte_is_reported_with_its_object() {
    for b in backends() {
        let root = &b.root;
        let m = save(root, "step_9", 1, 4096 * 3 + 100).await;
        let rec = m.files[0].clone();
        let full = root
            .open("step_9")
            .await
            .unwrap()
            .object_path(&rec.path)
            .unwrap();
        let mut bytes = root
            .store()
            .get(&full)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec();
        bytes[4096 + 10] ^= 0x01; // a byte in part 1
        root.store()
            .put(&full, PutPayload::from(bytes))
            .await
            .unwrap();

        let reader = root.open("step_9").await.unwrap();
        match reader.read_file(&rec.path).await.unwrap_err() {
            CheckpointError::ChecksumMismatch {
                path,
                part,
                expected,
                actual,
            } => {
                assert_eq!(path, full, "{}", b.name);
                assert_eq!(part, Some(1));
                assert_eq!(expected, rec.parts[1]);
                assert_ne!(actual, expected);
            }
            e => panic!("{e}"),
        }
        // A range inside the part is returned unchecked; the verified read widens and catches it.
        assert_eq!(
            reader
                .read_range(&rec.path, 4100..4200)
                .await
                .unwrap()
                .len(),
            100
        );
        let e = reader
            .read_range_verified(&rec.path, 4100..4200)
            .await
            .unwrap_err();
        assert!(matches!(
            e,
            CheckpointError::ChecksumMismatch { part: Some(1), .. }
        ));
        // Other parts still read clean.
        reader.read_range(&rec.path, 0..4096).await.unwrap();

        let report = root.verify("step_9").await.unwrap();
        assert_eq!(report.failures.len(), 1);
        assert!(report.failures[0].to_string().contains(full.as_ref()));
        assert!(b.metrics.snapshot().integrity_failures >= 3);
    }
}

#[tokio::test]
async fn failed_part_aborts_the_upload() {
    for b in backends() {
        let fault = FaultStore::new(b.root.store().clone()).on_part(2, FaultAction::Fail);
        let root = CheckpointRoot::new(Arc::new(fault.clone()), b.root.root().clone());
        let attempt = root.begin_save("step_1").await.unwrap();
        let w = root.rank_writer(&attempt, 0, &small_parts()).unwrap();
        let err = w
            .upload_bytes("__0_0.distcp", data(1, 4096 * 5))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("__0_0.distcp"), "{err}");
        assert_eq!(fault.stats().aborted, 1);
        assert_eq!(fault.stats().completed, 0);
        let path = root
            .checkpoint_dir("step_1")
            .join(attempt.attempt())
            .join("__0_0.distcp");
        assert!(root.store().head(&path).await.is_err(), "{}", b.name);

        // upload_all stops at the first failure and aborts what is in flight.
        let fault = FaultStore::new(b.root.store().clone()).on_part(3, FaultAction::Fail);
        let root = CheckpointRoot::new(Arc::new(fault.clone()), b.root.root().clone());
        let w = root.rank_writer(&attempt, 0, &small_parts()).unwrap();
        let files = (0..4).map(|k| (format!("f{k}"), UploadSource::Bytes(data(k, 4096 * 4))));
        assert!(w.upload_all(files).await.is_err());
        // Dropped uploads abort in the background: wait for every one to settle.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let s = fault.stats();
            if s.aborted + s.completed == s.multipart_started {
                assert!(s.aborted >= 1, "{s:?}");
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{s:?}");
            tokio::task::yield_now().await;
        }
    }
}

#[tokio::test]
async fn dropped_writer_aborts_its_upload() {
    let b = backends().remove(0);
    let fault = FaultStore::new(b.root.store().clone());
    let root = CheckpointRoot::new(Arc::new(fault.clone()), b.root.root().clone());
    let attempt = root.begin_save("step_1").await.unwrap();
    let w = root.rank_writer(&attempt, 0, &small_parts()).unwrap();
    let mut fw = w.create("x").unwrap();
    fw.write(&data(3, 4096 * 3)).await.unwrap();
    drop(fw);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while fault.stats().aborted == 0 {
        assert!(tokio::time::Instant::now() < deadline, "abort never came");
        tokio::task::yield_now().await;
    }
    assert_eq!(fault.stats().completed, 0);
}

#[tokio::test]
async fn part_memory_stays_within_budget() {
    for b in backends() {
        let fault = FaultStore::new(b.root.store().clone()).part_delay(Duration::from_millis(5));
        let root = CheckpointRoot::new(Arc::new(fault.clone()), b.root.root().clone());
        let attempt = root.begin_save("step_1").await.unwrap();
        let config = UploadConfig {
            part_size: 4096,
            memory_budget: 3 * 4096,
            max_concurrent_requests: 64,
            max_concurrent_files: 8,
            max_requests_per_second: None,
            single_put_max: 0,
        };
        let w = root.rank_writer(&attempt, 0, &config).unwrap();
        let files = (0..6).map(|k| (format!("f{k}"), UploadSource::Bytes(data(k, 4096 * 10))));
        let records = w.upload_all(files).await.unwrap();
        assert_eq!(records.len(), 6);
        let s = fault.stats();
        assert_eq!(s.parts, 60);
        assert!(s.peak_part_bytes_in_flight <= 3 * 4096, "{s:?}");
        assert!(
            s.peak_part_bytes_in_flight >= 2 * 4096,
            "no parallelism: {s:?}"
        );
    }
}

#[tokio::test]
async fn manifest_of_another_id_is_refused() {
    for b in backends() {
        let root = &b.root;
        save(root, "step_1", 1, 10).await;
        let body = root
            .store()
            .get(&root.manifest_path("step_1"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        root.store()
            .put(&root.manifest_path("step_2"), body.into())
            .await
            .unwrap();
        let e = root.open("step_2").await.unwrap_err();
        assert!(matches!(e, CheckpointError::InvalidManifest { .. }), "{e}");
        // Not listed either, and latest stays on the valid one.
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_1");
        root.store()
            .put(
                &root.manifest_path("step_3"),
                Bytes::from_static(b"{garbage").into(),
            )
            .await
            .unwrap();
        assert_eq!(root.list().await.unwrap().len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn rate_cap_spaces_put_requests() {
    let b = backends().remove(0);
    let attempt = b.root.begin_save("step_1").await.unwrap();
    let config = UploadConfig {
        max_requests_per_second: Some(10.0),
        ..small_parts()
    };
    let w = b.root.rank_writer(&attempt, 0, &config).unwrap();
    let start = tokio::time::Instant::now();
    let rec = w.upload_bytes("f", data(1, 4096 * 5)).await.unwrap();
    assert_eq!(rec.parts.len(), 5);
    // Five parts at 10/s: the last may start 0.4 s after the first.
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_millis(500),
        "{elapsed:?}"
    );
}

/// On a root whose create is not known to be atomic (an in-memory store behind
/// `CheckpointRoot::new`), a commit with no other attempt of its id in the store reads the
/// manifest back at once; one with another attempt folder there (a rival save, or a dead one's
/// leftovers) waits `ATOMIC_SETTLE` first. The clock is tokio's paused one: the waits are
/// counted, not slept.
#[tokio::test(start_paused = true)]
async fn commit_waits_only_when_another_attempt_is_listed() {
    use object_store::memory::InMemory;
    use shardstream_checkpoint::ATOMIC_SETTLE;

    let root = CheckpointRoot::new(Arc::new(InMemory::new()), "ckpt".into());
    assert!(!root.create_is_atomic());
    let commit = |id: &'static str| {
        let root = &root;
        async move {
            let attempt = root.begin_save(id).await.unwrap();
            let records = upload(root, &attempt, 1, 1, 100).await;
            let started = tokio::time::Instant::now();
            root.commit(
                &attempt,
                CommitRequest {
                    records,
                    world_size: 1,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            started.elapsed()
        }
    };

    assert!(commit("step_1").await < ATOMIC_SETTLE);

    // Leftovers of an earlier, dead attempt of step_2.
    let dead = root.begin_save("step_2").await.unwrap();
    upload(&root, &dead, 1, 1, 100).await;
    assert!(commit("step_2").await >= ATOMIC_SETTLE);
    assert_eq!(root.list().await.unwrap().len(), 2);
}
