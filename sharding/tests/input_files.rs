//! Folder-of-files and ImageFolder inputs: order, columns, labels, symlink rules, ranges.

use std::fs;
use std::path::Path;

use shardstream_sharding::input::{open, part_range, Input, InputFormat, InputOptions};
use shardstream_sharding::value::{ImageFormat, Value};
use shardstream_sharding::{FormatError, Sample};

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn write(root: &Path, rel: &str, data: &[u8]) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, data).unwrap();
}

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn read_all(input: &dyn Input) -> Vec<Sample> {
    input
        .read(0..input.len())
        .unwrap()
        .map(|s| s.unwrap())
        .collect()
}

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn str_of(sample: &Sample, column: &str) -> String {
    match &sample[column] {
        Value::Str(s) => s.clone(),
        other => panic!("{column} is {other:?}"),
    }
}

const JPEG: &[u8] = b"\xFF\xD8\xFF\xE0fake jpeg";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\nfake png";

#[test]
fn files_are_sorted_by_relative_path_with_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "b.txt", b"B");
    write(dir.path(), "a/z.bin", b"AZ");
    write(dir.path(), "a.txt", b"A");
    write(dir.path(), "a/b/c", b"ABC");
    let input = open(dir.path(), InputFormat::Files, &InputOptions::default()).unwrap();
    assert_eq!(input.format(), InputFormat::Files);
    assert_eq!(input.columns()["path"], "str");
    assert_eq!(input.columns()["data"], "bytes");
    let samples = read_all(input.as_ref());
    let paths: Vec<String> = samples.iter().map(|s| str_of(s, "path")).collect();
    assert_eq!(paths, ["a.txt", "a/b/c", "a/z.bin", "b.txt"]);
    assert_eq!(samples[1]["data"], Value::Bytes(b"ABC".to_vec()));
}

#[test]
fn ranges_and_parts_partition_the_same_order() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..10 {
        write(dir.path(), &format!("f{i:02}"), &[i]);
    }
    let input = open(dir.path(), InputFormat::Auto, &InputOptions::default()).unwrap();
    let all = read_all(input.as_ref());
    let mut joined = Vec::new();
    for part in 0..3 {
        let range = part_range(input.len(), part, 3);
        joined.extend(input.read(range).unwrap().map(|s| s.unwrap()));
    }
    assert_eq!(all, joined);
    assert_eq!(input.read(8..100).unwrap().count(), 2);
    assert_eq!(input.read(20..30).unwrap().count(), 0);
}

#[cfg(unix)]
#[test]
fn symlinks_inside_are_followed_and_escaping_ones_refused() {
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "secret", b"s");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "real/x", b"x");
    std::os::unix::fs::symlink(dir.path().join("real/x"), dir.path().join("link")).unwrap();
    let input = open(dir.path(), InputFormat::Files, &InputOptions::default()).unwrap();
    let paths: Vec<String> = read_all(input.as_ref())
        .iter()
        .map(|s| str_of(s, "path"))
        .collect();
    assert_eq!(paths, ["link", "real/x"]);

    std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("escape")).unwrap();
    let err = open(dir.path(), InputFormat::Files, &InputOptions::default()).unwrap_err();
    assert!(
        matches!(err, FormatError::UnsafePath { ref name, .. } if name == "escape"),
        "{err}"
    );
    fs::remove_file(dir.path().join("escape")).unwrap();

    std::os::unix::fs::symlink(outside.path(), dir.path().join("dirlink")).unwrap();
    let err = open(dir.path(), InputFormat::Files, &InputOptions::default()).unwrap_err();
    assert!(matches!(err, FormatError::UnsafePath { .. }), "{err}");
}

