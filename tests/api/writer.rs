//! The background memory writer: rule and LLM extraction, deduplication, contradictions that
//! supersede, durable jobs, and per-user isolation of the jobs' results.

use crate::support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply};
use support::{Backend, Home, TestApp};

/// Posts a message and waits until its turn's memory job has run.
async fn say(app: &TestApp, key: &str, thread: &str, content: &str) {
    app.say(key, thread, content).await;
}

async fn wait_for_jobs(app: &TestApp) {
    app.wait_for_jobs().await;
}

async fn memories(app: &TestApp, key: &str, query: &str) -> Vec<Value> {
    let (status, body) = app
        .get(&format!("/v1/memories?limit=500{query}"), Some(key))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["memories"].as_array().unwrap().clone()
}

fn contents(memories: &[Value]) -> Vec<&str> {
    memories
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect()
}

async fn thread(app: &TestApp, key: &str) -> String {
    app.create_thread(key, "t").await["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn rules_remember_dedupe_and_supersede_without_an_llm() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    for _ in 0..3 {
        say(
            &app,
            &key,
            &thread,
            "Remember that I use PostgreSQL 16 at work.",
        )
        .await;
    }
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(
        contents(&facts),
        ["I use PostgreSQL 16 at work"],
        "said three times, stored once"
    );
    assert_eq!(facts[0]["source"], "user");
    assert_eq!(facts[0]["trust"], "user");
    let old_id = facts[0]["id"].as_str().unwrap().to_string();
    // The user's messages are also searchable turn memories; without a chat model the
    // assistant's replies only list memories and are not kept.
    let turns = memories(&app, &key, "&kinds=turn").await;
    assert!(contents(&turns).contains(&"User: Remember that I use PostgreSQL 16 at work."));
    assert!(
        turns
            .iter()
            .all(|turn| turn["source"] == "user" && turn["trust"] == "user")
    );

    say(
        &app,
        &key,
        &thread,
        "Remember that I use PostgreSQL 17 at work.",
    )
    .await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(contents(&facts), ["I use PostgreSQL 17 at work"]);
    assert_eq!(facts[0]["supersedes"], old_id.as_str());
    let (_, old) = app.get(&format!("/v1/memories/{old_id}"), Some(&key)).await;
    assert!(old["memory"]["invalid_at"].is_string(), "{old}");
    // What superseded what, from either side: the old memory names its successor, in a
    // single read and in a list that shows invalid memories.
    assert_eq!(old["memory"]["superseded_by"], facts[0]["id"], "{old}");
    let with_invalid = memories(&app, &key, "&kinds=fact&include_invalid=true").await;
    let listed_old = with_invalid
        .iter()
        .find(|memory| memory["id"] == old_id.as_str())
        .expect("the superseded fact is listed");
    assert_eq!(listed_old["superseded_by"], facts[0]["id"]);
    assert!(facts[0].get("superseded_by").is_none(), "{}", facts[0]);
    let changes: Vec<&str> = old["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["change"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["created", "superseded"]);
    let (_, found) = app
        .post(
            "/v1/memories/search",
            Some(&key),
            Some(
                json!({ "query": "which PostgreSQL version do I use at work", "kinds": ["fact"] }),
            ),
        )
        .await;
    assert_eq!(
        found["results"][0]["memory"]["content"],
        "I use PostgreSQL 17 at work"
    );
    app.stop().await;
}

#[tokio::test]
async fn chinese_rules_produce_memories() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("li").await;
    let thread = thread(&app, &key).await;
    say(
        &app,
        &key,
        &thread,
        "请记住，我在公司用PostgreSQL 16。以后请用中文回答我。",
    )
    .await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(contents(&facts), ["我在公司用PostgreSQL 16"]);
    let preferences = memories(&app, &key, "&kinds=preference").await;
    assert_eq!(contents(&preferences), ["以后请用中文回答我"]);
    app.stop().await;
}

