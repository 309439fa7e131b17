//! Chats without memory: a temporary chat, and a user's memory switch turned off. Neither
//! recalls nor stores; what is already remembered stays, and comes back when memory is on.

use crate::support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply};
use support::{Backend, Home, ReceivedEvent, TestApp};

async fn say(app: &TestApp, key: &str, thread: &str, content: &str) -> Vec<ReceivedEvent> {
    app.say(key, thread, content).await
}

async fn new_thread(app: &TestApp, key: &str, temporary: bool) -> String {
    let (status, body) = app
        .post(
            "/v1/threads",
            Some(key),
            Some(json!({ "title": "t", "temporary": temporary })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["temporary"], temporary);
    body["id"].as_str().unwrap().to_string()
}

async fn facts(app: &TestApp, key: &str) -> Vec<String> {
    let (status, body) = app
        .get("/v1/memories?limit=500&kinds=fact,turn", Some(key))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect()
}

fn reply(events: &[ReceivedEvent]) -> String {
    events
        .iter()
        .find(|e| e.event == "message_complete")
        .map(|e| e.data["content"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

fn recalled(events: &[ReceivedEvent]) -> bool {
    events.iter().any(|e| e.event == "memory_recalled")
}

#[tokio::test]
async fn a_temporary_chat_neither_recalls_nor_stores() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;

    let normal = new_thread(&app, &key, false).await;
    say(
        &app,
        &key,
        &normal,
        "Remember that my sister lives in Graz.",
    )
    .await;
    let before = facts(&app, &key).await;
    assert!(
        before.iter().any(|m| m == "My sister lives in Graz"),
        "{before:?}"
    );

    let temporary = new_thread(&app, &key, true).await;
    let events = say(
        &app,
        &key,
        &temporary,
        "Remember that my locker code is 4471.",
    )
    .await;
    assert!(!recalled(&events), "a temporary chat recalls nothing");
    assert!(
        reply(&events).contains("Memory is off"),
        "{}",
        reply(&events)
    );
    let events = say(&app, &key, &temporary, "Where does my sister live?").await;
    assert!(!reply(&events).contains("Graz"), "{}", reply(&events));
    // Nothing of the temporary chat was kept, and what was remembered before is still there.
    assert_eq!(facts(&app, &key).await, before);

    // The same words in an ordinary chat are remembered and recalled.
    let events = say(&app, &key, &normal, "Where does my sister live?").await;
    assert!(recalled(&events));
    assert!(reply(&events).contains("Graz"), "{}", reply(&events));
    app.stop().await;
}

#[tokio::test]
async fn the_memory_switch_turns_recall_and_storing_off_for_that_user_only() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let (_, me) = app.get("/v1/me", Some(&alice)).await;
    assert_eq!(me["memory_enabled"], true);
    let thread = new_thread(&app, &alice, false).await;
    say(
        &app,
        &alice,
        &thread,
        "Remember that my sister lives in Graz.",
    )
    .await;

    let (status, me) = app
        .patch(
            "/v1/me",
            Some(&alice),
            Some(json!({ "memory_enabled": false })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        (me["name"].as_str(), &me["memory_enabled"]),
        (Some("alice"), &json!(false))
    );
    let (_, me) = app.get("/v1/me", Some(&alice)).await;
    assert_eq!(me["memory_enabled"], false);
    let before = facts(&app, &alice).await;
    let events = say(
        &app,
        &alice,
        &thread,
        "Remember that my locker code is 4471.",
    )
    .await;
    assert!(!recalled(&events));
    let events = say(&app, &alice, &thread, "Where does my sister live?").await;
    assert!(!reply(&events).contains("Graz"), "{}", reply(&events));
    assert_eq!(
        facts(&app, &alice).await,
        before,
        "nothing stored while off"
    );
    // The memories are still there to read.
    let (_, found) = app
        .post(
            "/v1/memories/search",
            Some(&alice),
            Some(json!({ "query": "sister" })),
        )
        .await;
    assert!(found.to_string().contains("Graz"), "{found}");

    // Bob's memory is his own switch.
    let (_, bobs) = app.get("/v1/me", Some(&bob)).await;
    assert_eq!(bobs["memory_enabled"], true);
    let bobs_thread = new_thread(&app, &bob, false).await;
    say(
        &app,
        &bob,
        &bobs_thread,
        "Remember that my cat is called Miso.",
    )
    .await;
    assert!(
        facts(&app, &bob)
            .await
            .iter()
            .any(|m| m == "My cat is called Miso")
    );

    // A bad body is the client's mistake.
    let (status, _) = app
        .patch(
            "/v1/me",
            Some(&alice),
            Some(json!({ "memory_enabled": "no" })),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // On again: recalled again, and stored again.
    app.patch(
        "/v1/me",
        Some(&alice),
        Some(json!({ "memory_enabled": true })),
    )
    .await;
    let events = say(&app, &alice, &thread, "Where does my sister live?").await;
    assert!(reply(&events).contains("Graz"), "{}", reply(&events));
    say(
        &app,
        &alice,
        &thread,
        "Remember that my bike is a Brompton.",
    )
    .await;
    assert!(
        facts(&app, &alice)
            .await
            .iter()
            .any(|m| m == "My bike is a Brompton")
    );
    app.stop().await;
}

#[tokio::test]
async fn a_model_in_a_temporary_chat_sees_no_profile_and_no_memory_tools() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    // The model asks to remember anyway (the fake replays a tool call, then text).
    llm.push(Reply::tool(
        "remember",
        json!({ "content": "My locker code is 4471" }),
    ));
    llm.push(Reply::text("Noted for this chat only."));
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = new_thread(&app, &key, true).await;
    let events = say(&app, &key, &thread, "My locker code is 4471.").await;
    assert_eq!(reply(&events), "Noted for this chat only.");
    let request: &Value = &llm.requests()[0];
    let tools: Vec<&str> = request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|tool| tool["function"]["name"].as_str().unwrap())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(tools, ["deep_research"]);
    let system = request["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("memory is off for this chat"), "{system}");
    // The refused tool call was answered as an error, and nothing was stored.
    let second = llm.requests()[1].to_string();
    assert!(second.contains("memory is off for this chat"), "{second}");
    assert!(
        !facts(&app, &key).await.iter().any(|m| m.contains("4471")),
        "{:?}",
        facts(&app, &key).await
    );
    app.stop().await;
}
