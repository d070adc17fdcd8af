//! Cutting a wire format's text into its fields at an ASCII byte: exactly a
//! signed token's four, a SigV4 credential scope's five; or all of them,
//! the signed header names, a key's segments.

/// `text` cut at every `sep` (ASCII) into its fields, in order: as
/// `str::split` cuts it, by a plain scan of the bytes (a `char` searcher
/// costs more than the scan on texts this short).
pub fn split(text: &str, sep: u8) -> impl Iterator<Item = &str> {
    debug_assert!(sep.is_ascii());
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let t = rest?;
        match t.bytes().position(|b| b == sep) {
            Some(i) => {
                // An ASCII byte is a character boundary.
                rest = t.get(i + 1..);
                t.get(..i)
            }
            None => {
                rest = None;
                Some(t)
            }
        }
    })
}

/// `text` cut at every `sep` (ASCII) into exactly `N` fields; `None` if it
/// has more or fewer.
pub fn exact<const N: usize>(text: &str, sep: u8) -> Option<[&str; N]> {
    let mut parts = split(text, sep);
    let mut fields = [""; N];
    for field in &mut fields {
        *field = parts.next()?;
    }
    parts.next().is_none().then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::{exact, split};

    #[test]
    fn exactly_n_fields_or_none() {
        assert_eq!(exact::<3>("a:b:c", b':'), Some(["a", "b", "c"]));
        assert_eq!(exact::<3>("a::c", b':'), Some(["a", "", "c"]));
        assert_eq!(exact::<3>("a:b", b':'), None, "fewer");
        assert_eq!(exact::<3>("a:b:c:d", b':'), None, "more");
        assert_eq!(exact::<1>("", b':'), Some([""]));
    }

    #[test]
    fn split_cuts_as_str_split() {
        for text in [
            "", ";", ";;", "a", "a;", ";a", "a;b", "a;;b", "é;ü;", "ab;cd;ef", "x;é",
        ] {
            assert_eq!(
                split(text, b';').collect::<Vec<_>>(),
                text.split(';').collect::<Vec<_>>(),
                "{text:?}"
            );
        }
    }
}
