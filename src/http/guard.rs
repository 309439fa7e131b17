//! Checks on every request before routing:
//!
//! - **No NUL in the URI.** A `%00` in a path or query would reach a string path parameter
//!   and the database (PostgreSQL cannot store NUL): 400, as for a NUL in a JSON body.
//! - **`--dev` answers loopback pages only.** In dev mode a request without credentials acts
//!   as the local user, which any web page the user visits could exploit. So: the `Host`
//!   must be a loopback name (a DNS-rebinding page reaches the server under its own name);
//!   a browser's `Origin` must be a loopback origin; and a write without credentials whose
//!   body a cross-site form could send (`text/plain`, form or multipart content, or none)
//!   must say where it comes from with a loopback `Origin`.
//! - **A body arrives in time.** The whole request body must arrive within
//!   `server.body_read_timeout_secs` of the request head (hyper bounds only the head): a
//!   client trickling a byte at a time gets 400 and its connection back, instead of holding a
//!   connection slot for as long as it likes. With the per-user cap on requests in progress
//!   (`limits::InFlight`), a few users cannot hold every slot.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::{ApiError, ErrorKind};
use super::limits::InFlightSlot;

pub(crate) async fn check_request(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if has_nul(request.uri()) {
        return ApiError::bad_request("the URL must not contain NUL characters (%00)")
            .into_response();
    }
    if state.settings.server.dev
        && let Err(message) = dev_allows(request.method(), request.headers())
    {
        return ApiError::new(ErrorKind::Forbidden, message).into_response();
    }
    let limit = Duration::from_secs(state.settings.server.body_read_timeout_secs);
    let slot = InFlightSlot::default();
    let mut request = request.map(|body| Body::new(DeadlineBody::new(body, limit, slot.clone())));
    request.extensions_mut().insert(slot);
    next.run(request).await
}

/// A request body that fails once its deadline passes, however its bytes trickle in. It holds
/// the request's place among its user's requests in progress until it is dropped.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    _in_flight: InFlightSlot,
}

impl DeadlineBody {
    fn new(inner: Body, limit: Duration, in_flight: InFlightSlot) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
            _in_flight: in_flight,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0} s (server.body_read_timeout_secs)")]
struct BodyTooSlow(u64);

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTooSlow(this.limit.as_secs())))));
        }
        Pin::new(&mut this.inner)
            .poll_frame(cx)
            .map_err(axum::BoxError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

fn has_nul(uri: &axum::http::Uri) -> bool {
    let path_and_query = uri
        .path_and_query()
        .map(axum::http::uri::PathAndQuery::as_str)
        .unwrap_or_default();
    path_and_query.contains("%00")
}

/// Whether dev mode serves this request; `Err` says why not.
fn dev_allows(method: &Method, headers: &HeaderMap) -> Result<(), &'static str> {
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if !host.is_empty() && !loopback_host(host) {
        return Err(
            "--dev answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1])",
        );
    }
    let origin = headers.get(header::ORIGIN);
    if let Some(origin) = origin
        && !loopback_origin(origin)
    {
        return Err("--dev answers only pages served from a loopback origin");
    }
    let writes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let credentials = headers.contains_key(header::AUTHORIZATION);
    if writes && !credentials && origin.is_none() && simple_content_type(headers) {
        return Err(
            "--dev refuses writes a cross-site form could send: send JSON, or the page's Origin",
        );
    }
    Ok(())
}

/// A `Host` of `localhost` (or a name under it), `127.0.0.1` or `[::1]`, with any port.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A loopback origin (`http://localhost:8080`, `http://127.0.0.1`, `http://[::1]:3000`).
pub(crate) fn loopback_origin(origin: &HeaderValue) -> bool {
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    match url::Url::parse(origin.trim().trim_end_matches('/')) {
        Ok(url) => match url.host() {
            Some(url::Host::Domain(name)) => {
                let name = name.to_ascii_lowercase();
                name == "localhost" || name.ends_with(".localhost")
            }
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        Err(_) => false,
    }
}

/// A content type a page may send cross-site without asking first (CORS "simple"), or none.
fn simple_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return true;
    };
    let essence = value
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data" | ""
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn dev_mode_serves_loopback_pages_only() {
        let local = [(header::HOST, "127.0.0.1:8080")];
        assert!(dev_allows(&Method::GET, &headers(&local)).is_ok());
        for host in ["localhost:8080", "[::1]:9000", "app.localhost", "127.0.0.1"] {
            assert!(
                dev_allows(&Method::GET, &headers(&[(header::HOST, host)])).is_ok(),
                "{host}"
            );
        }
        for host in [
            "evil.example:8080",
            "10.0.0.5:8080",
            "localhost.evil.example",
        ] {
            assert!(
                dev_allows(&Method::GET, &headers(&[(header::HOST, host)])).is_err(),
                "{host}"
            );
        }
        let foreign = [
            (header::HOST, "127.0.0.1:8080"),
            (header::ORIGIN, "https://evil.example"),
        ];
        assert!(dev_allows(&Method::GET, &headers(&foreign)).is_err());
        let null = [(header::HOST, "127.0.0.1:8080"), (header::ORIGIN, "null")];
        assert!(dev_allows(&Method::POST, &headers(&null)).is_err());
        // A form-like write needs the page's Origin or credentials; JSON does not.
        let form = [
            (header::HOST, "127.0.0.1:8080"),
            (header::CONTENT_TYPE, "text/plain"),
        ];
        assert!(dev_allows(&Method::POST, &headers(&form)).is_err());
        let json = [
            (header::HOST, "127.0.0.1:8080"),
            (header::CONTENT_TYPE, "application/json"),
        ];
        assert!(dev_allows(&Method::POST, &headers(&json)).is_ok());
        let page = [
            (header::HOST, "127.0.0.1:8080"),
            (header::CONTENT_TYPE, "text/plain"),
            (header::ORIGIN, "http://127.0.0.1:8080"),
        ];
        assert!(dev_allows(&Method::POST, &headers(&page)).is_ok());
        let keyed = [
            (header::HOST, "127.0.0.1:8080"),
            (header::CONTENT_TYPE, "multipart/form-data; boundary=x"),
            (header::AUTHORIZATION, "Bearer mnemo_x"),
        ];
        assert!(dev_allows(&Method::POST, &headers(&keyed)).is_ok());
    }

    #[test]
    fn nul_in_a_path_or_query_is_seen() {
        assert!(has_nul(&"/v1/jobs/%00".parse().unwrap()));
        assert!(has_nul(&"/v1/memories?kinds=%00".parse().unwrap()));
        assert!(!has_nul(&"/v1/jobs/turn%3A1".parse().unwrap()));
    }
}
