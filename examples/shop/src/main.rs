//! The shop's binary: a tessera node running carts and stock, with the whole `tessera`
//! command line (`shop node`, `shop members`, `shop entity cart alice '{"get": null}'`...).

use std::process::ExitCode;
use tessera::{EntitySettings, NodeBuilder};
use tessera_example_shop::{Cart, Stock, routes};

// ANCHOR: wiring
fn main() -> ExitCode {
    NodeBuilder::new()
        .entity(Cart)
        .entity_with(Stock, EntitySettings::new().snapshot_every(50))
        .routes(routes)
        .main()
}
// ANCHOR_END: wiring
