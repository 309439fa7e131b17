//! The page fetcher of deep research, safe against server-side request forgery: only http and
//! https, never a loopback, private, link-local, metadata or otherwise internal destination,
//! judged on the address actually connected to (a guarding DNS resolver), redirects followed
//! by hand with every hop re-checked, a cap on the decompressed body and one deadline for the
//! whole fetch.
//!
//! Where each check happens:
//! - [`Fetcher::fetch`] parses the URL and, on every hop, refuses other schemes, hosts that are
//!   internal by name (`localhost`, `metadata.google.internal`, …) and IP-literal hosts with a
//!   forbidden address (reqwest connects to IP literals without asking the resolver);
//! - [`GuardedResolver`] resolves every other host name and refuses it when any of its
//!   addresses is forbidden, so a name cannot be pointed at an internal address between a check
//!   and the connection (DNS rebinding);
//! - [`is_forbidden`] is the address policy, a pure function.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use url::{Host, Url};

use crate::text::extract::{self, ExtractError};

/// Longest URL quoted in an error message.
const MAX_URL_IN_MESSAGE: usize = 200;

/// Host names that reach cloud metadata services or the local machine whatever they resolve to.
const FORBIDDEN_NAMES: &[&str] = &[
    "localhost",
    "localhost.localdomain",
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "instance-data",
    "instance-data.ec2.internal",
];

/// Limits and the test-only allowlist of a [`Fetcher`].
#[derive(Debug, Clone)]
pub struct FetchPolicy {
    /// Cap on the decompressed body.
    pub max_body_bytes: usize,
    /// Deadline for the whole fetch: every redirect, the body and the extraction.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub max_redirects: usize,
    pub user_agent: String,
    /// TEST-ONLY: exact `ip:port` pairs that may be connected to although their address is
    /// forbidden (a local test server). Empty in production.
    pub allow: Vec<SocketAddr>,
}

impl Default for FetchPolicy {
    fn default() -> Self {
        Self {
            max_body_bytes: 5 * 1024 * 1024,
            timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(5),
            max_redirects: 5,
            user_agent: format!("mnemo/{} (+research)", env!("CARGO_PKG_VERSION")),
            allow: Vec::new(),
        }
    }
}

/// A fetched page and its readable text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedPage {
    /// The final URL, after redirects, without credentials.
    pub url: String,
    pub status: u16,
    pub content_type: String,
    pub title: Option<String>,
    pub text: String,
    /// Length of the decompressed body.
    pub bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("invalid url: {0}")]
    InvalidUrl(String),
    /// The URL (credentials removed) whose scheme is not http or https.
    #[error("refusing {0}: only http and https urls are fetched")]
    Scheme(String),
    #[error("refusing {url}: {reason}")]
    Refused { url: String, reason: String },
    #[error("too many redirects")]
    TooManyRedirects,
    #[error("the body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the fetch timed out")]
    Timeout,
    #[error("the server answered with status {0}")]
    Status(u16),
    #[error("network error: {0}")]
    Network(String),
    #[error("no text could be extracted: {0}")]
    Extract(String),
}

impl FetchError {
    /// Whether fetching the URL again would fail the same way (its content cannot be read,
    /// is too large, or the URL is refused): a research remembers it as a bad source.
    pub(crate) fn is_permanent(&self) -> bool {
        matches!(
            self,
            FetchError::InvalidUrl(_)
                | FetchError::Scheme(_)
                | FetchError::Refused { .. }
                | FetchError::TooLarge { .. }
                | FetchError::Extract(_)
        )
    }

    /// Stable, lowercase name of the variant, for metrics, events and tool results.
    pub fn label(&self) -> &'static str {
        match self {
            FetchError::InvalidUrl(_) => "invalid_url",
            FetchError::Scheme(_) => "scheme",
            FetchError::Refused { .. } => "refused",
            FetchError::TooManyRedirects => "too_many_redirects",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::Timeout => "timeout",
            FetchError::Status(_) => "status",
            FetchError::Network(_) => "network",
            FetchError::Extract(_) => "extract",
        }
    }
}

/// Fetches pages under a [`FetchPolicy`]. Cheap to clone; clones share one connection pool.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    policy: Arc<FetchPolicy>,
}

