//! The bearer-token check in front of every route: `Authorization: Bearer <http_token>`.
//!
//! Who needs the token:
//! - a mutating request (any method but GET, HEAD and OPTIONS) whenever a token is configured;
//! - every request when [`HttpSettings::token_required_for_reads`] is set, which the node does
//!   when HTTP binds a non-loopback address;
//! - never `/health/*` (process supervisors and load balancers probe it) nor
//!   `/bootstrap/seed-nodes` (nodes that are not members yet ask it).
//!
//! Without a configured token the mutating endpoints stay open: the node allows running
//! without a token only when HTTP binds loopback, where only local processes reach it. If reads
//! are required and still no token is configured, every protected request is refused (fail
//! closed) rather than served.
//!
//! The check runs as middleware, before any extractor or handler: a refused request changes
//! nothing and its body is never read.

use super::settings::HttpSettings;
use super::stats::HttpStats;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Path prefix that never needs the token: liveness and readiness probes.
const HEALTH_PREFIX: &str = "/health/";
/// Path that never needs the token: Cluster Bootstrap asks it before the node is a member.
const SEED_NODES_PATH: &str = "/bootstrap/seed-nodes";

/// Whether `path` is a health probe, open to everyone and exempt from the concurrency limit.
pub(super) fn is_health(path: &str) -> bool {
    path.starts_with(HEALTH_PREFIX)
}

/// Whether `path` is served without a token whatever the settings.
fn is_always_open(path: &str) -> bool {
    is_health(path) || path == SEED_NODES_PATH || DASHBOARD_ASSETS.contains(&path)
}

/// The dashboard's page, script and style: static, compiled into the binary, no cluster data
/// in them (the page asks for the token before it reads anything), so a browser can load
/// them on a node that requires the token for reads.
const DASHBOARD_ASSETS: [&str; 3] = ["/", "/dashboard/app.js", "/dashboard/style.css"];

/// Whether `method` only reads.
fn is_read_only(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Wraps every route of `router` (fallbacks included) in the token check of `settings`;
/// refusals are counted in `stats`.
pub(super) fn protect(router: Router, settings: &HttpSettings, stats: Arc<HttpStats>) -> Router {
    let policy = TokenPolicy {
        // Only the digest is kept: comparing two blake3 hashes is constant-time, and hashing
        // first also hides the token's length from a timing observer.
        expected: settings
            .token
            .as_deref()
            .map(|token| blake3::hash(token.as_bytes())),
        reads_required: settings.token_required_for_reads,
        stats,
    };
    router.layer(middleware::from_fn_with_state(Arc::new(policy), check))
}

/// What the middleware decides with.
struct TokenPolicy {
    /// blake3 of the configured token, or None when no token is configured.
    expected: Option<blake3::Hash>,
    /// Reads need the token too.
    reads_required: bool,
    stats: Arc<HttpStats>,
}

/// Why a request was refused. The message never contains what the client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// No `Authorization: Bearer <token>` header (or an empty token).
    Missing,
    /// A bearer token that is not the configured one.
    Wrong,
    /// The endpoint needs a token, but the node has none configured.
    NotConfigured,
}

impl TokenPolicy {
    fn needs_token(&self, method: &Method, path: &str) -> bool {
        !is_always_open(path) && (self.reads_required || !is_read_only(method))
    }

    fn verdict(&self, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), Refusal> {
        if !self.needs_token(method, path) {
            return Ok(());
        }
        let Some(expected) = &self.expected else {
            // Mutations without a token are open by design on loopback (see the module doc);
            // a node that requires the token for reads without having one refuses everything.
            return if self.reads_required {
                Err(Refusal::NotConfigured)
            } else {
                Ok(())
            };
        };
        let presented = bearer_token(headers).ok_or(Refusal::Missing)?;
        if blake3::hash(presented.as_bytes()) == *expected {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive, as RFC
/// 7235 says), or None when the header is absent, of another scheme or has an empty token.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (message, challenge) = match self {
            Refusal::Missing => (
                "missing bearer token: send `Authorization: Bearer <http_token>`",
                r#"Bearer realm="tessera""#,
            ),
            Refusal::Wrong => (
                "wrong bearer token",
                r#"Bearer realm="tessera", error="invalid_token""#,
            ),
            Refusal::NotConfigured => (
                "this endpoint requires a bearer token, but the node has no http_token configured",
                r#"Bearer realm="tessera""#,
            ),
        };
        let mut response = super::ApiError::new(StatusCode::UNAUTHORIZED, message).into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
        response
    }
}

/// The middleware: refuses with 401 before the route runs, or passes the request on.
async fn check(State(policy): State<Arc<TokenPolicy>>, request: Request, next: Next) -> Response {
    match policy.verdict(request.method(), request.uri().path(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            policy.stats.count_unauthorized();
            refusal.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(token: Option<&str>, reads_required: bool) -> TokenPolicy {
        TokenPolicy {
            expected: token.map(|t| blake3::hash(t.as_bytes())),
            reads_required,
            stats: Arc::default(),
        }
    }

    fn authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_other_schemes_are_missing_tokens() {
        assert_eq!(
            bearer_token(&authorization("Bearer s3cret")),
            Some("s3cret")
        );
        assert_eq!(
            bearer_token(&authorization("bearer  s3cret ")),
            Some("s3cret")
        );
        assert_eq!(bearer_token(&authorization("Basic czNjcmV0")), None);
        assert_eq!(bearer_token(&authorization("Bearer ")), None);
        assert_eq!(bearer_token(&authorization("s3cret")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn mutations_need_the_token_reads_only_when_required_and_probes_never() {
        let open_reads = policy(Some("t"), false);
        let none = HeaderMap::new();
        let good = authorization("Bearer t");
        assert_eq!(
            open_reads.verdict(&Method::GET, "/cluster/members", &none),
            Ok(())
        );
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            assert_eq!(
                open_reads.verdict(&method, "/cluster/join", &none),
                Err(Refusal::Missing)
            );
            assert_eq!(open_reads.verdict(&method, "/cluster/join", &good), Ok(()));
        }
        let closed_reads = policy(Some("t"), true);
        assert_eq!(
            closed_reads.verdict(&Method::GET, "/cluster/members", &none),
            Err(Refusal::Missing)
        );
        assert_eq!(
            closed_reads.verdict(&Method::GET, "/cluster/members", &authorization("Bearer x")),
            Err(Refusal::Wrong)
        );
        for path in ["/health/alive", "/health/ready", SEED_NODES_PATH] {
            assert_eq!(closed_reads.verdict(&Method::GET, path, &none), Ok(()));
        }
    }

    #[test]
    fn without_a_token_mutations_are_open_unless_reads_are_required() {
        let none = HeaderMap::new();
        assert_eq!(
            policy(None, false).verdict(&Method::PUT, "/cluster/members/a:1", &none),
            Ok(())
        );
        assert_eq!(
            policy(None, true).verdict(&Method::GET, "/cluster/members", &none),
            Err(Refusal::NotConfigured)
        );
        assert_eq!(
            policy(None, true).verdict(&Method::GET, "/health/alive", &none),
            Ok(())
        );
    }

    #[test]
    fn an_empty_configured_token_matches_nothing() {
        let empty = policy(Some(""), false);
        for value in ["Bearer ", "Bearer", "Bearer  "] {
            assert_eq!(
                empty.verdict(&Method::POST, "/cluster/join", &authorization(value)),
                Err(Refusal::Missing)
            );
        }
    }
}
