//! Records the git commit the binary was built from, for benchmark reports.
fn main() {
    println!("cargo:rerun-if-env-changed=FLASHCORE_COMMIT");
    if let Ok(commit) = std::env::var("FLASHCORE_COMMIT") {
        println!("cargo:rustc-env=FLASHCORE_COMMIT={commit}");
        return;
    }
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FLASHCORE_COMMIT={commit}");
    // Every commit appends to the HEAD log, whatever the ref storage.
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/logs/HEAD");
}
