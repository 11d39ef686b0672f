//! What the fuzz targets of the root package (`tessera::fuzzing`) need of this crate's
//! internals: the codecs of the coordinator's stored state and of remembered entities, as the
//! stores read them. Not an API.

use crate::remember::RememberEvent;
use crate::state::{CoordinatorState, StateEvent};
use crate::store::{StoreError, StoredState, from_stored, to_stored};

/// The state in a snapshot of the coordinator's log (`state_store_mode = persistence`), as
/// `JournalStore::load` reads it.
pub fn decode_snapshot_state(payload: &[u8]) -> Result<CoordinatorState, StoreError> {
    let stored: StoredState =
        postcard::from_bytes(payload).map_err(|e| StoreError::Fatal(e.to_string()))?;
    from_stored(stored)
}

/// The payload of a snapshot of `state`.
pub fn encode_snapshot_state(state: &CoordinatorState) -> Result<Vec<u8>, StoreError> {
    postcard::to_allocvec(&to_stored(state)).map_err(|e| StoreError::Fatal(e.to_string()))
}

/// The state in the register of the coordinator's key (`state_store_mode = ddata`), as
/// `DdataStore::load` reads it.
pub fn decode_json_state(text: &str) -> Result<CoordinatorState, StoreError> {
    let stored: StoredState =
        serde_json::from_str(text).map_err(|e| StoreError::Fatal(e.to_string()))?;
    from_stored(stored)
}

/// The register value of `state`.
pub fn encode_json_state(state: &CoordinatorState) -> Result<String, StoreError> {
    serde_json::to_string(&to_stored(state)).map_err(|e| StoreError::Fatal(e.to_string()))
}

/// An event of the coordinator's log.
pub fn decode_state_event(payload: &[u8]) -> Result<StateEvent, postcard::Error> {
    postcard::from_bytes(payload)
}

/// The payload of an event of the coordinator's log.
pub fn encode_state_event(event: &StateEvent) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(event)
}

/// An event of a shard's remembered entities: whether they started (else stopped), and their
/// ids.
pub fn decode_remember_event(payload: &[u8]) -> Result<(bool, Vec<String>), postcard::Error> {
    Ok(match postcard::from_bytes(payload)? {
        RememberEvent::Started(ids) => (true, ids),
        RememberEvent::Stopped(ids) => (false, ids),
    })
}

/// The payload of an event of a shard's remembered entities.
pub fn encode_remember_event(started: bool, ids: Vec<String>) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(&if started {
        RememberEvent::Started(ids)
    } else {
        RememberEvent::Stopped(ids)
    })
}