impl Fetcher {
    pub fn new(policy: FetchPolicy) -> Result<Self, FetchError> {
        let resolver = GuardedResolver;
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(resolver))
            .connect_timeout(policy.connect_timeout)
            .timeout(policy.timeout)
            .user_agent(policy.user_agent.clone())
            .build()
            .map_err(|error| {
                FetchError::Network(format!("cannot build the http client: {error}"))
            })?;
        Ok(Self {
            client,
            policy: Arc::new(policy),
        })
    }

    /// Fetches `url`, following at most `max_redirects` redirects, and extracts its text.
    pub async fn fetch(&self, url: &str) -> Result<FetchedPage, FetchError> {
        tokio::time::timeout(self.policy.timeout, self.fetch_within_deadline(url))
            .await
            .unwrap_or(Err(FetchError::Timeout))
    }

    async fn fetch_within_deadline(&self, url: &str) -> Result<FetchedPage, FetchError> {
        let mut current = Url::parse(url.trim())
            .map_err(|error| FetchError::InvalidUrl(format!("{}: {error}", quoted(url))))?;
        let mut redirects = 0;
        loop {
            self.check_url(&current)?;
            let response = self
                .client
                .get(current.clone())
                .send()
                .await
                .map_err(|error| request_error(&current, &error))?;
            let status = response.status().as_u16();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let Some(location) = response.headers().get(LOCATION) else {
                    return Err(FetchError::Status(status));
                };
                if redirects == self.policy.max_redirects {
                    return Err(FetchError::TooManyRedirects);
                }
                redirects += 1;
                let location = location.to_str().map_err(|_| {
                    FetchError::InvalidUrl(format!(
                        "{} redirects to a location that is not text",
                        display_url(&current)
                    ))
                })?;
                current = current.join(location).map_err(|error| {
                    FetchError::InvalidUrl(format!(
                        "{} redirects to {}: {error}",
                        display_url(&current),
                        quoted(location)
                    ))
                })?;
                continue;
            }
            if !(200..300).contains(&status) {
                return Err(FetchError::Status(status));
            }
            return self.read_page(current, status, response).await;
        }
    }

    /// Refuses a URL the fetcher must not connect to, before any connection is made.
    fn check_url(&self, url: &Url) -> Result<(), FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::Scheme(display_url(url)));
        }
        let refused = |reason: String| FetchError::Refused {
            url: display_url(url),
            reason,
        };
        let port = url
            .port_or_known_default()
            .ok_or_else(|| FetchError::InvalidUrl(format!("{} has no port", display_url(url))))?;
        let ip = match url.host() {
            None => {
                return Err(FetchError::InvalidUrl(format!(
                    "{} has no host",
                    display_url(url)
                )));
            }
            Some(Host::Domain(name)) => {
                return if is_forbidden_name(name) {
                    Err(refused(format!("{name:?} is an internal host name")))
                } else {
                    // Checked address by address when it is resolved.
                    Ok(())
                };
            }
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
        };
        if is_forbidden(ip) && !self.policy.allow.contains(&SocketAddr::new(ip, port)) {
            return Err(refused(format!("{ip} is not a public address")));
        }
        Ok(())
    }

    /// Reads the body under the size cap and extracts its text.
    async fn read_page(
        &self,
        url: Url,
        status: u16,
        response: reqwest::Response,
    ) -> Result<FetchedPage, FetchError> {
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string();
        // An unsupported type is known from the header alone; do not download it.
        if let Err(ExtractError::Unsupported(kind)) = extract::by_content_type(&content_type, &[]) {
            return Err(FetchError::Extract(format!(
                "{}: unsupported content type {kind:?}",
                display_url(&url)
            )));
        }
        let limit = self.policy.max_body_bytes;
        // Present only when the body is not compressed; a compressed body is counted as it
        // is inflated.
        if response
            .content_length()
            .is_some_and(|length| length > limit as u64)
        {
            return Err(FetchError::TooLarge { limit });
        }
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|error| request_error(&url, &error))?;
            if body.len() + chunk.len() > limit {
                return Err(FetchError::TooLarge { limit });
            }
            body.extend_from_slice(&chunk);
        }
        let bytes = body.len();
        let extracted = extract::extract_isolated(&content_type, body)
            .await
            .map_err(|error| FetchError::Extract(format!("{}: {error}", display_url(&url))))?;
        Ok(FetchedPage {
            url: display_url(&url),
            status,
            content_type,
            title: extracted.title,
            text: extracted.text,
            bytes,
        })
    }
}

/// Whether `ip` is an address the fetcher must never connect to: anything that is not a public
/// unicast address (loopback, unspecified, private, shared, link-local, multicast, broadcast,
/// reserved, documentation, benchmarking, IETF protocol assignments, unique- and site-local).
/// IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64, 6to4) are judged by the
/// embedded address; Teredo is refused.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_forbidden_v4(ip),
        IpAddr::V6(ip) => is_forbidden_v6(ip),
    }
}

