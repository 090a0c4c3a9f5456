//! Where everything lives inside one node's cache folder, and the small file helpers that keep
//! each file either absent or complete.
//!
//! ```text
//! <dir>/SHARDSTREAM-CACHE      layout marker ({"layout":1})
//! <dir>/CACHEDIR.TAG           tells backup tools to skip the folder
//! <dir>/generation             a random number drawn by the first process that opens the folder
//! <dir>/cache.lock             shared by every process that has the folder open
//! <dir>/space.lock             exclusive while the node's disk usage is counted or changed
//! <dir>/space.ledger           bytes in data/ as of the last change, valid for one generation
//! <dir>/locks/<id>.fetch       per shard: exclusive while its files are created, checked or removed
//! <dir>/locks/<id>.pin         per shard: shared by readers (leases), exclusive to delete the data
//! <dir>/entries/<id>.json      per shard: the cache's record (key, size, hash, verified generation)
//! <dir>/tmp/<id>.<bytes>       a download in progress, holding a reservation of <bytes>
//! <dir>/data/<id>              a complete, verified shard
//! <dir>/indexes/<id>.json      a copy of a remote dataset's index.json (<id> of its URL)
//! ```
//!
//! `<id>` is the 32-hex-digit xxh3-128 of the shard key, so keys never become paths.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use shardstream_sharding::hashing::{hash_hex, HashAlgorithm};

use super::error::{io_err, CacheError, Result};

/// The layout version written to the marker; a folder with another version is refused.
const LAYOUT_VERSION: u64 = 1;
const MARKER: &str = "SHARDSTREAM-CACHE";
/// The standard cache-directory tag (<https://bford.info/cachedir/>).
const CACHEDIR_TAG: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by shardstream.\n";

/// A shard key's file-name-safe identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct KeyId(String);

impl KeyId {
    pub(crate) fn of(key: &str) -> KeyId {
        KeyId(hash_hex(HashAlgorithm::Xxh3_128, key.as_bytes()))
    }

