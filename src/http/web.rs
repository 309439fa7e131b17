//! The browser app: the build output of `web/` (`web/dist`), embedded in release builds and
//! read from disk in debug builds (rust-embed), served at `/`, `/assets/*` and `/favicon.svg`
//! under a strict Content-Security-Policy. `/` negotiates: a browser (`Accept: text/html`)
//! gets the app, anything else the JSON service description. A binary built before the app
//! was built serves a page that says how to build it.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

#[derive(rust_embed::Embed)]
#[folder = "web/dist/"]
#[allow_missing = true]
struct WebAssets;

/// Changes whenever `web/dist` does (set by `build.rs`), so a release build re-embeds the app
/// after `npm run build`, also when the folder did not exist at the previous build.
const DIST_STAMP: &str = env!("MNEMO_WEB_DIST_STAMP");

/// The policy the app is built for: no inline script or style, no eval, nothing from another
/// origin, not framed.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// Shown at `/` to a browser when the binary holds no app.
const NOT_BUILT_PAGE: &str = "<!doctype html>
<html lang=\"en\">
<head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">
<title>mnemo: the web app is not built</title></head>
<body>
<h1>mnemo is running, but its web app was not built into this binary</h1>
<p>Build the app, then the binary again (<code>scripts/serve</code> does both):</p>
<pre>cd web &amp;&amp; npm ci &amp;&amp; npm run build
cargo build --release</pre>
<p>The API works without it: see <a href=\"/docs\">/docs</a> and <a href=\"/openapi.json\">/openapi.json</a>.</p>
</body>
</html>
";

/// True when this binary holds the built app.
pub(crate) fn app_built() -> bool {
    WebAssets::get("index.html").is_some()
}

/// The build stamp of the embedded app (changes with `web/dist`).
pub(crate) fn dist_stamp() -> &'static str {
    DIST_STAMP
}

/// True when the client asks for a page rather than data.
pub(crate) fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"))
}

/// The app's page (`index.html`), never cached without revalidation; or the page that says
/// how to build it.
pub(crate) fn index_page() -> Response {
    match WebAssets::get("index.html") {
        Some(file) => asset_response(
            "index.html",
            file.data.into_owned(),
            &file.metadata.sha256_hash(),
        ),
        None => with_security_headers(
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                NOT_BUILT_PAGE,
            )
                .into_response(),
        ),
    }
}

/// `GET|HEAD /assets/{*path}`.
pub(crate) async fn asset(
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    file(&format!("assets/{path}"), &headers)
}

/// `GET|HEAD /favicon.svg`.
pub(crate) async fn favicon(headers: HeaderMap) -> Result<Response, ApiError> {
    file("favicon.svg", &headers)
}

fn file(path: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    // rust-embed refuses `..` itself; refuse it here too so a debug build (reading from disk)
    // never looks outside the folder whatever the library does.
    if path.split('/').any(|part| part == ".." || part.is_empty()) {
        return Err(ApiError::not_found(format!("no file {path}")));
    }
    let file =
        WebAssets::get(path).ok_or_else(|| ApiError::not_found(format!("no file {path}")))?;
    let hash = file.metadata.sha256_hash();
    let etag = etag_of(&hash);
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(',').any(|tag| tag.trim() == etag))
    {
        let mut response = StatusCode::NOT_MODIFIED.into_response();
        set_cache_headers(&mut response, path, &etag);
        return Ok(with_security_headers(response));
    }
    Ok(asset_response(path, file.data.into_owned(), &hash))
}

fn asset_response(path: &str, bytes: Vec<u8>, hash: &[u8; 32]) -> Response {
    let mut response = Response::new(Body::from(bytes));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(path)),
    );
    set_cache_headers(&mut response, path, &etag_of(hash));
    with_security_headers(response)
}

/// Content-hashed files under `assets/` never change; everything else is revalidated.
fn set_cache_headers(response: &mut Response, path: &str, etag: &str) {
    let cache = if path.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    if let Ok(value) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, value);
    }
}

fn etag_of(hash: &[u8; 32]) -> String {
    format!("\"{}\"", hex::encode(&hash[..16]))
}

pub(super) fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, extension)| extension) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        Some("json") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The API reference (`/redoc`): a read-only page over `/openapi.json`, its script and style
/// files served from the binary under the web app's policy (no inline script or style).
pub(crate) async fn reference_page() -> Response {
    with_security_headers(
        (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            include_str!("reference/index.html"),
        )
            .into_response(),
    )
}

pub(crate) async fn reference_script() -> Response {
    with_security_headers(
        (
            [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
            include_str!("reference/reference.js"),
        )
            .into_response(),
    )
}

pub(crate) async fn reference_style() -> Response {
    with_security_headers(
        (
            [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
            include_str!("reference/reference.css"),
        )
            .into_response(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_of_the_files_vite_writes() {
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(
            content_type("assets/index-3f2a.js"),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(
            content_type("assets/style-9c1d.css"),
            "text/css; charset=utf-8"
        );
        assert_eq!(content_type("favicon.svg"), "image/svg+xml");
        assert_eq!(content_type("assets/blob"), "application/octet-stream");
    }

    #[test]
    fn a_browser_is_told_apart_from_an_api_client() {
        let mut headers = HeaderMap::new();
        assert!(!wants_html(&headers));
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        assert!(!wants_html(&headers));
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html,application/xhtml+xml,*/*;q=0.8"),
        );
        assert!(wants_html(&headers));
    }

    #[test]
    fn paths_leaving_the_folder_are_not_found() {
        let headers = HeaderMap::new();
        assert!(file("assets/../../Cargo.toml", &headers).is_err());
        assert!(file("assets//etc/passwd", &headers).is_err());
    }
}
