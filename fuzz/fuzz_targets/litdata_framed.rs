//! Fuzzes the framed zstd LitData chunk transform (`compression_level="batch"`): any bytes give
//! the classic layout or an error naming the chunk, never a panic, an overflow or an allocation
//! past the file and the inflation limit; what it writes is exactly the size the header announces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardstream_sharding::litdata::framed::{classic_size, to_classic, FramedPrefix};

const LIMIT: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let mut out = Vec::new();
    let mut published = 0u64;
    let result = to_classic(
        "fuzz/chunk-0-0.bin",
        &mut &data[..],
        len,
        LIMIT,
        &mut out,
        &mut |w| {
            assert!(w >= published);
            published = w;
        },
    );
    let Ok(written) = result else {
        assert!(out.len() as u64 <= LIMIT + (1 << 16) + 4 * (len + 1));
        return;
    };
    assert_eq!(written, out.len() as u64);
    assert_eq!(published, written);
    // The size a reader reserves from the header alone is what the transform wrote.
    let prefix = FramedPrefix::parse("fuzz", data).expect("a converted chunk has a prefix");
    let at = prefix.last_offset_at() as usize;
    let last = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"));
    let n = u64::from(prefix.num_items);
    assert_eq!(classic_size("fuzz", data, last, len, n).ok(), Some(written));
    // The classic layout: the count, then offsets rising from the header to the end.
    assert_eq!(out[..4], prefix.num_items.to_le_bytes());
    let offset = |i: usize| {
        u64::from(u32::from_le_bytes(
            out[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes"),
        ))
    };
    assert_eq!(offset(0), 4 + 4 * (n + 1));
    assert_eq!(offset(n as usize), written);
});
