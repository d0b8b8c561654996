//! The ptxas resource report (`-Xptxas -v`), parsed from the NVRTC log.

/// Resources ptxas reported for one kernel entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResourceReport {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory in bytes (dynamic shared memory is set at launch).
    pub static_smem: u32,
    /// Stack frame bytes per thread.
    pub stack_frame: u32,
    /// Spill store bytes.
    pub spill_stores: u32,
    /// Spill load bytes.
    pub spill_loads: u32,
    /// ptxas serialized the entry's wgmma instructions (its C75xx "Potential Performance Loss"
    /// notes: too few registers for the asynchronous pipeline, or instructions inside it that
    /// it cannot prove safe): each product waits for the one before, at a large cost and with
    /// no other sign in the resource numbers.
    pub wgmma_serialized: bool,
}

impl ResourceReport {
    /// Parses the report of `entry` from an NVRTC log; `None` if the log has none.
    pub fn parse(log: &str, entry: &str) -> Option<Self> {
        let mut report = ResourceReport::default();
        let mut in_entry = false;
        let mut found = false;
        let (quoted, spaced) = (format!("'{entry}'"), format!(" {entry}"));
        for line in log.lines() {
            // Printed before the entries' sections, naming the function.
            if line.contains("wgmma.mma_async instructions are serialized") && line.contains(&quoted) {
                report.wgmma_serialized = true;
                continue;
            }
            if line.contains("Compiling entry function") || line.contains("Function properties for") {
                in_entry = line.contains(&quoted) || line.trim_end().ends_with(&spaced);
                continue;
            }
            if !in_entry {
                continue;
            }
            if line.contains("bytes stack frame") {
                report.stack_frame = number_before(line, "bytes stack frame")?;
                report.spill_stores = number_before(line, "bytes spill stores")?;
                report.spill_loads = number_before(line, "bytes spill loads")?;
            }
            if line.contains("Used") && line.contains("registers") {
                report.registers = number_before(line, "registers")?;
                report.static_smem = number_before(line, "bytes smem").unwrap_or(0);
                found = true;
            }
        }
        found.then_some(report)
    }

    /// Whether ptxas spilled registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }

    /// What `flashcore compile` and CI accept of a kernel: no spill and no serialized wgmma.
    pub fn is_clean(&self) -> bool {
        !self.spills() && !self.wgmma_serialized
    }
}

fn number_before(line: &str, marker: &str) -> Option<u32> {
    let head = &line[..line.find(marker)?];
    head.split(|c: char| !c.is_ascii_digit()).rfind(|s| !s.is_empty())?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the function 'other'
ptxas info    : 4 bytes gmem
ptxas info    : Compiling entry function 'other' for 'sm_90a'
ptxas info    : Function properties for other
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8 bytes smem
ptxas info    : Compiling entry function 'fc_fwd' for 'sm_90a'
ptxas info    : Function properties for fc_fwd
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
";

    #[test]
    fn parses_the_named_entry_only() {
        let r = ResourceReport::parse(LOG, "fc_fwd").unwrap();
        let clean =
            ResourceReport { registers: 168, static_smem: 1024, stack_frame: 0, spill_stores: 0, spill_loads: 0, wgmma_serialized: false };
        assert_eq!(r, clean);
        assert!(!r.spills() && r.is_clean());
        let o = ResourceReport::parse(LOG, "other").unwrap();
        assert_eq!((o.registers, o.spill_stores, o.stack_frame, o.wgmma_serialized), (255, 4, 8, true));
        assert!(o.spills() && !o.is_clean());
        let serialized_alone = ResourceReport { wgmma_serialized: true, ..clean };
        assert!(!serialized_alone.spills() && !serialized_alone.is_clean());
        assert_eq!(ResourceReport::parse(LOG, "missing"), None);
    }
}
