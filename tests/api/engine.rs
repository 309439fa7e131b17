//! Memory-engine behaviour across the process lifetime: re-embedding after a model change,
//! the decay job at start, access statistics, and index lag in `/health` and `/metrics`.

use crate::support;

use std::time::Duration;

use mnemo::store::{Embedded, MemoryKind, NewMemory};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Backend, Home, TestApp, result_contents as contents};

async fn search(app: &TestApp, key: &str, body: Value) -> Value {
    let (status, response) = app.post("/v1/memories/search", Some(key), Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    response
}

#[tokio::test]
async fn memories_from_another_model_are_reembedded_at_start_and_become_recallable() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let user = app
        .state
        .store
        .accounts()
        .user_by_name("alice")
        .await
        .unwrap()
        .unwrap();
    // Memories written by an older, 8-dimensional model.
    let old = Embedded {
        vector: vec![0.5; 8],
        model: "old-model".into(),
    };
    insert_embedded(
        &app,
        user.id,
        &[
            "My daughter's name is Priya",
            "The office wifi password rotates every Monday",
        ],
        &old,
    )
    .await;
    app.stop().await;

    let app = TestApp::spawn(&home).await;
    let model = app.state.memory.embedder().vectors_id().to_string();
    wait_embedded_by(&app, &model).await;
    app.wait_indexed().await;
    let found = search(
        &app,
        &key,
        json!({ "query": "what is my child called", "mode": "vector", "k": 1 }),
    )
    .await;
    assert_eq!(contents(&found), ["My daughter's name is Priya"]);
    let listed = app
        .state
        .store
        .user(user.id)
        .list_memories(&Default::default(), 10, None)
        .await
        .unwrap();
    assert!(listed.iter().all(|memory| memory.embedding.len() == 384));
    app.stop().await;
}

/// Stores facts of `user` with `vector` as their recorded embedding, as an earlier version or
/// model left them.
async fn insert_embedded(
    app: &TestApp,
    user: mnemo::store::UserId,
    contents: &[&str],
    vector: &Embedded,
) {
    let news = contents
        .iter()
        .map(|content| {
            (
                NewMemory::from_user(MemoryKind::Fact, *content, 3),
                vector.clone(),
            )
        })
        .collect();
    app.state
        .store
        .user(user)
        .insert_memories(news)
        .await
        .unwrap();
}

