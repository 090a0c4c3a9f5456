//! Decompression of a stored shard into the cache's decompressed temp file.
//!
//! zstd and gzip are decoded as a stream from the complete compressed file, and the output's
//! complete prefix is published as it grows, so samples are served before the shard is fully
//! decompressed. Other algorithms are decoded in memory. A framed zstd LitData chunk is turned
//! into the classic chunk layout (`shardstream_sharding::litdata::framed`), also as a stream:
//! its header and offset table first, then its frames inflated one after another.
//!
//! Memory: everything the decoder holds is charged to the budget first ([`decoder_bytes`]):
//! the input buffer, the copy buffer, and for zstd the window the frame header declares (the
//! decoder allocates a window of `min(window, content size)` plus two blocks; it refuses
//! windows above 2^27 bytes, its default limit). A window larger than `memory_limit` is an
//! error naming the shard, not an allocation outside the budget.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use shardstream_sharding::compression::Algorithm;

use super::budget::Budget;
use super::growing::Publisher;
use crate::error::{Result, StreamerError};

/// Largest zstd window the decoder accepts (its default `window_log_max` of 27).
const ZSTD_MAX_WINDOW: u64 = 1 << 27;
/// zstd's largest block; the streaming decoder keeps about two next to its window.
const ZSTD_BLOCK: u64 = 128 << 10;
/// What a gzip (deflate) decoder holds: its 32 KiB window and its state.
const GZIP_STATE: u64 = 64 << 10;
/// The input buffer of a decoder (smaller for a small file).
const INPUT_BUFFER: u64 = 1 << 20;
/// The buffer decoded bytes pass through on their way to the file.
const COPY_BUFFER: usize = 256 << 10;
/// Bytes a zstd frame header takes at most.
pub(crate) const HEADER_BYTES: u64 = 18;

/// The window a zstd frame header declares: `Window_Descriptor`, or the frame content size for
/// a single-segment frame. `None` when `head` is not the start of a zstd frame.
pub(crate) fn zstd_window(head: &[u8]) -> Option<u64> {
    if head.get(..4)? != [0x28, 0xB5, 0x2F, 0xFD] {
        return None;
    }
    let fhd = *head.get(4)?;
    let single = fhd & 0x20 != 0;
    if !single {
        let wd = *head.get(5)?;
        let base = 1u64 << (10 + u32::from(wd >> 3));
        return Some(base + (base / 8) * u64::from(wd & 7));
    }
    let did = [0usize, 1, 2, 4][usize::from(fhd & 3)];
    let at = 5 + did;
    let fcs = match fhd >> 6 {
        0 => u64::from(*head.get(at)?),
        1 => u64::from(u16::from_le_bytes([*head.get(at)?, *head.get(at + 1)?])) + 256,
        2 => u64::from(u32::from_le_bytes(head.get(at..at + 4)?.try_into().ok()?)),
        _ => u64::from_le_bytes(head.get(at..at + 8)?.try_into().ok()?),
    };
    Some(fcs)
}

/// Bytes of the budget a streamed decompression holds: input buffer, copy buffer, and the
/// decoder's own state (for zstd, its window as the frame header declares it).
pub(crate) fn decoder_bytes(algorithm: Algorithm, head: &[u8], stored: u64, raw: u64) -> u64 {
    let input = INPUT_BUFFER.min(stored.max(1));
    let state = match algorithm {
        Algorithm::Zstd => {
            let window = zstd_window(head)
                .unwrap_or(ZSTD_MAX_WINDOW)
                .min(ZSTD_MAX_WINDOW);
            window.min(raw) + 2 * ZSTD_BLOCK
        }
        _ => GZIP_STATE,
    };
    input + COPY_BUFFER as u64 + state
}

/// The first bytes of a stored file.
pub(crate) fn read_head(file: &File, path: &Path, size: u64) -> Result<Vec<u8>> {
    let n = HEADER_BYTES.min(size);
    let mut head = vec![0u8; n as usize];
    file.read_exact_at(&mut head, 0)
        .map_err(|source| StreamerError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        })?;
    Ok(head)
}

/// What to decompress and where.
pub(crate) struct Job<'a> {
    pub algorithm: Algorithm,
    /// The stored (compressed) bytes, read front to back.
    pub input: Box<dyn Read + Send + 'a>,
    /// Its first bytes ([`read_head`]).
    pub head: &'a [u8],
    pub stored_size: u64,
    pub dst: &'a Path,
    pub raw_size: u64,
    /// The stored file is a framed zstd LitData chunk, to turn into the classic layout.
    pub framed: bool,
    /// The shard, for messages.
    pub what: &'a str,
    /// Advanced as the output's prefix grows.
    pub progress: Option<&'a Publisher>,
}

