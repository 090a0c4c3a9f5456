//! `pyjson` against CPython itself: `repr(float)` for thousands of doubles and `json.dumps` (with
//! and without `sort_keys`) for random JSON documents, checked by the venv's interpreter
//! (`$SHARDSTREAM_PYTHON`, else the workspace's `.venv/bin/python`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Map, Value as Json};
use shardstream_sharding::mds::pyjson::{dumps, float_repr};

fn python() -> PathBuf {
    std::env::var_os("SHARDSTREAM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            std::fs::canonicalize(&workspace)
                .unwrap_or(workspace)
                .join(".venv/bin/python")
        })
}

/// Runs `code` with `input` on stdin and returns stdout lines.
fn run_python(code: &str, input: &str) -> Vec<String> {
    let mut child = Command::new(python())
        .arg("-c")
        .arg(code)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (set SHARDSTREAM_PYTHON): {e}",
                python().display()
            )
        });
    // Feed stdin from another thread so a full stdout pipe cannot deadlock us.
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(out.status.success(), "python failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn doubles() -> Vec<f64> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut out = vec![
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
    ];
    for e in -330..310 {
        out.push(10f64.powi(e));
        out.push(-1.5 * 10f64.powi(e));
    }
    for _ in 0..4000 {
        out.push(f64::from_bits(rng.next()));
        let mantissa = rng.below(1_000_000) as f64;
        out.push(mantissa * 10f64.powi(rng.below(40) as i32 - 20));
        out.push((rng.below(1 << 54) as f64) * if rng.below(2) == 0 { 1.0 } else { -1.0 });
        out.push(f64::from(rng.next() as u32 as f32) / 1e6);
    }
    out
}

#[test]
fn float_repr_matches_cpython() {
    let values = doubles();
    let input: String = values
        .iter()
        .map(|f| format!("{:016x}\n", f.to_bits()))
        .collect();
    let code = "import sys, struct\nfor line in sys.stdin:\n    print(repr(struct.unpack('<d', bytes.fromhex(line.strip())[::-1])[0]))";
    let expected = run_python(code, &input);
    assert_eq!(expected.len(), values.len());
    for (f, want) in values.iter().zip(&expected) {
        assert_eq!(&float_repr(*f), want, "bits {:016x}", f.to_bits());
    }
}

fn random_json(rng: &mut Rng, depth: u32) -> Json {
    let strings = [
        "",
        "a",
        "é",
        "😀",
        "\"\\/\n\t\u{1}\u{7f}",
        "ключ",
        "\u{ffff}",
        "z",
    ];
    match rng.below(if depth == 0 { 6 } else { 8 }) {
        0 => Json::Null,
        1 => Json::Bool(rng.below(2) == 0),
        2 => Json::from(rng.next() as i64),
        3 => Json::from(rng.next()),
        4 => {
            let f = f64::from_bits(rng.next());
            if f.is_finite() {
                Json::from(f)
            } else {
                Json::from(rng.below(1000) as f64 / 8.0)
            }
        }
        5 => Json::String(
            strings[rng.below(strings.len() as u64) as usize].repeat(rng.below(3) as usize + 1),
        ),
        6 => Json::Array(
            (0..rng.below(5))
                .map(|_| random_json(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.below(5) {
                let key = format!(
                    "{}{}",
                    strings[rng.below(strings.len() as u64) as usize],
                    rng.below(100)
                );
                m.insert(key, random_json(rng, depth - 1));
            }
            Json::Object(m)
        }
    }
}

#[test]
fn dumps_matches_cpython() {
    let mut rng = Rng(12345);
    let docs: Vec<Json> = (0..400).map(|_| random_json(&mut rng, 4)).collect();
    // serde_json's compact text carries each document to Python; floats parse exactly there.
    let input: String = docs.iter().map(|d| format!("{d}\n")).collect();
    let code = "import sys, json\nfor line in sys.stdin:\n    o = json.loads(line)\n    print(json.dumps(o))\n    print(json.dumps(o, sort_keys=True))";
    let expected = run_python(code, &input);
    assert_eq!(expected.len(), docs.len() * 2);
    for (i, doc) in docs.iter().enumerate() {
        assert_eq!(dumps(doc, false), expected[2 * i], "doc {i}");
        assert_eq!(dumps(doc, true), expected[2 * i + 1], "doc {i} sorted");
    }
}
