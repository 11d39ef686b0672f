//! The rule for the names stores are keyed by: persistence ids, writer ids, tags.

/// Longest persistence id, writer id or tag accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;

/// What is wrong with a persistence id, writer id or tag, if anything: empty, or longer than
/// [`MAX_NAME_BYTES`]. The journal and the snapshot store follow the same rule, so that any
/// log the journal accepts can have snapshots.
pub fn name_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        Some("must not be empty".to_string())
    } else if value.len() > MAX_NAME_BYTES {
        Some(format!(
            "is {} bytes, more than {MAX_NAME_BYTES}",
            value.len()
        ))
    } else {
        None
    }
}

/// The first 64 characters of a name, for error messages.
pub fn name_excerpt(value: &str) -> String {
    value.chars().take(64).collect()
}
