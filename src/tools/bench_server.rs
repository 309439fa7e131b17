//! What the benchmarks that run the real server in-process share: settings for a scratch data
//! directory, an orderly release of the server's state, and the percentile they report.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use mnemo::config::{Overrides, Settings};
use mnemo::http::AppState;

/// Settings for a server on a fresh `data_dir` (emptied first), on a free loopback port, quiet
/// logs, the local model in `model_dir`, and the `MNEMO__…` variables of the process and (winning
/// over them) of `extra`.
pub fn scratch_settings(
    data_dir: &Path,
    model_dir: Option<&Path>,
    extra: Vec<(String, String)>,
) -> anyhow::Result<Settings> {
    if data_dir.exists() {
        std::fs::remove_dir_all(data_dir).context("clearing the bench data dir")?;
    }
    // The process's own `MNEMO__` settings first (an A/B of `MNEMO__EMBEDDER__PRECISION`,
    // say), then the benchmark's, which win.
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(key, _)| key.starts_with("MNEMO__"))
        .collect();
    env.extend([
        ("MNEMO__SERVER__ADDR".into(), "127.0.0.1:0".into()),
        ("MNEMO__LOG__LEVEL".into(), "warn".into()),
    ]);
    if let Some(dir) = model_dir {
        env.push((
            "MNEMO__EMBEDDER__MODEL_DIR".into(),
            dir.display().to_string(),
        ));
    }
    env.extend(extra);
    let overrides = Overrides {
        data_dir: Some(data_dir.to_path_buf()),
        ..Overrides::default()
    };
    Ok(Settings::load_from(&overrides, env)?)
}

/// Ends the runs and background tasks of a state whose shutdown token was cancelled, and
/// closes its indexes and pool.
pub async fn release(state: AppState) {
    state.runs.shutdown(Duration::from_secs(5)).await;
    state.memory.close(Duration::from_secs(10)).await;
    state.store.close().await;
}

/// A new key user named `name` in `store`; their API key.
pub async fn bench_user(
    store: &std::sync::Arc<dyn mnemo::store::Store>,
    name: &str,
) -> anyhow::Result<String> {
    let accounts = store.accounts();
    let user = accounts
        .create_user(name, mnemo::store::UserKind::Key)
        .await?;
    let key = mnemo::auth::keys::generate();
    accounts
        .add_api_key(user.id, &key.hash, &key.prefix)
        .await?;
    Ok(key.plaintext)
}

/// A JSON POST to `url` with the bearer `key`; the answer's JSON, or an error naming the
/// status when it is not a success.
pub async fn post_json(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let response = http.post(url).bearer_auth(key).json(body).send().await?;
    let status = response.status();
    let answer: serde_json::Value = response.json().await.unwrap_or_default();
    if !status.is_success() {
        anyhow::bail!("{url} answered {status}: {answer}");
    }
    Ok(answer)
}
