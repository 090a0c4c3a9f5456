//! Helpers shared by the CLI tests: run the built binary, build inputs, read outputs.
// Each test file uses a different subset of the helpers; a failed set-up step should panic with
// its message, as in the tests themselves.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The result of one `shardstream` run.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Panics with both streams unless the run succeeded.
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "failed:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }

    /// Panics unless the run failed; returns it for more checks.
    pub fn failed(self) -> Run {
        assert_ne!(
            self.code, 0,
            "succeeded unexpectedly:\nstdout: {}",
            self.stdout
        );
        self
    }
}

fn finish(out: Output) -> Run {
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `shardstream ARGS` with `env` added (AWS variables of the caller removed).
pub fn run_env(args: &[&str], env: &[(&str, String)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardstream"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") || k == "S3_ENDPOINT_URL" || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    finish(cmd.output().expect("run shardstream"))
}

/// Runs `shardstream ARGS`.
pub fn run(args: &[&str]) -> Run {
    run_env(args, &[])
}

/// `path` as a &str.
pub fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Writes `data` at `root/rel`, creating folders.
pub fn write(root: &Path, rel: &str, data: &[u8]) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap();
}

/// `cat --json` lines of a dataset.
pub fn cat_json(dataset: &str, env: &[(&str, String)]) -> Vec<serde_json::Value> {
    run_env(&["cat", dataset, "--json"], env)
        .ok()
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The project's Python venv (mosaicml-streaming, webdataset, torchvision, ...).
pub fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
}

/// Runs a Python script with arguments; returns its stdout.
pub fn run_python(script: &str, args: &[&str]) -> String {
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A folder of `n` files with deterministic contents, some in sub-folders.
pub fn files_tree(root: &Path, n: usize, size: usize) {
    for i in 0..n {
        let rel = if i % 3 == 0 {
            format!("sub/f{i:04}.bin")
        } else {
            format!("f{i:04}.bin")
        };
        let data: Vec<u8> = (0..size).map(|j| ((i * 31 + j * 7) % 251) as u8).collect();
        write(root, &rel, &data);
    }
}

/// Every file below `root`, relative, sorted.
pub fn listing(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = walk(root)
        .into_iter()
        .map(|p| p.strip_prefix(root).unwrap().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
