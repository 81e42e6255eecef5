//! Kubernetes name rules the engine checks itself, so that a patch it emits is not rejected by the
//! API server after the fact (which would fail the whole pod creation).

fn is_alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

/// A label value: empty, or at most 63 characters of `[A-Za-z0-9_.-]` starting and ending with an
/// alphanumeric.
pub(crate) fn label_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    if v.len() > 63 {
        return Err(format!("must be at most 63 characters (is {})", v.len()));
    }
    let b = v.as_bytes();
    let ok_inner = b
        .iter()
        .all(|&c| is_alnum(c) || matches!(c, b'-' | b'_' | b'.'));
    if !ok_inner || !is_alnum(b[0]) || !is_alnum(b[b.len() - 1]) {
        return Err(
            "must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric"
                .into(),
        );
    }
    Ok(())
}

/// A qualified name (label and annotation keys): an optional DNS-subdomain prefix and `/`, then a
/// name of at most 63 characters.
pub(crate) fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return Err("name part must not be empty".into());
    }
    label_value(name).map_err(|e| format!("name part {e}"))?;
    if let Some(prefix) = prefix {
        dns_subdomain(prefix).map_err(|e| format!("prefix {e}"))?;
    }
    Ok(())
}

/// A DNS-1123 subdomain: at most 253 characters, lowercase alphanumerics, '-' and '.', starting
/// and ending with an alphanumeric.
pub(crate) fn dns_subdomain(v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    let b = v.as_bytes();
    let lower_alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !b.iter().all(|&c| lower_alnum(c) || c == b'-' || c == b'.')
        || !lower_alnum(b[0])
        || !lower_alnum(b[b.len() - 1])
    {
        return Err(
            "must be lowercase alphanumerics, '-' or '.', starting and ending with an alphanumeric"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_follow_kubernetes_rules() {
        assert!(label_value("").is_ok());
        assert!(label_value("a.b-c_d9").is_ok());
        assert!(label_value("-a").is_err());
        assert!(label_value("a b").is_err());
        assert!(label_value(&"a".repeat(64)).is_err());
    }

    #[test]
    fn qualified_names_accept_a_dns_prefix() {
        assert!(qualified_name("app").is_ok());
        assert!(qualified_name("splice.dev/inject").is_ok());
        assert!(qualified_name("Splice.dev/inject").is_err());
        assert!(qualified_name("splice.dev/").is_err());
        assert!(qualified_name("a/b/c").is_err());
        assert!(qualified_name("").is_err());
    }
}
