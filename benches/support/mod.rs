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

/// A multi-threaded runtime with the machine's two workers, as the server has.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A port free on loopback now.
#[allow(dead_code)] // not every bench starts a server
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("free port")
}

/// `mnemo user add NAME` on `data_dir` (works while a server runs on it); returns the key.
#[allow(dead_code)] // not every bench makes users
pub async fn add_user(binary: &str, data_dir: &std::path::Path, name: &str) -> String {
    let output = tokio::process::Command::new(binary)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["user", "add", name])
        .output()
        .await
        .expect("mnemo user add");
    assert!(
        output.status.success(),
        "user add failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}
