//! Two replicas on one PostgreSQL and a three-peer Qdrant cluster (three shards, two copies of
//! each): a peer is SIGKILLed while memories are written through both replicas and recalled
//! through both, then restarted. Recall keeps answering from the vector index throughout (a
//! replica whose first peer died asks the next), no acknowledged memory is missing afterwards,
//! nobody recalls another user's memory, and `mnemo check` finds the cluster equal to SQL.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::binary::{Server, add_user_with, call, mnemo, read_log, start_server_with};
use support::qdrant_cluster::QdrantCluster;

const USERS: [&str; 2] = ["alice", "bob"];
/// Memories written before the kill, while the peer is down, and after its restart.
const WRITES_PER_PHASE: usize = 12;

fn memory_text(user: &str, n: usize) -> String {
    format!("{user} logbook entry {n}: the harbour crane number {n} was painted {user}-green")
}

fn borrowed(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect()
}

/// A vector-only recall of `query` through `base`: the answer's status and its contents.
async fn recall(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    query: &str,
) -> (StatusCode, Vec<String>) {
    let (status, body) = call(
        client,
        base,
        key,
        "POST",
        "/v1/memories/search",
        json!({ "query": query, "k": 5, "mode": "vector", "decay": false }),
    )
    .await;
    (status, support::result_contents(&body))
}

