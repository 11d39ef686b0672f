//! The entity types a node runs, as its HTTP API sees them: each type's JSON face, by name.

mod json;
mod registry;

pub use json::{JsonEntity, JsonFace};
pub use registry::JsonEntities;
