//! Helpers for the `shardstream run` / `cache gc` tests: start the built binary with a clean
//! environment (no SHARDSTREAM_*, torchrun or Kubernetes variables leak in from the caller),
//! read a child's stdout line by line, and wait with a deadline instead of hanging.
// Each test file uses a different subset; a failed set-up step panics with its message.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod restart_job;

use std::borrow::BorrowMut;
use std::io::{BufRead, BufReader, Lines};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The multi-process torchrun jobs of this test binary (gloo rendezvous, elastic restarts) take
/// turns: run side by side on a two-core CI machine, their rendezvous and collectives time out
/// under each other's load, which says nothing about the code under test.
static TORCHRUN_JOBS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds this test's turn among the torchrun jobs until dropped.
pub fn torchrun_turn() -> std::sync::MutexGuard<'static, ()> {
    TORCHRUN_JOBS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `shardstream` with only PATH and LANG from the caller's environment.
pub fn shardstream(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardstream"));
    cmd.env_clear();
    for key in ["PATH", "LANG"] {
        if let Ok(v) = std::env::var(key) {
            cmd.env(key, v);
        }
    }
    cmd.args(args);
    cmd
}

/// Runs it to the end: (exit code, stdout, stderr).
pub fn output(mut cmd: impl BorrowMut<Command>) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.borrow_mut().stdin(Stdio::null()).output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Starts it with stdout piped, in a process group of its own (as a pod's PID 1 would be),
/// and returns the child and its stdout lines.
pub fn spawn_piped(cmd: &mut Command) -> (Child, Lines<BufReader<ChildStdout>>) {
    std::os::unix::process::CommandExt::process_group(cmd, 0);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    (child, BufReader::new(out).lines())
}

/// The next stdout line (panics if stdout closed).
pub fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    lines.next().expect("stdout closed").unwrap()
}

/// Waits for `child` at most `limit`; kills it and panics past that.
pub fn wait_for(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} still running after {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (a name for kill(1), e.g. "TERM") to process `pid`.
pub fn kill(signal: &str, pid: u32) {
    let ok = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A program of the workspace's Python venv (`.venv/bin/NAME`), which must exist.
pub fn venv_bin(name: &str) -> PathBuf {
    let path = workspace().join(".venv/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: create the venv (scripts/setup-venv.sh)",
        path.display()
    );
    path
}

/// A TCP port free on 127.0.0.1 at the time of the call.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Shell text that blocks until `file` exists (checked every 50 ms, at most ~2 minutes, then
/// exit 99 so a broken test cannot leave processes behind).
pub fn sh_wait_for_file(file: &Path) -> String {
    format!(
        "i=0; while [ ! -e '{}' ]; do sleep 0.05; i=$((i+1)); if [ $i -gt 2400 ]; then exit 99; fi; done",
        file.display()
    )
}

/// `cache_root.join(rel)` as a string.
pub fn s(path: &Path) -> String {
    path.display().to_string()
}
