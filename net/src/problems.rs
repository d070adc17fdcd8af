//! A configuration's problems, reported all at once: the services check
//! every setting before they bind, and an operator fixes every problem
//! in one pass instead of one per start.

/// Every problem of one configuration.
#[derive(Debug, thiserror::Error)]
#[error("invalid {what} configuration:\n  - {}", .problems.join("\n  - "))]
pub struct Invalid {
    what: &'static str,
    problems: Vec<String>,
}

/// `Ok` when `problems` is empty; otherwise all of them, as the
/// configuration of `what` (`"proxy"`, `"locksvc"`, `"dev"`).
pub fn none(what: &'static str, problems: Vec<String>) -> Result<(), Invalid> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Invalid { what, problems })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_problem_is_listed_under_its_configuration() {
        assert!(super::none("proxy", Vec::new()).is_ok());
        let e = super::none("proxy", vec!["a is bad".into(), "b too".into()])
            .expect_err("two problems");
        assert_eq!(
            e.to_string(),
            "invalid proxy configuration:\n  - a is bad\n  - b too"
        );
    }
}
