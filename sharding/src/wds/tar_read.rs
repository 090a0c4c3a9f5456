//! A strictly sequential, bounded tar member reader with Python `tarfile`'s reading rules.
//!
//! Why not the `tar` crate: it reads GNU long-name and PAX extension bodies into memory with no
//! limit and gives no hook to bound them, and its raw mode loses PAX `size` overrides. This reader
//! keeps every allocation bounded (extension headers by [`MAX_EXTENSION_SIZE`], member data by the
//! caller's limit and by the bytes actually present) and follows `tarfile` where formats disagree:
//! the ustar prefix is joined unless the type is a GNU one, checksums may be signed or unsigned,
//! numbers may be octal or base-256, and link/directory/device members carry no data blocks.
//!
//! It is stricter than `tarfile` in one respect: a bad checksum or a truncated header or member is an
//! error, where `tarfile` in stream mode silently ends the archive.

use std::io::{self, Read};

use crate::error::{FormatError, Result};

const BLOCK: usize = 512;
/// Largest GNU long-name or PAX extension body accepted (a name longer than this is not a name).
pub const MAX_EXTENSION_SIZE: u64 = 1 << 20;
/// Most extension headers (`L`, `K`, `x`, `g`) allowed in front of one member.
const MAX_EXTENSIONS_PER_MEMBER: usize = 16;

/// One member's header, after long names and PAX records are applied.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// The member's name (PAX `path`, else GNU long name, else ustar prefix + name).
    pub name: String,
    /// A regular file (`0`, NUL, `7`), as `TarInfo.isreg()`.
    pub regular: bool,
}

/// Reads members one after another from any `Read`.
pub(crate) struct TarStream<R> {
    inner: R,
    path: String,
    /// Name of the member whose data is being read, for errors.
    current: String,
    /// Unread data bytes of the current member.
    data_left: u64,
    /// Padding after the current member's data.
    pad_left: u64,
    global_path: Option<String>,
    global_size: Option<u64>,
    finished: bool,
}

impl<R: Read> TarStream<R> {
    /// Reads the tar archive `inner`; `path` names it in errors.
    pub fn new(inner: R, path: impl Into<String>) -> Self {
        TarStream {
            inner,
            path: path.into(),
            current: String::new(),
            data_left: 0,
            pad_left: 0,
            global_path: None,
            global_size: None,
            finished: false,
        }
    }

    /// The reader underneath (for a position counted by a wrapper).
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Bytes of data the current member holds (0 before the first member).
    pub fn data_len(&self) -> u64 {
        self.data_left
    }

