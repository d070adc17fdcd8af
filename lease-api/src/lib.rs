//! The lease service's HTTP JSON API on the wire: its paths, typed request
//! bodies, answers and errors. The service decodes and encodes exactly
//! these types, and every client (the `fencegate` CLI, the proxy's check of
//! plain tokens, the bench, the tests) builds its requests from them and
//! reads its answers into them, so the two ends cannot drift apart.
//!
//! | method | path ([`path`])              | body                     | answer                 |
//! |--------|------------------------------|--------------------------|------------------------|
//! | POST   | `/v1/locks/{lock}/acquire`   | [`AcquireRequest`]       | [`LeaseResponse`]      |
//! | POST   | `/v1/locks/{lock}/renew`     | [`RenewRequest`]         | [`LeaseResponse`]      |
//! | POST   | `/v1/locks/{lock}/release`   | [`ReleaseRequest`]       | [`ReleaseResponse`]    |
//! | GET    | `/v1/locks/{lock}`           |                          | [`LockStatusResponse`] |
//! | GET    | `/health`                    |                          | `{"status": "ok"}`     |
//!
//! Every refusal is an [`ErrorResponse`]: `{"error": {"code", "message",
//! ...}}`, its [`ErrorCode`] knowing its HTTP status.
//!
//! [`Client`] is the one client of the API: the CLI, the proxy's check of
//! plain tokens, the bench and the tests' async code all call it.

pub mod client;
mod wire;

pub use client::{Client, ClientError, Urls, UrlsError};
pub use wire::*;
