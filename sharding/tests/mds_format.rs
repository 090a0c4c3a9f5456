//! Exact bytes of the MDS format, against output captured from mosaicml-streaming 0.13
//! (`mds_encode`, `MDSWriter`) and the hexdump in research/streaming-anchors.md §2.3.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use serde_json::json;
use shardstream_sharding::mds::{Encoding, LocalDirSink, MdsWriter, MdsWriterOptions};
use shardstream_sharding::value::{DType, NdArray, PilImage, Sample, Scalar, Value};
use shardstream_sharding::{hashing::HashAlgorithm, mds::MdsDataset};

fn scalar(dtype: DType, bytes: &[u8]) -> Value {
    Value::Scalar(Scalar {
        dtype,
        bytes: bytes.to_vec(),
    })
}

fn nd(dtype: DType, shape: &[u64], data: Vec<u8>) -> Value {
    Value::NdArray(NdArray {
        dtype,
        shape: shape.to_vec(),
        data,
    })
}

fn pil(w: u32, h: u32, mode: &str, data: &[u8]) -> Value {
    Value::Pil(PilImage {
        width: w,
        height: h,
        mode: mode.into(),
        data: data.to_vec(),
    })
}

/// (encoding, value, hex of Mosaic's `mds_encode(encoding, python_value)`).
fn cases() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        ("bytes", Value::Bytes(vec![0, 255]), "00ff"),
        ("str", Value::Str("é😀".into()), "c3a9f09f9880"),
        ("int", Value::Int(-2), "feffffffffffffff"),
        ("uint8", scalar(DType::U8, &[200]), "c8"),
        ("uint16", scalar(DType::U16, &513u16.to_le_bytes()), "0102"),
        (
            "uint32",
            scalar(DType::U32, &u32::MAX.to_le_bytes()),
            "ffffffff",
        ),
        (
            "uint64",
            scalar(DType::U64, &((1u64 << 63) + 5).to_le_bytes()),
            "0500000000000080",
        ),
        ("int8", scalar(DType::I8, &(-3i8).to_le_bytes()), "fd"),
        (
            "int16",
            scalar(DType::I16, &(-300i16).to_le_bytes()),
            "d4fe",
        ),
        (
            "int32",
            scalar(DType::I32, &(-70000i32).to_le_bytes()),
            "90eefeff",
        ),
        (
            "int64",
            scalar(DType::I64, &(-(1i64 << 40)).to_le_bytes()),
            "0000000000ffffff",
        ),
        (
            "float16",
            scalar(DType::F16, &half::f16::from_f64(1.5).to_le_bytes()),
            "003e",
        ),
        (
            "float32",
            scalar(DType::F32, &(-0.1f32).to_le_bytes()),
            "cdccccbd",
        ),
        (
            "float64",
            scalar(DType::F64, &1e-5f64.to_le_bytes()),
            "f168e388b5f8e43e",
        ),
        (
            "str_int",
            Value::StrInt("100000000000000000000".into()),
            "313030303030303030303030303030303030303030",
        ),
        ("str_float", Value::StrFloat(1e16), "31652b3136"),
        ("str_float", Value::StrFloat(-0.0), "2d302e30"),
        ("str_float", Value::StrFloat(f64::NAN), "6e616e"),
        ("str_decimal", Value::StrDecimal("1E+2".into()), "31452b32"),
        (
            "pil",
            pil(2, 1, "RGB", &[0, 1, 2, 3, 4, 5]),
            "020000000100000003000000524742000102030405",
        ),
        (
            "jpeg_array",
            Value::List(vec![
                Value::Bytes(b"\xff\xd8a".to_vec()),
                Value::Bytes(b"\xff\xd8bc".to_vec()),
            ]),
            "020000000300000004000000ffd861ffd86263",
        ),
        (
            "list[pil]",
            Value::List(vec![pil(1, 2, "L", &[1, 2])]),
            "00000000010000000f0000000100000002000000010000004c0102",
        ),
        (
            "json",
            Value::Json(json!({"b": [1, 2.5, null], "a": "é"})),
            "7b2262223a205b312c20322e352c206e756c6c5d2c202261223a20225c7530306539227d",
        ),
        (
            "pkl",
            Value::Pickle(hex::decode("80049506000000000000005d944b01612e").unwrap()),
            "80049506000000000000005d944b01612e",
        ),
        (
            "ndarray",
            nd(
                DType::I32,
                &[1, 3],
                [1i32, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            "21080103010000000200000003000000",
        ),
        (
            "ndarray:float64",
            nd(DType::F64, &[1], 0.5f64.to_le_bytes().to_vec()),
            "0401000000000000e03f",
        ),
        (
            "ndarray:uint8:2,2",
            nd(DType::U8, &[2, 2], vec![1, 2, 3, 4]),
            "01020304",
        ),
        (
            "ndarray",
            nd(DType::U8, &[2, 1], vec![0, 1]),
            "080802010001",
        ),
    ]
}

