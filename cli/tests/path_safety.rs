//! Names taken from inputs (JSONL keys, tar members) never make `shard` write outside OUTPUT.

use crate::common;
use common::*;

#[test]
fn a_jsonl_key_with_dotdot_writes_nothing_outside_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"__key__\": \"../escape\", \"txt\": \"a\"}\n").unwrap();
    let out = dir.path().join("sub/out");
    let failed = run(&["shard", s(&input), s(&out), "--format", "wds"]).failed();
    assert!(failed.stderr.contains("../escape"), "{}", failed.stderr);
    // Only the input and the (empty) output folder exist.
    assert_eq!(listing(dir.path()), ["in.jsonl"]);
    // As MDS the key is only data: shards are named by the writer.
    run(&["shard", s(&input), s(&out)]).ok();
    assert!(listing(dir.path())
        .iter()
        .all(|f| f == "in.jsonl" || f.starts_with("sub/out/")));
    assert_eq!(cat_json(s(&out), &[])[0]["__key__"], "../escape");
}

#[test]
fn a_tar_member_with_dotdot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tars = dir.path().join("tars");
    std::fs::create_dir_all(&tars).unwrap();
    let script = "import io, sys, tarfile\n\
                  with tarfile.open(sys.argv[1], 'w') as t:\n    \
                      for name in ['ok.txt', '../evil.txt']:\n        \
                          data = b'x'\n        \
                          info = tarfile.TarInfo(name)\n        \
                          info.size = len(data)\n        \
                          t.addfile(info, io.BytesIO(data))\n";
    run_python(script, &[s(&tars.join("bad.tar"))]);
    let out = dir.path().join("out");
    let failed = run(&["shard", s(&tars), s(&out)]).failed();
    assert!(failed.stderr.contains("evil"), "{}", failed.stderr);
    assert_eq!(listing(dir.path()), ["tars/bad.tar"]);
    run(&["cat", s(&tars)]).failed();
}
