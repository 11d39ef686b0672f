//! A shop built on tessera: shopping carts and the stock of each product, two event-sourced
//! entity types sharded over the cluster, and a checkout route that asks both.

mod cart;
mod routes;
mod stock;

pub use cart::{Cart, CartCommand, CartEvent, CartRejection, CartState};
pub use routes::routes;
pub use stock::{Stock, StockCommand, StockEvent, StockRejection};
