//! The on-disk CUBIN cache. One file per key: `magic | log | cubin | sha256 of the rest`.
//! Written to a temporary file and renamed, so a concurrent reader sees the old file, the
//! new file, or none, never half of one. An entry that fails its checksum is deleted and
//! reported as a miss: the caller recompiles rather than trusting it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"FCCUBIN1";

/// A compiled kernel as stored: its CUBIN and the compiler log it came with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The CUBIN image.
    pub cubin: Vec<u8>,
    /// NVRTC's log, including the ptxas report.
    pub log: String,
}

/// A directory of cache entries.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `$FLASHCORE_CACHE_DIR`, else the platform cache dir (`~/.cache/flashcore` on Linux).
    pub fn default_dir() -> PathBuf {
        std::env::var_os("FLASHCORE_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| dirs::cache_dir().map(|d| d.join("flashcore")))
            .unwrap_or_else(|| std::env::temp_dir().join("flashcore-cache"))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.fcbin"))
    }

    /// The entry under `key`; `None` if absent or corrupt (a corrupt file is removed).
    pub fn get(&self, key: &str) -> Option<Entry> {
        let path = self.path(key);
        let bytes = fs::read(&path).ok()?;
        let entry = decode(&bytes);
        if entry.is_none() {
            let _ = fs::remove_file(&path);
        }
        entry
    }

    /// Stores `entry` under `key` atomically.
    pub fn put(&self, key: &str, entry: &Entry) -> Result<()> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { op, path, source }
        };
        fs::create_dir_all(&self.dir).map_err(io("creating cache dir", &self.dir))?;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(io("creating temp file in", &self.dir))?;
        tmp.write_all(&encode(entry)).map_err(io("writing", tmp.path()))?;
        let dest = self.path(key);
        tmp.persist(&dest).map_err(|e| Error::Io { op: "renaming into", path: dest, source: e.error })?;
        Ok(())
    }
}

fn encode(entry: &Entry) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend((entry.log.len() as u64).to_le_bytes());
    out.extend(entry.log.as_bytes());
    out.extend((entry.cubin.len() as u64).to_le_bytes());
    out.extend(&entry.cubin);
    let digest = Sha256::digest(&out);
    out.extend(digest);
    out
}

fn decode(bytes: &[u8]) -> Option<Entry> {
    let (body, digest) = bytes.split_at(bytes.len().checked_sub(32)?);
    if Sha256::digest(body).as_slice() != digest || !body.starts_with(MAGIC) {
        return None;
    }
    let mut rest = &body[MAGIC.len()..];
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        rest = tail;
        Some(head)
    };
    let log_len = u64::from_le_bytes(take(8)?.try_into().ok()?) as usize;
    let log = String::from_utf8(take(log_len)?.to_vec()).ok()?;
    let cubin_len = u64::from_le_bytes(take(8)?.try_into().ok()?) as usize;
    let cubin = take(cubin_len)?.to_vec();
    Some(Entry { cubin, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry { cubin: (0..=255u8).cycle().take(4000).collect(), log: "ptxas info: Used 40 registers".into() }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path().join("nested"));
        assert_eq!(cache.get("k"), None);
        cache.put("k", &entry()).unwrap();
        assert_eq!(cache.get("k"), Some(entry()));
    }

    #[test]
    fn write_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path());
        cache.put("a", &entry()).unwrap();
        cache.put("a", &entry()).unwrap();
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.fcbin")]);
    }

    #[test]
    fn corrupt_entry_is_a_miss_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path());
        cache.put("k", &entry()).unwrap();
        let path = cache.path("k");
        let mut bytes = fs::read(&path).unwrap();
        bytes[100] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get("k"), None);
        assert!(!path.exists());
        // A truncated file is also a miss.
        cache.put("k", &entry()).unwrap();
        fs::write(&path, &fs::read(&path).unwrap()[..20]).unwrap();
        assert_eq!(cache.get("k"), None);
    }

    #[test]
    fn concurrent_writers_never_expose_a_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20 {
                        cache.put("k", &entry()).unwrap();
                        if let Some(e) = cache.get("k") {
                            assert_eq!(e, entry());
                        }
                    }
                });
            }
        });
        assert_eq!(cache.get("k"), Some(entry()));
    }
}
