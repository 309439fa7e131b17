//! The tracing subscriber. The sink is a parameter so tests can silence logs (or send them to
//! the test writer when `TEST_LOG` is set).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Installs the global subscriber; a second call is a no-op (tests spawn many apps).
pub fn init<W>(level: &str, json: bool, ansi: bool, sink: W)
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    // Qdrant Edge warns about internal feature flags on every open; keep that out of the way.
    let directives = if level.contains("qdrant_edge") {
        level.to_string()
    } else {
        format!("{level},qdrant_edge=error")
    };
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&directives))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(sink);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
