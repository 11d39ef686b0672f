//! Reading a node's `GET /metrics` (Prometheus text) for the few series the soak watches.

use std::net::SocketAddr;
use std::time::Duration;
use tessera_harness::http_client;

/// The node's metrics text; None when it does not answer with 200 in time.
pub async fn metrics_text(http: SocketAddr, timeout: Duration) -> Option<String> {
    let response = http_client::get(http, "/metrics", timeout).await.ok()?;
    (response.status == 200).then_some(response.body)
}

/// The value of `series` (a name with its labels, exactly as the node writes it, e.g.
/// `tessera_entities_live{type="account"}`), as a whole number.
pub fn series_value(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        let value: f64 = value.split_whitespace().next()?.parse().ok()?;
        (value >= 0.0).then_some(value as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_found_by_its_name_and_labels_exactly() {
        let text = "# TYPE tessera_entities_live gauge\n\
                    tessera_entities_live{type=\"account\"} 17\n\
                    tessera_entities_live_total 3\n\
                    tessera_ddata_keys 8.0\n";
        assert_eq!(
            series_value(text, "tessera_entities_live{type=\"account\"}"),
            Some(17)
        );
        assert_eq!(series_value(text, "tessera_ddata_keys"), Some(8));
        assert_eq!(series_value(text, "tessera_entities_live"), None);
        assert_eq!(series_value(text, "tessera_transport_peers"), None);
    }
}
