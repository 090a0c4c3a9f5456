//! Framed zstd LitData chunks (`compression="zstd"`, `compression_level="batch"`, litdata's
//! default for zstd) turned into the classic chunk layout: the one place that reads them, for
//! the CLI ([`super::LitDataChunk`]) and the streamer's decompression into its cache.
//!
//! Framed layout (`litdata/streaming/framed_zstd.py`): `"LDFZ01\0\0" | u16 version | u16 flags |
//! u32 n | u32 frame_rows | u32 n_frames | u32 offsets[n+1]` (relative to the inflated,
//! concatenated item bytes) `| n_frames × {u32 first_item, u32 n_items, u64 compressed_off,
//! u32 compressed_len, u32 uncompressed_len} |` zstd frames.
//!
//! Classic layout it becomes: `u32 n | u32 offsets[n+1]` (absolute: `4 + 4(n+1)` plus the
//! relative offset) `|` the frames inflated in order. Its size, `4 + 4(n+1) + offsets[n]`, is
//! known from the prefix and the last offset alone ([`FramedPrefix::classic_size`]), so a reader
//! that must reserve room first reads those few bytes.
//!
//! Every number in the header is untrusted: the tables must lie inside the file (checked before
//! they are allocated), the offsets must rise, the frames must cover the items in order, lie
//! inside the file one after another, and each inflate to exactly the bytes its items' offsets
//! span (the decoder is read through a bounded `take`). Errors name the chunk.
//!
//! ```
//! use shardstream_sharding::litdata::framed::{to_classic, FRAMED_MAGIC};
//! let mut chunk = FRAMED_MAGIC.to_vec();
//! let frame = zstd::encode_all(&b"abc"[..], 3).unwrap();
//! for w in [1u16, 0] { chunk.extend_from_slice(&w.to_le_bytes()); }
//! for w in [1u32, 256, 1, 0, 3, 0, 1] { chunk.extend_from_slice(&w.to_le_bytes()); }
//! let data_at = chunk.len() as u64 + 16;
//! chunk.extend_from_slice(&data_at.to_le_bytes());
//! for w in [frame.len() as u32, 3] { chunk.extend_from_slice(&w.to_le_bytes()); }
//! chunk.extend_from_slice(&frame);
//! let mut classic = Vec::new();
//! let len = chunk.len() as u64;
//! to_classic("c.bin", &mut &chunk[..], len, 1 << 20, &mut classic, &mut |_| {}).unwrap();
//! assert_eq!(classic, [&1u32.to_le_bytes()[..], &12u32.to_le_bytes(), &15u32.to_le_bytes(), b"abc"].concat());
//! ```

use std::io::{self, BufReader, Read, Write};

use crate::error::{FormatError, Result};

/// The first bytes of a framed chunk.
pub const FRAMED_MAGIC: &[u8; 8] = b"LDFZ01\0\0";
/// Bytes of the fixed prefix: magic, version, flags, item count, frame rows, frame count.
pub const PREFIX_BYTES: u64 = 24;
/// Bytes of one frame table entry.
const FRAME_ENTRY: u64 = 24;
/// The buffer inflated bytes pass through.
const COPY_BUFFER: usize = 64 << 10;

/// Whether `head` starts with the framed magic.
pub fn is_framed(head: &[u8]) -> bool {
    head.starts_with(FRAMED_MAGIC)
}

/// The fixed prefix of a framed chunk, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramedPrefix {
    /// Items in the chunk (`n`).
    pub num_items: u32,
    /// Items per frame the writer used (`K`).
    pub frame_rows: u32,
    /// Frames in the chunk.
    pub n_frames: u32,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

impl FramedPrefix {
    /// Parses the first [`PREFIX_BYTES`] of chunk `path`.
    pub fn parse(path: &str, head: &[u8]) -> Result<FramedPrefix> {
        if !is_framed(head) {
            return Err(FormatError::corrupt(path, "no framed zstd magic (LDFZ01)"));
        }
        let (Some(vf), Some(n), Some(k), Some(n_frames)) = (
            u32_at(head, 8),
            u32_at(head, 12),
            u32_at(head, 16),
            u32_at(head, 20),
        ) else {
            return Err(FormatError::corrupt(
                path,
                format!("framed zstd header truncated at {} bytes", head.len()),
            ));
        };
        let version = vf & 0xffff;
        if version != 1 {
            return Err(FormatError::Unsupported {
                path: path.to_string(),
                what: format!("framed zstd chunk version {version}"),
            });
        }
        if n == 0 || k == 0 || n_frames == 0 || n_frames > n {
            return Err(FormatError::corrupt(
                path,
                format!("invalid framed zstd header: {n} items, {n_frames} frames of {k} rows"),
            ));
        }
        Ok(FramedPrefix {
            num_items: n,
            frame_rows: k,
            n_frames,
        })
    }

