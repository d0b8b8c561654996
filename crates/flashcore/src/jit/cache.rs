//! The on-disk CUBIN cache. One file per key: `magic | log | cubin | sha256 of the rest`.
//! Written to a temporary file and renamed, so a concurrent reader sees the old file, the
//! new file, or none, never half of one. An entry that fails its checksum is deleted and
//! reported as a miss: the caller recompiles rather than trusting it. The checksum catches
//! corruption, not tampering: the directory and each entry read must be the current user's
//! alone ([`super::trust`]), or the cache refuses them.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::trust;
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
    /// A cache in `dir` (created on first write, mode 0700).
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

    /// The entry under `key`: `None` if absent, unreadable or corrupt (a corrupt file is
    /// removed); [`Error::UntrustedCache`] where the directory or the entry is not the current
    /// user's alone ([`trust`]): nothing is read from it.
    pub fn get(&self, key: &str) -> Result<Option<Entry>> {
        let path = self.path(key);
        let Ok(mut file) = fs::File::open(&path) else {
            return Ok(None); // absent or unreadable: compiled again, as a miss
        };
        trust::check_private(&self.dir)?;
        // The open file's own metadata: the file checked is the file read.
        let metadata = file.metadata().map_err(|source| Error::Io { op: "reading the owner of", path: path.clone(), source })?;
        trust::check_metadata(&path, &metadata)?;
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            return Ok(None);
        }
        let entry = decode(&bytes);
        if entry.is_none() {
            let _ = fs::remove_file(&path);
        }
        Ok(entry)
    }

    /// Stores `entry` under `key` atomically.
    pub fn put(&self, key: &str, entry: &Entry) -> Result<()> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { op, path, source }
        };
        trust::private_dir(&self.dir)?;
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
        assert_eq!(cache.get("k").unwrap(), None);
        cache.put("k", &entry()).unwrap();
        assert_eq!(cache.get("k").unwrap(), Some(entry()));
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
        assert_eq!(cache.get("k").unwrap(), None);
        assert!(!path.exists());
        // A truncated file is also a miss.
        cache.put("k", &entry()).unwrap();
        fs::write(&path, &fs::read(&path).unwrap()[..20]).unwrap();
        assert_eq!(cache.get("k").unwrap(), None);
    }

    #[cfg(unix)]
    #[test]
    fn a_shared_dir_or_a_planted_entry_is_refused_not_loaded() {
        use std::os::unix::fs::PermissionsExt;
        let chmod = |path: &Path, mode: u32| fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path().join("cache"));
        cache.put("k", &entry()).unwrap();
        assert_eq!(fs::metadata(cache.dir()).unwrap().permissions().mode() & 0o777, 0o700, "created private");
        // A valid entry in a directory every user can write: refused, whatever it holds.
        chmod(cache.dir(), 0o777);
        let err = cache.get("k").expect_err("a world-writable cache must be refused");
        assert!(matches!(err, Error::UntrustedCache { .. }) && err.to_string().contains("FLASHCORE_CACHE_DIR"), "{err}");
        assert!(matches!(cache.put("j", &entry()), Err(Error::UntrustedCache { .. })), "nor written");
        // A private directory, an entry another user could have written: refused.
        chmod(cache.dir(), 0o700);
        chmod(&cache.path("k"), 0o666);
        assert!(matches!(cache.get("k"), Err(Error::UntrustedCache { .. })));
        chmod(&cache.path("k"), 0o600);
        assert_eq!(cache.get("k").unwrap(), Some(entry()));
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
                        if let Some(e) = cache.get("k").unwrap() {
                            assert_eq!(e, entry());
                        }
                    }
                });
            }
        });
        assert_eq!(cache.get("k").unwrap(), Some(entry()));
    }
}
