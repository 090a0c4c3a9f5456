//! Property tests: every encoding round-trips arbitrary values, and the writer's shard boundaries
//! follow a naive model of Mosaic's closing rule while every sample reads back unchanged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use serde_json::Value as Json;
use shardstream_sharding::compression::Compression;
use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::mds::{
    decode_stored_shard, Columns, Encoding, Index, MdsWriter, MdsWriterOptions, ShardReader,
    ShardSink,
};
use shardstream_sharding::value::{DType, NdArray, PilImage, Sample, Scalar, Value};

const ND_DTYPES: [DType; 11] = [
    DType::U8,
    DType::I8,
    DType::U16,
    DType::I16,
    DType::F16,
    DType::U32,
    DType::I32,
    DType::F32,
    DType::U64,
    DType::I64,
    DType::F64,
];

fn round_trip(enc: &str, value: &Value) -> Value {
    let e = Encoding::parse(enc).unwrap();
    let bytes = e.encode(value).unwrap();
    if let Some(size) = e.fixed_size() {
        assert_eq!(bytes.len() as u64, size);
    }
    e.decode(&bytes).unwrap()
}

fn ndarray() -> impl Strategy<Value = NdArray> {
    (
        0..ND_DTYPES.len(),
        prop::collection::vec(1u64..5, 1..4),
        any::<u64>(),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(d, mut shape, seed, wide)| {
            if wide {
                shape.push(300);
            }
            let dtype = ND_DTYPES[d];
            let n = shape.iter().product::<u64>() as usize * dtype.size();
            let mut x = seed | 1;
            let data = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            NdArray { dtype, shape, data }
        })
}

fn json_value() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(Json::from),
        any::<u64>().prop_map(Json::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Json::from),
        ".*".prop_map(Json::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
            prop::collection::vec((".*", inner), 0..6)
                .prop_map(|kv| Json::Object(kv.into_iter().collect())),
        ]
    })
}

fn pil() -> impl Strategy<Value = PilImage> {
    (
        0u32..20,
        0u32..20,
        "[A-Z;0-9]{1,6}",
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(width, height, mode, data)| PilImage {
            width,
            height,
            mode,
            data,
        })
}

proptest! {
    #[test]
    fn variable_and_scalar_encodings_round_trip(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        text in ".*",
        int in any::<i64>(),
        d in 0..ND_DTYPES.len(),
        raw in prop::collection::vec(any::<u8>(), 8),
    ) {
        prop_assert_eq!(round_trip("bytes", &Value::Bytes(bytes.clone())), Value::Bytes(bytes.clone()));
        prop_assert_eq!(round_trip("str", &Value::Str(text.clone())), Value::Str(text.clone()));
        prop_assert_eq!(round_trip("pkl", &Value::Pickle(bytes.clone())), Value::Pickle(bytes.clone()));
        prop_assert_eq!(round_trip("int", &Value::Int(int)), Value::Int(int));
        prop_assert_eq!(round_trip("str_int", &Value::Int(int)), Value::StrInt(int.to_string()));
        let dtype = ND_DTYPES[d];
        let scalar = Value::Scalar(Scalar { dtype, bytes: raw[..dtype.size()].to_vec() });
        prop_assert_eq!(round_trip(dtype.name(), &scalar), scalar.clone());
        // Any encoding takes pre-encoded bytes of its size.
        prop_assert_eq!(round_trip(dtype.name(), &Value::Bytes(raw[..dtype.size()].to_vec())), scalar);
    }

    #[test]
    fn str_float_keeps_every_double(bits in any::<u64>()) {
        let f = f64::from_bits(bits);
        match round_trip("str_float", &Value::Float(f)) {
            Value::StrFloat(g) if f.is_nan() => prop_assert!(g.is_nan()),
            Value::StrFloat(g) => prop_assert_eq!(g.to_bits(), f.to_bits()),
            other => prop_assert!(false, "decoded {:?}", other),
        }
    }

    #[test]
    fn str_decimal_normalises_once(
        sign in prop::sample::select(vec!["", "-", "+"]),
        int in "[0-9]{0,12}",
        frac in prop::option::of("[0-9]{0,8}"),
        exp in prop::option::of(-40i32..40),
    ) {
        let mut text = format!("{sign}{int}");
        if let Some(f) = &frac {
            text.push('.');
            text.push_str(f);
        }
        prop_assume!(!int.is_empty() || frac.as_deref().is_some_and(|f| !f.is_empty()));
        if let Some(e) = exp {
            text.push_str(&format!("e{e}"));
        }
        let Value::StrDecimal(normal) = round_trip("str_decimal", &Value::StrDecimal(text.clone())) else {
            panic!("not a decimal");
        };
        prop_assert_eq!(round_trip("str_decimal", &Value::StrDecimal(normal.clone())), Value::StrDecimal(normal));
    }

    #[test]
    fn image_encodings_round_trip(
        images in prop::collection::vec(pil(), 0..4),
        files in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..4),
    ) {
        for p in &images {
            prop_assert_eq!(round_trip("pil", &Value::Pil(p.clone())), Value::Pil(p.clone()));
        }
        let list = Value::List(images.into_iter().map(Value::Pil).collect());
        prop_assert_eq!(round_trip("list[pil]", &list), list);
        use shardstream_sharding::value::ImageFormat::{Jpeg, Png};
        for (enc, fmt) in [("jpeg_array", Jpeg), ("list[jpeg]", Jpeg), ("list[png]", Png)] {
            let list = Value::List(files.iter().map(|f| Value::Image(fmt, f.clone())).collect());
            prop_assert_eq!(round_trip(enc, &list), list);
        }
    }

    #[test]
    fn json_round_trips(value in json_value()) {
        prop_assert_eq!(round_trip("json", &Value::Json(value.clone())), Value::Json(value));
    }

    #[test]
    fn ndarray_round_trips_in_every_form(a in ndarray()) {
        let dims: Vec<String> = a.shape.iter().map(u64::to_string).collect();
        let v = Value::NdArray(a.clone());
        for enc in [
            "ndarray".to_string(),
            format!("ndarray:{}", a.dtype.name()),
            format!("ndarray:{}:{}", a.dtype.name(), dims.join(",")),
        ] {
            prop_assert_eq!(round_trip(&enc, &v), v.clone(), "{}", enc);
        }
    }
}