/// Decompresses `job.input` into `job.dst`, producing exactly `raw_size` bytes.
pub(crate) fn decompress(job: Job<'_>, budget: &Budget) -> Result<()> {
    let Job {
        algorithm,
        input,
        head,
        stored_size,
        dst,
        raw_size,
        framed,
        what,
        progress,
    } = job;
    let corrupt = |reason: String| StreamerError::Corrupt {
        what: what.to_string(),
        reason,
    };
    let io = |op| {
        move |source| StreamerError::Io {
            op,
            path: dst.to_path_buf(),
            source,
        }
    };
    let mut out = File::options()
        .write(true)
        .truncate(true)
        .open(dst)
        .map_err(io("open"))?;
    let label = || format!("decompressing {what}");
    let written = match algorithm {
        Algorithm::Zstd if framed => {
            // The tables (at most the stored file) are held while the frames inflate.
            let charge = decoder_bytes(algorithm, &[], stored_size, raw_size) + stored_size;
            let _lease = budget.acquire_blocking(&label, charge)?;
            let mut reader =
                BufReader::with_capacity(INPUT_BUFFER.min(stored_size.max(1)) as usize, input);
            // Unbuffered writes (the header, then up to 64 KiB at a time): what is published
            // has reached the file.
            let mut publish = |written: u64| {
                if let Some(p) = progress {
                    p.advance(written.min(raw_size), written >= raw_size);
                }
            };
            shardstream_sharding::litdata::framed::to_classic(
                what,
                &mut reader,
                stored_size,
                raw_size,
                &mut out,
                &mut publish,
            )?
        }
        Algorithm::Zstd | Algorithm::Gzip => {
            let charge = decoder_bytes(algorithm, head, stored_size, raw_size);
            let _lease = budget.acquire_blocking(&label, charge)?;
            let reader =
                BufReader::with_capacity(INPUT_BUFFER.min(stored_size.max(1)) as usize, input);
            let decoder: Box<dyn Read> = match algorithm {
                Algorithm::Zstd => Box::new(
                    zstd::stream::read::Decoder::with_buffer(reader)
                        .map_err(|e| corrupt(format!("zstd: {e}")))?,
                ),
                _ => Box::new(flate2::bufread::MultiGzDecoder::new(reader)),
            };
            let mut limited = decoder.take(raw_size + 1);
            let mut buf = vec![0u8; COPY_BUFFER];
            let mut written = 0u64;
            loop {
                let n = match limited.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(stopped(e, &corrupt)),
                };
                out.write_all(buf.get(..n).unwrap_or_default())
                    .map_err(io("write"))?;
                written += n as u64;
                if let Some(p) = progress {
                    p.advance(written.min(raw_size), written >= raw_size);
                }
            }
            written
        }
        other => {
            let _lease = budget.acquire_blocking(&label, stored_size + raw_size)?;
            let mut data = Vec::new();
            let mut input = input;
            input
                .read_to_end(&mut data)
                .map_err(|e| stopped(e, &corrupt))?;
            let raw = shardstream_sharding::compression::decompress(other, &data, what, raw_size)?;
            out.write_all(&raw).map_err(io("write"))?;
            raw.len() as u64
        }
    };
    if written != raw_size {
        return Err(corrupt(format!(
            "decompresses to {written} bytes or more, the index records {raw_size}"
        )));
    }
    Ok(())
}

/// A read error of the decoder: the input is a complete local file, so it is damage.
fn stopped(e: std::io::Error, corrupt: &dyn Fn(String) -> StreamerError) -> StreamerError {
    corrupt(format!("decompress: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zstd_window_is_read_from_the_frame_header() {
        let data = vec![7u8; 300_000];
        // A one-shot compression records the content size in a single-segment frame.
        let one_shot = zstd::bulk::compress(&data, 3).unwrap();
        assert_eq!(zstd_window(&one_shot), Some(300_000));
        // A streamed one declares a window instead.
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
        enc.write_all(&data).unwrap();
        let streamed = enc.finish().unwrap();
        let w = zstd_window(&streamed).unwrap();
        assert!(w.is_power_of_two() || w.is_multiple_of(1024), "{w}");
        assert!((1 << 10..=ZSTD_MAX_WINDOW).contains(&w), "{w}");
        assert_eq!(zstd_window(b"not zstd at all"), None);
        // The charge never exceeds what the output can need, plus buffers.
        let charge = decoder_bytes(Algorithm::Zstd, &one_shot, one_shot.len() as u64, 300_000);
        assert!(charge <= 300_000 + 2 * ZSTD_BLOCK + COPY_BUFFER as u64 + one_shot.len() as u64);
    }
}
