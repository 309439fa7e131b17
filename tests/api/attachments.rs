//! Documents attached to a chat message: the turn reads their text as quoted data (the model's
//! prompt holds it, the reply is trusted as a document), the message lists them by title and
//! keeps them for a regenerate, another user's document is refused before anything is stored,
//! a deleted one is said to be gone, the idempotency key covers them, and a server without a
//! model says it cannot read them.

use crate::support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, last_user_text, prompt_text};
use support::{Backend, Home, ReceivedEvent, TestApp};

/// The chat turn's requests only: the writer's model calls would mix in.
const NO_WRITER: (&str, &str) = ("MNEMO__MEMORY__WRITER_WORKERS", "0");

const TRAVEL_PLAN: &str = "# Trip to Ljubljana\n\nThe train leaves Vienna at 07:40 on 14 March \
and arrives at 13:52. The hotel is the Vila Rozmarin, booked for three nights under the name \
Okonkwo. Dinner on the second night is at the Gostilna As, table for four at 19:30.";

async fn add_document(app: &TestApp, key: &str, title: &str, content: &str) -> String {
    let (status, body) = app
        .ingest_document(key, json!({ "title": title, "content": content }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().unwrap().to_string()
}

async fn read_run(app: &TestApp, key: &str, run: &Value) -> Vec<ReceivedEvent> {
    app.events(key, run["id"].as_str().unwrap(), None)
        .await
        .collect()
        .await
}

async fn messages(app: &TestApp, key: &str, thread: &str) -> Vec<Value> {
    let (status, body) = app.get(&format!("/v1/threads/{thread}"), Some(key)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["messages"].as_array().unwrap().clone()
}

/// Answers the thread's user message `message` again and reads the new turn to its end.
async fn regenerate(app: &TestApp, key: &str, thread: &str, message: &str) {
    let (status, run) = app
        .post(
            &format!("/v1/threads/{thread}/messages/{message}/retry"),
            Some(key),
            Some(json!({ "stream": false })),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    read_run(app, key, &run).await;
}

#[tokio::test]
async fn an_attached_document_is_read_by_the_turn_listed_on_the_message_and_kept_for_a_regenerate()
{
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let home = Home::new(backend).await;
        let llm = FakeLlm::start().await;
        let app = TestApp::spawn_with_llm(&home, &llm, &[NO_WRITER]).await;
        let key = app.user_key("alice").await;
        let plan = add_document(&app, &key, "Ljubljana plan", TRAVEL_PLAN).await;
        let thread = app.new_thread(&key).await;

        llm.push(Reply::text("The train arrives at 13:52."));
        let events = app
            .turn_in_thread(
                &key,
                &thread,
                json!({ "content": "When does my train arrive?", "stream": false,
                    "attachments": [plan, plan] }),
            )
            .await;
        assert!(
            events.iter().any(|event| event.event == "message_complete"),
            "{events:?}"
        );

        // The model read the document's text after the user's words, quoted as data.
        let requests = llm.requests();
        assert_eq!(requests.len(), 1, "{requests:?}");
        let asked = last_user_text(&requests[0]).to_string();
        assert!(
            asked.starts_with("When does my train arrive?"),
            "the user's words come first: {asked}"
        );
        assert!(
            asked.contains(&format!("[document {plan} | Ljubljana plan]")),
            "{asked}"
        );
        assert!(
            asked.contains("> The train leaves Vienna at 07:40"),
            "the text is quoted: {asked}"
        );
        assert_eq!(
            asked.matches("[document ").count(),
            1,
            "an id given twice is attached once: {asked}"
        );

        // The message lists it by title; the reply read a document.
        let stored = messages(&app, &key, &thread).await;
        assert_eq!(stored.len(), 2, "{stored:?}");
        assert_eq!(
            stored[0]["attachments"],
            json!([{ "document_id": plan, "title": "Ljubljana plan" }])
        );
        assert_eq!(stored[0]["content"], "When does my train arrive?");
        assert_eq!(stored[1]["trust"], "document", "{}", stored[1]);
        assert!(
            stored[1].get("attachments").is_none(),
            "a reply attaches nothing"
        );

        // A follow-up without attachments still sees the earlier message's document.
        llm.push(Reply::text("At the Vila Rozmarin."));
        app.turn_in_thread(
            &key,
            &thread,
            json!({ "content": "And the hotel?", "stream": false }),
        )
        .await;
        let follow_up = prompt_text(&llm.requests()[1]);
        assert!(follow_up.contains("Vila Rozmarin"), "{follow_up}");

        // Regenerating the first answer: the message keeps its document, the new turn reads it.
        llm.push(Reply::text("13:52, on 14 March."));
        regenerate(&app, &key, &thread, stored[0]["id"].as_str().unwrap()).await;
        let again = last_user_text(&llm.requests()[2]).to_string();
        assert!(again.contains("arrives at 13:52"), "{again}");
        let stored = messages(&app, &key, &thread).await;
        assert_eq!(stored.len(), 2, "{stored:?}");
        assert_eq!(stored[0]["attachments"][0]["document_id"], plan.as_str());

        // Deleted: the message still says what was attached, a new answer says it is gone.
        assert_eq!(
            app.delete_document(&key, &plan).await,
            StatusCode::NO_CONTENT
        );
        llm.push(Reply::text("It is gone."));
        regenerate(&app, &key, &thread, stored[0]["id"].as_str().unwrap()).await;
        let gone = last_user_text(&llm.requests()[3]).to_string();
        assert!(gone.contains("deleted since it was attached"), "{gone}");
        assert!(!gone.contains("Vila Rozmarin"), "{gone}");
        let stored = messages(&app, &key, &thread).await;
        assert_eq!(stored[0]["attachments"][0]["title"], "Ljubljana plan");
        app.stop().await;
    }
}

#[tokio::test]
async fn another_users_document_or_an_unknown_id_is_refused_before_anything_is_stored() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[NO_WRITER]).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let bobs = add_document(&app, &bob, "Bob's plan", TRAVEL_PLAN).await;
    let thread = app.new_thread(&alice).await;

    for attachments in [
        json!([bobs]),
        json!(["0190d8f0-0000-7000-8000-000000000000"]),
    ] {
        let (status, body) = app
            .post_to_thread(
                &alice,
                &thread,
                json!({ "content": "Read this", "stream": false, "attachments": attachments }),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("not one of your documents"), "{message}");
        assert!(
            !message.contains("Bob"),
            "nothing of Bob's is said: {message}"
        );
    }
    let (status, body) = app
        .post_to_thread(
            &alice,
            &thread,
            json!({ "content": "Read this", "stream": false, "attachments": ["not-a-uuid"] }),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let eleven: Vec<String> = (0..11)
        .map(|n| format!("0190d8f0-0000-7000-8000-0000000000{n:02}"))
        .collect();
    let (status, body) = app
        .post_to_thread(
            &alice,
            &thread,
            json!({ "content": "Read these", "stream": false, "attachments": eleven }),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 10"),
        "{body}"
    );

    assert!(messages(&app, &alice, &thread).await.is_empty());
    assert!(llm.requests().is_empty(), "no turn ran");
    app.stop().await;
}

#[tokio::test]
async fn the_idempotency_key_covers_the_attachments() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let first = add_document(&app, &key, "First", "The first document is about herons.").await;
    let second = add_document(&app, &key, "Second", "The second document is about owls.").await;
    let thread = app.new_thread(&key).await;
    let keyed = |attachments: Value| {
        app.client
            .post(app.url(&format!("/v1/threads/{thread}/messages")))
            .bearer_auth(&key)
            .header("Idempotency-Key", "attach-1")
            .json(&json!({ "content": "Summarise it", "stream": false,
                           "attachments": attachments }))
            .send()
    };
    let response = keyed(json!([first])).await.unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let run: Value = response.json().await.unwrap();
    let response = keyed(json!([first])).await.unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let again: Value = response.json().await.unwrap();
    assert_eq!(again["id"], run["id"], "the same request is replayed");
    let response = keyed(json!([second])).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::CONFLICT,
        "other attachments are another request"
    );
    read_run(&app, &key, &run).await;
    assert_eq!(messages(&app, &key, &thread).await.len(), 2);
    app.stop().await;
}

