//! The supervisor against real child processes (`sh`): exit codes, signal forwarding to the
//! whole process group, the grace-period kill, the exported environment and the hooks.
//!
//! Children announce readiness on a piped stdout ("ready" once their traps are set), and the
//! tests block reading it: no sleeps, no races with trap installation. Every child gives up by
//! itself after about a minute (exit 99), so a broken supervisor fails a test instead of hanging
//! it or leaving processes behind. Children idle in a *foreground* `sleep` counted by shell
//! arithmetic: the group signal kills the `sleep` and the shell runs its trap next. (A loop over
//! `$(seq N)` would be evaluated after "ready", and a signal killing `seq` would end it at once.)

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use std::io::{BufRead, BufReader, Lines};
use std::process::{ChildStdout, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardstream_launcher::{ForwardSignal, HookResult, Overrides, Running, Supervisor};

fn sh(script: &str) -> Supervisor {
    Supervisor::new(["sh", "-c", script]).unwrap()
}

fn piped(sup: Supervisor) -> (Running, Lines<BufReader<ChildStdout>>) {
    let mut running = sup.stdout(Stdio::piped()).spawn().unwrap();
    let out = running.take_stdout().unwrap();
    (running, BufReader::new(out).lines())
}

fn expect_line(lines: &mut Lines<BufReader<ChildStdout>>, want: &str) {
    let got = lines.next().expect("child closed stdout").unwrap();
    assert_eq!(got, want);
}

#[test]
fn exit_code_is_propagated() {
    for (script, code) in [("exit 0", 0), ("exit 3", 3), ("exit 255", 255)] {
        let outcome = sh(script).spawn().unwrap().wait().unwrap();
        assert_eq!(outcome.exit_code, code, "{script}");
        assert!(outcome.forwarded.is_empty());
        assert!(!outcome.killed_after_grace);
    }
}

#[test]
fn death_by_signal_is_128_plus_signal() {
    let outcome = sh("kill -KILL $$").spawn().unwrap().wait().unwrap();
    assert_eq!(outcome.exit_code, 137);
    let outcome = sh("kill -TERM $$").spawn().unwrap().wait().unwrap();
    assert_eq!(outcome.exit_code, 143);
}

#[test]
fn missing_program_is_an_error_and_hooks_still_run() {
    let ran = Arc::new(Mutex::new(false));
    let flag = ran.clone();
    let err = Supervisor::new(["/nonexistent/shardstream-test-program"])
        .unwrap()
        .on_shutdown("unmount", Duration::from_secs(5), move |_| {
            *flag.lock().unwrap() = true;
            Ok(())
        })
        .spawn()
        .unwrap_err();
    assert!(err.to_string().contains("could not start"), "{err}");
    assert!(*ran.lock().unwrap());
    assert!(Supervisor::new(Vec::<String>::new()).is_err());
}

#[test]
fn sigterm_reaches_the_whole_group_and_the_exit_code_is_the_childs() {
    // The child starts a grandchild in its own (the child's) process group; both trap TERM
    // and say so. The child waits for the grandchild and exits 7.
    let script = r#"
        ( trap 'echo grandchild-term; exit 0' TERM; echo grandchild-ready; i=0; while [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done ) &
        trap 'wait; echo child-term; exit 7' TERM
        echo ready
        wait
    "#;
    let (running, mut lines) = piped(sh(script));
    let mut seen = Vec::new();
    // Both "ready" lines, in either order.
    for _ in 0..2 {
        seen.push(lines.next().unwrap().unwrap());
    }
    seen.sort();
    assert_eq!(seen, vec!["grandchild-ready", "ready"]);
    let signaller = running.signaller();
    assert!(signaller.forward(ForwardSignal::Term));
    let waiter = std::thread::spawn(move || running.wait().unwrap());
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let outcome = waiter.join().unwrap();
    assert!(rest.contains(&"grandchild-term".to_string()), "{rest:?}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some("child-term"),
        "{rest:?}"
    );
    assert_eq!(outcome.exit_code, 7);
    assert_eq!(outcome.forwarded, vec![ForwardSignal::Term]);
    assert!(!outcome.killed_after_grace);
}

#[test]
#[allow(unsafe_code)] // one libc call, see below
fn sighup_is_forwarded_without_starting_the_grace_period() {
    // With a zero grace period, a HUP that armed the kill would SIGKILL the child at once
    // (exit 137); the child instead exits 0 by itself on the second HUP.
    let script = r#"
        n=0
        trap 'n=$((n+1)); echo hup; if [ $n -ge 2 ]; then exit 0; fi' HUP
        echo ready
        i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 99
    "#;
    // A test run under `nohup` (a CI script, a detached shell) inherits SIGHUP ignored, and a
    // shell cannot trap a signal ignored on entry: the child would never see a HUP. The
    // supervisor rightly keeps what it inherited (a job under `nohup` should ignore hangups),
    // so the test gives its children the default disposition.
    // SAFETY: setting a signal's disposition to its default installs no handler.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_DFL);
    }
    let (running, mut lines) = piped(sh(script).grace_period(Duration::ZERO));
    expect_line(&mut lines, "ready");
    let signaller = running.signaller();
    let waiter = std::thread::spawn(move || running.wait().unwrap());
    signaller.forward(ForwardSignal::Hup);
    expect_line(&mut lines, "hup");
    signaller.forward(ForwardSignal::Hup);
    expect_line(&mut lines, "hup");
    let outcome = waiter.join().unwrap();
    assert_eq!(outcome.exit_code, 0);
    assert!(!outcome.killed_after_grace);
    assert_eq!(
        outcome.forwarded,
        vec![ForwardSignal::Hup, ForwardSignal::Hup]
    );
}

#[test]
fn a_child_ignoring_sigterm_is_killed_after_the_grace_period() {
    let grace = Duration::from_millis(300);
    let script = r#"
        trap 'echo ignoring' TERM
        echo ready
        i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 99
    "#;
    let (running, mut lines) = piped(sh(script).grace_period(grace));
    expect_line(&mut lines, "ready");
    let signaller = running.signaller();
    let start = Instant::now();
    signaller.forward(ForwardSignal::Term);
    let outcome = running.wait().unwrap();
    let took = start.elapsed();
    assert!(outcome.killed_after_grace);
    assert_eq!(outcome.exit_code, 137);
    assert!(
        took >= grace,
        "killed after {took:?}, before the grace period"
    );
    assert!(took < grace + Duration::from_secs(10), "took {took:?}");
    assert_eq!(outcome.forwarded, vec![ForwardSignal::Term]);
}

#[test]
fn resolved_environment_is_exported() {
    let resolved = shardstream_launcher::resolve_with(
        &Overrides {
            run_id: Some("run-7".into()),
            node_rank: Some(2),
            ..Overrides::default()
        },
        &|_: &str| None,
    )
    .unwrap();
    let script =
        r#"echo "$SHARDSTREAM_RUN_ID|$SHARDSTREAM_NODE_RANK|$SHARDSTREAM_CACHE_DIR|$EXTRA""#;
    let sup = sh(script)
        .export_resolved(&resolved, std::path::Path::new("/cache/run-7/2"))
        .env("EXTRA", "x");
    let (running, mut lines) = piped(sup);
    expect_line(&mut lines, "run-7|2|/cache/run-7/2|x");
    assert_eq!(running.wait().unwrap().exit_code, 0);
}

#[test]
fn leftovers_in_the_group_are_killed_and_hooks_run_after_the_child() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    // The child leaves a background sleeper in its group and exits at once.
    let script = r#"
        ( trap '' TERM; i=0; while [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done ) &
        echo $!
    "#;
    let sup = sh(script).on_shutdown("drain", Duration::from_secs(5), move |_| {
        o.lock().unwrap().push("drain");
        Ok(())
    });
    let (running, mut lines) = piped(sup);
    let leftover: i32 = lines.next().unwrap().unwrap().parse().unwrap();
    let outcome = running.wait().unwrap();
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(outcome.hooks.len(), 1);
    assert_eq!(outcome.hooks[0].result, HookResult::Done);
    assert_eq!(*order.lock().unwrap(), vec!["drain"]);
    // The sleeper's subshell got SIGKILL: it is gone (or a zombie awaiting its new parent,
    // which reads as state Z in /proc), bounded wait for the reaper.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{leftover}/stat")).ok();
        let alive = state
            .as_deref()
            .and_then(|s| s.rsplit(')').next())
            .map(|rest| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false);
        if !alive {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leftover {leftover} still running"
        );
        std::thread::yield_now();
    }
}
