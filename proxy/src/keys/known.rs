//! What the proxy knows of a stored object ([`Known`]), and how the ETag
//! cache keeps it ([`Kept`]), compactly: the cache holds up to
//! `etag_cache_entries` of them (100,000 by default), and most stores give
//! a single-part object an MD5 ETag, 32 hex digits, which fit in 16 bytes
//! where a `String` costs an allocation of its own (BENCHMARKS.md, "Does
//! one proxy stay flat over a million keys?").

/// What the proxy knows of a stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    Absent,
    Present { etag: String, token: u64 },
}

impl Known {
    /// The token of the stored object (0 when absent or untagged).
    pub fn token(&self) -> u64 {
        match self {
            Known::Absent => 0,
            Known::Present { token, .. } => *token,
        }
    }
}

/// A [`Known`] as the cache keeps it; turned back into the same `Known`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kept {
    Absent,
    /// An ETag of 32 lowercase hex digits, as its 16 bytes.
    Md5 {
        digest: [u8; 16],
        token: u64,
    },
    /// Any other ETag, as its text.
    Text {
        etag: Box<str>,
        token: u64,
    },
}

/// The 16 bytes of `etag` if it is 32 lowercase hex digits (uppercase
/// ones stay text, so the ETag comes back as the store wrote it).
fn md5_digest(etag: &str) -> Option<[u8; 16]> {
    let hex = etag.as_bytes();
    if hex.len() != 32 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut digest = [0u8; 16];
    for (byte, pair) in digest.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(digest)
}

impl From<Known> for Kept {
    fn from(known: Known) -> Kept {
        match known {
            Known::Absent => Kept::Absent,
            Known::Present { etag, token } => match md5_digest(&etag) {
                Some(digest) => Kept::Md5 { digest, token },
                None => Kept::Text {
                    etag: etag.into_boxed_str(),
                    token,
                },
            },
        }
    }
}

impl From<&Kept> for Known {
    fn from(kept: &Kept) -> Known {
        match kept {
            Kept::Absent => Known::Absent,
            Kept::Md5 { digest, token } => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut etag = String::with_capacity(32);
                for b in digest {
                    etag.push(char::from(HEX[usize::from(b >> 4)]));
                    etag.push(char::from(HEX[usize::from(b & 15)]));
                }
                Known::Present {
                    etag,
                    token: *token,
                }
            }
            Kept::Text { etag, token } => Known::Present {
                etag: etag.to_string(),
                token: *token,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(etag: &str) -> (Kept, Known) {
        let known = Known::Present {
            etag: etag.to_owned(),
            token: 7,
        };
        let kept = Kept::from(known.clone());
        let back = Known::from(&kept);
        assert_eq!(back, known, "{etag:?} comes back as it went in");
        (kept, back)
    }

    #[test]
    fn every_etag_comes_back_as_the_store_wrote_it() {
        let (kept, _) = round_trip("0123456789abcdef0123456789abcdef");
        assert!(
            matches!(kept, Kept::Md5 { .. }),
            "an MD5 is kept in 16 bytes"
        );
        for other in [
            "0123456789ABCDEF0123456789ABCDEF",
            "0123456789abcdef0123456789abcdef-3",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdeg",
            "",
            "*",
            "W/abc",
            "é",
        ] {
            let (kept, _) = round_trip(other);
            assert!(matches!(kept, Kept::Text { .. }), "{other:?} stays text");
        }
        assert_eq!(Known::from(&Kept::from(Known::Absent)), Known::Absent);
    }
}