/// Keeps every file in memory.
#[derive(Default)]
struct MemSink(Mutex<BTreeMap<String, Vec<u8>>>);

impl ShardSink for MemSink {
    fn put(&self, name: &str, data: Vec<u8>) -> shardstream_sharding::Result<()> {
        self.0.lock().unwrap().insert(name.to_string(), data);
        Ok(())
    }
}

/// Mosaic's `Writer.write` closing rule, naively: sample counts per shard.
fn model(config_len: u64, limit: Option<u64>, sizes: &[u64]) -> Vec<u64> {
    let extra = 8 + config_len;
    let mut shards = Vec::new();
    let (mut count, mut size) = (0u64, extra);
    for &len in sizes {
        if limit.is_some_and(|l| l < size + len + 4) {
            shards.push(count);
            (count, size) = (0, extra);
        }
        count += 1;
        size += len + 4;
    }
    if count > 0 {
        shards.push(count);
    }
    shards
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn writer_follows_mosaics_closing_rule(
        lens in prop::collection::vec(0usize..700, 0..60),
        limit in prop::option::of(150u64..3000),
        threads in 0usize..3,
        compression in prop::sample::select(vec![None, Some("zstd"), Some("snappy"), Some("gz:1")]),
    ) {
        let columns = [("k".to_string(), "int".to_string()), ("v".to_string(), "bytes".to_string())];
        let sink = Arc::new(MemSink::default());
        let options = MdsWriterOptions {
            compression: compression.map(|c| Compression::parse(c).unwrap()),
            hashes: vec![HashAlgorithm::Xxh3_64],
            size_limit: limit,
            threads,
        };
        let mut w = MdsWriter::new(&columns, options, sink.clone()).unwrap();
        let config_len = w.config_json().len() as u64;
        let samples: Vec<Sample> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut s = Sample::new();
                s.insert("k".into(), Value::Int(i as i64));
                s.insert("v".into(), Value::Bytes(vec![i as u8; n]));
                s
            })
            .collect();
        let mut encoded_sizes = Vec::new();
        for s in &samples {
            let mut buf = Vec::new();
            w.columns().encode_sample(s, &mut buf).unwrap();
            encoded_sizes.push(buf.len() as u64);
            w.write(s).unwrap();
        }
        let index = w.finish().unwrap();
        let counts: Vec<u64> = index.shards.iter().map(|s| s.samples).collect();
        prop_assert_eq!(counts, model(config_len, limit, &encoded_sizes));

        let files = sink.0.lock().unwrap();
        let parsed = Index::from_json("index.json", &files["index.json"]).unwrap();
        prop_assert_eq!(&parsed, &index);
        let text = index.to_json();
        prop_assert_eq!(files["index.json"].as_slice(), text.as_bytes());
        let columns = Arc::new(Columns::new(&columns).unwrap());
        let mut read = Vec::new();
        for (i, shard) in parsed.shards.iter().enumerate() {
            prop_assert_eq!(shard.raw_data.basename.clone(), format!("shard.{i:05}.mds"));
            let stored = shard.stored_file();
            let raw = decode_stored_shard(&stored.basename, shard, files[&stored.basename].clone(), shard.zip_data.is_some(), true).unwrap();
            let reader = ShardReader::new(&stored.basename, raw, Arc::clone(&columns), Some(shard.samples)).unwrap();
            for s in reader.iter() {
                read.push(s.unwrap());
            }
        }
        prop_assert_eq!(read, samples);
    }
}

