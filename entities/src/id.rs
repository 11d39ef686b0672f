//! Entity ids: validated once at the edge, then shared cheaply.

use crate::error::EntityError;
use std::fmt;
use std::sync::Arc;

/// Longest entity id accepted, in bytes. Persistence ids (`{type}|{id}`) must stay within the
/// journal's 1 KiB name limit with room for the type name.
pub const MAX_ENTITY_ID_BYTES: usize = 256;

/// Separates the type name from the entity id in a persistence id. Type names may not contain
/// it; ids may (the type name ends at the first one).
pub const PERSISTENCE_ID_SEPARATOR: char = '|';

/// A valid entity id: non-empty, at most [`MAX_ENTITY_ID_BYTES`] bytes, no control characters.
/// Cloning shares the text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityId(Arc<str>);

impl EntityId {
    /// Checks `id`; the error names the id and what is wrong with it.
    pub fn new(id: &str) -> Result<Self, EntityError> {
        let reason = if id.is_empty() {
            "must not be empty".to_string()
        } else if id.len() > MAX_ENTITY_ID_BYTES {
            format!("is {} bytes, more than {MAX_ENTITY_ID_BYTES}", id.len())
        } else if let Some(c) = id.chars().find(|c| c.is_control()) {
            format!("contains the control character {c:?}")
        } else {
            return Ok(EntityId(Arc::from(id)));
        };
        Err(EntityError::InvalidId {
            id: id.chars().take(64).collect(),
            reason,
        })
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The persistence id of this entity of type `type_name`: `{type}|{id}`.
    pub fn persistence_id(&self, type_name: &str) -> String {
        let mut pid = String::with_capacity(type_name.len() + 1 + self.0.len());
        pid.push_str(type_name);
        pid.push(PERSISTENCE_ID_SEPARATOR);
        pid.push_str(&self.0);
        pid
    }

    /// A stable 64-bit hash of the id (the same in every process and release), for picking
    /// the id's cluster shard (modulo the number of shards) and its host partition (from the
    /// high bits). Never Rust's randomized `Hash`: shards are agreed on across nodes.
    pub fn stable_hash(&self) -> u64 {
        let digest = blake3::hash(self.0.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest.as_bytes()[..8]);
        u64::from_le_bytes(first)
    }
}

impl fmt::Display for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntityId({:?})", &*self.0)
    }
}

/// Checks an entity type name: non-empty, at most 64 bytes of ASCII letters, digits, `-`, `_`
/// and `.` (it appears in URLs and persistence ids).
pub fn validate_type_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!(
            "entity type name {name:?} must be 1 to 64 bytes long"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "entity type name {name:?} contains {c:?}: only ASCII letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_ids_are_accepted_and_form_persistence_ids() {
        let id = EntityId::new("alice").unwrap();
        assert_eq!(id.persistence_id("account"), "account|alice");
        assert!(EntityId::new("a|b c/é").is_ok());
        assert!(EntityId::new(&"x".repeat(MAX_ENTITY_ID_BYTES)).is_ok());
    }

    #[test]
    fn invalid_ids_name_the_problem() {
        let err = |id: &str| EntityId::new(id).unwrap_err().to_string();
        assert!(err("").contains("must not be empty"), "{}", err(""));
        let long = "x".repeat(MAX_ENTITY_ID_BYTES + 1);
        assert!(err(&long).contains("more than 256"), "{}", err(&long));
        assert!(
            err("a\nb").contains("control character '\\n'"),
            "{}",
            err("a\nb")
        );
        assert!(err("a\u{0}").contains("control character"));
    }

    #[test]
    fn stable_hash_is_fixed_forever() {
        // A stored value: if this changes, ids move between shards across releases.
        let id = EntityId::new("alice").unwrap();
        assert_eq!(
            id.stable_hash(),
            EntityId::new("alice").unwrap().stable_hash()
        );
        assert_eq!(id.stable_hash(), STABLE_HASH_OF_ALICE);
    }

    const STABLE_HASH_OF_ALICE: u64 = 5_135_304_091_365_847_665;

    #[test]
    fn type_names_are_checked() {
        assert!(validate_type_name("account").is_ok());
        assert!(validate_type_name("shop.cart-v2").is_ok());
        assert!(validate_type_name("").is_err());
        assert!(validate_type_name("a|b").unwrap_err().contains("'|'"));
        assert!(validate_type_name("a/b").is_err());
    }
}