    /// Where the last relative offset (`offsets[n]`, the inflated item bytes) is in the file.
    pub fn last_offset_at(&self) -> u64 {
        PREFIX_BYTES + 4 * u64::from(self.num_items)
    }

    /// Where the frame table ends (and the frames may start).
    pub fn tables_end(&self) -> u64 {
        PREFIX_BYTES + 4 * (u64::from(self.num_items) + 1) + FRAME_ENTRY * u64::from(self.n_frames)
    }

    /// Bytes of the classic header (`u32 n | u32 offsets[n+1]`).
    pub fn classic_header(&self) -> u64 {
        4 + 4 * (u64::from(self.num_items) + 1)
    }

    /// The classic layout's size for `items_bytes` inflated item bytes (`offsets[n]`); an error
    /// when its absolute offsets would not fit the classic u32 offsets.
    pub fn classic_size(&self, path: &str, items_bytes: u32) -> Result<u64> {
        let size = self.classic_header() + u64::from(items_bytes);
        if size > u64::from(u32::MAX) {
            return Err(FormatError::corrupt(
                path,
                format!(
                    "{items_bytes} inflated item bytes do not fit a classic chunk's u32 offsets"
                ),
            ));
        }
        Ok(size)
    }
}

/// One entry of the frame table.
#[derive(Debug, Clone, Copy)]
struct Frame {
    compressed_off: u64,
    compressed_len: u64,
    uncompressed_len: u64,
}

/// The checked tables of a framed chunk of `file_len` bytes: the relative offsets and frames.
struct Tables {
    offsets: Vec<u32>,
    frames: Vec<Frame>,
}

fn read_tables(
    path: &str,
    prefix: &FramedPrefix,
    input: &mut dyn Read,
    file_len: u64,
    max_inflated: u64,
) -> Result<Tables> {
    let corrupt = |reason: String| FormatError::corrupt(path, reason);
    let end = prefix.tables_end();
    if end > file_len {
        return Err(corrupt(format!(
            "framed zstd tables of {} items and {} frames end at byte {end}, past the file's {file_len}",
            prefix.num_items, prefix.n_frames
        )));
    }
    // Bounded by the file's own length, checked just above.
    let mut raw = vec![0u8; (end - PREFIX_BYTES) as usize];
    input
        .read_exact(&mut raw)
        .map_err(|e| read_error(path, e))?;
    let n = prefix.num_items as usize;
    let offsets: Vec<u32> = (0..=n).map(|i| u32_at(&raw, 4 * i).unwrap_or(0)).collect();
    if offsets.first() != Some(&0) {
        return Err(corrupt("framed zstd offsets do not start at 0".into()));
    }
    if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
        return Err(corrupt(format!(
            "framed zstd offset of item {} goes down",
            i + 1
        )));
    }
    let items_bytes = offsets.last().copied().unwrap_or(0);
    prefix.classic_size(path, items_bytes)?;
    if u64::from(items_bytes) > max_inflated {
        return Err(corrupt(format!(
            "{items_bytes} inflated item bytes exceed the limit of {max_inflated}"
        )));
    }
    let mut frames = Vec::with_capacity(prefix.n_frames as usize);
    let (mut next_item, mut pos) = (0u64, end);
    for f in 0..prefix.n_frames as usize {
        let at = 4 * (n + 1) + FRAME_ENTRY as usize * f;
        let field = |o: usize| u64::from(u32_at(&raw, at + o).unwrap_or(0));
        let (first, count) = (field(0), field(4));
        let coff = u64_at(&raw, at + 8).unwrap_or(0);
        let (clen, ulen) = (field(16), field(20));
        let last = first + count;
        if count == 0 || first != next_item || last > u64::from(prefix.num_items) {
            return Err(corrupt(format!(
                "framed zstd frame {f} holds items {first}..{last}, expected {next_item}.. up to {}",
                prefix.num_items
            )));
        }
        let within = coff >= pos && coff.checked_add(clen).is_some_and(|e| e <= file_len);
        if !within {
            return Err(corrupt(format!(
                "framed zstd frame {f} at bytes {coff}+{clen} is outside {pos}..{file_len}"
            )));
        }
        let span = u64::from(offsets[last as usize] - offsets[first as usize]);
        if span != ulen {
            return Err(corrupt(format!(
                "framed zstd frame {f} declares {ulen} inflated bytes, its items span {span}"
            )));
        }
        frames.push(Frame {
            compressed_off: coff,
            compressed_len: clen,
            uncompressed_len: ulen,
        });
        next_item = last;
        pos = coff + clen;
    }
    if next_item != u64::from(prefix.num_items) {
        return Err(corrupt(format!(
            "framed zstd frames cover {next_item} of {} items",
            prefix.num_items
        )));
    }
    Ok(Tables { offsets, frames })
}

