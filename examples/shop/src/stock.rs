//! `stock`: how many of one product the shop has, restocked and reserved.

use serde::{Deserialize, Serialize};
use tessera::{Effect, EntityType};

/// The stock of one product (the entity id is the product).
pub struct Stock;

/// What a product's stock is asked: `{"restock": 10}`, `{"reserve": 2}`, `"get"`. Every reply
/// is the number available.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StockCommand {
    Restock(u32),
    Reserve(u32),
    Get,
}

/// What a product's stock persists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StockEvent {
    Restocked(u32),
    Reserved(u32),
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StockRejection {
    Insufficient { available: u64, requested: u32 },
}

impl std::fmt::Display for StockRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StockRejection::Insufficient {
                available,
                requested,
            } => write!(f, "{requested} requested, {available} available"),
        }
    }
}

impl EntityType for Stock {
    type Command = StockCommand;
    type Event = StockEvent;
    type State = u64;
    type Reply = u64;
    type Rejection = StockRejection;
    const TYPE_NAME: &'static str = "stock";
    const EVENT_MANIFEST: &'static str = "shop.StockEvent";
    const STATE_MANIFEST: &'static str = "shop.StockState";

    fn initial_state(&self, _product: &str) -> u64 {
        0
    }

    fn handle_command(&self, available: &u64, command: StockCommand) -> Effect<Self> {
        match command {
            StockCommand::Get => Effect::reply(*available),
            StockCommand::Restock(n) => {
                Effect::persist(StockEvent::Restocked(n)).then_reply(|a| *a)
            }
            StockCommand::Reserve(n) if u64::from(n) > *available => {
                Effect::reject(StockRejection::Insufficient {
                    available: *available,
                    requested: n,
                })
            }
            StockCommand::Reserve(n) => Effect::persist(StockEvent::Reserved(n)).then_reply(|a| *a),
        }
    }

    fn apply_event(&self, available: &mut u64, event: &StockEvent) {
        match event {
            StockEvent::Restocked(n) => *available = available.saturating_add(u64::from(*n)),
            StockEvent::Reserved(n) => *available = available.saturating_sub(u64::from(*n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera::testkit::{EntityTestKit, TestKitSettings};

    #[test]
    fn reservations_never_take_more_than_is_available() {
        let mut socks = EntityTestKit::new(Stock, "socks").unwrap();
        assert_eq!(socks.run(StockCommand::Restock(3)).unwrap().reply, Ok(3));
        assert_eq!(socks.run(StockCommand::Reserve(2)).unwrap().reply, Ok(1));
        let refused = socks.run(StockCommand::Reserve(2)).unwrap();
        assert_eq!(
            refused.reply,
            Err(StockRejection::Insufficient {
                available: 1,
                requested: 2
            })
        );
        assert_eq!(
            socks.events().unwrap(),
            [StockEvent::Restocked(3), StockEvent::Reserved(2)]
        );
    }

    #[test]
    fn stock_recovers_from_its_snapshots() {
        let settings = TestKitSettings {
            snapshot_every: 50,
            ..TestKitSettings::default()
        };
        let mut hats = EntityTestKit::with_settings(Stock, "hats", settings).unwrap();
        for _ in 0..120 {
            hats.run(StockCommand::Restock(1)).unwrap();
        }
        hats.restart().unwrap();
        assert_eq!(*hats.state(), 120);
    }
}
