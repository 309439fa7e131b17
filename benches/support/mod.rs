//! What the benchmarks share (a module, not a bench target): numeric settings from the environment and the local model.

/// `name` from the environment as a number, or `default`.
pub fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// The local embedding model's directory, or `None` (with a note) when it was not fetched.
pub fn model_dir() -> Option<&'static str> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/models/all-MiniLM-L6-v2");
    if std::path::Path::new(dir).join("model.safetensors").exists() {
        Some(dir)
    } else {
        eprintln!("skipped: the embedding model is missing (run scripts/fetch-model)");
        None
    }
}