fn read_error(path: &str, e: io::Error) -> FormatError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        return FormatError::corrupt(path, "framed zstd chunk ends early");
    }
    FormatError::Io {
        path: path.to_string(),
        source: e,
    }
}

fn write_error(path: &str, e: io::Error) -> FormatError {
    FormatError::Io {
        path: format!("{path} (writing its inflated copy)"),
        source: e,
    }
}

/// Reads the framed chunk `path` of `file_len` bytes from `input` (front to back, from its first
/// byte) and writes its classic layout to `out`; returns the bytes written. `progress` is told
/// the bytes written so far after each write. At most `max_inflated` item bytes are accepted.
pub fn to_classic(
    path: &str,
    input: &mut dyn Read,
    file_len: u64,
    max_inflated: u64,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<u64> {
    let mut head = [0u8; PREFIX_BYTES as usize];
    if file_len < PREFIX_BYTES {
        return Err(FormatError::corrupt(
            path,
            format!("framed zstd header truncated at {file_len} bytes"),
        ));
    }
    input
        .read_exact(&mut head)
        .map_err(|e| read_error(path, e))?;
    let prefix = FramedPrefix::parse(path, &head)?;
    let tables = read_tables(path, &prefix, input, file_len, max_inflated)?;

    let base = prefix.classic_header() as u32; // classic_size checked it fits
    let mut header = Vec::with_capacity(prefix.classic_header() as usize);
    header.extend_from_slice(&prefix.num_items.to_le_bytes());
    for o in &tables.offsets {
        header.extend_from_slice(&(base + o).to_le_bytes());
    }
    out.write_all(&header).map_err(|e| write_error(path, e))?;
    let mut written = header.len() as u64;
    progress(written);

    let mut pos = prefix.tables_end();
    let mut buf = vec![0u8; COPY_BUFFER];
    for (f, frame) in tables.frames.iter().enumerate() {
        let gap = frame.compressed_off - pos;
        let skipped = io::copy(&mut Read::take(&mut *input, gap), &mut io::sink())
            .map_err(|e| read_error(path, e))?;
        if skipped != gap {
            return Err(FormatError::corrupt(path, "framed zstd chunk ends early"));
        }
        let decompress_error = |reason: String| FormatError::Decompress {
            path: format!("{path} (frame {f})"),
            algorithm: "zstd".into(),
            reason,
        };
        let mut limited = Read::take(&mut *input, frame.compressed_len);
        let mut inflated = 0u64;
        {
            let reader = BufReader::with_capacity(COPY_BUFFER, &mut limited);
            let decoder = zstd::stream::read::Decoder::with_buffer(reader)
                .map_err(|e| decompress_error(e.to_string()))?;
            let mut bounded = decoder.take(frame.uncompressed_len + 1);
            loop {
                let n = match bounded.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(decompress_error(e.to_string())),
                };
                inflated += n as u64;
                if inflated > frame.uncompressed_len {
                    break;
                }
                out.write_all(&buf[..n]).map_err(|e| write_error(path, e))?;
                written += n as u64;
                progress(written);
            }
        }
        if inflated != frame.uncompressed_len {
            return Err(decompress_error(format!(
                "inflates to {inflated} bytes{}, the frame table says {}",
                if inflated > frame.uncompressed_len {
                    " or more"
                } else {
                    ""
                },
                frame.uncompressed_len
            )));
        }
        // What the decoder left of the frame's bytes (padding), so the next frame starts right.
        io::copy(&mut limited, &mut io::sink()).map_err(|e| read_error(path, e))?;
        pos = frame.compressed_off + frame.compressed_len;
    }
    Ok(written)
}

