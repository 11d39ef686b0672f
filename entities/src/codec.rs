//! How events and state are stored: postcard bytes under a [`Manifest`] (type name + version),
//! and the way back, through the entity type's upcaster for anything written under another
//! manifest.
//!
//! postcard is compact and documented, but not self-describing: a payload is only readable
//! with the exact type that wrote it. That is what the manifest is for: a release that changes
//! `Event` bumps [`EntityType::EVENT_VERSION`] and keeps the old type around to decode (and
//! convert) what the previous release stored.

use crate::entity::EntityType;
pub use crate::error::CodecError;
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::marker::PhantomData;
use tessera_journal::Manifest;

/// Decodes a postcard payload as `T`, naming the manifest on failure. Upcasters use it to read
/// an old version's type before converting it.
pub fn decode_postcard<T: DeserializeOwned>(
    manifest: &Manifest,
    payload: &[u8],
) -> Result<T, CodecError> {
    postcard::from_bytes(payload).map_err(|e| CodecError::Decode {
        manifest_type: manifest.type_name.to_string(),
        manifest_version: manifest.version,
        reason: e.to_string(),
    })
}

fn encode_postcard<T: Serialize>(manifest: &Manifest, value: &T) -> Result<Bytes, CodecError> {
    postcard::to_allocvec(value)
        .map(Bytes::from)
        .map_err(|e| CodecError::Encode {
            manifest_type: manifest.type_name.to_string(),
            reason: e.to_string(),
        })
}

/// The encoder and decoder of one entity type's events and state. Holds the current manifests
/// so that every stored event shares one allocation of the name.
pub struct Codec<E: EntityType> {
    event_manifest: Manifest,
    state_manifest: Manifest,
    _entity: PhantomData<fn() -> E>,
}

impl<E: EntityType> Default for Codec<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: EntityType> Codec<E> {
    /// The codec of `E`'s current manifests.
    pub fn new() -> Self {
        Codec {
            event_manifest: Manifest::new(E::EVENT_MANIFEST, E::EVENT_VERSION),
            state_manifest: Manifest::new(E::STATE_MANIFEST, E::STATE_VERSION),
            _entity: PhantomData,
        }
    }

    /// The manifest events are written under.
    pub fn event_manifest(&self) -> &Manifest {
        &self.event_manifest
    }

    /// The manifest snapshots are written under.
    pub fn state_manifest(&self) -> &Manifest {
        &self.state_manifest
    }

    /// Encodes an event under the current manifest.
    pub fn encode_event(&self, event: &E::Event) -> Result<(Manifest, Bytes), CodecError> {
        let payload = encode_postcard(&self.event_manifest, event)?;
        Ok((self.event_manifest.clone(), payload))
    }

    /// Decodes a stored event: directly under the current manifest, through
    /// [`EntityType::upcast_event`] under any other.
    pub fn decode_event(
        &self,
        entity: &E,
        manifest: &Manifest,
        payload: &[u8],
    ) -> Result<E::Event, CodecError> {
        if *manifest == self.event_manifest {
            decode_postcard(manifest, payload)
        } else {
            entity.upcast_event(manifest, payload)
        }
    }

    /// Encodes a state under the current manifest.
    pub fn encode_state(&self, state: &E::State) -> Result<(Manifest, Bytes), CodecError> {
        let payload = encode_postcard(&self.state_manifest, state)?;
        Ok((self.state_manifest.clone(), payload))
    }

    /// Decodes a stored state: directly under the current manifest, through
    /// [`EntityType::upcast_state`] under any other.
    pub fn decode_state(
        &self,
        entity: &E,
        manifest: &Manifest,
        payload: &[u8],
    ) -> Result<E::State, CodecError> {
        if *manifest == self.state_manifest {
            decode_postcard(manifest, payload)
        } else {
            entity.upcast_state(manifest, payload)
        }
    }
}
