//! The type and encoding version of a stored payload.

use smol_str::SmolStr;

/// The type of a payload and the version of that type's encoding, so that an old event or
/// snapshot can be recognised and upcast by a later release.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Manifest {
    /// The payload's type name, e.g. `account.Deposited`. A replay hands the same name to
    /// thousands of events: up to 23 bytes it is stored inline and copied, longer ones are
    /// shared.
    pub type_name: SmolStr,
    /// The version of that type's encoding.
    pub version: u32,
}

impl Manifest {
    /// A manifest for `type_name` at `version`.
    pub fn new(type_name: impl Into<SmolStr>, version: u32) -> Self {
        Manifest {
            type_name: type_name.into(),
            version,
        }
    }
}
