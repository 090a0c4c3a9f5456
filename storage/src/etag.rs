//! S3-style ETags of local files, to decide whether a local file and an object already match.
//!
//! An S3 ETag is the MD5 of the content for a single-part upload, and the MD5 of the
//! concatenated part MD5s followed by `-<parts>` for a multipart one. Other stores (GCS,
//! Azure, local files) use opaque ETags, and S3 objects encrypted with SSE-KMS/SSE-C have
//! ETags that are not MD5s: a mismatch therefore only means "transfer again", never "corrupt".

use std::io::Read;
use std::path::Path;

use md5::{Digest, Md5};

use crate::error::{Result, StorageError};

/// An ETag in one of the two S3 MD5 forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Md5Etag {
    /// `md5(content)`.
    Single(String),
    /// `md5(md5(part 1) .. md5(part n))-n`.
    Multipart { digest: String, parts: u64 },
}

impl Md5Etag {
    /// Recognizes an S3 MD5 ETag (quoted or not); `None` for any other form.
    pub(crate) fn parse(etag: &str) -> Option<Self> {
        let etag = etag.trim_matches('"').to_ascii_lowercase();
        let is_md5 = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
        match etag.split_once('-') {
            None if is_md5(&etag) => Some(Self::Single(etag)),
            Some((digest, parts)) if is_md5(digest) => Some(Self::Multipart {
                digest: digest.to_string(),
                parts: parts.parse().ok().filter(|n| *n > 0)?,
            }),
            _ => None,
        }
    }
}

/// True if the file at `path` has content matching `etag`, assuming multipart uploads in
/// parts of `part_size` bytes. Blocking: call from `spawn_blocking`.
pub(crate) fn file_matches(path: &Path, etag: &Md5Etag, part_size: usize) -> Result<bool> {
    let mut file = std::fs::File::open(path).map_err(|e| StorageError::io(path, e))?;
    let block = match etag {
        Md5Etag::Single(_) => 8 * 1024 * 1024,
        Md5Etag::Multipart { .. } => part_size.max(1),
    };
    let mut whole = Md5::new();
    let mut of_parts = Md5::new();
    let mut parts = 0u64;
    let mut buf = vec![0u8; block];
    loop {
        let n = read_full(&mut file, &mut buf).map_err(|e| StorageError::io(path, e))?;
        if n == 0 {
            break;
        }
        let data = buf.get(..n).unwrap_or_default();
        match etag {
            Md5Etag::Single(_) => whole.update(data),
            Md5Etag::Multipart { .. } => of_parts.update(Md5::digest(data)),
        }
        parts += 1;
    }
    Ok(match etag {
        Md5Etag::Single(digest) => hex(&whole.finalize()) == *digest,
        Md5Etag::Multipart { digest, parts: n } => {
            *n == parts && hex(&of_parts.finalize()) == *digest
        }
    })
}

/// Reads until `buf` is full or the file ends.
fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = buf.get_mut(filled..).unwrap_or_default();
        match file.read(rest) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_s3_forms_only() {
        assert_eq!(
            Md5Etag::parse("\"d41d8cd98f00b204e9800998ecf8427e\""),
            Some(Md5Etag::Single("d41d8cd98f00b204e9800998ecf8427e".into()))
        );
        assert_eq!(
            Md5Etag::parse("\"0123456789ABCDEF0123456789abcdef-3\""),
            Some(Md5Etag::Multipart {
                digest: "0123456789abcdef0123456789abcdef".into(),
                parts: 3
            })
        );
        for other in [
            "\"abc\"",
            "1a2b-5f-10",
            "0x8DBA",
            "",
            "d41d8cd98f00b204e9800998ecf8427e-0",
        ] {
            assert_eq!(Md5Etag::parse(other), None, "{other}");
        }
    }

    #[test]
    fn single_and_multipart_digests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello world").unwrap();
        let single = Md5Etag::parse("5eb63bbbe01eeed093cb22bb8f5acdc3").unwrap();
        assert!(file_matches(&path, &single, 4).unwrap());
        // Parts "hello", " worl", "d" of 5 bytes.
        let mut outer = Md5::new();
        for p in [&b"hello"[..], b" worl", b"d"] {
            outer.update(Md5::digest(p));
        }
        let multi = format!("{}-3", hex(&outer.finalize()));
        let multi = Md5Etag::parse(&multi).unwrap();
        assert!(file_matches(&path, &multi, 5).unwrap());
        assert!(!file_matches(&path, &multi, 4).unwrap());
    }
}
