//! How a failed command's error reads on the terminal.

/// The line `flashcore` prints for `e`: its causes, outermost first, joined by ": ", each
/// once, then `no_gpu_hint` in parentheses when a cause is the library's missing GPU (what
/// the command can do without one). An error whose message already ends with its source's
/// (the library's `Io` and `Driver`, `io`'s `IoError`) would print that cause twice under
/// anyhow's `{:#}`; the library's keeps the source in its message since its `Display` is
/// all that Python sees.
pub fn message(e: &anyhow::Error, no_gpu_hint: Option<&str>) -> String {
    let mut text = String::new();
    for cause in e.chain().map(|c| c.to_string()) {
        if cause.is_empty() || text.ends_with(&cause) {
            continue;
        }
        if !text.is_empty() {
            text += ": ";
        }
        text += &cause;
    }
    if let Some(hint) = no_gpu_hint.filter(|_| e.chain().any(|c| matches!(c.downcast_ref(), Some(flashcore::Error::NoGpu(_))))) {
        text += &format!(" ({hint})");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::IoError;

    fn not_found() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::NotFound)
    }

    fn unreadable() -> IoError {
        IoError::Read { path: "/x".into(), source: not_found() }
    }

    #[test]
    fn a_cause_the_message_already_ends_with_is_printed_once() {
        assert_eq!(message(&unreadable().into(), None), format!("cannot read `/x`: {}", not_found()));
        let e = anyhow::Error::from(unreadable()).context("loading q");
        assert_eq!(message(&e, None), format!("loading q: cannot read `/x`: {}", not_found()));
    }

    #[test]
    fn causes_the_message_lacks_are_appended() {
        let e = anyhow::Error::from(not_found()).context("writing /y");
        assert_eq!(message(&e, None), format!("writing /y: {}", not_found()));
    }
    #[test]
    fn a_missing_gpu_gets_the_hint_and_nothing_else_does() {
        let hint = Some("run with --cpu");
        let e = anyhow::Error::from(flashcore::Error::NoGpu("no driver".into()));
        assert_eq!(message(&e, hint), "no usable GPU: no driver (run with --cpu)");
        assert_eq!(message(&e, None), "no usable GPU: no driver");
        assert_eq!(message(&unreadable().into(), hint), format!("cannot read `/x`: {}", not_found()));
    }
}
