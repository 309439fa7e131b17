//! Server-sent events of a run: every event carries `id: <seq>`, `event: <type>` and JSON
//! `data`; keep-alive comments every `server.keep_alive_secs`; proxies are told not to buffer.
//! Streams end after the run's `done` event, or at shutdown.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::AppState;
use crate::store::{RunId, StoredEvent, UserId};

/// Counts open event streams in the `mnemo_sse_open_streams` gauge while alive.
pub(super) struct OpenStream;

impl OpenStream {
    pub(super) fn new() -> Self {
        metrics::gauge!("mnemo_sse_open_streams").increment(1.0);
        Self
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        metrics::gauge!("mnemo_sse_open_streams").decrement(1.0);
    }
}

fn to_sse(event: StoredEvent) -> Event {
    let named = Event::default()
        .id(event.seq.to_string())
        .event(event.event_type.as_str());
    named
        .json_data(&event.data)
        .unwrap_or_else(|_| Event::default().comment("unserialisable event skipped"))
}

/// The SSE response following `run` from the event after `after`. The caller has checked that
/// `user` owns the run.
pub(crate) fn run_event_response(
    state: &AppState,
    user: UserId,
    run: RunId,
    after: i64,
) -> Response {
    let guard = OpenStream::new();
    let events = state
        .runs
        .follow(user, run, after, state.streams_stop.clone())
        .map(move |event| {
            let _alive = &guard;
            Ok::<_, Infallible>(to_sse(event))
        });
    let mut response = event_stream(state, events);
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&run.to_string()) {
        headers.insert(HeaderName::from_static("x-run-id"), value);
    }
    response
}

/// An SSE response of `events` with keep-alive comments every `server.keep_alive_secs`, not to
/// be cached or buffered by proxies.
pub(crate) fn event_stream<S>(state: &AppState, events: S) -> Response
where
    S: futures::Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let keep_alive = KeepAlive::new()
        .interval(Duration::from_secs(
            state.settings.server.keep_alive_secs.max(1),
        ))
        .text("keep-alive");
    let mut response = Sse::new(events).keep_alive(keep_alive).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}
