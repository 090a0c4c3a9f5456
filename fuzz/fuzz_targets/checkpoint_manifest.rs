//! Fuzzes the checkpoint manifest parser: any bytes give a manifest or an error, never a panic;
//! whatever parses re-serialises to an equal manifest and has in-bounds part ranges.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardstream_checkpoint::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::parse(data) {
        for f in &m.files {
            for i in 0..f.part_count() {
                if let Some(r) = f.part_range(i) {
                    assert!(r.start <= r.end && r.end <= f.size);
                }
            }
        }
        let json = m.to_json().expect("a parsed manifest serialises");
        assert_eq!(Manifest::parse(&json).expect("round trip"), m);
    }
});