    fn err(&self, reason: impl Into<String>) -> FormatError {
        FormatError::Tar {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    fn io_err(&self, e: io::Error) -> FormatError {
        self.err(format!("read error: {e}"))
    }

    /// The next member's header, skipping whatever of the previous member was not read.
    /// `None` at the end of the archive (a zero block, or the end of the input at a header).
    pub fn next_member(&mut self) -> Result<Option<Member>> {
        if self.finished {
            return Ok(None);
        }
        self.skip_rest()?;
        let mut long_name: Option<Vec<u8>> = None;
        let mut local = PaxRecords::default();
        for _ in 0..=MAX_EXTENSIONS_PER_MEMBER {
            let Some(block) = self.read_header()? else {
                if long_name.is_some() || local.any() {
                    return Err(
                        self.err("archive ends after an extension header, before its member")
                    );
                }
                self.finished = true;
                return Ok(None);
            };
            let header = Header::parse(&block).map_err(|r| self.err(r))?;
            match header.typeflag {
                b'x' | b'g' => {
                    let body = self.read_extension(&header, "PAX header")?;
                    let records = PaxRecords::parse(&body).map_err(|r| self.err(r))?;
                    if records.sparse {
                        return Err(self.unsupported("GNU sparse members (PAX GNU.sparse)"));
                    }
                    if header.typeflag == b'g' {
                        if records.path.is_some() {
                            self.global_path = records.path;
                        }
                        if records.size.is_some() {
                            self.global_size = records.size;
                        }
                    } else {
                        local = records;
                    }
                }
                b'L' => {
                    let body = self.read_extension(&header, "GNU long name")?;
                    long_name = Some(nts(&body).to_vec());
                }
                b'K' => {
                    self.read_extension(&header, "GNU long link name")?;
                }
                b'S' => return Err(self.unsupported("GNU sparse members")),
                _ => return self.finish_member(header, long_name, local).map(Some),
            }
        }
        Err(self.err(format!(
            "more than {MAX_EXTENSIONS_PER_MEMBER} extension headers in front of one member"
        )))
    }

    fn unsupported(&self, what: &str) -> FormatError {
        FormatError::Unsupported {
            path: self.path.clone(),
            what: what.to_string(),
        }
    }

    fn finish_member(
        &mut self,
        header: Header,
        long_name: Option<Vec<u8>>,
        local: PaxRecords,
    ) -> Result<Member> {
        let raw_name = match (&local.path, &self.global_path, long_name) {
            (Some(p), _, _) | (None, Some(p), _) => p.clone().into_bytes(),
            (None, None, Some(n)) => n,
            (None, None, None) => header.name.clone(),
        };
        let name = String::from_utf8(raw_name).map_err(|e| {
            self.err(format!(
                "member name {:?} is not UTF-8",
                String::from_utf8_lossy(e.as_bytes())
            ))
        })?;
        let size = local.size.or(self.global_size).unwrap_or(header.size);
        // An old-style (NUL type) member whose name ends in '/' is a directory.
        let regular = match header.typeflag {
            0 => !name.ends_with('/'),
            b'0' | b'7' => true,
            _ => false,
        };
        // tarfile skips data blocks only for regular files and types it does not know.
        let has_data = regular || !matches!(header.typeflag, 0 | b'1'..=b'6');
        let size = if has_data { size } else { 0 };
        self.current = name.clone();
        self.data_left = size;
        self.pad_left = padding(size);
        Ok(Member { name, regular })
    }

    /// Reads the current member's data, which must be at most `limit` bytes. Memory grows with the
    /// bytes actually read, never with the size the header claims.
    pub fn read_data(&mut self, limit: u64) -> Result<Vec<u8>> {
        let size = self.data_left;
        if size > limit {
            return Err(self.err(format!(
                "member {:?}: size {size} bytes exceeds the limit of {limit} bytes",
                self.current
            )));
        }
        let mut data = Vec::with_capacity(size.min(1 << 16) as usize);
        let got = (&mut self.inner)
            .take(size)
            .read_to_end(&mut data)
            .map_err(|e| self.io_err(e))? as u64;
        self.data_left = 0;
        if got < size {
            return Err(self.truncated(size, got));
        }
        self.skip_padding()?;
        Ok(data)
    }

    fn truncated(&self, size: u64, got: u64) -> FormatError {
        self.err(format!(
            "member {:?} is truncated: its header says {size} bytes, the archive ends after {got}",
            self.current
        ))
    }

    fn skip_rest(&mut self) -> Result<()> {
        let size = self.data_left;
        let skipped = self.discard(size)?;
        self.data_left = 0;
        if skipped < size {
            return Err(self.truncated(size, skipped));
        }
        self.skip_padding()
    }

    fn skip_padding(&mut self) -> Result<()> {
        let pad = self.pad_left;
        let skipped = self.discard(pad)?;
        self.pad_left = 0;
        if skipped < pad {
            return Err(self.err(format!(
                "member {:?}: archive ends inside the padding after its data",
                self.current
            )));
        }
        Ok(())
    }

    fn discard(&mut self, n: u64) -> Result<u64> {
        io::copy(&mut (&mut self.inner).take(n), &mut io::sink()).map_err(|e| self.io_err(e))
    }

    /// The next 512-byte header block; `None` at a clean end (end of input or a zero block).
    fn read_header(&mut self) -> Result<Option<[u8; BLOCK]>> {
        let mut block = [0u8; BLOCK];
        let mut filled = 0;
        while filled < BLOCK {
            match self.inner.read(&mut block[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
        if filled == 0 {
            return Ok(None);
        }
        if filled < BLOCK {
            return Err(self.err(format!(
                "truncated header: {filled} of {BLOCK} bytes after member {:?}",
                self.current
            )));
        }
        if block.iter().all(|&b| b == 0) {
            self.finished = true;
            return Ok(None);
        }
        Ok(Some(block))
    }

    fn read_extension(&mut self, header: &Header, what: &str) -> Result<Vec<u8>> {
        self.current = format!("{what} of {}", String::from_utf8_lossy(&header.name));
        self.data_left = header.size;
        self.pad_left = padding(header.size);
        self.read_data(MAX_EXTENSION_SIZE)
    }
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

/// The bytes up to the first NUL.
fn nts(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |i| &b[..i])
}

struct Header {
    name: Vec<u8>,
    size: u64,
    typeflag: u8,
}

impl Header {
    fn parse(b: &[u8; BLOCK]) -> std::result::Result<Header, String> {
        let chksum = number(&b[148..156]).map_err(|e| format!("bad checksum field: {e}"))?;
        let unsigned: i64 = 256
            + b[..148].iter().map(|&c| i64::from(c)).sum::<i64>()
            + b[156..].iter().map(|&c| i64::from(c)).sum::<i64>();
        let signed: i64 = 256
            + b[..148].iter().map(|&c| i64::from(c as i8)).sum::<i64>()
            + b[156..].iter().map(|&c| i64::from(c as i8)).sum::<i64>();
        if chksum != unsigned && chksum != signed {
            return Err(format!(
                "header checksum mismatch (stored {chksum}, computed {unsigned}): not a tar archive, or corrupt"
            ));
        }
        let size = number(&b[124..136]).map_err(|e| format!("bad size field: {e}"))?;
        let size = u64::try_from(size).map_err(|_| format!("negative member size {size}"))?;
        let typeflag = b[156];
        let mut name = nts(&b[0..100]).to_vec();
        let prefix = nts(&b[345..500]);
        if !prefix.is_empty() && !matches!(typeflag, b'L' | b'K' | b'S') {
            let mut joined = prefix.to_vec();
            joined.push(b'/');
            joined.extend_from_slice(&name);
            name = joined;
        }
        Ok(Header {
            name,
            size,
            typeflag,
        })
    }
}

/// `tarfile.nti`: octal text, or base-256 when the first byte is 0x80 / 0xff.
fn number(field: &[u8]) -> std::result::Result<i64, String> {
    match field.first() {
        Some(&first @ (0x80 | 0xff)) => {
            let mut n: i128 = 0;
            for &c in &field[1..] {
                n = (n << 8) | i128::from(c);
            }
            if first == 0xff {
                n -= 1i128 << (8 * (field.len() - 1));
            }
            i64::try_from(n).map_err(|_| "base-256 number out of range".to_string())
        }
        _ => {
            let text = std::str::from_utf8(nts(field)).map_err(|_| "not ASCII".to_string())?;
            let text = text.trim();
            if text.is_empty() {
                return Ok(0);
            }
            i64::from_str_radix(text, 8).map_err(|_| format!("{text:?} is not an octal number"))
        }
    }
}

/// The PAX records this reader acts on.
#[derive(Default)]
struct PaxRecords {
    path: Option<String>,
    size: Option<u64>,
    sparse: bool,
}

impl PaxRecords {
    fn any(&self) -> bool {
        self.path.is_some() || self.size.is_some()
    }

    /// Parses `"<len> <key>=<value>\n"` records.
    fn parse(body: &[u8]) -> std::result::Result<PaxRecords, String> {
        let mut out = PaxRecords::default();
        let mut pos = 0;
        while pos < body.len() && body[pos] != 0 {
            let rest = &body[pos..];
            let space = rest
                .iter()
                .position(|&c| c == b' ')
                .ok_or("PAX record without a length")?;
            let len: usize = std::str::from_utf8(&rest[..space])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("PAX record with a bad length")?;
            if len <= space + 1 || len > rest.len() || rest[len - 1] != b'\n' {
                return Err("malformed PAX record".into());
            }
            let record = &rest[space + 1..len - 1];
            let eq = record
                .iter()
                .position(|&c| c == b'=')
                .ok_or("PAX record without '='")?;
            let (key, value) = (&record[..eq], &record[eq + 1..]);
            match key {
                b"path" => {
                    out.path = Some(
                        String::from_utf8(value.to_vec())
                            .map_err(|_| "PAX path is not UTF-8".to_string())?,
                    )
                }
                b"size" => {
                    let text = std::str::from_utf8(value).unwrap_or("");
                    out.size = Some(
                        text.trim()
                            .parse()
                            .map_err(|_| format!("PAX size {text:?} is not a number"))?,
                    );
                }
                k if k.starts_with(b"GNU.sparse.") => out.sparse = true,
                _ => {}
            }
            pos += len;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ustar(name: &str, size: u64, typeflag: u8) -> [u8; BLOCK] {
        let mut h = tar::Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_size(size);
        h.set_entry_type(tar::EntryType::new(typeflag));
        h.set_cksum();
        let mut out = [0u8; BLOCK];
        out.copy_from_slice(h.as_bytes());
        out
    }

    fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in members {
            out.extend_from_slice(&ustar(name, data.len() as u64, b'0'));
            out.extend_from_slice(data);
            out.resize(out.len() + padding(data.len() as u64) as usize, 0);
        }
        out.resize(out.len() + 2 * BLOCK, 0);
        out
    }

    #[test]
    fn reads_members_in_order() {
        let bytes = archive(&[("a.txt", b"hello"), ("b.bin", &[7u8; 600])]);
        let mut t = TarStream::new(&bytes[..], "x.tar");
        let m = t.next_member().unwrap().unwrap();
        assert_eq!((m.name.as_str(), m.regular), ("a.txt", true));
        assert_eq!(t.read_data(100).unwrap(), b"hello");
        let m = t.next_member().unwrap().unwrap();
        assert_eq!(m.name, "b.bin");
        // Not reading the data: the next call skips it.
        assert!(t.next_member().unwrap().is_none());
        assert!(t.next_member().unwrap().is_none());
    }

    #[test]
    fn size_over_limit_and_truncation_are_errors() {
        let bytes = archive(&[("a.txt", &[1u8; 100])]);
        let mut t = TarStream::new(&bytes[..], "x.tar");
        t.next_member().unwrap();
        let e = t.read_data(10).unwrap_err().to_string();
        assert!(
            e.contains("x.tar") && e.contains("a.txt") && e.contains("limit"),
            "{e}"
        );

        let mut t = TarStream::new(&bytes[..BLOCK + 50], "x.tar");
        t.next_member().unwrap();
        let e = t.read_data(1000).unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains("a.txt"), "{e}");
    }

    #[test]
    fn huge_size_field_does_not_allocate() {
        let mut bytes = ustar("big.bin", 1 << 40, b'0').to_vec();
        bytes.extend_from_slice(&[0u8; 10]);
        let mut t = TarStream::new(&bytes[..], "x.tar");
        t.next_member().unwrap();
        let e = t.read_data(u64::MAX).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn pax_path_and_gnu_long_names_apply() {
        let long = format!("{}/k.txt", "d".repeat(150));
        let mut bytes = Vec::new();
        let mut b = tar::Builder::new(&mut bytes);
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        b.append_data(&mut h, &long, &b"hi"[..]).unwrap();
        b.into_inner().unwrap();
        let mut t = TarStream::new(&bytes[..], "x.tar");
        assert_eq!(t.next_member().unwrap().unwrap().name, long);
        assert_eq!(t.read_data(10).unwrap(), b"hi");

        let record = "16 path=p/q.txt\n";
        assert_eq!(record.len(), 16);
        let mut bytes = ustar("PaxHeader", record.len() as u64, b'x').to_vec();
        bytes.extend_from_slice(record.as_bytes());
        bytes.resize(BLOCK * 2, 0);
        bytes.extend_from_slice(&archive(&[("short.txt", b"z")]));
        let mut t = TarStream::new(&bytes[..], "x.tar");
        assert_eq!(t.next_member().unwrap().unwrap().name, "p/q.txt");
    }

    #[test]
    fn garbage_is_an_error() {
        let e = TarStream::new(&[1u8; 1024][..], "x.tar")
            .next_member()
            .unwrap_err()
            .to_string();
        assert!(e.contains("checksum"), "{e}");
        let e = TarStream::new(&[1u8; 100][..], "x.tar")
            .next_member()
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated header"), "{e}");
    }

    #[test]
    fn base256_numbers() {
        let mut f = [0u8; 12];
        f[0] = 0x80;
        f[11] = 5;
        assert_eq!(number(&f).unwrap(), 5);
        assert_eq!(number(b"0000644 \0").unwrap(), 0o644);
    }
}
