//! A Qdrant cluster of real peers on loopback, from the Qdrant server test tool
//! (`../shared/bin/qdrant`, or `MNEMO_QDRANT_BIN`): each peer with its own HTTP, gRPC and P2P
//! ports and storage directory, the first one bootstrapping the others. Peers are killed with
//! SIGKILL and restarted on their storage. Used by the integration tests and, compiled into the
//! binary, by `mnemo bench replicas --qdrant-bin`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};

/// The Qdrant server binary, when the test tool is on this machine.
pub fn binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var("MNEMO_QDRANT_BIN").ok().map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bin/qdrant")),
        Some(PathBuf::from("/work/shared/bin/qdrant")),
    ];
    candidates.into_iter().flatten().find(|path| path.is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

struct Peer {
    http: u16,
    grpc: u16,
    p2p: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// How many times it was started (each start logs to a file of its own).
    starts: usize,
}

pub struct QdrantCluster {
    binary: PathBuf,
    peers: Vec<Peer>,
}

impl QdrantCluster {
    /// `size` peers of `binary` forming one cluster, each with its storage under `dir`, every
    /// one ready.
    pub async fn start(binary: &Path, size: usize, dir: &Path) -> Self {
        let peers = (0..size)
            .map(|n| Peer {
                http: free_port(),
                grpc: free_port(),
                p2p: free_port(),
                dir: dir.join(format!("peer{n}")),
                child: None,
                starts: 0,
            })
            .collect();
        let mut cluster = Self {
            binary: binary.to_path_buf(),
            peers,
        };
        for n in 0..size {
            cluster.launch(n);
            // The first peer must be up before the others ask it to let them in.
            cluster.wait_ready(n).await;
        }
        cluster.wait_formed().await;
        cluster
    }

    /// The peers' gRPC endpoints (what mnemo's `qdrant.url` lists), in peer order.
    pub fn grpc_urls(&self) -> Vec<String> {
        self.peers
            .iter()
            .map(|peer| format!("http://127.0.0.1:{}", peer.grpc))
            .collect()
    }

    /// Peer `n`'s REST endpoint.
    pub fn http_url(&self, n: usize) -> String {
        format!("http://127.0.0.1:{}", self.peers[n].http)
    }

    fn launch(&mut self, n: usize) {
        let bootstrap = (n > 0).then(|| format!("http://127.0.0.1:{}", self.peers[0].p2p));
        let peer = &mut self.peers[n];
        std::fs::create_dir_all(&peer.dir).expect("peer dir");
        peer.starts += 1;
        let log = std::fs::File::create(peer.dir.join(format!("qdrant-{}.log", peer.starts)))
            .expect("peer log");
        let mut command = Command::new(&self.binary);
        command
            .current_dir(&peer.dir)
            .env("QDRANT__CLUSTER__ENABLED", "true")
            .env("QDRANT__CLUSTER__P2P__PORT", peer.p2p.to_string())
            .env("QDRANT__SERVICE__HOST", "127.0.0.1")
            .env("QDRANT__SERVICE__HTTP_PORT", peer.http.to_string())
            .env("QDRANT__SERVICE__GRPC_PORT", peer.grpc.to_string())
            .env("QDRANT__STORAGE__STORAGE_PATH", peer.dir.join("storage"))
            .env(
                "QDRANT__STORAGE__SNAPSHOTS_PATH",
                peer.dir.join("snapshots"),
            )
            .env("QDRANT__TELEMETRY_DISABLED", "true")
            .arg("--uri")
            .arg(format!("http://127.0.0.1:{}", peer.p2p))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        // A restarted peer finds the cluster in its storage; a new one asks the first peer.
        if peer.starts == 1
            && let Some(bootstrap) = bootstrap
        {
            command.arg("--bootstrap").arg(bootstrap);
        }
        peer.child = Some(command.spawn().expect("spawn qdrant"));
    }

    /// SIGKILL peer `n`.
    pub async fn kill(&mut self, n: usize) {
        if let Some(mut child) = self.peers[n].child.take() {
            child.kill().await.expect("SIGKILL qdrant peer");
        }
    }

    /// Starts peer `n` again on its storage and waits until it answers.
    pub async fn restart(&mut self, n: usize) {
        self.launch(n);
        self.wait_ready(n).await;
    }

    /// What peer `n` logged in its last run (for failure messages).
    pub fn log(&self, n: usize) -> String {
        let peer = &self.peers[n];
        std::fs::read_to_string(peer.dir.join(format!("qdrant-{}.log", peer.starts)))
            .unwrap_or_default()
    }

    async fn wait_ready(&mut self, n: usize) {
        let url = format!("{}/readyz", self.http_url(n));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if reqwest::get(&url)
                .await
                .is_ok_and(|response| response.status().is_success())
            {
                return;
            }
            if let Some(child) = self.peers[n].child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("qdrant peer {n} exited ({status}):\n{}", self.log(n));
            }
            assert!(
                Instant::now() < deadline,
                "qdrant peer {n} not ready within 30 s:\n{}",
                self.log(n)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the first peer knows every peer.
    async fn wait_formed(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let known = self.get(0, "/cluster").await.and_then(|body| {
                body["result"]["peers"]
                    .as_object()
                    .map(serde_json::Map::len)
            });
            if known == Some(self.peers.len()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not form within 30 s (peers known: {known:?}):\n{}",
                self.log(0)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `GET path` on peer `n`'s REST API; the JSON body, `None` when it does not answer 200.
    pub async fn get(&self, n: usize, path: &str) -> Option<Value> {
        let response = reqwest::get(format!("{}{path}", self.http_url(n)))
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }
}
