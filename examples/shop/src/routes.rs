//! The shop's own HTTP route, beside the node's API: `POST /shop/checkout/{cart}` checks the
//! cart out and reserves its items' stock, asking both entity types by typed references
//! (each wherever in the cluster it runs).

use crate::{Cart, CartCommand, Stock, StockCommand};
use tessera::axum::extract::{Path, State};
use tessera::axum::http::StatusCode;
use tessera::axum::routing::post;
use tessera::axum::{Json, Router};
use tessera::{AskError, NodeHandle};

/// What a checkout answers: each product with what is left of it, or why it is not reserved.
#[derive(serde::Serialize)]
pub struct Checkout {
    pub reserved: Vec<(String, u64)>,
    pub refused: Vec<(String, String)>,
}

// ANCHOR: routes
/// The shop's routes, merged into the node's HTTP API.
pub fn routes(node: NodeHandle) -> Router {
    Router::new()
        .route("/shop/checkout/{cart}", post(checkout))
        .with_state(node)
}

async fn checkout(
    State(node): State<NodeHandle>,
    Path(cart): Path<String>,
) -> Result<Json<Checkout>, (StatusCode, String)> {
    let cart = match node
        .entity_ref::<Cart>(cart)
        .ask(CartCommand::Checkout)
        .await
    {
        Ok(cart) => cart,
        Err(AskError::Rejected(why)) => return Err((StatusCode::CONFLICT, why.to_string())),
        Err(AskError::Failed(failure)) => {
            return Err((StatusCode::SERVICE_UNAVAILABLE, failure.to_string()));
        }
    };
    let mut answer = Checkout {
        reserved: Vec::new(),
        refused: Vec::new(),
    };
    for (product, quantity) in cart.items {
        let stock = node.entity_ref::<Stock>(product.as_str());
        match stock.ask(StockCommand::Reserve(quantity)).await {
            Ok(left) => answer.reserved.push((product, left)),
            Err(error) => answer.refused.push((product, error.to_string())),
        }
    }
    Ok(Json(answer))
}
// ANCHOR_END: routes
