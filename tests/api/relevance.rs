//! Decisions about meaning through the real server: `forget` removes what the user named and
//! no bystander (over HTTP with both shipped embedders, through MCP and the chat model's tool),
//! shows it first and can undo it; the same statement is remembered once; a research over
//! unrelated notes cites and remembers nothing; recall answers a question about something
//! never said with nothing.

use crate::support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply};
use support::{Backend, Home, TestApp};

/// The six facts of the report that found `forget` deleting all of them.
const SIX_FACTS: [&str; 6] = [
    "I'm allergic to peanuts.",
    "My passport number is X1234567.",
    "My sister lives in Lisbon.",
    "I always book aisle seats on long flights.",
    "My laptop is a ThinkPad X1 Carbon.",
    "I play the cello in a community orchestra.",
];
const PASSPORT: &str = "My passport number is X1234567.";

async fn remember_all(app: &TestApp, key: &str, facts: &[&str]) {
    app.remember_facts(key, facts).await;
}

async fn contents(app: &TestApp, key: &str) -> Vec<String> {
    let (status, body) = app.get("/v1/memories?limit=100", Some(key)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut all: Vec<String> = body["memories"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] != "turn")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    all.sort();
    all
}

fn texts_of(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|item| {
            item.get("memory")
                .unwrap_or(item)
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn bystanders() -> Vec<String> {
    let mut kept: Vec<String> = SIX_FACTS
        .iter()
        .filter(|fact| **fact != PASSPORT)
        .map(ToString::to_string)
        .collect();
    kept.sort();
    kept
}

/// Forget over HTTP with each shipped embedder: the preview names the passport alone, the
/// forget removes it alone, it is listed as restorable and comes back when restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_over_http_removes_what_was_named_and_can_be_undone() {
    for model in [support::model_dir(), support::multilingual_model_dir()] {
        let home = Home::new(Backend::Sqlite).await;
        let app = TestApp::spawn_with(&home, &[("MNEMO__EMBEDDER__MODEL_DIR", &model)]).await;
        let key = app.user_key("alice").await;
        remember_all(&app, &key, &SIX_FACTS).await;

        let (status, preview) = app
            .post(
                "/v1/memories/forget",
                Some(&key),
                Some(json!({ "query": "Forget everything about my passport", "dry_run": true })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{preview}");
        assert_eq!(preview["dry_run"], true);
        assert_eq!(
            texts_of(&preview["matches"]),
            [PASSPORT],
            "{model}: {preview}"
        );
        assert!(preview["forgotten"].as_array().unwrap().is_empty());
        assert_eq!(
            contents(&app, &key).await.len(),
            6,
            "a dry run removes nothing"
        );

        let (status, done) = app
            .post(
                "/v1/memories/forget",
                Some(&key),
                Some(json!({ "query": "Forget everything about my passport" })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        assert_eq!(texts_of(&done["forgotten"]), [PASSPORT], "{model}: {done}");
        assert!(done["restorable_until"].is_string(), "{done}");
        assert_eq!(contents(&app, &key).await, bystanders(), "{model}");

        // Gone from recall too, and listed as restorable.
        app.wait_indexed().await;
        let (_, found) = app
            .post(
                "/v1/memories/search",
                Some(&key),
                Some(json!({ "query": "passport number" })),
            )
            .await;
        assert!(
            !texts_of(&found["results"]).contains(&PASSPORT.to_string()),
            "{found}"
        );
        let (status, forgotten) = app.get("/v1/memories/forgotten", Some(&key)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(texts_of(&forgotten["forgotten"]), [PASSPORT]);
        let entry = &forgotten["forgotten"][0];
        assert_eq!(entry["via"], "api");
        assert_eq!(entry["request"], "Forget everything about my passport");
        let id = entry["memory"]["id"].as_str().unwrap().to_string();

        // Another user can neither see nor restore it.
        let bob = app.user_key("bob").await;
        let (_, theirs) = app.get("/v1/memories/forgotten", Some(&bob)).await;
        assert!(theirs["forgotten"].as_array().unwrap().is_empty());
        let (status, _) = app
            .post(
                &format!("/v1/memories/forgotten/{id}/restore"),
                Some(&bob),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        let (status, restored) = app
            .post(
                &format!("/v1/memories/forgotten/{id}/restore"),
                Some(&key),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{restored}");
        assert_eq!(restored["id"], id.as_str());
        assert_eq!(restored["content"], PASSPORT);
        assert_eq!(contents(&app, &key).await.len(), 6);
        let (_, history) = app.get(&format!("/v1/memories/{id}"), Some(&key)).await;
        let changes: Vec<&str> = history["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["change"].as_str().unwrap())
            .collect();
        assert_eq!(changes, ["created", "restored"], "{history}");
        app.wait_indexed().await;
        let (_, found) = app
            .post(
                "/v1/memories/search",
                Some(&key),
                Some(json!({ "query": "passport number" })),
            )
            .await;
        assert_eq!(
            texts_of(&found["results"]).first().map(String::as_str),
            Some(PASSPORT),
            "recallable again: {found}"
        );
        let (status, _) = app
            .post(
                &format!("/v1/memories/forgotten/{id}/restore"),
                Some(&key),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "restored once");

        // A request naming nothing the user said forgets nothing.
        let (_, none) = app
            .post(
                "/v1/memories/forget",
                Some(&key),
                Some(json!({ "query": "forget my dog's name" })),
            )
            .await;
        assert!(none["forgotten"].as_array().unwrap().is_empty(), "{none}");
        assert_eq!(contents(&app, &key).await.len(), 6);

        // Ids forget exactly what was chosen; bad bodies are refused.
        let (status, chosen) = app
            .post(
                "/v1/memories/forget",
                Some(&key),
                Some(json!({ "ids": [id], "query": "my passport" })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{chosen}");
        assert_eq!(texts_of(&chosen["forgotten"]), [PASSPORT]);
        for bad in [json!({}), json!({ "query": "  " }), json!({ "ids": [] })] {
            let (status, body) = app
                .post("/v1/memories/forget", Some(&key), Some(bad.clone()))
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        }
        app.stop().await;
    }
}

/// The MCP `forget` tool through the official SDK: the passport goes, the five others stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_through_mcp_keeps_the_bystanders() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let facts = serde_json::to_string(&SIX_FACTS).unwrap();
    let seen = crate::clients::run_client(
        "mcp_client.py",
        &[
            ("MNEMO_BASE", &app.base),
            ("MNEMO_KEY", &key),
            ("MNEMO_STEPS", "facts,forget"),
            ("MNEMO_FACTS", &facts),
            ("MNEMO_FORGET", "please forget my passport number"),
        ],
    )
    .await;
    assert_eq!(seen["forget"]["error"], false, "{seen}");
    let answer: Value = serde_json::from_str(seen["forget"]["texts"][0].as_str().unwrap()).unwrap();
    assert_eq!(answer["forgotten"], json!([PASSPORT]), "{answer}");
    assert_eq!(answer["more"], 0);
    assert!(answer["restorable_until"].is_string());
    assert_eq!(contents(&app, &key).await, bystanders());
    let (_, forgotten) = app.get("/v1/memories/forgotten", Some(&key)).await;
    assert_eq!(forgotten["forgotten"][0]["via"], "mcp");
    app.stop().await;
}

/// The chat model's `forget` tool: what the model asks to forget is matched like any forget
/// request, and the turn's tool result says what went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_forget_tool_keeps_the_bystanders() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[("MNEMO__CHAT__AUTO_RECALL", "0")]).await;
    let key = app.user_key("alice").await;
    remember_all(&app, &key, &SIX_FACTS).await;
    llm.push(Reply::tool(
        "forget",
        json!({ "query": "my passport number" }),
    ));
    llm.push(Reply::text(
        "Done: I no longer remember your passport number.",
    ));
    let (_, events) = app
        .say_in_new_thread(&key, "Please forget my passport number.")
        .await;
    let result = events
        .iter()
        .find(|e| e.event == "tool_result")
        .expect("tool_result");
    assert_eq!(
        result.data["result"]["forgotten"],
        json!([PASSPORT]),
        "{:?}",
        result.data
    );
    let facts: Vec<String> = contents(&app, &key)
        .await
        .into_iter()
        .filter(|c| SIX_FACTS.contains(&c.as_str()))
        .collect();
    assert_eq!(facts, bystanders());
    app.stop().await;
}

/// A statement said again in other words is the memory it repeats; a changed value is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_statement_is_remembered_once_wherever_it_comes_from() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(
        &home,
        &[(
            "MNEMO__EMBEDDER__MODEL_DIR",
            &support::multilingual_model_dir(),
        )],
    )
    .await;
    let key = app.user_key("alice").await;
    remember_all(&app, &key, &["My student number is 1008765432."]).await;
    // An import of the same statement in other words, and of a changed one.
    let lines = [
        json!({ "kind": "fact", "content": "My student ID number is 1008765432.", "importance": 3 }),
        json!({ "kind": "fact", "content": "My student number is 1008765999.", "importance": 3 }),
    ]
    .iter()
    .map(Value::to_string)
    .collect::<Vec<_>>()
    .join("\n");
    let response = app
        .client
        .post(app.url("/v1/memories/import"))
        .bearer_auth(&key)
        .header("content-type", "application/x-ndjson")
        .body(lines)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let report: Value = response.json().await.unwrap();
    assert_eq!(
        (report["imported"].as_u64(), report["skipped"].as_u64()),
        (Some(1), Some(1)),
        "{report}"
    );
    let all = contents(&app, &key).await;
    assert_eq!(
        all,
        [
            "My student number is 1008765432.",
            "My student number is 1008765999."
        ],
        "{all:?}"
    );
    app.stop().await;
}

/// A research without a model over the user's notes, none of them about the question: no
/// passage becomes a source, the digest says nothing answers, and nothing is remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_research_over_unrelated_notes_cites_and_remembers_nothing() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    for (title, text) in [
        (
            "Tides",
            "Spring tides happen when the sun and the moon line up, at new and full moon; neap tides come in between, at the quarter moons, when the tidal range is smallest.",
        ),
        (
            "Sea otters",
            "Sea otters wrap themselves in kelp to sleep so they do not drift away, and they hold hands in groups called rafts. They eat sea urchins, which keeps kelp forests healthy.",
        ),
    ] {
        let (status, body) = app
            .ingest_document(&key, json!({ "title": title, "content": text }))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    app.wait_indexed().await;
    let research = |query: &'static str| {
        let app = &app;
        let key = key.clone();
        async move {
            let response = app
                .client
                .post(app.url("/research/stream"))
                .bearer_auth(&key)
                .json(&json!({ "query": query, "search_api": "local" }))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            support::SseReader::new(response).collect().await
        }
    };
    let events = research("How do Fresnel lenses concentrate the light of a lighthouse?").await;
    let id = events[0].data["research_id"].as_str().unwrap().to_string();
    let (_, record) = app.get(&format!("/research/{id}"), Some(&key)).await;
    assert!(
        record["sources"].as_array().unwrap().is_empty(),
        "no unrelated note is a source: {record}"
    );
    // With nothing to cite, the research fails and says why: no report of unrelated text.
    assert_eq!(record["status"], "failed", "{record}");
    assert!(record["report"].is_null(), "{record}");
    assert!(
        record["error"]
            .as_str()
            .unwrap()
            .contains("the research found no source to cite"),
        "{record}"
    );
    assert_eq!(events.last().unwrap().data["status"], "failed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, conclusions) = app.get("/v1/memories?kinds=conclusion", Some(&key)).await;
    assert!(
        conclusions["memories"].as_array().unwrap().is_empty(),
        "{conclusions}"
    );

    // A question the notes answer, asked twice: its conclusions are remembered once.
    for _ in 0..2 {
        research("Why are spring tides stronger at full moon?").await;
    }
    let mut remembered = Vec::new();
    for _ in 0..50 {
        let (_, found) = app.get("/v1/memories?kinds=conclusion", Some(&key)).await;
        remembered = texts_of(&found["memories"]);
        if !remembered.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !remembered.is_empty(),
        "the tides research remembers a conclusion"
    );
    let mut unique = remembered.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), remembered.len(), "{remembered:?}");
    app.stop().await;
}

/// A statement written a moment ago — in SQL, not yet in the indexes, which follow the log a
/// moment behind — is found when the same statement comes again, and not written twice. (The
/// indexer learns of a write it was not told about on its next poll, a quarter of a second
/// later; before the check waited for the indexes, the second copy was written in that gap.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_written_a_moment_ago_is_not_written_again() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let alice = app.user_named("alice").await;
    let memory = &app.state.memory;
    let statement = "Neap tides come at the quarter moons, when the tidal range is smallest.";
    for round in 0..3 {
        let content = format!("{statement} (note {round})");
        let embedded = memory.embed_one(&content).await.unwrap();
        // Written as another replica would: straight to SQL, this replica's indexer not told.
        let written = app
            .state
            .store
            .user(alice.id)
            .insert_memories(vec![(
                mnemo::store::NewMemory::from_user(mnemo::store::MemoryKind::Fact, &content, 3),
                embedded,
            )])
            .await
            .unwrap();
        let again = mnemo::store::NewMemory::from_user(mnemo::store::MemoryKind::Fact, &content, 3);
        let unique = memory.add_unique(alice.id, vec![again]).await.unwrap();
        assert!(
            unique.written.is_empty(),
            "round {round}: {:?}",
            unique.written
        );
        assert_eq!(
            unique.repeated.iter().map(|m| m.id).collect::<Vec<_>>(),
            vec![written[0].id],
            "round {round}"
        );
    }
    let (_, facts) = app.get("/v1/memories?kinds=fact", Some(&key)).await;
    assert_eq!(texts_of(&facts["memories"]).len(), 3, "{facts}");
    app.stop().await;
}

/// Recall answers a question about something never said with nothing, and finds a memory
/// asked for in other words (both shipped embedders).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_finds_paraphrases_and_nothing_for_foreign_questions() {
    for model in [support::model_dir(), support::multilingual_model_dir()] {
        let home = Home::new(Backend::Sqlite).await;
        let app = TestApp::spawn_with(&home, &[("MNEMO__EMBEDDER__MODEL_DIR", &model)]).await;
        let key = app.user_key("alice").await;
        remember_all(&app, &key, &SIX_FACTS).await;
        let search = |query: &'static str| {
            let app = &app;
            let key = key.clone();
            async move { texts_of(&app.search(&key, query, 3).await["results"]) }
        };
        let found = search("Which city is my female sibling based in?").await;
        assert_eq!(
            found.first().map(String::as_str),
            Some("My sister lives in Lisbon."),
            "{model}: {found:?}"
        );
        let found = search("Which football team do I support?").await;
        assert!(found.is_empty(), "{model}: {found:?}");
        app.stop().await;
    }
}