/// The classic size of framed chunk `path` from its prefix (`head`, at least [`PREFIX_BYTES`])
/// and its last relative offset (the u32 at [`FramedPrefix::last_offset_at`]), after checking
/// its item count against `expected` and its tables against `file_len`.
pub fn classic_size(
    path: &str,
    head: &[u8],
    last_offset: u32,
    file_len: u64,
    expected: u64,
) -> Result<u64> {
    let prefix = FramedPrefix::parse(path, head)?;
    if u64::from(prefix.num_items) != expected {
        return Err(FormatError::corrupt(
            path,
            format!(
                "holds {} items, the index says {expected}",
                prefix.num_items
            ),
        ));
    }
    if prefix.tables_end() > file_len {
        return Err(FormatError::corrupt(
            path,
            format!(
                "framed zstd tables end at byte {}, past the file's {file_len}",
                prefix.tables_end()
            ),
        ));
    }
    prefix.classic_size(path, last_offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A framed chunk of `items`, `k` per frame, as `pack_framed_zstd` writes it.
    pub(crate) fn framed(items: &[&[u8]], k: usize) -> Vec<u8> {
        let n = items.len();
        let n_frames = n.div_ceil(k);
        let mut rel = vec![0u32];
        for it in items {
            rel.push(rel.last().unwrap() + it.len() as u32);
        }
        let mut frames = Vec::new();
        let mut table = Vec::new();
        let mut at = (PREFIX_BYTES as usize + 4 * (n + 1) + 24 * n_frames) as u64;
        for f in 0..n_frames {
            let (a, b) = (f * k, ((f + 1) * k).min(n));
            let raw = items[a..b].concat();
            let z = zstd::encode_all(&raw[..], 3).unwrap();
            for w in [a as u32, (b - a) as u32] {
                table.extend_from_slice(&w.to_le_bytes());
            }
            table.extend_from_slice(&at.to_le_bytes());
            for w in [z.len() as u32, raw.len() as u32] {
                table.extend_from_slice(&w.to_le_bytes());
            }
            at += z.len() as u64;
            frames.extend_from_slice(&z);
        }
        let mut out = FRAMED_MAGIC.to_vec();
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        for w in [n as u32, k as u32, n_frames as u32] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for o in rel {
            out.extend_from_slice(&o.to_le_bytes());
        }
        out.extend_from_slice(&table);
        out.extend_from_slice(&frames);
        out
    }

    fn convert(chunk: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        to_classic(
            "c.bin",
            &mut &chunk[..],
            chunk.len() as u64,
            1 << 30,
            &mut out,
            &mut |_| {},
        )?;
        Ok(out)
    }

    #[test]
    fn framed_chunks_become_classic_ones_of_the_announced_size() {
        let items: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i; usize::from(i) * 3]).collect();
        let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
        let chunk = framed(&refs, 3);
        let classic = convert(&chunk).unwrap();
        assert_eq!(u32_at(&classic, 0), Some(7));
        let header = 4 + 4 * 8;
        let mut at = header;
        for (i, it) in items.iter().enumerate() {
            assert_eq!(u32_at(&classic, 4 + 4 * i), Some(at as u32));
            assert_eq!(&classic[at..at + it.len()], &it[..]);
            at += it.len();
        }
        assert_eq!(classic.len(), at);
        let prefix = FramedPrefix::parse("c.bin", &chunk).unwrap();
        let last = u32_at(&chunk, prefix.last_offset_at() as usize).unwrap();
        let size = classic_size("c.bin", &chunk, last, chunk.len() as u64, 7).unwrap();
        assert_eq!(size, classic.len() as u64);
    }

    #[test]
    fn damaged_headers_and_frames_are_errors_naming_the_chunk() {
        let chunk = framed(&[b"aaaa", b"bb", b"cccccc"], 2);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", chunk[..10].to_vec()),
            ("tables past the end", {
                let mut c = chunk.clone();
                c[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
                c[20..24].copy_from_slice(&1u32.to_le_bytes());
                c
            }),
            ("frame past the end", chunk[..chunk.len() - 3].to_vec()),
            ("wrong inflated size", {
                let mut c = chunk.clone();
                let at = 24 + 16 + 20; // frame 0's uncompressed_len
                c[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
                c
            }),
            ("offsets going down", {
                let mut c = chunk.clone();
                c[28..32].copy_from_slice(&100u32.to_le_bytes());
                c
            }),
            ("damaged frame bytes", {
                let mut c = chunk.clone();
                let frame0 = FramedPrefix::parse("c.bin", &c).unwrap().tables_end() as usize;
                c[frame0] ^= 0xff;
                c
            }),
        ];
        for (what, bytes) in cases {
            let err = convert(&bytes).unwrap_err().to_string();
            assert!(err.contains("c.bin"), "{what}: {err}");
        }
        let mut v2 = chunk.clone();
        v2[8] = 2;
        assert!(matches!(convert(&v2), Err(FormatError::Unsupported { .. })));
    }
}
