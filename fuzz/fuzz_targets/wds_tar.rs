//! Fuzzes the WebDataset tar reader: any bytes, plain or compressed, must give samples or an
//! error, never a panic, and never an allocation larger than the input allows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardstream_sharding::wds::{base_plus_ext, WdsReadOptions, WdsReader};

fuzz_target!(|data: &[u8]| {
    for gunzip_members in [false, true] {
        let options = WdsReadOptions {
            max_member_size: 1 << 20,
            gunzip_members,
        };
        if let Ok(reader) = WdsReader::with_options(data, "fuzz.tar", options) {
            for sample in reader {
                if let Ok(sample) = sample {
                    let _ = sample.into_sample();
                }
            }
        }
    }
    if let Ok(name) = std::str::from_utf8(data) {
        let _ = base_plus_ext(name);
    }
});