#[tokio::test]
async fn without_a_model_the_answer_names_what_was_attached() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let plan = add_document(&app, &key, "Ljubljana plan", TRAVEL_PLAN).await;
    let thread = app.new_thread(&key).await;
    let events = app
        .turn_in_thread(
            &key,
            &thread,
            json!({ "content": "When does my train arrive?", "stream": false,
                "attachments": [plan] }),
        )
        .await;
    let complete = events
        .iter()
        .find(|event| event.event == "message_complete")
        .expect("an answer");
    let answer = complete.data["content"].as_str().unwrap();
    assert!(
        answer.contains("No language model is configured") && answer.contains("\"Ljubljana plan\""),
        "{answer}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_long_document_is_read_passage_by_passage_each_once() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[NO_WRITER]).await;
    let key = app.user_key("alice").await;
    // Long enough for several chunks, which overlap one another for search.
    let paragraphs: Vec<String> = (0..30)
        .map(|n| format!("Stage {n} of the walk passes the lighthouse number {n} at dawn."))
        .collect();
    let walk = add_document(&app, &key, "The walk", &paragraphs.join("\n\n")).await;
    let thread = app.new_thread(&key).await;
    llm.push(Reply::text("A long walk."));
    app.turn_in_thread(
        &key,
        &thread,
        json!({ "content": "Summarise the walk", "attachments": [walk] }),
    )
    .await;
    let asked = last_user_text(&llm.requests()[0]).to_string();
    for paragraph in &paragraphs {
        assert_eq!(
            asked.matches(paragraph.as_str()).count(),
            1,
            "{paragraph}: {asked}"
        );
    }
    assert!(!asked.contains('…'), "no overlap marks: {asked}");
    app.stop().await;
}
