//! JSONL input: inference, explicit columns, errors naming `file:LINE`, ranges over checkpoints.

use std::fs;
use std::io::Write;

use shardstream_sharding::input::jsonl::CHECKPOINT_EVERY;
use shardstream_sharding::input::{open, parse_columns, part_range, InputFormat, InputOptions};
use shardstream_sharding::value::{DType, NdArray, Scalar, Value};
use shardstream_sharding::{FormatError, Sample};

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn options(columns: Option<&str>) -> InputOptions {
    InputOptions {
        columns: columns.map(|c| parse_columns(c).unwrap()),
        ..InputOptions::default()
    }
}

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn collect(path: &std::path::Path, columns: Option<&str>) -> Result<Vec<Sample>, FormatError> {
    let input = open(path, InputFormat::Auto, &options(columns))?;
    let samples = input.read(0..input.len())?.collect();
    samples
}

#[test]
fn infers_columns_from_the_first_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.jsonl");
    fs::write(
        &path,
        "{\"id\": 1, \"txt\": \"a\", \"score\": 0.5, \"ok\": true, \"meta\": {\"k\": [1]}}\n\
         \n\
         {\"id\": 2, \"txt\": \"b\", \"score\": 2, \"ok\": false, \"meta\": null}\r\n",
    )
    .unwrap();
    let input = open(&path, InputFormat::Auto, &InputOptions::default()).unwrap();
    assert_eq!(input.format(), InputFormat::Jsonl);
    let cols: Vec<(&str, &str)> = input
        .columns()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        cols,
        [
            ("id", "int"),
            ("meta", "json"),
            ("ok", "uint8"),
            ("score", "float64"),
            ("txt", "str")
        ]
    );
    assert_eq!(input.len(), 2);
    let samples: Vec<Sample> = input.read(0..2).unwrap().map(|s| s.unwrap()).collect();
    assert_eq!(samples[1]["id"], Value::Int(2));
    assert_eq!(samples[1]["txt"], Value::Str("b".into()));
    assert_eq!(
        samples[1]["score"],
        Value::Scalar(Scalar {
            dtype: DType::F64,
            bytes: 2f64.to_le_bytes().to_vec()
        })
    );
    assert_eq!(
        samples[0]["ok"],
        Value::Scalar(Scalar {
            dtype: DType::U8,
            bytes: vec![1]
        })
    );
    assert_eq!(samples[1]["meta"], Value::Json(serde_json::Value::Null));
}

#[test]
fn a_line_that_is_not_json_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    fs::write(
        &path,
        "{\"a\": 1}\n\n{\"a\": 2}\n{\"a\": oops}\n{\"a\": 4}\n",
    )
    .unwrap();
    let err = collect(&path, None).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, FormatError::InvalidInput { .. }), "{text}");
    assert!(text.contains("bad.jsonl:4"), "{text}");
    assert!(text.contains("not valid JSON"), "{text}");
}

#[test]
fn records_must_match_the_inferred_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.jsonl");
    fs::write(&path, "{\"a\": 1}\n{\"a\": 1.5}\n").unwrap();
    let err = collect(&path, None).unwrap_err().to_string();
    assert!(
        err.contains("d.jsonl:2") && err.contains("column \"a\""),
        "{err}"
    );
    fs::write(&path, "{\"a\": 1}\n{\"b\": 1}\n").unwrap();
    let err = collect(&path, None).unwrap_err().to_string();
    assert!(err.contains("d.jsonl:2") && err.contains("\"b\""), "{err}");
    fs::write(&path, "[1, 2]\n").unwrap();
    let err = collect(&path, None).unwrap_err().to_string();
    assert!(
        err.contains("d.jsonl:1") && err.contains("expected a JSON object"),
        "{err}"
    );
}

#[test]
fn explicit_columns_convert_and_select() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.jsonl");
    fs::write(
        &path,
        "{\"v\": [[1, 2], [3, 4]], \"n\": 7, \"skip\": \"me\"}\n",
    )
    .unwrap();
    let samples = collect(&path, Some("v:ndarray:int16:2,2,n:str_int")).unwrap();
    assert_eq!(samples[0].len(), 2);
    assert_eq!(samples[0]["n"], Value::StrInt("7".into()));
    assert_eq!(
        samples[0]["v"],
        Value::NdArray(NdArray {
            dtype: DType::I16,
            shape: vec![2, 2],
            data: [1i16, 2, 3, 4]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        })
    );
    let err = open(&path, InputFormat::Jsonl, &options(Some("v:jpeg"))).unwrap_err();
    assert!(matches!(err, FormatError::InvalidArgument(_)), "{err}");
    let err = collect(&path, Some("missing:int")).unwrap_err().to_string();
    assert!(
        err.contains("x.jsonl:1") && err.contains("missing key"),
        "{err}"
    );
}

#[test]
fn ranges_across_checkpoints_and_files_keep_the_order() {
    let dir = tempfile::tempdir().unwrap();
    let per_file = CHECKPOINT_EVERY * 2 + 37;
    let mut id = 0u64;
    for name in ["b.jsonl", "a.jsonl", "sub/c.ndjson", "ignored.txt"] {
        let path = dir.path().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut f = fs::File::create(path).unwrap();
        for i in 0..per_file {
            if i % 100 == 0 {
                writeln!(f).unwrap();
            }
            writeln!(f, "{{\"id\": {id}}}").unwrap();
            id += 1;
        }
    }
    let input = open(dir.path(), InputFormat::Auto, &InputOptions::default());
    // ignored.txt makes the folder a plain folder of files for auto-detection.
    assert_eq!(input.unwrap().format(), InputFormat::Files);
    let input = open(dir.path(), InputFormat::Jsonl, &InputOptions::default()).unwrap();
    assert_eq!(input.len(), per_file * 3);
    let ids = |r: std::ops::Range<u64>| -> Vec<i64> {
        input
            .read(r)
            .unwrap()
            .map(|s| match s.unwrap()["id"] {
                Value::Int(i) => i,
                ref v => panic!("{v:?}"),
            })
            .collect()
    };
    let pf = per_file as i64;
    // Files go in path order: a.jsonl (ids pf..2pf), b.jsonl (0..pf), sub/c.ndjson (2pf..3pf).
    let expected: Vec<i64> = (pf..2 * pf).chain(0..pf).chain(2 * pf..3 * pf).collect();
    assert_eq!(ids(0..input.len()), expected);
    for (start, end) in [
        (0, 1),
        (1023, 1025),
        (2000, 2200),
        (per_file - 1, per_file + 1),
        (3 * per_file - 5, 3 * per_file),
    ] {
        assert_eq!(
            ids(start..end),
            expected[start as usize..end as usize],
            "{start}..{end}"
        );
    }
    let mut joined = Vec::new();
    for part in 0..7 {
        joined.extend(ids(part_range(input.len(), part, 7)));
    }
    assert_eq!(joined, expected);
}

#[test]
fn an_empty_file_needs_explicit_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.jsonl");
    fs::write(&path, "\n\n").unwrap();
    assert!(open(&path, InputFormat::Jsonl, &InputOptions::default()).is_err());
    let input = open(&path, InputFormat::Jsonl, &options(Some("a:int"))).unwrap();
    assert_eq!(input.len(), 0);
}
