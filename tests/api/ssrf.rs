//! The page fetcher against server-side request forgery: a table of internal destinations,
//! spelled every way we know and reached directly or through redirects from an allowlisted
//! local site, must all be refused before any connection to a canary listener; plus the body
//! cap (a gzip bomb), the deadline (servers that trickle), status and content-type errors.

use crate::support::site;

use std::time::{Duration, Instant};

use mnemo::search::fetch::{FetchError, FetchPolicy, Fetcher};
use site::{Canary, TestSite};

/// A fetcher that may reach `site` and nothing else that is internal. Short timeouts so a
/// broken check fails fast instead of hanging on an unroutable address.
fn fetcher_for(site: &TestSite) -> Fetcher {
    // Pages are read by the mnemo binary as a worker process, as in the server.
    crate::support::use_extraction_worker();
    Fetcher::new(FetchPolicy {
        timeout: Duration::from_secs(3),
        connect_timeout: Duration::from_secs(1),
        allow: vec![site.addr],
        ..FetchPolicy::default()
    })
    .expect("fetcher")
}

/// Every URL that must be refused, with the error kind expected.
fn refused_urls(canary: u16, site: &TestSite) -> Vec<(String, &'static str)> {
    let p = canary;
    let mut table: Vec<(String, &'static str)> = Vec::new();
    let mut add = |kind: &'static str, urls: Vec<String>| {
        table.extend(urls.into_iter().map(|url| (url, kind)));
    };

    // Loopback, spelled every way, aimed at the canary.
    add(
        "refused",
        vec![
            format!("http://127.0.0.1:{p}/"),
            format!("http://127.1:{p}/"),
            format!("http://127.0.1:{p}/"),
            format!("http://2130706433:{p}/"),
            format!("http://0x7f000001:{p}/"),
            format!("http://0x7f.0.0.1:{p}/"),
            format!("http://0x7f.0x0.0x0.0x1:{p}/"),
            "http://0x7f.0.0.1/".to_string(),
            format!("http://0177.0.0.1:{p}/"),
            "http://0177.0.0.1/".to_string(),
            format!("http://0177.0000.0000.0001:{p}/"),
            format!("http://017700000001:{p}/"),
            format!("http://127.0.0.1.:{p}/"),
            format!("http://127.0.0.2:{p}/"),
            format!("http://127.255.255.254:{p}/"),
            format!("http://[::1]:{p}/"),
            format!("http://[0:0:0:0:0:0:0:1]:{p}/"),
            "http://[0:0:0:0:0:0:0:1]/".to_string(),
            format!("http://[::ffff:127.0.0.1]:{p}/"),
            format!("http://[::ffff:7f00:1]:{p}/"),
            format!("http://[0:0:0:0:0:ffff:127.0.0.1]:{p}/"),
            format!("http://[::127.0.0.1]:{p}/"),
            format!("http://[64:ff9b::127.0.0.1]:{p}/"),
            format!("http://[2002:7f00:1::]:{p}/"),
            format!("http://localhost:{p}/"),
            format!("http://LOCALHOST:{p}/"),
            format!("http://localhost.:{p}/"),
            format!("http://localhost.localdomain:{p}/"),
            format!("http://foo.localhost:{p}/"),
            format!("http://a.b.localhost:{p}/"),
            format!("http://0.0.0.0:{p}/"),
            format!("http://0:{p}/"),
            "http://0.0.0.0/".to_string(),
            format!("http://[::]:{p}/"),
            format!("http://１２７.０.０.１:{p}/"),
            format!("http://127。0。0。1:{p}/"),
            format!("https://127.0.0.1:{p}/"),
            format!("https://localhost:{p}/"),
            "http://127.0.0.1/".to_string(),
            format!("http://127.0.0.1:{p}/admin?delete=all"),
            format!("HTTP://127.0.0.1:{p}/"),
            // The site's own address on another port: the allowlist is exact.
            format!("http://127.0.0.1:{}/", site.addr.port().wrapping_add(1)),
        ],
    );

    // User-info and fragment tricks: the host is what follows the last `@` of the authority.
    add(
        "refused",
        vec![
            format!("http://evil.com@127.0.0.1:{p}/"),
            format!("http://user:secret@127.0.0.1:{p}/"),
            format!("http://evil.com:80@127.0.0.1:{p}/"),
            format!("http://127.0.0.1:{p}#@evil.com"),
            format!("http://127.0.0.1:{p}?@evil.com/"),
            format!("http://127.0.0.1:{p}\\@evil.com/"),
            format!("http://evil.com@localhost:{p}/"),
        ],
    );

    // Private, shared, link-local and metadata destinations.
    add(
        "refused",
        [
            "http://10.0.0.1/",
            "http://10.1.2.3/",
            "http://10.255.255.254:8080/",
            "http://172.16.0.1/",
            "http://172.17.0.1/",
            "http://172.20.0.5/",
            "http://172.24.1.1/",
            "http://172.31.255.254/",
            "http://192.168.0.1/",
            "http://192.168.1.1/",
            "http://192.168.255.255/",
            "http://100.64.0.1/",
            "http://100.100.100.200/latest/meta-data/",
            "http://100.127.255.254/",
            "http://169.254.169.254/",
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
            "http://169.254.169.254/computeMetadata/v1/",
            "http://169.254.170.2/v2/credentials",
            "http://0xa9fea9fe/latest/meta-data/",
            "http://2852039166/latest/meta-data/",
            "http://[::ffff:169.254.169.254]/latest/meta-data/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[2002:a9fe:a9fe::]/",
            "http://[fd00:ec2::254]/latest/meta-data/",
            "http://metadata.google.internal/computeMetadata/v1/",
            "http://METADATA.google.internal./computeMetadata/v1/",
            "http://metadata/computeMetadata/v1/",
            "http://instance-data/latest/meta-data/",
            "http://[fe80::1]/",
            "http://[fc00::1]/",
            "http://[fec0::1]/",
            "http://[::ffff:10.0.0.1]/",
            "http://[::ffff:192.168.1.1]/",
            "http://224.0.0.1/",
            "http://239.255.255.250:1900/",
            "http://[ff02::1]/",
            "http://255.255.255.255/",
            "http://240.0.0.1/",
            "http://198.18.0.1/",
            "http://192.0.0.8/",
            "http://192.0.2.1/",
            "http://198.51.100.1/",
            "http://203.0.113.1/",
            "http://[2001:db8::1]/",
            "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
        ]
        .iter()
        .map(std::string::ToString::to_string)
        .collect(),
    );

    // Schemes other than http and https.
    add(
        "scheme",
        vec![
            "file:///etc/passwd".to_string(),
            "file://localhost/etc/passwd".to_string(),
            "FILE:///etc/passwd".to_string(),
            format!("ftp://127.0.0.1:{p}/"),
            "ftp://example.com/file".to_string(),
            format!("gopher://127.0.0.1:{p}/_GET%20/"),
            "data:text/plain,hello".to_string(),
            "data:text/html;base64,PGgxPng8L2gxPg==".to_string(),
            "javascript:alert(1)".to_string(),
            format!("dict://127.0.0.1:{p}/info"),
            format!("ldap://127.0.0.1:{p}/"),
            format!("sftp://127.0.0.1:{p}/"),
            format!("ws://127.0.0.1:{p}/"),
            "wss://example.com/".to_string(),
            format!("jar:http://127.0.0.1:{p}/x.jar!/"),
            format!("tftp://127.0.0.1:{p}/x"),
            "netdoc:///etc/passwd".to_string(),
            format!("view-source:http://127.0.0.1:{p}/"),
        ],
    );

    // Not URLs at all.
    add(
        "invalid_url",
        vec![
            format!("127.0.0.1:{p}"),
            format!("//127.0.0.1:{p}/"),
            "http://".to_string(),
            "http://256.0.0.1/".to_string(),
            "http://[fe80::1%25eth0]/".to_string(),
            String::new(),
        ],
    );

    // Redirects from the allowlisted site: every redirect status to the canary, then other
    // spellings and destinations.
    let canary_url = format!("http://127.0.0.1:{p}/");
    add(
        "refused",
        [301, 302, 303, 307, 308]
            .iter()
            .map(|status| site.redirect(*status, &canary_url))
            .collect(),
    );
    add(
        "refused",
        [
            format!("http://localhost:{p}/"),
            format!("http://[::1]:{p}/"),
            format!("http://2130706433:{p}/"),
            format!("http://0x7f000001:{p}/"),
            format!("http://[::ffff:127.0.0.1]:{p}/"),
            format!("http://0.0.0.0:{p}/"),
            format!("//127.0.0.1:{p}/"),
            format!("http://evil.com@127.0.0.1:{p}/"),
            "http://10.0.0.1/".to_string(),
            "http://192.168.1.1/".to_string(),
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "http://metadata.google.internal/computeMetadata/v1/".to_string(),
            "http://[fd00:ec2::254]/".to_string(),
        ]
        .iter()
        .map(|location| site.redirect(302, location))
        .collect(),
    );
    // A redirect to a redirect to the canary: refused on the second hop.
    add(
        "refused",
        vec![site.redirect(307, &site.redirect(302, &canary_url))],
    );
    add(
        "scheme",
        vec![
            site.redirect(301, "file:///etc/passwd"),
            site.redirect(302, &format!("gopher://127.0.0.1:{p}/_x")),
            site.redirect(307, "data:text/html,<h1>x</h1>"),
            site.redirect(308, &format!("ftp://127.0.0.1:{p}/")),
        ],
    );
    add(
        "too_many_redirects",
        vec![site.url("/chain/6"), site.url("/chain/50")],
    );
    table
}