#[tokio::test]
async fn the_llm_extracts_and_decides_contradictions() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    llm.push(Reply::text("Noted."));
    llm.push(Reply::text(
        r#"{"memories": [{"should_remember": true, "kind": "fact", "content": "The user uses PostgreSQL 16 at work", "importance": 3}]}"#,
    ));
    say(
        &app,
        &key,
        &thread,
        "remember that I use PostgreSQL 16 at work",
    )
    .await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(contents(&facts), ["The user uses PostgreSQL 16 at work"]);
    let old_id = facts[0]["id"].as_str().unwrap().to_string();
    llm.push(Reply::text("Good to know."));
    llm.push(Reply::text(
        r#"{"memories": [{"should_remember": true, "kind": "fact", "content": "The user uses PostgreSQL 17 at work", "importance": 3}, {"should_remember": false, "kind": "fact", "content": "small talk", "importance": 1}]}"#,
    ));
    llm.push(Reply::text(&format!(
        r#"{{"action": "supersede", "target_id": "{old_id}"}}"#
    )));
    say(&app, &key, &thread, "we moved to PostgreSQL 17").await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(contents(&facts), ["The user uses PostgreSQL 17 at work"]);
    assert_eq!(facts[0]["supersedes"], old_id.as_str());
    let turns = memories(&app, &key, "&kinds=turn").await;
    assert!(
        turns
            .iter()
            .any(|turn| turn["content"] == "Assistant: Good to know."
                && turn["trust"] == "assistant"),
        "with a model, replies are turn memories at assistant trust"
    );
    let prompts: Vec<String> = llm
        .requests()
        .iter()
        .map(support::fake_llm::prompt_text)
        .collect();
    let extraction = prompts
        .iter()
        .find(|p| {
            p.contains("Decide what is worth remembering")
                && p.contains("> we moved to PostgreSQL 17")
        })
        .expect("the extraction prompt quotes the user's words");
    assert!(extraction.contains("> Good to know."));
    let consolidation = prompts
        .iter()
        .rfind(|p| p.contains("A new statement about the user"))
        .expect("a consolidation prompt");
    assert!(consolidation.contains(&old_id), "{consolidation}");
    assert!(consolidation.contains("> The user uses PostgreSQL 17 at work"));

    // `noop`: the model finds it already known, and nothing is written (it was added).
    let current = facts[0]["id"].as_str().unwrap().to_string();
    llm.push(Reply::text("Yes."));
    llm.push(Reply::text(
        r#"{"memories": [{"should_remember": true, "kind": "fact", "content": "At work the user runs PostgreSQL 17", "importance": 3}]}"#,
    ));
    llm.push(Reply::text(r#"{"action": "noop"}"#));
    say(&app, &key, &thread, "as I said, PostgreSQL 17 at work").await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(contents(&facts), ["The user uses PostgreSQL 17 at work"]);
    assert_eq!(facts[0]["id"], current.as_str());
    app.stop().await;
}

#[tokio::test]
async fn queued_jobs_survive_a_restart_and_run_once() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&home, &[("MNEMO__MEMORY__WRITER_WORKERS", "0")]).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    for content in ["My locker code is 4471.", "I prefer window seats."] {
        let run = app.post_message(&key, &thread, content).await;
        app.events(&key, run["id"].as_str().unwrap(), None)
            .await
            .collect()
            .await;
    }
    assert_eq!(
        app.state
            .store
            .maintenance()
            .queue_stats()
            .await
            .unwrap()
            .queued,
        2
    );
    app.stop().await;
    let app = TestApp::spawn(&home).await;
    wait_for_jobs(&app).await;
    let mut found = contents(&memories(&app, &key, "&kinds=fact,preference").await)
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    found.sort();
    assert_eq!(found, ["I prefer window seats", "My locker code is 4471"]);
    let (_, health) = app.health().await;
    assert_eq!(health["components"]["memory_writer"]["queued"], 0);
    app.stop().await;
}

