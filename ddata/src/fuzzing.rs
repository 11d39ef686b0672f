//! What the fuzz targets of the root package (`tessera::fuzzing`) need of this crate's
//! internals: the durable store's record codec, without a store. Not an API.

use crate::durable;
use crate::envelope::DataEnvelope;

/// The envelope of a durable record `value` stored under `key` (checksum verified).
pub fn decode_durable_record(key: &[u8], value: &[u8]) -> Result<DataEnvelope, String> {
    durable::decode_record(key, value)
}

/// The durable record of `envelope` stored under `key`.
pub fn encode_durable_record(key: &[u8], envelope: &DataEnvelope) -> Result<Vec<u8>, String> {
    durable::encode_record(key, envelope)
}

/// `body` sealed as a durable record stored under `key`.
pub fn seal_durable_record(key: &[u8], body: &[u8]) -> Vec<u8> {
    durable::seal_record(key, body)
}
