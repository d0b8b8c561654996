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

/// `compile --keys` names the cache entries the binary reads, one a variant, and compiles none:
/// the two reference variants for one arch, keyed by arch (the folder stays empty).
#[test]
fn compile_keys_names_the_entries_and_writes_none() {
    let dir = tempfile::tempdir().unwrap();
    let keys = |arch: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_flashcore"))
            .args(["compile", "--arch", arch, "--kernel", "reference", "--keys"])
            .env("FLASHCORE_CACHE_DIR", dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect::<Vec<_>>()
    };
    let sm80 = keys("sm_80");
    assert_eq!(sm80.len(), 2, "{sm80:?}");
    for (key, dtype) in sm80.iter().zip(["f16", "bf16"]) {
        assert!(key.starts_with(&format!("reference_{dtype}_")) && key.contains("-sm_80-") && key.ends_with(".fcbin"), "{key}");
    }
    assert!(keys("sm_90a").iter().all(|k| !sm80.contains(k)), "another arch, other keys");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing compiled");
}
