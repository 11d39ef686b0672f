//! `cart`: items go in and out until the cart is checked out.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera::{Effect, EntityType};

// ANCHOR: cart
/// A shopping cart: items go in and out until it is checked out.
pub struct Cart;

/// Over HTTP: `{"add": {"product": "socks", "quantity": 2}}`, `{"remove": "socks"}`, `"get"`...
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CartCommand {
    Add { product: String, quantity: u32 },
    Remove(String),
    Checkout,
    Get,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CartEvent {
    Added { product: String, quantity: u32 },
    Removed(String),
    CheckedOut,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CartState {
    pub items: BTreeMap<String, u32>, // product -> quantity
    pub checked_out: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CartRejection {
    CheckedOut,
    Empty,
    NoQuantity,
}

impl EntityType for Cart {
    type Command = CartCommand;
    type Event = CartEvent;
    type State = CartState;
    type Reply = CartState;
    type Rejection = CartRejection; // shown with its Display, below
    // Stored with every event and snapshot: never changed (versions are bumped instead).
    const TYPE_NAME: &'static str = "cart";
    const EVENT_MANIFEST: &'static str = "shop.CartEvent";
    const STATE_MANIFEST: &'static str = "shop.CartState";

    fn initial_state(&self, _cart_id: &str) -> CartState {
        CartState::default()
    }

    fn handle_command(&self, cart: &CartState, command: CartCommand) -> Effect<Self> {
        match command {
            CartCommand::Get => Effect::reply(cart.clone()),
            _ if cart.checked_out => Effect::reject(CartRejection::CheckedOut),
            CartCommand::Add { quantity: 0, .. } => Effect::reject(CartRejection::NoQuantity),
            CartCommand::Add { product, quantity } => {
                Effect::persist(CartEvent::Added { product, quantity }).then_reply(Clone::clone)
            }
            CartCommand::Remove(product) => {
                Effect::persist(CartEvent::Removed(product)).then_reply(Clone::clone)
            }
            CartCommand::Checkout if cart.items.is_empty() => Effect::reject(CartRejection::Empty),
            CartCommand::Checkout => {
                Effect::persist(CartEvent::CheckedOut).then_reply(Clone::clone)
            }
        }
    }

    fn apply_event(&self, cart: &mut CartState, event: &CartEvent) {
        match event {
            CartEvent::Added { product, quantity } => {
                let held = cart.items.entry(product.clone()).or_default();
                *held = held.saturating_add(*quantity);
            }
            CartEvent::Removed(product) => {
                cart.items.remove(product);
            }
            CartEvent::CheckedOut => cart.checked_out = true,
        }
    }
}
// ANCHOR_END: cart

impl std::fmt::Display for CartRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CartRejection::CheckedOut => "the cart is checked out",
            CartRejection::Empty => "an empty cart cannot be checked out",
            CartRejection::NoQuantity => "a quantity of 0 adds nothing",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera::testkit::EntityTestKit;

    // ANCHOR: cart_test
    #[test]
    fn a_checked_out_cart_takes_no_more_items() {
        let mut cart = EntityTestKit::new(Cart, "alice").unwrap();
        let socks = || CartCommand::Add {
            product: "socks".into(),
            quantity: 2,
        };
        let added = cart.run(socks()).unwrap();
        assert_eq!(
            added.events,
            [CartEvent::Added {
                product: "socks".into(),
                quantity: 2
            }]
        );
        let checked_out = cart.run(CartCommand::Checkout).unwrap();
        assert_eq!(checked_out.events, [CartEvent::CheckedOut]);
        let late = cart.run(socks()).unwrap();
        assert_eq!(late.reply, Err(CartRejection::CheckedOut));
        assert!(late.events.is_empty(), "a rejection persists nothing");
        // A new incarnation recovers the same state from the stored events.
        cart.restart().unwrap();
        assert!(cart.state().checked_out);
        assert_eq!(cart.state().items["socks"], 2);
    }
    // ANCHOR_END: cart_test

    #[test]
    fn an_empty_cart_cannot_check_out_and_nothing_adds_nothing() {
        let mut cart = EntityTestKit::new(Cart, "bob").unwrap();
        assert_eq!(
            cart.run(CartCommand::Checkout).unwrap().reply,
            Err(CartRejection::Empty)
        );
        let none = CartCommand::Add {
            product: "hat".into(),
            quantity: 0,
        };
        assert_eq!(
            cart.run(none).unwrap().reply,
            Err(CartRejection::NoQuantity)
        );
        assert!(cart.events().unwrap().is_empty());
    }
}
