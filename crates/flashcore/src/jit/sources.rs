//! The kernel sources, embedded at build time (see `build.rs`).

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// The text of the source or header with include name `name`.
pub fn source(name: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}
