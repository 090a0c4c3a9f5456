//! `verify`: passes on a good dataset; a flipped byte, a truncated shard and a missing shard each
//! fail with a non-zero exit naming the file and the problem.

use crate::common;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn dataset(dir: &Path, extra: &[&str]) -> PathBuf {
    let (input, out) = (dir.join("in"), dir.join("out"));
    files_tree(&input, 40, 300);
    let mut args = vec!["shard", s(&input), s(&out), "--shard-size", "3kb"];
    args.extend_from_slice(extra);
    run(&args).ok();
    assert!(run(&["verify", s(&out)]).ok().stdout.starts_with("ok:"));
    out
}

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn shard_file(out: &Path, n: usize) -> PathBuf {
    let mut names: Vec<String> = listing(out)
        .into_iter()
        .filter(|f| f.starts_with("shard."))
        .collect();
    names.sort();
    out.join(&names[n])
}

/// The failed run's last stderr line (the one-line reason).
fn reason(run: &Run) -> String {
    run.stderr.lines().last().unwrap_or_default().to_string()
}

#[test]
fn a_flipped_byte_fails_naming_the_shard_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let out = dataset(dir.path(), &[]);
    let victim = shard_file(&out, 2);
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&victim, bytes).unwrap();
    let failed = run(&["verify", s(&out)]).failed();
    let name = victim.file_name().unwrap().to_str().unwrap();
    assert!(reason(&failed).contains(name), "{}", failed.stderr);
    assert!(
        reason(&failed).contains("xxh64 hash mismatch"),
        "{}",
        failed.stderr
    );
    assert!(
        failed.stdout.contains(&format!("FAILED {}", s(&victim))),
        "{}",
        failed.stdout
    );
    // `cat` refuses the corrupt shard too.
    assert!(run(&["cat", s(&out)]).failed().stderr.contains(name));
}

#[test]
fn a_truncated_shard_fails_with_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = dataset(
        dir.path(),
        &["--compression", "none", "--hashes", "sha1,md5"],
    );
    let victim = shard_file(&out, 0);
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() - 10]).unwrap();
    let failed = run(&["verify", s(&out), "--json"]).failed();
    let report: Value = serde_json::from_str(&failed.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["problems"].as_array().unwrap().len(), 1);
    assert_eq!(report["problems"][0]["file"], s(&victim));
    let problem = report["problems"][0]["problem"].as_str().unwrap();
    assert!(
        problem.contains(&format!(
            "expected {} bytes, found {}",
            bytes.len(),
            bytes.len() - 10
        )),
        "{problem}"
    );
    assert!(reason(&failed).contains(victim.file_name().unwrap().to_str().unwrap()));
}

#[test]
fn a_listed_shard_that_is_missing_fails() {
    let dir = tempfile::tempdir().unwrap();
    let out = dataset(dir.path(), &[]);
    let victim = shard_file(&out, 1);
    std::fs::remove_file(&victim).unwrap();
    let failed = run(&["verify", s(&out)]).failed();
    let line = reason(&failed);
    assert!(
        line.contains(victim.file_name().unwrap().to_str().unwrap()) && line.contains("missing"),
        "{line}"
    );
}

#[test]
fn every_problem_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let out = dataset(dir.path(), &[]);
    std::fs::remove_file(shard_file(&out, 3)).unwrap();
    let victim = shard_file(&out, 0);
    std::fs::write(&victim, b"garbage").unwrap();
    let failed = run(&["verify", s(&out), "--json"]).failed();
    let report: Value = serde_json::from_str(&failed.stdout).unwrap();
    assert_eq!(report["problems"].as_array().unwrap().len(), 2, "{report}");
    assert!(reason(&failed).contains("2 problem(s)"));
}

/// Uncompressed local shards are streamed through the checks rather than read whole: a flipped
/// byte still fails its hash, and a broken offset table fails even with no hash recorded.
#[test]
fn uncompressed_local_shards_are_checked_in_full() {
    let dir = tempfile::tempdir().unwrap();
    let hashed = dataset(
        &dir.path().join("hashed"),
        &["--compression", "none", "--hashes", "xxh64,sha256"],
    );
    let victim = shard_file(&hashed, 1);
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&victim, bytes).unwrap();
    let failed = run(&["verify", s(&hashed)]).failed();
    let line = reason(&failed);
    assert!(
        line.contains(victim.file_name().unwrap().to_str().unwrap())
            && line.contains("hash mismatch"),
        "{line}"
    );

    let unhashed = dataset(
        &dir.path().join("unhashed"),
        &["--compression", "none", "--hashes", "none"],
    );
    let victim = shard_file(&unhashed, 0);
    let mut bytes = std::fs::read(&victim).unwrap();
    // The second offset (sample 0's end) set below the first: sizes match, the header does not.
    bytes[8..12].copy_from_slice(&0u32.to_le_bytes());
    std::fs::write(&victim, bytes).unwrap();
    let failed = run(&["verify", s(&unhashed), "--json"]).failed();
    let report: Value = serde_json::from_str(&failed.stdout).unwrap();
    assert_eq!(report["problems"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["problems"][0]["file"], s(&victim));
    let problem = report["problems"][0]["problem"].as_str().unwrap();
    assert!(problem.contains("offset 1"), "{problem}");
}
