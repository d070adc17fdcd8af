//! Cutting a wire format's text into its fields: a signed token's four, a
//! SigV4 credential scope's five.

/// `text` cut at every `sep` into exactly `N` fields; `None` if it has
/// more or fewer.
pub fn exact<const N: usize>(text: &str, sep: char) -> Option<[&str; N]> {
    let mut parts = text.split(sep);
    let mut fields = [""; N];
    for field in &mut fields {
        *field = parts.next()?;
    }
    parts.next().is_none().then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::exact;

    #[test]
    fn exactly_n_fields_or_none() {
        assert_eq!(exact::<3>("a:b:c", ':'), Some(["a", "b", "c"]));
        assert_eq!(exact::<3>("a::c", ':'), Some(["a", "", "c"]));
        assert_eq!(exact::<3>("a:b", ':'), None, "fewer");
        assert_eq!(exact::<3>("a:b:c:d", ':'), None, "more");
        assert_eq!(exact::<1>("", ':'), Some([""]));
    }
}