#[tokio::test]
async fn jobs_of_concurrent_users_land_under_their_own_user() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let mut users = Vec::new();
    for index in 0..20 {
        let key = app.user_key(&format!("user{index}")).await;
        let thread = thread(&app, &key).await;
        users.push((index, key, thread));
    }
    let posts = users.iter().map(|(index, key, thread)| {
        let app = &app;
        async move {
            let content = format!("Remember that my badge number is B-{index:03}-canary.");
            let run = app.post_message(key, thread, &content).await;
            app.events(key, run["id"].as_str().unwrap(), None)
                .await
                .collect()
                .await;
        }
    });
    futures::future::join_all(posts).await;
    wait_for_jobs(&app).await;
    for (index, key, _) in &users {
        let all = memories(&app, key, "").await;
        assert!(!all.is_empty());
        for memory in &all {
            let content = memory["content"].as_str().unwrap();
            if content.contains("-canary") {
                assert!(
                    content.contains(&format!("B-{index:03}-canary")),
                    "user{index} got {content}"
                );
            }
        }
        let facts = memories(&app, key, "&kinds=fact").await;
        assert_eq!(
            contents(&facts),
            [format!("My badge number is B-{index:03}-canary")]
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn the_profile_is_rebuilt_from_preferences_and_facts_and_the_agent_sees_it() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    llm.set_default(Reply::text("ok"));
    let app = TestApp::spawn_with(&home, &[("MNEMO__MEMORY__PROFILE_INTERVAL_SECS", "1")]).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    say(&app, &key, &thread, "I prefer answers with code examples.").await;
    wait_for_jobs(&app).await;
    let profiles = memories(&app, &key, "&kinds=profile").await;
    assert_eq!(profiles.len(), 1);
    assert!(
        profiles[0]["content"]
            .as_str()
            .unwrap()
            .contains("I prefer answers with code examples")
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    say(&app, &key, &thread, "My team's platform is Kubernetes.").await;
    wait_for_jobs(&app).await;
    let profiles = memories(&app, &key, "&kinds=profile").await;
    assert_eq!(profiles.len(), 1, "the profile is rebuilt, not appended");
    let content = profiles[0]["content"].as_str().unwrap();
    assert!(
        content.contains("My team's platform is Kubernetes") && content.contains("code examples"),
        "{content}"
    );
    let facts = memories(&app, &key, "&kinds=fact").await;
    let refs = profiles[0]["source_refs"].as_array().unwrap();
    assert!(
        refs.iter().any(|r| r == &facts[0]["id"]),
        "the profile points at its sources"
    );
    app.stop().await;

    // The chat agent always sees the profile.
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let run = app.post_message(&key, &thread, "hello again").await;
    app.events(&key, run["id"].as_str().unwrap(), None)
        .await
        .collect()
        .await;
    let system = llm.requests()[0]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.contains("> Facts:") || system.contains("> - My team's platform is Kubernetes"),
        "{system}"
    );
    app.stop().await;
}

#[tokio::test]
async fn forgetting_by_description_and_with_a_thread() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let first = thread(&app, &key).await;
    say(&app, &key, &first, "My home address is 12 Elm Street.").await;
    say(&app, &key, &first, "I prefer green tea.").await;
    let second = thread(&app, &key).await;
    say(&app, &key, &second, "I prefer aisle seats on flights.").await;
    let (status, body) = app
        .post(
            "/v1/memories/forget",
            Some(&key),
            Some(json!({ "query": "my home address" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let forgotten: Vec<&str> = body["forgotten"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert!(
        forgotten.contains(&"My home address is 12 Elm Street"),
        "{forgotten:?}"
    );
    assert!(
        !forgotten.iter().any(|c| c.contains("aisle")),
        "{forgotten:?}"
    );
    wait_for_jobs(&app).await;
    let (_, found) = app
        .post(
            "/v1/memories/search",
            Some(&key),
            Some(json!({ "query": "Elm Street", "mode": "keyword" })),
        )
        .await;
    assert!(
        found["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| !r["memory"]["content"]
                .as_str()
                .unwrap()
                .contains("12 Elm Street")
                || r["memory"]["kind"] == "turn"),
        "{found}"
    );
    // Deleting a thread can take the memories made from it along.
    let (status, _) = app
        .delete(
            &format!("/v1/threads/{second}?forget_memories=true"),
            Some(&key),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let all = memories(&app, &key, "&include_archived=true").await;
    assert!(
        all.iter()
            .all(|m| !m["content"].as_str().unwrap().contains("aisle")),
        "{all:?}"
    );
    assert!(
        all.iter()
            .all(|m| !m["content"].as_str().unwrap().contains("Elm")),
        "the address is gone from facts, turns and the profile: {all:?}"
    );
    assert!(
        all.iter()
            .any(|m| m["content"].as_str().unwrap() == "I prefer green tea"),
        "unrelated memories stay: {all:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_changed_value_supersedes_even_when_the_vectors_are_nearly_identical() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    say(
        &app,
        &key,
        &thread,
        "Remember that my locker code is bench00001x.",
    )
    .await;
    say(
        &app,
        &key,
        &thread,
        "Remember that my locker code is bench00002x.",
    )
    .await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(contents(&facts), ["My locker code is bench00002x"]);
    assert!(facts[0]["supersedes"].is_string());
    app.stop().await;
}

#[tokio::test]
async fn a_background_import_is_a_job_per_batch_owned_by_its_user() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let lines: String = (0..3)
        .map(|i| {
            format!(
                "{}\n",
                json!({ "kind": "fact", "content": format!("Imported fact number {i} about herons"),
                        "source": "import", "trust": "user", "importance": 3 })
            )
        })
        .collect();
    let post = |token: String, body: String| {
        let app = &app;
        async move {
            let response = app
                .client
                .post(app.url("/v1/memories/import?background=true"))
                .bearer_auth(token)
                .header("content-type", "application/x-ndjson")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = response.status();
            (status, response.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, queued) = post(alice.clone(), lines.clone()).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{queued}");
    let batches = queued["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0]["lines"], 3);
    let id = batches[0]["id"].as_str().unwrap().to_string();
    // Another user cannot see the batch.
    let (status, _) = app
        .get(&format!("/v1/memories/import/{id}"), Some(&bob))
        .await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);
    wait_for_jobs(&app).await;
    let (_, state) = app
        .get(&format!("/v1/memories/import/{id}"), Some(&alice))
        .await;
    assert_eq!(state["status"], "done", "{state}");
    let found = contents(&memories(&app, &alice, "&kinds=fact").await)
        .into_iter()
        .filter(|c| c.contains("herons"))
        .count();
    assert_eq!(found, 3);
    // The same upload again is the same job: nothing is imported twice.
    let (_, again) = post(alice.clone(), lines).await;
    assert_eq!(again["batches"][0]["id"], id.as_str());
    wait_for_jobs(&app).await;
    let found = contents(&memories(&app, &alice, "&kinds=fact").await)
        .into_iter()
        .filter(|c| c.contains("herons"))
        .count();
    assert_eq!(found, 3);
    assert!(contents(&memories(&app, &bob, "&kinds=fact").await).is_empty());
    app.stop().await;
}

/// A message whose lowercase form is longer than itself ("İ") used to panic the rule
/// extractor on a char boundary; the panic ended the worker loop, and the job came back after
/// every lease, so no memory was written for anybody again.
#[tokio::test]
async fn a_message_that_once_panicked_the_extractor_stops_no_later_memory() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    say(&app, &key, &thread, "İ, remember the tea is 乌龙茶").await;
    say(&app, &key, &thread, "Remember that my locker code is 4471.").await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    let mut found = contents(&facts);
    found.sort();
    assert_eq!(found, ["My locker code is 4471", "The tea is 乌龙茶"]);
    let health = app.health().await.1;
    assert_eq!(
        health["components"]["memory_writer"]["failed"], 0,
        "{health}"
    );
    app.stop().await;
}

/// Greetings, thanks and slash-commands are not memories; a message longer than one memory
/// becomes several turn memories, each recallable.
#[tokio::test]
async fn content_free_turns_are_not_kept_and_long_ones_are_split() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    for content in ["hello", "/help", "thanks!", "你好"] {
        say(&app, &key, &thread, content).await;
    }
    assert!(
        memories(&app, &key, "&kinds=turn").await.is_empty(),
        "no turn memory for content-free messages"
    );
    // 20,000 characters: sentences about numbered lighthouses, one unusual word at the end.
    let mut long = String::new();
    let mut index = 0;
    while long.chars().count() < 19_900 {
        long.push_str(&format!(
            "Lighthouse {index} stands on the northern cliffs of the bay. "
        ));
        index += 1;
    }
    long.push_str("The keeper's parrot is called Quillanbert.");
    assert!(long.chars().count() > 19_900);
    say(&app, &key, &thread, &long).await;
    let turns = memories(&app, &key, "&kinds=turn").await;
    assert!(turns.len() >= 10, "split into {} memories", turns.len());
    for turn in &turns {
        let text = turn["content"].as_str().unwrap();
        assert!(text.starts_with("User: "), "{text}");
        assert!(
            text.chars().count() <= 2_100,
            "{} characters",
            text.chars().count()
        );
    }
    let (status, found) = app
        .post(
            "/v1/memories/search",
            Some(&key),
            Some(json!({ "query": "Quillanbert", "k": 3 })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{found}");
    assert!(
        found["results"][0]["memory"]["content"]
            .as_str()
            .unwrap()
            .contains("The keeper's parrot is called Quillanbert."),
        "{found}"
    );
    app.stop().await;
}

/// "My dog is called Rex", then "... Max": one valid fact, the old one superseded; the same in
/// Chinese with 叫.
#[tokio::test]
async fn a_renamed_thing_leaves_one_valid_fact() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    say(&app, &key, &thread, "My dog is called Rex.").await;
    say(&app, &key, &thread, "My dog is called Max.").await;
    say(&app, &key, &thread, "我的猫叫小白").await;
    say(&app, &key, &thread, "我的猫叫大黄").await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    let mut valid = contents(&facts);
    valid.sort();
    assert_eq!(valid, ["My dog is called Max", "我的猫叫大黄"]);
    let all = memories(&app, &key, "&kinds=fact&include_invalid=true").await;
    assert_eq!(all.len(), 4, "the old values stay in history");
    app.stop().await;
}

/// A turn's context view holds its neighbours: when the next turn arrives, the previous turn
/// is found by words only its neighbour said (a log entry re-indexes it; its row is untouched).
/// The user starts with a note and recalls it, so recall has learnt that they have no context
/// views; their first turns must change that.
#[tokio::test]
async fn the_context_view_of_a_turn_follows_the_next_turn() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(
        &home,
        &[
            ("MNEMO__MEMORY__FUSION__CONTEXT_BM25_WEIGHT", "1"),
            ("MNEMO__MEMORY__FUSION__CONTEXT_VECTOR_WEIGHT", "1"),
        ],
    )
    .await;
    let key = app.user_key("alice").await;
    let (status, note) = app
        .post(
            "/v1/memories",
            Some(&key),
            Some(json!({ "content": "My sister lives in Lisbon." })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{note}");
    app.wait_indexed().await;
    let (status, found) = app
        .post(
            "/v1/memories/search",
            Some(&key),
            Some(json!({ "query": "where does my sister live", "k": 5 })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{found}");
    assert_eq!(found["results"][0]["memory"]["id"], note["id"], "{found}");
    let thread = thread(&app, &key).await;
    say(
        &app,
        &key,
        &thread,
        "What should I call my new sailing boat?",
    )
    .await;
    let search = |query: &'static str| {
        let app = &app;
        let key = key.clone();
        async move {
            let (status, found) = app
                .post(
                    "/v1/memories/search",
                    Some(&key),
                    Some(json!({ "query": query, "k": 5, "mode": "keyword" })),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{found}");
            found["results"].as_array().unwrap().clone()
        }
    };
    assert!(search("Seabiscuit").await.is_empty());
    let before = memories(&app, &key, "&kinds=turn").await;
    say(&app, &key, &thread, "I think Seabiscuit suits it.").await;
    let found = search("Seabiscuit").await;
    let question = found
        .iter()
        .find(|r| r["memory"]["content"] == "User: What should I call my new sailing boat?")
        .unwrap_or_else(|| panic!("the earlier turn is found through its context: {found:?}"));
    assert!(question["signals"]["bm25_rank"].is_null(), "{question}");
    // Both turns' contexts now read the same two lines: they tie, in either order.
    assert!(
        question["signals"]["context_bm25_rank"]
            .as_u64()
            .is_some_and(|rank| rank <= 2),
        "{question}"
    );
    // The earlier turn's row did not change.
    let after = memories(&app, &key, "&kinds=turn").await;
    let row = |list: &[Value]| {
        list.iter()
            .find(|m| m["content"] == "User: What should I call my new sailing boat?")
            .cloned()
            .unwrap()
    };
    assert_eq!(row(&before)["version"], row(&after)["version"]);
    assert_eq!(row(&before)["updated_at"], row(&after)["updated_at"]);
    // Its context vector is of both turns' words: closer to the next turn's name than its
    // own vector is.
    let (status, found) = app
        .post(
            "/v1/memories/search",
            Some(&key),
            Some(json!({ "query": "Seabiscuit suits it", "k": 5, "mode": "vector" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{found}");
    let question = found["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["memory"]["content"] == "User: What should I call my new sailing boat?")
        .cloned()
        .unwrap_or_else(|| panic!("{found}"));
    let own = question["signals"]["vector_score"].as_f64().unwrap();
    let context = question["signals"]["context_vector_score"]
        .as_f64()
        .unwrap();
    assert!(context > own + 0.1, "context {context} against own {own}");
    app.stop().await;
}

/// A past conversation imported into a thread: its messages keep their authors and times,
/// their turn memories read `Name: text`, and the job's state is the owner's alone.
#[tokio::test]
async fn an_imported_conversation_becomes_named_turn_memories() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let thread = thread(&app, &alice).await;
    let body = json!({ "messages": [
        { "role": "user", "author": "Caroline", "content": "I went to a pottery class on Saturday.",
          "created_at": "2023-05-08T13:56:00Z" },
        { "role": "assistant", "author": "Melanie", "content": "Did you make a bowl?",
          "created_at": "2023-05-08T13:57:00Z" },
        { "role": "user", "author": "Caroline", "content": "hi",
          "created_at": "2023-05-08T13:58:00Z" },
    ]});
    let (status, refused) = app
        .post(
            &format!("/v1/threads/{thread}/import"),
            Some(&bob),
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{refused}");
    let (status, bad) = app
        .post(
            &format!("/v1/threads/{thread}/import"),
            Some(&alice),
            Some(json!({ "messages": [{ "role": "system", "content": "x" }] })),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    let (status, imported) = app
        .post(
            &format!("/v1/threads/{thread}/import"),
            Some(&alice),
            Some(body),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{imported}");
    assert_eq!(imported["messages"].as_array().unwrap().len(), 3);
    let job = imported["job"].as_str().unwrap().to_string();
    wait_for_jobs(&app).await;
    let (status, state) = app.get(&format!("/v1/jobs/{job}"), Some(&alice)).await;
    assert_eq!(
        (status, state["status"].as_str()),
        (StatusCode::OK, Some("done"))
    );
    let (status, _) = app.get(&format!("/v1/jobs/{job}"), Some(&bob)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let turns = memories(&app, &alice, "&kinds=turn").await;
    let mut said: Vec<(&str, &str, &str)> = turns
        .iter()
        .map(|m| {
            (
                m["content"].as_str().unwrap(),
                m["trust"].as_str().unwrap(),
                m["created_at"].as_str().unwrap(),
            )
        })
        .collect();
    said.sort();
    assert_eq!(
        said,
        [
            (
                "Caroline: I went to a pottery class on Saturday.",
                "user",
                "2023-05-08T13:56:00Z"
            ),
            (
                "Melanie: Did you make a bowl?",
                "assistant",
                "2023-05-08T13:57:00Z"
            ),
        ]
    );
    let (_, thread_view) = app
        .get(&format!("/v1/threads/{thread}"), Some(&alice))
        .await;
    assert_eq!(thread_view["messages"][1]["author"], "Melanie");

    // Lists filter by trust and by thread (the web app's memory filters), in SQL.
    let (status, _) = app
        .post(
            "/v1/memories",
            Some(&alice),
            Some(json!({ "content": "Caroline's favourite glaze is celadon" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let listed = |memories: Vec<Value>| -> Vec<String> {
        let mut contents: Vec<String> = memories
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect();
        contents.sort();
        contents
    };
    assert_eq!(
        listed(memories(&app, &alice, "&trust=assistant").await),
        ["Melanie: Did you make a bowl?"]
    );
    assert_eq!(
        listed(memories(&app, &alice, &format!("&trust=user&thread_id={thread}")).await),
        ["Caroline: I went to a pottery class on Saturday."]
    );
    let both = listed(memories(&app, &alice, "&trust=user,assistant").await);
    for content in [
        "Caroline's favourite glaze is celadon",
        "Caroline: I went to a pottery class on Saturday.",
        "Melanie: Did you make a bowl?",
    ] {
        assert!(both.iter().any(|listed| listed == content), "{both:?}");
    }
    let in_thread = listed(memories(&app, &alice, &format!("&thread_id={thread}")).await);
    assert!(
        in_thread
            .iter()
            .any(|listed| listed == "Melanie: Did you make a bowl?")
    );
    assert!(
        !in_thread.iter().any(|listed| listed.contains("celadon")),
        "{in_thread:?}"
    );
    let (status, bad) = app.get("/v1/memories?trust=boss", Some(&alice)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("user, assistant, document, tool, web")
    );
    let (status, _) = app.get("/v1/memories?thread_id=nope", Some(&alice)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        memories(&app, &bob, &format!("&thread_id={thread}"))
            .await
            .is_empty()
    );
    app.stop().await;
}

/// A turn job that failed after storing its turn (here: the memory model was down) stored the
/// turn again on its retry; the turns are keyed by their message.
#[tokio::test]
async fn a_retried_turn_job_stores_its_turn_once() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    llm.push(Reply::text("Noted."));
    // The memory model is down for the job's first attempt (every retry of the call too), so
    // the job fails after storing the turn and runs again (an unusable answer would not fail
    // it: the rules would extract instead).
    for _ in 0..4 {
        llm.push(Reply::Error {
            status: 503,
            message: "overloaded".into(),
        });
    }
    llm.set_default(Reply::text(
        r#"{"memories": [{"should_remember": true, "kind": "fact", "content": "The user keeps bees in Ostrava", "importance": 3}]}"#,
    ));
    say(&app, &key, &thread, "I keep bees in Ostrava").await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(contents(&facts), ["The user keeps bees in Ostrava"]);
    let turns = memories(&app, &key, "&kinds=turn").await;
    let mine: Vec<&str> = contents(&turns)
        .into_iter()
        .filter(|content| content.contains("Ostrava"))
        .collect();
    assert_eq!(mine, ["User: I keep bees in Ostrava"], "{turns:?}");
    let (_, health) = app.health().await;
    assert_eq!(
        health["components"]["memory_writer"]["failed"], 0,
        "{health}"
    );
    app.stop().await;
}

/// "İ, remember 茶" and then "Remember that my favourite editor is helix" (no model): a search
/// for "favourite editor" answers with the fact (or the turn that said it) first, never with
/// the unrelated turn (which ranks after it, if at all), once the profile is rebuilt too.
#[tokio::test]
async fn the_fact_answers_its_question_before_unrelated_turns_and_the_profile() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(
        &home,
        &[
            (
                "MNEMO__EMBEDDER__MODEL_DIR",
                &support::multilingual_model_dir(),
            ),
            ("MNEMO__MEMORY__PROFILE_INTERVAL_SECS", "0"),
        ],
    )
    .await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    say(&app, &key, &thread, "İ, remember 茶").await;
    say(
        &app,
        &key,
        &thread,
        "Remember that my favourite editor is helix",
    )
    .await;
    wait_for_jobs(&app).await;
    // The profile as the writer rebuilds it (its schedule allows one a second).
    let user = app
        .state
        .store
        .accounts()
        .user_by_name("alice")
        .await
        .unwrap()
        .expect("alice")
        .id;
    app.state.writer.build_profile(user).await.unwrap();
    app.wait_indexed().await;
    let all = memories(&app, &key, "&kinds=profile").await;
    assert!(
        contents(&all).iter().any(|c| c.contains("helix")),
        "the profile was rebuilt: {all:?}"
    );
    let (status, body) = app
        .post(
            "/v1/memories/search",
            Some(&key),
            Some(json!({ "query": "favourite editor", "k": 5 })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let found: Vec<&str> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["memory"]["content"].as_str().unwrap())
        .collect();
    assert!(
        found
            .first()
            .is_some_and(|first| first.contains("favourite editor is helix")),
        "{found:?}"
    );
    // What said it comes before what did not, which is far less likely about it.
    let said = found.iter().rposition(|c| c.contains("helix")).unwrap();
    let unrelated = found.iter().position(|c| c.contains('茶'));
    assert!(unrelated.is_none_or(|at| at > said), "{found:?}");
    app.stop().await;
}

/// A memory model that never answers the JSON asked for (as a small local model often does):
/// the rules extract instead, the fact is stored, and no job fails.
#[tokio::test]
async fn an_unusable_extraction_falls_back_to_the_rules_and_loses_nothing() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    llm.set_handler(|request| {
        Some(Reply::text(if request["response_format"].is_object() {
            "Sure! The user uses PostgreSQL at work, which is a great database."
        } else {
            "Noted."
        }))
    });
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = thread(&app, &key).await;
    say(
        &app,
        &key,
        &thread,
        "Remember that I use PostgreSQL 16 at work.",
    )
    .await;
    let facts = memories(&app, &key, "&kinds=fact").await;
    assert_eq!(contents(&facts), ["I use PostgreSQL 16 at work"]);
    let stats = app.state.store.maintenance().queue_stats().await.unwrap();
    assert_eq!(stats.failed, 0, "{stats:?}");
    let asked = llm
        .requests()
        .iter()
        .filter(|request| request["response_format"].is_object())
        .count();
    assert!(asked >= 2, "the model was asked and asked again: {asked}");
    app.stop().await;
}

/// A question about the user in the first person ("what is my…") lifts what the user said
/// above the assistant's longer answer on the same words (`memory.user_boost`), with both
/// shipped embedders; with the lift off the assistant's answer comes first — the order
/// before the lift.
#[tokio::test]
async fn a_question_about_me_puts_what_i_said_first() {
    let conversation = json!({ "messages": [
        { "role": "user",
          "content": "I can spend 650 dollars a month on food, mostly at the farmers market.",
          "created_at": "2024-03-01T10:00:00Z" },
        { "role": "assistant",
          "content": "For a monthly grocery budget, split it into weekly amounts, plan \
                      meals before you shop and keep the receipts.",
          "created_at": "2024-03-01T10:01:00Z" },
    ]});
    for (model, user_boost) in [
        (support::model_dir(), "2"),
        (support::multilingual_model_dir(), "2"),
        (support::model_dir(), "1"),
    ] {
        let home = Home::new(Backend::Sqlite).await;
        let app = TestApp::spawn_with(
            &home,
            &[
                ("MNEMO__EMBEDDER__MODEL_DIR", &model),
                ("MNEMO__MEMORY__USER_BOOST", user_boost),
            ],
        )
        .await;
        let key = app.user_key("alice").await;
        let thread = thread(&app, &key).await;
        let (status, imported) = app
            .post(
                &format!("/v1/threads/{thread}/import"),
                Some(&key),
                Some(conversation.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{imported}");
        wait_for_jobs(&app).await;
        app.wait_indexed().await;
        let found = app
            .search(&key, "What is my monthly grocery budget?", 5)
            .await;
        let first = &found["results"][0]["memory"];
        let (trust, content) = (
            first["trust"].as_str().unwrap_or("none"),
            first["content"].as_str().unwrap_or(""),
        );
        if user_boost == "1" {
            assert_eq!(trust, "assistant", "{model}, lift off: {content}");
        } else {
            assert_eq!(trust, "user", "{model}: {content}");
            assert!(content.contains("650"), "{model}: {content}");
        }
        app.stop().await;
    }
}
