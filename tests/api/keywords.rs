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

/// The same memories with the same first: below it, BM25 ties may fall otherwise where the
/// server's length normalisation uses fixed averages (`sparse::AVERAGE_LENGTHS`).
fn same_answers(found: &[String], expected: &[String]) -> bool {
    let (mut a, mut b) = (found.to_vec(), expected.to_vec());
    a.sort();
    b.sort();
    a == b && found.first() == expected.first()
}

async fn search(app: &TestApp, key: &str, query: &str, mode: &str) -> Vec<String> {
    let (status, body) = app
        .post(
            "/v1/memories/search",
            Some(key),
            Some(json!({ "query": query, "k": 3, "mode": mode })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    support::result_contents(&body)
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
            ("MNEMO__QDRANT__KEYWORDS", "replica"),
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
                same_answers(&found, &expected)
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

/// A deployment that ran with keyword search in its replicas (`replica`) and restarts with
/// `server`: the replica answers at once from the collection it had and its tantivy index,
/// fills the keyword vectors in the background, then searches on the server; nothing written
/// meanwhile is lost, and the next start keeps no index in the data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_moves_its_keyword_search_to_the_server_in_the_background() {
    let Ok(qdrant) = std::env::var("QDRANT_URL") else {
        println!("skipped: QDRANT_URL is not set, no Qdrant server to search on");
        return;
    };
    let home = Home::new(Backend::Sqlite).await;
    let collection = format!("moving_keywords_{}", uuid::Uuid::now_v7().simple());
    let spawn = |keywords: &'static str| {
        TestApp::spawn_with_owned(
            &home,
            vec![
                ("MNEMO__QDRANT__URL", qdrant.clone()),
                ("MNEMO__QDRANT__COLLECTION", collection.clone()),
                ("MNEMO__QDRANT__KEYWORDS", keywords.to_string()),
                // Any lag is filled in the background (by default up to 10,000 log entries
                // are filled before the replica answers).
                ("MNEMO__QDRANT__KEYWORDS_FILL_INLINE", "0".to_string()),
                // Questions are asked as fast as answered, for as long as the move takes.
                ("MNEMO__SERVER__REQUESTS_PER_MINUTE", "0".to_string()),
            ],
        )
    };
    let before = spawn("replica").await;
    let key = before.user_key("alice").await;
    let bob = before.user_key("bob").await;
    before.remember_facts(&key, &FACTS).await;
    let fillers: Vec<String> = (0..120)
        .map(|n| format!("Logbook entry {n}: checked shelf {} in the archive.", n * 7))
        .collect();
    let fillers: Vec<&str> = fillers.iter().map(String::as_str).collect();
    before.remember_facts(&key, &fillers).await;
    before
        .remember_facts(&bob, &["Bob keeps bees on his roof."])
        .await;
    // A history long enough that filling the keyword vectors takes a while: another user's
    // memories, written to SQL with vectors of their own.
    before.user_key("carol").await;
    let carol = before.user_named("carol").await;
    let model = before.state.memory.embedder().model_id().to_string();
    let dimension = before.state.memory.embedder().dimension();
    for batch in 0..10 {
        let memories = (0..500)
            .map(|n| {
                let seed = (batch * 500 + n) as f32;
                let mut vector: Vec<f32> = (0..dimension)
                    .map(|i| (seed * 0.37 + i as f32 * 1.13).sin())
                    .collect();
                let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
                vector.iter_mut().for_each(|x| *x /= norm);
                (
                    mnemo::store::NewMemory::from_user(
                        mnemo::store::MemoryKind::Fact,
                        format!("Carol's logbook, page {seed}: the greenhouse kept warm."),
                        3,
                    ),
                    mnemo::store::Embedded {
                        vector,
                        model: model.clone(),
                    },
                )
            })
            .collect();
        before
            .state
            .store
            .user(carol.id)
            .insert_memories(memories)
            .await
            .expect("write carol's history");
    }
    before.wait_indexed().await;
    let mut expected = Vec::new();
    for query in QUERIES {
        expected.push(search(&before, &key, query, "keyword").await);
    }
    assert_eq!(
        expected[1].first().map(String::as_str),
        Some("I'm allergic to peanuts.")
    );
    before.stop().await;
    assert!(home.data_dir().join("keyword").exists());

    // Restarted with keyword search on the server: it answers while it fills, the same as
    // before, and takes writes.
    let app = spawn("server").await;
    // Serving at once, from the collection it had and its tantivy index.
    let serving = app.state.memory.indexer();
    assert!(matches!(
        serving.keyword(),
        mnemo::index::keyword::KeywordSearch::Local(_)
    ));
    let first = std::sync::Arc::downgrade(&serving);
    drop(serving);
    let key = app.key_of("alice").await;
    let bob = app.key_of("bob").await;
    let mut answers = 0;
    let mut moving = 0;
    let mut written = false;
    let started = std::time::Instant::now();
    loop {
        for (query, expected) in QUERIES.iter().zip(&expected) {
            let found = search(&app, &key, query, "keyword").await;
            assert!(
                same_answers(&found, expected),
                "{query:?} after {answers} answers: {found:?} vs {expected:?}"
            );
            answers += 1;
        }
        if !written {
            app.remember_facts(&key, &["Ingrid teaches violin on Thursdays."])
                .await;
            written = true;
        }
        if matches!(
            app.state.memory.indexer().keyword(),
            mnemo::index::keyword::KeywordSearch::Beside(_)
        ) {
            break;
        }
        moving += 1;
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the keyword vectors were not filled within a minute"
        );
    }
    println!("{moving} rounds of questions answered during the move");
    // On the server now: the same answers, the write made during the move among them, each
    // user's memories apart.
    for (query, expected) in QUERIES.iter().zip(&expected) {
        let found = search(&app, &key, query, "keyword").await;
        assert!(
            same_answers(&found, expected),
            "{query:?}: {found:?} vs {expected:?}"
        );
    }
    assert_eq!(
        search(&app, &key, "Ingrid", "keyword").await,
        vec!["Ingrid teaches violin on Thursdays.".to_string()]
    );
    assert_eq!(
        search(&app, &bob, "bees", "keyword").await,
        vec!["Bob keeps bees on his roof.".to_string()]
    );
    assert!(search(&app, &bob, "peanuts", "keyword").await.is_empty());
    let lag = app.state.memory.indexer().lag().await.expect("index lag");
    assert_eq!(lag.keyword_applied, lag.vector_applied);
    app.stop_and_release().await;
    // The indexer it started with (and its tantivy index) is gone with it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while first.strong_count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first indexer outlived its app"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // The next start searches on the server at once and removes the index left behind.
    let again = spawn("server").await;
    assert!(matches!(
        again.state.memory.indexer().keyword(),
        mnemo::index::keyword::KeywordSearch::Beside(_)
    ));
    assert!(!home.data_dir().join("keyword").exists());
    let key = again.key_of("alice").await;
    assert_eq!(
        search(&again, &key, "peanuts", "keyword")
            .await
            .first()
            .map(String::as_str),
        Some("I'm allergic to peanuts.")
    );
    again.stop().await;
}
