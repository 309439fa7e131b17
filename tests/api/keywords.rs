//! Keyword search on the Qdrant server (`qdrant.keywords = "server"`): the same answers as the
//! replica's tantivy index (`"replica"`, the vectors on the same server), for keyword recall and for the product's hybrid recall (whose
//! relevance gate reads the keyword coverage), each user's memories apart, and no index in the
//! replica's data directory. Runs only when `QDRANT_URL` is set (`scripts/test` starts one).

use crate::support;

use reqwest::StatusCode;
use serde_json::json;
use support::{Backend, Home, TestApp};

const FACTS: [&str; 9] = [
    "I'm allergic to peanuts.",
    "My passport number is X1234567.",
    "My sister lives in Lisbon.",
    "I always book aisle seats on long flights.",
    "My laptop is a ThinkPad X1 Carbon.",
    "I play the cello in a community orchestra.",
    "Spring tides happen when the sun and the moon line up, at new and full moon.",
    "我每天早上喝一杯乌龙茶。",
    "周末我们去杭州看了龙井茶园。",
];

/// Keyword and hybrid queries, some answered by one fact, some by several, some by none.
const QUERIES: [&str; 8] = [
    "Where does my sister live?",
    "peanuts",
    "What laptop do I use?",
    "cello orchestra",
    "full moon tides",
    "乌龙茶",
    "喝茶",
    "Which football team do I support?",
];

async fn search(app: &TestApp, key: &str, query: &str, mode: &str) -> Vec<String> {
    let (status, body) = app
        .post(
            "/v1/memories/search",
            Some(key),
            Some(json!({ "query": query, "k": 3, "mode": mode })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|result| {
            result["memory"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyword_search_on_the_server_answers_as_the_replicas_index() {
    let Ok(qdrant) = std::env::var("QDRANT_URL") else {
        println!("skipped: QDRANT_URL is not set, no Qdrant server to search on");
        return;
    };
    // Both on the Qdrant server, each with a collection of its own: only where keyword search
    // runs differs.
    let local_home = Home::new(Backend::Sqlite).await;
    let local_collection = format!("replica_keywords_{}", uuid::Uuid::now_v7().simple());
    let local = TestApp::spawn_with(
        &local_home,
        &[
            ("MNEMO__QDRANT__URL", &qdrant),
            ("MNEMO__QDRANT__COLLECTION", &local_collection),
        ],
    )
    .await;
    let server_home = Home::new(Backend::Sqlite).await;
    let collection = format!("server_keywords_{}", uuid::Uuid::now_v7().simple());
    let server = TestApp::spawn_with(
        &server_home,
        &[
            ("MNEMO__QDRANT__URL", &qdrant),
            ("MNEMO__QDRANT__COLLECTION", &collection),
            ("MNEMO__QDRANT__KEYWORDS", "server"),
        ],
    )
    .await;
    let local_key = local.user_key("alice").await;
    let server_key = server.user_key("alice").await;
    let bob = server.user_key("bob").await;
    local.remember_facts(&local_key, &FACTS).await;
    server.remember_facts(&server_key, &FACTS).await;
    server
        .remember_facts(&bob, &["Bob keeps bees on his roof."])
        .await;

    // Keyword recall: the same memories in the same order. Hybrid recall: the same memories,
    // the same first; below the relevance line the order may differ, as fusion weighs the BM25
    // scores, whose length normalisation the server's vectors take from fixed averages
    // (`sparse::AVERAGE_LENGTHS`) where tantivy takes the index's own.
    let mut differ = Vec::new();
    for mode in ["keyword", "hybrid"] {
        for query in QUERIES {
            let expected = search(&local, &local_key, query, mode).await;
            let found = search(&server, &server_key, query, mode).await;
            let same = if mode == "keyword" {
                found == expected
            } else {
                let (mut a, mut b) = (found.clone(), expected.clone());
                a.sort();
                b.sort();
                a == b && found.first() == expected.first()
            };
            if !same {
                differ.push(format!("{mode} {query:?}: {found:?} vs {expected:?}"));
            }
        }
    }
    assert!(differ.is_empty(), "{differ:#?}");
    // The answers are the right ones, not only the same ones.
    assert_eq!(
        search(&server, &server_key, "Where does my sister live?", "hybrid")
            .await
            .first()
            .map(String::as_str),
        Some("My sister lives in Lisbon.")
    );
    assert_eq!(
        search(&server, &server_key, "乌龙茶", "keyword")
            .await
            .first()
            .map(String::as_str),
        Some("我每天早上喝一杯乌龙茶。")
    );
    assert!(
        search(
            &server,
            &server_key,
            "Which football team do I support?",
            "hybrid"
        )
        .await
        .is_empty()
    );
    // Each user's memories apart: Bob finds his bees, and nothing of Alice's by her words.
    assert_eq!(
        search(&server, &bob, "bees", "keyword").await,
        vec!["Bob keeps bees on his roof.".to_string()]
    );
    assert!(
        search(&server, &bob, "peanuts passport Lisbon", "keyword")
            .await
            .is_empty()
    );
    assert!(
        search(&server, &server_key, "bees", "keyword")
            .await
            .is_empty()
    );
    // The replica keeps no keyword index, and its keyword side is the vector side.
    assert!(!server_home.data_dir().join("keyword").exists());
    assert!(local_home.data_dir().join("keyword").exists());
    let lag = server
        .state
        .memory
        .indexer()
        .lag()
        .await
        .expect("index lag");
    assert_eq!(lag.keyword_applied, lag.vector_applied);
    local.stop().await;
    server.stop().await;
}
