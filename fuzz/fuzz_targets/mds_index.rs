//! Fuzzes MDS `index.json` parsing: any bytes give an index or an error, never a panic, and an
//! accepted index survives a write/parse round trip in both serialisations.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardstream_sharding::mds::{merge_indexes, Index};

fuzz_target!(|data: &[u8]| {
    let Ok(index) = Index::from_json("index.json", data) else {
        return;
    };
    let again =
        Index::from_json("index.json", index.to_json().as_bytes()).expect("a written index parses");
    assert_eq!(again, index);
    let merged = merge_indexes(&[("0".to_string(), index.clone())]);
    let reparsed = Index::from_json("index.json", merged.to_merged_json().as_bytes())
        .expect("a merged index parses");
    assert_eq!(reparsed.shards.len(), index.shards.len());
    for shard in &index.shards {
        let _ = shard.encodings();
        let _ = shard.compression();
    }
});
