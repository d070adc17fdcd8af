//! A write whose connection to the store ended after its request may have
//! left whole, and before the store answered: the store closed it, a
//! middlebox reset it, or the answer could not be read. The store may hold
//! that request and still commit it, exactly as one it did not answer in
//! time. So the gate holds such a write the same way
//! (`gate::write::linger`) instead of letting a raise through at once.
//!
//! The store's two write clients (the lean forwarder's, `lean::conns`, and
//! the SDK's, `send_check::SdkClient`) mark such a failure with
//! [`NoAnswer`] among its error's sources ([`NoAnswer::mark`]); the gate
//! finds the mark with [`may_have_landed`], whichever client and error
//! conversion the failure went through.
//!
//! The standing check's refusal of a write's bytes ([`refusal`], made in
//! `send_check`) is told apart here too: such a request left at most in
//! part.
//!
//! A failure is not marked only when it is known that the request did not
//! leave whole: the connect failed, the standing check refused a write of
//! its bytes, hyper never started it, or its own body failed (the client's
//! body ended early or was cut; the store does not commit a body shorter
//! than its `Content-Length`). Anything else after hyper took the request
//! is marked, a store's unreadable answer included: a wrongly marked write
//! costs a raise `store_decision_secs`, a wrongly unmarked one may land
//! after a newer token was admitted. (hyper also counts as the caller's a
//! connection task dropped with a request in it, by a panic or the
//! runtime's end; that is the process failing, which the unclean-run
//! record covers: `Fences::load` waits out `store_decision_secs` after a
//! run that did not drain.)

use s3s::StdError as BoxError;
use std::error::Error;

/// The mark of a send that failed after its request may have left whole.
#[derive(Debug)]
pub struct NoAnswer(BoxError);

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no answer could be read from the store: {}", self.0)
    }
}

impl Error for NoAnswer {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

impl NoAnswer {
    /// `e`, the error of a send that hyper took (its connect succeeded),
    /// marked if the request may have left whole.
    pub fn mark(e: BoxError) -> BoxError {
        if left_in_part_at_most(&*e) {
            e
        } else {
            Box::new(NoAnswer(e))
        }
    }

    /// What ended the connection, with the causes under it (a client's
    /// error often names only its kind).
    pub fn cause(&self) -> String {
        let mut said: Vec<String> = Vec::new();
        for c in causes(&*self.0) {
            let text = c.to_string();
            if !said.iter().any(|s| s.contains(&text)) {
                said.push(text);
            }
        }
        said.join(": ")
    }
}

/// What a write refused before its bytes left fails with (inside an
/// `io::Error`, which hyper passes on): the standing check's refusal
/// (`send_check`).
#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("this replica's cluster standing ended: the request was not sent")
    }
}

impl Error for Refused {}

/// The error of a write of bytes the standing check refused.
pub fn refusal() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, Refused)
}

/// Whether `e` is the standing check's refusal: the request left at most
/// in part.
pub fn refused_here(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Refused>())
}

/// Whether `e` says that the request did not leave whole: the connect
/// failed, the standing check refused it, hyper never started it, or its
/// body failed on our side.
fn left_in_part_at_most(e: &(dyn Error + 'static)) -> bool {
    causes(e).any(|cause| {
        if let Some(h) = cause.downcast_ref::<hyper::Error>() {
            return h.is_user() || h.is_canceled() || h.is_body_write_aborted();
        }
        if let Some(h) = cause.downcast_ref::<hyper_util::client::legacy::Error>() {
            return h.is_connect();
        }
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(refused_here)
    })
}

/// `e` and its sources, in order.
fn causes<'a>(e: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(e), |&e: &&'a (dyn Error + 'static)| e.source())
}

/// The mark of the send that failed with `e`, if the write may still land.
pub fn may_have_landed(e: &s3s::S3Error) -> Option<&NoAnswer> {
    causes(e.source()?).find_map(|c| c.downcast_ref::<NoAnswer>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_known_to_stop_short_go_unmarked() {
        let reset: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let marked = NoAnswer::mark(reset);
        assert!(marked.is::<NoAnswer>(), "a reset after the send is marked");

        let refused: BoxError = Box::new(refusal());
        assert!(
            !NoAnswer::mark(refused).is::<NoAnswer>(),
            "a write the standing check refused left at most in part"
        );

        let mut e = s3s::S3Error::new(s3s::S3ErrorCode::InternalError);
        assert!(may_have_landed(&e).is_none());
        // Under the SDK's connector error, as `send_check::SdkClient` gives
        // it.
        e.set_source(Box::new(
            aws_smithy_runtime_api::client::result::ConnectorError::other(marked, None),
        ));
        assert_eq!(
            may_have_landed(&e).map(NoAnswer::cause),
            Some(std::io::Error::from(std::io::ErrorKind::ConnectionReset).to_string()),
            "the mark is found among the sources, with its cause"
        );
    }
}
