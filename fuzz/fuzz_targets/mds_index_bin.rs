//! Fuzzes `index.ssx` (the binary MDS index): any bytes give an index, a view, or an error
//! naming the file, never a panic, an overflow or an allocation the bytes did not pay for
//! (every count and size in the header is untrusted). Where both readers accept, they agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardstream_sharding::mds::index_bin::{from_bytes, IndexView};

fuzz_target!(|data: &[u8]| {
    let index = from_bytes("index.ssx", data);
    let view = IndexView::parse("index.ssx", data.to_vec());
    if let (Ok(index), Ok(view)) = (&index, &view) {
        assert_eq!(index.shards.len(), view.len());
        assert_eq!(index.num_samples(), view.num_samples());
        for (i, s) in index.shards.iter().enumerate() {
            let r = view.shard(i).expect("a checked view has every shard");
            assert_eq!(r.raw, (s.raw_data.basename.as_str(), s.raw_data.bytes));
        }
    }
});