#[test]
fn every_encoding_writes_mosaics_bytes_and_reads_them_back() {
    for (enc, value, want) in cases() {
        let encoding = Encoding::parse(enc).unwrap();
        let bytes = encoding.encode(&value).unwrap();
        assert_eq!(hex::encode(&bytes), want, "{enc} {value:?}");
        let back = encoding.decode(&bytes).unwrap();
        let expected = match (&encoding, value) {
            // Pre-encoded elements decode as the images they are.
            (Encoding::JpegArray, Value::List(items)) => Value::List(
                items
                    .into_iter()
                    .map(|v| match v {
                        Value::Bytes(b) => {
                            Value::Image(shardstream_sharding::value::ImageFormat::Jpeg, b)
                        }
                        other => other,
                    })
                    .collect(),
            ),
            (_, v) => v,
        };
        // NaN never equals itself; compare the canonical JSON instead.
        assert_eq!(
            back.to_canonical_json(),
            expected.to_canonical_json(),
            "{enc}"
        );
    }
}

#[test]
fn plain_values_encode_like_python_objects() {
    // Python ints and floats given to scalar columns, as numpy's constructors take them.
    let cases: Vec<(&str, Value, &str)> = vec![
        ("uint8", Value::Int(200), "c8"),
        ("int16", Value::Int(-300), "d4fe"),
        ("float32", Value::Float(-0.1), "cdccccbd"),
        ("float16", Value::Int(1), "003c"),
        ("int", Value::Bool(true), "0100000000000000"),
        ("str_int", Value::Int(-5), "2d35"),
        ("str_int", Value::StrInt("+007".into()), "37"),
        ("str_float", Value::Float(1e-5), "31652d3035"),
        (
            "str_decimal",
            Value::StrDecimal("0.0000001".into()),
            "31452d37",
        ),
        ("json", Value::Str("é".into()), "225c753030653922"),
        ("json", Value::Float(f64::INFINITY), "496e66696e697479"),
        (
            "json",
            nd(
                DType::F32,
                &[2],
                [0.5f32, 0.1].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            "5b302e352c20302e31303030303030303134393031313631325d",
        ),
    ];
    for (enc, value, want) in cases {
        let bytes = Encoding::parse(enc).unwrap().encode(&value).unwrap();
        assert_eq!(hex::encode(&bytes), want, "{enc} {value:?}");
    }
}

#[test]
fn refused_values_name_the_problem() {
    let refusals: Vec<(&str, Value, &str)> = vec![
        ("uint8", Value::Int(256), "out of range"),
        ("uint8", Value::Int(-1), "out of range"),
        ("int", Value::Float(1.0), "expected an int"),
        ("int", Value::Bytes(vec![1, 2, 3]), "fixed size of 8"),
        ("str", Value::Int(1), "expected a str"),
        ("str_float", Value::Int(1), "expected a float"),
        ("str_int", Value::StrInt("1.5".into()), "not an int"),
        (
            "str_decimal",
            Value::StrDecimal("abc".into()),
            "not a decimal",
        ),
        (
            "jpeg",
            Value::Image(shardstream_sharding::value::ImageFormat::Png, vec![1]),
            "expected a jpeg image",
        ),
        ("jpeg_array", Value::List(vec![]), "at least one image"),
        ("ndarray:uint8", nd(DType::I8, &[1], vec![1]), "wrong dtype"),
        (
            "ndarray:uint8:2",
            nd(DType::U8, &[3], vec![1, 2, 3]),
            "wrong shape",
        ),
        ("ndarray", nd(DType::U8, &[0], vec![]), "0 elements"),
        ("ndarray", nd(DType::U8, &[2], vec![1]), "needs 2"),
        ("json", Value::Pickle(vec![1]), "JSON-serialisable"),
    ];
    for (enc, value, needle) in refusals {
        let err = Encoding::parse(enc)
            .unwrap()
            .encode(&value)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{enc} {value:?}: {err}");
    }
}

fn research_sample(id: i64, txt: &str, shape: &[u64], arr: &[u16], f: f32) -> Sample {
    let mut s = Sample::new();
    s.insert("id".into(), Value::Int(id));
    s.insert("txt".into(), Value::Str(txt.into()));
    s.insert(
        "arr".into(),
        nd(
            DType::U16,
            shape,
            arr.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
    );
    s.insert("f".into(), scalar(DType::F32, &f.to_le_bytes()));
    s
}

const RESEARCH_SHARD: &str = "02000000ff0000001d0100003e0100007b22636f6c756d6e5f656e636f64696e6773223a205b226e6461727261793a75696e743136222c2022666c6f61743332222c2022696e74222c2022737472225d2c2022636f6c756d6e5f6e616d6573223a205b22617272222c202266222c20226964222c2022747874225d2c2022636f6c756d6e5f73697a6573223a205b6e756c6c2c20342c20382c206e756c6c5d2c2022636f6d7072657373696f6e223a206e756c6c2c2022666f726d6174223a20226d6473222c2022686173686573223a205b2273686131225d2c202273697a655f6c696d6974223a20313034383537362c202276657273696f6e223a20327d080000000200000004030000010002000000c03f070000000000000068690b0000000200000008020201000100010001000000803effffffffffffffffc3a9";

const RESEARCH_INDEX: &str = r#"{"shards": [{"column_encodings": ["ndarray:uint16", "float32", "int", "str"], "column_names": ["arr", "f", "id", "txt"], "column_sizes": [null, 4, 8, null], "compression": null, "format": "mds", "hashes": ["sha1"], "raw_data": {"basename": "shard.00000.mds", "bytes": 318, "hashes": {"sha1": "5c458a3e868d7dd9b167b911732e940fde795dc9"}}, "samples": 2, "size_limit": 1048576, "version": 2, "zip_data": null}], "version": 2}"#;

#[test]
fn writer_reproduces_the_research_hexdump() {
    let dir = tempfile::tempdir().unwrap();
    let columns: Vec<(String, String)> = [
        ("id", "int"),
        ("txt", "str"),
        ("arr", "ndarray:uint16"),
        ("f", "float32"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    let options = MdsWriterOptions {
        hashes: vec![HashAlgorithm::Sha1],
        size_limit: Some(1 << 20),
        threads: 0,
        ..Default::default()
    };
    let mut w = MdsWriter::new(
        &columns,
        options,
        Arc::new(LocalDirSink::new(dir.path()).unwrap()),
    )
    .unwrap();
    let samples = [
        research_sample(7, "hi", &[3], &[0, 1, 2], 1.5),
        research_sample(-1, "é", &[2, 2], &[1, 1, 1, 1], 0.25),
    ];
    for s in &samples {
        w.write(s).unwrap();
    }
    w.finish().unwrap();
    let shard = std::fs::read(dir.path().join("shard.00000.mds")).unwrap();
    assert_eq!(hex::encode(&shard), RESEARCH_SHARD);
    let index = std::fs::read_to_string(dir.path().join("index.json")).unwrap();
    assert_eq!(index, RESEARCH_INDEX);
    let read: Vec<Sample> = MdsDataset::open(dir.path(), Default::default())
        .unwrap()
        .iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(read, samples);
}

#[test]
fn empty_shard_quirk_matches_mosaic() {
    // MDSWriter(columns={'x': 'bytes'}, size_limit=300) given 1000, 10 and 1000 bytes.
    let want = r#"{"shards": [{"column_encodings": ["bytes"], "column_names": ["x"], "column_sizes": [null], "compression": null, "format": "mds", "hashes": [], "raw_data": {"basename": "shard.00000.mds", "bytes": 171, "hashes": {}}, "samples": 0, "size_limit": 300, "version": 2, "zip_data": null}, {"column_encodings": ["bytes"], "column_names": ["x"], "column_sizes": [null], "compression": null, "format": "mds", "hashes": [], "raw_data": {"basename": "shard.00001.mds", "bytes": 1179, "hashes": {}}, "samples": 1, "size_limit": 300, "version": 2, "zip_data": null}, {"column_encodings": ["bytes"], "column_names": ["x"], "column_sizes": [null], "compression": null, "format": "mds", "hashes": [], "raw_data": {"basename": "shard.00002.mds", "bytes": 189, "hashes": {}}, "samples": 1, "size_limit": 300, "version": 2, "zip_data": null}, {"column_encodings": ["bytes"], "column_names": ["x"], "column_sizes": [null], "compression": null, "format": "mds", "hashes": [], "raw_data": {"basename": "shard.00003.mds", "bytes": 1179, "hashes": {}}, "samples": 1, "size_limit": 300, "version": 2, "zip_data": null}], "version": 2}"#;
    let dir = tempfile::tempdir().unwrap();
    let options = MdsWriterOptions {
        size_limit: Some(300),
        threads: 3,
        ..Default::default()
    };
    let sink = Arc::new(LocalDirSink::new(dir.path()).unwrap());
    let mut w = MdsWriter::new(&[("x".into(), "bytes".into())], options, sink).unwrap();
    for (byte, n) in [(b'a', 1000), (b'b', 10), (b'c', 1000)] {
        let mut s = Sample::new();
        s.insert("x".into(), Value::Bytes(vec![byte; n]));
        w.write(&s).unwrap();
    }
    let index = w.finish().unwrap();
    assert_eq!(index.to_json(), want);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("index.json")).unwrap(),
        want
    );
    let ds = MdsDataset::open(dir.path(), Default::default()).unwrap();
    ds.verify().unwrap();
    assert_eq!(ds.iter().count(), 3);
}
