//! Where each sample of a tar shard lies: one pass over the member headers, grouping members
//! into samples exactly as [`super::WdsReader`] (and `webdataset`) does, recording each field's
//! data range in the tar instead of reading it. A shard opened for streaming is read from these
//! ranges with positioned reads, as an MDS shard is read from its offset table.

use std::io::{self, Read};
use std::ops::Range;

use super::reader::{base_plus_ext, check_member_name, is_metadata};
use super::tar_read::TarStream;
use crate::error::{FormatError, Result};

/// One sample of a tar: its key and each field's extension and data range, in archive order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedSample {
    /// The member path up to the first dot of its basename (`webdataset`'s `__key__`).
    pub key: String,
    /// `(extension, byte range of the member's data in the tar)`; extensions are lowercased.
    pub fields: Vec<(String, Range<u64>)>,
}

/// A reader that counts the bytes read through it: the position in a stream read front to
/// back (a tar being located, a tar being measured).
#[derive(Debug)]
pub struct CountingReader<R> {
    inner: R,
    position: u64,
}

impl<R> CountingReader<R> {
    /// Counts from 0.
    pub fn new(inner: R) -> Self {
        Self { inner, position: 0 }
    }

    /// Bytes read so far.
    pub fn position(&self) -> u64 {
        self.position
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.position += n as u64;
        Ok(n)
    }
}

/// The samples of the (uncompressed) tar `reader`, located; `url` names it in errors. Reads
/// the whole stream (data is skipped, not kept): memory grows with the number of members,
/// never with their sizes. A repeated extension within a sample is an error, as in
/// `webdataset`.
pub fn locate_samples<R: Read>(reader: R, url: &str) -> Result<Vec<LocatedSample>> {
    let mut tar = TarStream::new(CountingReader::new(reader), url.to_string());
    let mut out: Vec<LocatedSample> = Vec::new();
    while let Some(member) = tar.next_member()? {
        if !member.regular || is_metadata(&member.name) {
            continue;
        }
        check_member_name(url, &member.name)?;
        let Some((key, ext)) = base_plus_ext(&member.name) else {
            continue;
        };
        let start = tar.get_ref().position();
        let end = start
            .checked_add(tar.data_len())
            .ok_or_else(|| FormatError::Tar {
                path: url.to_string(),
                reason: format!("member {:?}: size overflows", member.name),
            })?;
        let ext = ext.to_lowercase();
        let same = out.last().is_some_and(|s| s.key == key);
        if !same {
            out.push(LocatedSample {
                key: key.to_string(),
                fields: Vec::new(),
            });
        }
        let current = out.last_mut().ok_or_else(|| FormatError::Tar {
            path: url.to_string(),
            reason: "no sample to add a member to".into(),
        })?;
        if current.fields.iter().any(|(e, _)| *e == ext) {
            return Err(FormatError::Tar {
                path: url.to_string(),
                reason: format!(
                    "member {:?}: sample {key:?} already has a {ext:?} member (duplicate file name)",
                    member.name
                ),
            });
        }
        current.fields.push((ext, start..end));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wds::{TarWriter, WdsReader, WdsSample};

    #[test]
    fn ranges_hold_what_the_reader_reads() {
        let mut w = TarWriter::new(Vec::new());
        for (k, t) in [("a/0", "zero"), ("a/1", "one!"), ("b/1", "")] {
            w.write(&WdsSample {
                key: k.into(),
                url: String::new(),
                fields: vec![
                    ("cls".into(), b"7".to_vec()),
                    ("seg.PNG".into(), t.as_bytes().to_vec()),
                ],
            })
            .unwrap();
        }
        let tar = w.finish().unwrap();
        let located = locate_samples(&tar[..], "t.tar").unwrap();
        let read: Vec<WdsSample> = WdsReader::new(&tar[..], "t.tar")
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(located.len(), read.len());
        for (l, r) in located.iter().zip(&read) {
            assert_eq!(l.key, r.key);
            let fields: Vec<(String, Vec<u8>)> = l
                .fields
                .iter()
                .map(|(e, range)| {
                    (
                        e.clone(),
                        tar[range.start as usize..range.end as usize].to_vec(),
                    )
                })
                .collect();
            assert_eq!(fields, r.fields);
        }
        assert!(locate_samples(&tar[..1000], "t.tar").is_err());
    }
}
