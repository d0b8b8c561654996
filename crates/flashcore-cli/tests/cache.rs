//! The CLI and a kernel cache FlashCore refuses (`flashcore::jit::trust`): one line naming it.

#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

#[test]
fn compile_and_info_name_a_cache_every_user_can_write() {
    let root = tempfile::tempdir().unwrap();
    let shared = root.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let run =
        |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_flashcore")).args(args).env("FLASHCORE_CACHE_DIR", &shared).output().unwrap();
    let out = run(&["compile", "--arch", "sm_80", "--kernel", "reference"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!("flashcore: refusing the cache {}: mode 0777, writable by every user", shared.display());
    assert!(!out.status.success() && stderr.starts_with(&expected) && stderr.lines().count() == 1, "{stderr}");
    assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 0, "nothing written into it");
    let info = String::from_utf8_lossy(&run(&["info"]).stdout).into_owned();
    assert!(info.contains(&format!("cache dir      {} REFUSED: refusing the cache", shared.display())), "{info}");
}