proptest! {
    /// `Columns::split_ranges` (the streamer's per-sample split) finds each column's encoded
    /// bytes in a sample of fixed and variable columns in any (sorted-name) order, and refuses
    /// a sample that is cut short or has bytes left over, naming the file and the sample.
    #[test]
    fn split_ranges_finds_every_column_and_refuses_wrong_lengths(
        names in Just(vec!["a", "b", "c", "d"]).prop_shuffle(),
        blob in prop::collection::vec(any::<u8>(), 0..300),
        text in ".{0,40}",
        int in any::<i64>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
        extra in 1usize..5,
    ) {
        let kinds = [
            ("bytes", Value::Bytes(blob)),
            ("str", Value::Str(text)),
            ("int", Value::Int(int)),
            ("uint8", Value::Bytes(vec![byte])),
        ];
        let spec: Vec<(String, String)> =
            names.iter().zip(&kinds).map(|(n, (enc, _))| (n.to_string(), enc.to_string())).collect();
        let columns = Columns::new(&spec).unwrap();
        let values: BTreeMap<String, Value> =
            names.iter().zip(&kinds).map(|(n, (_, v))| (n.to_string(), v.clone())).collect();
        let sample: Sample = values.clone().into_iter().collect();
        let mut body = Vec::new();
        columns.encode_sample(&sample, &mut body).unwrap();

        let ranges = columns.split_ranges("x.mds", 7, &body).unwrap();
        prop_assert_eq!(ranges.len(), spec.len());
        for ((name, enc), r) in columns.names().iter().zip(columns.encodings()).zip(&ranges) {
            let want = enc.encode(&values[name]).unwrap();
            prop_assert_eq!(&body[r.clone()], &want[..], "column {}", name);
        }
        let split = columns.split_sample("x.mds", 7, &body).unwrap();
        prop_assert_eq!(split, ranges.iter().map(|r| &body[r.clone()]).collect::<Vec<_>>());

        let short = cut.index(body.len());
        let err = columns.split_ranges("x.mds", 7, &body[..short]).unwrap_err().to_string();
        prop_assert!(err.contains("x.mds") && err.contains("sample 7"), "{}", err);
        let mut long = body.clone();
        long.extend(std::iter::repeat_n(0u8, extra));
        let err = columns.split_ranges("x.mds", 7, &long).unwrap_err().to_string();
        prop_assert!(err.contains(&format!("{extra} bytes left after the last column")), "{}", err);
    }
}

#[test]
fn a_cut_size_header_names_the_column_whose_size_is_missing() {
    let spec =
        [("a", "int"), ("b", "bytes"), ("c", "str")].map(|(n, e)| (n.to_string(), e.to_string()));
    let columns = Columns::new(&spec).unwrap();
    // Two variable columns: an 8-byte header of sizes; 5 bytes hold only "b"'s.
    let err = columns
        .split_ranges("y.mds", 3, &[0; 5])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("y.mds")
            && err.contains("sample 3")
            && err.contains("size of column \"c\" is cut off"),
        "{err}"
    );
    let err = columns
        .split_ranges("y.mds", 3, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("size of column \"b\" is cut off"), "{err}");
}
