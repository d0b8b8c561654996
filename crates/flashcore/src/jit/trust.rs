//! Whom the caches trust: their owner alone.
//!
//! FlashCore runs what it finds in its cache directory: CUBIN entries are loaded onto the GPU
//! and the Python package's native library into the process. An entry's checksum catches
//! corruption, not tampering (whoever can write the file can write a matching digest), so the
//! cache is trusted only where no one else can write: a directory (and each file read from it)
//! must belong to the current user and be writable by neither its group nor others, as ssh
//! requires of its keys. Anything else is refused with [`Error::UntrustedCache`], naming the
//! path, its owner and mode. Directories FlashCore creates are mode 0700. The one home of the
//! rule: the kernel cache ([`super::DiskCache`]) and the Python package's native-library
//! loader (through the extension) both call it.

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};

/// Creates `dir` and its missing parents (mode 0700 where created), then checks it
/// ([`check_private`]).
pub fn private_dir(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(|source| Error::Io { op: "creating cache dir", path: dir.to_path_buf(), source })?;
    }
    check_private(dir)
}

/// Checks that `path` (a directory or a file; links followed) belongs to the current user
/// and that neither its group nor others may write it.
pub fn check_private(path: &Path) -> Result<()> {
    let metadata = fs::metadata(path).map_err(|source| Error::Io { op: "reading the owner of", path: path.to_path_buf(), source })?;
    check_metadata(path, &metadata)
}

/// [`check_private`] on metadata already read (an open file's, so that the file checked is
/// the file read).
pub(crate) fn check_metadata(path: &Path, metadata: &fs::Metadata) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let uid = current_uid();
        let (owner, mode) = (metadata.uid(), metadata.mode() & 0o7777);
        let why = if owner != uid {
            Some(format!("owned by uid {owner}, not the current user"))
        } else if mode & 0o022 != 0 {
            Some(format!("mode {mode:04o}, writable by {}", if mode & 0o002 != 0 { "every user" } else { "its group" }))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::UntrustedCache { path: path.to_path_buf(), why, uid });
        }
    }
    #[cfg(not(unix))]
    let _ = (path, metadata); // no owner or mode bits to read: the platform's own ACLs decide
    Ok(())
}

/// The effective user of the process.
#[cfg(unix)]
pub(crate) fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn refusal(path: &Path) -> String {
        let err = check_private(path).expect_err("must be refused");
        assert!(matches!(err, Error::UntrustedCache { .. }), "{err}");
        err.to_string()
    }

    #[test]
    fn a_created_cache_dir_is_private_and_trusted() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/flashcore");
        private_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        chmod(&dir, 0o755); // readable by others is fine: only writers could plant code
        private_dir(&dir).unwrap();
    }

    #[test]
    fn a_world_or_group_writable_dir_is_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        chmod(root.path(), 0o777);
        let msg = refusal(root.path());
        assert!(
            msg.contains(&root.path().display().to_string()) && msg.contains("mode 0777") && msg.contains("FLASHCORE_CACHE_DIR"),
            "{msg}"
        );
        chmod(root.path(), 0o770);
        assert!(refusal(root.path()).contains("writable by its group"));
        assert!(matches!(private_dir(root.path()), Err(Error::UntrustedCache { .. })), "an existing dir is checked, not re-created");
        chmod(root.path(), 0o700);
    }

    #[test]
    fn a_world_writable_file_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("planted.so");
        fs::write(&file, b"not yours").unwrap();
        chmod(&file, 0o666);
        assert!(refusal(&file).contains("planted.so"));
        chmod(&file, 0o644);
        check_private(&file).unwrap();
    }

    #[test]
    fn a_dir_of_another_user_is_refused() {
        // As root the test hands a directory to `nobody`; as anyone else, `/` is root's.
        let root = tempfile::tempdir().unwrap();
        let theirs = if current_uid() == 0 {
            let c = std::ffi::CString::new(root.path().to_str().unwrap()).unwrap();
            // SAFETY: a NUL-terminated path; chown has no other preconditions.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0, "chown to nobody");
            root.path().to_path_buf()
        } else {
            std::path::PathBuf::from("/")
        };
        assert!(refusal(&theirs).contains("not the current user"));
    }
}