fn is_forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0 // "this network", 0.0.0.0/8
        || a == 10 // private
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT), 100.64/10
        || a == 127 // loopback
        || (a == 169 && b == 254) // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b)) // private, 172.16/12
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation (TEST-NET-1)
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast
        || (a == 192 && b == 168) // private
        || (a == 198 && (18..20).contains(&b)) // benchmarking, 198.18/15
        || (a == 198 && b == 51 && c == 100) // documentation (TEST-NET-2)
        || (a == 203 && b == 0 && c == 113) // documentation (TEST-NET-3)
        || a >= 224 // multicast 224/4, reserved 240/4, broadcast
}

fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    let embedded = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    match segments {
        // IPv4-mapped, ::ffff:a.b.c.d
        [0, 0, 0, 0, 0, 0xffff, high, low] => is_forbidden_v4(embedded(high, low)),
        // IPv4-compatible (deprecated), ::a.b.c.d; also :: and ::1, whose embedded
        // addresses 0.0.0.0 and 0.0.0.1 are forbidden
        [0, 0, 0, 0, 0, 0, high, low] => is_forbidden_v4(embedded(high, low)),
        // NAT64, 64:ff9b::a.b.c.d
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] => is_forbidden_v4(embedded(high, low)),
        // 6to4, 2002:aabb:ccdd::/48
        [0x2002, high, low, ..] => is_forbidden_v4(embedded(high, low)),
        // IETF protocol assignments 2001::/23: Teredo, benchmarking, ORCHID, …
        [0x2001, second, ..] if second < 0x200 => true,
        // documentation
        [0x2001, 0xdb8, ..] => true,
        [first, ..] if first & 0xfff0 == 0x3ff0 => true, // 3fff::/20
        // Everything outside global unicast 2000::/3 (unique-local fc00::/7, link-local
        // fe80::/10, site-local fec0::/10, multicast ff00::/8, discard 100::/64, the rest
        // of ::/8 and the unassigned space)
        [first, ..] => first & 0xe000 != 0x2000,
    }
}

/// Whether a host name is internal whatever it resolves to.
fn is_forbidden_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    FORBIDDEN_NAMES.contains(&name.as_str()) || name.ends_with(".localhost") || name.is_empty()
}

/// A host name that resolves to an address the fetcher may not connect to.
#[derive(Debug, thiserror::Error)]
#[error("{host:?} resolves to {address}, which is not a public address")]
struct ResolvedToForbidden {
    host: String,
    address: IpAddr,
}

/// Resolves host names with the system resolver and refuses a name when any of its addresses
/// is forbidden. The test allowlist does not apply here: reqwest asks for the name alone,
/// without the port, so an exact `ip:port` cannot be matched, and matching the IP alone would
/// open every port of an allowlisted address to any name that resolves to it. Allowlisted
/// servers are therefore reached by IP-literal URLs only.
#[derive(Debug)]
struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            // Port 0: the connector replaces it with the port of the URL.
            let addresses: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(forbidden) = addresses
                .iter()
                .map(SocketAddr::ip)
                .find(|ip| is_forbidden(*ip))
            {
                return Err(Box::new(ResolvedToForbidden {
                    host,
                    address: forbidden,
                })
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addresses.into_iter()) as Addrs)
        })
    }
}

/// Maps a reqwest error: a refusal by the resolver, a timeout, or a network failure with its
/// cause chain.
fn request_error(url: &Url, error: &reqwest::Error) -> FetchError {
    let mut causes = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(refusal) = cause.downcast_ref::<ResolvedToForbidden>() {
            return FetchError::Refused {
                url: display_url(url),
                reason: refusal.to_string(),
            };
        }
        causes.push(cause.to_string());
        source = cause.source();
    }
    if error.is_timeout() {
        return FetchError::Timeout;
    }
    causes.dedup();
    let what = if error.is_connect() {
        "cannot connect"
    } else if error.is_body() || error.is_decode() {
        "cannot read the body"
    } else {
        "the request failed"
    };
    FetchError::Network(format!(
        "{}: {what}: {}",
        display_url(url),
        causes.join(": ")
    ))
}

/// The URL without user name and password, shortened for messages.
fn display_url(url: &Url) -> String {
    let mut shown = url.clone();
    // Fails only for URLs that cannot carry credentials.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    quoted(shown.as_str())
}