/// Waits until no memory's vector is recorded under another id than `id` (the re-embedding at
/// start has run).
async fn wait_embedded_by(app: &TestApp, id: &str) {
    let mut remaining = 1;
    for _ in 0..100 {
        remaining = app
            .state
            .store
            .maintenance()
            .count_memories_not_embedded_by(id)
            .await
            .unwrap();
        if remaining == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(remaining, 0, "every memory is recorded as made by {id}");
}

/// A data directory of the versions that recorded the bare model id keeps its vectors when the
/// arithmetic is the default's (`auto`, here 8 bits or bfloat16), relabelled with the
/// arithmetic; under another arithmetic they are made again, as after a change of model.
#[tokio::test]
#[cfg_attr(
    not(any(cpu_amx, cpu_vnni, cpu_avx2)),
    ignore = "needs a reduced arithmetic for the default (x86 amx, avx512 vnni, or avx2 with fma)"
)]
async fn vectors_under_the_bare_model_id_are_kept_in_the_default_arithmetic_and_remade_in_another()
{
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    app.user_key("alice").await;
    let user = app
        .state
        .store
        .accounts()
        .user_by_name("alice")
        .await
        .unwrap()
        .unwrap();
    let embedder = app.state.memory.embedder().clone();
    let bare = embedder.model_id().to_string();
    assert_eq!(bare, "all-MiniLM-L6-v2");
    let default = mnemo_encoder::Precision::Auto.on_this_cpu();
    assert_ne!(default, mnemo_encoder::Precision::F32);
    let current = format!("{bare}@{}", default.name());
    assert_eq!(embedder.vectors_id(), current);
    assert_eq!(embedder.earlier_vectors_id(), Some(bare.as_str()));
    // A vector no model makes (not of unit length): still there means not made again.
    let marker = Embedded {
        vector: vec![0.5; 384],
        model: bare.clone(),
    };
    insert_embedded(
        &app,
        user.id,
        &["My daughter's name is Priya", "I moved to Lisbon in 2021"],
        &marker,
    )
    .await;
    app.stop().await;

    let app = TestApp::spawn(&home).await;
    wait_embedded_by(&app, &current).await;
    let list = |app: &TestApp| {
        let store = app.state.store.clone();
        async move {
            store
                .user(user.id)
                .list_memories(&Default::default(), 10, None)
                .await
                .unwrap()
        }
    };
    let kept = list(&app).await;
    assert_eq!(kept.len(), 2);
    for memory in &kept {
        assert_eq!(memory.embedding_model, current);
        assert_eq!(
            memory.embedding, marker.vector,
            "{} was embedded again",
            memory.content
        );
    }
    app.stop().await;

    let app = TestApp::spawn_with(&home, &[("MNEMO__EMBEDDER__PRECISION", "f32")]).await;
    let exact = format!("{bare}@f32");
    assert_eq!(app.state.memory.embedder().vectors_id(), exact);
    assert_eq!(app.state.memory.embedder().earlier_vectors_id(), None);
    wait_embedded_by(&app, &exact).await;
    for memory in list(&app).await {
        assert_eq!(memory.embedding.len(), 384);
        assert_ne!(
            memory.embedding, marker.vector,
            "{} was kept",
            memory.content
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn the_decay_job_archives_unused_trivia_at_start_and_recall_respects_it() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let user = app
        .state
        .store
        .accounts()
        .user_by_name("alice")
        .await
        .unwrap()
        .unwrap();
    let long_ago = chrono::Utc::now() - chrono::Duration::days(400);
    let mut trivia = NewMemory::from_user(MemoryKind::Fact, "The hotel lobby had green carpets", 1);
    trivia.created_at = Some(long_ago);
    let mut essential = NewMemory::from_user(
        MemoryKind::Fact,
        "The hotel booking is under my maiden name",
        5,
    );
    essential.created_at = Some(long_ago);
    app.state
        .memory
        .add(user.id, vec![trivia, essential])
        .await
        .unwrap();
    app.stop().await;

    // The job runs once at start.
    let app = TestApp::spawn(&home).await;
    let mut archived = Vec::new();
    for _ in 0..50 {
        archived = app
            .state
            .store
            .user(user.id)
            .list_memories(
                &mnemo::store::MemoryFilter {
                    include_archived: true,
                    ..Default::default()
                },
                10,
                None,
            )
            .await
            .unwrap()
            .into_iter()
            .filter(|memory| memory.archived_at.is_some())
            .map(|memory| memory.content)
            .collect();
        if !archived.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(archived, ["The hotel lobby had green carpets"]);
    app.wait_indexed().await;
    let default = search(&app, &key, json!({ "query": "hotel", "mode": "keyword" })).await;
    assert_eq!(
        contents(&default),
        ["The hotel booking is under my maiden name"]
    );
    let all = search(
        &app,
        &key,
        json!({ "query": "hotel", "mode": "keyword", "include_archived": true }),
    )
    .await;
    assert_eq!(contents(&all).len(), 2);
    app.stop().await;
}

/// A fresh app on `home` with user alice holding one fact, indexed; returns the app, alice's key
/// and the fact's id.
async fn app_with_fact(home: &Home, content: &str) -> (TestApp, String, String) {
    let app = TestApp::spawn(home).await;
    let key = app.user_key("alice").await;
    let (status, memory) = app
        .post(
            "/v1/memories",
            Some(&key),
            Some(json!({ "content": content, "kind": "fact" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{memory}");
    let id = memory["id"].as_str().unwrap().to_string();
    app.wait_indexed().await;
    (app, key, id)
}

/// Access stats are written at most once a second under a stream of recalls: every recall
/// still counts, and what is pending when the server stops is written before it ends.
#[tokio::test]
async fn a_burst_of_recalls_counts_every_access_even_at_shutdown() {
    let home = Home::new(Backend::Sqlite).await;
    let (app, key, id) = app_with_fact(&home, "The spare bike key hangs behind the boiler").await;
    for _ in 0..5 {
        let found = search(
            &app,
            &key,
            json!({ "query": "bike key boiler", "mode": "keyword" }),
        )
        .await;
        assert_eq!(
            contents(&found),
            ["The spare bike key hangs behind the boiler"]
        );
    }
    app.stop_and_release().await;
    let app = TestApp::spawn(&home).await;
    let id = mnemo::store::MemoryId::from_uuid(id.parse().expect("memory id"));
    let stored = app
        .state
        .store
        .maintenance()
        .owned_memories(&[id])
        .await
        .expect("read the memory");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].memory.access_count, 5);
    app.stop().await;
}

#[tokio::test]
async fn recall_records_access_and_health_reports_index_lag() {
    let home = Home::new(Backend::Sqlite).await;
    let (app, key, id) = app_with_fact(&home, "I keep my passport in the blue drawer").await;
    let found = search(&app, &key, json!({ "query": "where is my passport" })).await;
    assert_eq!(contents(&found)[0], "I keep my passport in the blue drawer");
    let signals = &found["results"][0]["signals"];
    assert_eq!(signals["vector_rank"], 1);
    assert_eq!(signals["bm25_rank"], 1);
    assert!(found["timings"]["embed_ms"].as_f64().unwrap() > 0.0);
    let mut count = 0;
    for _ in 0..50 {
        let (_, body) = app.get(&format!("/v1/memories/{id}"), Some(&key)).await;
        count = body["memory"]["access_count"].as_i64().unwrap_or(0);
        if count > 0 {
            assert!(body["memory"]["last_accessed_at"].is_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count, 1);
    // The same query again: its vector comes from the query cache.
    let again = search(&app, &key, json!({ "query": "where is my passport" })).await;
    assert_eq!(contents(&again)[0], "I keep my passport in the blue drawer");

    let (status, health) = app.health().await;
    assert_eq!(status, StatusCode::OK, "{health}");
    let components = &health["components"];
    assert_eq!(components["embedder"]["dimension"], 384);
    assert_eq!(components["vector_index"]["backend"], "qdrant-edge");
    assert_eq!(components["keyword_index"]["backend"], "tantivy");
    let indexes = &components["indexes"];
    assert!(indexes["log_head"].as_i64().unwrap() >= 1);
    assert_eq!(indexes["vector"]["lag"], 0);
    assert_eq!(indexes["keyword"]["lag"], 0);
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("mnemo_index_lag{index=\"vector\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mnemo_recall_duration_seconds"),
        "{metrics}"
    );
    // The embedding queue: its depth, its batch sizes and the query cache.
    for line in [
        "mnemo_embed_queue_texts 0",
        "mnemo_embed_batch_texts_count",
        "mnemo_embed_query_cache_total{result=\"hit\"} 1",
        "mnemo_embed_query_cache_total{result=\"miss\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    app.stop().await;
}
