//! What a projection's handler gets: one event of its entity type, decoded, with where it is.

use tessera_entities::EntityType;

/// One acknowledged event of entity type `E`.
#[derive(Debug)]
pub struct Envelope<E: EntityType> {
    /// The log: `<entity type>|<entity id>`.
    pub persistence_id: String,
    /// The entity's id.
    pub entity_id: String,
    /// The event's position in its log, from 1: within a log, handlers see these in order.
    pub sequence_nr: u64,
    /// When the event was written, in milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Its slice, `0..1024`.
    pub slice: u16,
    /// The tags it was written with.
    pub tags: Vec<String>,
    /// The event.
    pub event: E::Event,
}
