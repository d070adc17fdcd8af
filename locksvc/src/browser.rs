//! What keeps web pages out of the lease service.
//!
//! A page the operator opens can make the browser send requests to the
//! lease service (it is on the operator's machine or network), and with
//! DNS rebinding (the page's own name made to resolve to the service) it can
//! also read the answers: a granted lease, signed token and S3 secret
//! included. Browsers always say where a request comes from, so two rules
//! keep them out:
//!
//! - **Host.** A rebound page's requests carry the page's own name in
//!   `Host` (`attacker.example`). The service answers only to names it
//!   knows ([`AllowedHosts`]): IP literals (no DNS, so nothing to rebind),
//!   `localhost` and `*.localhost` (browsers resolve them to loopback
//!   themselves), and the names in `allowed_hosts`; `"*"` turns the check
//!   off. The port is not compared (a rebound page must use the service's
//!   port anyway, and port mappings change it). A request without `Host`
//!   (HTTP/1.0) is not a browser's and passes; every `Host` and the
//!   authority of an absolute request target are checked. Everything but
//!   `/health` is checked, the status page included.
//! - **Shape.** On the JSON API (`/v1/`), a request with an `Origin` header
//!   is refused: browsers send it with every cross-origin request and every
//!   POST, and no client of the API does. A request with a body must
//!   declare it `application/json` (parameters such as `charset` allowed):
//!   the only bodies a page can send without asking the service first
//!   (CORS) are `text/plain`, form data and untyped. A POST with no body
//!   and no type passes on, to be told what body it lacks.
//!
//! The decisions are pure functions shared with the proxy
//! (`fencegate_net::browser`); the two middlewares here apply them and
//! count refusals. The refusal ([`Refusal`]) becomes the API's JSON error
//! in `api`.

pub use fencegate_net::browser::{AllowedHosts, Refusal, check_host, check_shape, entry_problem};

use crate::metrics::Metrics;
use axum::body::HttpBody as _;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// A refusal on its way to the client (answered as the API's JSON error,
/// in `api`).
#[derive(Debug)]
pub struct Refused(pub Refusal);

/// What the middlewares need.
#[derive(Debug, Clone)]
pub struct Rules {
    pub hosts: AllowedHosts,
    pub metrics: Arc<Metrics>,
}

/// The Host rule as a middleware, for every path but `/health`.
pub async fn host_rule(
    State(rules): State<Arc<Rules>>,
    req: Request,
    next: Next,
) -> Result<Response, Refused> {
    if !matches!(req.uri().path(), "/health" | "/ready")
        && let Err(refusal) = check_host(req.headers(), req.uri(), &rules.hosts)
    {
        rules.metrics.refused(refusal.reason());
        return Err(Refused(refusal));
    }
    Ok(next.run(req).await)
}

/// The shape rule as a middleware, for the JSON API's routes.
pub async fn shape_rule(
    State(rules): State<Arc<Rules>>,
    req: Request,
    next: Next,
) -> Result<Response, Refused> {
    let empty = req.body().size_hint().exact() == Some(0);
    if let Err(refusal) = check_shape(req.method(), req.headers(), empty) {
        rules.metrics.refused(refusal.reason());
        return Err(Refused(refusal));
    }
    Ok(next.run(req).await)
}
