//! Fuzzes LitData `index.json` parsing: any bytes give an index or an error, never a panic or
//! an overflow (chunk sizes and counts are untrusted until checked).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardstream_sharding::litdata::LitDataIndex;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = LitDataIndex::parse("index.json", data) {
        let total: u64 = index
            .chunks
            .iter()
            .map(|c| c.chunk_size)
            .fold(0, u64::saturating_add);
        assert_eq!(index.num_samples(), total);
        let _ = index.whole_file_zstd();
    }
});
