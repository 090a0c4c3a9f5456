//! Fuzzes LitData index and chunk decoding: the input is tried as an `index.json`, and as a chunk
//! file under fixed indexes covering every leaf serializer, loader and compression level.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardstream_sharding::litdata::{LitDataChunk, LitDataIndex, LitDataOptions};

const FORMATS: [&str; 15] = [
    "str",
    "int",
    "float",
    "bool",
    "bytes",
    "numpy",
    "no_header_numpy:9",
    "tensor",
    "no_header_tensor:16",
    "pil",
    "jpeg",
    "jpeg_array",
    "json",
    "file:txt",
    "pickle",
];

/// An index with one chunk of `items` items, leaves `formats` in a tuple.
fn index(formats: &[&str], loader: &str, compression: &str, level: &str, items: u32) -> String {
    let leaf = r#"{"type": null, "context": null, "children_spec": []}"#;
    let children = vec![leaf; formats.len()].join(", ");
    let spec = format!(
        r#"[1, {{"type": "builtins.tuple", "context": "null", "children_spec": [{children}]}}]"#
    );
    format!(
        r#"{{"chunks": [{{"chunk_bytes": null, "chunk_size": {items}, "dim": null, "filename": "chunk-0-0.bin"}}],
            "config": {{"compression": {compression}, "compression_level": {level},
                        "data_format": {formats}, "data_spec": {spec_json}, "item_loader": "{loader}",
                        "encryption": null}}}}"#,
        formats = format!(
            "[{}]",
            formats
                .iter()
                .map(|f| format!("\"{f}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        spec_json = quote(&spec),
    )
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fuzz_target!(|data: &[u8]| {
    let _ = LitDataIndex::parse("fuzz/index.json", data);
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    // The item count the index claims: taken from the chunk so that the header check passes and
    // the fuzzer reaches the item decoders (framed chunks keep it at offset 12).
    let count_at = |at: usize| {
        rest.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0)
    };
    let leaf = [FORMATS[selector as usize % FORMATS.len()]];
    let (formats, loader, compression, level, items): (&[&str], _, _, _, _) =
        match selector / 16 % 6 {
            0 => (&FORMATS, "PyTreeLoader", "null", "null", count_at(0)),
            1 => (&leaf, "PyTreeLoader", "null", "null", count_at(0)),
            2 => (
                &FORMATS,
                "PyTreeLoader",
                "\"zstd\"",
                "\"batch\"",
                count_at(12),
            ),
            3 => (&leaf, "PyTreeLoader", "\"zstd\"", "\"sample\"", count_at(0)),
            4 => (&leaf, "PyTreeLoader", "\"zstd:3\"", "null", 0),
            _ => (
                &["no_header_tensor:16"],
                "TokensLoader",
                "null",
                "null",
                count_at(0),
            ),
        };
    let json = index(formats, loader, compression, level, items);
    let Ok(index) = LitDataIndex::parse("fuzz/index.json", json.as_bytes()) else {
        return;
    };
    let options = LitDataOptions {
        allow_unsafe_types: selector & 1 == 1,
        max_inflated_size: 1 << 20,
    };
    if let Ok(chunk) = LitDataChunk::parse(&index, 0, rest.to_vec(), &options) {
        for sample in chunk.samples() {
            let _ = sample;
        }
    }
});
