//! The fence decision (design rule 3): lower rejects, equal and higher admit.

/// What the resource does with a write carrying a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The write may proceed. `raises` is true when the token is higher than
    /// every token seen before: the caller must make the new maximum durable
    /// (and drain older writes) before applying the write.
    Admit { raises: bool },
    /// The token is lower than `max`, the highest token already admitted; the
    /// writer has lost its lease and must stop.
    Stale { max: u64 },
}

/// Decides a write with `token` against the highest admitted token `max`
/// (0 when none has been admitted yet; tokens start at 1).
///
/// Equal tokens are admitted: a holder writes many times under one lease.
/// Rejecting `token <= max` would lock every holder out after its first
/// write.
pub fn decide(max: u64, token: u64) -> Verdict {
    if token < max {
        Verdict::Stale { max }
    } else {
        Verdict::Admit {
            raises: token > max,
        }
    }
}

/// `token` is below `max`: a write carrying it is refused as stale.
pub fn is_stale(max: u64, token: u64) -> bool {
    matches!(decide(max, token), Verdict::Stale { .. })
}

/// `token` is above `max`: admitting it raises the max (and cuts the
/// writes admitted below it).
pub fn raises(max: u64, token: u64) -> bool {
    decide(max, token) == Verdict::Admit { raises: true }
}

/// `max` has reached `token`: a write carrying `token` needs no raise (it
/// is admitted if equal, refused if below).
pub fn reached(max: u64, token: u64) -> bool {
    !raises(max, token)
}

/// The fence state of one resource: the highest admitted token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fence {
    max: u64,
}

impl Fence {
    /// A fence that has already admitted `max`.
    pub fn with_max(max: u64) -> Fence {
        Fence { max }
    }

    /// The highest token admitted so far (0 if none).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Decides `token` and, when it is admitted and higher, raises the max.
    pub fn admit(&mut self, token: u64) -> Verdict {
        let verdict = decide(self.max, token);
        if let Verdict::Admit { raises: true } = verdict {
            self.max = token;
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_questions_agree_with_the_decision() {
        for (max, token) in [(7, 6), (7, 7), (7, 8), (0, 1), (0, 0)] {
            let verdict = decide(max, token);
            assert_eq!(
                is_stale(max, token),
                matches!(verdict, Verdict::Stale { .. })
            );
            assert_eq!(
                raises(max, token),
                verdict == Verdict::Admit { raises: true }
            );
            assert_eq!(reached(max, token), !raises(max, token));
        }
        assert!(is_stale(7, 6) && !is_stale(7, 7) && !is_stale(7, 8));
        assert!(raises(7, 8) && !raises(7, 7) && !raises(7, 6));
    }

    #[test]
    fn lower_rejects_with_the_max() {
        let mut f = Fence::with_max(7);
        assert_eq!(f.admit(6), Verdict::Stale { max: 7 });
        assert_eq!(f.max(), 7);
    }

    #[test]
    fn equal_admits_without_raising() {
        let mut f = Fence::with_max(7);
        for _ in 0..3 {
            assert_eq!(f.admit(7), Verdict::Admit { raises: false });
        }
        assert_eq!(f.max(), 7);
    }

    #[test]
    fn higher_admits_and_raises() {
        let mut f = Fence::default();
        assert_eq!(f.admit(1), Verdict::Admit { raises: true });
        assert_eq!(f.admit(9), Verdict::Admit { raises: true });
        assert_eq!(f.max(), 9);
        assert_eq!(f.admit(1), Verdict::Stale { max: 9 });
    }
}