#[test]
fn imagefolder_labels_follow_sorted_class_folders() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "dog/1.jpg", JPEG);
    write(dir.path(), "cat/b.JPEG", JPEG);
    write(dir.path(), "cat/sub/a.jpg", JPEG);
    write(dir.path(), "cat/z.jpg", JPEG);
    write(dir.path(), "cat/notes.txt", b"ignored");
    write(dir.path(), "bird/0.jpg", JPEG);
    let input = open(dir.path(), InputFormat::Auto, &InputOptions::default());
    // notes.txt makes auto-detection see a plain folder of files.
    assert_eq!(input.unwrap().format(), InputFormat::Files);
    let input = open(
        dir.path(),
        InputFormat::ImageFolder,
        &InputOptions::default(),
    )
    .unwrap();
    assert_eq!(input.columns()["image"], "jpeg");
    assert_eq!(input.columns()["label"], "int");
    let samples = read_all(input.as_ref());
    let got: Vec<(String, Value)> = samples
        .iter()
        .map(|s| (str_of(s, "path"), s["label"].clone()))
        .collect();
    // torchvision: classes bird=0, cat=1, dog=2; inside cat, files of `cat` before `cat/sub`.
    let want = [
        ("bird/0.jpg", 0),
        ("cat/b.JPEG", 1),
        ("cat/z.jpg", 1),
        ("cat/sub/a.jpg", 1),
        ("dog/1.jpg", 2),
    ];
    let want: Vec<(String, Value)> = want
        .iter()
        .map(|(p, l)| (p.to_string(), Value::Int(*l)))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        samples[0]["image"],
        Value::Image(ImageFormat::Jpeg, JPEG.to_vec())
    );
}

#[test]
fn imagefolder_encoding_depends_on_every_file() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a/1.png", PNG);
    write(dir.path(), "b/2.png", PNG);
    let input = open(dir.path(), InputFormat::Auto, &InputOptions::default()).unwrap();
    assert_eq!(input.format(), InputFormat::ImageFolder);
    assert_eq!(input.columns()["image"], "png");
    write(dir.path(), "b/3.jpg", JPEG);
    let input = open(
        dir.path(),
        InputFormat::ImageFolder,
        &InputOptions::default(),
    )
    .unwrap();
    assert_eq!(input.columns()["image"], "bytes");
    let samples = read_all(input.as_ref());
    assert_eq!(samples[2]["image"], Value::Bytes(JPEG.to_vec()));
}

#[test]
fn imagefolder_refuses_an_empty_class_like_torchvision() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a/1.png", PNG);
    write(dir.path(), "b/readme.md", b"no image");
    let err = open(
        dir.path(),
        InputFormat::ImageFolder,
        &InputOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("no valid file for the classes b"),
        "{err}"
    );
}

#[test]
fn explicit_columns_are_for_jsonl_only() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "x", b"x");
    let options = InputOptions {
        columns: Some(shardstream_sharding::input::parse_columns("data:bytes").unwrap()),
        ..InputOptions::default()
    };
    assert!(open(dir.path(), InputFormat::Files, &options).is_err());
}

/// The venv the project's Python tests use (torchvision, mosaicml-streaming, ...).
fn venv_python() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
}

#[test]
fn imagefolder_order_and_labels_equal_torchvisions() {
    let dir = tempfile::tempdir().unwrap();
    for rel in [
        "zebra/x.png",
        "Apple/1.PNG",
        "apple/b/2.png",
        "apple/a b/3.png",
        "apple/a/4.png",
        "apple/a/c/5.png",
        "apple/9.png",
        "apple/éclair.png",
        "apple/e.png",
        "apple/skip.txt",
        "mango/m.webp",
    ] {
        write(dir.path(), rel, PNG);
    }
    write(dir.path(), "top-level.png", PNG);
    let script = "import json, os, sys\n\
                  from torchvision.datasets.folder import find_classes, make_dataset, IMG_EXTENSIONS\n\
                  root = sys.argv[1]\n\
                  classes, idx = find_classes(root)\n\
                  items = make_dataset(root, idx, extensions=IMG_EXTENSIONS)\n\
                  print(json.dumps([[os.path.relpath(p, root), l] for p, l in items]))\n";
    let out = std::process::Command::new(venv_python())
        .args(["-c", script])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Vec<(String, i64)> = serde_json::from_slice(&out.stdout).unwrap();
    let input = open(
        dir.path(),
        InputFormat::ImageFolder,
        &InputOptions::default(),
    )
    .unwrap();
    assert_eq!(input.columns()["image"], "bytes"); // mango/m.webp is not a PNG
    let got: Vec<(String, i64)> = read_all(input.as_ref())
        .iter()
        .map(|s| match s["label"] {
            Value::Int(l) => (str_of(s, "path"), l),
            ref v => panic!("{v:?}"),
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), 10);
}