    /// Accepts only names this cache could have produced.
    pub(crate) fn parse(name: &str) -> Option<KeyId> {
        let ok = name.len() == 32
            && name
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| KeyId(name.to_string()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// Parses a temp file's name, `<id>.<reserved bytes>`.
pub(crate) fn parse_tmp_name(name: &str) -> Option<(KeyId, u64)> {
    let (id, bytes) = name.split_once('.')?;
    Some((KeyId::parse(id)?, bytes.parse().ok()?))
}

/// Paths inside one cache folder.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    root: PathBuf,
}

impl Layout {
    pub(crate) fn new(root: PathBuf) -> Layout {
        Layout { root }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub(crate) fn entries_dir(&self) -> PathBuf {
        self.root.join("entries")
    }

    fn locks_dir(&self) -> PathBuf {
        self.root.join("locks")
    }

    pub(crate) fn indexes_dir(&self) -> PathBuf {
        self.root.join("indexes")
    }

    /// The copy of the index whose URL has identity `id`.
    pub(crate) fn index_copy(&self, id: &KeyId) -> PathBuf {
        self.indexes_dir().join(format!("{}.json", id.as_str()))
    }

    /// The one temp name of that copy (written only under [`Layout::index_lock`]).
    pub(crate) fn index_copy_tmp(&self, id: &KeyId) -> PathBuf {
        self.indexes_dir().join(format!("{}.json.tmp", id.as_str()))
    }

    /// Exclusive while that copy is written.
    pub(crate) fn index_lock(&self, id: &KeyId) -> PathBuf {
        self.locks_dir().join(format!("{}.index", id.as_str()))
    }

    pub(crate) fn data(&self, id: &KeyId) -> PathBuf {
        self.data_dir().join(id.as_str())
    }

    pub(crate) fn tmp(&self, id: &KeyId, reserved: u64) -> PathBuf {
        self.tmp_dir().join(format!("{}.{reserved}", id.as_str()))
    }

    pub(crate) fn record(&self, id: &KeyId) -> PathBuf {
        self.entries_dir().join(format!("{}.json", id.as_str()))
    }

    pub(crate) fn record_tmp(&self, id: &KeyId) -> PathBuf {
        self.entries_dir().join(format!("{}.json.tmp", id.as_str()))
    }

    pub(crate) fn fetch_lock(&self, id: &KeyId) -> PathBuf {
        self.locks_dir().join(format!("{}.fetch", id.as_str()))
    }

    pub(crate) fn pin_lock(&self, id: &KeyId) -> PathBuf {
        self.locks_dir().join(format!("{}.pin", id.as_str()))
    }

    pub(crate) fn space_lock(&self) -> PathBuf {
        self.root.join("space.lock")
    }

    pub(crate) fn ledger(&self) -> PathBuf {
        self.root.join("space.ledger")
    }

    pub(crate) fn open_lock(&self) -> PathBuf {
        self.root.join("cache.lock")
    }

    fn generation(&self) -> PathBuf {
        self.root.join("generation")
    }

    /// Whether the folder holds this layout's marker (reads only; creates nothing).
    pub(crate) fn is_ours(&self) -> bool {
        fs::read_to_string(self.root.join(MARKER)).is_ok_and(|found| found == marker_text())
    }

    /// Creates the folder tree and marker files if missing, and refuses a folder that holds
    /// another layout. Safe to race: every step is idempotent or an atomic rename.
    pub(crate) fn create(&self) -> Result<()> {
        fs::create_dir_all(&self.root).map_err(io_err("create directory", &self.root))?;
        // The marker before anything else: a process that finds the folder while another is
        // still making it sees it empty or marked, never holding unmarked files
        // (`shardstream_identity::prepare_node_folder` refuses to adopt those).
        self.write_marker()?;
        for dir in [
            self.data_dir(),
            self.tmp_dir(),
            self.entries_dir(),
            self.locks_dir(),
            self.indexes_dir(),
        ] {
            fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        }
        let tag = self.root.join("CACHEDIR.TAG");
        if !tag.exists() {
            write_new_atomically(&tag, CACHEDIR_TAG.as_bytes())?;
        }
        Ok(())
    }

    /// Writes the layout marker if missing; refuses a folder marked with another layout.
    fn write_marker(&self) -> Result<()> {
        let marker = self.root.join(MARKER);
        let want = marker_text();
        match fs::read_to_string(&marker) {
            Ok(found) if found == want => {}
            Ok(found) => {
                return Err(CacheError::Layout {
                    path: marker,
                    found: found.trim().to_string(),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                write_new_atomically(&marker, want.as_bytes())?;
            }
            Err(e) => return Err(io_err("read", &marker)(e)),
        }
        Ok(())
    }

    pub(crate) fn read_generation(&self) -> Result<u64> {
        let path = self.generation();
        match fs::read_to_string(&path) {
            Ok(s) => Ok(s.trim().parse().unwrap_or(0)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    /// Starts a new generation and returns it. Only called with `cache.lock` held
    /// exclusively: other processes read the file only after that hold is downgraded, and the
    /// next opener after a writer that died mid-write is a first opener that writes it again,
    /// so a plain write needs neither a temp file nor a rename.
    ///
    /// A generation is a random number, not a counter, and so needs no fsync: the file is only
    /// ever read by processes that open the folder while its writer still holds it open (the
    /// same boot). If a power cut loses the write, the next first opener draws a fresh value,
    /// which no record or ledger carries; a lost counter bump would instead hand out a value
    /// again, and records verified under the lost one would pass as checked.
    pub(crate) fn new_generation(&self) -> Result<u64> {
        let old = self.read_generation()?;
        let generation = random_generation(old);
        overwrite_in_place(&self.generation(), format!("{generation:020}\n").as_bytes())?;
        Ok(generation)
    }
}

/// A random generation, never 0 (what a folder without a generation file reads as) nor `old`.
fn random_generation(old: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // std's hasher keys come from the OS's random source, once per process, and differ for
    // every `RandomState`; the time and pid make two draws of one process differ as well.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.write_u64(old);
    match h.finish() {
        0 => 1,
        g if g == old => g.wrapping_add(2).max(1),
        g => g,
    }
}

/// The marker file's content for this layout.
fn marker_text() -> String {
    format!("{{\"layout\":{LAYOUT_VERSION}}}\n")
}

/// Writes `bytes` over the start of `path` (creating it), without truncating it first (only a
/// longer file is cut to `bytes` afterwards): for small files rewritten at a fixed width under
/// a lock their readers take too (the generation, the space ledger). ext4 flushes a file that
/// was truncated, or renamed over another, when it is closed (`auto_da_alloc`), and where it is
/// mounted with `discard` and without a journal, freeing the old blocks waits for the device:
/// 180-200 µs for a truncating write or a write-and-rename on the development VM, 4 µs in
/// place. Not atomic against a power cut; callers' files are trusted for one boot only.
pub(crate) fn overwrite_in_place(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io_err("open", path))?;
    f.write_all_at(bytes, 0).map_err(io_err("write", path))?;
    let len = f.metadata().map_err(io_err("stat", path))?.len();
    if len > bytes.len() as u64 {
        f.set_len(bytes.len() as u64)
            .map_err(io_err("truncate", path))?;
    }
    Ok(())
}

/// Writes `bytes` to `tmp`, fsyncs it, renames it over `path` and fsyncs the folder, so `path`
/// is either its old content or the new one, also after a power cut.
pub(crate) fn write_atomically(path: &Path, tmp: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(tmp).map_err(io_err("create", tmp))?;
    f.write_all(bytes).map_err(io_err("write", tmp))?;
    f.sync_all().map_err(io_err("fsync", tmp))?;
    drop(f);
    fs::rename(tmp, path).map_err(io_err("rename", tmp))?;
    sync_parent(path)
}

/// For files that many processes, and threads of one process, may create at once with the same
/// content: each writer has its own temp name (process id and a per-process count), so none can
/// rename another's half-written file into place, or find its own renamed away by another.
fn write_new_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
    write_atomically(path, &tmp, bytes)
}

/// Makes a rename or unlink inside `path`'s folder durable.
pub(crate) fn sync_parent(path: &Path) -> Result<()> {
    let Some(dir) = path.parent() else {
        return Ok(());
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

/// Removes a file; a file that is already gone is fine.
pub(crate) fn remove_if_present(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("remove", path)(e)),
    }
}

/// The names in a folder; entries that vanish or are not UTF-8 are skipped (the cache never
/// creates such names).
pub(crate) fn list_names(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = match entry {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("list", dir)(e)),
        };
        if let Ok(name) = entry.file_name().into_string() {
            out.push(name);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overwrite_in_place_leaves_exactly_the_new_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // Absent, shorter (an older variable-width ledger), longer (anything else).
        overwrite_in_place(&path, b"00000000000000000042\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"00000000000000000042\n");
        fs::write(&path, "7 9\n").unwrap();
        overwrite_in_place(&path, b"00000000000000000007 00000000000000000010\n").unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "00000000000000000007 00000000000000000010\n"
        );
        fs::write(&path, "x".repeat(100)).unwrap();
        overwrite_in_place(&path, b"1\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"1\n");
    }

    #[test]
    fn a_generation_is_read_back_whatever_its_width() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_path_buf());
        layout.create().unwrap();
        let drawn = layout.new_generation().unwrap();
        assert_eq!(layout.read_generation().unwrap(), drawn);
        // A folder whose generation an older version wrote (no padding).
        fs::write(layout.generation(), "12345\n").unwrap();
        assert_eq!(layout.read_generation().unwrap(), 12345);
        let next = layout.new_generation().unwrap();
        assert_ne!(next, 12345);
        assert_eq!(layout.read_generation().unwrap(), next);
    }

    #[test]
    fn key_ids_are_hex_and_round_trip() {
        let id = KeyId::of("split/shard.00000.mds.zstd");
        assert_eq!(id.as_str().len(), 32);
        assert_eq!(KeyId::parse(id.as_str()), Some(id.clone()));
        assert_eq!(KeyId::parse("notes.txt"), None);
        assert_eq!(KeyId::parse(&id.as_str().to_uppercase()), None);
        let tmp = format!("{}.4096", id.as_str());
        assert_eq!(parse_tmp_name(&tmp), Some((id, 4096)));
        assert_eq!(parse_tmp_name("foreign.partial"), None);
    }

    #[test]
    fn threads_of_one_process_create_a_new_folder_at_once() {
        // Several threads of a process opening a node's cache for the first time (a script's
        // datasets in threads): each writes the marker and tag under its own temp name.
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().to_path_buf();
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let layout = Layout::new(root.clone());
                    std::thread::spawn(move || layout.create())
                })
                .collect();
            for t in threads {
                t.join().unwrap().unwrap();
            }
            assert_eq!(
                fs::read_to_string(root.join("CACHEDIR.TAG")).unwrap(),
                CACHEDIR_TAG
            );
        }
    }

    #[test]
    fn a_folder_with_another_layout_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_path_buf());
        layout.create().unwrap();
        layout.create().unwrap();
        fs::write(dir.path().join(MARKER), "{\"layout\":99}\n").unwrap();
        assert!(matches!(layout.create(), Err(CacheError::Layout { .. })));
    }
}
