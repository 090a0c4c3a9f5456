//! A real SIGTERM sent to this process is caught and forwarded to the child instead of killing
//! us. Alone in its own test binary: it signals the whole test process.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use shardstream_launcher::{ForwardSignal, OsSignals, Supervisor};

#[test]
fn os_sigterm_is_forwarded_to_the_child() {
    let script = r#"
        trap 'echo term; exit 9' TERM
        echo ready
        i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 99
    "#;
    let mut running = Supervisor::new(["sh", "-c", script])
        .unwrap()
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let os = OsSignals::install(running.signaller()).unwrap();
    let mut lines = BufReader::new(running.take_stdout().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    // Signals are forwarded by the waiting loop, so it runs first.
    let waiter = std::thread::spawn(move || running.wait().unwrap());
    signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "term");
    let outcome = waiter.join().unwrap();
    drop(os);
    assert_eq!(outcome.exit_code, 9);
    assert_eq!(outcome.forwarded, vec![ForwardSignal::Term]);

    // `run` puts the same pieces together: catch, start, wait, hooks.
    let outcome = Supervisor::new(["sh", "-c", "exit 4"])
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(outcome.exit_code, 4);
}
