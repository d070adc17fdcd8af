//! Virtual-hosted-style addressing: which requests name their bucket in the
//! `Host` header (`backups.s3.example.com/key`) instead of the path
//! (`s3.example.com/backups/key`).
//!
//! A host is virtual-hosted only under a configured domain
//! (`virtual_host_domains`, default `localhost`): `<bucket>.<domain>`
//! names a bucket, `<domain>` itself is path style. Every other host (an IP
//! address, a name nobody configured) is path style, so a proxy reached by
//! an unexpected name never mistakes a host for a bucket.

use s3s::S3Result;
use s3s::host::{S3Host, VirtualHost};

/// The configured virtual-host domains.
#[derive(Debug, Clone)]
pub struct VirtualHosts {
    /// Lowercase, without a port.
    domains: Vec<String>,
}

impl VirtualHosts {
    pub fn new(domains: &[String]) -> VirtualHosts {
        VirtualHosts {
            domains: domains.iter().map(|d| d.to_ascii_lowercase()).collect(),
        }
    }

    /// The bucket a `Host` header names, if it is virtual-hosted.
    pub fn bucket<'h>(&self, host: &'h str) -> Option<&'h str> {
        let name = without_port(host);
        self.domains.iter().find_map(|domain| {
            let (bucket, rest) = name.split_at_checked(name.len().checked_sub(domain.len())?)?;
            let bucket = bucket.strip_suffix('.')?;
            (rest.eq_ignore_ascii_case(domain) && !bucket.is_empty()).then_some(bucket)
        })
    }
}

/// `host` without a trailing `:port`.
fn without_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

impl S3Host for VirtualHosts {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        Ok(match self.bucket(host) {
            Some(bucket) => VirtualHost::new(host).with_bucket(bucket),
            None => VirtualHost::new(host),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hosts_under_a_configured_domain_name_a_bucket() {
        let v = VirtualHosts::new(&["localhost".into(), "S3.Example.com".into()]);
        for (host, bucket) in [
            ("backups.localhost:9000", Some("backups")),
            ("backups.localhost", Some("backups")),
            ("my.dotted.bucket.s3.example.com", Some("my.dotted.bucket")),
            ("Backups.S3.EXAMPLE.com:443", Some("Backups")),
            ("localhost:9000", None),
            ("s3.example.com", None),
            (".localhost", None),
            ("notlocalhost", None),
            ("backups.otherhost:9000", None),
            ("127.0.0.1:9000", None),
            ("[::1]:9000", None),
            ("", None),
        ] {
            assert_eq!(v.bucket(host), bucket, "{host}");
        }
    }
}