/// Recalls through both replicas until `stop`, counting the answers and the failures (a
/// status other than 200, or another user's memory).
fn recall_continuously(
    client: reqwest::Client,
    bases: Vec<String>,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut n = 0usize;
        while !stop.load(Ordering::SeqCst) {
            let (base, user) = (&bases[n % bases.len()], n % USERS.len());
            let (status, contents) =
                recall(&client, base, &keys[user], "harbour crane painted green").await;
            let other = USERS[1 - user];
            if status != StatusCode::OK {
                failures
                    .lock()
                    .expect("failures")
                    .push(format!("recall {n} through {base}: {status}"));
            } else if let Some(foreign) = contents
                .iter()
                .find(|content| content.starts_with(&format!("{other} ")))
            {
                failures
                    .lock()
                    .expect("failures")
                    .push(format!("{} recalled {other}'s {foreign:?}", USERS[user]));
            } else {
                answered.fetch_add(1, Ordering::SeqCst);
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
}

/// Writes `WRITES_PER_PHASE` memories per user through the replicas in turn; their texts.
async fn write_phase(
    client: &reqwest::Client,
    bases: &[String],
    keys: &[String],
    phase: usize,
) -> Vec<(usize, String)> {
    let mut written = Vec::new();
    for n in phase * WRITES_PER_PHASE..(phase + 1) * WRITES_PER_PHASE {
        for (user, name) in USERS.iter().enumerate() {
            let base = &bases[(n + user) % bases.len()];
            let content = memory_text(name, n);
            let (status, body) = call(
                client,
                base,
                &keys[user],
                "POST",
                "/v1/memories",
                json!({ "content": content }),
            )
            .await;
            assert_eq!(
                status,
                StatusCode::CREATED,
                "write {n} through {base}: {body}"
            );
            written.push((user, content));
        }
    }
    written
}

/// Waits until `base`'s vector index has applied the whole memory log (`admin`: an
/// administrator's key, to whom `/health` shows the lag).
async fn wait_indexed(client: &reqwest::Client, base: &str, admin: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let health: Value = match client
            .get(format!("{base}/health"))
            .bearer_auth(admin)
            .send()
            .await
        {
            Ok(response) => response.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        if health["components"]["indexes"]["vector"]["lag"] == json!(0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{base}: the vector index did not catch up within 60 s: {health}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_qdrant_peer_killed_mid_traffic_loses_no_acknowledged_memory() {
    let Some(binary) = support::qdrant_cluster::binary() else {
        println!("skipped: no Qdrant server binary (../shared/bin/qdrant or MNEMO_QDRANT_BIN)");
        return;
    };
    let database_url = support::databases::fresh_postgres_url().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = QdrantCluster::start(&binary, 3, &dir.path().join("qdrant")).await;
    let peers = cluster.grpc_urls();
    let shared: Vec<(String, String)> = vec![
        ("MNEMO__DATABASE__URL".into(), database_url),
        ("MNEMO__QDRANT__COLLECTION".into(), "cluster_test".into()),
        ("MNEMO__QDRANT__SHARD_NUMBER".into(), "3".into()),
        ("MNEMO__QDRANT__REPLICATION_FACTOR".into(), "2".into()),
        ("MNEMO__SERVER__REQUESTS_PER_MINUTE".into(), "0".into()),
        // `/health` shows the index lag to an administrator only.
        ("MNEMO__SERVER__ADMIN_USERS".into(), "alice".into()),
    ];
    // Replica A asks peer 0 first, replica B peer 1; peer 0 (the one that bootstrapped the
    // cluster, A's first choice) is the one killed.
    let env_for = |first: usize| {
        let mut env = shared.clone();
        let mut order = peers.clone();
        order.rotate_left(first);
        env.push(("MNEMO__QDRANT__URL".into(), order.join(",")));
        env
    };
    let envs = [env_for(0), env_for(1)];
    let (env_a, env_b) = (borrowed(&envs[0]), borrowed(&envs[1]));
    let mut keys = Vec::new();
    for name in USERS {
        keys.push(add_user_with(&dir.path().join("a"), name, &env_a).await);
    }
    let logs = [dir.path().join("a.log"), dir.path().join("b.log")];
    let servers: Vec<Server> = vec![
        start_server_with(&dir.path().join("a"), &logs[0], &env_a).await,
        start_server_with(&dir.path().join("b"), &logs[1], &env_b).await,
    ];
    let bases: Vec<String> = servers.iter().map(|server| server.base.clone()).collect();
    let client = reqwest::Client::new();

    // The collection mnemo created is spread as configured, with the keyword vectors beside
    // the dense ones (keyword search runs on the cluster: no replica keeps an index).
    let collection = cluster
        .get(1, "/collections/cluster_test_384_views_bm25")
        .await
        .expect("the collection on the cluster");
    let params = &collection["result"]["config"]["params"];
    assert_eq!(params["shard_number"], json!(3), "{collection}");
    assert_eq!(params["replication_factor"], json!(2), "{collection}");
    for view in ["own_bm25", "context_bm25"] {
        assert_eq!(
            params["sparse_vectors"][view]["modifier"],
            json!("idf"),
            "{collection}"
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = recall_continuously(
        client.clone(),
        bases.clone(),
        keys.clone(),
        stop.clone(),
        answered.clone(),
        failures.clone(),
    );

    let mut written = write_phase(&client, &bases, &keys, 0).await;
    for base in &bases {
        wait_indexed(&client, base, &keys[0]).await;
    }
    cluster.kill(0).await;
    let answered_before_kill = answered.load(Ordering::SeqCst);
    written.extend(write_phase(&client, &bases, &keys, 1).await);
    // Both replicas apply the log to the cluster with a peer down, and recall through it.
    for base in &bases {
        wait_indexed(&client, base, &keys[0]).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while answered.load(Ordering::SeqCst) < answered_before_kill + 20 {
        assert!(
            Instant::now() < deadline,
            "recall stopped answering with a peer down: {:?}",
            failures.lock().expect("failures")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.restart(0).await;
    written.extend(write_phase(&client, &bases, &keys, 2).await);
    for base in &bases {
        wait_indexed(&client, base, &keys[0]).await;
    }
    stop.store(true, Ordering::SeqCst);
    reader.await.expect("reader");
    let failures = failures.lock().expect("failures").clone();
    assert!(
        failures.is_empty(),
        "recall failed {} times ({} answered): {failures:?}\nA:\n{}\nB:\n{}",
        failures.len(),
        answered.load(Ordering::SeqCst),
        read_log(&logs[0]),
        read_log(&logs[1])
    );

    // Replica A, whose first peer died, moved on to the next one (and said so).
    assert!(
        read_log(&logs[0]).contains("a peer cannot be reached; requests go to another one"),
        "A:\n{}",
        read_log(&logs[0])
    );

    // Every acknowledged memory is recalled, by its owner only, through either replica.
    for (n, (user, content)) in written.iter().enumerate() {
        let base = &bases[n % bases.len()];
        let (status, contents) = recall(&client, base, &keys[*user], content).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            contents.first(),
            Some(content),
            "{content:?} through {base}"
        );
        let other = USERS[1 - user];
        assert!(
            contents
                .iter()
                .all(|content| !content.starts_with(&format!("{other} "))),
            "{} recalled {other}'s memory: {contents:?}",
            USERS[*user]
        );
    }

    // `mnemo check` (a third process, its own data directory) finds the cluster equal to SQL.
    let output = mnemo(&dir.path().join("check"), &env_b)
        .arg("check")
        .output()
        .await
        .expect("run mnemo check");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "mnemo check: {report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        report.contains(&format!(
            "{} memories of 2 users; vector index: 0 missing, 0 extra",
            written.len()
        )),
        "{report}"
    ); // Neither replica keeps a keyword index of its own.
    for replica in ["a", "b"] {
        assert!(!dir.path().join(replica).join("keyword").exists());
    }
}