#[tokio::test]
async fn internal_destinations_are_refused_without_a_connection() {
    let canary = Canary::start().await;
    let site = TestSite::start().await;
    let fetcher = fetcher_for(&site);
    let table = refused_urls(canary.port, &site);
    assert!(table.len() >= 100, "only {} urls", table.len());

    let results = futures::future::join_all(table.iter().map(|(url, _)| fetcher.fetch(url))).await;
    let mut wrong = Vec::new();
    for ((url, expected), result) in table.iter().zip(results) {
        match result {
            Err(error) if error.label() == *expected => {
                // The message names the destination and never repeats a password.
                assert!(!error.to_string().contains("secret"), "{url}: {error}");
                if *expected == "refused" {
                    assert!(error.to_string().starts_with("refusing "), "{error}");
                }
            }
            Err(error) => wrong.push(format!("{url}: expected {expected}, got {error:?}")),
            Ok(page) => wrong.push(format!("{url}: expected {expected}, fetched {}", page.url)),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Connections that slipped through would still be arriving.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(canary.accepted(), 0, "the canary was reached");
    // The redirect cases really went through the site.
    assert!(site.hits() >= 30, "the site saw {} requests", site.hits());
}

/// Names other than `localhost` that resolve to internal addresses (the machine's host name,
/// names in /etc/hosts) are refused by the resolver, at connection time.
#[tokio::test]
async fn names_resolving_to_internal_addresses_are_refused_by_the_resolver() {
    let canary = Canary::start().await;
    let site = TestSite::start().await;
    let fetcher = fetcher_for(&site);

    let mut names: Vec<String> = Vec::new();
    if let Ok(hostname) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        names.push(hostname.trim().to_string());
    }
    if let Ok(hosts) = std::fs::read_to_string("/etc/hosts") {
        for line in hosts.lines() {
            let line = line.split('#').next().unwrap_or_default();
            names.extend(line.split_whitespace().skip(1).map(str::to_string));
        }
    }
    names.sort();
    names.dedup();
    let mut internal = Vec::new();
    for name in names {
        if name.contains("localhost") || name.is_empty() {
            continue; // refused by name before resolution
        }
        let Ok(addresses) = tokio::net::lookup_host((name.as_str(), 0)).await else {
            continue;
        };
        let addresses: Vec<_> = addresses.collect();
        if !addresses.is_empty()
            && addresses
                .iter()
                .all(|a| mnemo::search::fetch::is_forbidden(a.ip()))
        {
            internal.push(name);
        }
    }
    assert!(
        !internal.is_empty(),
        "no local name resolves to an internal address"
    );

    for name in &internal {
        for url in [
            format!("http://{name}:{}/", canary.port),
            site.redirect(302, &format!("http://{name}:{}/", canary.port)),
        ] {
            match fetcher.fetch(&url).await {
                Err(FetchError::Refused {
                    url: refused,
                    reason,
                }) => {
                    assert!(reason.contains("resolves to"), "{reason}");
                    assert!(refused.contains(name.as_str()), "{refused}");
                }
                other => panic!("{url}: expected a refusal, got {other:?}"),
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(canary.accepted(), 0, "the canary was reached");
}

#[tokio::test]
async fn an_allowlisted_page_is_fetched_and_its_html_becomes_text() {
    let site = TestSite::start().await;
    let fetcher = fetcher_for(&site);
    let page = fetcher.fetch(&site.url("/page")).await.expect("page");
    assert_eq!(page.url, site.url("/page"));
    assert_eq!(page.status, 200);
    assert_eq!(page.content_type, "text/html; charset=utf-8");
    assert_eq!(page.title.as_deref(), Some("Canary-free page"));
    assert_eq!(page.text, "Safe fetching\n\nEvery hop is checked.");
    assert_eq!(page.bytes, site::PAGE_HTML.len());
}

#[tokio::test]
async fn redirects_within_the_site_are_followed() {
    let site = TestSite::start().await;
    let fetcher = fetcher_for(&site);

    let page = fetcher
        .fetch(&site.redirect(302, "/page"))
        .await
        .expect("absolute-path redirect");
    assert_eq!(page.url, site.url("/page"));
    assert_eq!(page.title.as_deref(), Some("Canary-free page"));

    let page = fetcher
        .fetch(&site.redirect(301, "page"))
        .await
        .expect("relative redirect");
    assert_eq!(page.url, site.url("/page"));

    // Exactly `max_redirects` relative hops are allowed; one more is refused (table above).
    let page = fetcher
        .fetch(&site.url("/chain/5"))
        .await
        .expect("five redirects");
    assert_eq!(page.url, site.url("/chain/0"));
    assert_eq!(page.text, "arrived");
}

#[tokio::test]
async fn a_gzip_bomb_is_cut_off_at_the_cap() {
    let site = TestSite::start().await;
    let limit = 1024 * 1024;
    let fetcher = Fetcher::new(FetchPolicy {
        max_body_bytes: limit,
        allow: vec![site.addr],
        ..FetchPolicy::default()
    })
    .expect("fetcher");
    let compressed = site::gzip_zeros(site::BOMB_INFLATED).len();
    assert!(compressed < limit / 4, "the bomb is {compressed} bytes");

    let peak_before = peak_memory_bytes();
    let started = Instant::now();
    let result = fetcher.fetch(&site.url("/bomb")).await;
    let elapsed = started.elapsed();
    assert!(
        matches!(result, Err(FetchError::TooLarge { limit: l }) if l == limit),
        "{result:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    // Inflating all 50 MiB into memory would raise the peak by at least that much.
    if let (Some(before), Some(after)) = (peak_before, peak_memory_bytes()) {
        let grown = after.saturating_sub(before);
        assert!(
            grown < 32 * 1024 * 1024,
            "peak memory grew by {grown} bytes"
        );
    }
}

/// Peak resident memory of this process (Linux), in bytes.
fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[tokio::test]
async fn a_trickling_body_hits_the_deadline() {
    let site = TestSite::start().await;
    let timeout = Duration::from_secs(2);
    let fetcher = Fetcher::new(FetchPolicy {
        timeout,
        allow: vec![site.addr],
        ..FetchPolicy::default()
    })
    .expect("fetcher");
    let started = Instant::now();
    let result = fetcher.fetch(&site.url("/trickle")).await;
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(FetchError::Timeout)), "{result:?}");
    assert!(
        elapsed >= timeout - Duration::from_millis(100),
        "{elapsed:?}"
    );
    assert!(elapsed < timeout + Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test]
async fn trickling_headers_hit_the_deadline() {
    let addr = site::trickling_headers_server().await;
    let timeout = Duration::from_secs(2);
    let fetcher = Fetcher::new(FetchPolicy {
        timeout,
        allow: vec![addr],
        ..FetchPolicy::default()
    })
    .expect("fetcher");
    let started = Instant::now();
    let result = fetcher.fetch(&format!("http://{addr}/")).await;
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(FetchError::Timeout)), "{result:?}");
    assert!(elapsed < timeout + Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test]
async fn error_statuses_and_binary_content_are_errors() {
    let site = TestSite::start().await;
    let fetcher = fetcher_for(&site);

    let result = fetcher.fetch(&site.url("/missing")).await;
    assert!(matches!(result, Err(FetchError::Status(404))), "{result:?}");

    let result = fetcher.fetch(&site.url("/image")).await;
    match result {
        Err(error @ FetchError::Extract(_)) => {
            assert_eq!(error.label(), "extract");
            assert!(error.to_string().contains("image/png"), "{error}");
        }
        other => panic!("expected an extraction error, got {other:?}"),
    }
}
