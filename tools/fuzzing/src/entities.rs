//! Target of what the node's entities read: commands (JSON, from the HTTP API or from
//! another node's region), entity ids, and events and snapshots from the journal.

use super::assert_round_trip;
use tessera_entities::{Codec, EntityId, EntityType, Manifest};
use tessera_example_account::{Account, AccountCommand, AccountState};

/// Target `entity_codec`: the first byte chooses what the rest is: a JSON command (decoded
/// as a region does, into a value then the entity's command type), an entity id, or an
/// `account` event or snapshot payload under its manifest (decoded, replayed onto a state,
/// encoded again) or under another manifest (which must be refused: there is no upcaster).
pub fn entity_codec(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let codec = Codec::<Account>::new();
    match mode % 5 {
        0 => {
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(rest) {
                let _ = serde_json::from_value::<AccountCommand>(value);
            }
        }
        1 => {
            if let Ok(id) = std::str::from_utf8(rest)
                && let Ok(entity) = EntityId::new(id)
            {
                let _ = entity.persistence_id(Account::TYPE_NAME);
                let _ = entity.stable_hash();
            }
        }
        2 => {
            let manifest = codec.event_manifest().clone();
            if let Ok(event) = codec.decode_event(&Account, &manifest, rest) {
                let mut state = Account.initial_state("fuzz");
                Account.apply_event(&mut state, &event);
                assert_round_trip(
                    "account event",
                    &event,
                    |e| codec.encode_event(e).map(|(_, bytes)| bytes.to_vec()),
                    |b| codec.decode_event(&Account, &manifest, b),
                );
            }
        }
        3 => {
            let manifest = codec.state_manifest().clone();
            if let Ok(state) = codec.decode_state(&Account, &manifest, rest) {
                assert_round_trip(
                    "account state",
                    &state,
                    |s: &AccountState| codec.encode_state(s).map(|(_, bytes)| bytes.to_vec()),
                    |b| codec.decode_state(&Account, &manifest, b),
                );
            }
        }
        _ => {
            // A manifest version from the input: anything but the current one is unknown.
            let version = rest.first().map_or(0, |&v| u32::from(v));
            let manifest = Manifest::new(Account::EVENT_MANIFEST, version);
            let decoded = codec.decode_event(&Account, &manifest, rest);
            assert!(
                decoded.is_err() || version == Account::EVENT_VERSION,
                "an event under an unknown manifest was decoded"
            );
        }
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    use super::*;
    use tessera_example_account::AccountEvent;

    /// Seeds of `entity_codec`: commands, ids, events and a state.
    pub fn entity_codec() -> Vec<Vec<u8>> {
        let codec = Codec::<Account>::new();
        let mut seeds: Vec<Vec<u8>> = [
            &br#"{"deposit": 5}"#[..],
            br#"{"withdraw": 18446744073709551615}"#,
            br#"{"get": null}"#,
        ]
        .iter()
        .map(|json| [&[0u8][..], json].concat())
        .collect();
        seeds.push([&[1u8][..], b"alice"].concat());
        for event in [
            AccountEvent::Deposited { amount: 5 },
            AccountEvent::Withdrawn { amount: u64::MAX },
        ] {
            if let Ok((_, bytes)) = codec.encode_event(&event) {
                seeds.push([&[2u8][..], &bytes].concat());
                seeds.push([&[4u8][..], &bytes].concat());
            }
        }
        if let Ok((_, bytes)) = codec.encode_state(&AccountState { balance: 300 }) {
            seeds.push([&[3u8][..], &bytes].concat());
        }
        seeds
    }
}