/// Text from outside, shortened for messages.
fn quoted(text: &str) -> String {
    if text.len() <= MAX_URL_IN_MESSAGE {
        return text.to_string();
    }
    let mut end = MAX_URL_IN_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl crate::error::HasKind for FetchError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            FetchError::InvalidUrl(_) | FetchError::Scheme(_) | FetchError::Refused { .. } => {
                ErrorKind::BadRequest
            }
            FetchError::TooLarge { .. } => ErrorKind::PayloadTooLarge,
            FetchError::Timeout => ErrorKind::Timeout,
            FetchError::TooManyRedirects
            | FetchError::Status(_)
            | FetchError::Network(_)
            | FetchError::Extract(_) => ErrorKind::Unavailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn public_addresses_are_allowed() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "169.253.255.255",
            "192.167.1.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450:4001::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            let ip: IpAddr = ip.parse().expect("test address");
            assert!(!is_forbidden(ip), "{ip} should be allowed");
        }
    }

    #[test]
    fn internal_addresses_are_forbidden() {
        for ip in [
            // IPv4
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.254",
            "127.0.0.1",
            "127.1.2.3",
            "169.254.169.254",
            "169.254.0.1",
            "172.16.0.1",
            "172.20.10.5",
            "172.31.255.255",
            "192.0.0.1",
            "192.0.0.170",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.0.1",
            "192.168.255.255",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            // IPv6
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:7f00:1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.1.1.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2002:c0a8:101::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:2::1",
            "2001:db8::1",
            "3fff::1",
            "100::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "ff05::1:3",
            "::ffff:0:7f00:1",
            "1::1",
        ] {
            let ip: IpAddr = ip.parse().expect("test address");
            assert!(is_forbidden(ip), "{ip} should be forbidden");
        }
    }

    #[test]
    fn internal_names_are_refused() {
        for name in [
            "localhost",
            "LOCALHOST.",
            "foo.localhost",
            "a.b.localhost.",
            "metadata",
            "metadata.google.internal",
            "Metadata.Google.Internal.",
            "instance-data",
        ] {
            assert!(is_forbidden_name(name), "{name} should be refused");
        }
        for name in ["example.com", "localhost.example.com", "metadata.example"] {
            assert!(!is_forbidden_name(name), "{name} should be allowed");
        }
    }

    /// The url crate turns every numeric spelling of an IPv4 address into `Host::Ipv4`, so the
    /// literal check sees the address (reqwest never resolves such hosts).
    #[test]
    fn numeric_hosts_are_parsed_as_ipv4() {
        for url in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0x7f.0.0.1/",
            "http://0177.0.0.1/",
            "http://017700000001/",
            "http://127.0.0.1./",
            "http://0x7F.1/",
            "http://１２７.０.０.１/",
            "http://127。0。0。1/",
        ] {
            let parsed = Url::parse(url).expect("test url");
            assert_eq!(
                parsed.host(),
                Some(Host::Ipv4(Ipv4Addr::LOCALHOST)),
                "{url}"
            );
        }
    }

    fn fetcher(allow: Vec<SocketAddr>) -> Fetcher {
        Fetcher::new(FetchPolicy {
            allow,
            ..FetchPolicy::default()
        })
        .expect("fetcher")
    }

    #[test]
    fn literal_hosts_are_checked_with_their_port() {
        let fetcher = fetcher(vec!["127.0.0.1:8080".parse().expect("addr")]);
        let check = |url: &str| fetcher.check_url(&Url::parse(url).expect("test url"));
        assert!(check("http://127.0.0.1:8080/page").is_ok());
        assert!(check("http://8.8.8.8/").is_ok());
        assert!(check("https://example.com/").is_ok());
        for url in [
            "http://127.0.0.1:8081/",
            "http://127.0.0.1/",
            "http://[::1]:8080/",
            "http://user:secret@10.0.0.1/",
            "http://localhost:8080/",
        ] {
            let error = check(url).expect_err(url);
            assert_eq!(error.label(), "refused", "{url}: {error}");
            assert!(!error.to_string().contains("secret"), "{error}");
        }
        let error = check("file:///etc/passwd").expect_err("file");
        assert_eq!(error.label(), "scheme");
    }

    #[tokio::test]
    async fn the_resolver_refuses_names_of_internal_addresses() {
        let name = Name::from_str("localhost").expect("name");
        let error = match GuardedResolver.resolve(name).await {
            Ok(addrs) => panic!("localhost resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(error) => error,
        };
        assert!(
            error.downcast_ref::<ResolvedToForbidden>().is_some(),
            "{error}"
        );

        // A public address passes, with port 0 for the connector to replace.
        let name = Name::from_str("8.8.8.8").expect("name");
        let addrs: Vec<SocketAddr> = GuardedResolver
            .resolve(name)
            .await
            .expect("public")
            .collect();
        assert_eq!(
            addrs,
            vec!["8.8.8.8:0".parse::<SocketAddr>().expect("addr")]
        );
    }

    #[test]
    fn messages_hide_credentials_and_long_urls() {
        let url = Url::parse("https://alice:hunter2@example.com/a").expect("url");
        assert_eq!(display_url(&url), "https://example.com/a");
        let long = format!("data:text/plain,{}", "x".repeat(1000));
        assert!(quoted(&long).chars().count() <= MAX_URL_IN_MESSAGE + 1);
    }
}
