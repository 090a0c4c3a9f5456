//! Fuzzes the MDS shard reader, every column decoder and every decompressor on arbitrary bytes:
//! errors are fine, panics and unbounded allocations are not.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use shardstream_sharding::compression::{decompress, Algorithm};
use shardstream_sharding::mds::{Columns, Encoding, ShardReader};

/// Column layouts the first input byte chooses between.
const LAYOUTS: &[&[(&str, &str)]] = &[
    &[("a", "bytes")],
    &[
        ("id", "int"),
        ("txt", "str"),
        ("arr", "ndarray:uint16"),
        ("f", "float32"),
    ],
    &[("img", "pil"), ("imgs", "list[pil]"), ("j", "jpeg_array")],
    &[
        ("n", "ndarray"),
        ("s", "ndarray:float64:2,3"),
        ("js", "json"),
    ],
    &[
        ("si", "str_int"),
        ("sf", "str_float"),
        ("sd", "str_decimal"),
        ("u", "uint64"),
    ],
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let layout = LAYOUTS[usize::from(selector) % LAYOUTS.len()];
    let spec: Vec<(String, String)> = layout
        .iter()
        .map(|(n, e)| (n.to_string(), e.to_string()))
        .collect();
    let columns = Arc::new(Columns::new(&spec).expect("fixed layouts are valid"));
    if let Ok(reader) = ShardReader::new("fuzz.mds", rest, columns, None) {
        for i in 0..reader.len() {
            let _ = reader.sample_columns(i);
            let _ = reader.decode_sample(i);
        }
        let _ = reader.sample_bytes(reader.len());
    }
    for name in Encoding::NAMES {
        if let Ok(encoding) = Encoding::parse(name) {
            let _ = encoding.decode(rest);
        }
    }
    let algorithm = Algorithm::ALL[usize::from(selector) % Algorithm::ALL.len()];
    if let Ok(out) = decompress(algorithm, rest, "fuzz", 1 << 20) {
        assert!(out.len() <= 1 << 20);
    }
});
